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

with a standard error that treats rows as independent units (advantages are shared
within a response): with the influence function ``IF_i = (x_i - x_bar)(y_i - y_bar) -
cov``, ``Var(cov) = B/(B-1) sum_b (sum_{i in b} IF_i)^2 / N^2``. Null: log-probabilities
independent of advantages, rows i.i.d.; then ``z = cov / se -> N(0, 1)`` as ``B`` grows
(``tests/reference/diagnostics/test_covariance.py`` calibrates it).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .. import _validate as v
from ..errors import InputError
from ._common import DiagnosticResult, normal_sf, token_tensors

__all__ = ["LogprobAdvantageCovariance", "logprob_advantage_covariance"]


@dataclasses.dataclass(frozen=True)
class LogprobAdvantageCovariance(DiagnosticResult):
    """Token-level ``Cov(log pi, A)`` with a row-clustered standard error and its z."""

    namespace = "entropy_cov"

    cov: float
    stderr: float
    z: float
    """``cov / stderr``; ``N(0, 1)`` under the null (0 when ``stderr`` is 0)."""
    p_value: float
    """One-sided ``P(Z > z)``: small when entropy is being drained."""
    corr: float
    n_tokens: int
    n_sequences: int

    def _metrics(self) -> dict[str, float]:
        return {
            "cov": self.cov,
            "stderr": self.stderr,
            "z": self.z,
            "p_value": self.p_value,
            "corr": self.corr,
            "n_tokens": float(self.n_tokens),
        }

    def summary(self) -> str:
        return (
            f"Cov(log pi, A) {self.cov:+.4g} +- {self.stderr:.2g} (z={self.z:+.2f}, "
            f"corr {self.corr:+.3f}) over {self.n_tokens} tokens"
        )


def logprob_advantage_covariance(
    *, logprobs: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor
) -> LogprobAdvantageCovariance:
    """``Cov(logprobs, advantages)`` over response tokens; ``advantages`` ``[B]`` or
    ``[B, T]``; needs ``B >= 2`` rows for the standard error."""
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
    x, y = t["logprobs"], t["advantages"]
    n = float(mask.sum())
    xc = torch.where(mask, x - float(x.sum()) / n, 0.0)
    yc = torch.where(mask, y - float(y.sum()) / n, 0.0)
    prod = xc * yc
    cov = float(prod.sum()) / n
    infl = torch.where(mask, prod - cov, 0.0).sum(dim=1)
    se = math.sqrt(rows / (rows - 1) * float(infl.square().sum())) / n
    z = cov / se if se > 0 else 0.0
    sx, sy = math.sqrt(float(xc.square().sum()) / n), math.sqrt(float(yc.square().sum()) / n)
    corr = cov / (sx * sy) if sx > 0 and sy > 0 else 0.0
    return LogprobAdvantageCovariance(
        cov=cov,
        stderr=se,
        z=z,
        p_value=normal_sf(z),
        corr=corr,
        n_tokens=int(n),
        n_sequences=rows,
    )
