"""Figures of ``docs/logprobs.md``: the rounding error of a low-precision log-softmax and the
kept-mass bias of a truncating sampler, on synthetic next-token distributions.

The synthetic batch: ``V = 32768``; at each position Zipf-shaped logits
``z_v = offset - s log(rank_v) + N(0, noise^2)`` over a random permutation of the
vocabulary, the exponent ``s`` uniform in ``[s_min, s_max]`` per position (small ``s``:
a flat, high-entropy step; large ``s``: a confident one), stored in float32. The rounding
table rounds them to bfloat16 first (a bfloat16 model's output), so it counts only the
error of the computation; sampled tokens are drawn from ``softmax(z / tau)``.

Run: ``python bench/logprobs_figures.py`` (add ``--rows/--cols/--vocab``; CPU, about two
minutes at the defaults on two cores: the top-p sort dominates).
"""

from __future__ import annotations

import argparse

import torch

from polgrad_reference.diagnostics.sampling import sampling_bias
from polgrad_reference.logprobs import log_softmax_rounding_error


def synthetic_logits(
    seed: int,
    rows: int,
    cols: int,
    vocab: int,
    *,
    s_range: tuple[float, float] = (1.05, 6.0),
    noise: float = 0.5,
    offset: float = 0.0,
) -> torch.Tensor:
    """``[rows, cols, vocab]`` float32 logits of the family in the module docstring."""
    g = torch.Generator().manual_seed(seed)
    log_rank = torch.arange(1, vocab + 1, dtype=torch.float64).log()
    s = s_range[0] + (s_range[1] - s_range[0]) * torch.rand(
        (rows, cols, 1), generator=g, dtype=torch.float64
    )
    out = torch.empty((rows, cols, vocab), dtype=torch.float32)
    for r in range(rows):  # one row at a time: the float64 draft stays small
        z = (
            offset
            - s[r] * log_rank
            + noise * torch.randn((cols, vocab), generator=g, dtype=torch.float64)
        )
        out[r] = z[:, torch.randperm(vocab, generator=g)].float()
    return out


def sample(logits: torch.Tensor, tau: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(logits.double() / tau, dim=-1).reshape(-1, logits.shape[-1])
    return torch.multinomial(p, 1, generator=g).reshape(logits.shape[:-1])


def rounding_table(z: torch.Tensor) -> None:
    print("## log-softmax error at sampled tokens, bfloat16 logits (vs float64 on them)")
    print("| logits offset | temperature | compute dtype | max abs (nats) | mean abs | "
          "max abs ratio error |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for offset in (0.0, 20.0):
        zo = (z + offset).bfloat16()
        for tau in (1.0, 0.7):
            y = sample(zo, tau, seed=1)
            for dtype in (torch.bfloat16, torch.float16, torch.float32):
                e = log_softmax_rounding_error(
                    logits=zo, labels=y, temperature=tau, compute_dtype=dtype
                )
                print(
                    f"| {offset:g} | {tau:g} | {e.compute_dtype} | {e.max_abs:.3g} | "
                    f"{e.mean_abs:.3g} | {e.max_ratio_error:.3g} |"
                )


def bias_table(z: torch.Tensor) -> None:
    mask = torch.ones(z.shape[:2], dtype=torch.bool)
    print("## kept-mass bias of the trainer/rollout ratio (temperature 1)")
    print("| top_p | top_k | mean ratio | median | min | outside [0.9, 1.1] | mean kept |")
    print("|---|---|---|---|---|---|---|")
    for top_p, top_k in ((1.0, 0), (0.95, 0), (0.9, 0), (0.8, 0), (1.0, 50), (0.9, 50)):
        r = sampling_bias(logits=z, response_mask=mask, temperature=1.0, top_p=top_p, top_k=top_k)
        print(
            f"| {top_p:g} | {top_k} | {r.mean_ratio:.4f} | {r.median_ratio:.4f} | "
            f"{r.min_ratio:.4f} | {r.frac_outside_band:.1%} | {r.mean_kept_tokens:.1f} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--cols", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--no-bias", action="store_true", help="only the rounding table")
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    z = synthetic_logits(0, args.rows, args.cols, args.vocab)
    print(f"B={args.rows}, T={args.cols}, V={args.vocab}, s ~ U[1.05, 6], noise 0.5\n")
    rounding_table(z)
    print()
    if not args.no_bias:
        bias_table(z)


if __name__ == "__main__":
    main()
