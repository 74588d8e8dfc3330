"""How a trainer splits one optimizer step: data-parallel ranks, micro-batches, generation.

A :class:`Split` deals the rows of one optimizer step (the full batch, ``B`` rows) to
``world_size`` ranks, each running ``gradient_accumulation_steps`` micro-batches, and says
how the step sits in its generation batch (``steps_per_generation``, TRL's name: the
rollout batch is generated once and consumed over that many micro-steps). :func:`splits`
draws them; :meth:`Split.infos` gives, per micro-batch, the counts a trainer has at hand
(:class:`StepInfo`). Facts behind the shapes drawn: verl issues #5625/#5641 (sample-count
scale factors), SkyRL #925 (mean of micro-batch means), TRL #6024 (steps_per_generation !=
gradient_accumulation_steps), ms-swift #10116 (accumulation division applied twice).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from ._cache import choice, ints, permutations, subsets
from ._sample import composite
from ._validate import check_choice, check_int

__all__ = ["SPLIT_FAMILIES", "Split", "StepInfo", "splits"]

SPLIT_FAMILIES = ("full-batch", "micro-batches", "data-parallel", "generation-steps")
"""``full-batch``: one rank, one micro-batch. ``micro-batches``: one rank, several
micro-batches. ``data-parallel``: several ranks (each with one or more micro-batches).
``generation-steps``: ``steps_per_generation != gradient_accumulation_steps``."""


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """What a trainer knows when it computes one micro-batch's loss.

    Token counts are response tokens (``response_mask.sum()``), row counts are sequences.
    ``global_*`` cover the whole optimizer step on every rank (verl's ``batch_num_tokens``
    / ``global_batch_size`` after their all-reduce, verl 0.9.1
    ``workers/engine/fsdp/transformer_impl.py``); ``rank_*`` this rank's share of it;
    ``generation_*`` the generation batch this micro-batch was cut from, on every rank
    (TRL 1.16.0 ``num_items_in_batch``, ``grpo_trainer.py``).
    """

    rank: int
    world_size: int
    micro_batch: int
    gradient_accumulation_steps: int
    steps_per_generation: int
    rows: tuple[int, ...]
    """Row indices of this micro-batch in the full batch."""
    micro_batch_tokens: int
    micro_batch_rows: int
    rank_tokens: int
    rank_rows: int
    global_tokens: int
    global_rows: int
    generation_tokens: int
    generation_rows: int


@dataclasses.dataclass(frozen=True)
class Split:
    """``ranks[r][k]``: the row indices of micro-batch ``k`` on rank ``r``.

    Every rank runs the same number of micro-batches (a backward per micro-step, as
    data-parallel training requires); every row of the step appears exactly once. A
    micro-batch may be empty (``()``: no rows, no response tokens), and so may every
    micro-batch of a rank: data loaders that drop or pack samples make them (NeMo-RL #212),
    and the rank still runs its backward so the all-reduce completes. An empty
    micro-batch contributes nothing to the step's gradient.
    ``steps_per_generation`` (default: the number of micro-batches) divides or is a
    multiple of ``gradient_accumulation_steps``. When it is a multiple, the generation batch
    also holds the next optimizer steps' rows: ``outside_tokens`` / ``outside_rows`` count
    them (all ranks).
    """

    ranks: tuple[tuple[tuple[int, ...], ...], ...]
    steps_per_generation: int | None = None
    outside_tokens: int = 0
    outside_rows: int = 0

    def __post_init__(self) -> None:
        ranks = tuple(tuple(tuple(int(i) for i in mb) for mb in rank) for rank in self.ranks)
        object.__setattr__(self, "ranks", ranks)
        if not ranks or not ranks[0]:
            raise ValueError("Split.ranks must hold at least one rank with one micro-batch")
        counts = {len(rank) for rank in ranks}
        if len(counts) != 1:
            raise ValueError(
                "every rank must run the same number of micro-batches, got "
                f"{[len(r) for r in ranks]}"
            )
        rows = sorted(i for rank in ranks for mb in rank for i in mb)
        if not rows:
            raise ValueError("Split.ranks must hold at least one row; every micro-batch is empty")
        if rows != list(range(len(rows))):
            raise ValueError(f"Split must cover rows 0..B-1 exactly once, got rows {rows}")
        g = self.gradient_accumulation_steps
        s = g if self.steps_per_generation is None else self.steps_per_generation
        if isinstance(s, bool) or not isinstance(s, int) or s < 1 or (s % g and g % s):
            raise ValueError(
                f"steps_per_generation must be a positive divisor or multiple of "
                f"gradient_accumulation_steps={g}, got {self.steps_per_generation!r}"
            )
        object.__setattr__(self, "steps_per_generation", s)
        for name in ("outside_tokens", "outside_rows"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"Split.{name} must be an int >= 0, got {v!r}")
        if s <= g and (self.outside_tokens or self.outside_rows):
            raise ValueError("outside_tokens/outside_rows need steps_per_generation > accumulation")

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def gradient_accumulation_steps(self) -> int:
        return len(self.ranks[0])

    @property
    def batch_size(self) -> int:
        return sum(len(mb) for rank in self.ranks for mb in rank)

    @property
    def family(self) -> str:
        """The first of :data:`SPLIT_FAMILIES` (from the end) that this split belongs to."""
        if self.steps_per_generation != self.gradient_accumulation_steps:
            return "generation-steps"
        if self.world_size > 1:
            return "data-parallel"
        return "micro-batches" if self.gradient_accumulation_steps > 1 else "full-batch"

    def infos(self, response_mask: torch.Tensor) -> list[list[StepInfo]]:
        """``infos(mask)[r][k]``: the :class:`StepInfo` of micro-batch ``k`` on rank ``r``."""
        if response_mask.dim() != 2 or response_mask.shape[0] != self.batch_size:
            raise ValueError(
                f"response_mask must be [B, T] with B = {self.batch_size} rows for this split, "
                f"got shape {list(response_mask.shape)}"
            )
        lengths = response_mask.sum(dim=1).tolist()

        def tokens(rows: Sequence[int]) -> int:
            return int(sum(lengths[i] for i in rows))

        g, s, w = self.gradient_accumulation_steps, self.steps_per_generation, self.world_size
        assert s is not None
        total = tokens(range(self.batch_size))

        def generation(k: int) -> tuple[int, int]:
            if s >= g:
                return total + self.outside_tokens, self.batch_size + self.outside_rows
            block = range((k // s) * s, (k // s) * s + s)
            mbs = [self.ranks[r][j] for r in range(w) for j in block]
            return sum(tokens(mb) for mb in mbs), sum(len(mb) for mb in mbs)

        out = []
        for r, rank in enumerate(self.ranks):
            rank_rows = [i for mb in rank for i in mb]
            row = []
            for k, mb in enumerate(rank):
                gen_tokens, gen_rows = generation(k)
                row.append(
                    StepInfo(
                        rank=r,
                        world_size=w,
                        micro_batch=k,
                        gradient_accumulation_steps=g,
                        steps_per_generation=s,
                        rows=mb,
                        micro_batch_tokens=tokens(mb),
                        micro_batch_rows=len(mb),
                        rank_tokens=tokens(rank_rows),
                        rank_rows=len(rank_rows),
                        global_tokens=total,
                        global_rows=self.batch_size,
                        generation_tokens=gen_tokens,
                        generation_rows=gen_rows,
                    )
                )
            out.append(row)
        return out

    def describe(self) -> str:
        """One line, e.g. ``2 ranks x 2 micro-batches: rank 0 [0 | 1], rank 1 [2, 3 | 4]``
        (an empty micro-batch is ``(empty)``)."""
        ranks = ", ".join(
            f"rank {r} ["
            + " | ".join(", ".join(map(str, mb)) if mb else "(empty)" for mb in rank)
            + "]"
            for r, rank in enumerate(self.ranks)
        )
        g = self.gradient_accumulation_steps
        head = f"{self.world_size} rank(s) x {g} micro-batch(es) of rows: {ranks}"
        if self.steps_per_generation != g:
            head += f"; steps_per_generation={self.steps_per_generation}"
            if self.outside_rows or self.outside_tokens:
                head += (
                    f" (the generation batch also holds {self.outside_rows} rows / "
                    f"{self.outside_tokens} tokens of later optimizer steps)"
                )
        return head

    def to_python(self) -> str:
        """Python that rebuilds this split (for report snippets)."""
        args = [f"ranks={self.ranks!r}"]
        if self.steps_per_generation != self.gradient_accumulation_steps:
            args.append(f"steps_per_generation={self.steps_per_generation}")
        if self.outside_tokens or self.outside_rows:
            args += [f"outside_tokens={self.outside_tokens}", f"outside_rows={self.outside_rows}"]
        return "Split(" + ", ".join(args) + ")"


def _cut(draw: st.DrawFn, n: int, parts: int, even: bool) -> list[int]:
    """Sizes (each >= 1) of ``parts`` consecutive chunks of ``n`` items."""
    if parts == 1:
        return [n]
    if even or parts == n:
        return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]
    cuts = sorted(draw(subsets(1, n - 1, parts - 1)))
    bounds = [0, *cuts, n]
    return [bounds[i + 1] - bounds[i] for i in range(parts)]


def splits(
    lengths: Sequence[int],
    *,
    family: str | None = None,
    max_ranks: int = 4,
    max_micro_batches: int = 8,
    empty: bool = False,
) -> st.SearchStrategy[Split]:
    """Splits of a step whose rows have response ``lengths`` (one int per row).

    Draws the world size and the number of micro-batches, then how rows are ordered before
    they are cut (as given, sorted by length, so that micro-batches of only short rows sit
    next to ones of only long rows, or shuffled) and where (even sizes, uneven sizes, or one
    row per micro-batch); with ``family='generation-steps'`` also ``steps_per_generation``
    (half, double or four times the accumulation steps) and the later steps' share of the
    generation batch. ``family`` (one of :data:`SPLIT_FAMILIES`) restricts the draw; None
    draws any. Shrinks towards one rank, few micro-batches, rows in order, even cuts.

    ``empty=True`` (family ``micro-batches``, ``data-parallel`` or None) also leaves
    micro-batches empty: one micro-batch of the step, or every micro-batch of one rank (a
    rank with no response tokens), more where the rows are too few for the others. Off by
    default, so the pools drawn without it are as before.
    """
    rows = len(lengths)
    check_int("len(lengths)", rows, minimum=1)
    check_int("max_ranks", max_ranks, minimum=1)
    check_int("max_micro_batches", max_micro_batches, minimum=1)
    check_choice("family", family, SPLIT_FAMILIES, optional=True)
    need = {"full-batch": 1, "micro-batches": 2, "data-parallel": 2, "generation-steps": 1}
    if family is not None and rows < need[family] and not empty:  # empty: one row will do
        raise InvalidArgument(f"family={family!r} needs at least {need[family]} rows, got {rows}")
    if family == "data-parallel" and max_ranks < 2:
        raise InvalidArgument("family='data-parallel' needs max_ranks >= 2")
    if family == "micro-batches" and max_micro_batches < 2:
        raise InvalidArgument("family='micro-batches' needs max_micro_batches >= 2")
    if not isinstance(empty, bool):
        raise InvalidArgument(f"empty must be a bool, got {empty!r}")
    if empty and family not in (None, "micro-batches", "data-parallel"):
        raise InvalidArgument(
            f"empty=True draws micro-batches or data-parallel splits, not family={family!r}"
        )
    if empty and rows < 2 and max_ranks < 2 and max_micro_batches < 2:
        raise InvalidArgument("empty=True needs room for two micro-batches (or two ranks)")
    lens = [int(n) for n in lengths]

    def _splits(draw: st.DrawFn) -> Split:
        if empty:
            return _with_empty(draw, lens, family, max_ranks, max_micro_batches)
        fam = family if family is not None else draw(choice(_families(rows)))
        if fam == "full-batch":
            w, k = 1, 1
        elif fam == "micro-batches":
            w, k = 1, draw(ints(2, min(max_micro_batches, rows)))
        elif fam == "data-parallel":
            w = draw(ints(2, min(max_ranks, rows)))
            k = draw(ints(1, max(1, min(max_micro_batches, rows // w))))
        else:
            w = draw(ints(1, min(max_ranks, rows)))
            k = draw(ints(1, max(1, min(max_micro_batches, rows // w))))
        cut = draw(choice(("even", "uneven", "single")))
        if cut == "single" and fam != "full-batch" and rows % w == 0:
            k = max(k, min(rows // w, max_micro_batches))  # one row each where it fits
        order = draw(choice(("given", "sorted", "shuffled")))
        idx = list(range(rows))
        if order == "sorted":
            idx.sort(key=lambda i: (lens[i], i))
        elif order == "shuffled":
            idx = list(draw(permutations(tuple(idx))))
        parts = w * k
        if cut == "single" and rows == parts:
            sizes = [1] * parts
        else:
            sizes = _cut(draw, rows, parts, even=cut != "uneven")
        chunks, start = [], 0
        for size in sizes:
            chunks.append(tuple(idx[start : start + size]))
            start += size
        ranks = tuple(tuple(chunks[r * k : (r + 1) * k]) for r in range(w))
        if fam != "generation-steps":
            return Split(ranks)
        options = [s for s in (2 * k, 4 * k) if s <= 16] + ([k // 2] if k % 2 == 0 else [])
        s = draw(choice(tuple(options)))
        if s <= k:
            return Split(ranks, steps_per_generation=s)
        later = s // k - 1
        extra_rows = later * rows
        extra_tokens = draw(ints(extra_rows, max(extra_rows, later * sum(lens) * 2)))
        return Split(ranks, s, outside_tokens=extra_tokens, outside_rows=extra_rows)

    return composite(_splits)


def _with_empty(
    draw: st.DrawFn, lens: list[int], family: str | None, max_ranks: int, max_mb: int
) -> Split:
    """A micro-batches or data-parallel split with empty micro-batches (see :func:`splits`)."""
    rows = len(lens)
    families = ("micro-batches", "data-parallel") if max_ranks >= 2 else ("micro-batches",)
    if max_mb < 2:
        families = ("data-parallel",)
    fam = family if family is not None else draw(choice(families))
    w = 1 if fam == "micro-batches" else draw(ints(2, max_ranks))
    k = draw(ints(2 if w == 1 else 1, max(2 if w == 1 else 1, min(max_mb, rows // w + 1))))
    parts = w * k
    whole_rank = w > 1 and draw(choice(("micro-batch", "rank"))) == "rank"
    if whole_rank:
        r = draw(ints(0, w - 1))
        empties = set(range(r * k, r * k + k))
    else:
        empties = {draw(ints(0, parts - 1))}
    for p in range(parts - 1, -1, -1):  # too few rows for the other micro-batches
        if parts - len(empties) <= rows:
            break
        empties.add(p)
    order = draw(choice(("given", "sorted", "shuffled")))
    idx = list(range(rows))
    if order == "sorted":
        idx.sort(key=lambda i: (lens[i], i))
    elif order == "shuffled":
        idx = list(draw(permutations(tuple(idx))))
    full = parts - len(empties)
    sizes = iter(_cut(draw, rows, full, even=draw(choice((True, False)))))
    chunks, start = [], 0
    for p in range(parts):
        size = 0 if p in empties else next(sizes)
        chunks.append(tuple(idx[start : start + size]))
        start += size
    return Split(tuple(tuple(chunks[r * k : (r + 1) * k]) for r in range(w)))


def _families(rows: int) -> tuple[str, ...]:
    return SPLIT_FAMILIES if rows >= 2 else ("full-batch", "generation-steps")
