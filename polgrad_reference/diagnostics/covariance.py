"""Covariance of the sampled tokens' log-probability and their advantage: the leading
indicator of entropy collapse.

For a softmax policy, Cui et al. (arXiv:2505.22617, "The Entropy Mechanism of RL for
Reasoning Language Models", entropy-dynamics analysis) show that one natural
policy-gradient step of size ``eta`` changes the entropy by about
``-eta Cov_{a ~ pi}(log pi(a), A(a))``: a positive covariance (confident tokens being
reinforced) drains entropy before the entropy curve itself bends; their Clip-Cov and
KL-Cov act on tokens with large centred products ``(log pi - mean)(A - mean)``. This
module computes that batch covariance over response tokens,

    cov = (1/N) sum_i (x_i - x_bar)(y_i - y_bar),   x = logprobs, y = advantages,

with a standard error that treats rows as the units (advantages are shared within a
response): with ``IF_i = (x_i - x_bar)(y_i - y_bar) - cov``,
``se^2 = B/(B-1) sum_b (sum_{i in b} IF_i)^2 / N^2``, and the studentized ``t = cov / se``.

The test (row advantages, ``[B]`` or constant along each row): **null** — within each
``groups`` cell (prompt; the whole batch without ``groups``) the rows' advantages are
exchangeable and independent of the rows' log-probabilities. Permuting the advantages
within groups leaves the null distribution unchanged, so the Monte Carlo permutation
p-value of ``t`` has level ``<= alpha`` at every ``B`` (Hemerik & Goeman 2018), and the
randomized p-value's probit ``z`` is exactly ``N(0, 1)`` (what ``RunMonitor`` needs).
Studentizing keeps the test asymptotically valid when advantages are merely uncorrelated
with log-probabilities (DiCiccio & Romano 2017, JASA 112, "Robust permutation tests for
correlation and regression coefficients"). The normal approximation of ``t`` it replaces
rejected 0.145 of null batches at ``B = 4`` (``bench/calibration.py``).

Token-varying advantages (``[B, T]`` that differ along a row, e.g. GAE) cannot be
permuted between rows of different lengths: the p-value is then Student-t with ``B - 1``
degrees of freedom (``method="clustered-t"``), an approximation that decides only from
``MIN_ROWS_CLUSTERED_T`` rows (its level measured in ``bench/calibration.py``).
Tests: ``tests/reference/diagnostics/test_covariance.py``.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .. import _validate as v
from ..errors import InputError
from ._common import (
    COMPUTE,
    DiagnosticResult,
    Resampler,
    can_decide,
    check_alpha,
    check_resamples,
    check_seed,
    group_labels,
    log_permutations,
    min_permutation_rows,
    probit,
    randomization_p,
    student_t_cdf,
    token_tensors,
)

__all__ = ["MIN_ROWS_CLUSTERED_T", "LogprobAdvantageCovariance", "logprob_advantage_covariance"]

MIN_ROWS_CLUSTERED_T = 32
"""Rows from which the clustered-t approximation (token-varying advantages) decides."""


@dataclasses.dataclass(frozen=True)
class LogprobAdvantageCovariance(DiagnosticResult):
    """Token-level ``Cov(log pi, A)``, its row-clustered standard error and the test."""

    namespace = "entropy_cov"

    cov: float
    stderr: float
    t: float
    """Studentized ``cov / stderr`` (0 when ``stderr`` is 0); the test's statistic."""
    z: float
    """Probit of the randomized p-value: exactly ``N(0, 1)`` under the null
    (``method="permutation"``); feed it to ``RunMonitor`` (direction ``"up"``)."""
    p_value: float
    """One-sided: small when entropy is being drained (positive covariance)."""
    alpha: float
    alarm: bool
    """``decided`` and ``p_value <= alpha``."""
    decided: bool
    """False when the batch has too few rows to decide (``min_rows``)."""
    min_rows: int
    method: str
    """``"permutation"`` (row advantages) or ``"clustered-t"`` (token-varying ones)."""
    corr: float
    n_tokens: int
    n_sequences: int
    n_resamples: int

    def _metrics(self) -> dict[str, float]:
        return {
            "cov": self.cov,
            "stderr": self.stderr,
            "t": self.t,
            "z": self.z,
            "p_value": self.p_value,
            "alarm": float(self.alarm),
            "decided": float(self.decided),
            "corr": self.corr,
            "n_tokens": float(self.n_tokens),
        }

    def summary(self) -> str:
        if not self.decided:
            verdict = (
                f"undecided: too few rows to decide ({self.n_sequences} rows; the {self.method} "
                f"test needs at least {self.min_rows} at alpha={self.alpha:g})"
            )
        else:
            verdict = f"{'ALARM' if self.alarm else 'ok'} (p={self.p_value:.3g}, {self.method})"
        return (
            f"Cov(log pi, A) {self.cov:+.4g} +- {self.stderr:.2g} (t={self.t:+.2f}, "
            f"corr {self.corr:+.3f}) over {self.n_tokens} tokens: {verdict}"
        )


