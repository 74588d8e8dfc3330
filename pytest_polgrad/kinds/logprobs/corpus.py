"""Canonical inputs of the logprobs kind: literal logits and token ids in each
shift/alignment convention, with large, masked-vocabulary and large-vocabulary variants."""

from __future__ import annotations

import math

import torch

from pytest_polgrad.strategies._logits import LogprobBatch, read_positions

from .reference import LogprobsReference

__all__ = ["CORPUS_VERSION", "LARGE_VOCAB", "corpus_batch", "large_vocab_batch"]

CORPUS_VERSION = 1
LARGE_VOCAB = 152064
"""A production vocabulary size (Qwen2.5's padded 151 646 tokens)."""

_LENGTHS = [6, 3, 5, 2]
_PROMPTS = [2, 1, 3, 1]
_WIDTH, _VOCAB = 7, 5


def _mask(
    ref: LogprobsReference, lengths: list[int], prompts: list[int], width: int
) -> torch.Tensor:
    cols = torch.arange(width)[None, :]
    tokens = (cols >= torch.tensor(prompts)[:, None]) & (cols < torch.tensor(lengths)[:, None])
    if ref.shift == "next" and ref.align == "logits":
        mask = torch.zeros_like(tokens)
        mask[:, :-1] = tokens[:, 1:]
        return mask
    return tokens


def corpus_batch(
    ref: LogprobsReference, dtype: torch.dtype, temperature: float, variant: str = "ragged"
) -> LogprobBatch:
    """Four sequences of lengths 6, 3, 5, 2 (prompts 2, 1, 3, 1), ``V = 5``, one padding
    column; logits rows nobody reads hold 50.0, unread token ids 0. ``variant``:
    ``"ragged"``; ``"large"`` (rows read offset by +-1e4); ``"masked-vocab"`` (some entries
    ``-inf``, never a sampled token's)."""
    mask = _mask(ref, _LENGTHS, _PROMPTS, _WIDTH)
    rows, ids_at = read_positions(mask, ref.shift, ref.align)
    b = len(_LENGTHS)
    z = torch.tensor(
        [
            [[((3 * i + 5 * t + 7 * v) % 11 - 5) / 2 for v in range(_VOCAB)] for t in range(_WIDTH)]
            for i in range(b)
        ],
        dtype=torch.float64,
    )
    z[0, 2] = torch.tensor([6.0, 0.0, 0.0, -1.0, 0.5])  # peaked
    ids = torch.tensor([[(2 * i + 3 * t + 1) % _VOCAB for t in range(_WIDTH)] for i in range(b)])
    if variant == "large":
        z = z + torch.tensor([1e4, -1e4, 1e4, -1e4])[:, None, None]
    elif variant == "masked-vocab":
        drop = torch.tensor(
            [[(i + t + v) % 3 == 0 for v in range(_VOCAB)] for i in range(b) for t in range(_WIDTH)]
        ).reshape(z.shape)
        # the token a row scores keeps its logit
        if ref.shift == "none":
            scored = ids
        else:
            scored = torch.zeros_like(ids)
            scored[:, :-1] = ids[:, 1:]
        drop.scatter_(2, scored[:, :, None], False)
        z = torch.where(drop, -math.inf, z)
    z = torch.where(rows[:, :, None], z, 50.0)
    ids = torch.where(ids_at, ids, 0)
    return LogprobBatch(
        logits=z.to(dtype),
        input_ids=ids,
        response_mask=mask,
        lengths=torch.tensor(_LENGTHS),
        temperature=temperature,
        shift=ref.shift,
        align=ref.align,
        pattern="corpus" if variant == "ragged" else variant,
    )


def large_vocab_batch(
    ref: LogprobsReference, dtype: torch.dtype, temperature: float
) -> LogprobBatch:
    """Two sequences of lengths 4 and 3 over ``V = LARGE_VOCAB`` seeded normal logits (the
    snippet rebuilds them from the seed), tokens sampled from ``softmax(z / tau)``."""
    lengths, prompts, width = [4, 3], [1, 2], 4
    mask = _mask(ref, lengths, prompts, width)
    _, ids_at = read_positions(mask, ref.shift, ref.align)
    shape = (len(lengths), width, LARGE_VOCAB)
    recipe = (
        f"(torch.randn({shape}, generator=torch.Generator().manual_seed(31), "
        f"dtype=torch.float64) * 2.0).to({dtype})"
    )
    gen = torch.Generator().manual_seed(31)
    z = (torch.randn(shape, generator=gen, dtype=torch.float64) * 2.0).to(dtype)
    row_of = ids_at
    if ref.shift == "next":
        row_of = torch.zeros_like(ids_at)
        row_of[:, :-1] = ids_at[:, 1:]
    p = torch.softmax(z[row_of].double() / temperature, dim=-1)
    ids = torch.zeros((len(lengths), width), dtype=torch.int64)
    ids[ids_at] = torch.multinomial(p, 1, generator=torch.Generator().manual_seed(32))[:, 0]
    return LogprobBatch(
        logits=z,
        input_ids=ids,
        response_mask=mask,
        lengths=torch.tensor(lengths),
        temperature=temperature,
        shift=ref.shift,
        align=ref.align,
        pattern="large-vocabulary",
        recipe=recipe,
    )
