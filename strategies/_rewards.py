"""Inputs of the advantage, value-loss and entropy kinds: rewards in groups, critic values
and episode ends, value-loss triples, and next-token logits.

Hypothesis decides the structure (group sizes 1..16, each group's reward kind, the order
of rows, response lengths, which patterns appear); bulk values come from a seeded
``torch.Generator``, so drawing stays cheap and every batch shrinks toward a few small
groups of plain binary rewards. Padding holds garbage (finite, or NaN with
``padding="nan"``) that a correct function never reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from ._cache import BOOLS, choice, ints
from ._sample import composite
from ._snippet import snippet
from ._validate import check_bool, check_choice, check_dtype, check_int, check_range, check_real

__all__ = [
    "LOGIT_PATTERNS",
    "REWARD_KINDS",
    "LogitBatch",
    "RewardBatch",
    "ValueBatch",
    "logit_batches",
    "reward_batches",
    "value_batches",
]

REWARD_KINDS = ("binary", "equal", "grid", "continuous", "one-hot")
"""Per-group reward patterns: 0/1 verifier outcomes, all equal (zero spread), a short grid
of dyadic values with ties, continuous (seeded normal), one success among failures."""
_GRID = (0.0, 1.0, 0.5, -1.0, 0.25, 2.0, -0.5)
_SCALES = {  # extreme-domain reward scales per dtype: squares stay finite in float32 (a
    # float64 function may compute in float32), advantages stay representable
    torch.float64: (1.0, 1e-3, 1e3, 1e6, 1e15),
    torch.float32: (1.0, 1e-3, 1e3, 1e6, 1e15),
    torch.bfloat16: (1.0, 1e-3, 1e3, 1e6),
    torch.float16: (1.0, 1e-2, 10.0),  # group sums of squares stay below 65504
}
_GARBAGE = 1e4


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _lengths_mask(lengths: list[int], pad: int) -> torch.Tensor:
    width = max(lengths) + pad
    return torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]


def _garbage(mask: torch.Tensor, x: torch.Tensor, seed: int, nan: bool) -> torch.Tensor:
    """``x`` at response positions, garbage (``+-1e4``-scale or NaN) at padding."""
    if nan:
        return torch.where(mask, x, float("nan"))
    junk = (torch.rand(mask.shape, generator=_gen(seed), dtype=torch.float64) - 0.5) * _GARBAGE
    return torch.where(mask, x, junk.to(x.dtype))


class _Literal:
    """Shared ``as_kwargs`` / ``to_snippet`` for the dataclasses below."""

    def _items(self) -> Iterator[tuple[str, torch.Tensor]]:
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                yield f.name, value

    def as_kwargs(self) -> dict[str, torch.Tensor]:
        """The tensors by parameter name (right-padded layout)."""
        return dict(self._items())

    def to_snippet(self) -> str:
        """Standalone Python (``import torch`` + literals) rebuilding the tensors exactly."""
        return snippet(self._items())

    def replace(self, **changes: Any) -> Any:
        """A copy with some tensors replaced."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


def _lengths(mask: torch.Tensor) -> list[int]:
    return [int(n) for n in mask.sum(dim=1)]


@dataclasses.dataclass(frozen=True, eq=False)
class RewardBatch(_Literal):
    """Rewards ``[B]`` in groups (``group_ids`` int64 ``[B]``), a right-padded
    ``response_mask [B, T]`` and, when drawn, per-token rewards, critic values and episode
    ends (``dones``, bool ``[B, T]``, only at response positions)."""

    rewards: torch.Tensor
    group_ids: torch.Tensor
    response_mask: torch.Tensor
    token_rewards: torch.Tensor | None = None
    values: torch.Tensor | None = None
    dones: torch.Tensor | None = None
    kinds: tuple[str, ...] = ()
    """The reward kind of each group (for :meth:`describe`)."""

    @property
    def group_sizes(self) -> list[int]:
        _, counts = torch.unique(self.group_ids, return_counts=True)
        return [int(c) for c in counts]

    def describe(self) -> str:
        """E.g. ``B=6 in 2 groups of sizes [4, 2] (binary, equal), lengths [1, 3, ...]``."""
        kinds = f" ({', '.join(self.kinds)})" if self.kinds else ""
        extra = [n for n in ("token_rewards", "values", "dones") if getattr(self, n) is not None]
        tail = f", with {', '.join(extra)}" if extra else ""
        return (
            f"B={self.rewards.shape[0]} in {len(self.group_sizes)} group(s) of sizes "
            f"{self.group_sizes}{kinds}, response lengths {_lengths(self.response_mask)}, "
            f"T={self.response_mask.shape[1]}, {str(self.rewards.dtype).removeprefix('torch.')}"
            f"{tail}"
        )


