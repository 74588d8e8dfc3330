"""The polgrad snapshot format and comparator (docs/snapshots.md), without pytest runs:
layout, special values, tolerance (noise passes, semantic change fails), update merging,
and clear errors for corrupted or hand-edited files."""

from __future__ import annotations

import dataclasses
import math
import types
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from syrupy.data import Snapshot, SnapshotCollection

from pytest_polgrad.core.golden_format import (
    FORMAT,
    EntryScale,
    PolgradSnapshotExtension,
    SnapshotFormatError,
    Tolerant,
    compare,
    explain,
    flatten,
    merged_text,
    parse,
    render,
)
from pytest_polgrad.core.tolerance import Tolerance

SPECIAL = [float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 5e-324, 1e300, -1.5]


def text(data: object, corpus: int | None = None) -> str:
    return render(flatten(data, corpus=corpus))


def outcome(stored: object, received: object, policy: Tolerant | None = None) -> object:
    return compare(parse(text(stored)), parse(text(received)), policy)


def test_layout_one_named_value_per_line() -> None:
    data = {"ragged": {"loss": torch.tensor(0.25, dtype=torch.float64), "grad": torch.eye(2)}}
    assert text(data, corpus=3).splitlines()[1:] == [
        f"format = {FORMAT}",
        "corpus = 3",
        "ragged/loss: float64 []",
        "ragged/loss = 0.25",
        "ragged/grad: float32 [2, 2]",
        "ragged/grad[0,0] = 1",
        "ragged/grad[0,1] = 0",
        "ragged/grad[1,0] = 0",
        "ragged/grad[1,1] = 1",
    ]


def test_fixed_significant_digits_per_dtype() -> None:
    third = 1.0 / 3.0
    lines = text({"d": third, "f": torch.tensor(third), "b": torch.tensor(third).bfloat16()})
    assert "d = 0.333333333333" in lines  # 12 digits for float64 / Python floats
    assert "f = 0.33333334" in lines  # 8 for float32
    assert "b = 0.334" in lines  # 3 for bfloat16


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_special_values_round_trip(dtype: torch.dtype) -> None:
    values = torch.tensor(SPECIAL, dtype=torch.float64).to(dtype)
    data = {
        "x": values,
        "empty": torch.zeros(0, 3, dtype=dtype),
        "empty2": torch.zeros(2, 0, dtype=torch.int64),
        "ints": torch.tensor([-(2**63), 0, 2**63 - 1]),
        "small": torch.tensor([-128, 127], dtype=torch.int8),
        "bytes": torch.tensor([0, 255], dtype=torch.uint8),
        "mask": torch.tensor([[True, False]]),
        "py": [1.5, -0.0, float("nan"), 7, True, 'a "quoted" str', None],
    }
    written = text(data)
    assert parse(written) == flatten(data)
    assert compare(parse(written), parse(written)).ok
    assert "x[3] = -0" in written
    assert "x[0] = nan" in written and "x[2] = -inf" in written
    assert "empty: " in written and "empty[" not in written


