"""The suite's one way to run a pytester session in this process: :func:`run`.

A ``pytester.runpytest_subprocess`` run pays an interpreter, pytest's start, ``import
torch`` and collection again (about 3 s here); :func:`run` runs the same command line in
the already-warm test process (``pytester.runpytest_inprocess``) and guards what sharing
the process could break:

- into the inner run: the outer suite's ``PYTEST_XDIST_WORKER``,
  ``PYTEST_XDIST_WORKER_COUNT`` and ``PYTEST_ADDOPTS`` are removed (``env=`` sets
  variables a test means the inner run to see); a ``KeyboardInterrupt`` inside ends the
  inner session with exit code 2, as in a subprocess, and is not raised in the outer test;
- ``cold=True``: the plugin's caches (the engine's pools, the report's diagnoses, the
  snapshot write errors) are emptied for the run and Hypothesis's default profile is
  loaded, as a fresh process has them (two runs with one seed are then independent);
  both are restored afterwards. ``cold=False`` (the default) shares the warm caches and
  the suite's profile, and an inner run may add cache entries but not replace one;
- out of it: the outer process's Hypothesis profile and default settings, torch's thread
  count, default dtype and grad mode, the engine's pool limit and pooled inputs, the
  report's caches and the snapshot module's ``_WRITE_ERRORS`` and ``RETAIN`` must be as
  they were; :func:`run` fails naming what changed (``may_change=`` exempts a name a test
  changes on purpose), after putting back torch's and Hypothesis's settings;
- ``-n`` workers: started by :mod:`tests.helpers.forked_workers` (forked from a process that has
  imported torch, about 1.2 s of CPU less per worker; what a fork cannot honour gets a
  fresh interpreter);
- bytecode: under ``PYTHONDONTWRITEBYTECODE`` (set in some CI images and shells) every
  worker would assertion-rewrite, uncached, each module of the pytest plugins it imports
  (Hypothesis's ~100, the kit's, syrupy's: ~2.5 s of an inner ``-n 2`` session's ~3 s on a
  loaded 2-core machine); the inner run's workers instead cache their bytecode under
  :data:`PYCACHE` (``PYTHONPYCACHEPREFIX``), so only the first workers compile and
  rewrite; nothing is written into the venv or the checkout, and ``env=`` still sets
  either variable for a test that means to;
- ``sys.modules``: pytester drops every module the run imported first, at the end of the
  run and again at the end of the test; a library module dropped that way is imported a
  second time later (two ``_POOLS``, two exception classes, torch registering its ops
  twice). :data:`PRELOAD` imports them up front, and :func:`run` fails, naming the
  module, when the inner run still imported one first (the project's own modules, under
  ``pytester.path`` or a path argument's directory, are dropped on purpose).

Each guard is shown to catch its leak by tests/helpers/test_inline_run.py. A claim that needs a
fresh interpreter (loading the plugin must not import torch, ``os._exit`` in the main
process, a real process's exit status) keeps ``runpytest_subprocess``.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
import tempfile
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import settings

from pytest_polgrad.core import engine
from pytest_polgrad.core import golden_format as snapshot
from pytest_polgrad.kinds.policy_loss import report
from tests.helpers import forked_workers

__all__ = ["PRELOAD", "PYCACHE", "STATE", "XDIST_ENV", "run"]

_KIT = ("pytest_polgrad", "polgrad_reference", "strategies")
_NOT_KIT = ("pytest_polgrad.frameworks", "pytest_polgrad.__main__")  # a framework; the CLI
_LAZY = (
    # imported on first use inside a session: by torch (symbolic shapes pull in sympy)
    "torch._subclasses.schema_check_mode",
    "torch.fx.experimental.symbolic_shapes",
    "torch.utils._sympy.interp",
    "torch.utils._sympy.printers",
    "torch.utils._sympy.solve",
    "torch.utils._sympy.value_ranges",
    "colorsys",
    # by pytest's plugins, and xdist's controller under an inner -n 2
    "hypothesis.extra.pytestplugin",
    "syrupy",
    "execnet",
    "xdist.dsession",
    "xdist.newhooks",
    "xdist.remote",
    "xdist.report",
    "xdist.scheduler",
    "xdist.workermanage",
    # by pytest's tmp_path under an outer xdist worker (its user name)
    "getpass",
    "termios",
    # by Hypothesis under its default (random) profile, e.g. for a user's @given
    "numpy.random",
    "secrets",
    # by the suite's own inner projects (tests/pytest/test_torch_threads.py, test_shared_calls.py)
    "tests.helpers.sample_losses",
)


def _preload() -> tuple[str, ...]:
    """Import every module of the kit (not the framework adapters, which import a
    framework) and the lazily imported library modules; return their names."""
    names = list(_LAZY)
    for package in _KIT:
        root = importlib.import_module(package)
        names.append(package)
        for info in pkgutil.walk_packages(root.__path__, package + "."):
            if not info.name.startswith(_NOT_KIT):
                names.append(info.name)
    for name in names:
        importlib.import_module(name)
    return tuple(names)


PRELOAD = _preload()
"""Imported with this module, at collection, before any ``Pytester`` snapshots
``sys.modules``: the kit's modules and the libraries a session imports lazily."""

