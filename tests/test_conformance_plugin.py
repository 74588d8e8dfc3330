"""The plugin end to end, in subprocess pytest runs (``pytester``): generated ids,
verdicts serial vs ``-n 2``, expected deviations, options, fixtures, torch-free loading."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

LOSSES = """
import pytest
import torch


def _dapo(logprobs, old_logprobs, advantages, response_mask, hi=0.28):
    r = torch.exp(torch.where(response_mask, logprobs - old_logprobs, 0.0))
    a = advantages[:, None]
    per = torch.maximum(-a * r, -a * r.clamp(0.8, 1.0 + hi))
    return torch.where(response_mask, per, 0.0).sum() / response_mask.sum()


@pytest.mark.polgrad_conforms("dapo")
def good(logprobs, old_logprobs, advantages, response_mask):
    return _dapo(logprobs, old_logprobs, advantages, response_mask)


@pytest.mark.polgrad_conforms(
    "dapo", expect={"value": "clip-high 0.2", "gradient": "clip-high 0.2"}
)
def declared(logprobs, old_logprobs, advantages, response_mask):
    return _dapo(logprobs, old_logprobs, advantages, response_mask, hi=0.2)


@pytest.mark.polgrad_conforms("dapo", expect={"deterministic": "it is not"})
def stale(logprobs, old_logprobs, advantages, response_mask):
    return _dapo(logprobs, old_logprobs, advantages, response_mask)


@pytest.mark.polgrad_conforms("dapo", checks=["value", "gradient"])
def wrong(logprobs, old_logprobs, advantages, response_mask):
    return _dapo(logprobs, old_logprobs, advantages, response_mask, hi=0.2)
