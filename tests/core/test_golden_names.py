"""A golden's file name is injective over test ids (issue 28 item 1): ``a/b`` and ``ab``,
or two long names sharing their first 250 characters, never share a file.

:func:`~pytest_polgrad.core.golden_format.golden_stem` escapes what a file system drops
or folds and hashes the tail of a long name; the names the suite already records keep
their file names.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_polgrad.core.golden_format import golden_stem

LIMIT = 255 - len(".polgrad")

# Ids as pytest builds them, with what breaks file names over-represented.
_HOSTILE = st.sampled_from([*'/\\:*?"<>|%~.\n\t\x00 []-_ab', "é", "\u2028", "\ud800"])
_ID = st.lists(st.one_of(_HOSTILE, st.characters()), max_size=400).map("".join)


@settings(max_examples=400, deadline=None)
@given(st.lists(_ID, min_size=2, max_size=6, unique=True))
def test_distinct_ids_get_distinct_file_names(ids: list[str]) -> None:
    names = [f"loss[{i}-dapo-golden]" for i in ids]
    stems = [golden_stem(n) for n in names]
    assert len(set(stems)) == len(stems), list(zip(names, stems, strict=True))


@settings(max_examples=300, deadline=None)
@given(_ID)
def test_a_stem_is_one_valid_file_name(name: str) -> None:
    stem = golden_stem(f"f[{name}]")
    assert len(stem.encode("utf-8")) <= LIMIT
    assert stem.isascii() and stem.isprintable()
    assert not any(c in stem for c in '/\\:*?"<>|')
    assert not stem.startswith(".")


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("g[a/b-dapo-golden]", "g[ab-dapo-golden]"),
        ("g[x:y-dapo-golden]", "g[xy-dapo-golden]"),
        ("g[%2F-dapo-golden]", "g[/-dapo-golden]"),  # the escape itself is escaped
        ("g[a\nb-dapo-golden]", "g[ab-dapo-golden]"),
        ("f" * 260 + "x[dapo-golden]", "f" * 260 + "y[dapo-golden]"),
        ("f" * 300, golden_stem("f" * 300)),  # a hashed stem is nobody's plain name
    ],
)
def test_names_syrupy_merged_are_kept_apart(a: str, b: str) -> None:
    assert golden_stem(a) != golden_stem(b)


def test_a_long_name_keeps_its_head_and_fits(tmp_path: Path) -> None:
    long = "loss_" + "x" * 600 + "[dapo-golden]"
    stem = golden_stem(long)
    assert stem.startswith("loss_xxx") and len(stem) == LIMIT and "~" in stem
    (tmp_path / f"{stem}.polgrad").write_text("x")  # the file system takes it


def test_the_names_the_suite_records_are_unchanged() -> None:
    for path in Path(__file__).parents[2].rglob("*.polgrad"):
        if ".venv" not in path.parts:
            assert golden_stem(path.stem) == path.stem, path
