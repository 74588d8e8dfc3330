"""The canonical corpus as the policy-loss kind's batches, built once per process: the same
tensors for every check and every golden item, so the shared oracle computes each
reference result once."""

from __future__ import annotations

import math
from typing import Any

import torch

from pytest_polgrad.core.corpus import canonical_corpus
from pytest_polgrad.strategies import Batch

__all__ = ["corpus_batches", "whole_corpus"]

_CORPORA: dict[tuple[torch.dtype, str, bool, frozenset[str]], dict[str, Batch]] = {}


def corpus_batches(
    dtype: torch.dtype, advantages: str, nan: bool, drop: frozenset[str]
) -> dict[str, Batch]:
    """The canonical corpus as batches, built once per process (the same tensors for every
    check, so the shared oracle computes each reference result once); NaN at padding when
    ``nan``, the tensors in ``drop`` left out."""
    key = (dtype, advantages, nan, drop)
    if key not in _CORPORA:
        out = {}
        for name, tensors in canonical_corpus(dtype=dtype, advantages=advantages).items():
            kw: dict[str, Any] = {k: v for k, v in tensors.items() if k not in drop}
            if nan:
                pad = ~kw["response_mask"]
                for k, t in kw.items():
                    if t.is_floating_point() and t.dim() == 2:
                        kw[k] = t.masked_fill(pad, math.nan)
            out[name] = Batch(**kw)
        _CORPORA[key] = out
    return _CORPORA[key]


def whole_corpus(dtype: torch.dtype, advantages: str) -> dict[str, Batch]:
    """The canonical corpus with every tensor it has, as golden items evaluate it: built
    once per process like the checks' corpus, so the oracle's per-batch cache serves
    every function's golden item (a fresh corpus per item missed it every time)."""
    return corpus_batches(dtype, advantages, False, frozenset())
