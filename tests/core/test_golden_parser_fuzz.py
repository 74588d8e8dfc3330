"""The golden parser is safe to run on any file a pull request may bring (issue 28 item 5):
over arbitrary bytes and over mutations of the goldens this repository records, reading a
snapshot raises nothing but :class:`SnapshotFormatError` (or marks a non-UTF-8 file
unreadable), allocates at most a small multiple of the file's size and takes a fraction of
a second of CPU time, whatever shape the file declares (one pass over its lines,
positions made one at a time).
"""

from __future__ import annotations

import contextlib
import time
import tracemalloc
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_polgrad.core.golden_format import SnapshotFormatError, parse

ROOT = Path(__file__).parents[2]
REAL = sorted((ROOT / "snapshots").rglob("*.polgrad"))[:8]
FACTOR, SLACK = 40, 256 * 1024
"""Allowed peak: 40 bytes per byte of the file (a Python str per value token) + 256 KiB."""
SECONDS = 0.5
"""Allowed CPU time to read one file (at most ~10 KB here; a read takes milliseconds)."""


def _read(raw: bytes) -> None:
    """What reading a golden does: UTF-8 or refused as not UTF-8, then parse."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return  # reported as "not UTF-8 text", never parsed
    with contextlib.suppress(SnapshotFormatError):
        parse(text, source="fuzzed")


def _bounded(raw: bytes) -> None:
    start = time.process_time()  # CPU time: a loaded machine does not inflate it
    _read(raw)
    spent = time.process_time() - start
    assert spent < SECONDS, (spent, len(raw))
    tracemalloc.start()
    try:
        _read(raw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= FACTOR * len(raw) + SLACK, (peak, len(raw))


HEADER = b"format = 1\ncorpus = 1\n"
_LINE = st.one_of(
    st.binary(max_size=40),
    st.from_regex(rb"[a-z/]{1,8}: (float64|int|bool|str|none|float32) \[[0-9, ]{0,30}\]"),
    st.from_regex(rb"[a-z/]{1,8}(\[[0-9,]{0,9}\])? = [-+0-9.einfa\"]{0,12}"),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2000))
def test_arbitrary_bytes(raw: bytes) -> None:
    _bounded(raw)
    _bounded(HEADER + raw)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_LINE, max_size=30))
def test_lines_that_look_like_a_golden(lines: list[bytes]) -> None:
    _bounded(HEADER + b"\n".join(lines))


def test_the_real_goldens_parse() -> None:
    assert REAL
    for path in REAL:
        parse(path.read_text(encoding="utf-8"), source=str(path))


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    lines = draw(st.sampled_from(REAL)).read_bytes().splitlines()
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(lines) - 1))
        how = draw(st.sampled_from(["drop", "copy", "bytes", "shape", "flip", "swap"]))
        if how == "drop":
            del lines[i]
        elif how == "copy":
            lines.insert(i, lines[i])
        elif how == "bytes":
            lines[i] = draw(st.binary(max_size=30))
        elif how == "shape":  # a declaration claiming an enormous tensor
            declarations = [k for k, line in enumerate(lines) if b": " in line and b"[" in line]
            i = draw(st.sampled_from(declarations or [i]))
            big = draw(st.sampled_from([b"30000000, 30000000", b"300000000, 300000000", b"9" * 30]))
            lines[i] = lines[i].split(b"[")[0] + b"[" + big + b"]"
        elif how == "flip" and lines[i]:
            j = draw(st.integers(0, len(lines[i]) - 1))
            lines[i] = (
                lines[i][:j] + bytes([lines[i][j] ^ draw(st.integers(1, 255))]) + lines[i][j + 1 :]
            )
        elif how == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        if not lines:
            break
    return b"\n".join(lines)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated())
def test_mutated_real_goldens(raw: bytes) -> None:
    _bounded(raw)


def test_an_enormous_declared_shape_is_a_format_error_without_its_memory() -> None:
    """Five lines declaring 9e16 values: it was 2.3 GB (3e7 x 3e7) or an out-of-memory kill."""
    raw = b"format = 1\nx: float64 [300000000, 300000000]\nx[0,0] = 1\n"
    start = time.process_time()
    tracemalloc.start()
    try:
        try:
            parse(raw.decode(), source="big")
        except SnapshotFormatError as exc:
            assert "file ends after 1 of 90000000000000000 values" in str(exc)
        else:
            raise AssertionError("parsed")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < SLACK
    assert time.process_time() - start < SECONDS
