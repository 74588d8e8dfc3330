"""In-process ``pytester`` runs for the plugin's end-to-end tests (conformance items,
golden snapshots, the snapshot guard), with cold plugin state, as a fresh process has it.

A subprocess run pays the interpreter, pytest, ``import torch`` and collection again (about
3 s here); a run inside the already-warm test process pays almost none of it. The inner
session shares the process, so :func:`run_isolated` isolates it both ways:

- into the inner run: no ``PYTEST_XDIST_WORKER``/``PYTEST_XDIST_WORKER_COUNT``/
  ``PYTEST_ADDOPTS`` of the outer xdist run, Hypothesis's own default profile (not the
  suite's ``polgrad-dev``), and empty plugin caches (the engine's pools, the report's
  diagnoses, the snapshot write errors): two runs with one seed are then independent;
- out of it: the outer process's Hypothesis profile and plugin caches are restored,
  pytester drops the test project's modules (two tests' projects can both be called
  ``test_losses``), and the inner run must leave torch's default dtype and thread count
  alone (an assertion).

``sys.modules``: pytester drops every module a test imported first, at the end of the
run and again at the end of the test; a library module dropped that way is imported a
second time later (two ``_POOLS``, two exception classes, torch registering its ops
twice). :data:`PRELOAD` imports them up front, and :func:`run_isolated` fails, naming
the module, when an inner run still imports a non-stdlib library module first.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import torch

from pytest_polgrad import engine, report, snapshot

__all__ = ["PRELOAD", "XDIST_ENV", "run_isolated"]

_KIT = ("pytest_polgrad", "polgrad_reference", "strategies")
_NOT_KIT = ("pytest_polgrad.frameworks", "pytest_polgrad.__main__")  # a framework; the CLI
_LAZY = (
    # third-party modules imported on first use inside a session: by torch (symbolic
    # shapes pull in sympy), numpy, and xdist's controller under -n 2
    "numpy.random",
    "torch._subclasses.schema_check_mode",
    "torch.fx.experimental.symbolic_shapes",
    "torch.utils._sympy.interp",
    "torch.utils._sympy.printers",
    "torch.utils._sympy.solve",
    "torch.utils._sympy.value_ranges",
    "execnet",
    "syrupy",
    "xdist.dsession",
    "xdist.newhooks",
    "xdist.remote",
    "xdist.report",
    "xdist.scheduler",
    "xdist.workermanage",
)


def _preload() -> tuple[str, ...]:
    names = list(_LAZY)
    for package in _KIT:
        try:
            root = importlib.import_module(package)
        except ImportError:
            continue
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

XDIST_ENV = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_ADDOPTS")
"""Set in an outer xdist worker; an inner run must not see them."""

_CACHES = (
    (engine, "_POOLS"),
    (report, "_DIAGNOSES"),
    (report, "_BEST"),
    (snapshot, "_WRITE_ERRORS"),
)
"""Module-level caches of the plugin, empty in a fresh process."""


class _LastModules:
    """``sys.modules`` as the inner session ends (before pytester restores it)."""

    def __init__(self) -> None:
        self.modules: dict[str, Any] = {}

    def pytest_unconfigure(self) -> None:
        self.modules = dict(sys.modules)


def _inside(module: Any, root: Path) -> bool:
    file = getattr(module, "__file__", None)
    try:
        return file is not None and Path(file).resolve().is_relative_to(root)
    except (OSError, ValueError):
        return False


def run_isolated(pytester: pytest.Pytester, *args: str, cold: bool = True) -> pytest.RunResult:
    """``pytester.runpytest_inprocess(*args)``, isolated as the module docstring says.

    ``cold=False`` leaves the plugin caches alone (neither emptied nor restored), as
    consecutive in-process sessions of a user's pytester test find them. A
    ``KeyboardInterrupt`` inside the inner session ends it with exit code 2, as in a
    subprocess; it is not raised again in the outer test."""
    profile = hypothesis.settings.get_current_profile_name()
    saved = [(m, n, dict(getattr(m, n))) for m, n in _CACHES if cold and hasattr(m, n)]
    dtype, threads = torch.get_default_dtype(), torch.get_num_threads()
    last = _LastModules()
    roots = [pytester.path.resolve()]
    roots += [Path(a).resolve().parent for a in args if not a.startswith("-") and Path(a).exists()]
    outer = set(sys.modules)
    try:
        with pytest.MonkeyPatch.context() as mp:
            for name in XDIST_ENV:
                mp.delenv(name, raising=False)
            for module, name, _ in saved:
                getattr(module, name).clear()
            hypothesis.settings.load_profile("default")
            result = pytester.runpytest_inprocess(*args, plugins=[last], no_reraise_ctrlc=True)
    finally:
        hypothesis.settings.load_profile(profile)
        for module, name, content in saved:
            cache = getattr(module, name)
            cache.clear()
            cache.update(content)
    first = sorted(
        name
        for name, module in last.modules.items()
        if name not in outer
        and name.partition(".")[0] not in sys.stdlib_module_names  # harmless twice
        and not any(_inside(module, root) for root in roots)
    )
    changed = [
        f"{what} {before} -> {after}"
        for what, before, after in (
            ("torch default dtype", dtype, torch.get_default_dtype()),
            ("torch threads", threads, torch.get_num_threads()),
        )
        if before != after
    ]
    if changed:
        torch.set_default_dtype(dtype)
        torch.set_num_threads(threads)
    assert not changed, f"the inner pytest run changed the outer process: {changed}"
    assert not first, (
        f"the inner pytest run imported {first} first; pytester drops them and a later "
        "import makes a second copy: add them to _LAZY in tests/isolated_run.py"
    )
    return result