def _studentized(
    a: torch.Tensor, resid: torch.Tensor, lengths: torch.Tensor, n: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cov, t)`` for row advantages ``a`` ``[M, B]`` against fixed rows: ``resid_b =
    sum_t (x_bt - x_bar)``, ``lengths_b = L_b``; ``cov = sum_b a_b resid_b / N`` and the
    row influence ``(a_b - y_bar) resid_b - L_b cov``."""
    rows = a.shape[-1]
    y_bar = (a @ lengths) / n
    centred = a - y_bar[:, None]
    cov = (centred @ resid) / n  # centred first: 0 exactly for constant advantages
    infl = centred * resid - lengths * cov[:, None]
    se = torch.sqrt(rows / (rows - 1) * infl.square().sum(dim=1)) / n
    t = torch.where(se > 0, cov / torch.where(se > 0, se, 1.0), 0.0)
    return cov, t


def logprob_advantage_covariance(
    *,
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    groups: torch.Tensor | None = None,
    alpha: float = 0.05,
    n_resamples: int | None = None,
    seed: int = 0,
) -> LogprobAdvantageCovariance:
    """``Cov(logprobs, advantages)`` over response tokens and its one-sided test (module
    docstring); ``advantages`` ``[B]`` or ``[B, T]``, ``groups`` an integer ``[B]`` tensor
    of prompt ids (advantages are permuted within a prompt), ``B >= 2`` rows.

    ``n_resamples`` permutations (None: ``max(999, ceil(20 / alpha) - 1)``) drawn from
    ``seed``; in a run, pass a different seed at every step (the step number) so that
    steps' permutations are independent."""
    a_level = check_alpha(alpha)
    m_perm = check_resamples(n_resamples, a_level)
    seed = check_seed(seed)
    adv = v.require_tensor("advantages", advantages)
    if adv.dim() == 1 and isinstance(response_mask, torch.Tensor) and response_mask.dim() == 2:
        if adv.shape[0] != response_mask.shape[0]:
            raise InputError(
                f"advantages must have shape [B] = [{response_mask.shape[0]}] or [B, T] like "
                f"response_mask, got {list(adv.shape)}"
            )
        adv = adv[:, None].expand(response_mask.shape)
    mask, t = token_tensors(response_mask, {"logprobs": logprobs, "advantages": adv})
    rows = mask.shape[0]
    if rows < 2:
        raise InputError(f"response_mask must have B >= 2 rows for a standard error, got {rows}")
    labels = group_labels(groups, mask)
    x, y = t["logprobs"], t["advantages"]
    lengths = mask.sum(dim=1).to(COMPUTE)
    n = float(lengths.sum())
    x_bar = float(x.sum()) / n
    resid = x.sum(dim=1) - x_bar * lengths
    first = y[:, 0]
    row_level = bool(torch.where(mask, y == first[:, None], True).all())
    if row_level:
        cov_t, t_t = _studentized(first[None], resid, lengths, n)
        cov, stat = float(cov_t[0]), float(t_t[0])
        y_bar = float(first @ lengths) / n
        infl = (first - y_bar) * resid - lengths * cov
    else:
        y_bar = float(y.sum()) / n
        xc = torch.where(mask, x - x_bar, 0.0)
        yc = torch.where(mask, y - y_bar, 0.0)
        cov = float((xc * yc).sum()) / n
        infl = torch.where(mask, xc * yc - cov, 0.0).sum(dim=1)
    se = math.sqrt(rows / (rows - 1) * float(infl.square().sum())) / n
    if not row_level:
        stat = cov / se if se > 0 else 0.0
    yc_all = torch.where(mask, y - y_bar, 0.0)
    sx = math.sqrt(float(torch.where(mask, x - x_bar, 0.0).square().sum()) / n)
    sy = math.sqrt(float(yc_all.square().sum()) / n)
    corr = cov / (sx * sy) if sx > 0 and sy > 0 else 0.0

    if row_level:
        method = "permutation"
        decided = can_decide(log_permutations(labels), a_level)
        min_rows = min_permutation_rows(a_level)
        sampler = Resampler(seed, mask.device)
        u = sampler.uniform()
        null = []
        for size in sampler.chunks(m_perm, rows):
            perm = sampler.permutations(size, labels)
            null.append(_studentized(first[perm], resid, lengths, n)[1])
        p, p_rand = randomization_p(stat, torch.cat(null), u=u)
        z = probit(p_rand)
    else:
        method = "clustered-t"
        decided = rows >= MIN_ROWS_CLUSTERED_T
        min_rows = MIN_ROWS_CLUSTERED_T
        p = 1.0 - student_t_cdf(stat, rows - 1)
        z = probit(p)
        m_perm = 0
    return LogprobAdvantageCovariance(
        cov=cov,
        stderr=se,
        t=stat,
        z=z,
        p_value=p,
        alpha=a_level,
        alarm=decided and p <= a_level,
        decided=decided,
        min_rows=min_rows,
        method=method,
        corr=corr,
        n_tokens=int(n),
        n_sequences=rows,
        n_resamples=m_perm,
    )