def _group_rewards(kind: str, size: int, gen: torch.Generator) -> list[float]:
    if kind == "binary":
        return [float(x) for x in torch.randint(0, 2, (size,), generator=gen)]
    if kind == "equal":
        return [_GRID[int(torch.randint(0, len(_GRID), (1,), generator=gen))]] * size
    if kind == "grid":
        return [_GRID[int(i)] for i in torch.randint(0, len(_GRID), (size,), generator=gen)]
    if kind == "one-hot":
        hot = int(torch.randint(0, size, (1,), generator=gen))
        return [1.0 if i == hot else 0.0 for i in range(size)]
    return [float(x) for x in torch.randn(size, generator=gen, dtype=torch.float64)]


def reward_batches(
    *,
    min_groups: int = 1,
    max_groups: int = 4,
    min_group_size: int = 1,
    max_group_size: int = 16,
    kinds: tuple[str, ...] = REWARD_KINDS,
    max_length: int = 12,
    dtype: torch.dtype = torch.float64,
    shuffle: bool | None = None,
    equal_sizes: bool = False,
    token_rewards: bool = False,
    values: bool = False,
    dones: bool = False,
    domain: str = "semantic",
    padding: str = "garbage",
) -> st.SearchStrategy[RewardBatch]:
    """:class:`RewardBatch` es: ``min_groups..max_groups`` groups of
    ``min_group_size..max_group_size`` rows, each group's rewards of one of ``kinds``
    (:data:`REWARD_KINDS`), rows contiguous or shuffled with arbitrary labels
    (``shuffle=None``: either); ``equal_sizes`` gives every group the same size (the
    ``[num_prompts, G]`` layout). ``domain="extreme"`` scales each group's rewards by up to
    ``1e15`` (float64/float32; less for narrower dtypes). Shrinks toward one group of one row."""
    check_int("min_groups", min_groups, minimum=1)
    check_int("max_groups", max_groups, minimum=1)
    check_range("min_groups", min_groups, "max_groups", max_groups)
    check_int("min_group_size", min_group_size, minimum=1)
    check_int("max_group_size", max_group_size, minimum=1)
    check_range("min_group_size", min_group_size, "max_group_size", max_group_size)
    check_int("max_length", max_length, minimum=1)
    dt = check_dtype(dtype)
    if not isinstance(kinds, tuple) or not kinds:
        raise InvalidArgument(f"kinds must be a non-empty tuple of {REWARD_KINDS}, got {kinds!r}")
    for k in kinds:
        check_choice("kinds", k, REWARD_KINDS)
    check_bool("shuffle", shuffle, optional=True)
    check_bool("equal_sizes", equal_sizes)
    for name, flag in (("token_rewards", token_rewards), ("values", values), ("dones", dones)):
        check_bool(name, flag)
    check_choice("domain", domain, ("semantic", "extreme"))
    check_choice("padding", padding, ("garbage", "nan"))
    scales = _SCALES[dt] if domain == "extreme" else (1.0,)
    kind_choice = choice(tuple(kinds))
    orders = choice((False, True)) if shuffle is None else choice((shuffle,))

    def _draw(draw: st.DrawFn) -> RewardBatch:
        n_groups = draw(ints(min_groups, max_groups))
        if equal_sizes:
            sizes = [draw(ints(min_group_size, max_group_size))] * n_groups
        else:
            sizes = [draw(ints(min_group_size, max_group_size)) for _ in range(n_groups)]
        group_kinds = tuple(draw(kind_choice) for _ in range(n_groups))
        group_scales = [draw(choice(scales)) for _ in range(n_groups)]
        shuffled = draw(orders)
        ragged = draw(BOOLS)
        pad = draw(ints(0, 2))
        seed = draw(ints(0, 2**32 - 1))
        gen = _gen(seed)
        rows: list[float] = []
        labels: list[int] = []
        for g, (size, kind, scale) in enumerate(zip(sizes, group_kinds, group_scales, strict=True)):
            rows += [r * scale for r in _group_rewards(kind, size, gen)]
            labels += [g] * size
        b = len(rows)
        if shuffled:
            perm = torch.randperm(b, generator=gen)
            relabel = torch.randperm(1000, generator=gen)[:n_groups] * 7 - 3000
            rows = [rows[int(i)] for i in perm]
            labels = [int(relabel[labels[int(i)]]) for i in perm]
        lengths = (
            [int(x) for x in torch.randint(1, max_length + 1, (b,), generator=gen)]
            if ragged
            else [max_length] * b
        )
        mask = _lengths_mask(lengths, pad)
        nan = padding == "nan"
        shape = tuple(mask.shape)
        extra: dict[str, torch.Tensor] = {}
        if token_rewards:
            tr = torch.randn(shape, generator=gen, dtype=torch.float64) * 0.1
            extra["token_rewards"] = _garbage(mask, tr, seed + 1, nan).to(dt)
        if values:
            val = torch.randn(shape, generator=gen, dtype=torch.float64) * 0.5
            extra["values"] = _garbage(mask, val, seed + 2, nan).to(dt)
        if dones:
            d = torch.rand(shape, generator=gen, dtype=torch.float64) < 0.15
            extra["dones"] = d & mask
        return RewardBatch(
            rewards=torch.tensor(rows, dtype=torch.float64).to(dt),
            group_ids=torch.tensor(labels, dtype=torch.int64),
            response_mask=mask,
            kinds=group_kinds,
            **extra,
        )

    return composite(_draw)


