"""Run monitor: one-sided CUSUM tests over a whole run with a bounded false-alarm rate.

Each monitored statistic is standardised by its stated null, ``z_t = (x_t - mean) / std``
(``N(0, 1)`` i.i.d. under the null: the z of a detector, or a statistic with a known null
mean and spread), and each watched side runs Page's CUSUM (Page 1954, Biometrika 41)

    S_t = max(0, S_{t-1} + z_t - k),   alarm when S_t > h,

(``-z_t`` for the lower side). The false-alarm bound over a horizon of ``N`` steps: for
every start ``j`` the process ``exp(2k sum_{i=j}^t (z_i - k))`` is a non-negative
martingale when ``z ~ N(0, 1)`` (``E exp(2k (z - k)) = 1``), so by Ville's inequality
``P(sup_t sum_{i=j}^t (z_i - k) >= h) <= exp(-2kh)``. ``S_t > h`` for some ``t <= N``
needs such an excursion from one of the ``N`` starts, hence

    P(any false alarm within N steps) <= N exp(-2kh)

per side, and ``h = log(N * sides / alpha) / (2k)`` bounds the whole run's false-alarm
probability over every side of every statistic by ``alpha`` (union bound). The bound
holds for any null ``z`` with ``E exp(2k(z - k)) <= 1`` (sub-Gaussian, variance proxy 1).
Siegmund's approximation of the in-control average run length per side,
``ARL0 ~ (exp(2kb) - 2kb - 1) / (2k^2)``, ``b = h + 1.166`` (Siegmund 1985, *Sequential
Analysis*), is reported for orientation only; the guarantee is the bound above.
Enforced in ``tests/reference/diagnostics/test_monitor.py`` on runs of 10,000 null steps.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import torch

from ..errors import ConfigError, InputError
from ._common import DiagnosticResult, check_alpha

__all__ = [
    "Alarm",
    "MonitorReport",
    "MonitoredStatistic",
    "RunMonitor",
    "cusum_paths",
    "cusum_threshold",
]

_SIDES = {"up": ("up",), "down": ("down",), "both": ("up", "down")}


@dataclasses.dataclass(frozen=True)
class MonitoredStatistic:
    """A statistic the monitor watches: its name, its null mean and std, and the side(s)
    on which a shift is an alarm (``"up"``, ``"down"`` or ``"both"``)."""

    name: str
    mean: float = 0.0
    std: float = 1.0
    direction: str = "up"

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


def cusum_threshold(*, horizon: int, sides: int, alpha: float, drift: float) -> float:
    """``h = log(horizon * sides / alpha) / (2 drift)``: whole-run false alarms ``<= alpha``."""
    return math.log(horizon * sides / alpha) / (2.0 * drift)


def cusum_paths(z: torch.Tensor, *, drift: float) -> torch.Tensor:
    """Upper CUSUM paths ``S_t = max(0, S_{t-1} + z_t - k)`` of ``z`` ``[..., N]`` at once:
    with ``C_t = sum_{i <= t}(z_i - k)``, ``S_t = C_t - min(0, min_{i <= t} C_i)``."""
    c = torch.cumsum(z - drift, dim=-1)
    return c - torch.cummin(c, dim=-1).values.clamp(max=0.0)


class RunMonitor:
    """Feed it each step's statistics; it raises an :class:`Alarm` with a whole-run
    false-alarm probability ``<= alpha`` over ``horizon`` steps (module docstring).

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
        if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
            raise ConfigError(
                f"horizon must be a positive integer (steps in the run), got {horizon!r}"
            )
        if isinstance(drift, bool) or not isinstance(drift, (int, float)) or not drift > 0:
            raise ConfigError(f"drift must be a real number > 0, got {drift!r}")
        self.statistics = {s.name: s for s in stats}
        self.horizon = horizon
        self.alpha = check_alpha(alpha)
        self.drift = float(drift)
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
