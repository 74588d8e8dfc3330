"""The plugin end to end, in pytest runs of small projects (``pytester``): generated ids,
verdicts serial vs ``-n 2``, expected deviations, options, fixtures, torch-free loading.

The runs are in-process (``tests/helpers/inline_run.py``: cold plugin caches, the outer suite's
state restored); only the claim that needs a fresh interpreter (loading the plugin does not
import torch) runs a subprocess, and the ``python -m pytest_polgrad`` command runs in the
suite's snippet interpreter. A ``-n 2`` run still has real worker processes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import inline_run
from tests.helpers.snippet_driver import run_snippets

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

FEWEST = ("-p", "no:cacheprovider", "--polgrad-max-examples=1", "-p", "no:randomly")
"""For a test that compares verdicts, not one that needs a check's drawn examples: every
failure and declared deviation below shows on the corpus batches, which run first at any
budget (the verdicts at 1 are the ones at 15, item for item)."""


EXAMPLES = Path(__file__).parents[2] / "examples"
DEMO = EXAMPLES / "test_minitrainer_conformance.py"


def _entries(report: Path) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = json.loads(report.read_text())
    return data


TIME_FIELDS = ("seconds", "function_seconds")
"""The report's timing fields: measured, so they differ between runs of one seed."""


def _untimed(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``entries`` without their :data:`TIME_FIELDS` (every other field: verdicts, worst
    errors, examples, diagnoses)."""
    return [{k: v for k, v in e.items() if k not in TIME_FIELDS} for e in entries]


def _failed_reports(result: pytest.RunResult, part: str) -> list[str]:
    """Node ids containing ``part`` with a failed collection or test report (setup, call or
    teardown): what makes a session's exit status non-zero."""
    reprec = result.reprec  # type: ignore[attr-defined]
    reports = reprec.getreports("pytest_collectreport") + reprec.getreports(
        "pytest_runtest_logreport"
    )
    return [
        f"{r.nodeid} ({getattr(r, 'when', 'collect')})"
        for r in reports
        if r.failed and part in r.nodeid
    ]


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_losses=LOSSES)
    return pytester


def test_ids_and_verdicts_identical_serial_and_xdist(project: pytest.Pytester) -> None:
    """One session serially and one under ``-n 2``, each running the project's losses and
    the examples' mini trainer (``examples/test_minitrainer_conformance.py``, under the
    repository's pytest configuration, goldens deselected there): the same ids and
    verdicts both ways, and the examples' declared deviations are exactly their failures
    (no failed report for an example, so ``make demo`` exits 0 both ways)."""
    # rootdir "/": the common ancestor, so both files' node ids name their file
    config = ("-c", str(EXAMPLES.parent / "pyproject.toml"), "--rootdir=/")
    both = ("test_losses.py", str(DEMO), *config, "-k", "test_losses or not golden")
    runs = []
    for extra in ((), ("-n", "2")):
        report = project.path / f"both{len(extra)}.json"
        result = inline_run.run(
            project, *FEWEST, f"--polgrad-report={report}", *both, *extra, cold=True
        )
        demo_failed = _failed_reports(result, "test_minitrainer_conformance.py")
        assert not demo_failed, (
            f"the examples do not run clean {extra}: {demo_failed}\n" + result.stdout.str()[-3000:]
        )
        runs.append((sorted((r["nodeid"], r["status"]) for r in _entries(report)), result))
    (every, result), (every_n, result_n) = runs
    assert every == every_n, "ids or verdicts differ between the serial and the -n 2 run"
    demo = [(n, s) for n, s in every if "test_minitrainer_conformance.py" in n]
    assert len(demo) > 50, demo  # every example item reported (goldens deselected)
    assert {s for _, s in demo} == {"passed", "xfailed"}, "examples: declared deviations"
    serial = [(n, s) for n, s in every if "/test_losses.py::" in n]
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
    for text in (result.stdout.str(), result_n.stdout.str()):
        assert "polgrad conformance" in text
        assert "declared as a known deviation ('it is not') but it now passes" in text
        assert "is token-mean, token ratio, pg_clip eps 0.2/0.2, no KL term — ppo" in text


def test_failure_report_is_readable(project: pytest.Pytester) -> None:
    result = inline_run.run(project, *ARGS, "-k", "wrong and value", cold=True)
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
    """Two sessions with one seed, each starting with cold caches (as two processes do):
    the same report, entry for entry (verdicts, worst errors, examples, diagnoses), but
    for the measured times."""
    reports = []
    for i in range(2):
        report = project.path / f"seed7-{i}.json"
        args = (*ARGS, f"--polgrad-report={report}", "-k", "wrong", "--polgrad-seed=7")
        inline_run.run(project, *args, cold=True)
        reports.append(_entries(report))
    first, second = reports
    assert [(r["nodeid"], r["status"]) for r in first] == [
        ("test_losses.py::wrong[dapo-gradient]", "failed"),
        ("test_losses.py::wrong[dapo-value]", "failed"),
    ]
    for entry in (*first, *second):  # each check's time (issue 32), which no seed fixes
        assert all(isinstance(entry[k], float) for k in TIME_FIELDS), entry
    assert _untimed(first) == _untimed(second)
    report = project.path / "quick.json"
    inline_run.run(
        project,
        "-p",
        "no:cacheprovider",
        "--polgrad-profile=quick",
        f"--polgrad-report={report}",
        "-k",
        "good",
        cold=True,
    )
    assert max(r["examples"] for r in json.loads(report.read_text())) <= 20


