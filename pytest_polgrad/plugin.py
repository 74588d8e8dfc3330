"""The pytest plugin: the ``polgrad_conforms`` marker, its generated items, options,
fixtures and the terminal/JSON reports.

Loaded for every pytest session through the ``pytest11`` entry point, so this module
imports nothing heavy at module level: torch and Hypothesis are imported only when a
marked function is collected or a polgrad fixture is used.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
import tempfile
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_polgrad.core import saved_snippets
from pytest_polgrad.core.expect import (
    BASIS,
    declared_fields,
    evidence_budget,
    excused_reason,
    fmt,
    judge,
)
from pytest_polgrad.core.options import PROFILES, ConformanceOptions, MarkerError, did_you_mean
from pytest_polgrad.core.verdicts import repeated_verdict, verdict_key
from pytest_polgrad.pytest.collect import Target, targets, unmarkable
from pytest_polgrad.pytest.guard import SnapshotGuard
from pytest_polgrad.pytest.notes import passing_notes
from pytest_polgrad.pytest.threads import apply as apply_threads
from pytest_polgrad.pytest.threads import parse as parse_threads

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
    group.addoption(
        "--polgrad-torch-threads",
        default=None,
        metavar="N|auto|keep",
        help="torch intra-op threads: auto (default) gives each pytest-xdist worker its "
        "share of the CPUs, N sets N, keep leaves torch alone",
    )
    parser.addini("polgrad_max_examples", "examples per polgrad check", default=None)
    parser.addini(
        "polgrad_torch_threads",
        "torch intra-op threads: auto (each xdist worker its share of the CPUs), N, keep",
        default=None,
    )
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


# --------------------------------------------------------------------------- settings


@dataclasses.dataclass(frozen=True)
class Settings:
    """The session's polgrad settings, validated once at startup (``pytest_configure``)."""

    cli_examples: int | None
    """``--polgrad-max-examples``, else the budget of ``--polgrad-profile`` (beats markers)."""
    ini_examples: int | None
    """ini ``polgrad_max_examples``, else the budget of ini ``polgrad_profile``."""
    seed: int
    report: Path | None
    torch_threads: str = "auto"
    """``--polgrad-torch-threads`` / ini ``polgrad_torch_threads`` (see :mod:`.threads`)."""

    def max_examples(self, options: ConformanceOptions) -> int:
        """Command line (examples, then profile) > marker > ini (examples, then profile)
        > the default profile's 100."""
        for value in (self.cli_examples, options.max_examples, self.ini_examples):
            if value is not None:
                return value
        return PROFILES["default"]


_SETTINGS = pytest.StashKey[Settings]()
_THREADS_SET = pytest.StashKey[bool]()


def _positive(name: str, value: int | None) -> int | None:
    if value is not None and value < 1:
        raise pytest.UsageError(f"{name} must be a positive number of examples, got {value}")
    return value


def _ini_int(config: pytest.Config, ini: str) -> int | None:
    raw = config.getini(ini)
    if raw in (None, ""):
        return None
    try:
        return int(str(raw).strip())
    except ValueError:
        raise pytest.UsageError(f"ini option {ini} must be an integer, got {raw!r}") from None


def _profile(name: object, where: str) -> int | None:
    if name in (None, ""):
        return None
    if name not in PROFILES:
        raise pytest.UsageError(
            f"{where} must be one of {', '.join(map(repr, PROFILES))}, got {name!r}"
            + did_you_mean(name, PROFILES)
        )
    return PROFILES[str(name)]


def _report_path(raw: object) -> Path | None:
    if not raw:
        return None
    path = Path(str(raw))
    if path.is_dir():
        raise pytest.UsageError(
            f"--polgrad-report names a directory ({path}); give a file, e.g. "
            f"--polgrad-report={path / 'polgrad.json'}"
        )
    if not path.parent.is_dir():
        raise pytest.UsageError(
            f"--polgrad-report={raw}: the directory {path.parent} does not exist; create it "
            "or give another path"
        )
    existed = path.exists()
    try:  # unwritable (read-only, /proc/x): a usage error now, not a red line at the end
        with path.open("a"):
            pass
        if not existed:
            path.unlink()
    except OSError as exc:
        raise pytest.UsageError(
            f"--polgrad-report={raw}: cannot write there ({exc.strerror or exc}); give another path"
        ) from None
    return path


