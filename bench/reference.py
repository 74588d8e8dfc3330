"""Benchmark: ``policy_loss`` against a minimal hand-written torch loss, forward+backward.

Configs: dapo (token-mean, clip 0.2/0.28) and grpo (seq-mean-token-mean, clip 0.2, k3 KL
in the loss, coef 0.04). B=64, T=4096, float32, CPU. Time is the median of interleaved
repetitions in one process; peak memory is the peak of live tensor bytes during one
forward+backward, from the torch profiler's allocation events.

Run: ``python bench/reference.py`` (add ``--reps N``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from polgrad_reference import ALGORITHMS, policy_loss

B, T = 64, 4096
Loss = Callable[[dict[str, torch.Tensor]], torch.Tensor]


def make_inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    logprobs = -torch.rand((B, T), generator=g) * 5
    return {
        "logprobs": logprobs,
        "old_logprobs": logprobs + (torch.rand((B, T), generator=g) - 0.5) * 0.6,
        "ref_logprobs": logprobs + (torch.rand((B, T), generator=g) - 0.5) * 0.2,
        "advantages": torch.randn((B,), generator=g),
        "response_mask": mask,
    }


def hand_dapo(x: dict[str, torch.Tensor]) -> torch.Tensor:
    """What one would write by hand: token-mean PPO clip, eps 0.2 / 0.28."""
    mask = x["response_mask"].float()
    ratio = torch.exp(x["logprobs"] - x["old_logprobs"])
    adv = x["advantages"][:, None]
    per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.28))
    return (per_token * mask).sum() / mask.sum()


def hand_grpo(x: dict[str, torch.Tensor]) -> torch.Tensor:
    """By hand: seq-mean-token-mean PPO clip 0.2 plus 0.04 * k3 KL with the same weights."""
    mask = x["response_mask"].float()
    ratio = torch.exp(x["logprobs"] - x["old_logprobs"])
    adv = x["advantages"][:, None]
    per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    lr = x["ref_logprobs"] - x["logprobs"]
    per_token = per_token + 0.04 * (torch.exp(lr) - 1 - lr)
    return ((per_token * mask).sum(dim=1) / mask.sum(dim=1)).mean()


def reference(name: str) -> Loss:
    cfg = ALGORITHMS[name].loss

    def run(x: dict[str, torch.Tensor]) -> torch.Tensor:
        return policy_loss(cfg, **x).loss

    return run


IMPLS: dict[str, Loss] = {
    "dapo/hand": hand_dapo,
    "dapo/reference": reference("dapo"),
    "grpo/hand": hand_grpo,
    "grpo/reference": reference("grpo"),
}


def step(fn: Loss, x: dict[str, torch.Tensor]) -> None:
    lp = x["logprobs"].detach().requires_grad_()
    fn({**x, "logprobs": lp}).backward()


def peak_tensor_mib(name: str, x: dict[str, torch.Tensor]) -> float:
    """Peak of live CPU tensor bytes during one forward+backward, MiB, from the torch
    profiler's allocation events (exact and repeatable, unlike RSS)."""
    fn = IMPLS[name]
    step(fn, x)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step(fn, x)
    events = prof.profiler.kineto_results.events()  # type: ignore[union-attr]
    allocations = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in allocations:
        live += nbytes
        peak = max(peak, live)
    return peak / 2**20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=60)
    args = parser.parse_args()
    torch.set_num_threads(1)
    x = make_inputs()
    times: dict[str, list[float]] = {k: [] for k in IMPLS}
    for _ in range(3):
        for fn in IMPLS.values():
            step(fn, x)
    for _ in range(args.reps):
        for key, fn in IMPLS.items():
            t0 = time.perf_counter()
            step(fn, x)
            times[key].append(time.perf_counter() - t0)
    mem = {key: peak_tensor_mib(key, x) for key in IMPLS}
    print(f"B={B} T={T} float32, {args.reps} interleaved reps, 1 thread, torch {torch.__version__}")
    print(f"{'impl':<16} {'median ms':>10} {'peak tensor MiB':>20}")
    for key in IMPLS:
        print(f"{key:<16} {statistics.median(times[key]) * 1e3:>10.3f} {mem[key]:>20.1f}")
    for algo in ("dapo", "grpo"):
        t_ratio = statistics.median(times[f"{algo}/reference"]) / statistics.median(
            times[f"{algo}/hand"]
        )
        m_hand = max(mem[f"{algo}/hand"], 1e-9)
        print(
            f"{algo}: time ratio reference/hand = {t_ratio:.3f}, "
            f"memory ratio = {mem[f'{algo}/reference'] / m_hand:.3f}"
        )


if __name__ == "__main__":
    main()
