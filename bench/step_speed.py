"""``assert_conforms`` time per kind, two source trees side by side (issue 32).

Each round runs, for every tree given, one fresh process per kind that times
``assert_conforms`` at the default budget on a few correct vectorised functions of that
kind: the first function cold (pools drawn in the process), the others warm. Rounds
alternate the trees, so load on a shared machine falls on both alike; the table gives the
medians over rounds of the per-kind mean (warm) and of the cold first call.

Run: ``python bench/step_speed.py --tree before=/path/to/old/checkout --tree after=. --rounds 5``
(``--kinds training_step`` for one kind; ``--profile`` runs cProfile on the GRPO + k3
training step in this tree instead).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import torch

# ---- correct vectorised functions of every kind (written for this benchmark) ------------


def grpo_k3_step(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    ref_logprobs: torch.Tensor,
    global_rows: int,
    world_size: int,
) -> torch.Tensor:
    """GRPO (clip 0.2) + k3 KL (coef 0.04) in the loss, seq-mean-token-mean over the step."""
    ratio = torch.exp(logprobs - old_logprobs)
    adv = advantages if advantages.dim() == 2 else advantages[:, None]
    pg = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
    d = ref_logprobs - logprobs
    tok = torch.where(response_mask, pg + 0.04 * (torch.exp(d) - d - 1.0), 0.0)
    return (tok.sum(dim=1) / response_mask.sum(dim=1)).sum() / global_rows * world_size


def dapo_step(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    global_tokens: int,
    world_size: int,
) -> torch.Tensor:
    """DAPO (clip 0.2 / 0.28), token-mean over the step's global token count."""
    ratio = torch.exp(logprobs - old_logprobs)
    adv = advantages if advantages.dim() == 2 else advantages[:, None]
    pg = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.28) * adv)
    return torch.where(response_mask, pg, 0.0).sum() / global_tokens * world_size


def k3(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    d = torch.where(response_mask, ref_logprobs - logprobs, 0.0)
    return torch.where(response_mask, torch.exp(d) - d - 1.0, 0.0)


def k1(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    return torch.where(response_mask, logprobs - ref_logprobs, 0.0)


def grpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Group-normalised rewards (unbiased std, eps 1e-6)."""
    groups = torch.unique(group_ids, return_inverse=True)[1]
    n = int(groups.max()) + 1
    out = torch.empty_like(rewards)
    for g in range(n):
        sel = groups == g
        r = rewards[sel]
        std = r.std() if r.numel() > 1 else torch.ones((), dtype=r.dtype)
        out[sel] = (r - r.mean()) / (std + 1e-6)
    return out


def token_mean(token_loss: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    m = response_mask.to(token_loss.dtype)
    return (torch.where(response_mask, token_loss, 0.0) * m).sum() / m.sum().clamp(min=1)


def seq_mean_token_mean(token_loss: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    m = response_mask.to(token_loss.dtype)
    per = torch.where(response_mask, token_loss, 0.0).sum(1) / m.sum(1).clamp(min=1)
    return per.mean()


def entropy(logits: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(logits.double(), dim=-1)
    ent = -(logp.exp() * logp).sum(-1)
    return torch.where(response_mask, ent, 0.0)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
) -> torch.Tensor:
    """PPO clipped value loss (0.5 * max of squared errors, clip 0.2), token-mean."""
    clipped = old_values + (values - old_values).clamp(-0.2, 0.2)
    err = torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    m = response_mask.to(values.dtype)
    return 0.5 * (torch.where(response_mask, err, 0.0) * m).sum() / m.sum()


# (kind, reference, options, functions)
CASES: dict[str, tuple[str, dict[str, Any], tuple[str, ...]]] = {
    "training_step": ("grpo", {}, ("grpo_k3_step", "grpo_k3_step")),
    "training_step_dapo": ("dapo", {}, ("dapo_step", "dapo_step")),
    "kl": ("grpo", {}, ("k3", "k3")),
    "advantages": ("grpo", {}, ("grpo_advantages", "grpo_advantages")),
    "aggregation": ("token-mean", {}, ("token_mean", "token_mean")),
    "aggregation_seq": ("seq-mean-token-mean", {}, ("seq_mean_token_mean",)),
    "entropy": ("entropy", {}, ("entropy", "entropy")),
    "value_loss": ("ppo", {}, ("value_loss", "value_loss")),
}
KIND_OF = {"training_step_dapo": "training_step", "aggregation_seq": "aggregation"}


def _child(case: str, budget: int | None) -> None:
    """Time one kind in this process; print JSON ``{"cold": s, "warm": [s, ...]}``."""
    import pytest_polgrad

    torch.set_num_threads(1)  # as the suite and xdist workers run (docs/engine.md)

    reference, options, names = CASES[case]
    kind = KIND_OF.get(case, case)
    times = []
    for name in names:
        fn = globals()[name]
        t = time.perf_counter()
        pytest_polgrad.assert_conforms(
            fn, reference, kind=kind, name=name, max_examples=budget, **options
        )
        times.append(time.perf_counter() - t)
    print(
        json.dumps({"cold": times[0], "warm": times[1:] or times, "file": pytest_polgrad.__file__})
    )


def _run(tree: str, case: str, budget: int | None) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", case]
        + ([] if budget is None else ["--budget", str(budget)]),
        cwd=os.path.abspath(tree),
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode:
        raise SystemExit(f"{tree} {case} failed:\n{out.stdout}\n{out.stderr}")
    data: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return data


def _profile() -> None:
    import cProfile
    import pstats

    import pytest_polgrad

    torch.set_num_threads(1)
    prof = cProfile.Profile()
    prof.enable()
    pytest_polgrad.assert_conforms(grpo_k3_step, "grpo", kind="training_step")
    prof.disable()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(45)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", action="append", default=[], help="label=path")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kinds", nargs="*", default=list(CASES))
    parser.add_argument("--child")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--budget", type=int, help="max_examples (default: the default, 100)")
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.budget)
        return
    if args.profile:
        _profile()
        return
    trees = [t.split("=", 1) for t in args.tree] or [["here", "."]]
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for _ in range(args.rounds):
        for case in args.kinds:
            for label, path in trees:
                run = _run(path, case, args.budget)
                results.setdefault((label, case), []).append(run)
                print(f"{label} {case} cold {run['cold']:.2f}s warm {run['warm']}", flush=True)
    head = f"{'kind':<20}" + "".join(
        f"{label + ' warm':>14}{label + ' cold':>14}" for label, _ in trees
    )
    print(head)
    for case in args.kinds:
        row = f"{case:<20}"
        for label, _ in trees:
            runs = results[(label, case)]
            warm = statistics.median(statistics.mean(r["warm"]) for r in runs)
            cold = statistics.median(r["cold"] for r in runs)
            row += f"{warm:>13.2f}s{cold:>13.2f}s"
        print(row)
    print(f"medians of {args.rounds} rounds; trees: " + ", ".join(f"{a}={b}" for a, b in trees))


if __name__ == "__main__":
    main()
