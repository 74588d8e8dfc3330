"""Snippets and reprs are valid Python that rebuilds the exact tensors."""

from __future__ import annotations

import math
import struct

import pytest
import torch
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

from pytest_polgrad.strategies import Batch, batches
from pytest_polgrad.strategies._snippet import format_float, tensor_literal


def bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""


small = st.fixed_dictionaries(
    {
        "max_batch": st.just(3),
        "max_length": st.just(6),
        "dtype": st.sampled_from([torch.float64, torch.float32, torch.bfloat16, torch.float16]),
        "padding": st.sampled_from(["garbage", "nan"]),
        "layout": st.sampled_from(["right", "left", "packed"]),
        "domain": st.sampled_from(["semantic", "extreme"]),
    }
).flatmap(lambda kw: batches(**kw))


@settings(max_examples=60)
@given(small)
def test_snippet_rebuilds_every_tensor_bit_for_bit(batch: Batch) -> None:
    code = batch.to_snippet()
    assert code.startswith("import torch\n")
    namespace: dict[str, object] = {}
    exec(compile(code, "<snippet>", "exec"), namespace)  # only torch is imported
    inputs = namespace["inputs"]
    assert isinstance(inputs, dict)
    expected = batch.as_kwargs()
    assert list(inputs) == list(expected)
    for name, tensor in expected.items():
        rebuilt = inputs[name]
        assert isinstance(rebuilt, torch.Tensor)
        assert rebuilt.dtype == tensor.dtype and rebuilt.shape == tensor.shape, name
        assert bits(rebuilt) == bits(tensor), name


@settings(max_examples=40)
@given(small)
def test_repr_evaluates_back_to_the_same_batch(batch: Batch) -> None:
    text = repr(batch)
    if text.startswith("Batch(<"):  # too large for literals: a summary instead
        return
    again = eval(text, {"torch": torch, "Batch": Batch, "nan": math.nan, "inf": math.inf})
    assert again.layout == batch.layout
    for name, tensor in batch.as_kwargs().items():
        assert bits(again.as_kwargs()[name]) == bits(tensor), name


def test_large_batches_print_a_summary() -> None:
    found = find(
        batches(min_batch=8, max_batch=8, min_length=100, max_length=100),
        lambda b: True,
        settings=settings(database=None, phases=[Phase.generate]),
    )
    assert repr(found).startswith("Batch(<B=8, T=100, layout='right'")
    assert "seed=" in repr(found)


@pytest.mark.parametrize(
    ("value", "dtype", "text"),
    [
        (0.1, torch.float64, "0.1"),
        (struct.unpack("<f", struct.pack("<f", 0.1))[0], torch.float32, "0.1"),
        (-0.0, torch.float32, "-0.0"),
        (1e-45, torch.float32, "1e-45"),
        (float("nan"), torch.float64, "nan"),
        (float("-inf"), torch.float16, "-inf"),
        (-1.25390625, torch.float64, "-1.25390625"),
        (2.0**-24, torch.float16, "6e-08"),
    ],
)
def test_format_float_is_shortest_round_trip(value: float, dtype: torch.dtype, text: str) -> None:
    assert format_float(value, dtype) == text


@settings(max_examples=200)
@given(
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.float64]),
)
def test_float_literals_round_trip_in_every_dtype(value: float, dtype: torch.dtype) -> None:
    t = torch.tensor([value], dtype=dtype)
    rebuilt = eval(tensor_literal(t), {"torch": torch, "nan": math.nan, "inf": math.inf})
    assert bits(rebuilt) == bits(t) or (bool(t.isnan().all()) and bool(rebuilt.isnan().all()))


@settings(max_examples=150)
@given(
    st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.bool]),
    st.lists(
        st.tuples(st.sampled_from([0.0, -0.0, 1.0, -3.5, math.nan, math.inf]), st.integers(1, 12)),
        min_size=1,
        max_size=6,
    ),
    st.integers(1, 3),
)
def test_runs_of_a_repeated_value_rebuild_bit_for_bit(
    dtype: torch.dtype, runs: list[tuple[float, int]], rows: int
) -> None:
    """``[v] * n`` for a run of 8 or more: -0.0 is not 0.0, NaN and inf survive, rows stay rows."""
    values = [v for v, n in runs for _ in range(n)]
    t = torch.tensor([values] * rows, dtype=torch.float64).to(dtype)
    text = tensor_literal(t)
    if any(n >= 8 for _, n in runs):
        assert "] * " in text
    rebuilt = eval(text, {"torch": torch, "nan": math.nan, "inf": math.inf})
    assert rebuilt.dtype == t.dtype and rebuilt.shape == t.shape
    if t.is_floating_point():  # a NaN's sign and payload are not kept (``nan``)
        assert torch.equal(rebuilt.isnan(), t.isnan())
        t, rebuilt = (torch.where(x.isnan(), 0.0, x) for x in (t, rebuilt))
    assert bits(rebuilt) == bits(t)


def test_a_realistic_size_batch_prints_in_short_lines_and_rebuilds_bit_for_bit() -> None:
    """Rows of thousands of tokens: no line over 100 characters (the literal once was one
    line per tensor, 64k characters long), the masks one short line per row."""
    found = find(
        batches(min_batch=3, max_batch=3, min_length=1500, max_length=3000, dtype=torch.float32),
        lambda b: b.logprobs.unique().numel() > 1000,  # random values: no runs to shorten
        settings=settings(database=None, phases=[Phase.generate]),
    )
    code = found.to_snippet()
    literals = [ln for ln in code.splitlines() if not ln.startswith(("#", "inputs = dict("))]
    assert max(len(line) for line in literals) <= 100
    mask_start = code.index("response_mask = ")
    mask = code[mask_start : code.index("dtype=torch.bool", mask_start)]
    assert mask.count("\n") <= found.batch_size + 1, mask
    namespace: dict[str, object] = {}
    exec(compile(code, "<snippet>", "exec"), namespace)
    inputs = namespace["inputs"]
    assert isinstance(inputs, dict)
    for name, tensor in found.as_kwargs().items():
        assert bits(inputs[name]) == bits(tensor), name


@pytest.mark.parametrize("shape", [(0,), (0, 5), (3, 0), (2, 0, 4), (0, 0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.bool, torch.int64])
def test_an_empty_tensor_rebuilds_with_its_shape(
    shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    """``[]`` alone would rebuild a ``(0, 5)`` tensor as ``(0,)``."""
    t = torch.zeros(shape, dtype=dtype)
    rebuilt = eval(tensor_literal(t), {"torch": torch})
    assert rebuilt.shape == t.shape and rebuilt.dtype == t.dtype
