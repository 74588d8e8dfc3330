"""How the training-step kind executes a split: simulated, or on a real process group.

``distributed=None`` (the default) keeps the simulated accumulation: per-rank gradient sums
averaged over ranks, as an all-reduce MEAN does. ``distributed="ddp"`` / ``"fsdp"`` runs
every split with more than one rank on a real ``torch.distributed`` group of
``world_size`` ranks (:mod:`.distributed`), whose reducer does the averaging; a one-rank
split reduces nothing and stays simulated. A drawn split of another world size is folded
onto ``world_size`` ranks (:func:`fold`), so one pool of rank processes serves the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_polgrad.core.verdicts import Verdict
from pytest_polgrad.kinds.training_step._text import empty_hint
from pytest_polgrad.kinds.training_step.distributed import DistributedError, accumulate_distributed
from pytest_polgrad.strategies._splits import Split

__all__ = ["WORLD_SIZES", "empty_hint", "fold", "on_process_group", "run_distributed"]

WORLD_SIZES = (2, 4)
"""The process groups' sizes (``core.options.WORLD_SIZES``; two pools at most)."""


def fold(split: Split, world: int) -> Split:
    """``split`` on ``world`` ranks: rank ``r >= world``'s micro-batch ``k`` is appended to
    rank ``r mod world``'s micro-batch ``k`` (every row once, the accumulation steps and
    ``steps_per_generation`` kept). One-rank splits and splits of ``world`` ranks are
    returned as they are; a split of fewer ranks than ``world`` is folded onto the
    largest of :data:`WORLD_SIZES` it holds (3 ranks onto 2), so at most two pools run."""
    w = split.world_size
    if w == 1:
        return split
    world = max(n for n in WORLD_SIZES if n <= min(w, world))
    if w == world:
        return split
    k = split.gradient_accumulation_steps
    ranks = [[list(mb) for mb in split.ranks[r]] for r in range(world)]
    for r in range(world, w):
        for j in range(k):
            ranks[r % world][j] += list(split.ranks[r][j])
    return Split(
        tuple(tuple(tuple(mb) for mb in rank) for rank in ranks),
        steps_per_generation=split.steps_per_generation,
        outside_tokens=split.outside_tokens,
        outside_rows=split.outside_rows,
    )


def on_process_group(wrap: str | None, split: Split) -> bool:
    """Whether ``split`` runs on a real process group (``wrap`` set, more than one rank)."""
    return wrap is not None and split.world_size > 1


def run_distributed(
    ctx: Any, inputs: Mapping[str, Any], *, wrap: str, snapshot: bool = False
) -> Any:
    """:func:`.distributed.accumulate_distributed`, with a fault of the function on a rank
    (an exception, a bad return, a hang, a dead process) turned into the kit's
    :class:`Verdict`, naming the rank and the group. A :class:`LaunchError` (the
    environment could not start the ranks) propagates: it is no finding about the step."""
    split: Split = inputs["split"]
    try:
        return accumulate_distributed(ctx, inputs, wrap=wrap, snapshot=snapshot)
    except DistributedError as exc:
        who = "" if exc.rank is None else f", rank {exc.rank}"
        raise Verdict(
            f"on a real {wrap} process group ({split.world_size} ranks{who}): {exc}"
        ) from exc