def test_nested_containers_and_dataclasses() -> None:
    @dataclasses.dataclass
    class Result:
        loss: torch.Tensor
        extra: dict[str, object]

    doc = flatten([Result(torch.tensor(1.0), {"k": (1, 2)})])
    assert list(doc.entries) == ["0/loss", "0/extra/k/0", "0/extra/k/1"]
    assert list(flatten(torch.ones(1)).entries) == ["value"]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (torch.ones(2, dtype=torch.complex64), "complex64"),
        (torch.ones(2).to_sparse(), "sparse"),
        (object(), "type object"),
        ({"bad key": 1}, "keys are"),
        ({1.5: 1}, "keys are"),
    ],
)
def test_unsupported_values_are_refused(value: object, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        flatten(value)


def test_two_values_with_one_key_are_refused() -> None:
    with pytest.raises(ValueError, match="same snapshot key '0'"):
        flatten({0: 1, "0": 2})


# ------------------------------------------------------------------------ tolerance


U64 = 2.0**-53
U32 = 2.0**-24


@pytest.mark.parametrize(
    ("dtype", "noise", "change"),
    [(torch.float64, 8 * U64, 1e-9), (torch.float32, 2 * U32, 1e-3)],
)
def test_noise_passes_and_semantic_change_fails(
    dtype: torch.dtype, noise: float, change: float
) -> None:
    """The default scale of a value is its own size plus the entry's largest (40 here):
    ``change`` is ~1e4 (float64) and ~10 (float32) times the tolerance."""
    base = torch.tensor([0.123456789, -2.5, 1e-3, 0.0, 40.0], dtype=torch.float64).to(dtype)
    assert outcome(base, base * (1 + noise)).ok  # type: ignore[attr-defined]
    moved = base.clone()
    moved[2] += change
    result = outcome(base, moved)
    assert not result.ok  # type: ignore[attr-defined]
    assert [d.position for d in result.differences] == [(2,)]  # type: ignore[attr-defined]


@given(
    st.lists(
        st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_subnormal=False),
        min_size=1,
        max_size=8,
    ),
    st.lists(st.integers(-8, 8), min_size=8, max_size=8),
)
def test_written_rounding_and_float64_noise_never_fail(
    values: list[float], ulps: list[int]
) -> None:
    """Stored and received are both rounded to 12 digits; noise of a few ulps on top of that
    must pass, whatever the values (the rounding allowance is per side)."""
    exact = torch.tensor(values, dtype=torch.float64)
    noisy = exact * (1 + torch.tensor(ulps[: len(values)], dtype=torch.float64) * U64)
    assert outcome(exact, noisy).ok  # type: ignore[attr-defined]


def test_non_finite_values_must_agree_exactly() -> None:
    base = torch.tensor([float("nan"), float("inf"), 1.0, -0.0])
    assert outcome(base, torch.tensor([float("nan"), float("inf"), 1.0, 0.0])).ok  # type: ignore[attr-defined]
    for i, value in [(0, 1.0), (1, -float("inf")), (2, float("nan")), (2, float("inf"))]:
        moved = base.clone()
        moved[i] = value
        (diff,) = outcome(base, moved).differences  # type: ignore[attr-defined]
        assert diff.position == (i,) and math.isinf(diff.ratio)


def test_integers_bools_and_strings_compare_exactly() -> None:
    assert not outcome({"n": torch.tensor([1, 2])}, {"n": torch.tensor([1, 3])}).ok  # type: ignore[attr-defined]
    assert not outcome({"m": torch.tensor([True])}, {"m": torch.tensor([False])}).ok  # type: ignore[attr-defined]
    assert not outcome({"s": "a"}, {"s": "b"}).ok  # type: ignore[attr-defined]
    assert outcome({"n": 5, "s": "a", "z": None}, {"n": 5, "s": "a", "z": None}).ok  # type: ignore[attr-defined]


def test_structural_changes_are_named() -> None:
    result = outcome(
        {"a": torch.zeros(2), "b": torch.zeros(2), "c": 1.0},
        {"a": torch.zeros(3), "b": torch.zeros(2, dtype=torch.float64), "d": 1.0},
    )
    described = [d.describe() for d in result.differences]  # type: ignore[attr-defined]
    assert described == [
        "a: stored float32 [2], received float32 [3]",
        "b: stored float32 [2], received float64 [2]",
        "d: stored (absent), received float []",
        "c: stored float [], received (absent)",
    ]


def test_corpus_version_mismatch_is_reported_as_such() -> None:
    old = parse(text({"x": 1.0}, corpus=1))
    result = compare(old, parse(text({"x": 1.0}, corpus=2)))
    assert not result.ok and not result.differences
    assert "corpus version 1" in str(result.problem) and "version 2" in str(result.problem)


def test_entry_scales_follow_the_engine_rules() -> None:
    tol = Tolerance(torch.float64, strict=True)
    stored = {"loss": torch.tensor(1e-6, dtype=torch.float64), "g": torch.zeros(3).double()}
    received = {"loss": torch.tensor(1e-6 + 1e-15, dtype=torch.float64), "g": stored["g"]}
    # By its own magnitude the loss moved 1e-9 relative: too much for float64 ...
    assert not outcome(stored, received, Tolerant(received, tolerance=tol)).ok  # type: ignore[attr-defined]
    # ... but the loss is a sum whose terms are of size 1 (value_scale), so it is noise.
    scaled = Tolerant(received, tolerance=tol, scales={"loss": EntryScale(1.0, count=10)})
    assert outcome(stored, received, scaled).ok  # type: ignore[attr-defined]
    # A non-strict float64 tolerance accepts float32 arithmetic, as the engine does.
    loose = Tolerant(received, tolerance=Tolerance(torch.float64))
    assert outcome(stored, received, loose).ok  # type: ignore[attr-defined]


