"""Digest of the engine's pools: one SHA-1 over every tensor of every pooled input.

A change meant to make drawing or building the pools faster must leave every pooled
batch bitwise as it was (the suite's verdicts, the reports' batches and the false-alarm
sweep were all established on them). Run this before and after the change and compare
the two lines. It draws, for each option set below, every applicable check's pool at
three seeds (``engine._pool``: the drawn batches and the realistic-size ones), and hashes
each tensor's name, shape, dtype and bytes in order.

Run: ``python bench/pool_digest.py [--budget 60] [--seeds 0 7 123]``.
"""

from __future__ import annotations

import argparse
import hashlib
from typing import Any

import torch

from pytest_polgrad.engine import _pool, applicable_checks, build_context, kind_of, resolve_config
from pytest_polgrad.options import parse_marker

# (reference, marker options): dtypes, per-token advantages, holes, NaN padding, KL and
# rollout-IS inputs
OPTION_SETS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("grpo", {}),
    ("dapo", {}),
    ("dapo", {"dtype": "bfloat16"}),
    ("gspo", {}),
    ("grpo", {"advantages": "token"}),
    ("cispo", {"dtype": "float16"}),
    ("grpo_tis", {}),
    ("ppo", {"holes": True}),
    ("dapo", {"padding_nan": True, "dtype": "float32"}),
)


def _loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    ref_logprobs: torch.Tensor | None = None,
    rollout_logprobs: torch.Tensor | None = None,
) -> torch.Tensor:
    """Takes every optional input, so no pool is narrowed by the signature."""
    return logprobs.sum()


def digest(budget: int, seeds: list[int]) -> tuple[int, str]:
    """``(tensors hashed, hex digest)`` over every option set, check and seed."""
    h = hashlib.sha1()
    count = 0
    for reference, marker in OPTION_SETS:
        options = parse_marker((reference,), marker)
        ctx = build_context(_loss, options)
        kind = kind_of(options)
        for name in applicable_checks(resolve_config(options), options):
            check = kind.check(name)
            if check is None:
                continue
            for seed in seeds:
                drawn, extra = _pool(kind, ctx, check, seed, budget)
                for batch in (*drawn, *extra):
                    for field, value in sorted(vars(batch).items()):
                        if isinstance(value, torch.Tensor):
                            h.update(f"{field} {tuple(value.shape)} {value.dtype}".encode())
                            h.update(value.contiguous().view(torch.uint8).numpy().tobytes())
                            count += 1
    return count, h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", type=int, default=60)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 7, 123])
    args = parser.parse_args()
    count, hexdigest = digest(args.budget, args.seeds)
    print(f"{count} tensors, sha1 {hexdigest}")


if __name__ == "__main__":
    main()
