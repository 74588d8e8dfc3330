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
``se^2 = G/(G-1) sum_c (sum_{b in c} grad D(m) . (z_b - m))^2 / B^2`` over ``G`` clusters
``c`` (the ``groups``, or rows) and the interval ``D +- t_{G-1}((1 + level)/2) se``
(approximate: its coverage is measured in ``bench/calibration.py``).

The alarm is a test, not the interval, and ``z`` (for ``RunMonitor``) is the probit of its
randomized p-value. ``D`` is ``sum_b c_b A_b`` times a positive factor, ``c_b = W_b (L_b -
L_bar)``, and:

- without ``groups`` — **null:** the rows are independent and each advantage is
  symmetric about 0 given its length (``E[A | L] = 0`` with symmetry; the spread may
  depend on length). Flipping the signs of any rows leaves that distribution unchanged
  and leaves ``s_L`` and ``sum_b W_b |A_b|`` as they are, so the Monte Carlo sign-flip
  p-value of ``D`` is exact at every ``B`` (Hemerik & Goeman 2018); advantages whose mean
  is not 0 (uncentred rewards) do drive token-mean towards long, and are rightly flagged.
- with ``groups`` (prompt ids; GRPO-style advantages are dependent within a prompt and not
  symmetric) — **null:** within each prompt the advantages are exchangeable and
  independent of the lengths; permuting them within prompts gives an exact p-value.
  Group-centred advantages make ``D``'s null centre 0.

Two-sided p-value of ``|D|``; the probit ``z`` of the randomized upper p-value is exactly
``N(0, 1)`` under the null (``z > 0``: towards long). The normal ``D / se`` it replaces
(still reported as ``t``) had variance 1.25 at ``B = 64``, lengths ``U(16..64)``
(``bench/calibration.py``): the delta-method ``se`` is an estimate with few effective
degrees of freedom (``c_b`` is skewed), and it is asymmetric in the sign of ``D``.
Tests: ``tests/reference/diagnostics/test_length.py``.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .. import _validate as v
from ..aggregate import token_weights
from ..config import Aggregation, _enum
from ..errors import ConfigError, InputError
from ._common import (
    COMPUTE,
    DiagnosticResult,
    Resampler,
    can_decide,
    check_resamples,
    check_seed,
    group_labels,
    log_permutations,
    log_sign_patterns,
    min_permutation_rows,
    min_sign_rows,
    probit,
    randomization_p,
    student_t_quantile,
)

__all__ = ["LengthBias", "length_bias"]


@dataclasses.dataclass(frozen=True)
class LengthBias(DiagnosticResult):
    """The length drive ``D`` of one batch under one aggregation, its interval and test."""

    namespace = "length"

    aggregation: str
    drive: float
    stderr: float
    """Delta-method standard error, clustered by ``groups`` (rows without)."""
    ci_low: float
    ci_high: float
    level: float
    t: float
    """Row-clustered delta-method ``D / se_rows`` (0 if ``se_rows`` is 0): approximate,
    shown for orientation; the test and ``z`` do not use it."""
    z: float
    """Probit of the randomized upper permutation p-value: exactly ``N(0, 1)`` under the
    null (``> 0``: towards long); feed it to ``RunMonitor`` (direction ``"both"``)."""
    p_value: float
    """Two-sided randomization p-value of ``|D|``."""
    alarm: bool
    """``decided`` and ``p_value <= 1 - level``."""
    decided: bool
    """False when the groups allow too few rearrangements to decide (``min_rows``)."""
    min_rows: int
    """Rows (one group) the test needs to decide at ``1 - level``."""
    method: str
    """``"sign-flip"`` (no ``groups``) or ``"permutation"`` (within ``groups``)."""
    weight_length_slope: float
    """Least-squares slope of ``log W_b`` on ``log L_b``: 1 for token-mean, 0 for
    seq-mean-token-mean (0 when all lengths are equal)."""
    mean_length: float
    n_sequences: int
    n_clusters: int
    n_resamples: int

    def _metrics(self) -> dict[str, float]:
        return {
            "drive": self.drive,
            "stderr": self.stderr,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "t": self.t,
            "z": self.z,
            "p_value": self.p_value,
            "alarm": float(self.alarm),
            "decided": float(self.decided),
            "weight_length_slope": self.weight_length_slope,
            "mean_length": self.mean_length,
        }

    def summary(self) -> str:
        if not self.decided:
            verdict = (
                f"undecided: too few rows to decide (a group needs at least {self.min_rows} "
                f"rows at alpha={1 - self.level:.3g})"
            )
        else:
            verdict = f"{'ALARM' if self.alarm else 'ok'} ({self.method} p={self.p_value:.3g})"
        lean = "long" if self.drive > 0 else "short"
        return (
            f"length bias {verdict} ({self.aggregation}): drive {self.drive:+.3f} towards "
            f"{lean}, {self.level:.0%} CI [{self.ci_low:+.3f}, {self.ci_high:+.3f}] over "
            f"{self.n_sequences} rows"
        )


