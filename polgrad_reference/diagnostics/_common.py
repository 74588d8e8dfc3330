"""Shared pieces of the diagnostics: the result protocol, input checks, exact tail sums.

Every detector computes in float64 on the device of its inputs (so bfloat16 and float16
inputs are accepted and upcast losslessly) and returns a frozen result with a one-line
``summary()``, a multi-line ``report()`` and ``as_metrics()``: a flat ``dict[str, float]``
with namespaced keys (``"ess/token"``, ``"mismatch/k3"``, ...), ready for any logger.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from statistics import NormalDist

import torch

from .. import _validate as v
from ..errors import ConfigError, InputError

__all__ = [
    "DiagnosticResult",
    "binomial_half_upper_tail",
    "check_alpha",
    "normal_quantile",
    "normal_sf",
    "token_tensors",
]

COMPUTE = torch.float64


class DiagnosticResult:
    """Mixin of the frozen result dataclasses: summaries and flat float metrics."""

    namespace: str = "diagnostic"

    def _metrics(self) -> Mapping[str, float]:  # pragma: no cover - every result overrides
        raise NotImplementedError

    def summary(self) -> str:
        """One line: the headline numbers and the verdict."""
        raise NotImplementedError  # pragma: no cover

    def _details(self) -> list[str]:
        return [f"  {k} = {val:.6g}" for k, val in self.as_metrics().items()]

    def report(self) -> str:
        """The full summary: the one-liner, then every metric and the null it is tested
        against (see ``docs/diagnostics.md``)."""
        return "\n".join([self.summary(), *self._details()])

    def as_metrics(self, prefix: str = "") -> dict[str, float]:
        """``{prefix + namespace + "/" + name: float}`` for every scalar of the result."""
        return {f"{prefix}{self.namespace}/{k}": float(x) for k, x in self._metrics().items()}

    def __str__(self) -> str:
        return self.summary()


def check_alpha(alpha: object, name: str = "alpha") -> float:
    """A significance level in ``(0, 1)``."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise ConfigError(f"{name} must be a real number in (0, 1), got {alpha!r}")
    a = float(alpha)
    if not 0.0 < a < 1.0:
        raise ConfigError(f"{name} must lie in (0, 1), got {a}")
    return a


def token_tensors(
    response_mask: object, tokens: dict[str, object], *, nonempty: bool = True
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Validate a ``[B, T]`` bool mask and float ``[B, T]`` tensors on one device; return
    the mask and the tensors upcast to float64 with padding set to 0.

    Float dtypes may differ (a bfloat16 rollout beside a float32 trainer is normal): every
    value is upcast to float64, which is exact. Values must be finite at response tokens;
    padding may hold anything (NaN included).
    """
    mask = v.require_response_mask(response_mask, sized=True, nonempty=False)
    out: dict[str, torch.Tensor] = {}
    for name, x in tokens.items():
        t = v.require_float_tensor(name, x)
        v.require_shape(name, t, tuple(mask.shape), "[B, T] like response_mask")
        out[name] = t
    v.require_same_device({**out, "response_mask": mask})
    if nonempty:
        v.require_nonempty_rows("response_mask", mask)
    elif not bool(mask.any()):
        raise InputError("response_mask selects no token; a diagnostic needs at least one")
    for name, t in out.items():
        v.require_finite_where(name, t, mask)
    return mask, {name: torch.where(mask, t.detach().to(COMPUTE), 0.0) for name, t in out.items()}


def normal_sf(z: float) -> float:
    """``P(Z > z)`` for a standard normal ``Z``."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def normal_quantile(p: float) -> float:
    """The standard normal quantile ``Phi^{-1}(p)``."""
    return NormalDist().inv_cdf(p)


def binomial_half_upper_tail(k: int, m: int, *, device: torch.device) -> float:
    """Exact ``P(X >= k)`` for ``X ~ Binomial(m, 1/2)``, summed in log space.

    ``log C(m, j) - m log 2`` from ``lgamma`` for ``j = k..m`` and one ``logsumexp``; the
    vector is built on ``device`` (the inputs' device), never silently on the CPU.
    """
    if k <= 0:
        return 1.0
    if k > m:
        return 0.0
    j = torch.arange(k, m + 1, device=device, dtype=COMPUTE)
    log_terms = (
        math.lgamma(m + 1.0) - torch.lgamma(j + 1.0) - torch.lgamma(m - j + 1.0) - m * math.log(2.0)
    )
    return min(1.0, float(torch.logsumexp(log_terms, dim=0).exp()))
