"""Determinism (same plan or seed -> bitwise-identical tensors, in any process) and exact
layout conversions."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import textwrap
from pathlib import Path
from typing import Literal

import pytest
import torch
from hypothesis import Phase, given, seed, settings
from hypothesis import strategies as st

from pytest_polgrad.strategies import (
    Batch,
    BatchPlan,
    batches,
    build,
    build_many,
    left_to_right,
    pack,
    right_to_left,
    row_extents,
    unpack,
)
from tests.helpers.snippet_driver import HASH_SEED, run_snippets

ROOT = Path(__file__).resolve().parents[2]


def bits(t: torch.Tensor) -> bytes:
    """The tensor's exact bytes (NaN payloads and signed zeros included)."""
    return t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""


def digest(batch: Batch) -> str:
    h = hashlib.sha256()
    for name, t in batch.as_kwargs().items():
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(repr(tuple(t.shape)).encode())
        h.update(bits(t))
    return h.hexdigest()


def same(a: Batch, b: Batch) -> bool:
    return digest(a) == digest(b)


@settings(max_examples=40)
@given(st.data())
def test_rebuilding_a_plan_is_bitwise_identical(data: st.DataObject) -> None:
    dtype = data.draw(st.sampled_from([torch.float64, torch.float32, torch.bfloat16]))
    batch = data.draw(batches(dtype=dtype, holes=data.draw(st.booleans())))
    assert batch.plan is not None
    assert same(build(batch.plan), batch)
    assert same(batch.rebuild(), batch)


_MIXED = st.sampled_from([torch.float64, torch.float32, torch.bfloat16, torch.float16])


@settings(max_examples=25)
@given(st.data())
def test_building_plans_together_gives_each_its_own_batch(data: st.DataObject) -> None:
    """A pool builds its plans together (one buffer for all their logprobs, one write for
    all their aimed values); each batch must be bitwise the one its plan builds alone,
    whatever its neighbours: other dtypes, domains, layouts, holes, NaN padding, targets."""
    drawn = [
        data.draw(
            batches(
                dtype=data.draw(_MIXED),
                holes=data.draw(st.booleans()),
                padding=data.draw(st.sampled_from(["garbage", "nan"])),
                layout=data.draw(st.sampled_from(["right", "left", "packed"])),
                domain=data.draw(st.sampled_from(["semantic", "extreme"])),
            )
        )
        for _ in range(data.draw(st.integers(1, 5)))
    ]
    plans = [b.plan for b in drawn if b.plan is not None]
    together = build_many(plans)
    assert [digest(b) for b in together] == [digest(build(p)) for p in plans]
    assert [digest(b) for b in together] == [digest(b) for b in drawn]


SEED = 20240601
_DRAWN = dict(max_batch=6, max_length=96, holes=True, with_rollout_logprobs=True)

_CHILD = textwrap.dedent(
    f"""
    import hashlib, sys, torch
    sys.path.insert(0, {str(ROOT)!r})
    from hypothesis import given, seed, settings, Phase
    from pytest_polgrad.strategies import batches, build
    from pytest_polgrad.strategies._plan import *  # the plan classes, for eval(repr(plan))
    torch.set_num_threads(THREADS)
    drawn, rebuilt = hashlib.sha256(), hashlib.sha256()
    def add(h, b):
        for name, t in b.as_kwargs().items():
            h.update(name.encode())
            h.update(t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    @seed({SEED})
    @settings(max_examples=30, database=None, phases=[Phase.generate], deadline=None)
    @given(batches(**{_DRAWN!r}))
    def draw_some(b):
        add(drawn, b)
    draw_some()
    for line in open(PLANS).read().splitlines():
        add(rebuilt, build(eval(line)))
    print(drawn.hexdigest(), rebuilt.hexdigest())
    """
)
"""Run in the suite's snippet interpreter (``tests/helpers/snippet_driver.py``): another process,
with another hash seed (``HASH_SEED``), the kit imported afresh (``fresh_kit``); ``THREADS`` and
``PLANS`` are filled in."""


def _add(h: hashlib._Hash, batch: Batch) -> None:
    for name, t in batch.as_kwargs().items():
        h.update(name.encode())
        h.update(bits(t))