"""

ARGS = ("-p", "no:cacheprovider", "--polgrad-max-examples=15", "-p", "no:randomly")


def _outcomes(pytester: pytest.Pytester, *extra: str) -> tuple[list[tuple[str, str]], str]:
    report = pytester.path / f"report{len(extra)}.json"
    result = pytester.runpytest_subprocess(*ARGS, f"--polgrad-report={report}", *extra)
    data = json.loads(report.read_text())
    return sorted((r["nodeid"], r["status"]) for r in data), result.stdout.str()


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_losses=LOSSES)
    return pytester


def test_ids_and_verdicts_identical_serial_and_xdist(project: pytest.Pytester) -> None:
    serial, out = _outcomes(project)
    parallel, out_n = _outcomes(project, "-n", "2")
    assert serial == parallel
    ids = {n.split("::")[1] for n, _ in serial}
    assert "good[dapo-value]" in ids and "good[dapo-extreme-finite]" in ids
    assert "wrong[dapo-value]" in ids and "wrong[dapo-padding-values]" not in ids
    status = dict((n.split("::")[1], s) for n, s in serial)
    assert {s for n, s in status.items() if n.startswith("good[dapo-")} == {"passed", "failed"}
    assert [n for n, s in status.items() if n.startswith("good[") and s == "failed"] == [
        "good[dapo-golden]"  # never recorded in this temporary project
    ]
    assert status["declared[dapo-value]"] == "xfailed"
    assert status["declared[dapo-padding-values]"] == "passed"
    assert status["stale[dapo-deterministic]"] == "failed"
    assert status["wrong[dapo-value]"] == "failed"
    for text in (out, out_n):
        assert "polgrad conformance" in text
        assert "declared as a known deviation ('it is not') but it now passes" in text
        assert "is token-mean, token ratio, pg_clip eps 0.2/0.2, no KL term — ppo" in text


def test_failure_report_is_readable(project: pytest.Pytester) -> None:
    result = project.runpytest_subprocess(*ARGS, "-k", "wrong and value")
    text = result.stdout.str()
    result.assert_outcomes(failed=1)
    assert "wrong does not conform to 'dapo': check 'value' failed" in text
    assert "reproduce (standalone" in text and "from test_losses import wrong" in text
    assert (
        "replay     pytest 'test_losses.py::wrong[dapo-value]' -p no:randomly "
        "--polgrad-seed=0 --polgrad-max-examples=15"
    ) in text
    assert "Traceback" not in text


def test_same_seed_same_results_and_profiles(project: pytest.Pytester) -> None:
    first, _ = _outcomes(project, "-k", "wrong", "--polgrad-seed=7")
    second, _ = _outcomes(project, "-k", "wrong", "--polgrad-seed=7")
    assert first == second
    report = project.path / "quick.json"
    project.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--polgrad-profile=quick",
        f"--polgrad-report={report}",
        "-k",
        "good",
    )
    assert max(r["examples"] for r in json.loads(report.read_text())) <= 20


def test_ini_options(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\npolgrad_max_examples = 5\npolgrad_seed = 3\n")
    pytester.makepyfile(test_losses=LOSSES)
    report = pytester.path / "r.json"
    pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", f"--polgrad-report={report}", "-k", "good"
    )
    assert max(r["examples"] for r in json.loads(report.read_text())) <= 5


def test_user_hypothesis_profile_is_not_clobbered(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        "from hypothesis import settings\n"
        "settings.register_profile('mine', max_examples=3, deadline=1234)\n"
        "settings.load_profile('mine')\n"
    )
    pytester.makepyfile(
        test_losses=LOSSES + "\n\ndef test_zz_profile_survives():\n"
        "    from hypothesis import settings\n"
        "    assert settings.default.max_examples == 3\n"
        "    assert settings.default.deadline.total_seconds() == 1.234\n"
    )
    result = pytester.runpytest_subprocess(*ARGS, "-k", "(good or profile) and not golden")
    result.assert_outcomes(passed=10)


def test_plugin_load_does_not_import_torch(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        "import sys\n\ndef test_plain():\n    assert 'torch' not in sys.modules\n"
        "    assert 'pytest_polgrad.plugin' in sys.modules\n"
    )
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_invalid_marker_is_a_clear_collection_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        "import pytest\n\n@pytest.mark.polgrad_conforms('dapo', layuot='left')\n"
        "def f(logprobs, old_logprobs, advantages, response_mask):\n    return logprobs.sum()\n"
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    text = result.stdout.str()
    assert "f: invalid @pytest.mark.polgrad_conforms" in text
    assert "unknown option(s) ['layuot']" in text
    pytester.makepyfile(
        "import pytest\n\n@pytest.mark.polgrad_conforms('grpo2')\n"
        "def f(logprobs, old_logprobs, advantages, response_mask):\n    return logprobs.sum()\n"
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*unknown algorithm 'grpo2' (did you mean 'grpo'?); known: *"])


def test_fixtures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        "import torch\n\n"
        "def test_oracle(polgrad_oracle, polgrad_batch, polgrad_report_type):\n"
        "    batch = polgrad_batch('ragged', dtype=torch.float32)\n"
        "    out = polgrad_oracle('dr_grpo', budget=8)(**batch)\n"
        "    assert out.loss.dtype == torch.float64\n"
        "    assert polgrad_report_type.__name__ == 'CheckResult'\n"
    )
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_which_command(project: pytest.Pytester) -> None:
    target = str(Path(project.path) / "test_losses.py::declared")
    result = project.run(sys.executable, "-m", "pytest_polgrad", "which", target)
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        ["*MATCH*token-mean, token ratio, pg_clip eps 0.2/0.2, no KL term*"]
    )


def test_the_demo_trainer_exits_clean_serial_and_xdist(pytester: pytest.Pytester) -> None:
    """The examples' declared deviations are exactly the failures: exit 0 both ways."""
    examples = Path(__file__).parents[1] / "examples"
    base = ("-p", "no:cacheprovider", "--polgrad-max-examples=40", "-k", "not golden")
    runs = []
    for extra in ((), ("-n", "2")):
        report = pytester.path / f"demo{len(extra)}.json"
        result = pytester.runpytest_subprocess(
            str(examples / "test_minitrainer_conformance.py"),
            *base,
            f"--polgrad-report={report}",
            f"--rootdir={examples}",
            *extra,
        )
        assert result.ret == 0, result.stdout.str()[-3000:]
        runs.append(sorted((r["nodeid"], r["status"]) for r in json.loads(report.read_text())))
    assert runs[0] == runs[1]
    statuses = {s for _, s in runs[0]}
    assert statuses == {"passed", "xfailed"}


def test_summary_counts_failed_golden_and_stray_expectations(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_losses=LOSSES)
    report = pytester.path / "r.json"
    # no golden is recorded yet: the golden items fail, and the table must say so
    result = pytester.runpytest_subprocess(*ARGS, "-k", "good", f"--polgrad-report={report}")
    text = result.stdout.str()
    row = next(line for line in text.splitlines() if line.startswith("good "))
    assert row.split()[1:6] == ["policy_loss", "dapo", "9", "1", "0"], row
    assert "conforms" not in row and row.endswith("golden not recorded yet")
    assert "1 golden not recorded yet: review the functions, then run pytest --snapshot-update" in (
        text
    )
    entries = {r["check"]: r["status"] for r in json.loads(report.read_text())}
    assert entries["golden"] == "failed" and entries["value"] == "passed"
    pytester.makepyfile(
        "import pytest\n\n@pytest.mark.polgrad_conforms('dapo', expect={'micro-batch': 'x'})\n"
        "def f(logprobs, old_logprobs, advantages, response_mask):\n    return logprobs.sum()\n"
    )
    text = pytester.runpytest_subprocess("-p", "no:cacheprovider").stdout.str()
    assert "expect= names ['micro-batch'], check(s) that do not run" in text
