"""The pytest plugin: the ``polgrad_conforms`` marker, its generated items, options,
fixtures and the terminal/JSON reports.

Loaded for every pytest session through the ``pytest11`` entry point, so this module
imports nothing heavy at module level: torch and Hypothesis are imported only when a
marked function is collected or a polgrad fixture is used.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .options import PROFILES, ConformanceOptions, MarkerError, parse_marker

MARKER = "polgrad_conforms"
DEFAULT_SEED = 0


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("polgrad", "pytest-polgrad conformance checks")
    group.addoption(
        "--polgrad-max-examples",
        type=int,
        default=None,
        help="examples per polgrad check (overrides markers and the profile)",
    )
    group.addoption(
        "--polgrad-seed",
        type=int,
        default=None,
        help=f"base seed of every polgrad check (default {DEFAULT_SEED}); checks are "
        "deterministic for a given seed",
    )
    group.addoption(
        "--polgrad-profile",
        choices=sorted(PROFILES),
        default=None,
        help="example budget: " + ", ".join(f"{k}={v}" for k, v in PROFILES.items()),
    )
    group.addoption(
        "--polgrad-report", default=None, metavar="PATH", help="write a JSON report of all checks"
    )
    parser.addini("polgrad_max_examples", "examples per polgrad check", default=None)
    parser.addini(
        "polgrad_snapshot_dir",
        "directory (relative to the rootdir) for polgrad snapshots; default: syrupy's "
        "__snapshots__ beside each test module",
        default="",
    )
    parser.addini("polgrad_seed", "base seed of the polgrad checks", default=None)
    parser.addini(
        "polgrad_profile", "polgrad example budget: quick, default, thorough", default=None
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(reference, **options): check the marked loss function against the "
        "named polgrad reference semantics (see pytest-polgrad docs)",
    )
    config.pluginmanager.register(Reporter(config), "polgrad-reporter")
    from .guard import SnapshotGuard

    config.pluginmanager.register(SnapshotGuard(config), "polgrad-snapshot-guard")


def _int_setting(config: pytest.Config, option: str, ini: str) -> int | None:
    value = config.getoption(option)
    if value is None:
        raw = config.getini(ini)
        if raw in (None, ""):
            return None
        try:
            value = int(str(raw))
        except ValueError:
            raise pytest.UsageError(f"ini option {ini} must be an integer, got {raw!r}") from None
    return int(value)


def _profile_budget(config: pytest.Config, source: str) -> int | None:
    name = (
        config.getoption("--polgrad-profile")
        if source == "cli"
        else config.getini("polgrad_profile")
    )
    if name in (None, ""):
        return None
    if name not in PROFILES:
        raise pytest.UsageError(f"polgrad_profile must be one of {sorted(PROFILES)}, got {name!r}")
    return PROFILES[str(name)]


def max_examples(config: pytest.Config, options: ConformanceOptions) -> int:
    """Command line (examples, then profile) > marker > ini (examples, then profile) > 100."""
    for value in (
        config.getoption("--polgrad-max-examples"),
        _profile_budget(config, "cli"),
        options.max_examples,
        _int_setting(config, "--polgrad-max-examples", "polgrad_max_examples"),
        _profile_budget(config, "ini"),
    ):
        if value is not None:
            if value < 1:
                raise pytest.UsageError(f"polgrad max examples must be >= 1, got {value}")
            return int(value)
    return PROFILES["default"]


def base_seed(config: pytest.Config) -> int:
    value = _int_setting(config, "--polgrad-seed", "polgrad_seed")
    return DEFAULT_SEED if value is None else value


class ConformanceFailure(AssertionError):
    """A polgrad check failed; its message is the full report."""


class PolgradItem(pytest.Item):
    """One check of one marked function: ``fn[<reference>-<check>]``."""

    def __init__(
        self,
        *,
        fn: Callable[..., Any],
        options: ConformanceOptions,
        check: str,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.fn = fn
        self.options = options
        self.check = check

    def runtest(self) -> None:
        from .engine import build_context, run_check

        config = self.config
        seed, budget = base_seed(config), max_examples(config, self.options)
        replay = (
            f"pytest '{self.nodeid}' -p no:randomly --polgrad-seed={seed} "
            f"--polgrad-max-examples={budget}"
        )
        ctx = build_context(self.fn, self.options)
        result = run_check(ctx, self.check, max_examples=budget, base_seed=seed, replay=replay)
        self.user_properties[:] = [p for p in self.user_properties if p[0] != "polgrad"]
        self.user_properties.append(("polgrad", json.dumps(result.as_dict())))
        reason = self.options.expect.get(self.check)
        if result.passed and reason is not None:
            raise ConformanceFailure(
                f"{result.function}: check {self.check!r} was declared as a known deviation "
                f"({reason!r}) but it now passes; remove it from expect= on the marker"
            )
        if not result.passed:
            if reason is not None:
                pytest.xfail(f"known deviation: {reason}")
            raise ConformanceFailure(result.report)

    def repr_failure(
        self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None
    ) -> str | Any:
        if isinstance(excinfo.value, ConformanceFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, self.name


def _provisional(fn: object, reference: str, check: str) -> tuple[str, str]:
    """The entry an item reports when it ends without a result (a golden item, an error
    inside the kit), so that the summary table still counts it."""
    entry = {
        "function": getattr(fn, "__qualname__", repr(fn)),
        "reference": reference,
        "check": check,
        "worst": None,
        "examples": 0,
        "match": "",
        "diagnosis": "",
    }
    return "polgrad", json.dumps(entry)


def _golden_item(
    collector: pytest.Module | pytest.Class,
    name: str,
    fn: Callable[..., Any],
    options: ConformanceOptions,
) -> pytest.Function:
    """The ``golden`` check: a real pytest function using syrupy's ``snapshot`` fixture,
    so ``--snapshot-update``, unused-snapshot reports and xdist locking all apply."""
    from .golden import golden_test

    item = pytest.Function.from_parent(
        collector,
        name=f"{name}[{options.reference_id}-golden]",
        callobj=golden_test(fn, options),
    )
    config = collector.config
    if not config.pluginmanager.hasplugin("syrupy"):
        item.add_marker(pytest.mark.skip(reason="golden checks need syrupy (-p no:syrupy given)"))
    reason = options.expect.get("golden")
    if reason is not None:
        # Strict, except while snapshots are being updated (the update makes it pass).
        updating = bool(config.getoption("--snapshot-update", default=False))
        item.add_marker(pytest.mark.xfail(reason=f"known deviation: {reason}", strict=not updating))
    return item


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(
    collector: pytest.Module | pytest.Class, name: str, obj: object
) -> list[pytest.Item] | None:
    marks = [m for m in getattr(obj, "pytestmark", []) if getattr(m, "name", None) == MARKER]
    if not marks or not callable(obj) or isinstance(obj, type):
        return None
    from .engine import applicable_checks, resolve_config

    items: list[pytest.Item] = []
    seen: set[str] = set()
    for mark in marks:
        try:
            options = parse_marker(mark.args, mark.kwargs)
            cfg = resolve_config(options)
        except (MarkerError, ValueError, TypeError) as exc:
            raise collector.CollectError(f"{name}: invalid @pytest.mark.{MARKER}: {exc}") from exc
        if options.reference_id in seen:
            raise collector.CollectError(
                f"{name}: two {MARKER} markers share the id {options.reference_id!r}; "
                "give one of them id='...'"
            )
        seen.add(options.reference_id)
        running = applicable_checks(cfg, options)
        if options.checks is None or "golden" in options.checks:
            running.append("golden")
        stray = set(options.expect) - set(running)
        if stray or not running:
            raise collector.CollectError(
                f"{name}: expect= names check(s) {sorted(stray)} that do not run for this "
                f"reference and options (running: {running})"
                if stray
                else f"{name}: no polgrad check applies ({options.checks=})"
            )
        for check in running:
            item: pytest.Item
            if check == "golden":
                item = _golden_item(collector, name, obj, options)
            else:
                item = PolgradItem.from_parent(
                    collector,
                    name=f"{name}[{options.reference_id}-{check}]",
                    fn=obj,
                    options=options,
                    check=check,
                )
            item.user_properties.append(_provisional(obj, options.reference_id, check))
            items.append(item)
    for item in items:
        for other in getattr(obj, "pytestmark", []):
            if getattr(other, "name", None) != MARKER:
                item.add_marker(other)
    return items


class Reporter:
    """Collects check results (on the xdist controller too, via ``user_properties``) and
    writes the summary table and the JSON report."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.results: list[dict[str, Any]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not (report.when == "call" or report.failed):
            return  # one entry per item: its call, or the setup/teardown that failed
        for key, value in report.user_properties:
            if key == "polgrad":
                entry = json.loads(str(value))
                entry["status"] = "xfailed" if hasattr(report, "wasxfail") else report.outcome
                entry["nodeid"] = report.nodeid
                self.results.append(entry)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.results or hasattr(self.config, "workerinput"):
            return
        tr = terminalreporter
        tr.section("polgrad conformance")
        header = ("function", "reference", "pass", "fail", "expected", "worst/tol", "diagnosis")
        rows = list(summary_rows(self.results))
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(6)]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths) + "  {}"
        tr.write_line(fmt.format(*header))
        for row in rows:
            tr.write_line(fmt.format(*row))
        path = self.config.getoption("--polgrad-report")
        if path:
            ordered = sorted(self.results, key=lambda r: str(r["nodeid"]))
            Path(path).write_text(json.dumps(ordered, indent=2) + "\n")
            tr.write_line(f"polgrad JSON report written to {path}")


