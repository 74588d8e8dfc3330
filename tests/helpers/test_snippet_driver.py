"""The suite's snippet interpreter (``tests/helpers/snippet_driver.py``) keeps one snippet from
helping the next, runs a script as ``python SCRIPT`` would, serves every call of a test
process from one interpreter, and survives a snippet that kills it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers.snippet_driver import run_scripts, run_snippets

PID = "import os\nprint(os.getpid())\n"


def _dir(root: Path, name: str, module: str, value: str) -> Path:
    where = root / name
    (where / "tests").mkdir(parents=True)
    (where / "tests" / f"{module}.py").write_text(f"VALUE = {value!r}\n")
    return where


def test_what_one_snippet_imported_or_put_on_sys_path_does_not_help_the_next(
    tmp_path: Path,
) -> None:
    a = _dir(tmp_path, "a", "helper", "a")
    put = f"import sys\nsys.path.insert(0, {str(a / 'tests')!r})\n"
    first = put + "import helper\nprint(helper.VALUE)\n"
    second = "import helper\nprint(helper.VALUE)\n"  # neither on sys.path nor imported now
    out = run_snippets([("first", first, str(a)), ("second", second, str(a))], tmp_path)
    assert out["first"] == "a\n"
    assert out["second"].startswith("FAILED") and "ModuleNotFoundError" in out["second"]


def test_a_relative_entry_names_the_directory_each_snippet_runs_from(tmp_path: Path) -> None:
    """``sys.path[:0] = ['tests']`` from two projects: each imports its own module (the
    import system's finder for ``'tests'`` is not the previous directory's)."""
    a = _dir(tmp_path, "a", "kinds", "a")
    b = _dir(tmp_path, "b", "kinds", "b")
    code = "import sys\nsys.path[:0] = ['tests', '.']\nimport kinds\nprint(kinds.VALUE)\n"
    out = run_snippets([("a", code, str(a)), ("b", code, str(b))], tmp_path)
    assert (out["a"], out["b"]) == ("a\n", "b\n")
    out = run_snippets([("b again", code, str(b))], tmp_path)  # and in a later call
    assert out["b again"] == "b\n"


def test_a_script_runs_in_place_with_its_directory_and_pythonpath_first(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "mylib.py").write_text("NAME = 'mylib'\n")
    script = tmp_path / "scripts" / "check.py"
    script.write_text(
        "import os, sys\nimport mylib\n"
        "print(__name__, __file__, os.getcwd(), sys.path[0], sys.path[1], mylib.NAME)\n"
    )
    run_from = tmp_path / "lib"
    out = run_scripts([("check", script, run_from, (tmp_path / "lib",))])["check"]
    assert out.split() == [
        "__main__",
        str(script),
        str(run_from),
        str(script.parent),
        str(tmp_path / "lib"),
        "mylib",
    ]
    (without,) = run_scripts([("check", script, run_from, ())]).values()
    assert without.startswith("FAILED") and "No module named 'mylib'" in without
    exits = {"0": "sys.exit(0)", "None": "sys.exit()", "2": "sys.exit(2)", "text": "exit('no')"}
    exited = run_snippets(
        [(k, f"import sys\nprint('before')\n{v}\n", str(tmp_path)) for k, v in exits.items()],
        tmp_path,
    )
    assert exited["0"] == exited["None"] == "before\n"  # `python FILE` exits with status 0
    assert exited["2"].startswith("FAILED") and exited["text"].startswith("FAILED")


def test_one_interpreter_serves_every_call_and_a_dead_one_is_replaced(tmp_path: Path) -> None:
    first = run_snippets([("pid", PID, str(tmp_path))], tmp_path)["pid"]
    assert run_snippets([("pid", PID, str(tmp_path))], tmp_path)["pid"] == first
    assert int(first) != os.getpid()
    stray = "import os\nos.write(1, b'not an answer\\n')\nprint('kept')\n"
    assert run_snippets([("stray", stray, str(tmp_path))], tmp_path) == {"stray": "kept\n"}
    with pytest.raises(AssertionError, match="the snippet interpreter died"):
        run_snippets([("exit", "import os\nos._exit(3)\n", str(tmp_path))], tmp_path)
    again = run_snippets([("pid", PID, str(tmp_path))], tmp_path)["pid"]
    assert again != first


def test_the_kit_stays_imported_unless_a_fresh_kit_is_asked_for(tmp_path: Path) -> None:
    """The kit's packages are an install (kept, as site-packages are); ``fresh_kit=True``
    and every script import them afresh."""
    mark = "import polgrad_reference\npolgrad_reference.marked_by_a_snippet = True\n"
    look = "import polgrad_reference\nprint(hasattr(polgrad_reference, 'marked_by_a_snippet'))\n"
    (tmp_path / "look.py").write_text(look)
    cwd = str(tmp_path)
    assert run_snippets([("mark", mark, cwd), ("look", look, cwd)], tmp_path)["look"] == "True\n"
    fresh = run_snippets([("look", look, cwd)], tmp_path, fresh_kit=True)
    assert fresh == {"look": "False\n"}
    run_snippets([("mark", mark, cwd)], tmp_path)
    script = run_scripts([("look", tmp_path / "look.py", tmp_path, ())])
    assert script == {"look": "False\n"}
