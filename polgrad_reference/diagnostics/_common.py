"""Shared pieces of the diagnostics: the result protocol, input checks, exact tail sums,
seeded randomization tests and Student-t tails.

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
    "Resampler",
    "binomial_half_upper_tail",
    "can_decide",
    "check_alpha",
    "check_resamples",
    "check_seed",
    "default_resamples",
    "group_labels",
    "log_permutations",
    "log_sign_patterns",
    "min_permutation_rows",
    "min_sign_rows",
    "min_units",
    "normal_quantile",
    "normal_sf",
    "probit",
    "randomization_p",
    "student_t_cdf",
    "student_t_quantile",
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


# ------------------------------------------------------------------ randomization tests

_CHUNK_ELEMENTS = 1 << 22


def check_seed(seed: object) -> int:
    """A non-negative integer seed."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    return seed


def default_resamples(alpha: float) -> int:
    """``max(999, ceil(20 / alpha) - 1)`` resamples: at least 20 of them beyond the observed
    statistic at the test's level, so the Monte Carlo p-value can reach ``alpha``."""
    return max(999, math.ceil(20.0 / alpha) - 1)


def check_resamples(n_resamples: object, alpha: float, name: str = "n_resamples") -> int:
    """``None`` (:func:`default_resamples`) or a positive integer with ``(M + 1) alpha >= 1``."""
    if n_resamples is None:
        return default_resamples(alpha)
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, int) or n_resamples < 1:
        raise ConfigError(f"{name} must be a positive integer or None, got {n_resamples!r}")
    if (n_resamples + 1) * alpha < 1.0:
        raise ConfigError(
            f"{name} = {n_resamples} cannot reach alpha = {alpha:g}: the smallest p-value is "
            f"1/({name} + 1); use at least {math.ceil(1.0 / alpha) - 1}"
        )
    return n_resamples