def summary_rows(results: list[dict[str, Any]]) -> Iterator[tuple[str, ...]]:
    """One row per (function, reference): counts, worst error, diagnosis."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["function"], r["reference"]), []).append(r)
    for (fn, ref), rows in sorted(groups.items()):
        passed = sum(r["status"] == "passed" for r in rows)
        failed = sum(r["status"] == "failed" for r in rows)
        expected = sum(r["status"] == "xfailed" for r in rows)
        measured = [float(r["worst"]) for r in rows if r["worst"] is not None]
        worst = f"{max(measured):.3g}" if measured else "-"
        diagnosis = next((str(r.get("match", "")) for r in rows if r.get("match")), "")
        if not diagnosis and failed == 0:
            diagnosis = "conforms" if expected == 0 else "conforms, except the declared deviations"
        yield fn, ref, str(passed), str(failed), str(expected), worst, diagnosis


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def polgrad_oracle() -> Callable[..., Any]:
    """Factory: ``polgrad_oracle("grpo", budget=8)`` returns a callable
    ``oracle(**batch) -> PolicyLossOutput`` of the reference (float64)."""
    from .fixtures import make_oracle

    return make_oracle


@pytest.fixture
def polgrad_batch() -> Callable[..., Any]:
    """Factory of canonical batches: ``polgrad_batch("ragged", dtype=torch.float32)``."""
    from .fixtures import make_batch

    return make_batch


@pytest.fixture
def polgrad_snapshot(snapshot: Any) -> Any:
    """syrupy's ``snapshot`` preconfigured for tensors and loss results: one ``.polgrad``
    text file per assertion, compared within the dtype's tolerance (docs/snapshots.md)."""
    from .snapshot import PolgradSnapshotExtension

    return snapshot.use_extension(PolgradSnapshotExtension)


@pytest.fixture
def polgrad_report_type() -> type:
    """The result type of one check (``CheckResult``), for typing custom reporting."""
    from .engine import CheckResult

    return CheckResult


@pytest.fixture
def polgrad_diagnostics() -> Any:
    """The ``polgrad_reference.diagnostics`` module (imported on first use, so loading the
    plugin still imports no torch): run-pathology detectors with calibrated alarms
    (docs/diagnostics.md)."""
    from polgrad_reference import diagnostics

    return diagnostics