def test_skipped_positions_need_only_agree_on_finiteness() -> None:
    stored = {"g": torch.tensor([1.0, 2.0, 3.0])}
    received = {"g": torch.tensor([1.0, -7.0, 3.0])}
    skip = EntryScale(torch.ones(3), skip=torch.tensor([False, True, False]))
    assert outcome(stored, received, Tolerant(received, scales={"g": skip})).ok  # type: ignore[attr-defined]
    nan = {"g": torch.tensor([1.0, float("nan"), 3.0])}
    assert not outcome(stored, nan, Tolerant(nan, scales={"g": skip})).ok  # type: ignore[attr-defined]


# --------------------------------------------------------------- merge and failure text


LOOSE = Tolerance(torch.float64)  # the engine's default: float32 arithmetic accepted


def test_update_rewrites_only_the_lines_that_really_changed() -> None:
    base = torch.linspace(-1, 1, 50, dtype=torch.float64) / 3
    noisy = base * (1 + 3e-11)  # changes the 11th/12th written digit of most values
    noisy[17] = 0.5
    old = text({"v": base})
    new = PolgradSnapshotExtension().serialize(Tolerant({"v": noisy}, tolerance=LOOSE))
    assert sum(a != b for a, b in zip(old.splitlines(), new.splitlines(), strict=False)) > 10
    merged = merged_text(old, new)
    changed = [
        (a, b) for a, b in zip(old.splitlines(), merged.splitlines(), strict=False) if a != b
    ]
    assert changed == [(f"v[17] = {base[17].item():.12g}", "v[17] = 0.5")]
    assert merged_text("not a snapshot", new) == new


def test_failure_text_names_entries_positions_and_file() -> None:
    stored = type("Stored", (str,), {"location": "/x/__snapshots__/t/fn.polgrad"})
    old = stored(text({"b": {"grad": torch.tensor([[1.0, 2.0], [3.0, 4.0]])}}))
    lines = list(explain(text({"b": {"grad": torch.tensor([[1.0, 2.0], [3.0, 4.5]])}}), old))
    assert lines[0] == "1 value(s) in 1 entry(ies) differ beyond tolerance:"
    assert lines[1].startswith("  b/grad[1,1]: stored 4, received 4.5 (")
    assert "/x/__snapshots__/t/fn.polgrad" in lines[2]
    assert lines[-3:-1] == ["-b/grad[1,1] = 4", "+b/grad[1,1] = 4.5"]
    assert "--snapshot-update" in lines[-1]


# ------------------------------------------------------------------ corrupted files


GOOD = text({"b": {"loss": 0.5, "grad": torch.tensor([1.0, 2.0])}}, corpus=1)


@pytest.mark.parametrize(
    ("edit", "line", "entry", "message"),
    [
        (lambda s: s.replace("b/grad[1] = 2", "b/grad[1] = two"), 8, "b/grad", "not a float32"),
        (lambda s: s.replace("b/grad[1] = 2", "b/grad[0] = 2"), 8, "b/grad", "expected the line"),
        (lambda s: s.replace("b/grad[1] = 2\n", ""), 8, "b/grad", "ends after 1 of 2"),
        (lambda s: s.replace("float32", "float128"), 6, "b/grad", "unknown dtype"),
        (lambda s: s.replace("b/loss: float []", "b/loss float"), 4, None, "declaration"),
        (lambda s: s.replace("format = 1", "format = 99"), 2, None, "newer pytest-polgrad"),
        (lambda s: s.replace("format = 1\n", ""), 3, None, "no 'format = N'"),
        (lambda s: "", 1, None, "empty"),
        (lambda s: "\x80\x04\x95 pickle?\n", 1, None, "not a pytest-polgrad snapshot"),
        (lambda s: s + "b/loss: float []\nb/loss = 1\n", 9, "b/loss", "declared twice"),
    ],
)
def test_corrupted_snapshot_errors_name_file_line_and_entry(
    edit: object, line: int, entry: str | None, message: str
) -> None:
    with pytest.raises(SnapshotFormatError) as info:
        parse(edit(GOOD), source="snaps/fn.polgrad")  # type: ignore[operator]
    error = info.value
    assert str(error).startswith(f"snaps/fn.polgrad, line {line}")
    assert error.entry == entry and message in str(error)


