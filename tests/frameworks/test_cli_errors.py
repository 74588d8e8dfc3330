"""Issue 28: ``python -m pytest_polgrad.frameworks`` with a bad argument, a framework not
installed, a directory it cannot read or write, or a failing pip (``drift`` offline) prints
one line naming the problem and exits 2, never a Python traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_polgrad.frameworks import __main__ as cli
from pytest_polgrad.frameworks._pins import PINS


def _fake_venv(root: Path) -> Path:
    """A --venv whose python fails every command, as pip does offline."""
    python = root / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\nexit 1\n")
    python.chmod(0o755)
    return root / "venv"


def _not_installed() -> str:
    import importlib.util

    missing = [fw for fw in PINS if importlib.util.find_spec(fw) is None]
    if not missing:
        pytest.skip("every framework is installed")
    return missing[0]


# (name, argv with {d} the test's directory, words of the one line)
CLI_CASES: list[tuple[str, list[str], str]] = [
    ("record a framework not installed", ["record", "{missing}"], "is not installed"),
    ("record --out under /proc", ["record", "--out", "/proc/x/y", "verl"], "--out /proc/x/y"),
    ("record --out a file", ["record", "--out", "{d}/file", "verl"], "--out {d}/file"),
    ("record unknown framework", ["record", "vrl"], "unknown framework(s) ['vrl']"),
    ("compare --against missing", ["compare", "--against", "{d}/missing"], "--against"),
    ("compare --against a file", ["compare", "--against", "{d}/file"], "--against"),
    ("compare --against empty dir", ["compare", "--against", "{d}/empty"], "verl.json"),
    ("drift offline", ["drift", "--venv", "{venv}"], "returned non-zero exit status"),
    ("drift --venv a file", ["drift", "--venv", "{d}/file"], "--venv"),
    ("unknown command", ["replay"], "invalid choice: 'replay'"),
    ("no command", [], "the following arguments are required"),
]


@pytest.mark.parametrize(("argv", "words"), [pytest.param(a, w, id=n) for n, a, w in CLI_CASES])
def test_a_bad_frameworks_command_is_one_line_and_exit_2(
    argv: list[str], words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    fill = {"d": str(tmp_path), "missing": "", "venv": ""}
    if any("{missing}" in a for a in argv):
        fill["missing"] = _not_installed()
    if any("{venv}" in a for a in argv):
        fill["venv"] = str(_fake_venv(tmp_path))
    with pytest.raises(SystemExit) as info:
        cli.main([a.format(**fill) for a in argv])
    assert info.value.code == 2
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if not line.startswith("usage:")]
    assert len(lines) == 1, err
    assert words.format(**fill) in lines[0]
    assert "Traceback" not in err + out
    assert os.listdir(tmp_path / "empty") == []


FRAMEWORKS_CLI_BAD_INPUTS = len(CLI_CASES)
