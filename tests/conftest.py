"""Test-suite settings: a Hypothesis profile without deadlines (CI machines are shared)
and derandomized, so every run of the suite explores the same examples and CI cannot
flake; set HYPOTHESIS_PROFILE=polgrad-explore to explore new examples locally."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

# One torch thread per test process. Under `pytest -n auto` every xdist worker would
# otherwise start an OpenMP pool as wide as the machine; on 2 cores with 2 workers a small
# kernel (indexing a 64 x 384 batch) then costs ~10 ms of thread hand-offs instead of ~5 us.
os.environ.setdefault("OMP_NUM_THREADS", "1")  # and in the subprocesses tests start


def pytest_configure(config):  # type: ignore[no-untyped-def]
    """Every process that runs tests uses one torch thread; the xdist controller runs none
    and does not import torch (1.2 s of CPU while its workers start)."""
    if config.getoption("numprocesses", None) and not hasattr(config, "workerinput"):
        return
    import torch

    torch.set_num_threads(1)


def pytest_collection_finish(session):  # type: ignore[no-untyped-def]
    """Freeze what collection left (torch, the kit, the items: alive for the whole session)
    out of the cyclic garbage collector: each of its full passes would otherwise walk
    about 300 000 objects, 0.15 s, whatever a test allocated."""
    import gc

    gc.freeze()


_COMMON = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}
settings.register_profile("polgrad-dev", derandomize=True, **_COMMON)
settings.register_profile("polgrad-explore", max_examples=500, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "polgrad-dev"))


# ------------------------------------------------- claims: every claimed test passed


def _claims_module():  # type: ignore[no-untyped-def]
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tools" / "claims.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location("polgrad_claims", path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("polgrad_claims", module)
    spec.loader.exec_module(module)
    return module


_PASSED: set[str] = set()


def pytest_runtest_logreport(report):  # type: ignore[no-untyped-def]
    if report.when == "call" and report.passed and not hasattr(report, "wasxfail"):
        _PASSED.add(report.nodeid)


def pytest_sessionfinish(session, exitstatus):  # type: ignore[no-untyped-def]
    """On a whole-suite run that passed (testpaths, no -k/-m/--lf), fail when a claimed
    test did not run and pass: a claim enforced by a skipped or deselected test is not
    enforced. Runs on the xdist controller, which sees every report."""
    import pytest

    config = session.config
    if hasattr(config, "workerinput") or exitstatus != 0:
        return
    whole = config.args_source is pytest.Config.ArgsSource.TESTPATHS
    filtered = (
        config.option.keyword
        or config.option.markexpr
        or config.getoption("lf", False)
        or config.option.collectonly  # nothing ran: nothing to hold against the claims
    )
    claims = _claims_module() if whole and not filtered else None
    if claims is None:
        return
    unmet = [
        c.test
        for c in claims.CLAIMS
        if not any(n == c.test or n.startswith(c.test + "[") for n in _PASSED)
    ]
    if unmet:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"claimed test(s) did not pass: {', '.join(unmet)}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# ------------------------------------------------- xdist: modules kept on one worker

ONE_WORKER = frozenset(
    {
        "tests/kinds/advantages/test_report.py",
        "tests/kinds/policy_loss/test_calls.py",
        "tests/kinds/policy_loss/diagnose/test_speed.py",
        "tests/reference/diagnostics/test_example.py",
        "tests/faces/test_packaging.py",
        "tests/faces/test_script_snippets.py",
        "tests/faces/test_snippets_run.py",
        "tests/kinds/training_step/test_distributed_runner.py",
        "tests/kinds/training_step/test_distributed_kind.py",
    }
)
"""The modules with a module-scoped fixture, each costly (a snippet interpreter, a script
run, a wheel build, a failing session): every worker that ran one of their tests would
build it again (``tests/helpers/test_suite_scheduling.py`` keeps the list complete). xdist's own
``--dist loadgroup`` does not group under pytest 9.2 (pytest-dev/pytest-xdist#1386)."""


@pytest.hookimpl(optionalhook=True)  # an xdist hook: unknown under -p no:xdist
def pytest_xdist_make_scheduler(config, log):  # type: ignore[no-untyped-def]
    """Under ``-n`` with the default ``--dist load``: each test is its own unit of work,
    except that a module of :data:`ONE_WORKER` is one unit."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class OneWorkerModules(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in ONE_WORKER else nodeid

    return OneWorkerModules(config, log)
