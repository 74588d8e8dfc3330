"""Inputs of the logprobs kind: logits, the sampled token ids they score, the response
mask, the temperature, and the same batch as a packed stream with ``cu_seqlens``.

Row ``b`` is one sequence of ``L_b`` tokens: a prompt of ``P_b >= 1`` tokens, then a
response. With ``shift="next"`` the logits at position ``s`` predict the token at
``s + 1``; ``response_mask`` is in the output's alignment (``align="token"``: it selects
the response tokens ``P_b <= t < L_b``; ``align="logits"``: the logits rows that predict
them, ``P_b - 1 <= s < L_b - 1``). With ``shift="none"`` it selects ``P_b <= t < L_b``
scored by their own logits. Response tokens are sampled from ``softmax(z / tau)`` of the
row that scores them, so they always have a finite logit. Logits rows and token ids that
no selected position reads hold garbage (finite ``+-1e4``-scale, or NaN for logits) that a
correct function never reads; padding columns ``t >= L_b`` are dropped when packing.

Batches whose logits would hold more than :data:`LITERAL_LIMIT` numbers (a large
vocabulary) are built from a seeded ``torch.randn``: their snippet rebuilds them with that
call instead of printing the numbers.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from ._cache import BOOLS, choice, ints
from ._sample import composite
from ._snippet import format_float, snippet
from ._validate import check_choice, check_dtype, check_int, check_range

__all__ = [
    "LITERAL_LIMIT",
    "LOGPROB_PATTERNS",
    "LogprobBatch",
    "logprob_batches",
    "pack_rows",
    "read_positions",
    "unpack_rows",
]

LOGPROB_PATTERNS = ("normal", "peaked", "uniform", "large", "excluded")
"""``normal`` N(0, 2^2); ``peaked`` one logit 12 above the rest; ``uniform`` all equal
(every shift and temperature gives ``-log V``); ``large`` each row offset by ``+-1e4``
(needs the max shift); ``excluded`` about 30% of the vocabulary at ``-inf`` (a masked
vocabulary; entry 0 always stays)."""

LITERAL_LIMIT = 1 << 14
"""Largest number of logits a snippet prints as literals."""

_GARBAGE = 1e4
_SHIFTS = ("next", "none")
_ALIGNS = ("token", "logits")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def read_positions(
    response_mask: torch.Tensor, shift: str, align: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, ids)``: bool ``[B, T]`` masks of the logits rows and the token ids that the
    positions ``response_mask`` selects read (``shift="next"``, ``align="token"``: row
    ``t - 1`` and token ``t``; ``align="logits"``: row ``s`` and token ``s + 1``)."""
    if shift == "none":
        return response_mask.clone(), response_mask.clone()
    before = torch.zeros_like(response_mask)
    before[:, :-1] = response_mask[:, 1:]
    after = torch.zeros_like(response_mask)
    after[:, 1:] = response_mask[:, :-1]
    if align == "token":
        return before, response_mask.clone()
    return response_mask.clone(), after


