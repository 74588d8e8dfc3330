"""Run monitor (docs/diagnostics.md, "Run monitor").

Bound: P(any false alarm within the horizon) <= alpha for N(0, 1) null steps. Checked on
R runs of 10,000 null steps (vectorised with ``cusum_paths`` at the monitor's threshold,
which equals the monitor's own recursion step for step): the false-alarm fraction is
<= alpha + 3 binomial standard errors. Power: a shift of 2 null standard deviations is
found within 2 (h + 1.166) / (2 - k) steps.
"""

from __future__ import annotations

import math

import pytest
import torch

from polgrad_reference.diagnostics import MonitoredStatistic, RunMonitor, cusum_paths
from polgrad_reference.errors import ConfigError, InputError

HORIZON = 10_000


def _first_alarm(paths: torch.Tensor, h: float) -> torch.Tensor:
    """First index where a path exceeds h, or -1."""
    over = paths > h
    first = torch.argmax(over.to(torch.int8), dim=-1)
    return torch.where(over.any(dim=-1), first, -1)


def test_false_alarm_rate_over_10000_null_steps_is_within_the_bound() -> None:
    alpha = 0.05
    mon = RunMonitor([MonitoredStatistic("z", direction="both")], horizon=HORIZON, alpha=alpha)
    g = torch.Generator().manual_seed(0)
    runs, chunk, false_alarms = 1200, 200, 0
    for _ in range(runs // chunk):
        z = torch.randn((chunk, HORIZON), generator=g, dtype=torch.float64)
        up = _first_alarm(cusum_paths(z, drift=mon.drift), mon.threshold) >= 0
        down = _first_alarm(cusum_paths(-z, drift=mon.drift), mon.threshold) >= 0
        false_alarms += int((up | down).sum())
    rate = false_alarms / runs
    assert rate <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / runs), rate


def test_the_monitor_matches_the_vectorised_paths_step_for_step() -> None:
    g = torch.Generator().manual_seed(1)
    z = torch.randn((6, HORIZON), generator=g, dtype=torch.float64)
    z[3:, 4000:] += 1.5  # three runs with a shift, three without
    for run in range(6):
        mon = RunMonitor(["z"], horizon=HORIZON, alpha=0.05)
        first = None
        for x in z[run].tolist():
            if mon.update({"z": x}) and first is None:
                first = mon.steps - 1
        expected = int(_first_alarm(cusum_paths(z[run], drift=mon.drift), mon.threshold))
        assert first == (None if expected < 0 else expected)
        assert (first is not None) == (run >= 3)
        assert dict(mon.report().first_alarm)["z"] == first


def test_a_two_sigma_shift_is_found_within_the_stated_delay() -> None:
    mon = RunMonitor(["z"], horizon=HORIZON, alpha=0.01)
    window = math.ceil(2 * (mon.threshold + 1.166) / (2.0 - mon.drift))
    g = torch.Generator().manual_seed(2)
    runs, start = 400, 5000
    z = torch.randn((runs, HORIZON), generator=g, dtype=torch.float64)
    z[:, start:] += 2.0
    first = _first_alarm(cusum_paths(z, drift=mon.drift), mon.threshold)
    early = (first >= 0) & (first < start)
    assert int(early.sum()) <= 0.01 * runs + 3 * math.sqrt(0.01 * runs)
    found = (first >= start) & (first < start + window)
    assert int(found.sum()) >= 0.99 * (runs - int(early.sum())), (window, first.tolist()[:10])


def test_threshold_follows_the_union_bound_and_is_split_over_sides() -> None:
    one = RunMonitor(["a"], horizon=1000, alpha=0.01)
    assert one.threshold == pytest.approx(math.log(1000 / 0.01) / (2 * 0.5))
    both = RunMonitor(["a", MonitoredStatistic("b", direction="both")], horizon=1000, alpha=0.01)
    assert both.threshold == pytest.approx(math.log(3 * 1000 / 0.01))
    assert 1000 * 3 * math.exp(-2 * both.drift * both.threshold) == pytest.approx(0.01)


def test_standardisation_sides_report_and_metrics() -> None:
    mon = RunMonitor(
        [MonitoredStatistic("ess", mean=1.0, std=0.01, direction="down"), "cov"],
        horizon=50,
        alpha=0.01,
    )
    alarms = ()
    for _ in range(10):
        raised = mon.update({"ess": torch.tensor(0.9, dtype=torch.bfloat16), "cov": 0.0})
        alarms = alarms or raised
    assert (
        alarms and alarms[0].statistic == "ess" and alarms[0].side == "down" and alarms[0].step == 0
    )
    rep = mon.report()
    assert dict(rep.first_alarm) == {"ess": 0, "cov": None}
    metrics = rep.as_metrics(prefix="run/")
    assert (
        metrics["run/monitor/ess/alarm"] == 1.0
        and rep.steps == 10
        and metrics["run/monitor/cov/alarm"] == 0.0
    )
    assert all(isinstance(v, float) for v in metrics.values())
    assert "ess@0" in rep.summary() and "\n" not in rep.summary() and "alarm Alarm(" in rep.report()


def test_bad_inputs_and_configs_are_named() -> None:
    with pytest.raises(ConfigError, match="horizon must be a positive integer"):
        RunMonitor(["a"], horizon=0)
    with pytest.raises(ConfigError, match="alpha must lie in"):
        RunMonitor(["a"], horizon=10, alpha=2.0)
    with pytest.raises(ConfigError, match="distinct names"):
        RunMonitor(["a", "a"], horizon=10)
    with pytest.raises(ConfigError, match="std must be > 0"):
        MonitoredStatistic("a", std=0.0)
    with pytest.raises(ConfigError, match="direction must be one of"):
        MonitoredStatistic("a", direction="left")
    mon = RunMonitor(["a"], horizon=2)
    with pytest.raises(InputError, match=r"missing \['a'\], unexpected \['b'\]"):
        mon.update({"b": 0.0})
    with pytest.raises(InputError, match=r"values\['a'\] must be finite, got nan at step 0"):
        mon.update({"a": math.nan})
    with pytest.raises(InputError, match="one-element float tensor"):
        mon.update({"a": torch.zeros(2)})
    with pytest.raises(InputError, match="must be a real number"):
        mon.update({"a": "1"})  # type: ignore[dict-item]
    mon.update({"a": 0.0})
    mon.update({"a": 0.0})
    with pytest.raises(InputError, match="horizon of 2 steps is used up"):
        mon.update({"a": 0.0})
