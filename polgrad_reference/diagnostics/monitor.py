"""Run monitor: one-sided CUSUM tests over a whole run with a bounded false-alarm rate.

Each monitored statistic is turned into a null-``N(0, 1)`` score ``z_t``: the ``z`` a
detector returns as is (``kind="z"``, ``mean=0``, ``std=1``), a statistic with a known
null mean and spread standardised, ``z_t = (x_t - mean) / std``, or a p-value through its
probit, ``z_t = Phi^{-1}(1 - p_t)`` (``kind="p_value"``). Each watched side runs Page's
CUSUM (Page 1954, Biometrika 41)

    S_t = max(0, S_{t-1} + z_t - k),   alarm when S_t > h,

(``-z_t`` for the lower side; the side restarts at 0 after an alarm, so a sustained
change re-alarms every ``~h / (shift - k)`` steps, spaced, not at every step).

**Bound.** Read as an e-detector (Shin, Ramdas & Rinaldo 2024, NEJSDS, "E-detectors: a
nonparametric framework for sequential change detection"): ``e_t = exp(2k z_t - 2k^2)``
is an e-value, ``E[e_t | past] <= 1``, whenever ``z_t`` given the past is ``N(0, 1)`` or
stochastically smaller (``E exp(2k(Z - k)) = 1`` for ``Z ~ N(0, 1)``), so for every
start ``j`` the product ``prod_{i=j}^t e_i = exp(2k sum_{i=j}^t (z_i - k))`` is a
non-negative supermartingale and Ville's inequality gives ``P(sup_t sum_{i=j}^t (z_i - k)
>= h) <= exp(-2kh)``. ``S_t > h`` for some ``t <= N`` needs such an excursion from one of
the ``N`` starts, hence ``P(any false alarm within N steps) <= N exp(-2kh)`` per side, and
``h = log(N * sides / alpha) / (2k)`` bounds the whole run's false-alarm probability over
every side of every statistic by ``alpha`` (union bound).

**What it is fed.** The condition is on the inputs, so the library's detectors make their
``z`` the probit of an *exact* randomized p-value (permutation or sign-flip,
``_common.randomization_p``): exactly ``N(0, 1)`` under the detector's null at every
batch size (given independent resamples at each step: pass ``seed=step``), where the old
normal-approximation z's were not (the length z at 64 rows had variance 1.25 and drove
the monitor to 0.108 false-alarm runs at ``alpha = 0.05``; ``bench/calibration.py``). A
statistic of your own must be ``N(0, 1)`` itself after ``(mean, std)`` (heavy tails break
the bound: unit-variance ``t_5`` inputs alarm in about 0.16 of runs at ``alpha = 0.05``);
when it is not, feed a valid p-value (``kind="p_value"``, any null distribution): if
``P(p_t <= u | past) <= u`` then ``Phi^{-1}(1 - p_t)`` is stochastically below
``N(0, 1)``, and the bound holds.

Siegmund's approximation of the in-control average run length per side,
``ARL0 ~ (exp(2kb) - 2kb - 1) / (2k^2)``, ``b = h + 1.166`` (Siegmund 1985, *Sequential
Analysis*), is reported for orientation only; the guarantee is the bound above.
Enforced in ``tests/reference/diagnostics/test_monitor.py``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import torch

from ..errors import ConfigError, InputError
from ._common import DiagnosticResult, check_alpha, probit

__all__ = [
    "Alarm",
    "MonitorReport",
    "MonitoredStatistic",
    "RunMonitor",
    "cusum_paths",
    "cusum_threshold",
]

_SIDES = {"up": ("up",), "down": ("down",), "both": ("up", "down")}
_KINDS = ("z", "p_value")


@dataclasses.dataclass(frozen=True)
class MonitoredStatistic:
    """A statistic the monitor watches: its name, its null mean and std, the side(s) on
    which a shift is an alarm (``"up"``, ``"down"`` or ``"both"``), and its ``kind``:
    ``"z"`` (standardised by ``mean`` and ``std``) or ``"p_value"`` (a p-value in
    ``(0, 1]``, small under a change; only ``"up"``, default ``mean``/``std``)."""

    name: str
    mean: float = 0.0
    std: float = 1.0
    direction: str = "up"
    kind: str = "z"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"name must be a non-empty string, got {self.name!r}")
        for field in ("mean", "std"):
            x = getattr(self, field)
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
                raise ConfigError(f"{self.name}: {field} must be a finite real number, got {x!r}")
            object.__setattr__(self, field, float(x))
        if self.std <= 0:
            raise ConfigError(f"{self.name}: std must be > 0, got {self.std}")
        if self.direction not in _SIDES:
            raise ConfigError(
                f"{self.name}: direction must be one of {sorted(_SIDES)}, got {self.direction!r}"
            )
        if self.kind not in _KINDS:
            raise ConfigError(f"{self.name}: kind must be one of {_KINDS}, got {self.kind!r}")
        if self.kind == "p_value" and (
            self.direction != "up" or self.mean != 0.0 or self.std != 1.0
        ):
            raise ConfigError(
                f"{self.name}: a p-value statistic is watched on the 'up' side only (small p "
                "is evidence of a change), with the default mean and std"
            )


@dataclasses.dataclass(frozen=True)
class Alarm:
    """One alarm: which statistic and side crossed ``h``, at which step, with what ``S``."""

    statistic: str
    side: str
    step: int
    cusum: float


@dataclasses.dataclass(frozen=True)
class MonitorReport(DiagnosticResult):
    """State of a run monitor after ``steps`` updates."""

    namespace = "monitor"

    steps: int
    horizon: int
    alpha: float
    drift: float
    threshold: float
    arl0_approx: float
    cusum: tuple[tuple[str, str, float], ...]
    """``(statistic, side, S_t)`` now."""
    first_alarm: tuple[tuple[str, int | None], ...]
    """``(statistic, first alarm step or None)``."""
    alarms: tuple[Alarm, ...]

    def _metrics(self) -> dict[str, float]:
        out: dict[str, float] = {"steps": float(self.steps), "threshold": self.threshold}
        for name, side, s in self.cusum:
            out[f"{name}/cusum_{side}"] = s
        for name, step in self.first_alarm:
            out[f"{name}/alarm"] = float(step is not None)
        return out

    def summary(self) -> str:
        fired = [f"{n}@{s}" for n, s in self.first_alarm if s is not None]
        state = "alarms: " + ", ".join(fired) if fired else "no alarm"
        return (
            f"run monitor after {self.steps}/{self.horizon} steps: {state} "
            f"(CUSUM k={self.drift:g}, h={self.threshold:.3g}, "
            f"P(false alarm in run) <= {self.alpha:g})"
        )

    def _details(self) -> list[str]:
        return [*super()._details(), *(f"  alarm {a}" for a in self.alarms)]


def _check_count(name: str, x: object, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < 1:
        raise ConfigError(f"{name} must be a positive integer ({what}), got {x!r}")
    return x


def _check_drift(drift: object) -> float:
    if isinstance(drift, bool) or not isinstance(drift, (int, float)):
        raise ConfigError(f"drift must be a finite real number > 0, got {drift!r}")
    k = float(drift)
    if not (math.isfinite(k) and k > 0):
        raise ConfigError(f"drift must be a finite real number > 0, got {drift!r}")
    return k


def cusum_threshold(*, horizon: int, sides: int, alpha: float, drift: float) -> float:
    """``h = log(horizon * sides / alpha) / (2 drift)``: whole-run false alarms ``<= alpha``."""
    n = _check_count("horizon", horizon, "steps in the run")
    m = _check_count("sides", sides, "watched sides")
    return math.log(n * m / check_alpha(alpha)) / (2.0 * _check_drift(drift))


def cusum_paths(z: torch.Tensor, *, drift: float) -> torch.Tensor:
    """Upper CUSUM paths ``S_t = max(0, S_{t-1} + z_t - k)`` of ``z`` ``[..., N]`` at once:
    with ``C_t = sum_{i <= t}(z_i - k)``, ``S_t = C_t - min(0, min_{i <= t} C_i)``."""
    c = torch.cumsum(z - drift, dim=-1)
    return c - torch.cummin(c, dim=-1).values.clamp(max=0.0)


class RunMonitor:
    """Feed it each step's statistics; it raises an :class:`Alarm` with a whole-run
    false-alarm probability ``<= alpha`` over ``horizon`` steps when every input is null
    ``N(0, 1)`` or stochastically smaller given the past (module docstring).

    ``drift`` (``k``) is half the standardised shift the monitor is tuned to detect
    fastest (``k = 0.5``: shifts of one null standard deviation).
    """

    def __init__(
        self,
        statistics: Sequence[MonitoredStatistic | str],
        *,
        horizon: int,
        alpha: float = 0.01,
        drift: float = 0.5,
    ) -> None:
        stats = [
            s if isinstance(s, MonitoredStatistic) else MonitoredStatistic(s) for s in statistics
        ]
        if not stats:
            raise ConfigError("statistics must name at least one statistic to monitor")
        names = [s.name for s in stats]
        if len(set(names)) != len(names):
            raise ConfigError(f"statistics must have distinct names, got {names}")
        self.statistics = {s.name: s for s in stats}
        self.horizon = _check_count("horizon", horizon, "steps in the run")
        self.alpha = check_alpha(alpha)
        self.drift = _check_drift(drift)
        self.sides = [(s.name, side) for s in stats for side in _SIDES[s.direction]]
        self.threshold = cusum_threshold(
            horizon=horizon, sides=len(self.sides), alpha=self.alpha, drift=self.drift
        )
        b = 2.0 * self.drift * (self.threshold + 1.166)
        self.arl0_approx = (math.exp(b) - b - 1.0) / (2.0 * self.drift**2)
        self.steps = 0
        self._s = dict.fromkeys(self.sides, 0.0)
        self._first: dict[str, int | None] = dict.fromkeys(self.statistics)
        self._alarms: list[Alarm] = []

    def update(self, values: Mapping[str, float | torch.Tensor]) -> tuple[Alarm, ...]:
        """Add one step; ``values`` maps every monitored name to a finite real (or 0-d
        tensor). Returns the alarms raised at this step (a side restarts at 0 after it
        fires)."""
        missing = set(self.statistics) - set(values)
        extra = set(values) - set(self.statistics)
        if missing or extra:
            raise InputError(
                f"values must have exactly the monitored statistics {sorted(self.statistics)}; "
                f"missing {sorted(missing)}, unexpected {sorted(extra)}"
            )
        if self.steps >= self.horizon:
            raise InputError(
                f"the monitor's horizon of {self.horizon} steps is used up; its false-alarm "
                "bound covers only that many steps (create it with a larger horizon)"
            )
        z: dict[str, float] = {}
        for name, raw in values.items():
            if isinstance(raw, torch.Tensor):
                if raw.numel() != 1 or not raw.dtype.is_floating_point:
                    raise InputError(
                        f"values[{name!r}] must be a real number or a one-element float "
                        f"tensor, got shape {list(raw.shape)} dtype {raw.dtype}"
                    )
                x = float(raw)
            elif isinstance(raw, (int, float)) and not isinstance(raw, bool):
                x = float(raw)
            else:
                raise InputError(f"values[{name!r}] must be a real number, got {raw!r}")
            if not math.isfinite(x):
                raise InputError(f"values[{name!r}] must be finite, got {x} at step {self.steps}")
            st = self.statistics[name]
            if st.kind == "p_value":
                if not 0.0 < x <= 1.0:
                    raise InputError(
                        f"values[{name!r}] must be a p-value in (0, 1], got {x} at step "
                        f"{self.steps}"
                    )
                z[name] = -math.inf if x == 1.0 else probit(x)
            else:
                z[name] = (x - st.mean) / st.std
        step = self.steps
        self.steps += 1
        raised: list[Alarm] = []
        for name, side in self.sides:
            zz = z[name] if side == "up" else -z[name]
            s = max(0.0, self._s[(name, side)] + zz - self.drift)
            if s > self.threshold:
                raised.append(Alarm(name, side, step, s))
                if self._first[name] is None:
                    self._first[name] = step
                s = 0.0
            self._s[(name, side)] = s
        self._alarms.extend(raised)
        return tuple(raised)

    def report(self) -> MonitorReport:
        """A frozen snapshot of the monitor (its ``summary()`` / ``as_metrics()``)."""
        return MonitorReport(
            steps=self.steps,
            horizon=self.horizon,
            alpha=self.alpha,
            drift=self.drift,
            threshold=self.threshold,
            arl0_approx=self.arl0_approx,
            cusum=tuple((n, side, s) for (n, side), s in self._s.items()),
            first_alarm=tuple(self._first.items()),
            alarms=tuple(self._alarms),
        )
