"""A small ragged-batch builder for the reference's own tests (seeded, float64)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st


def build(
    lengths: list[int], seed: int, *, width: int | None = None, gap: float = 0.5
) -> dict[str, torch.Tensor]:
    """Right-padded batch with NaN garbage at padding, log-ratio gaps in ``[-gap, gap]``."""
    width = width or max(lengths)
    g = torch.Generator().manual_seed(seed)
    b = len(lengths)
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    lp = -(torch.rand((b, width), generator=g, dtype=torch.float64) * 3 + 0.05)
    old = lp - (torch.rand((b, width), generator=g, dtype=torch.float64) * 2 - 1) * gap
    ref = lp - (torch.rand((b, width), generator=g, dtype=torch.float64) * 2 - 1) * gap
    roll = old - (torch.rand((b, width), generator=g, dtype=torch.float64) * 2 - 1) * gap
    adv = torch.randn((b,), generator=g, dtype=torch.float64)
    nan = torch.tensor(float("nan"), dtype=torch.float64)
    return {
        "logprobs": torch.where(mask, lp, nan),
        "old_logprobs": torch.where(mask, old, nan),
        "ref_logprobs": torch.where(mask, ref, nan),
        "rollout_logprobs": torch.where(mask, roll, nan),
        "advantages": adv,
        "response_mask": mask,
    }


@st.composite
def ragged(draw: st.DrawFn, max_batch: int = 6, max_length: int = 12) -> dict[str, torch.Tensor]:
    """Hypothesis strategy over :func:`build`: sizes and lengths drawn, values seeded."""
    lengths = draw(st.lists(st.integers(1, max_length), min_size=1, max_size=max_batch))
    pad = draw(st.integers(0, 3))
    seed = draw(st.integers(0, 2**16))
    gap = draw(st.sampled_from([0.05, 0.3, 1.0]))
    return build(lengths, seed, width=max(lengths) + pad, gap=gap)