@dataclasses.dataclass(frozen=True, eq=False)
class ValueBatch(_Literal):
    """Critic inputs: ``values``, ``old_values``, ``returns`` (float ``[B, T]``) and a
    right-padded ``response_mask``; ``values - old_values`` lies well inside or well
    outside the clip range per token (never within rounding of the boundary)."""

    values: torch.Tensor
    old_values: torch.Tensor
    returns: torch.Tensor
    response_mask: torch.Tensor

    def describe(self) -> str:
        return (
            f"B={self.values.shape[0]}, T={self.values.shape[1]}, response lengths "
            f"{_lengths(self.response_mask)}, {str(self.values.dtype).removeprefix('torch.')}"
        )


def value_batches(
    *,
    max_batch: int = 6,
    max_length: int = 12,
    clip_range: float = 0.2,
    dtype: torch.dtype = torch.float64,
    domain: str = "semantic",
    padding: str = "garbage",
) -> st.SearchStrategy[ValueBatch]:
    """:class:`ValueBatch` es with both clip regions present: each token's
    ``|values - old_values|`` is below ``clip_range / 2`` or in ``[1.5, 3] * clip_range``
    (either sign), returns on either side. ``domain="extreme"`` scales everything by up to
    ``1e4`` (``4`` for float16)."""
    check_int("max_batch", max_batch, minimum=1)
    check_int("max_length", max_length, minimum=1)
    c = check_real("clip_range", clip_range, low=0.0, high=1e6)
    dt = check_dtype(dtype)
    check_choice("domain", domain, ("semantic", "extreme"))
    check_choice("padding", padding, ("garbage", "nan"))
    scales: tuple[float, ...] = (1.0,)
    if domain == "extreme":  # float16: a token-mean of squares stays below 65504
        scales = (1.0, 1e-2, 4.0) if dt is torch.float16 else (1.0, 1e-2, 1e2, 1e4)
    fractions = choice((0.0, 0.5, 1.0))

    def _draw(draw: st.DrawFn) -> ValueBatch:
        b = draw(ints(1, max_batch))
        ragged = draw(BOOLS)
        pad = draw(ints(0, 2))
        outside = draw(fractions)  # share of tokens outside the clip range
        scale = draw(choice(scales))
        seed = draw(ints(0, 2**32 - 1))
        gen = _gen(seed)
        lengths = (
            [int(x) for x in torch.randint(1, max_length + 1, (b,), generator=gen)]
            if ragged
            else [max_length] * b
        )
        mask = _lengths_mask(lengths, pad)
        shape = tuple(mask.shape)
        f64 = torch.float64
        old = torch.randn(shape, generator=gen, dtype=f64)
        sign = torch.where(torch.rand(shape, generator=gen, dtype=f64) < 0.5, -1.0, 1.0)
        far = torch.rand(shape, generator=gen, dtype=f64) < outside
        size = torch.rand(shape, generator=gen, dtype=f64)
        step = torch.where(far, (1.5 + 1.5 * size) * c, 0.5 * c * size) * sign
        ret = old + torch.randn(shape, generator=gen, dtype=f64) * 2 * c
        nan = padding == "nan"
        tensors = {
            "values": old + step,
            "old_values": old,
            "returns": ret,
        }
        out = {
            k: _garbage(mask, x * scale, seed + i, nan).to(dt)
            for i, (k, x) in enumerate(tensors.items())
        }
        return ValueBatch(response_mask=mask, **out)

    return composite(_draw)


