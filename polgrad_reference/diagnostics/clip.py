"""Clip report: which tokens sit in each clip region, and exactly whose gradient dies.

For ``pg_clip`` with ratio ``r`` and advantage ``A`` (arXiv:1707.06347 Eq. 7; dual clip
arXiv:1912.09729 Eq. 5) the per-token loss is constant in ``r`` (zero gradient) exactly
in the open regions ``A > 0, r > 1 + eps_high`` (``high``), ``A < 0, r < 1 - eps_low``
(``low``) and, with dual clip ``c``, ``A < 0, r > c`` (``dual``):
:func:`polgrad_reference.clip_region`. How that becomes the set of tokens whose
``d loss / d logprobs`` is zero depends on the ratio kind:

- ``token``: the token itself (its gradient is local);
- ``sequence_token`` (GSPO-token, arXiv:2507.18071 Eq. 13): the token, with ``r`` the
  row's sequence ratio (the gradient is token-local);
- ``sequence`` (GSPO, arXiv:2507.18071 Eq. 7): every token of a row receives
  ``(s_b / L_b) sum_t w_t dloss_t/ds``, so the row dies when every token of it is
  clipped or has ``A = 0``, and at least one is clipped.

``cispo``'s clip truncates a stop-gradient weight that stays positive and ``pg`` /
``reinforce`` have no clip: their killed set is empty (the truncated fraction is still
reported). The killed set equals autograd's zero set of ``policy_loss`` (tokens with
``A != 0``; no IS-mask correction, no KL term): ``tests/reference/diagnostics/test_clip.py``.
"""

from __future__ import annotations

import dataclasses

import torch

from .. import _validate as v
from ..config import PolicyLossConfig, RatioKind, SurrogateKind
from ..errors import ConfigError, InputError
from ..ratios import masked_log_ratio, ratio
from ..surrogates import clip_region
from ._common import DiagnosticResult, token_tensors

__all__ = ["ClipReport", "clip_report"]


@dataclasses.dataclass(frozen=True)
class ClipReport(DiagnosticResult):
    """Fractions of response tokens per clip region and the killed-gradient set."""

    namespace = "clip"

    ratio_kind: str
    surrogate: str
    n_tokens: int
    frac_high: float
    """``A > 0`` and ``r > 1 + eps_high`` (gradient killed for pg_clip)."""
    frac_low: float
    """``A < 0`` and ``r < 1 - eps_low`` (gradient killed for pg_clip)."""
    frac_dual: float
    """``A < 0`` and ``r > dual_clip`` (gradient killed)."""
    frac_outside_range: float
    """``r`` outside ``[1 - eps_low, 1 + eps_high]`` whatever the sign of ``A`` (for cispo:
    the fraction whose weight is truncated)."""
    frac_killed: float
    """Fraction of response tokens whose gradient the clip sets to exactly zero."""
    rows_killed: int
    """Rows all of whose tokens are killed."""
    killed: torch.Tensor = dataclasses.field(repr=False, compare=False)
    """Bool ``[B, T]``: the killed set (False at padding)."""

    def _metrics(self) -> dict[str, float]:
        return {
            "frac_high": self.frac_high,
            "frac_low": self.frac_low,
            "frac_dual": self.frac_dual,
            "frac_outside_range": self.frac_outside_range,
            "frac_killed": self.frac_killed,
            "rows_killed": float(self.rows_killed),
            "n_tokens": float(self.n_tokens),
        }

    def summary(self) -> str:
        return (
            f"clip ({self.surrogate}, {self.ratio_kind} ratio): killed {self.frac_killed:.2%} "
            f"of {self.n_tokens} tokens (high {self.frac_high:.2%}, low {self.frac_low:.2%}, "
            f"dual {self.frac_dual:.2%}); outside range {self.frac_outside_range:.2%}"
        )


def clip_report(
    cfg: PolicyLossConfig,
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
) -> ClipReport:
    """Clip regions and the killed-gradient set of ``cfg`` on a ``[B, T]`` batch.

    ``advantages`` is ``[B]`` or ``[B, T]``; any float dtype (float64 internally)."""
    if not isinstance(cfg, PolicyLossConfig):
        raise ConfigError(f"cfg must be a PolicyLossConfig, got {type(cfg).__name__}")
    v.require_tensor("advantages", advantages)
    adv_in = advantages
    if advantages.dim() == 1:
        if not isinstance(response_mask, torch.Tensor) or response_mask.dim() != 2:
            adv_in = advantages  # the mask check below names the problem
        elif advantages.shape[0] != response_mask.shape[0]:
            raise InputError(
                f"advantages must have shape [B] = [{response_mask.shape[0]}] or [B, T] "
                f"like response_mask, got {list(advantages.shape)}"
            )
        else:
            adv_in = advantages[:, None].expand(response_mask.shape)
    mask, t = token_tensors(
        response_mask, {"logprobs": logprobs, "old_logprobs": old_logprobs, "advantages": adv_in}
    )
    adv = t["advantages"]
    r = ratio(cfg.ratio, masked_log_ratio(t["logprobs"], t["old_logprobs"], mask), mask)
    clip = cfg.clip
    pos, neg = (adv > 0) & mask, (adv < 0) & mask
    false = torch.zeros_like(mask)
    high = pos & (r > clip.high) if clip.high is not None else false
    low = neg & (r < clip.low) if clip.low is not None else false
    dual = neg & (r > clip.dual_clip) if clip.dual_clip is not None else false
    outside = false.clone()
    if clip.high is not None:
        outside |= mask & (r > clip.high)
    if clip.low is not None:
        outside |= mask & (r < clip.low)

    if cfg.surrogate is SurrogateKind.PG_CLIP:
        region = clip_region(ratio=r, advantages=adv, clip=clip) & mask
        if cfg.ratio is RatioKind.SEQUENCE:
            dead_or_zero = region | (adv == 0) | ~mask
            row_dead = dead_or_zero.all(dim=1) & region.any(dim=1)
            killed = mask & row_dead[:, None]
        else:
            killed = region
    else:
        killed = false
    n = int(mask.sum())
    lengths = mask.sum(dim=1)
    return ClipReport(
        ratio_kind=cfg.ratio.value,
        surrogate=cfg.surrogate.value,
        n_tokens=n,
        frac_high=int(high.sum()) / n,
        frac_low=int(low.sum()) / n,
        frac_dual=int(dual.sum()) / n,
        frac_outside_range=int(outside.sum()) / n,
        frac_killed=int(killed.sum()) / n,
        rows_killed=int(((killed.sum(dim=1) == lengths) & (lengths > 0)).sum()),
        killed=killed,
    )
