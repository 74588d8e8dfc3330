"""Digest of the engine's pools: one SHA-1 over every tensor of every pooled input.

A change meant to make drawing or building the pools faster must leave every pooled
batch bitwise as it was (the suite's verdicts, the reports' batches and the false-alarm
sweep were all established on them). Run this before and after the change and compare
the lines. It draws, for each option set below, every applicable check's pool at three
seeds (``engine._pool``: the drawn batches and the realistic-size ones), and hashes each
tensor's name, shape, dtype and bytes in order: one line for the policy-loss option sets,
one for the other kinds whose inputs are drawn from ``batches()`` (KL, training step).

Run: ``python bench/pool_digest.py [--budget 60] [--seeds 0 7 123]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
from typing import Any

import torch

from pytest_polgrad.core.engine import (
    _pool,
    applicable_checks,
    build_context,
    check_of,
    kind_of,
    resolve_config,
)
from pytest_polgrad.core.options import parse_marker

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


# kinds whose inputs wrap batches(): the KL term, the training step (bfloat16 too)
OTHER_KINDS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("grpo", {"kind": "kl"}),
    ("dapo", {"kind": "training_step"}),
    ("grpo", {"kind": "training_step", "dtype": "bfloat16"}),
)


def _hash(value: Any, h: Any) -> int:
    """Feed every tensor inside ``value`` (dataclasses, mappings, sequences) to ``h``."""
    if isinstance(value, torch.Tensor):
        h.update(f"{tuple(value.shape)} {value.dtype}".encode())
        h.update(value.contiguous().view(torch.uint8).numpy().tobytes())
        return 1
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
    elif isinstance(value, dict):
        items = sorted(value.items())
    elif isinstance(value, (list, tuple)):
        items = list(enumerate(value))
    else:
        return 0
    count = 0
    for name, inner in items:
        h.update(str(name).encode())
        count += _hash(inner, h)
    return count


def digest(
    budget: int, seeds: list[int], option_sets: tuple[tuple[str, dict[str, Any]], ...]
) -> tuple[int, str]:
    """``(tensors hashed, hex digest)`` over every option set, check and seed."""
    h = hashlib.sha1()
    count = 0
    for reference, marker in option_sets:
        options = parse_marker((reference,), marker)
        ctx = build_context(_loss, options)
        kind = kind_of(options)
        for name in applicable_checks(resolve_config(options), options):
            check = check_of(kind, ctx, name)
            for seed in seeds:
                drawn, extra = _pool(kind, ctx, check, seed, budget)
                if kind.name != "policy_loss":
                    count += _hash([*drawn, *extra], h)
                    continue
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
    for label, sets in (("policy loss", OPTION_SETS), ("other kinds", OTHER_KINDS)):
        count, hexdigest = digest(args.budget, args.seeds, sets)
        print(f"{label}: {count} tensors, sha1 {hexdigest}")


if __name__ == "__main__":
    main()