PYCACHE = os.path.join(tempfile.gettempdir(), f"polgrad-pycache-{os.getuid()}")
"""Where the inner runs' workers cache bytecode when ``PYTHONDONTWRITEBYTECODE`` is set
(module docstring): one directory for every test process of this user, kept between runs
(a cached file is used only while its source's time and size match, as in ``__pycache__``),
so the first worker to import a module compiles it (the first inner ``-n 2`` session of a
fresh machine: ~10 s) and every later one reads it."""
os.makedirs(PYCACHE, exist_ok=True)

XDIST_ENV = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_ADDOPTS")
"""Set in an outer xdist worker (or by the user); an inner run must not see them."""

_CACHES = (
    (engine, "_POOLS"),
    (report, "_DIAGNOSES"),
    (report, "_BEST"),
    (snapshot, "_WRITE_ERRORS"),
)
"""Module-level caches of the plugin, empty in a fresh process."""


def _state() -> dict[str, Any]:
    """What an inner run must leave as it found it, by name."""
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


STATE = tuple(_state())
"""The names :func:`run` checks, and the ones ``may_change`` may name."""


def _changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Names whose value the inner run changed. Caches may gain entries (the inner
    run's own functions and pools) and the pool may evict; an entry present before and
    after must be the same object; a snapshot write error must not be left behind."""
    out = []
    for name, old in before.items():
        new = after[name]
        if isinstance(old, dict):
            replaced = any(k in new and new[k] is not v for k, v in old.items())
            if replaced or (name == "snapshot._WRITE_ERRORS" and new != old):
                out.append(name)
        elif new is not old and new != old:
            out.append(name)
    return out


def _describe(old: Any, new: Any) -> str:
    """What changed, briefly: a cache's keys added, removed and replaced, or a value."""
    if not isinstance(old, dict):
        return f"{old!r} -> {new!r}"
    parts = {
        "added": [k for k in new if k not in old],
        "removed": [k for k in old if k not in new],
        "replaced": [k for k in old if k in new and new[k] is not old[k]],
    }
    return ", ".join(f"{what} {keys[:3]!r}" for what, keys in parts.items() if keys)


def _restore(before: dict[str, Any]) -> None:
    """Put back the process-wide settings an inner run changed (not the caches)."""
    settings.load_profile(before["hypothesis profile"])
    torch.set_num_threads(before["torch threads"])
    torch.set_default_dtype(before["torch default dtype"])
    torch.set_grad_enabled(before["torch grad mode"])


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


def _inside(path: str | None, roots: list[Path]) -> bool:
    try:
        return path is not None and any(Path(path).resolve().is_relative_to(r) for r in roots)
    except (OSError, ValueError):
        return False


def run(
    pytester: pytest.Pytester,
    *args: str,
    cold: bool = False,
    env: Mapping[str, str] | None = None,
    may_change: Collection[str] = (),
) -> pytest.RunResult:
    """``pytester.runpytest_inprocess(*args)`` with the guards of the module docstring;
    fails (naming what leaked) when the run changed the outer process's state or
    imported a library module that pytester is about to drop.

    ``cold=True``: empty plugin caches and Hypothesis's default profile for the run.
    ``env``: variables the inner run sees (set after the outer xdist ones are removed).
    ``may_change``: names of :data:`STATE` the test changes in the inner run on purpose
    and restores itself; every other name is still checked."""
    unknown = sorted(set(may_change) - set(STATE))
    if unknown:
        raise ValueError(f"may_change must name entries of {STATE}, got {unknown}")
    before = _state()
    saved = [(m, n, dict(getattr(m, n))) for m, n in _CACHES] if cold else []
    modules = _Modules()
    try:
        with pytest.MonkeyPatch.context() as mp:
            for name in XDIST_ENV:
                mp.delenv(name, raising=False)
            if os.environ.get("PYTHONDONTWRITEBYTECODE"):  # the workers' bytecode: cached
                mp.delenv("PYTHONDONTWRITEBYTECODE")
                mp.setenv("PYTHONPYCACHEPREFIX", PYCACHE)
            for name, value in (env or {}).items():
                mp.setenv(name, value)
            for module, name, _ in saved:
                getattr(module, name).clear()
            if cold:
                settings.load_profile("default")
            with forked_workers.forking():
                result = pytester.runpytest_inprocess(
                    *args, plugins=[modules], no_reraise_ctrlc=True
                )
    finally:
        if cold:
            settings.load_profile(before["hypothesis profile"])
        for module, name, content in saved:
            cache = getattr(module, name)
            cache.clear()
            cache.update(content)
    after = _state()
    changed = [name for name in _changed(before, after) if name not in may_change]
    if changed:
        _restore(before)
    assert not changed, f"the in-process run changed the outer process's {changed}: " + "; ".join(
        _describe(before[name], after[name]) for name in changed
    )
    roots = [Path(pytester.path).resolve()]
    roots += [Path(a).resolve().parent for a in args if not a.startswith("-") and Path(a).exists()]
    first = sorted(name for name, file in modules.first.items() if not _inside(file, roots))
    assert not first, (
        f"the in-process run imported {first} first; pytester drops them afterwards and a "
        "later import makes a second copy: add them to _LAZY in tests/helpers/inline_run.py"
    )
    return result
