"""Length bias: how an aggregation's gradient signal leans towards long or short responses.

Under an aggregation with token weights ``w_bt`` (``polgrad_reference.token_weights``) the
policy term's gradient is ``sum_b A_b W_b g_b`` with row weight ``W_b = sum_t w_bt`` and
``g_b`` the row's mean score ``(1/L_b) sum_t grad log pi``: a sequence's share of the
update is ``W_b A_b``. Token-mean and token-sum-type modes give ``W_b ~ L_b``,
seq-mean-token-mean ``W_b`` constant (Dr.GRPO's analysis, arXiv:2503.20783 Sec. 3.1). The
*length drive* is the advantage-weighted standardised length of that signal,

    D = sum_b W_b A_b (L_b - L_bar) / (s_L sum_b W_b |A_b|),      s_L = sd(L),

in ``[-max|z_L|, max|z_L|]``: ``D > 0`` means the update raises the likelihood of long
responses more than of short ones. ``D`` is invariant to the scale of ``W`` (so to the
batch-dependent normaliser of every mode) and is a smooth function of five row means
``m = mean_b(W A L, W A, L, L^2, W |A|)``; the delta method gives
``Var(D) = G/(G-1) sum_c (sum_{b in c} grad D(m) . (z_b - m))^2 / B^2`` over ``G``
clusters ``c`` (rows, or the ``groups`` of GRPO-style advantages, whose rows are
dependent), and the interval ``D +- Phi^{-1}((1 + level) / 2) se``. Its coverage is
calibrated by Monte Carlo in ``tests/reference/diagnostics/test_length.py``; under the null
``E[A | L] = 0``, ``D = 0``.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .. import _validate as v
from ..aggregate import token_weights
from ..config import Aggregation, _enum
from ..errors import ConfigError, InputError
from ._common import COMPUTE, DiagnosticResult, normal_quantile

__all__ = ["LengthBias", "length_bias"]


@dataclasses.dataclass(frozen=True)
class LengthBias(DiagnosticResult):
    """The length drive ``D`` of one batch under one aggregation, with its interval."""

    namespace = "length"

    aggregation: str
    drive: float
    stderr: float
    ci_low: float
    ci_high: float
    level: float
    z: float
    """``D / se``: ``N(0, 1)`` asymptotically under ``E[A | L] = 0``; 0 if ``se`` is 0."""
    alarm: bool
    """The interval excludes 0."""
    weight_length_slope: float
    """Least-squares slope of ``log W_b`` on ``log L_b``: 1 for token-mean, 0 for
    seq-mean-token-mean (0 when all lengths are equal)."""
    mean_length: float
    n_sequences: int
    n_clusters: int

    def _metrics(self) -> dict[str, float]:
        return {
            "drive": self.drive,
            "stderr": self.stderr,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "z": self.z,
            "alarm": float(self.alarm),
            "weight_length_slope": self.weight_length_slope,
            "mean_length": self.mean_length,
        }

    def summary(self) -> str:
        verdict = "ALARM" if self.alarm else "ok"
        lean = "long" if self.drive > 0 else "short"
        return (
            f"length bias {verdict} ({self.aggregation}): drive {self.drive:+.3f} towards "
            f"{lean}, {self.level:.0%} CI [{self.ci_low:+.3f}, {self.ci_high:+.3f}] over "
            f"{self.n_sequences} rows"
        )


def _drive(m: torch.Tensor) -> torch.Tensor:
    wal, wa, ell, ell2, wabs = m.unbind(-1)
    sd = torch.sqrt(ell2 - ell * ell)
    return (wal - ell * wa) / (sd * wabs)


def length_bias(
    *,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    aggregation: Aggregation | str,
    budget: int | None = None,
    groups: torch.Tensor | None = None,
    level: float = 0.95,
) -> LengthBias:
    """Length drive of the sequence advantages ``[B]`` under ``aggregation`` (``budget``
    for token-sum-norm), with a ``level`` delta-method interval clustered by ``groups``
    (an integer ``[B]`` tensor of prompt ids; rows are the clusters when None)."""
    mode = _enum(Aggregation, aggregation, "aggregation")
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ConfigError(f"level must be a confidence level in (0, 1), got {level!r}")
    mask = v.require_response_mask(response_mask)
    adv = v.require_float_tensor("advantages", advantages)
    v.require_shape("advantages", adv, tuple(mask.shape[:1]), "[B]")
    v.require_same_device({"advantages": adv, "response_mask": mask})
    v.require_finite_where("advantages", adv, None)
    rows = mask.shape[0]
    if groups is None:
        cluster = torch.arange(rows, device=mask.device)
    else:
        g = v.require_tensor("groups", groups)
        if g.dtype.is_floating_point or g.dtype.is_complex or g.dtype == torch.bool:
            raise InputError(f"groups must be an integer tensor of prompt ids, got {g.dtype}")
        v.require_shape("groups", g, (rows,), "[B]")
        v.require_same_device({"groups": g, "response_mask": mask})
        cluster = torch.unique(g, return_inverse=True)[1]
    n_clusters = int(cluster.max()) + 1
    if n_clusters < 2:
        raise InputError(
            f"length_bias needs at least 2 clusters (rows or groups), got {n_clusters}"
        )
    lengths = mask.sum(dim=1).to(COMPUTE)
    if float(lengths.max()) == float(lengths.min()):
        raise InputError(
            "every row has the same length "
            f"({int(lengths[0])}); a length bias needs responses of different lengths"
        )
    w = token_weights(mask, mode, budget=budget).sum(dim=1)
    w = w / w.max()  # D is scale-invariant; keep the means well-scaled
    a = adv.detach().to(COMPUTE)
    if float((w * a.abs()).sum()) == 0.0:
        raise InputError("advantages are all 0: no gradient signal to measure a length bias of")
    z_rows = torch.stack([w * a * lengths, w * a, lengths, lengths * lengths, w * a.abs()], -1)
    means = z_rows.mean(dim=0)
    with torch.enable_grad():
        m = means.clone().requires_grad_(True)
        d = _drive(m)
        (grad,) = torch.autograd.grad(d, m)
    drive = float(d.detach())
    infl = (z_rows - means) @ grad
    per_cluster = torch.zeros(n_clusters, device=mask.device, dtype=COMPUTE)
    per_cluster.index_add_(0, cluster, infl)
    corr = n_clusters / (n_clusters - 1)
    se = math.sqrt(corr * float(per_cluster.square().sum())) / rows
    half = normal_quantile(0.5 + level / 2.0) * se
    logw, logl = torch.log(w), torch.log(lengths)
    lc = logl - logl.mean()
    slope = float((lc * (logw - logw.mean())).sum() / lc.square().sum())
    lo, hi = drive - half, drive + half
    return LengthBias(
        aggregation=mode.value,
        drive=drive,
        stderr=se,
        ci_low=lo,
        ci_high=hi,
        level=float(level),
        z=drive / se if se > 0 else 0.0,
        alarm=lo > 0 or hi < 0,
        weight_length_slope=slope,
        mean_length=float(lengths.mean()),
        n_sequences=rows,
        n_clusters=n_clusters,
    )
