"""Sizes, row lengths and response masks: the structure Hypothesis decides and shrinks.

Sizes come from *classes* (exactly the minimum, up to 4, up to 16, up to 64, above), so a
default budget of 100 examples sees B = 1, one-token rows and T > 64 alike, and shrinking
walks to the first class: the minimum. Row lengths follow a *pattern* (all equal, ragged,
or the two extremes side by side); "all equal" comes first, so lengths shrink toward equal.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections.abc import Sequence
from typing import Literal

import torch
from hypothesis import strategies as st

from ._cache import BOOLS, binary, choice, ints
from ._layout import right_to_left
from ._sample import composite
from ._validate import check_bool, check_choice, check_int, check_range

__all__ = [
    "Hole",
    "Positions",
    "build_mask",
    "build_masks",
    "draw_choices",
    "draw_extents",
    "draw_holes",
    "draw_size",
    "draw_width",
    "lengths",
    "own",
    "response_masks",
    "valid_positions",
]

Hole = tuple[int, int, int]
"""``(row, start, stop)``: columns ``[start, stop)`` of ``row`` are masked out."""

_CLASS_EDGES = (4, 16, 64)


def draw_choices(draw: st.DrawFn, n: int, k: int) -> list[int]:
    """``n`` indices in ``[0, k)`` from a single Hypothesis ``bytes`` draw.

    One draw instead of ``n`` keeps per-row structure cheap at B = 64; the bytes shrink
    toward zero, so every index shrinks toward 0 (the first, simplest choice).
    """
    if n <= 0 or k <= 1:
        return [0] * max(n, 0)
    width = 1 if k <= 256 else 2 if k <= 65536 else 4
    raw = draw(binary(n * width))
    return [int.from_bytes(raw[i * width : (i + 1) * width], "big") % k for i in range(n)]


@functools.lru_cache(maxsize=1024)
def _size_classes(lo: int, hi: int) -> tuple[tuple[int, int], ...]:
    """Size classes of ``[lo, hi]`` (exactly ``lo``, up to 4, up to 16, up to 64, above),
    class ``k`` repeated ``k**2`` times (the minimum once), in increasing order.

    Hypothesis tries the all-minimal example first anyway, and a run of 100 examples
    holds only a few dozen independent structures (its mutations reuse the rest), so the
    larger classes need the weight.
    """
    classes: list[tuple[int, int]] = [(lo, lo)]
    start = lo + 1
    for edge in (*_CLASS_EDGES, hi):
        stop = min(edge, hi)
        if start <= stop:
            classes.append((start, stop))
            start = stop + 1
    return tuple(c for k, c in enumerate(classes) for _ in range(max(k * k, 1)))


def draw_size(draw: st.DrawFn, lo: int, hi: int) -> int:
    """An int in ``[lo, hi]``, weighted by size class: a small uniform index over the
    increasing classes, then an offset from the class's start. Shrinking either draw
    shrinks the size, down to ``lo``."""
    if lo == hi:
        return lo
    classes = _size_classes(lo, hi)
    a, b = classes[draw(ints(0, len(classes) - 1))]
    return a if a == b else a + int(draw(ints(0, b - a)))


Pattern = Literal["equal", "ragged", "extremes"]
_PATTERNS: st.SearchStrategy[Pattern] = choice(("equal", "ragged", "ragged", "extremes"))


def draw_extents(draw: st.DrawFn, batch_size: int, lo: int, hi: int) -> tuple[int, ...]:
    """Row extents in ``[lo, hi]``: all equal, ragged, or the two extremes side by side.

    Ragged batches of two or more rows always hold a shortest and a longest row (and
    each other row is one of those a quarter of the time), so a one-token row next to a
    long one is common, not a coincidence.
    """
    cap = draw_size(draw, lo, hi)
    pattern: Pattern = draw(
        _PATTERNS
    )  # drawn even when moot: stable choice sequences shrink better
    if pattern == "equal" or cap == lo:
        return (cap,) * batch_size
    if pattern == "ragged":
        span = cap - lo + 1
        picks = draw_choices(draw, batch_size, 4 * span)
        rows = [lo if v % 4 == 1 else cap if v % 4 == 2 else lo + v // 4 for v in picks]
        if batch_size > 1:  # the shortest and the longest row are always there
            short = picks[0] % batch_size
            rows[short] = lo
            rows[(short + 1 + picks[1] % (batch_size - 1)) % batch_size] = cap
        return tuple(rows)
    # extremes: the first row is as short as allowed, the last as long, the rest either.
    rows = [lo] + [cap if i else lo for i in draw_choices(draw, batch_size - 2, 2)]
    return tuple([*rows, cap] if batch_size > 1 else [cap])


def draw_width(draw: st.DrawFn, extents: tuple[int, ...], max_width: int) -> int:
    """``max(extents)`` plus, sometimes, a few all-padding columns (never past max_width)."""
    longest = max(extents)
    room = min(max_width - longest, 8)
    if room <= 0 or not draw(BOOLS):
        return longest
    return longest + draw(ints(1, room))


def draw_holes(draw: st.DrawFn, extents: tuple[int, ...]) -> tuple[Hole, ...]:
    """Interior holes: up to two masked spans per row, never at the row's ends.

    A row's first and last positions stay response tokens, so its extent (and with it
    every layout conversion) is recoverable from the mask alone.
    """
    holes: list[Hole] = []
    for row, extent in enumerate(extents):
        if extent < 3:
            continue
        for _ in range(draw(ints(0, 2))):
            start = draw(ints(1, extent - 2))
            stop = draw(ints(start + 1, extent - 1))
            holes.append((row, start, stop))
    return tuple(holes)


def build_mask(extents: tuple[int, ...], width: int, holes: tuple[Hole, ...] = ()) -> torch.Tensor:
    """Right-padded ``[B, width]`` bool mask from extents and holes."""
    return build_masks([(extents, width, holes)])[0]


def build_masks(
    layouts: Sequence[tuple[tuple[int, ...], int, tuple[Hole, ...]]],
) -> list[torch.Tensor]:
    """:func:`build_mask` of each ``(extents, width, holes)``: every row of every mask
    compared with its extent in one operation, then copied out (:func:`own`)."""
    widths = [width for extents, width, _ in layouts for _ in extents]
    sizes = [len(extents) * width for extents, width, _ in layouts]
    row_width = torch.tensor(widths, dtype=torch.int64)
    row_start = row_width.cumsum(0) - row_width
    column = torch.arange(sum(sizes)) - row_start.repeat_interleave(row_width)
    extent = torch.tensor([e for extents, _, _ in layouts for e in extents], dtype=torch.int64)
    mask = column < extent.repeat_interleave(row_width)
    holed: list[int] = []
    start = 0
    for extents, width, holes in layouts:
        holed += [start + r * width + c for r, a, b in holes for c in range(a, b)]
        start += len(extents) * width
    if holed:
        mask[torch.tensor(holed, dtype=torch.int64)] = False
    pieces = mask.split_with_sizes(sizes)
    shared = len(layouts) > 1
    return [own(m.view(len(e), w), shared) for m, (e, w, _) in zip(pieces, layouts, strict=True)]


def own(piece: torch.Tensor, shared: bool) -> torch.Tensor:
    """``piece`` of a buffer, with a storage of its own when the buffer is ``shared`` with
    other batches: a batch's tensors never share memory, a version counter or a
    ``torch.save`` file with another batch's."""
    return piece.clone() if shared else piece