def test_same_seed_gives_identical_tensors_in_another_process(tmp_path: Path) -> None:
    """What pytest-xdist needs: a worker with the same seed draws the same batches, and a
    plan printed in one process rebuilds bit for bit in another (here with a different
    hash seed and thread count)."""
    drawn, rebuilt = hashlib.sha256(), hashlib.sha256()

    @seed(SEED)
    @settings(max_examples=30, database=None, phases=[Phase.generate], deadline=None)
    @given(batches(**_DRAWN))  # type: ignore[arg-type]
    def draw_some(b: Batch) -> None:
        _add(drawn, b)

    draw_some()
    plans: list[BatchPlan] = []

    @settings(max_examples=15, database=None)
    @given(batches(max_batch=4, max_length=80, dtype=torch.float32, padding="nan"))
    def collect(b: Batch) -> None:
        assert b.plan is not None
        plans.append(b.plan)
        _add(rebuilt, b)

    collect()
    (tmp_path / "plans.txt").write_text("\n".join(repr(p) for p in plans))
    threads = max(1, torch.get_num_threads() % 2 + 1)  # another thread count than this one's
    code = _CHILD.replace("THREADS", str(threads)).replace(
        "PLANS", repr(str(tmp_path / "plans.txt"))
    )
    child = run_snippets([("child", code, str(ROOT))], tmp_path, fresh_kit=True)["child"]
    assert not child.startswith("FAILED"), child
    assert os.environ.get("PYTHONHASHSEED") != HASH_SEED  # another hash seed there
    assert child.split() == [drawn.hexdigest(), rebuilt.hexdigest()]


@settings(max_examples=60)
@given(st.data())
def test_layouts_round_trip_exactly(data: st.DataObject) -> None:
    batch = data.draw(
        batches(
            holes=data.draw(st.booleans()),
            padding=data.draw(st.sampled_from(["garbage", "nan"])),
            advantage_shape=data.draw(st.sampled_from(["sequence", "token"])),
        )
    )
    left = batch.to_layout("left")
    assert left.layout == "left"
    assert same(left.to_layout("right"), batch)  # a rotation: padding values included
    packed = batch.to_layout("packed")
    assert same(packed.to_layout("right").to_layout("packed"), packed)
    assert same(left.to_layout("packed"), packed)
    assert packed.lengths == batch.lengths == left.lengths
    assert packed.extents == batch.extents == left.extents
    back = packed.to_layout("right")
    span = torch.arange(batch.width)[None, :] < torch.tensor(batch.extents)[:, None]
    for name, t in batch.as_kwargs().items():
        if t.shape == batch.response_mask.shape:
            assert bits(back.as_kwargs()[name][span]) == bits(t[span]), name


@settings(max_examples=60)
@given(st.data())
def test_drawn_layouts_equal_converted_canonical_batches(data: st.DataObject) -> None:
    layout: Literal["left", "packed"] = data.draw(st.sampled_from(["left", "packed"]))
    batch = data.draw(batches(layout=layout, holes=True))
    assert batch.layout == layout
    assert batch.plan is not None
    canonical = build(batch.plan.__class__(**{**batch.plan.__dict__, "layout": "right"}))
    assert same(canonical.to_layout(layout), batch)
    if layout == "left":
        assert bool(batch.response_mask[:, -1].all())  # every row ends at the last column
    else:
        assert batch.cu_seqlens is not None and batch.cu_seqlens.dtype == torch.int32


@settings(max_examples=60)
@given(
    st.lists(st.integers(0, 7), min_size=1, max_size=6),
    st.integers(0, 3),
    st.sampled_from([torch.float64, torch.float32, torch.int64, torch.bool]),
)
def test_tensor_converters_are_exact_inverses(
    extents: list[int], extra: int, dtype: torch.dtype
) -> None:
    width = max(extents) + extra
    ext = torch.tensor(extents)
    x = (torch.randn(len(extents), width) * 100).to(dtype)
    assert bits(left_to_right(right_to_left(x, ext), ext)) == bits(x)
    stream, cu = pack(x, ext)
    assert cu.dtype == torch.int32 and cu.tolist()[-1] == sum(extents)
    again = unpack(stream, cu, width=width, fill=0)
    span = torch.arange(width)[None, :] < ext[:, None]
    assert bits(again[span]) == bits(x[span])
    assert bits(pack(again, ext)[0]) == bits(stream)
    assert row_extents(span, "right").tolist() == extents
    assert row_extents(right_to_left(span, ext), "left").tolist() == extents


def test_a_plan_whose_magnitudes_miss_rows_is_refused_not_shifted() -> None:
    """Built with others, a plan's row scales are one slice of a shared vector: a plan with
    magnitudes for the wrong number of rows must be refused, not shift its neighbours'."""
    from pytest_polgrad.strategies._plan import AdvantagePlan

    good = BatchPlan(extents=(2, 3), width=3, seed=1)
    bad = dataclasses.replace(good, advantages=AdvantagePlan(values=(1.0, -1.0), magnitudes=(2.0,)))
    with pytest.raises(ValueError, match=r"AdvantagePlan.magnitudes has 1 entries for 2 rows"):
        build_many([good, bad])