@dataclasses.dataclass(frozen=True, eq=False)
class LogitBatch(_Literal):
    """Next-token ``logits [B, T, V]`` and a right-padded ``response_mask [B, T]``."""

    logits: torch.Tensor
    response_mask: torch.Tensor
    pattern: str = ""

    def describe(self) -> str:
        b, t, vocab = self.logits.shape
        kind = f", {self.pattern} logits" if self.pattern else ""
        return (
            f"B={b}, T={t}, V={vocab}, response lengths {_lengths(self.response_mask)}"
            f"{kind}, {str(self.logits.dtype).removeprefix('torch.')}"
        )


LOGIT_PATTERNS = ("normal", "peaked", "uniform", "large", "excluded")
"""``normal`` N(0, 2^2); ``peaked`` one logit 12 above the rest (entropy near 0);
``uniform`` all equal (entropy ``log V``); ``large`` offset ``+-1e4`` (needs the max
shift); ``excluded`` some vocabulary entries ``-inf``."""


def logit_batches(
    *,
    max_batch: int = 4,
    max_length: int = 8,
    min_vocab: int = 2,
    max_vocab: int = 16,
    patterns: tuple[str, ...] = LOGIT_PATTERNS,
    dtype: torch.dtype = torch.float64,
    padding: str = "garbage",
) -> st.SearchStrategy[LogitBatch]:
    """:class:`LogitBatch` es, one :data:`LOGIT_PATTERNS` entry per batch. Padding holds
    garbage logits (``+-1e4``-scale, or NaN)."""
    check_int("max_batch", max_batch, minimum=1)
    check_int("max_length", max_length, minimum=1)
    check_int("min_vocab", min_vocab, minimum=1)
    check_int("max_vocab", max_vocab, minimum=1)
    check_range("min_vocab", min_vocab, "max_vocab", max_vocab)
    dt = check_dtype(dtype)
    for p in patterns:
        check_choice("patterns", p, LOGIT_PATTERNS)
    check_choice("padding", padding, ("garbage", "nan"))
    pattern_choice = choice(tuple(patterns))

    def _draw(draw: st.DrawFn) -> LogitBatch:
        b = draw(ints(1, max_batch))
        vocab = draw(ints(min_vocab, max_vocab))
        pattern = draw(pattern_choice)
        ragged = draw(BOOLS)
        pad = draw(ints(0, 2))
        seed = draw(ints(0, 2**32 - 1))
        gen = _gen(seed)
        lengths = (
            [int(x) for x in torch.randint(1, max_length + 1, (b,), generator=gen)]
            if ragged
            else [max_length] * b
        )
        mask = _lengths_mask(lengths, pad)
        shape = (*mask.shape, vocab)
        f64 = torch.float64
        z = torch.randn(shape, generator=gen, dtype=f64) * 2.0
        if pattern == "peaked":
            top = torch.randint(0, vocab, mask.shape, generator=gen)
            z = z * 0.25 + 12.0 * torch.nn.functional.one_hot(top, vocab).to(f64)
        elif pattern == "uniform":
            z = torch.zeros(shape, dtype=f64) + 0.5
        elif pattern == "large":
            offset = torch.where(torch.rand(mask.shape, generator=gen) < 0.5, -1e4, 1e4)
            z = z + offset[:, :, None].to(f64)
        elif pattern == "excluded" and vocab > 1:
            drop = torch.rand(shape, generator=gen, dtype=f64) < 0.3
            drop[..., 0] = False  # one entry always stays
            z = torch.where(drop, -torch.inf, z)
        if padding == "nan":
            z = torch.where(mask[:, :, None], z, float("nan"))
        else:
            junk = (torch.rand(shape, generator=_gen(seed + 1), dtype=f64) - 0.5) * _GARBAGE
            z = torch.where(mask[:, :, None], z, junk)
        return LogitBatch(logits=z.to(dt), response_mask=mask, pattern=pattern)

    return composite(_draw)
