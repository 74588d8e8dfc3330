"""The golden format executes nothing (docs/snapshots.md, "Safety"): a value, a key or a
dtype written as Python code, a pickle or a YAML tag is a named format error, and the code
never runs (its side effect, creating a file, does not happen)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from pytest_polgrad.core.golden_format import SnapshotFormatError, parse


def _hostile(marker: Path) -> list[tuple[str, str]]:
    code = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    head = "format = 1\ncorpus = 1\n"
    return [
        ("code as a float value", f"{head}x: float64 []\nx = {code}\n"),
        ("code as an int value", f"{head}x: int64 [1]\nx[0] = {code}\n"),
        ("code as a str value", f"{head}x: str\nx = {code}\n"),
        ("code as a dtype", f"{head}x: {code} []\nx = 1\n"),
        ("code as a shape", f"{head}x: float64 [{code}]\nx = 1\n"),
        ("code as an index", f"{head}x: float64 [1]\nx[{code}] = 1\n"),
        ("a YAML object tag", f"{head}x: !!python/object/apply:os.system ['true']\n"),
        ("a pickle", pickle.dumps({"x": 1}).decode("latin-1")),
    ]


NAMES = [n for n, _ in _hostile(Path("m"))]
GOLDEN_CODE_BAD_INPUTS = len(NAMES)


@pytest.mark.parametrize("index", range(len(NAMES)), ids=NAMES)
def test_code_in_a_golden_is_a_format_error_and_never_runs(index: int, tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    _, text = _hostile(marker)[index]
    with pytest.raises(SnapshotFormatError):
        parse(text, source="hostile")
    assert not marker.exists()