def read_settings(config: pytest.Config) -> Settings:
    """Validate every polgrad option and ini value: one usage error, before any test."""
    cli = _positive("--polgrad-max-examples", config.getoption("--polgrad-max-examples"))
    if cli is None:
        cli = _profile(config.getoption("--polgrad-profile"), "--polgrad-profile")
    ini = _positive("ini option polgrad_max_examples", _ini_int(config, "polgrad_max_examples"))
    profile = _profile(config.getini("polgrad_profile"), "ini option polgrad_profile")
    seed = config.getoption("--polgrad-seed")
    if seed is None:
        seed = _ini_int(config, "polgrad_seed")
    threads = config.getoption("--polgrad-torch-threads")
    where = "--polgrad-torch-threads"
    if threads is None:
        threads, where = config.getini("polgrad_torch_threads"), "ini option polgrad_torch_threads"
        threads = threads or None  # an empty ini value is no value
    try:
        torch_threads = parse_threads(threads, where)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    return Settings(
        cli_examples=cli,
        ini_examples=ini if ini is not None else profile,
        seed=DEFAULT_SEED if seed is None else int(seed),
        report=_report_path(config.getoption("--polgrad-report")),
        torch_threads=torch_threads,
    )


def settings(config: pytest.Config) -> Settings:
    """The validated settings (read at startup; read again for a config made elsewhere)."""
    if _SETTINGS not in config.stash:
        config.stash[_SETTINGS] = read_settings(config)
    return config.stash[_SETTINGS]


def max_examples(config: pytest.Config, options: ConformanceOptions) -> int:
    """The example budget of one check (see :meth:`Settings.max_examples`)."""
    return settings(config).max_examples(options)


def base_seed(config: pytest.Config) -> int:
    return settings(config).seed


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(reference, **options): check the marked loss function against the "
        "named polgrad reference semantics (see pytest-polgrad docs)",
    )
    config.stash[_SETTINGS] = read_settings(config)
    config.stash[_SNIPPETS_BEFORE] = saved_snippets.current()
    saved_snippets.save_under(_snippet_directory(config))
    config.pluginmanager.register(Reporter(config), "polgrad-reporter")

    config.pluginmanager.register(SnapshotGuard(config), "polgrad-snapshot-guard")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _SNIPPETS_BEFORE in config.stash:  # configure may have stopped before (a bad option)
        saved_snippets.save_under(config.stash[_SNIPPETS_BEFORE])


_SNIPPETS_BEFORE = pytest.StashKey[Callable[[], Path] | None]()


def _snippet_directory(config: pytest.Config) -> Callable[[], Path]:
    """``<basetemp>/polgrad`` for long reproduction snippets (:mod:`.saved_snippets`),
    made at the first one: pytest keeps the last three basetemps, so the file outlives
    the run. Looked up when needed: pytest's tmpdir plugin may configure after this one."""

    def directory() -> Path:
        factory = getattr(config, "_tmp_path_factory", None)  # tmp_path_factory's own
        if factory is None:  # -p no:tmpdir
            path = Path(tempfile.gettempdir()) / "pytest-polgrad"
        else:
            path = factory.getbasetemp() / "polgrad"
        path.mkdir(parents=True, exist_ok=True)
        return path

    return directory


def pytest_sessionstart(session: pytest.Session) -> None:
    # Snapshot write errors belong to one session: a later session in this process (a
    # pytester in-process run) must not report an earlier one's failed write as its own.
    snapshot = sys.modules.get(
        f"{__package__}.core.golden_format"
    )  # not imported: nothing to forget
    if snapshot is not None:
        snapshot.forget_write_errors()


