"""Trainer-vs-rollout log-probability mismatch, tested against a stated null.

At a response token sampled by the rollout engine, ``d = trainer_logprobs -
rollout_logprobs`` and ``w = exp(d)``. Per-token estimators of ``KL(rollout || trainer)``
(Schulman 2020, "Approximating KL Divergence"): ``k1 = -d`` and ``k3 = w - 1 - d`` are
unbiased, ``k2 = d^2 / 2`` is biased but low-variance. ``TV = E|w - 1| / 2`` and
``chi2 = E(w - 1)^2`` are unbiased for the per-context total variation and
``chi^2(trainer || rollout)``. Means hide tails, so the result also reports ratio
quantiles, the fraction of tokens with ``w`` outside a band and the catastrophic tokens
(``w`` outside ``[1/c, c]``) with their positions.

The alarm is a test against a stated null, not a bare threshold:

- ``null="noise-floor"`` (``rescored_logprobs`` given): the trainer re-scores the same
  tokens at another batch shape, ``d0 = trainer_logprobs - rescored_logprobs``. A token
  *exceeds* when ``|d| > margin |d0| + atol`` and *stays within* when ``|d| < margin |d0|
  + atol``; row ``b``'s score is ``c_b = #exceed - #within``. **Null:** rows are
  independent, and within each row the rollout's discrepancy is no larger than the
  floor's, ``margin``-inflated plus ``atol``: given ``|c_b|``, ``c_b > 0`` is at most as
  likely as ``c_b < 0``. It holds with equality when the row vectors ``(|d_b|)`` and
  ``(margin |d0_b| + atol)`` are exchangeable (e.g. ``margin = 1``, ``atol = 0`` and the
  rollout engine as close to the trainer as the trainer is to itself, errors shared along
  a row allowed), and leans negative for a rollout closer than that. The test flips the
  signs of whole rows (the row is the unit, so errors shared within a row are allowed):
  the Monte Carlo sign-flip p-value of ``sum_b c_b`` has level ``<= alpha`` at every
  ``B`` (Hemerik & Goeman 2018), and the probit ``z`` of the randomized p-value is
  ``N(0, 1)`` on the null's boundary and stochastically smaller inside it (what
  ``RunMonitor``'s ``"up"`` side needs). ``margin = 1.1`` puts a rollout up to about 10%
  noisier than the floor inside the null, so one 5% noisier is a non-event (the old
  token-level sign test alarmed on 99.5% of such batches at 32k tokens), and
  ``atol = 1e-4`` (a ratio within 0.01% of 1; float32 rounds a log-probability near -10
  by about 1e-6) keeps a bitwise-equal re-score, whose floor is 0, from turning a 1e-6
  rounding difference into an alarm. With fewer than
  ``log2(2 / alpha)`` rows holding a nonzero score the test cannot reach ``alpha`` and
  reports "too few rows to decide".
- ``null="on-policy"`` (no rescore): the rollout logprobs are the trainer's, bitwise. Any
  ``d != 0`` is a mismatch (level 0).

Derivations and the tests that enforce them: ``docs/diagnostics.md``.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .. import _validate as v
from ..errors import ConfigError, NumericalError
from ._common import (
    DiagnosticResult,
    Resampler,
    can_decide,
    check_alpha,
    check_resamples,
    check_seed,
    log_sign_patterns,
    min_sign_rows,
    probit,
    randomization_p,
    token_tensors,
)

__all__ = ["DEFAULT_QUANTILES", "LogprobMismatch", "logprob_mismatch"]

DEFAULT_QUANTILES = (0.001, 0.01, 0.5, 0.99, 0.999)
_MAX_CATASTROPHIC = 16


@dataclasses.dataclass(frozen=True)
class LogprobMismatch(DiagnosticResult):
    """Drift statistics, tails and the null test of one batch."""

    namespace = "mismatch"

    n_tokens: int
    k1: float
    """Token mean of ``-d``: unbiased for ``KL(rollout || trainer)``."""
    k2: float
    k3: float
    tv: float
    chi2: float
    mean_abs_log_ratio: float
    max_abs_log_ratio: float
    quantiles: tuple[tuple[float, float], ...]
    """``(q, ratio quantile)`` pairs over response tokens."""
    band: tuple[float, float]
    frac_outside_band: float
    catastrophic_ratio: float
    n_catastrophic: int
    catastrophic: tuple[tuple[int, int, float], ...]
    """``(row, column, d)`` of the worst catastrophic tokens, largest ``|d|`` first."""
    null: str
    """``"noise-floor"`` or ``"on-policy"``."""
    alpha: float
    margin: float
    """Factor on ``|d0|`` a token must exceed (noise floor)."""
    atol: float
    """Absolute log-ratio added to the floor (noise floor)."""
    p_value: float
    alarm: bool
    """``decided`` and ``p_value <= alpha``."""
    decided: bool
    """False when too few rows carry a nonzero score to reach ``alpha`` (``min_rows``)."""
    min_rows: int
    n_informative: int
    """Tokens the test uses: ``|d| != margin |d0| + atol`` (noise floor) or every token
    (on-policy)."""
    n_exceed: int
    """Tokens with ``|d| > margin |d0| + atol`` (noise floor) or ``d != 0`` (on-policy)."""
    n_rows_informative: int
    """Rows with a nonzero score ``c_b`` (noise floor; every row on-policy)."""
    z: float | None
    """Probit of the randomized sign-flip p-value (``N(0, 1)`` on the null's boundary,
    stochastically smaller inside it; feed it to ``RunMonitor``, direction ``"up"``);
    None for the on-policy null."""
    n_resamples: int
    noise_frac_outside_band: float | None
    noise_rms: float | None
    """RMS of ``d0`` (the noise floor), beside ``rms`` of ``d``."""
    rms: float

    def _metrics(self) -> dict[str, float]:
        out = {
            "k1": self.k1,
            "k2": self.k2,
            "k3": self.k3,
            "tv": self.tv,
            "chi2": self.chi2,
            "mean_abs_log_ratio": self.mean_abs_log_ratio,
            "max_abs_log_ratio": self.max_abs_log_ratio,
            "rms_log_ratio": self.rms,
            "frac_outside_band": self.frac_outside_band,
            "n_catastrophic": float(self.n_catastrophic),
            "p_value": self.p_value,
            "alarm": float(self.alarm),
            "decided": float(self.decided),
            "n_tokens": float(self.n_tokens),
        }
        out |= {f"ratio_q{q:g}": r for q, r in self.quantiles}
        if self.z is not None:
            out["z"] = self.z
        if self.noise_rms is not None:
            out["noise_rms_log_ratio"] = self.noise_rms
        if self.noise_frac_outside_band is not None:
            out["noise_frac_outside_band"] = self.noise_frac_outside_band
        return out

    def summary(self) -> str:
        if not self.decided:
            verdict = "undecided"
            test = (
                f"too few rows to decide ({self.n_rows_informative} rows with a nonzero score; "
                f"the sign-flip test needs at least {self.min_rows} at alpha={self.alpha:g})"
            )
        elif self.z is not None:
            verdict = "ALARM" if self.alarm else "ok"
            test = (
                f"row sign-flip test vs {self.margin:g} x noise floor + {self.atol:g} "
                f"p={self.p_value:.3g} (z={self.z:.2f})"
            )
        else:
            verdict = "ALARM" if self.alarm else "ok"
            test = f"on-policy null: {self.n_exceed} token(s) differ"
        lo, hi = self.band
        return (
            f"mismatch {verdict}: k3={self.k3:.3g} tv={self.tv:.3g} "
            f"outside [{lo:g}, {hi:g}]={self.frac_outside_band:.2%} "
            f"catastrophic={self.n_catastrophic}; {test}"
        )

    def _details(self) -> list[str]:
        lines = super()._details()
        for b, t, d in self.catastrophic:
            lines.append(f"  catastrophic token ({b}, {t}): log-ratio {d:+.4g}")
        return lines


def _quantiles(x: torch.Tensor, qs: tuple[float, ...]) -> tuple[tuple[float, float], ...]:
    """Linear-interpolation quantiles of a 1-D tensor (sorted once; no size limit)."""
    s = torch.sort(x).values
    n = s.numel()
    out = []
    for q in qs:
        pos = q * (n - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, n - 1)
        frac = pos - lo
        out.append((q, float(s[lo]) * (1.0 - frac) + float(s[hi]) * frac))
    return tuple(out)


def _real(name: str, x: object) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ConfigError(f"{name} must be a real number, got {x!r}")
    return float(x)


def _check_options(
    band: object, catastrophic_ratio: object, quantiles: object, margin: object, atol: object
) -> tuple[tuple[float, float], float, tuple[float, ...], float, float]:
    if not (isinstance(band, tuple) and len(band) == 2):
        raise ConfigError(f"band must be a (low, high) tuple of ratios, got {band!r}")
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in band):
        raise ConfigError(f"band must be a (low, high) tuple of real ratios, got {band!r}")
    lo, hi = (float(x) for x in band)
    if not 0.0 < lo < 1.0 < hi or not math.isfinite(hi):
        raise ConfigError(f"band must satisfy 0 < low < 1 < high < inf, got {band!r}")
    c = _real("catastrophic_ratio", catastrophic_ratio)
    if not (math.isfinite(c) and c > 1.0):
        raise ConfigError(f"catastrophic_ratio must be a finite ratio > 1, got {c!r}")
    if not isinstance(quantiles, (tuple, list)) or not all(
        isinstance(q, (int, float)) and not isinstance(q, bool) for q in quantiles
    ):
        raise ConfigError(
            f"quantiles must be a non-empty tuple of values in [0, 1], got {quantiles!r}"
        )
    qs = tuple(float(q) for q in quantiles)
    if not qs or any(not 0.0 <= q <= 1.0 for q in qs):
        raise ConfigError(f"quantiles must be a non-empty tuple of values in [0, 1], got {qs}")
    rho = _real("margin", margin)
    if not (math.isfinite(rho) and rho >= 1.0):
        raise ConfigError(f"margin must be a finite factor >= 1 on the noise floor, got {rho!r}")
    tau = _real("atol", atol)
    if not (math.isfinite(tau) and tau >= 0.0):
        raise ConfigError(f"atol must be a finite log-ratio >= 0, got {tau!r}")
    return (lo, hi), c, qs, rho, tau


def logprob_mismatch(
    *,
    trainer_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    rescored_logprobs: torch.Tensor | None = None,
    alpha: float = 1e-3,
    band: tuple[float, float] = (0.9, 1.1),
    catastrophic_ratio: float = 10.0,
    quantiles: tuple[float, ...] = DEFAULT_QUANTILES,
    margin: float = 1.1,
    atol: float = 1e-4,
    n_resamples: int | None = None,
    seed: int = 0,
) -> LogprobMismatch:
    """Mismatch of rollout logprobs against the trainer's on the sampled tokens.

    ``rescored_logprobs``: the trainer's log-probabilities of the same tokens computed at
    another batch shape (micro-batch size, padding), defining the noise-floor null;
    without it the null is exact on-policy. ``band`` is the ratio band the tail fraction
    is reported for (TRL#6789 reports tokens outside ``[0.9, 1.1]``); tokens with ratio
    outside ``[1/catastrophic_ratio, catastrophic_ratio]`` are listed with positions.
    ``margin`` and ``atol`` widen the noise-floor null (module docstring);
    ``n_resamples`` sign flips (None: ``max(999, ceil(20 / alpha) - 1)``) drawn from
    ``seed`` (in a run, pass the step number). ``[B, T]`` tensors, padding ignored, any
    float dtype (float64 internally).
    """
    a = check_alpha(alpha)
    (lo, hi), c, qs, rho, tau = _check_options(band, catastrophic_ratio, quantiles, margin, atol)
    m_flip = check_resamples(n_resamples, a)
    seed = check_seed(seed)
    tokens: dict[str, object] = {
        "trainer_logprobs": trainer_logprobs,
        "rollout_logprobs": rollout_logprobs,
    }
    if rescored_logprobs is not None:
        tokens["rescored_logprobs"] = rescored_logprobs
    mask, t = token_tensors(response_mask, tokens, nonempty=False)
    dev = mask.device
    d_full = t["trainer_logprobs"] - t["rollout_logprobs"]
    d = d_full[mask]
    w = torch.exp(d)
    if not bool(torch.isfinite(w).all()):
        bad = mask & ~torch.isfinite(torch.exp(d_full))
        raise NumericalError(
            "exp(trainer_logprobs - rollout_logprobs) overflows float64 at positions "
            f"{v.format_positions(bad)}; check that both score the same tokens"
        )
    n = d.numel()
    outside = (w < lo) | (w > hi)

    log_c = math.log(c)
    cat_full = mask & (d_full.abs() > log_c)
    n_cat = int(cat_full.sum())
    worst: tuple[tuple[int, int, float], ...] = ()
    if n_cat:
        idx = cat_full.nonzero()
        vals = d_full[cat_full]
        order = torch.argsort(vals.abs(), descending=True)[:_MAX_CATASTROPHIC]
        worst = tuple((int(idx[i, 0]), int(idx[i, 1]), float(vals[i])) for i in order.tolist())

    if rescored_logprobs is not None:
        d0_full = t["trainer_logprobs"] - t["rescored_logprobs"]
        d0 = d0_full[mask]
        excess = torch.sign(d_full.abs() - (rho * d0_full.abs() + tau))
        excess = torch.where(mask, excess, 0.0)
        k = int((excess > 0).sum())
        m = int((excess != 0).sum())
        scores = excess.sum(dim=1)
        scores = scores[scores != 0]
        rows_informative = scores.numel()
        sampler = Resampler(seed, dev)
        u = sampler.uniform()
        observed = float(scores.sum())
        null_stats = [
            sampler.signs(size, rows_informative) @ scores.abs()
            for size in sampler.chunks(m_flip, rows_informative)
        ]
        p, p_rand = randomization_p(observed, torch.cat(null_stats), u=u)
        z: float | None = probit(p_rand)
        decided = can_decide(log_sign_patterns(rows_informative), a)
        null = "noise-floor"
        w0 = torch.exp(d0)
        noise_out: float | None = float(((w0 < lo) | (w0 > hi)).double().mean())
        noise_rms: float | None = float(d0.square().mean().sqrt())
    else:
        k = int((d != 0).sum())
        m = n
        rows_informative = mask.shape[0]
        p = 0.0 if k else 1.0
        z = None
        decided = True
        m_flip = 0
        null = "on-policy"
        noise_out = noise_rms = None

    return LogprobMismatch(
        n_tokens=n,
        k1=float((-d).mean()),
        k2=float((0.5 * d.square()).mean()),
        k3=float((torch.expm1(d) - d).mean()),
        tv=float(0.5 * (w - 1.0).abs().mean()),
        chi2=float((w - 1.0).square().mean()),
        mean_abs_log_ratio=float(d.abs().mean()),
        max_abs_log_ratio=float(d.abs().max()),
        quantiles=_quantiles(w, qs),
        band=(lo, hi),
        frac_outside_band=float(outside.double().mean()),
        catastrophic_ratio=c,
        n_catastrophic=n_cat,
        catastrophic=worst,
        null=null,
        alpha=a,
        margin=rho,
        atol=tau,
        p_value=p,
        alarm=decided and p <= a,
        decided=decided,
        min_rows=min_sign_rows(a),
        n_informative=m,
        n_exceed=k,
        n_rows_informative=rows_informative,
        z=z,
        n_resamples=m_flip,
        noise_frac_outside_band=noise_out,
        noise_rms=noise_rms,
        rms=float(d.square().mean().sqrt()),
    )
