"""The guards of tests/inline_run.py catch what an in-process pytester run could leak: each
case is an inner test that changes one thing of the outer process, and the run must fail
naming it (the marker tests rely on these guards to run their projects in-process)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from pytest_polgrad import engine, snapshot
from tests import inline_run

pytest_plugins = ["pytester"]

PROBE = ("tests/test_inline_run.py", "probe")


def _inner(pytester: pytest.Pytester, body: str) -> None:
    pytester.makepyfile(test_inner="import os\nimport sys\n\n\ndef test_leak():\n" + body)
    inline_run.run(pytester, "-p", "no:cacheprovider", "-q").assert_outcomes(passed=1)


def test_a_clean_run_passes_and_sees_no_outer_xdist_variables(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw7")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "8")
    _inner(
        pytester,
        "    assert 'PYTEST_XDIST_WORKER' not in os.environ\n"
        "    assert 'PYTEST_XDIST_WORKER_COUNT' not in os.environ\n",
    )
    assert os.environ["PYTEST_XDIST_WORKER"] == "gw7"  # the outer variables are back


def test_a_changed_default_dtype_is_caught(pytester: pytest.Pytester) -> None:
    before = torch.get_default_dtype()
    try:
        with pytest.raises(AssertionError, match="torch default dtype"):
            _inner(pytester, "    import torch\n    torch.set_default_dtype(torch.float64)\n")
    finally:
        torch.set_default_dtype(before)


def test_a_changed_thread_count_is_caught(pytester: pytest.Pytester) -> None:
    before = torch.get_num_threads()
    try:
        with pytest.raises(AssertionError, match="torch threads"):
            _inner(pytester, f"    import torch\n    torch.set_num_threads({before + 1})\n")
    finally:
        torch.set_num_threads(before)


def test_a_replaced_pool_entry_is_caught(pytester: pytest.Pytester) -> None:
    engine._POOLS[PROBE] = ((), ())
    try:
        with pytest.raises(AssertionError, match=r"engine\._POOLS"):
            _inner(
                pytester,
                f"    from pytest_polgrad import engine\n    engine._POOLS[{PROBE!r}] = ((), ())\n",
            )
    finally:
        engine._POOLS.pop(PROBE, None)


def test_a_write_error_left_behind_is_caught(pytester: pytest.Pytester) -> None:
    try:
        with pytest.raises(AssertionError, match=r"snapshot\._WRITE_ERRORS"):
            _inner(
                pytester,
                "    from pytest_polgrad import snapshot\n"
                f"    snapshot._WRITE_ERRORS[{PROBE[1]!r}] = 'x'\n",
            )
    finally:
        snapshot._WRITE_ERRORS.pop(PROBE[1], None)


def test_a_library_module_imported_first_is_caught(pytester: pytest.Pytester) -> None:
    name = "tabnanny"  # a standard-library module nothing here imports
    assert name not in sys.modules
    with pytest.raises(AssertionError, match=rf"imported \['{name}'\] first"):
        _inner(pytester, f"    import {name}\n")
    assert name not in sys.modules  # pytester dropped it, as the guard warns
