"""Effective sample size of the rollout -> trainer importance weights.

With log-weights ``lw_i = trainer_logprobs_i - rollout_logprobs_i`` (the weight that turns
rollout samples into trainer-policy samples), Kish's effective sample size over ``n``
weights is ``ESS = (sum w)^2 / sum w^2`` (Kish 1965, *Survey Sampling*; Owen 2013,
*Monte Carlo theory, methods and examples*, ch. 9). It is computed in log space,

    log(ESS / n) = 2 logsumexp(lw) - logsumexp(2 lw) - log n,

so weights of any magnitude neither overflow nor underflow. ``ESS/n`` lies in ``(0, 1]``,
is exactly 1 when all weights are equal (on-policy: every ``lw = 0``), and under i.i.d.
``lw ~ N(mu, sigma^2)`` it converges to ``E[w]^2 / E[w^2] = exp(-sigma^2)`` (lognormal
moments ``E[w^k] = exp(k mu + k^2 sigma^2 / 2)``). Token level uses every response token;
sequence level uses the full-sequence weight ``exp(sum_t lw_t)`` per row (the weight of the
sequence-level IS correction, ``polgrad_reference.ISCorrection(level="sequence")``).

Finite-``n`` bias: ``ESS/n`` is a ratio of sample moments, and under large drift the
sample second moment ``mean(w^2)`` is dominated by rare large weights that a finite
sample mostly misses, so ``ESS/n`` sits *above* ``exp(-sigma^2)``: measured at
``n = 16,384`` over 1,000 replicates it is +7.5% (se 0.6%) at ``sigma = 1.5`` and +63%
(se 2.1%) at ``sigma = 2`` (``bench/calibration.py``; the audit of issue 29 measured
+61%; ``E[w^4]`` grows as ``exp(8 sigma^2)``, so the delta method fails there too). An
ESS/n that looks acceptable at large drift overstates the sample's worth;
``token_sigma`` inherits the bias (downwards).
Derivation and tests: ``docs/diagnostics.md``.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ..errors import ConfigError
from ._common import DiagnosticResult, token_tensors

__all__ = ["ImportanceESS", "importance_ess", "lognormal_ess"]


@dataclasses.dataclass(frozen=True)
class ImportanceESS(DiagnosticResult):
    """ESS/n of the trainer/rollout importance weights at token and sequence level."""

    namespace = "ess"

    token: float
    """Token-level ``ESS / n`` in ``(0, 1]``; exactly 1 on-policy."""
    sequence: float
    """Sequence-level ``ESS / B`` in ``(0, 1]`` over the rows' full-sequence weights."""
    n_tokens: int
    n_sequences: int
    log_weight_mean: float
    log_weight_std: float
    """Standard deviation of the token log-weights (the ``sigma`` of the lognormal null)."""
    max_abs_log_weight: float

    @property
    def token_sigma(self) -> float:
        """The log-weight std a lognormal drift would need to give this ESS:
        ``sqrt(-log(ESS/n))`` (0 on-policy)."""
        return math.sqrt(max(0.0, -math.log(self.token)))

    def _metrics(self) -> dict[str, float]:
        return {
            "token": self.token,
            "sequence": self.sequence,
            "token_sigma": self.token_sigma,
            "log_weight_mean": self.log_weight_mean,
            "log_weight_std": self.log_weight_std,
            "max_abs_log_weight": self.max_abs_log_weight,
            "n_tokens": float(self.n_tokens),
            "n_sequences": float(self.n_sequences),
        }

    def summary(self) -> str:
        return (
            f"ESS/n token {self.token:.4f} (n={self.n_tokens}, lognormal-equivalent sigma "
            f"{self.token_sigma:.3g}), sequence {self.sequence:.4f} (B={self.n_sequences})"
        )


def lognormal_ess(sigma: float) -> float:
    """Population ``ESS/n`` of i.i.d. ``N(mu, sigma^2)`` log-weights: ``exp(-sigma^2)``
    (the finite-sample value is biased upwards at large ``sigma``: module docstring)."""
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float)):
        raise ConfigError(f"sigma must be a real standard deviation >= 0, got {sigma!r}")
    s = float(sigma)
    if not (math.isfinite(s) and s >= 0.0):
        raise ConfigError(f"sigma must be a finite standard deviation >= 0, got {sigma!r}")
    return math.exp(-(s**2))


def _ess_fraction(log_w: torch.Tensor) -> float:
    """``ESS / n`` of a 1-D vector of log-weights, in log space, clamped to ``<= 1``
    (Cauchy-Schwarz; rounding could otherwise give ``1 + 1e-16``)."""
    n = log_w.numel()
    log_frac = 2.0 * torch.logsumexp(log_w, dim=0) - torch.logsumexp(2.0 * log_w, dim=0)
    return min(1.0, math.exp(float(log_frac) - math.log(n)))


def importance_ess(
    *,
    trainer_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
) -> ImportanceESS:
    """ESS/n of ``w = exp(trainer_logprobs - rollout_logprobs)`` over response tokens and
    over sequences (``[B, T]`` right-padded, padding ignored, any float dtype, float64
    internally). Raises ``InputError``/``InputTypeError`` naming the bad argument."""
    mask, t = token_tensors(
        response_mask,
        {"trainer_logprobs": trainer_logprobs, "rollout_logprobs": rollout_logprobs},
    )
    lw = t["trainer_logprobs"] - t["rollout_logprobs"]  # 0 at padding
    tok = lw[mask]
    seq = lw.sum(dim=1)
    std = float(tok.std(correction=0))
    return ImportanceESS(
        token=_ess_fraction(tok),
        sequence=_ess_fraction(seq),
        n_tokens=int(tok.numel()),
        n_sequences=int(seq.numel()),
        log_weight_mean=float(tok.mean()),
        log_weight_std=std,
        max_abs_log_weight=float(tok.abs().max()),
    )