def test_string_values_are_data_never_code() -> None:
    doc = parse(text({"s": "__import__('os').system('false')"}))
    assert doc.entries["s"].values == ("\"__import__('os').system('false')\"",)
    with pytest.raises(SnapshotFormatError, match="not a str value"):
        parse(GOOD.replace("b/loss: float []\nb/loss = 0.5", "b/loss: str []\nb/loss = os"))


# ------------------------------------------------------------------------- extension


def test_extension_writes_atomically_and_merges(tmp_path: Path) -> None:
    ext = PolgradSnapshotExtension()
    path = tmp_path / "fn.polgrad"
    base = torch.linspace(0, 1, 9, dtype=torch.float64) / 7

    def write(data: object) -> None:
        collection = SnapshotCollection(location=str(path))
        collection.add(Snapshot(name="fn", data=ext.serialize(data)))
        PolgradSnapshotExtension.write_snapshot_collection(snapshot_collection=collection)

    write(base)
    first = path.read_text()
    write(Tolerant(base * (1 + 3e-11), tolerance=LOOSE))  # noise only: no line changes
    assert path.read_text() == first
    assert [p.name for p in tmp_path.iterdir()] == ["fn.polgrad"]  # no temporary left
    stored = ext.read_snapshot_data_from_location(
        snapshot_location=str(path), snapshot_name="fn", session_id="s"
    )
    assert stored.location == str(path)
    noisy = ext.serialize(Tolerant(base * (1 + 3e-11), tolerance=LOOSE))
    assert noisy != stored and ext.matches(serialized_data=noisy, snapshot_data=stored)
    assert not ext.matches(serialized_data=ext.serialize(base + 1e-3), snapshot_data=stored)
    corrupted = type(stored)("format = 1\nv: float64 [9]\nv[0] = 0\n")
    corrupted.location = str(path)
    assert not ext.matches(serialized_data=ext.serialize(base), snapshot_data=corrupted)
    lines = list(ext.diff_lines(ext.serialize(base), corrupted))
    assert lines[0].startswith(f"corrupted or hand-edited snapshot: {path}, line 4, entry 'v'")
    ext.delete_snapshots(snapshot_location=str(path), snapshot_names={"fn"})
    ext.delete_snapshots(snapshot_location=str(path), snapshot_names={"fn"})  # idempotent
    assert not path.exists()


def test_include_exclude_are_refused() -> None:
    with pytest.raises(TypeError, match="include/exclude"):
        PolgradSnapshotExtension().serialize(1.0, exclude=lambda **_: False)


class _Config:
    def __init__(self, root: Path, value: str | None) -> None:
        self.rootpath, self.value = root, value

    def getini(self, name: str) -> str:
        if self.value is None:
            raise ValueError(name)
        return self.value


@pytest.mark.parametrize(
    ("ini", "expected"),
    [
        (None, "tests/unit/__snapshots__/test_mod"),
        ("", "tests/unit/__snapshots__/test_mod"),
        ("goldens", "goldens/tests/unit/test_mod"),
    ],
)
def test_location_follows_syrupy_unless_configured(
    tmp_path: Path, ini: str | None, expected: str
) -> None:
    location = types.SimpleNamespace(
        item=types.SimpleNamespace(config=_Config(tmp_path, ini)),
        filepath=str(tmp_path / "tests" / "unit" / "test_mod.py"),
        basename="test_mod",
    )
    got = PolgradSnapshotExtension.dirname(test_location=location)  # type: ignore[arg-type]
    assert Path(got) == tmp_path / expected
