"""The frameworks tier: collected only where verl, TRL and OpenRLHF are installed.

``make frameworks`` builds ``.venv-frameworks`` with the pinned releases and runs this
directory. In any other environment (the default suite, ``make test``) each test module of
a framework that is not installed is left out of collection, and one test,
``test_tier.py::test_frameworks_tier_environment``, is reported as skipped with the list of
what is missing: a single visible skip, never hundreds of silent ones.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # the _marking and _tier helpers

from _tier import MISSING

MODULES = {
    "verl": ("test_verl_*.py",),
    "trl": ("test_trl_*.py",),
    "openrlhf": ("test_openrlhf_*.py",),
}

collect_ignore_glob = [pattern for fw in MISSING for pattern in MODULES[fw]]
if MISSING:
    # Cross-framework tests (the DEVIATIONS table, empty rows) need all three.
    collect_ignore_glob += ["test_all_*.py"]


# ------------------------------------------------------------------ the DEVIATIONS table
# A demonstrating test that fails (or whose expected failure passes) fails the run by
# itself; one that is skipped would hide a deviation, so a skip of any of them fails the
# run too. That every node id exists is test_all_deviations.py's check.

import pytest  # noqa: E402

from pytest_polgrad.frameworks import DEVIATIONS  # noqa: E402

_IDS = {d.nodeid for d in DEVIATIONS}
_SKIPPED: set[str] = set()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.nodeid in _IDS and report.skipped and not hasattr(report, "wasxfail"):
        _SKIPPED.add(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput") or not _SKIPPED:
        return
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        tr.write_line(
            "DEVIATIONS whose demonstrating test was skipped (a deviation must be "
            "demonstrated): " + ", ".join(sorted(_SKIPPED)),
            red=True,
        )
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
