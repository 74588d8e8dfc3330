"""In-process pytester runs for the suite's own marker tests, guarded against leaks both ways.

A ``pytester.runpytest_subprocess`` run pays an interpreter, pytest's start and
``import torch`` (about 2.8 s here); :func:`run` runs the same command line in the
already-warm test process (``pytester.runpytest_inprocess``) and checks what sharing the
process could break:

- into the inner run: the outer suite's xdist and ``PYTEST_ADDOPTS`` variables are
  removed for the run (the engine sets every Hypothesis setting it depends on
  explicitly, so the outer ``polgrad-dev`` profile does not reach its checks);
- out of it: the outer process's Hypothesis profile, torch's thread count, default dtype
  and grad mode, the engine's pooled inputs, the report's diagnosis cache and the
  snapshot module's globals (``_WRITE_ERRORS``, ``RETAIN``) must be as they were;
- ``sys.modules``: pytester restores it after an in-process run, dropping every module the
  run imported first; a library module dropped that way would be imported a second time
  later (two ``_POOLS``, two ``ConformanceError`` classes, torch modules registering
  twice). :data:`PRELOAD` imports them up front, and :func:`run` fails, naming the
  module, when the inner run still imported a library module first.

A test whose claim needs a fresh interpreter (loading the plugin must not import torch,
``os._exit`` in the main process, a real process's exit status) keeps
``runpytest_subprocess``.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path
from typing import Any

import pytest

_LIBRARIES = ("pytest_polgrad", "polgrad_reference", "strategies")
_LAZY = (
    # imported by torch on a first use inside the checks (symbolic shapes pull in sympy)
    "torch.fx.experimental.symbolic_shapes",
    "torch.utils._sympy.interp",
    "torch.utils._sympy.solve",
    "colorsys",
    "hypothesis.extra.pytestplugin",
    "syrupy",
    "xdist.newhooks",
    # imported by Hypothesis under its default (random) profile, e.g. for a user's @given
    "numpy.random",
    "secrets",
)
_SKIP = ("pytest_polgrad.frameworks", "pytest_polgrad.__main__")


def _preload() -> tuple[str, ...]:
    """Import every module of the kit (not the framework adapters, which import a
    framework) and the lazily imported library modules; return their names."""
    names: list[str] = list(_LAZY)
    for package in _LIBRARIES:
        module = importlib.import_module(package)
        names.append(package)
        for info in pkgutil.walk_packages(module.__path__, package + "."):
            if not info.name.startswith(_SKIP):
                names.append(info.name)
    for name in names:
        importlib.import_module(name)
    return tuple(names)


PRELOAD = _preload()
"""Modules imported when this helper is imported (at collection, before any pytester
fixture takes its ``sys.modules`` snapshot)."""

_OUTER_ENV = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_ADDOPTS")


class _Modules:
    """Records, at the end of the inner session (before pytester restores
    ``sys.modules``), the modules it imported first and their files."""

    def __init__(self) -> None:
        self.outer = set(sys.modules)
        self.first: dict[str, str | None] = {}

    def pytest_unconfigure(self) -> None:
        self.first = {name: _where(sys.modules[name]) for name in set(sys.modules) - self.outer}


def _where(module: Any) -> str | None:
    """A module's file, or the first directory of a namespace package (no ``__file__``)."""
    file = getattr(module, "__file__", None)
    if file is None:
        file = next(iter(getattr(module, "__path__", None) or ()), None)
    return None if file is None else str(file)


def _state() -> dict[str, Any]:
    """What an inner run must leave as it found it, by name."""
    import torch
    from hypothesis import settings

    from pytest_polgrad import engine, report, snapshot

    return {
        "hypothesis profile": settings.get_current_profile_name(),
        "hypothesis default settings": settings.default,
        "torch threads": torch.get_num_threads(),
        "torch default dtype": torch.get_default_dtype(),
        "torch grad mode": torch.is_grad_enabled(),
        "engine._POOL_LIMIT": engine._POOL_LIMIT,
        "engine._POOLS": dict(engine._POOLS),
        "report._DIAGNOSES": dict(report._DIAGNOSES),
        "report._BEST": dict(report._BEST),
        "snapshot._WRITE_ERRORS": dict(snapshot._WRITE_ERRORS),
        "snapshot.RETAIN": snapshot.RETAIN,
    }


def _changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Names whose value the inner run changed. Caches may gain entries (the inner
    run's own functions and pools) and the pool may evict; an entry present before and
    after must be the same object."""
    out = []
    for name, old in before.items():
        new = after[name]
        if isinstance(old, dict):
            if any(k in new and new[k] is not v for k, v in old.items()):
                out.append(name)
            if name == "snapshot._WRITE_ERRORS" and new != old:
                out.append(name)
        elif new is not old and new != old:
            out.append(name)
    return out


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """``pytester.runpytest_inprocess(*args)`` with the guards above; fails (naming what
    leaked) when the run changed the outer process's state or imported a library module
    that pytester is about to drop."""
    before = _state()
    modules = _Modules()
    with pytest.MonkeyPatch.context() as mp:
        for name in _OUTER_ENV:
            mp.delenv(name, raising=False)
        result = pytester.runpytest_inprocess(*args, plugins=[modules])
    changed = _changed(before, _state())
    assert not changed, f"the in-process run changed the outer process's {changed}"
    project = Path(pytester.path).resolve()
    first = sorted(name for name, file in modules.first.items() if not _in(file, project))
    assert not first, (
        f"the in-process run imported {first} first; pytester drops them afterwards and a "
        "later import makes a second copy: add them to tests/inline_run.py _LAZY"
    )
    return result


def _in(path: str | None, root: Path) -> bool:
    return path is not None and Path(path).resolve().is_relative_to(root)
