"""The canonical corpus: small, deterministic, versioned batches shared by diagnosis and
golden snapshots.

Every value is written here as a literal (log-ratios as logs of literal ratios), so the
corpus is the same on every machine. Bump ``CORPUS_VERSION`` when any batch changes: the
snapshot files record it (:func:`corpus_version`, per dtype) and a mismatch is reported
as such, not as a semantic change.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = ["CORPUS_VERSION", "canonical_corpus", "corpus_version"]

CORPUS_VERSION = 2
_FLOAT16_VERSION = 3
"""float16's corpus: its padding garbage a third as large (version 2 put log-ratios of
+/-30 at padding, whose exp is inf in float16, so a correct loss that multiplies by the
mask returned NaN there: inf * 0). The other dtypes' batches are version 2's."""
NAN = float("nan")


def corpus_version(dtype: torch.dtype) -> int:
    """The version of the corpus built in ``dtype``, which snapshot files record."""
    return _FLOAT16_VERSION if dtype is torch.float16 else CORPUS_VERSION


# (advantage, lengths-padded row of ratios) per batch; None marks padding.
_Row = tuple[float, Sequence[float | None]]
_BATCHES: dict[str, tuple[_Row, ...]] = {
    # Ragged rows including a one-token row; two trailing padding columns.
    "ragged": (
        (1.5, (1.1, None, None, None, None, None, None, None, None, None)),
        (-0.8, (0.9, 1.05, 0.7, None, None, None, None, None, None, None)),
        (0.6, (1.25, 0.95, 1.35, 1.0, 0.6, 1.15, None, None, None, None)),
        (-1.2, (1.02, 0.85, 1.4, 0.75, 1.1, 0.98, 1.24, 0.5, None, None)),
    ),
    # Every row one token long, T = 1.
    "one-token": ((1.0, (1.5,)), (-1.0, (0.7,)), (0.5, (1.0,))),
    # Ratios just inside and just outside 1 +/- 0.2 and 1 + 0.28, both advantage signs,
    # and the dual-clip region (ratios around c = 3 with A < 0).
    "clip-boundaries": (
        (1.0, (1.19, 1.21, 1.27, 1.29, 1.2001, 0.79)),
        (-1.0, (0.81, 0.79, 0.7, 0.73, 1.21, 1.3)),
        (-2.0, (2.9, 3.1, 4.0, 5.0, 10.0, 0.5)),
        (0.0, (1.3, 0.7, 1.0, 1.5, 0.5, 1.1)),
    ),
    # Log-ratios of a few 1e-4 so sequence ratios straddle GSPO's 1 - 3e-4 / 1 + 4e-4.
    "sequence-ratios": (
        (1.0, (1.0002, 1.0003, None, None, None, None, None)),
        (-0.5, (0.9996, 0.9999, 0.9995, 0.9997, 0.9998, None, None)),
        (2.0, (1.0006, 1.0004, 1.0005, 1.0007, 1.0002, 1.0003, 1.0006)),
    ),
    # Rollout/trainer mismatch (rho = pi_old / pi_rollout, below) past every IS threshold
    # the registry uses, with policy ratios inside every clip range.
    "rollout-mismatch": (
        (1.0, (1.05, 0.95, 1.1, 1.0, 0.9)),
        (-0.7, (0.95, 1.1, 1.0, None, None)),
        (0.5, (1.0, 1.05, None, None, None)),
        (-1.5, (1.1, 0.9, 1.0, 1.05, None)),
    ),
}

# rho = pi_old / pi_rollout per token, for the batches that set it (the others take
# rollout_logprobs = old_logprobs - 0.5 * ref_gap: rho within [0.905, 1.105]). Far from
# every threshold: token caps 2 (truncate) and 3 (mask), IcePop's band [0.5, 5], sequence
# products 2.4 (truncated at 2, kept by a mask at 3) and 3.375 (masked at 3), geometric
# means far outside [0.999, 1.001].
_ROLLOUT_RHO: dict[str, tuple[Sequence[float | None], ...]] = {
    "rollout-mismatch": (
        (2.5, 1.0, 0.4, 1.2, 1.0),  # truncated at 2 / kept at 3; 0.4 leaves [0.5, 5]
        (3.5, 1.0, 6.0, None, None),  # masked at 3; 6 leaves [0.5, 5]; product 21
        (1.5, 1.6, None, None, None),  # each token kept; product 2.4
        (1.5, 1.5, 1.5, 1.0, None),  # each token kept; product 3.375
    ),
}


def _batch(
    name: str, rows: tuple[_Row, ...], index: int, advantages: str, garbage_scale: float
) -> dict[str, torch.Tensor]:
    width = len(rows[0][1])
    mask = torch.tensor([[r is not None for r in row] for _, row in rows])
    b = len(rows)
    # logprobs: a fixed, row- and column-dependent pattern in [-3, -0.05]
    lp = torch.tensor(
        [[-0.05 - ((3 * i + 7 * j + index) % 11) * 0.29 for j in range(width)] for i in range(b)],
        dtype=torch.float64,
    )
    log_r = torch.tensor(
        [[math.log(r) if r is not None else 0.0 for r in row] for _, row in rows],
        dtype=torch.float64,
    )
    garbage = torch.tensor(
        [[(-1.0) ** (i + j) * (3.0 + i + j) for j in range(width)] for i in range(b)],
        dtype=torch.float64,
    ).mul_(garbage_scale)
    adv_rows = torch.tensor([a for a, _ in rows], dtype=torch.float64)
    if advantages == "token":
        col = torch.arange(width, dtype=torch.float64)
        adv = adv_rows[:, None] * (1.0 + 0.25 * torch.cos(col))[None, :]
        adv = torch.where(mask, adv, garbage)
    else:
        adv = adv_rows
    ref_gap = torch.tensor(
        [[0.1 * (((i + 2 * j) % 5) - 2) for j in range(width)] for i in range(b)],
        dtype=torch.float64,
    )
    rollout_gap = 0.5 * ref_gap
    if name in _ROLLOUT_RHO:
        rollout_gap = torch.tensor(
            [[math.log(r) if r is not None else 0.0 for r in row] for row in _ROLLOUT_RHO[name]],
            dtype=torch.float64,
        )
    return {
        "logprobs": torch.where(mask, lp, garbage),
        "old_logprobs": torch.where(mask, lp - log_r, -garbage),
        "advantages": adv,
        "response_mask": mask,
        "ref_logprobs": torch.where(mask, lp - ref_gap, garbage),
        "rollout_logprobs": torch.where(mask, lp - log_r - rollout_gap, garbage),
    }


def canonical_corpus(
    *, dtype: torch.dtype = torch.float64, advantages: str = "sequence"
) -> dict[str, dict[str, torch.Tensor]]:
    """The corpus batches by name, ``[B, T]`` right-padded, finite garbage at padding.

    ``advantages='token'`` gives ``[B, T]`` advantages (a fixed per-token modulation of the
    row's advantage). Float tensors are cast to ``dtype`` from their float64 literals; in
    float16 the padding garbage is a third as large (log-ratios within +/-10 at padding,
    whose exp float16 holds).
    """
    scale = 1.0 / 3.0 if dtype is torch.float16 else 1.0
    out = {}
    for index, (name, rows) in enumerate(_BATCHES.items()):
        batch = _batch(name, rows, index, advantages, scale)
        out[name] = {k: v.to(dtype) if v.is_floating_point() else v for k, v in batch.items()}
    return out
