"""examples/diagnose_run.py: each detector fires within WINDOW steps of its injection and
stays quiet before it; the plot is written where the test says (never in the repository).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

EXAMPLE = Path(__file__).parents[3] / "examples" / "diagnose_run.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("diagnose_run", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def example() -> Iterator[tuple[ModuleType, object]]:
    module = _load()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 200 steps of small tensors: threads only add overhead
    try:
        yield module, module.run(seed=0)
    finally:
        torch.set_num_threads(threads)


def test_each_detector_fires_at_its_injection_and_is_quiet_before(example) -> None:  # type: ignore[no-untyped-def]
    module, result = example
    for name, inject in module.INJECT.items():
        first = result.first_alarm[name]
        assert first is not None and inject <= first <= inject + module.WINDOW, (name, first)
    alarms = result.monitor.alarms
    for name, stat in module.MONITORED.items():
        # quiet before: no alarm of that statistic before its injection
        assert all(a.step >= module.INJECT[name] for a in alarms if a.statistic == stat)
    # no statistic fires before the first injection at all
    assert min(a.step for a in alarms) >= module.INJECT["mismatch"]
    inject = module.INJECT["entropy"]
    assert not result.entropy_before.alarm
    assert result.entropy_full.alarm
    assert inject <= result.entropy_full.changepoint <= inject + 2 * module.WINDOW
    assert all(ok for *_, ok in module.verdicts(result))


def test_series_match_the_injections(example) -> None:  # type: ignore[no-untyped-def]
    module, result = example
    s = result.series
    drift = module.INJECT["mismatch"]
    assert max(s["mismatch/n_catastrophic"][:drift]) == 0.0
    assert sum(s["mismatch/n_catastrophic"][drift:]) > 0
    assert min(s["ess/token"][:drift]) > 0.999
    entropy = s["entropy/mean"]
    assert entropy[-1] < 0.6 * entropy[0]


def test_report_prints_the_verdicts_and_writes_the_plot(  # type: ignore[no-untyped-def]
    example, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    module, result = example
    assert module.report(result, tmp_path) == 0
    out = capsys.readouterr().out
    assert "WRONG" not in out and out.count(" ok") >= 4
    png = tmp_path / "diagnose_run.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
