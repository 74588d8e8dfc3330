"""Words shared by the simulated and the real-process-group step (no imports: the rank
processes load this too)."""

from __future__ import annotations

__all__ = ["empty_hint"]


def empty_hint(micro_batch_tokens: int, rank_tokens: int) -> str:
    """The cause of a non-finite loss on a micro-batch without response tokens: a division
    by the micro-batch's (or the rank's) own token count, ``0 / 0`` there (NeMo-RL #212)."""
    if micro_batch_tokens:
        return ""
    if rank_tokens:
        where, whose = "", "the micro-batch's own token count"
    else:
        where, whose = " on its rank", "the micro-batch's or the rank's own token count (both 0)"
    return (
        f"; it is an empty micro-batch (0 response tokens{where}): the loss divides by {whose}, "
        "0/0 there (division by empty micro-batches, NeMo-RL #212); an empty micro-batch "
        "contributes a zero loss and gradient"
    )
