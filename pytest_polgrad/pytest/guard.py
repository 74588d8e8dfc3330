"""Nothing lost on ``--snapshot-update``: syrupy deletes every snapshot no test used, and a
test that never ran (``-x``, ``--maxfail``, Ctrl-C, a collection error, a crashed xdist
worker) used none. This plugin runs before syrupy's session end and

- keeps syrupy from deleting anything when the session did not run every selected item to
  completion (it turns on syrupy's own ``--snapshot-no-cleanup`` for this session), and
- in a complete session, reports each item that failed to syrupy as skipped, so syrupy
  keeps its snapshots (a failure before the snapshot assertion is not "unused").

Only syrupy's documented option and its session's ``ran_item`` are used; under xdist the
controller's merged worker reports are adjusted the same way, and when their shape is not
the expected one, cleanup is turned off instead (never a deletion on a guess).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

__all__ = ["SnapshotGuard"]

_GOLDEN = "__polgrad_golden__"  # set on golden items by pytest_polgrad.pytest.golden


def _check_snapshot_dir(config: pytest.Config) -> None:
    """A ``polgrad_snapshot_dir`` outside the rootdir is a usage error at startup."""
    try:
        configured = str(config.getini("polgrad_snapshot_dir") or "")
    except ValueError:  # not registered (the plugin's ini options are absent)
        return
    if not configured:
        return
    # syrupy: only for a session with snapshots configured, not at the plugin's load
    from pytest_polgrad.core.golden_format import SnapshotPathError, snapshot_base

    try:
        snapshot_base(config.rootpath, configured)
    except SnapshotPathError as exc:
        raise pytest.UsageError(str(exc)) from None


class SnapshotGuard:
    """Tracks which items ran to completion and protects the snapshots of the others."""

    def __init__(self, config: pytest.Config) -> None:
        _check_snapshot_dir(config)
        self.config = config
        self.selected: set[str] = set()
        self.done: set[str] = set()
        self.failed: set[str] = set()
        self.collection_errors = 0
        self.crashed = 0
        self.kept: str = ""

    # ---------------------------------------------------------------- what ran

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.collection_errors += 1

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.selected.update(item.nodeid for item in session.items)
        goldens = [i for i in session.items if getattr(getattr(i, "obj", None), _GOLDEN, 0)]
        if goldens:  # imported only then: a session without goldens loads no torch
            from pytest_polgrad.pytest.golden import claim_golden_files

            claim_golden_files(self.config, goldens)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self.selected.update(ids)  # xdist controller: every worker collects every item

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: Any, sched: Any) -> None:
        self.crashed += 1

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            self.failed.add(report.nodeid)
        elif report.when == "call" or report.skipped:
            self.done.add(report.nodeid)

    # ---------------------------------------------------------------- protection

    def _updating(self) -> bool:
        return bool(getattr(self.config.option, "update_snapshots", False))

    def incomplete(self, session: pytest.Session, exitstatus: int | pytest.ExitCode) -> str:
        """Why the session did not run every selected item to completion ("" if it did)."""
        if self.collection_errors:
            return f"{self.collection_errors} collection error(s)"
        if self.crashed:
            return f"{self.crashed} xdist worker crash(es)"
        if exitstatus == pytest.ExitCode.INTERRUPTED:
            return "the session was interrupted"
        if session.shouldstop or session.shouldfail:
            return f"the session stopped early ({session.shouldstop or session.shouldfail})"
        missing = self.selected - self.done - self.failed
        if missing:
            return f"{len(missing)} of {len(self.selected)} selected item(s) did not finish"
        return ""

    @pytest.hookimpl(wrapper=True)
    def pytest_sessionfinish(
        self, session: pytest.Session, exitstatus: int | pytest.ExitCode
    ) -> Generator[None, object, object]:
        syrupy = getattr(self.config, "_syrupy", None)
        if syrupy is not None and self._updating() and not hasattr(self.config, "workerinput"):
            self._protect(syrupy, self.incomplete(session, exitstatus))
        return (yield)

    def _protect(self, syrupy: Any, why: str) -> None:
        if why:
            self._no_cleanup(why)
            return
        failed = sorted(self.failed)
        if not failed:
            return
        reports = getattr(syrupy, "_worker_reports", None)
        if reports:  # xdist controller: syrupy merges the workers' item statuses
            if not all(
                isinstance(r, dict) and isinstance(r.get("selected"), dict) for r in reports
            ):
                self._no_cleanup(f"{len(failed)} item(s) failed")
                return
            for report in reports:
                for nodeid in failed:
                    if nodeid in report["selected"]:
                        report["selected"][nodeid] = "skipped"
        else:
            for nodeid in failed:
                syrupy.ran_item(nodeid, "skipped")

    def _no_cleanup(self, why: str) -> None:
        self.config.option.no_cleanup = True
        self.kept = (
            f"--snapshot-update did not run every item to completion ({why}): no snapshot "
            "was deleted; rerun it to completion to remove unused snapshots"
        )

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.kept and not hasattr(self.config, "workerinput"):
            terminalreporter.write_line(f"polgrad: {self.kept}", yellow=True)