class Resampler:
    """Seeded random rearrangements for Monte Carlo randomization tests.

    Everything is drawn on a CPU generator with an explicit ``device="cpu"`` and moved to
    the inputs' device, so a CUDA run draws the same rearrangements as the CPU.
    """

    def __init__(self, seed: int, device: torch.device) -> None:
        self.gen = torch.Generator(device="cpu").manual_seed(seed)
        self.device = device

    def uniform(self) -> float:
        """One ``U(0, 1)`` draw, never exactly 0 (the randomized p-value's tie-breaker)."""
        u = float(torch.rand(1, generator=self.gen, device="cpu", dtype=COMPUTE))
        return u if u > 0.0 else 0.5

    def chunks(self, total: int, width: int) -> list[int]:
        """Chunk sizes covering ``total`` resamples of ``width`` values each."""
        step = max(1, _CHUNK_ELEMENTS // max(1, width))
        return [min(step, total - start) for start in range(0, total, step)]

    def permutations(self, rows: int, groups: torch.Tensor) -> torch.Tensor:
        """``[rows, n]`` index tensor: each row a uniformly random permutation of the ``n``
        positions that maps every position to one of its own group (``groups`` ``[n]``,
        CPU integer labels)."""
        n = groups.numel()
        keys = torch.rand((rows, n), generator=self.gen, device="cpu", dtype=COMPUTE)
        offset = groups.to(COMPUTE) * 2.0  # keys in [0, 1): groups stay contiguous
        order = torch.argsort(keys + offset, dim=1)
        base = torch.argsort(groups, stable=True)
        perm = torch.empty((rows, n), dtype=torch.long, device="cpu")
        perm[:, base] = order
        return perm.to(self.device)

    def signs(self, rows: int, n: int) -> torch.Tensor:
        """``[rows, n]`` independent fair signs in float64."""
        bits = torch.randint(0, 2, (rows, n), generator=self.gen, device="cpu", dtype=torch.int8)
        return (2.0 * bits.to(COMPUTE) - 1.0).to(self.device)


def randomization_p(observed: float, null: torch.Tensor, *, u: float) -> tuple[float, float]:
    """Monte Carlo randomization p-values of an upper-tail statistic.

    With ``M`` resampled statistics ``T_j`` drawn uniformly from a group of transformations
    that leaves the null distribution invariant, ``(T, T_1, ..., T_M)`` is exchangeable
    under the null (Hemerik & Goeman 2018, TEST 27, "Exact testing with random
    permutations"), so

    - ``p = (1 + #{T_j >= T}) / (M + 1)`` has ``P(p <= a) <= a`` (Phipson & Smyth 2010);
    - ``p_rand = (#{T_j > T} + u (1 + #{T_j = T})) / (M + 1)``, ``u ~ U(0, 1)``, is exactly
      ``U(0, 1)`` (the rank of ``T`` with ties broken at random is uniform).

    Values within ``1e-9 max(1, |T|)`` of ``T`` count as ties (rounding of resampled sums).
    """
    tol = 1e-9 * max(1.0, abs(observed))
    greater = int((null > observed + tol).sum())
    at_least = int((null >= observed - tol).sum())
    m = null.numel()
    return (1 + at_least) / (m + 1), (greater + u * (1 + at_least - greater)) / (m + 1)


def probit(p_upper: float) -> float:
    """``z = Phi^{-1}(1 - p)``: ``N(0, 1)`` exactly when ``p`` is ``U(0, 1)``; computed as
    ``-Phi^{-1}(p)`` so small p-values keep their precision."""
    p = min(max(p_upper, 1e-300), 1.0 - 1e-16)
    return -normal_quantile(p)


def log_sign_patterns(rows: int) -> float:
    """``log 2^rows``: the number of sign-flip rearrangements of ``rows`` units."""
    return rows * math.log(2.0)


def log_permutations(groups: torch.Tensor) -> float:
    """``log prod_g n_g!``: the number of within-group permutations (ties ignored)."""
    counts = torch.bincount(groups.to("cpu"))
    return float(torch.lgamma(counts.to(COMPUTE) + 1.0).sum())


def can_decide(log_count: float, alpha: float) -> bool:
    """A randomization test decides only when it has at least ``2 / alpha`` distinct
    rearrangements (fewer cannot put an observed statistic alone in the top ``alpha``)."""
    return log_count >= math.log(2.0 / alpha)


def min_units(alpha: float, log_count_of: object) -> int:
    """The smallest number of units ``n`` with ``log_count_of(n) >= log(2 / alpha)``."""
    assert callable(log_count_of)
    n = 1
    while not can_decide(float(log_count_of(n)), alpha):
        n += 1
    return n


def min_permutation_rows(alpha: float) -> int:
    """Smallest ``B`` with ``B! >= 2 / alpha`` (one group)."""
    return min_units(alpha, lambda n: math.lgamma(n + 1.0))


def min_sign_rows(alpha: float) -> int:
    """Smallest ``B`` with ``2^B >= 2 / alpha``."""
    return min_units(alpha, log_sign_patterns)


# ------------------------------------------------------------------------- Student t


def student_t_cdf(t: float, dof: int) -> float:
    """``P(T_dof <= t)`` for integer ``dof >= 1``: the finite series of Abramowitz & Stegun
    26.7.3-26.7.4 in ``theta = atan(t / sqrt(dof))``; a normal tail expansion above 400
    degrees of freedom (``t`` shrunk by ``1 - 1/(4 dof)``, error below 1e-5)."""
    if dof > 400:
        return 1.0 - normal_sf(t * (1.0 - 1.0 / (4.0 * dof)) / math.sqrt(1.0 + t * t / (2.0 * dof)))
    theta = math.atan(t / math.sqrt(dof))
    c, s = math.cos(theta), math.sin(theta)
    if dof % 2 == 1:
        total, term = 0.0, c
        if dof > 1:
            total = term
            for j in range(3, dof - 1, 2):
                term *= c * c * (j - 1) / j
                total += term
        a = 2.0 / math.pi * (theta + s * total)
    else:
        total, term = 1.0, 1.0
        for j in range(2, dof - 1, 2):
            term *= c * c * (j - 1) / j
            total += term
        a = s * total
    return 0.5 * (1.0 + a)


def student_t_quantile(p: float, dof: int) -> float:
    """``t`` with ``P(T_dof <= t) = p``, by bisection on :func:`student_t_cdf`."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must lie in (0, 1), got {p}")
    if p < 0.5:
        return -student_t_quantile(1.0 - p, dof)
    lo, hi = 0.0, 1.0
    while student_t_cdf(hi, dof) < p:
        hi *= 2.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if student_t_cdf(mid, dof) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def group_labels(groups: object, mask: torch.Tensor) -> torch.Tensor:
    """``groups``: None (one group: every row exchangeable with every other) or an integer
    ``[B]`` tensor of prompt ids on ``mask``'s device; returns labels ``0..G-1`` on the
    CPU."""
    rows = mask.shape[0]
    if groups is None:
        return torch.zeros(rows, dtype=torch.long, device="cpu")
    g = v.require_tensor("groups", groups)
    if g.dtype.is_floating_point or g.dtype.is_complex or g.dtype == torch.bool:
        raise InputError(f"groups must be an integer tensor of prompt ids, got {g.dtype}")
    v.require_shape("groups", g, (rows,), "[B]")
    v.require_same_device({"groups": g, "response_mask": mask})
    labels: torch.Tensor = torch.unique(g.to("cpu"), return_inverse=True)[1]
    return labels
