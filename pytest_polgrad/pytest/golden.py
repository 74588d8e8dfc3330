"""The ``golden`` item of a marked function: its loss and gradient on every canonical corpus
batch, stored as a polgrad snapshot and compared within the engine's tolerance.

The item is a plain pytest function taking syrupy's ``snapshot`` fixture, so
``--snapshot-update``, unused-snapshot reports and xdist all behave as for any syrupy test.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from syrupy.assertion import SnapshotAssertion
from syrupy.location import PyTestLocation

from pytest_polgrad.core.engine import build_context, kind_of
from pytest_polgrad.core.golden_format import (
    RETAIN,
    PolgradSnapshotExtension,
    SnapshotPathError,
    Tolerant,
    refuse_unusual,
    write_error,
)
from pytest_polgrad.core.options import ConformanceOptions, MarkerError
from pytest_polgrad.core.verdicts import Verdict

__all__ = ["GoldenMismatch", "claim_golden_files", "golden_test"]

_GOLDEN = "__polgrad_golden__"
_SHARED = pytest.StashKey[dict[str, str]]()
"""Per session: node id of a golden item -> why its file is not its own alone."""


def claim_golden_files(config: pytest.Config, items: Iterable[pytest.Item]) -> dict[str, str]:
    """Map each golden item to its snapshot file at collection; an item whose file another
    item also maps to gets an error instead of a run (never one overwriting the other's
    values). File names are injective (:func:`~pytest_polgrad.core.golden_format.
    golden_stem`), so this catches a hash collision, or two names one file system folds
    into one (case-insensitive ones)."""
    owners: dict[str, list[str]] = {}
    for item in items:
        if not getattr(getattr(item, "obj", None), _GOLDEN, False):
            continue
        try:
            location = PolgradSnapshotExtension.get_location(
                test_location=PyTestLocation(item), index=0
            )
        except Exception:  # the item then reports it when it runs
            continue
        key = os.path.normcase(location)
        owners.setdefault(key, []).append(item.nodeid)
        folded = key.casefold()
        if folded != key:
            owners.setdefault("\0" + folded, []).append(item.nodeid)
    shared: dict[str, str] = {}
    for key, ids in owners.items():
        if len(ids) > 1:
            fold = " on a case-insensitive file system" if key.startswith("\0") else ""
            for nodeid in ids:
                others = ", ".join(i for i in ids if i != nodeid)
                shared.setdefault(
                    nodeid,
                    f"its golden file would be shared{fold} with {others}; rename one (no "
                    "test writes a golden another test owns)",
                )
    if not _case_insensitive(config.rootpath):
        shared = {n: why for n, why in shared.items() if "case-insensitive" not in why}
    config.stash[_SHARED] = shared
    return shared


def _case_insensitive(path: Path) -> bool:
    """Whether the file system at ``path`` folds case (``path`` seen through its swapped
    case is the same file)."""
    if not path.name:  # the file system's root
        return False
    swapped = path.with_name(path.name.swapcase())
    if swapped == path:
        return False
    try:
        return os.path.samefile(path, swapped)
    except OSError:
        return False


def _kind(location: str) -> str:
    """``"file"``, ``"absent"``, or what else is there (a link is not followed)."""
    try:
        mode = os.lstat(location).st_mode
    except FileNotFoundError:
        return "absent"
    return "file" if stat.S_ISREG(mode) else "other"


def _location(snapshot: SnapshotAssertion) -> str:
    return str(
        snapshot.extension.get_location(test_location=snapshot.test_location, index=snapshot.index)
    )


class GoldenMismatch(pytest.fail.Exception):  # type: ignore[misc,name-defined]
    """The golden snapshot differs from the function's outputs: the only golden failure a
    declared ``expect={"golden": ...}`` excuses (never a function that cannot be evaluated,
    a missing snapshot or a failed write)."""

    # pytest's own outcomes do this: the short summary line reads "GoldenMismatch: golden
    # ...", not a module path that the terminal width cuts to "pytest_polgrad.golde..."
    __module__ = "builtins"


def _note(request: pytest.FixtureRequest, **fields: object) -> None:
    """Add fields to the item's polgrad entry (for the summary and the JSON report)."""
    props = request.node.user_properties
    for i, (key, value) in enumerate(props):
        if key == "polgrad":
            props[i] = (key, json.dumps({**json.loads(str(value)), **fields}))


def golden_test(
    fn: Callable[..., Any], options: ConformanceOptions, *, name: str | None = None
) -> Callable[..., None]:
    """The test function of ``fn[<reference>-golden]``; it takes syrupy's ``snapshot``.
    ``name`` is the name pytest collected the function under (reports use it)."""
    shown = name if name is not None else str(getattr(fn, "__qualname__", fn))
    label = f"{shown} (reference {options.reference_id})"

    def golden(snapshot: SnapshotAssertion, request: pytest.FixtureRequest) -> None:
        snap = snapshot.use_extension(PolgradSnapshotExtension)
        location = _location(snap)
        shared = request.config.stash.get(_SHARED, {}).get(request.node.nodeid)
        if shared:
            pytest.fail(f"golden: {label}: {shared}", pytrace=False)
        try:
            refuse_unusual(Path(location))  # a link or a directory: refused, never followed
        except SnapshotPathError as exc:
            _ = snap == RETAIN  # leave it where it is
            pytest.fail(f"golden: {label}: {exc}", pytrace=False)
        stored = _kind(location) == "file"
        problem = unusable = ""
        try:
            ctx = build_context(fn, options, name=shown)
            data: Tolerant | None = kind_of(options).golden(ctx)
        except Verdict as exc:
            data, problem = None, str(exc)
        except MarkerError as exc:  # e.g. device="cuda" on a machine without CUDA
            data, unusable = None, str(exc)
        if unusable:
            pytest.fail(f"golden: {label}: {unusable}", pytrace=False)
        if data is None:
            if stored:
                _ = snap == RETAIN  # keep the stored golden: this failure is not a new value
            _note(request, match="cannot be evaluated")
            pytest.fail(f"golden: {label} could not be evaluated {problem}", pytrace=False)
        if snap != data:
            failed_write = write_error(location)
            if failed_write:
                pytest.fail(f"golden: {label}: {failed_write}", pytrace=False)
            if not stored:
                _note(request, golden="missing", match="golden not recorded yet")
                pytest.fail(
                    f"no golden snapshot of {label} is recorded yet (see the polgrad summary: "
                    "review the function, run pytest --snapshot-update, commit the file)",
                    pytrace=False,
                )
            diff = "\n".join(snap.get_assert_diff())
            raise GoldenMismatch(
                f"golden snapshot of {label} does not match its outputs on the canonical corpus "
                f"(keys read <batch>/<loss|grad>[b,t]):\n{diff}",
                pytrace=False,
            )

    attribute = name.split("[", 1)[0] if name else getattr(fn, "__name__", "golden")
    golden.__name__ = attribute
    golden.__qualname__ = attribute
    golden.__module__ = getattr(fn, "__module__", __name__)
    golden.__doc__ = f"Golden snapshot of {label} on the canonical corpus."
    setattr(golden, _GOLDEN, True)
    return golden