def valid_positions(extent: int, row: int, holes: tuple[Hole, ...]) -> list[int]:
    """Columns of ``row`` that hold response tokens."""
    spans = [(a, b) for r, a, b in holes if r == row]
    if not spans:
        return list(range(extent))
    return [t for t in range(extent) if not any(a <= t < b for a, b in spans)]


class Positions:
    """Response-token positions of a right-padded batch, addressable by one flat index."""

    def __init__(self, extents: tuple[int, ...], holes: tuple[Hole, ...]) -> None:
        self._extents = extents
        self._holes = holes
        self._holed = {r for r, _, _ in holes}
        counts = [
            len(valid_positions(e, r, holes)) if r in self._holed else e
            for r, e in enumerate(extents)
        ]
        self.starts = [0, *itertools.accumulate(counts)]
        self.total = self.starts[-1]

    def locate(self, index: int) -> tuple[int, int]:
        """``(row, col)`` of the ``index``-th response token in row-major order."""
        row = bisect.bisect_right(self.starts, index) - 1
        offset = index - self.starts[row]
        if row in self._holed:
            return row, valid_positions(self._extents[row], row, self._holes)[offset]
        return row, offset


def _check_sizes(min_batch: int, max_batch: int, min_length: int, max_length: int) -> None:
    check_int("min_batch", min_batch, minimum=1)
    check_int("max_batch", max_batch, minimum=1)
    check_range("min_batch", min_batch, "max_batch", max_batch)
    check_int("min_length", min_length, minimum=1)
    check_int("max_length", max_length, minimum=1)
    check_range("min_length", min_length, "max_length", max_length)


def lengths(
    *, min_batch: int = 1, max_batch: int = 8, min_length: int = 1, max_length: int = 256
) -> st.SearchStrategy[tuple[int, ...]]:
    """Row lengths (response tokens per row) of a batch of ``min_batch..max_batch`` rows.

    Every length lies in ``[min_length, max_length]``. Patterns: all equal, ragged, or the
    shortest and longest allowed rows side by side. Shrinks to ``(min_length,)``.
    """
    _check_sizes(min_batch, max_batch, min_length, max_length)

    def _lengths(draw: st.DrawFn) -> tuple[int, ...]:
        batch = draw_size(draw, min_batch, max_batch)
        return draw_extents(draw, batch, min_length, max_length)

    return composite(_lengths)


def response_masks(
    *,
    min_batch: int = 1,
    max_batch: int = 8,
    min_length: int = 1,
    max_length: int = 256,
    layout: Literal["right", "left"] = "right",
    holes: bool = False,
) -> st.SearchStrategy[torch.Tensor]:
    """``torch.bool`` masks ``[B, T]``, right- or left-padded, optionally with holes.

    Every row holds at least one response token; with ``holes=True`` rows of three or more
    tokens may have masked spans strictly inside them (tool outputs in multi-turn data).
    ``T`` is the longest row plus, sometimes, a few all-padding columns, at most
    ``max_length``. For packed rows use :func:`batches` with ``layout="packed"``.
    """
    _check_sizes(min_batch, max_batch, min_length, max_length)
    check_choice("layout", layout, ("right", "left"))
    check_bool("holes", holes)

    def _masks(draw: st.DrawFn) -> torch.Tensor:
        batch = draw_size(draw, min_batch, max_batch)
        extents = draw_extents(draw, batch, min_length, max_length)
        width = draw_width(draw, extents, max_length)
        spans = draw_holes(draw, extents) if holes else ()
        mask = build_mask(extents, width, spans)
        if layout == "left":
            mask = right_to_left(mask, torch.tensor(extents, dtype=torch.int64))
        return mask

    return composite(_masks)