def test_ini_options(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\npolgrad_max_examples = 5\npolgrad_seed = 3\n")
    pytester.makepyfile(test_losses=LOSSES)
    report = pytester.path / "r.json"
    inline_run.run(
        pytester, "-p", "no:cacheprovider", f"--polgrad-report={report}", "-k", "good", cold=True
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
    result = inline_run.run(pytester, *ARGS, "-k", "(good or profile) and not golden", cold=True)
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
    result = inline_run.run(pytester, "-p", "no:cacheprovider", cold=True)
    text = result.stdout.str()
    assert "f: invalid @pytest.mark.polgrad_conforms" in text
    assert "unknown option(s) ['layuot']" in text
    pytester.makepyfile(
        "import pytest\n\n@pytest.mark.polgrad_conforms('grpo2')\n"
        "def f(logprobs, old_logprobs, advantages, response_mask):\n    return logprobs.sum()\n"
    )
    result = inline_run.run(pytester, "-p", "no:cacheprovider", cold=True)
    result.stdout.fnmatch_lines(["*unknown algorithm 'grpo2' (did you mean 'grpo'?); known: *"])


def test_every_invalid_marker_of_a_file_is_named_in_its_one_collection_error(
    pytester: pytest.Pytester,
) -> None:
    """Not only the first: a user fixing signatures sees them all in one run."""
    pytester.makepyfile(
        "import pytest\n\n"
        "@pytest.mark.polgrad_conforms('dapo')\n"
        "def one(logprobs, old_logprobs, advantages, response_mask, rollout_logprobs):\n"
        "    return logprobs.sum()\n\n"
        "@pytest.mark.polgrad_conforms('dapo')\n"
        "def two(old_logprobs, advantages, response_mask):\n"
        "    return old_logprobs.sum()\n\n"
        "@pytest.mark.polgrad_conforms('dapo', checks=['value'])\n"
        "def fine(logprobs, old_logprobs, advantages, response_mask):\n"
        "    return logprobs.sum()\n"
    )
    for workers in ((), ("-n", "2")):
        result = inline_run.run(pytester, "-p", "no:cacheprovider", *workers, cold=True)
        # serially pytest stops at a collection error; xdist's controller reports it
        stopped = pytest.ExitCode.INTERRUPTED if not workers else pytest.ExitCode.TESTS_FAILED
        assert result.ret == stopped, result.stdout.str()
        result.assert_outcomes(errors=1)
        result.stdout.fnmatch_lines(
            [
                "one: invalid @pytest.mark.polgrad_conforms: *'rollout_logprobs'*",
                "two: invalid @pytest.mark.polgrad_conforms: *no 'logprobs' parameter*",
            ]
        )


def test_fixtures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        "import torch\n\n"
        "def test_oracle(polgrad_oracle, polgrad_batch, polgrad_report_type):\n"
        "    batch = polgrad_batch('ragged', dtype=torch.float32)\n"
        "    out = polgrad_oracle('dr_grpo', budget=8)(**batch)\n"
        "    assert out.loss.dtype == torch.float64\n"
        "    assert polgrad_report_type.__name__ == 'CheckResult'\n"
    )
    inline_run.run(pytester, "-p", "no:cacheprovider", cold=True).assert_outcomes(passed=1)


def test_which_command(project: pytest.Pytester) -> None:
    """``python -m pytest_polgrad which FILE::NAME`` from the project, as that command
    runs (``runpy.run_module`` as ``__main__``, the working directory first on
    ``sys.path``) in the suite's snippet interpreter (``tests/helpers/snippet_driver.py``: another
    process, the kit imported afresh: ``fresh_kit``); its exit status is the
    ``SystemExit`` code, which must be 0 (anything else reads ``FAILED``)."""
    target = str(Path(project.path) / "test_losses.py::declared")
    command = (
        "import os, runpy, sys\n"
        "sys.path.insert(0, os.getcwd())\n"
        f"sys.argv = ['pytest_polgrad', 'which', {target!r}]\n"
        "runpy.run_module('pytest_polgrad', run_name='__main__', alter_sys=True)\n"
    )
    ran = run_snippets([("which", command, str(project.path))], project.path, fresh_kit=True)
    out = ran["which"]
    assert not out.startswith("FAILED"), out
    pytest.LineMatcher(out.splitlines()).fnmatch_lines(
        ["*MATCH*token-mean, token ratio, pg_clip eps 0.2/0.2, no KL term*", "  diagnosis  *"]
    )


def test_summary_counts_failed_golden_and_stray_expectations(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_losses=LOSSES)
    report = pytester.path / "r.json"
    # no golden is recorded yet: the golden items fail, and the table must say so
    result = inline_run.run(pytester, *ARGS, "-k", "good", f"--polgrad-report={report}", cold=True)
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
    text = inline_run.run(pytester, "-p", "no:cacheprovider", cold=True).stdout.str()
    assert "expect= names ['micro-batch'], check(s) that do not run" in text