def _drive_and_influence(
    w: torch.Tensor, a: torch.Tensor, lengths: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``D`` ``[M]`` and the row influences ``grad D(m) . (z_b - m)`` ``[M, B]`` for
    advantages ``a`` ``[M, B]`` (weights ``w`` and ``lengths`` ``[B]`` fixed), with the
    gradient of ``D = (m1 - m3 m2) / (s m5)``, ``s = sqrt(m4 - m3^2)``, in closed form:
    ``(1, -m3, -m2 + N m3 / s^2, -N / (2 s^2), -N / m5) / (s m5)``, ``N = m1 - m3 m2``."""
    wa = w * a
    wal = wa * lengths
    wabs = w * a.abs()
    m1, m2, m5 = wal.mean(dim=-1), wa.mean(dim=-1), wabs.mean(dim=-1)
    m3 = lengths.mean()
    m4 = (lengths * lengths).mean()
    var = m4 - m3 * m3
    sd = torch.sqrt(var)
    num = m1 - m3 * m2
    scale = 1.0 / (sd * m5)
    d = num * scale
    lc, l2c = lengths - m3, lengths * lengths - m4
    infl = (
        (wal - m1[..., None])
        - m3 * (wa - m2[..., None])
        + (-m2 + num * m3 / var)[..., None] * lc
        - (num / (2.0 * var))[..., None] * l2c
        - (num / m5)[..., None] * (wabs - m5[..., None])
    ) * scale[..., None]
    return d, infl


def _drive_only(w: torch.Tensor, a: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``D`` ``[M]`` for advantages ``a`` ``[M, B]`` (``w``, ``lengths`` fixed)."""
    c = w * (lengths - lengths.mean())
    sd = torch.sqrt((lengths * lengths).mean() - lengths.mean() ** 2)
    return (a @ c) / (sd * (a.abs() @ w))


def length_bias(
    *,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    aggregation: Aggregation | str,
    budget: int | None = None,
    groups: torch.Tensor | None = None,
    level: float = 0.95,
    n_resamples: int | None = None,
    seed: int = 0,
) -> LengthBias:
    """Length drive of the sequence advantages ``[B]`` under ``aggregation`` (``budget``
    for token-sum-norm), its ``level`` interval clustered by ``groups`` (an integer ``[B]``
    tensor of prompt ids; rows are the clusters when None) and the sign-flip (no groups)
    or within-group permutation test at ``1 - level`` (module docstring).

    ``n_resamples`` rearrangements (None: ``max(999, ceil(20 / (1 - level)) - 1)``) drawn
    from ``seed``; in a run, pass a different seed at every step (the step number)."""
    mode = _enum(Aggregation, aggregation, "aggregation")
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ConfigError(f"level must be a confidence level in (0, 1), got {level!r}")
    alpha = 1.0 - float(level)
    m_perm = check_resamples(n_resamples, alpha)
    seed = check_seed(seed)
    mask = v.require_response_mask(response_mask)
    adv = v.require_float_tensor("advantages", advantages)
    v.require_shape("advantages", adv, tuple(mask.shape[:1]), "[B]")
    v.require_same_device({"advantages": adv, "response_mask": mask})
    v.require_finite_where("advantages", adv, None)
    rows = mask.shape[0]
    labels = group_labels(groups, mask)
    # the interval's clusters: the groups, or every row its own
    cluster = torch.arange(rows, device=mask.device) if groups is None else labels.to(mask.device)
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
    d_t, infl_t = _drive_and_influence(w, a[None], lengths)
    drive, infl = float(d_t[0]), infl_t[0]
    per_cluster = torch.zeros(n_clusters, device=mask.device, dtype=COMPUTE)
    per_cluster.index_add_(0, cluster, infl)
    se = math.sqrt(n_clusters / (n_clusters - 1) * float(per_cluster.square().sum())) / rows
    half = student_t_quantile(0.5 + level / 2.0, n_clusters - 1) * se
    se_rows = math.sqrt(rows / (rows - 1) * float(infl.square().sum())) / rows
    stat = drive / se_rows if se_rows > 0 else 0.0

    sampler = Resampler(seed, mask.device)
    u = sampler.uniform()
    null = []
    if groups is None:  # sign flips: s_L and sum W|A| unchanged, D = sum c_b A_b / const
        sd = math.sqrt(float((lengths * lengths).mean() - lengths.mean() ** 2))
        c = w * (lengths - lengths.mean()) * a.abs() / (sd * float((w * a.abs()).sum()))
        for size in sampler.chunks(m_perm, rows):
            null.append(sampler.signs(size, rows) @ c)
        decided = can_decide(log_sign_patterns(rows), alpha)
        min_rows = min_sign_rows(alpha)
        method = "sign-flip"
    else:
        for size in sampler.chunks(m_perm, rows):
            null.append(_drive_only(w, a[sampler.permutations(size, labels)], lengths))
        decided = can_decide(log_permutations(labels), alpha)
        min_rows = min_permutation_rows(alpha)
        method = "permutation"
    null_d = torch.cat(null)
    p_two = randomization_p(abs(drive), null_d.abs(), u=u)[0]
    z = probit(randomization_p(drive, null_d, u=u)[1])

    logw, logl = torch.log(w), torch.log(lengths)
    lc = logl - logl.mean()
    slope = float((lc * (logw - logw.mean())).sum() / lc.square().sum())
    return LengthBias(
        aggregation=mode.value,
        drive=drive,
        stderr=se,
        ci_low=drive - half,
        ci_high=drive + half,
        level=float(level),
        t=stat,
        z=z,
        p_value=p_two,
        alarm=decided and p_two <= alpha,
        decided=decided,
        min_rows=min_rows,
        method=method,
        weight_length_slope=slope,
        mean_length=float(lengths.mean()),
        n_sequences=rows,
        n_clusters=n_clusters,
        n_resamples=m_perm,
    )
