# ruff: noqa: E501  (inner-session sources spelled out on one line each)
"""The guards of tests/helpers/inline_run.py catch what an in-process pytester run could leak: each
case is an inner test that changes one thing of the outer process (or looks at what it
was given), and the run must fail naming it, or the inner test must pass."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest
import torch
from hypothesis import settings

from pytest_polgrad.core import engine
from pytest_polgrad.core import golden_format as snapshot
from pytest_polgrad.kinds.policy_loss import report
from tests.helpers import inline_run

pytest_plugins = ["pytester"]

PROBE = ("tests/helpers/test_inline_run.py", "probe")


def _inner(pytester: pytest.Pytester, body: str, **kwargs: Any) -> pytest.RunResult:
    pytester.makepyfile(test_inner="import os\nimport sys\n\n\ndef test_leak():\n" + body)
    result = inline_run.run(pytester, "-p", "no:cacheprovider", "-q", **kwargs)
    result.assert_outcomes(passed=1)
    return result


def test_a_clean_run_passes_and_sees_no_outer_xdist_variables(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw7")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "8")
    monkeypatch.setenv("PYTEST_ADDOPTS", "--polgrad-seed=99")
    _inner(
        pytester,
        "    assert 'PYTEST_XDIST_WORKER' not in os.environ\n"
        "    assert 'PYTEST_XDIST_WORKER_COUNT' not in os.environ\n"
        "    assert 'PYTEST_ADDOPTS' not in os.environ\n",
    )
    assert os.environ["PYTEST_XDIST_WORKER"] == "gw7"  # the outer variables are back


def test_env_is_what_the_inner_run_sees_and_only_there(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "8")
    _inner(
        pytester,
        "    assert os.environ['PYTEST_XDIST_WORKER_COUNT'] == '3'\n",
        env={"PYTEST_XDIST_WORKER_COUNT": "3"},
    )
    assert os.environ["PYTEST_XDIST_WORKER_COUNT"] == "8"


def test_under_no_bytecode_the_inner_run_caches_it_in_the_suites_directory(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``PYTHONDONTWRITEBYTECODE`` would make every inner worker rewrite the plugins'
    modules again (uncached); the inner run caches under :data:`inline_run.PYCACHE`
    instead, and the outer variables are back afterwards."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    _inner(
        pytester,
        "    assert 'PYTHONDONTWRITEBYTECODE' not in os.environ\n"
        f"    assert os.environ['PYTHONPYCACHEPREFIX'] == {inline_run.PYCACHE!r}\n",
    )
    assert os.environ["PYTHONDONTWRITEBYTECODE"] == "1"
    assert "PYTHONPYCACHEPREFIX" not in os.environ


def test_a_ctrl_c_ends_the_inner_session_only(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner="def test_stop():\n    raise KeyboardInterrupt\n")
    try:
        result = inline_run.run(pytester, "-p", "no:cacheprovider")
    except KeyboardInterrupt:
        pytest.fail("the inner session's KeyboardInterrupt reached the outer test")
    assert result.ret == pytest.ExitCode.INTERRUPTED


def test_a_changed_default_dtype_is_caught_and_put_back(pytester: pytest.Pytester) -> None:
    before = torch.get_default_dtype()
    try:
        with pytest.raises(AssertionError, match="torch default dtype"):
            _inner(pytester, "    import torch\n    torch.set_default_dtype(torch.float64)\n")
        assert torch.get_default_dtype() == before  # the run put it back before failing
    finally:
        torch.set_default_dtype(before)


def test_a_changed_thread_count_is_caught_and_put_back(pytester: pytest.Pytester) -> None:
    before = torch.get_num_threads()
    try:
        with pytest.raises(AssertionError, match="torch threads"):
            _inner(pytester, f"    import torch\n    torch.set_num_threads({before + 1})\n")
        assert torch.get_num_threads() == before
    finally:
        torch.set_num_threads(before)


def test_may_change_exempts_the_name_it_gives_and_no_other(pytester: pytest.Pytester) -> None:
    before = torch.get_num_threads()
    try:
        _inner(
            pytester,
            f"    import torch\n    torch.set_num_threads({before + 1})\n",
            may_change=("torch threads",),
        )
        assert torch.get_num_threads() == before + 1  # left to the test, as asked
        torch.set_num_threads(before)
        with pytest.raises(AssertionError, match="torch default dtype"):
            _inner(
                pytester,
                f"    import torch\n    torch.set_num_threads({before + 1})\n"
                "    torch.set_default_dtype(torch.float64)\n",
                may_change=("torch threads",),
            )
        with pytest.raises(ValueError, match=r"may_change must name entries of .*\['threads'\]"):
            inline_run.run(pytester, may_change=("threads",))
    finally:
        torch.set_num_threads(before)
        torch.set_default_dtype(torch.float32)


def test_a_changed_hypothesis_profile_is_caught_and_put_back(pytester: pytest.Pytester) -> None:
    outer = settings.get_current_profile_name()
    with pytest.raises(AssertionError, match="hypothesis profile"):
        _inner(
            pytester,
            "    from hypothesis import settings\n"
            "    settings.register_profile('inner_leak', max_examples=2)\n"
            "    settings.load_profile('inner_leak')\n",
        )
    assert settings.get_current_profile_name() == outer


def test_replaced_default_settings_are_caught(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = settings.get_current_profile_name()
    monkeypatch.setitem(settings._profiles, name, settings.get_profile(name))  # undone after
    try:
        with pytest.raises(AssertionError, match="hypothesis default settings"):
            _inner(
                pytester,
                "    from hypothesis import settings\n"
                f"    settings.register_profile({name!r}, max_examples=2)\n"
                f"    settings.load_profile({name!r})\n",
            )
    finally:
        monkeypatch.undo()
        settings.load_profile(name)


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("torch grad mode", "    import torch\n    torch.set_grad_enabled(False)\n"),
        (
            "engine._POOL_LIMIT",
            "    from pytest_polgrad.core import engine\n    engine._POOL_LIMIT = 1\n",
        ),
        (
            "snapshot.RETAIN",
            "    from pytest_polgrad.core import golden_format as snapshot\n    snapshot.RETAIN = object()\n",
        ),
        (
            "report._DIAGNOSES",
            f"    from pytest_polgrad.kinds.policy_loss import report\n    report._DIAGNOSES[{PROBE!r}] = ('', '')\n",
        ),
        (
            "report._BEST",
            f"    from pytest_polgrad.kinds.policy_loss import report\n    report._BEST[{PROBE!r}] = 1\n",
        ),
    ],
)
def test_other_outer_state_changed_is_caught(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, name: str, body: str
) -> None:
    monkeypatch.setattr(engine, "_POOL_LIMIT", engine._POOL_LIMIT)  # undone after the test
    monkeypatch.setattr(snapshot, "RETAIN", snapshot.RETAIN)
    monkeypatch.setitem(report._DIAGNOSES, PROBE, ("", ""))  # present before: same object after
    monkeypatch.setitem(report._BEST, PROBE, 0)
    with pytest.raises(AssertionError, match=rf"\['{name}'\]"):
        _inner(pytester, body)
    assert torch.is_grad_enabled()


def test_a_replaced_pool_entry_is_caught(pytester: pytest.Pytester) -> None:
    engine._POOLS[PROBE] = ((), ())
    try:
        with pytest.raises(AssertionError, match=r"engine\._POOLS"):
            _inner(
                pytester,
                f"    from pytest_polgrad.core import engine\n    engine._POOLS[{PROBE!r}] = ((), ())\n",
            )
    finally:
        engine._POOLS.pop(PROBE, None)


def test_a_write_error_left_behind_is_caught(pytester: pytest.Pytester) -> None:
    try:
        with pytest.raises(AssertionError, match=r"snapshot\._WRITE_ERRORS"):
            _inner(
                pytester,
                "    from pytest_polgrad.core import golden_format as snapshot\n"
                f"    snapshot._WRITE_ERRORS[{PROBE[1]!r}] = 'x'\n",
            )
    finally:
        snapshot._WRITE_ERRORS.pop(PROBE[1], None)


def _seen(cold: bool) -> str:
    """An inner conftest recording the plugin caches and Hypothesis profile it starts
    with, then adding a pool (and, cold, loading a profile of its own)."""
    load = "settings.register_profile('inner', max_examples=2)\nsettings.load_profile('inner')\n"
    return (
        "from hypothesis import settings\n"
        "from pytest_polgrad.core import engine, golden_format as snapshot\n"
        "from pytest_polgrad.kinds.policy_loss import report\n"
        "SEEN = {'pools': dict(engine._POOLS), 'diagnoses': dict(report._DIAGNOSES),\n"
        "        'best': dict(report._BEST), 'write errors': dict(snapshot._WRITE_ERRORS),\n"
        "        'profile': settings.get_current_profile_name()}\n"
        "engine._POOLS[('inner', 'pool')] = ((), ())\n" + (load if cold else "")
    )


@pytest.mark.parametrize("cold", [True, False], ids=["cold", "warm"])
def test_cold_empties_the_caches_and_loads_the_default_profile_then_restores_them(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, cold: bool
) -> None:
    """Cold: the inner session sees empty plugin caches and Hypothesis's default profile
    (even where the outer process has entries and a profile of its own); afterwards the
    outer process has its own profile and caches back and the project's modules are
    dropped. Warm: it sees the outer caches and profile, and what it adds stays."""
    key = ("outer", "sentinel")
    monkeypatch.setitem(engine._POOLS, key, ((), ()))
    monkeypatch.setitem(report._DIAGNOSES, key, ("", ""))
    monkeypatch.setitem(report._BEST, key, 0)
    if cold:  # warm, the inner session's start forgets it (a guarded change: see above)
        monkeypatch.setitem(snapshot._WRITE_ERRORS, "outer", "x")
    profile = settings.get_current_profile_name()
    assert profile != "default"
    caches = [dict(engine._POOLS), dict(report._DIAGNOSES), dict(report._BEST)]
    caches.append(dict(snapshot._WRITE_ERRORS))
    pytester.makeconftest(_seen(cold))
    if cold:
        expected = (
            "{'pools': {}, 'diagnoses': {}, 'best': {}, 'write errors': {}, 'profile': 'default'}"
        )
        check = f"    assert SEEN == {expected}\n"
    else:
        check = (
            f"    assert SEEN['pools'][{key!r}] == ((), ())\n"
            f"    assert SEEN['diagnoses'][{key!r}] == ('', '')\n"
            f"    assert SEEN['best'][{key!r}] == 0\n"
            f"    assert SEEN['profile'] == {profile!r}\n"
        )
    pytester.makepyfile(test_losses="from conftest import SEEN\n\n\ndef test_inside():\n" + check)
    # a whole-suite run has a `conftest` of its own (tests/frameworks/ is not a package)
    outer = {name: sys.modules.get(name) for name in ("test_losses", "conftest")}
    try:
        inline_run.run(pytester, "-p", "no:cacheprovider", cold=cold).assert_outcomes(passed=1)
        assert settings.get_current_profile_name() == profile
        assert (("inner", "pool") in engine._POOLS) is not cold  # cold: gone with the run
        engine._POOLS.pop(("inner", "pool"), None)
        after = [dict(engine._POOLS), dict(report._DIAGNOSES), dict(report._BEST)]
        assert [*after, dict(snapshot._WRITE_ERRORS)] == caches
        assert {name: sys.modules.get(name) for name in outer} == outer  # project's dropped
    finally:
        engine._POOLS.pop(("inner", "pool"), None)


def test_a_library_module_imported_first_is_caught(pytester: pytest.Pytester) -> None:
    name = "tabnanny"  # a standard-library module nothing here imports
    assert name not in sys.modules
    with pytest.raises(AssertionError, match=rf"imported \['{name}'\] first"):
        _inner(pytester, f"    import {name}\n")
    assert name not in sys.modules  # pytester dropped it, as the guard warns


def test_the_projects_own_modules_are_not_library_modules(
    pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A namespace package of the project (no ``__file__``) and a test file outside
    ``pytester.path`` given as an argument are the project's, dropped on purpose."""
    (pytester.path / "nspkg").mkdir()
    (pytester.path / "nspkg" / "part.py").write_text("X = 1\n")
    _inner(pytester, "    import nspkg.part\n    assert nspkg.part.X == 1\n")
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "test_elsewhere_only.py"
    elsewhere.write_text("def test_there():\n    pass\n")
    result = inline_run.run(pytester, "-p", "no:cacheprovider", "--rootdir", ".", str(elsewhere))
    result.assert_outcomes(passed=1)