def pack_rows(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Right-padded ``[B, T, ...]`` -> the rows' first ``L_b`` entries back to back
    ``[N, ...]`` (an index gather: values are moved, never recomputed)."""
    keep = torch.arange(x.shape[1])[None, :] < lengths[:, None]
    return x[keep]


def unpack_rows(
    stream: torch.Tensor, lengths: torch.Tensor, width: int, fill: float = 0.0
) -> torch.Tensor:
    """Inverse of :func:`pack_rows`: ``[N, ...]`` -> ``[B, width, ...]``, ``fill`` beyond
    each row's length."""
    keep = torch.arange(width)[None, :] < lengths[:, None]
    out = torch.full((*keep.shape, *stream.shape[1:]), fill, dtype=stream.dtype)
    out[keep] = stream
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class LogprobBatch:
    """Right-padded ``logits [B, T, V]``, ``input_ids [B, T]`` (int64), ``response_mask
    [B, T]`` (bool, in the output's alignment), the sequence ``lengths [B]`` (int64), the
    ``temperature`` the tokens were sampled at, and the ``shift``/``align`` convention
    the mask is stated in. :meth:`packed` gives the same batch as one stream."""

    logits: torch.Tensor
    input_ids: torch.Tensor
    response_mask: torch.Tensor
    lengths: torch.Tensor
    temperature: float = 1.0
    shift: str = "next"
    align: str = "token"
    pattern: str = ""
    recipe: str = ""
    """A Python expression (``torch`` in scope) that rebuilds ``logits`` exactly; set for
    batches too large to print (:data:`LITERAL_LIMIT`)."""

    def as_kwargs(self) -> dict[str, Any]:
        """The tensors by name (right-padded) and ``temperature`` (a float)."""
        return {
            "logits": self.logits,
            "input_ids": self.input_ids,
            "response_mask": self.response_mask,
            "lengths": self.lengths,
            "temperature": self.temperature,
        }

    def packed(self) -> dict[str, torch.Tensor]:
        """The batch as a packed stream: ``logits [N, V]``, ``input_ids [N]``,
        ``response_mask [N]``, ``cu_seqlens`` int32 ``[B + 1]`` and ``position_ids [N]``
        (restarting at 0 in each sequence), ``N = sum L_b``."""
        lengths = self.lengths
        cu = torch.zeros(lengths.shape[0] + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(lengths, 0).to(torch.int32)
        width = self.response_mask.shape[1]
        pos = torch.arange(width, dtype=torch.int64).expand(lengths.shape[0], width)
        return {
            "logits": pack_rows(self.logits, lengths),
            "input_ids": pack_rows(self.input_ids, lengths),
            "response_mask": pack_rows(self.response_mask, lengths),
            "cu_seqlens": cu,
            "position_ids": pack_rows(pos, lengths),
        }

    def replace(self, **changes: Any) -> LogprobBatch:
        """A copy with some fields replaced (a replaced ``logits`` drops the recipe)."""
        if "logits" in changes and "recipe" not in changes:
            changes["recipe"] = ""
        return dataclasses.replace(self, **changes)

    def to_snippet(self) -> str:
        """Standalone Python rebuilding the tensors exactly (``inputs = dict(...)``)."""
        others = [(n, getattr(self, n)) for n in ("input_ids", "response_mask", "lengths")]
        tau = format_float(self.temperature)
        comment = "pytest-polgrad inputs: " + self.describe()
        if not self.recipe:
            text = snippet([("logits", self.logits), *others], comment=comment)
            return text.replace(
                "\ninputs = dict(",
                f"\ntemperature = {tau}\ninputs = dict(temperature=temperature, ",
            )
        body = snippet(others, comment=comment)
        head, tail = body.split("\ninputs = dict(", 1)
        return (
            f"{head}\nlogits = {self.recipe}\ntemperature = {tau}\n"
            f"inputs = dict(logits=logits, temperature=temperature, {tail}"
        )

    def describe(self) -> str:
        """E.g. ``B=3, T=6, V=5, lengths [6, 4, 5], responses [4, 3, 2], temperature 0.7``."""
        b, t, vocab = self.logits.shape
        kind = f", {self.pattern} logits" if self.pattern else ""
        return (
            f"B={b}, T={t}, V={vocab}, sequence lengths {self.lengths.tolist()}, response "
            f"lengths {[int(n) for n in self.response_mask.sum(dim=1)]}, temperature "
            f"{self.temperature:g}{kind}, {str(self.logits.dtype).removeprefix('torch.')}"
        )


def _sample_ids(
    z: torch.Tensor, ids_at: torch.Tensor, tau: float, shift: str, gen: torch.Generator
) -> torch.Tensor:
    """Token ids: at every position ``ids_at`` marks, a draw from ``softmax(z[row] / tau)``
    of the row that scores it; random valid ids elsewhere."""
    b, t, vocab = z.shape
    ids = torch.randint(0, vocab, (b, t), generator=gen)
    if not bool(ids_at.any()):
        return ids
    row_of = ids_at
    if shift == "next":  # token t is scored by row t - 1 (either alignment)
        row_of = torch.zeros_like(ids_at)
        row_of[:, :-1] = ids_at[:, 1:]
    u = z[row_of].to(torch.float64) / tau
    p = torch.softmax(u, dim=-1)
    drawn = torch.multinomial(p, 1, generator=gen)[:, 0]
    ids[ids_at] = drawn
    return ids


def logprob_batches(
    *,
    max_batch: int = 4,
    max_length: int = 8,
    min_vocab: int = 2,
    max_vocab: int = 16,
    patterns: tuple[str, ...] = LOGPROB_PATTERNS,
    temperatures: tuple[float, ...] = (1.0,),
    shift: str = "next",
    align: str = "token",
    dtype: torch.dtype = torch.float64,
    padding: str = "garbage",
) -> st.SearchStrategy[LogprobBatch]:
    """:class:`LogprobBatch` es: ``B <= max_batch`` sequences of ``2 <= L_b <=
    max_length`` tokens (a prompt of at least one token, a response of at least one),
    ``min_vocab <= V <= max_vocab``, one :data:`LOGPROB_PATTERNS` entry and
    one of ``temperatures`` per batch. Garbage (or NaN with ``padding="nan"``) wherever no
    selected position reads. Shrinks toward one short sequence, a small vocabulary, the
    first pattern and the first temperature."""
    check_int("max_batch", max_batch, minimum=1)
    check_int("max_length", max_length, minimum=2)
    check_int("min_vocab", min_vocab, minimum=2)
    check_int("max_vocab", max_vocab, minimum=2)
    check_range("min_vocab", min_vocab, "max_vocab", max_vocab)
    dt = check_dtype(dtype)
    for p in patterns:
        check_choice("patterns", p, LOGPROB_PATTERNS)
    if not patterns:
        raise InvalidArgument("patterns must name at least one pattern")
    if not temperatures or not all(
        not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x) and x > 0
        for x in temperatures
    ):
        raise InvalidArgument(f"temperatures must be finite numbers > 0, got {temperatures!r}")
    check_choice("shift", shift, _SHIFTS)
    check_choice("align", align, _ALIGNS)
    check_choice("padding", padding, ("garbage", "nan"))
    pattern_choice = choice(tuple(patterns))
    tau_choice = choice(tuple(float(x) for x in temperatures))

    def _draw(draw: st.DrawFn) -> LogprobBatch:
        b = draw(ints(1, max_batch))
        vocab = draw(ints(min_vocab, max_vocab))
        pattern = draw(pattern_choice)
        tau = draw(tau_choice)
        ragged = draw(BOOLS)
        pad = draw(ints(0, 2))
        seed = draw(ints(0, 2**32 - 1))
        gen = _gen(seed)
        lengths = (
            torch.randint(2, max_length + 1, (b,), generator=gen)
            if ragged
            else torch.full((b,), max_length, dtype=torch.int64)
        )
        prompts = (torch.rand(b, generator=gen) * (lengths - 1).double()).long() + 1
        width = int(lengths.max()) + pad
        cols = torch.arange(width)[None, :]
        tokens = (cols >= prompts[:, None]) & (cols < lengths[:, None])  # response tokens
        if shift == "next" and align == "logits":
            mask = torch.zeros_like(tokens)
            mask[:, :-1] = tokens[:, 1:]
        else:
            mask = tokens
        rows, ids_at = read_positions(mask, shift, align)
        shape = (b, width, vocab)
        big = b * width * vocab > LITERAL_LIMIT
        f64 = torch.float64
        recipe = ""
        if big:  # rebuilt in the snippet from the seed: no garbage, plain normal logits
            pattern = "normal"
            recipe = (
                f"(torch.randn({shape}, generator=torch.Generator().manual_seed({seed}), "
                f"dtype=torch.float64) * 2.0).to({dt})"
            )
            z = (torch.randn(shape, generator=_gen(seed), dtype=f64) * 2.0).to(dt)
        else:
            z = torch.randn(shape, generator=gen, dtype=f64) * 2.0
            if pattern == "peaked":
                top = torch.randint(0, vocab, (b, width), generator=gen)
                z = z * 0.25 + 12.0 * torch.nn.functional.one_hot(top, vocab).to(f64)
            elif pattern == "uniform":
                z = torch.zeros(shape, dtype=f64) + 0.5
            elif pattern == "large":
                offset = torch.where(torch.rand((b, width), generator=gen) < 0.5, -1e4, 1e4)
                z = z + offset[:, :, None].to(f64)
            elif pattern == "excluded":
                drop = torch.rand(shape, generator=gen, dtype=f64) < 0.3
                drop[..., 0] = False
                z = torch.where(drop, -math.inf, z)
            if padding == "nan":
                junk = torch.full(shape, math.nan, dtype=f64)
            else:
                junk = (torch.rand(shape, generator=_gen(seed + 1), dtype=f64) - 0.5) * _GARBAGE
            z = torch.where(rows[:, :, None], z, junk).to(dt)
        ids = _sample_ids(z, ids_at, tau, shift, gen)
        return LogprobBatch(
            logits=z,
            input_ids=ids,
            response_mask=mask,
            lengths=lengths.to(torch.int64),
            temperature=tau,
            shift=shift,
            align=align,
            pattern=pattern,
            recipe=recipe,
        )

    return composite(_draw)
