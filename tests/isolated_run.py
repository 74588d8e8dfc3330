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

Library modules the inner run imported first (torch submodules, the kit's kinds) stay
loaded: pytester would drop them, and importing them again later makes a second copy
(torch registering its ops twice). The heavy ones are imported here, at collection,
before any ``Pytester`` takes its own snapshot of ``sys.modules``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import execnet  # noqa: F401  (xdist's transport: an inner -n 2 controller imports it)
import hypothesis
import pytest
import syrupy  # noqa: F401
import torch
import xdist  # type: ignore[import-untyped]  # noqa: F401

import pytest_polgrad.golden  # noqa: F401
from pytest_polgrad import engine, report, snapshot
from pytest_polgrad.engine import kind_of
from pytest_polgrad.options import ConformanceOptions

kind_of(ConformanceOptions(reference="dapo"))  # imports the policy-loss kind and its checks

__all__ = ["XDIST_ENV", "run_isolated"]

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
    root = pytester.path.resolve()
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
        for name, module in last.modules.items():
            if name not in sys.modules and not _inside(module, root):
                sys.modules[name] = module  # a library the inner run imported: keep it
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
    return result