# --------------------------------------------------------------------------- items


class ConformanceFailure(AssertionError):
    """A polgrad check failed; its message is the full report."""


def _entry(target: Target, check: str, fields: dict[str, Any] | None = None) -> tuple[str, str]:
    """The ``user_properties`` entry an item reports (provisional until it runs, so the
    summary still counts an item that ends without a result)."""
    entry = {
        "kind": target.options.kind,
        "reference": target.options.reference_id,
        "check": check,
        "checks": list(target.checks),
        "worst": None,
        "examples": 0,
        "match": "",
        "diagnosis": "",
        "seconds": None,  # the check's time and the function's own share (core/clock.py)
        "function_seconds": None,
        **(fields or {}),
        "function": target.label,
    }
    return "polgrad", json.dumps(entry)


def set_entry(item: pytest.Item, entry: tuple[str, str]) -> None:
    item.user_properties[:] = [p for p in item.user_properties if p[0] != "polgrad"]
    item.user_properties.append(entry)


def _is_verdict(report: str) -> bool:
    return "\n  verdict " in report


class PolgradItem(pytest.Item):
    """One check of one marked function: ``fn[<reference>-<check>]``."""

    def _once(self, result: Any) -> str:
        """The report, in full the first time this process reports a verdict (the
        function misbehaved, e.g. raised on a valid batch) for this function; for the
        same verdict from its other checks, the verdict and the replay line only."""
        report = str(result.report)
        if not _is_verdict(report):
            return report
        first = self.target.verdicts.setdefault(verdict_key(str(result.message)), self.check)
        if first == self.check:
            return report
        return repeated_verdict(report, first, self.target.label)

    def __init__(self, *, target: Target, check: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.target = target
        self.fn = target.fn
        self.options = target.options
        self.check = check

    def _run(self, run_check: Any, ctx: Any, budget: int, seed: int) -> Any:
        replay = (  # a command line: the node id shell-quoted (issue 28)
            f"pytest {saved_snippets.shell_word(self.nodeid)} -p no:randomly "
            f"--polgrad-seed={seed} --polgrad-max-examples={budget}"
        )
        return run_check(
            ctx,
            self.check,
            max_examples=budget,
            base_seed=seed,
            replay=replay,
            shared=self.target.calls,
        )

    def runtest(self) -> None:
        from pytest_polgrad.core.engine import build_context, run_check  # torch: at run only

        s = settings(self.config)
        if _THREADS_SET not in self.config.stash:
            self.config.stash[_THREADS_SET] = True
            apply_threads(s.torch_threads, self.config)
        budget = s.max_examples(self.options)
        reason = self.options.expect.get(self.check)
        try:
            ctx = build_context(self.fn, self.options, name=self.target.label)
            result = self._run(run_check, ctx, budget, s.seed)
            again = evidence_budget(budget) if result.passed and reason is not None else None
            if again is not None:  # a declared check is called stale at the default budget
                result = self._run(run_check, ctx, again, s.seed)
        except MarkerError as exc:  # e.g. device="cuda" on a machine without CUDA
            raise ConformanceFailure(f"{self.target.label}: {exc}") from None
        data = {**result.as_dict(), "function": self.target.label}
        if result.passed and reason is not None:
            set_entry(self, _entry(self.target, self.check, {**data, "stale": True}))
            raise ConformanceFailure(
                f"{self.target.label}: check {self.check!r} was declared as a known deviation "
                f"({reason!r}) but it now passes; remove it from expect= on the marker"
            )
        if result.passed:
            set_entry(self, _entry(self.target, self.check, data))
            return
        if reason is None:
            set_entry(self, _entry(self.target, self.check, data))
            raise ConformanceFailure(self._once(result))
        verdict = judge(ctx, result)
        bound = self.options.expect_bounds.get(self.check)
        declared = declared_fields(reason, verdict, bound, data["worst"])
        set_entry(self, _entry(self.target, self.check, {**data, "declared": declared}))
        if verdict.excused:
            message = excused_reason(self.check, reason, verdict.measured, bound, result.worst)
            pytest.xfail(message)
            # Only reached under --runxfail (pytest.xfail is then a no-op): a failure.
            raise ConformanceFailure(
                f"{self.target.label}: check {self.check!r}: {message}; it is excused by "
                f"expect=, and reported as a failure because of --runxfail\n\n{result.report}"
            )
        raise ConformanceFailure(
            f"{self.target.label}: check {self.check!r} is declared as a known deviation "
            f"({reason!r}), but expect= does not excuse this failure: {verdict.problem}\n\n"
            f"{result.report}"
        )

    def repr_failure(
        self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None
    ) -> str | Any:
        # A known deviation (pytest.xfail) is rendered too, even when pytest then shows only
        # its reason: pytest's traceback of it parses the source of every frame, about
        # 0.1-0.2 s per item. Its message says all there is (and reads well under --runxfail).
        if isinstance(excinfo.value, (ConformanceFailure, pytest.xfail.Exception)):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        # A line is required where pytest reports a skip at the item's location (skipif).
        fn = getattr(self.fn, "func", self.fn)
        code = getattr(getattr(fn, "__func__", fn), "__code__", None)
        return self.path, (code.co_firstlineno - 1 if code is not None else 0), self.name


def _golden_item(collector: pytest.Module | pytest.Class, target: Target) -> pytest.Function:
    """The ``golden`` check: a real pytest function using syrupy's ``snapshot`` fixture,
    so ``--snapshot-update``, unused-snapshot reports and xdist locking all apply."""
    from pytest_polgrad.pytest.golden import (  # syrupy: golden items only
        GoldenMismatch,
        golden_test,
    )

    item = pytest.Function.from_parent(
        collector,
        name=target.item_name("golden"),
        callobj=golden_test(target.fn, target.options, name=target.label),
    )
    config = collector.config
    if not config.pluginmanager.hasplugin("syrupy"):
        item.add_marker(pytest.mark.skip(reason="golden checks need syrupy (-p no:syrupy given)"))
    reason = target.options.expect.get("golden")
    if reason is not None:
        # Strict, except while snapshots are being updated (the update makes it pass); only
        # a snapshot mismatch is excused, never a function that cannot be evaluated.
        updating = bool(config.getoption("--snapshot-update", default=False))
        item.add_marker(
            pytest.mark.xfail(
                reason=f"known deviation: {reason}", strict=not updating, raises=GoldenMismatch
            )
        )
    return item


_INVALID = pytest.StashKey[list[str]]()
"""A collector's marked objects whose marker cannot work, one message each."""


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(
    collector: pytest.Module | pytest.Class, name: str, obj: object
) -> list[pytest.Item] | None:
    try:
        found = targets(collector, name, obj)
    except MarkerError as exc:  # collected on, so every such object of the file is named
        collector.stash.setdefault(_INVALID, []).append(
            f"{name}: invalid @pytest.mark.{MARKER}: {exc}"
        )
        return []
    if found is None:
        return None
    items: list[pytest.Item] = []
    for target in found:
        for check in target.checks:
            item: pytest.Item
            if check == "golden":
                item = _golden_item(collector, target)
            else:
                item = PolgradItem.from_parent(
                    collector, name=target.item_name(check), target=target, check=check
                )
            item.user_properties.append(_entry(target, check))
            for mark in target.marks:
                item.add_marker(getattr(pytest.mark, mark.name)(*mark.args, **mark.kwargs))
            items.append(item)
    return items


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    """A file (or class) with invalid markers is one collection error that names each of
    them, as pytest reports a file that does not import."""
    report = yield
    if report.failed and (line := unmarkable(collector.path, str(report.longrepr))):
        return pytest.CollectReport(collector.nodeid, "failed", line, [], report.sections)
    invalid = collector.stash.get(_INVALID, [])
    if invalid and report.passed:
        report = pytest.CollectReport(
            collector.nodeid, "failed", "\n".join(invalid), [], sections=report.sections
        )
    return report


# --------------------------------------------------------------------------- reports


class Reporter:
    """Collects check results (on the xdist controller too, via ``user_properties``) and
    writes the summary table and the JSON report."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.results: list[dict[str, Any]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not (report.when == "call" or report.failed or report.skipped):
            return  # one entry per item: its call, or the setup/teardown that failed
        if report.when == "teardown" and not report.failed:
            return
        for key, value in report.user_properties:
            if key == "polgrad":
                entry = json.loads(str(value))
                status = "xfailed" if hasattr(report, "wasxfail") else report.outcome
                entry["status"] = status
                entry["nodeid"] = report.nodeid
                self.results = [r for r in self.results if r["nodeid"] != report.nodeid]
                self.results.append(entry)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.results or hasattr(self.config, "workerinput"):
            return
        tr = terminalreporter
        tr.section("polgrad conformance")
        header = ("function", "kind", "reference", "pass", "fail", "expected", "worst/tol")
        rows = list(summary_rows(self.results))
        widths = [max(len(r[i]) for r in [(*header, ""), *rows]) for i in range(len(header))]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths) + "  {}"
        tr.write_line(fmt.format(*header, "diagnosis"))
        for row in rows:
            tr.write_line(fmt.format(*row))
        timed = [r for r in self.results if isinstance(r.get("seconds"), (int, float))]
        if timed:  # the functions' own calls apart from the kit's work (core/clock.py)
            total = sum(float(r["seconds"]) for r in timed)
            own = sum(float(r.get("function_seconds") or 0.0) for r in timed)
            tr.write_line(
                f"time in checks {total:.2f} s: the functions' own calls {own:.2f} s, the kit "
                f"{total - own:.2f} s (each check's: --polgrad-report)"
            )
        passed = [(str(r["function"]), list(r.get("notes") or ())) for r in self.results
                  if r.get("status") == "passed"]  # fmt: skip
        notes = passing_notes(passed)
        if notes:
            tr.write_line("notes of passing checks:")
            for line in notes:
                tr.write_line(f"  {line}")
        missing = sum(r.get("golden") == "missing" for r in self.results)
        if missing:
            tr.write_line(
                f"{missing} golden{'s' if missing != 1 else ''} not recorded yet: review the "
                "functions, then run pytest --snapshot-update and commit the new files",
                yellow=True,
            )
        pinned = _goldens_of_failing_functions(self.results)
        if pinned and self.config.getoption("--snapshot-update", default=False):
            tr.write_line(
                f"polgrad: --snapshot-update recorded the golden of {len(pinned)} function(s) "
                f"that fail other checks: {', '.join(pinned)}. A golden pins what a function "
                "computes now; review those failures before committing the snapshots",
                yellow=True,
            )
        path = settings(self.config).report
        if path is not None:
            ordered = sorted(self.results, key=lambda r: str(r["nodeid"]))
            try:
                path.write_text(json.dumps(ordered, indent=2) + "\n")
            except OSError as exc:  # the run fails: its report was asked for (issue 28)
                tr.write_line(f"--polgrad-report: JSON report NOT written: {exc}", red=True)
                if tr._session is not None:
                    tr._session.exitstatus = pytest.ExitCode.USAGE_ERROR
            else:
                tr.write_line(f"polgrad JSON report written to {path}")


def _goldens_of_failing_functions(results: list[dict[str, Any]]) -> list[str]:
    """The functions whose golden passed (under ``--snapshot-update``: was recorded) while
    another of their checks failed (an excused, declared deviation is not a failure)."""
    golden: set[str] = set()
    failing: set[str] = set()
    for r in results:
        name = str(r["function"])
        if r.get("check") == "golden" and r.get("status") == "passed":
            golden.add(name)
        elif r.get("check") != "golden" and r.get("status") == "failed":
            failing.add(name)
    return sorted(golden & failing)


def _in_check_order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The row's entries in the order its checks were generated (golden last), whatever
    order xdist delivers them in."""
    planned = list(rows[0].get("checks") or [])

    def key(r: dict[str, Any]) -> tuple[bool, int]:
        check = r.get("check")
        return check == "golden", planned.index(check) if check in planned else len(planned)

    return sorted(rows, key=key)


def _brief(message: str) -> str:
    """A verdict in a few words for the table: its first line without "the function",
    and for a likely cause the report names, the cause and its fix (batch sizes
    dropped, so every check's verdict reads the same)."""
    lines = message.splitlines()
    text = lines[0].strip() if lines else ""
    text = text.removeprefix("the function ")
    if "; likely cause: " in text:
        cause = re.sub(r" = \[[\d, ]*\]", "", text.split("; likely cause: ", 1)[1])
        fix = re.search(r"\((write [^()]+)\)\s*$", cause)
        text = f"{cause.split(': ', 1)[0]}; {fix.group(1)}" if fix else cause
    return text if len(text) <= 140 else text[:137].rstrip() + "..."


def _verdict(rows: list[dict[str, Any]]) -> str:
    """What the row's first verdict says (the function raised, returned NaN, ...), or ""."""
    for r in _in_check_order(rows):
        if r["status"] == "failed" and _is_verdict(str(r.get("report") or "")):
            text = _brief(str(r.get("message") or ""))
            if "different results for the same batch" in text:
                return f"not deterministic: {text}"
            return f"cannot be evaluated: {text}" if text else "cannot be evaluated"
    return ""


def _declared_sizes(rows: list[dict[str, Any]]) -> str:
    """The sizes of the row's declared deviations in the words of the expected-failure
    reasons and the "grew" failures: "declared: value 3.82e+03x, gradient 4.03e+04x the
    tolerance on the canonical corpus" for the excused ones, "grew: value 3.82e+03x the
    tolerance on the canonical corpus, declared at most 3e+03x" for each one over its
    bound, "declared, not shown by the canonical corpus: value" for those at most 1x
    there; "" when none has a size (an exact property's deviation has none)."""
    excused: list[str] = []
    unseen: list[str] = []
    grew: list[str] = []
    for r in _in_check_order(rows):
        declared = r.get("declared") or {}
        size, bound = declared.get("corpus_size"), declared.get("bound")
        if not isinstance(size, (int, float)) or not math.isfinite(size):
            continue
        if r["status"] == "xfailed" and size <= 1:
            unseen.append(str(r["check"]))
        elif r["status"] == "xfailed":
            excused.append(f"{r['check']} {fmt(float(size))}x")
        elif isinstance(bound, (int, float)) and size > bound:  # the item failed: it grew
            grew.append(
                f"grew: {r['check']} {fmt(float(size))}x the tolerance on {BASIS}, declared "
                f"at most {fmt(float(bound))}x"
            )
    clauses = [f"declared: {', '.join(excused)} the tolerance on {BASIS}"] if excused else []
    if unseen:
        clauses.append(f"declared, not shown by {BASIS}: {', '.join(unseen)}")
    return "; ".join(clauses + grew)


def _diagnosis(rows: list[dict[str, Any]], failed: int, expected: int) -> str:
    text = _verdict_or_state(rows, failed, expected)
    sizes = _declared_sizes(rows)
    if not sizes:
        return text
    if text.startswith("conforms"):
        return f"{text} ({sizes.removeprefix('declared: ').removeprefix('declared, ')})"
    return f"{text}; {sizes}" if text else sizes


def _verdict_or_state(rows: list[dict[str, Any]], failed: int, expected: int) -> str:
    # A semantic check's diagnosis first, then what a verdict says (the golden row's
    # "golden not recorded yet" or "cannot be evaluated" must not hide either).
    ordered = _in_check_order(rows)
    found = next(
        (str(r["match"]) for r in ordered if r.get("match") and r.get("check") != "golden"), ""
    )
    found = found or _verdict(rows)
    found = found or next((str(r["match"]) for r in ordered if r.get("match")), "")
    if found:
        return found
    missing = [r for r in rows if r.get("golden") == "missing"]
    if missing and failed == len(missing):
        return "golden not recorded yet"
    if failed:
        return ""
    planned = set(rows[0].get("checks") or [r["check"] for r in rows])
    ran = {r["check"] for r in rows if r["status"] in ("passed", "xfailed")}
    if not planned <= ran:
        left = sorted(planned - ran)
        shown = ", ".join(left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
        return (
            f"{len(ran & planned)} of {len(planned)} checks ran, all passed; not run: {shown} "
            "(no overall verdict)"
        )
    return "conforms" if expected == 0 else "conforms, except the declared deviations"


def summary_rows(results: list[dict[str, Any]]) -> Iterator[tuple[str, ...]]:
    """One row per (function as collected, kind, reference): counts, worst error,
    diagnosis. "conforms" needs every check generated for the row to have run.

    ``worst/tol`` is the worst error, in tolerances, over the examples this run drew for
    the row's judged checks; an excused check is left out of it, and its size on the
    canonical corpus (what its declaration bounds) is in the diagnosis instead."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in results:
        key = (str(r["function"]), str(r.get("kind", "policy_loss")), str(r["reference"]))
        groups.setdefault(key, []).append(r)
    for (fn, kind, ref), rows in sorted(groups.items()):
        passed = sum(r["status"] == "passed" for r in rows)
        failed = sum(r["status"] == "failed" for r in rows)
        expected = sum(r["status"] == "xfailed" for r in rows)
        judged = [r for r in rows if r["status"] != "xfailed"]
        measured = [float(r["worst"]) for r in judged if isinstance(r["worst"], (int, float))]
        if any(r["worst"] == "inf" for r in judged):
            measured.append(float("inf"))
        worst = f"{max(measured):.3g}" if measured else "-"
        yield (
            fn,
            kind,
            ref,
            str(passed),
            str(failed),
            str(expected),
            worst,
            _diagnosis(rows, failed, expected),
        )


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def polgrad_oracle() -> Callable[..., Any]:
    """Factory: ``polgrad_oracle("grpo", budget=8)`` returns a callable
    ``oracle(**batch) -> PolicyLossOutput`` of the reference (float64)."""
    from pytest_polgrad.pytest.fixtures import make_oracle  # torch: when the fixture is used

    return make_oracle


@pytest.fixture
def polgrad_batch() -> Callable[..., Any]:
    """Factory of canonical batches: ``polgrad_batch("ragged", dtype=torch.float32)``."""
    from pytest_polgrad.pytest.fixtures import make_batch  # torch: when the fixture is used

    return make_batch


@pytest.fixture
def polgrad_snapshot(snapshot: Any) -> Any:
    """syrupy's ``snapshot`` preconfigured for tensors and loss results: one ``.polgrad``
    text file per assertion, compared within the dtype's tolerance (docs/snapshots.md)."""
    from pytest_polgrad.core.golden_format import PolgradSnapshotExtension  # syrupy: when used

    return snapshot.use_extension(PolgradSnapshotExtension)


@pytest.fixture
def polgrad_report_type() -> type:
    """The result type of one check (``CheckResult``), for typing custom reporting."""
    from pytest_polgrad.core.engine import CheckResult  # torch: when the fixture is used

    return CheckResult


@pytest.fixture
def polgrad_diagnostics() -> Any:
    """The ``polgrad_reference.diagnostics`` module (imported on first use, so loading the
    plugin still imports no torch): run-pathology detectors with calibrated alarms
    (docs/diagnostics.md)."""
    from polgrad_reference import diagnostics  # torch: when the fixture is used

    return diagnostics
