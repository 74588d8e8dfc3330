"""Issue 28, strategies bullet: ``Batch.rebuild`` validates ``dtype``, ``layout`` and
``padding`` as ``batches()`` does (``InvalidArgument`` naming the argument); it returned
integer (and float8) logprobs for ``dtype=torch.int32`` and took ``padding="zero"``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import InvalidArgument

from pytest_polgrad.strategies import Batch, batches

REBUILD_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("dtype int32", {"dtype": torch.int32}, "dtype must be one of"),
    ("dtype int64", {"dtype": torch.int64}, "dtype must be one of"),
    ("dtype bool", {"dtype": torch.bool}, "dtype must be one of"),
    ("dtype float8", {"dtype": torch.float8_e4m3fn}, "dtype must be one of"),
    ("dtype complex64", {"dtype": torch.complex64}, "dtype must be one of"),
    ("dtype string", {"dtype": "float32"}, "dtype must be one of"),
    ("dtype numpy-like name", {"dtype": "torch.float32"}, "dtype must be one of"),
    ("padding zero", {"padding": "zero"}, "padding must be one of 'garbage', 'nan'"),
    ("padding NaN capitalised", {"padding": "NaN"}, "padding must be one of"),
    ("padding int", {"padding": 0}, "padding must be one of"),
    ("layout middle", {"layout": "middle"}, "layout must be one of 'right', 'left', 'packed'"),
    ("layout int", {"layout": 1}, "layout must be one of"),
]


@settings(max_examples=1, database=None, suppress_health_check=list(HealthCheck))
@given(batches(max_batch=2, max_length=3))
def _one_batch(batch: Batch) -> None:
    _DRAWN.append(batch)


_DRAWN: list[Batch] = []


@pytest.mark.parametrize(
    ("kwargs", "words"), [pytest.param(k, w, id=n) for n, k, w in REBUILD_CASES]
)
def test_rebuild_refuses_what_batches_refuses(kwargs: dict[str, Any], words: str) -> None:
    if not _DRAWN:
        _one_batch()
    with pytest.raises(InvalidArgument, match=words):
        _DRAWN[0].rebuild(**kwargs)


def test_rebuild_still_takes_every_valid_value() -> None:
    if not _DRAWN:
        _one_batch()
    batch = _DRAWN[0]
    assert batch.rebuild(dtype=torch.float32).logprobs.dtype is torch.float32
    assert batch.rebuild(dtype=torch.bfloat16).logprobs.dtype is torch.bfloat16
    assert batch.rebuild(padding="nan").logprobs.isnan().any() == (~batch.response_mask).any()
    assert batch.rebuild(layout="left").layout == "left"


REBUILD_BAD_INPUTS = len(REBUILD_CASES)
