"""What the training-step checks share: one pool of steps, one accumulation per (step,
split), one oracle result per batch, one corpus.

Every check of the kind screens the same pooled :class:`StepBatch` items: a drawn batch
with one split of each family (:data:`FAMILY_SHAPES`). A split check runs its family's
split, the non-semantic checks the split of the family the item names (``shared``), so
every input of the pool is accumulated once per split and the masked-positions,
padding-values (first run) and deterministic (first run) checks reuse the accumulation of
the split check (:data:`~pytest_polgrad.core.kinds.SHARED_CALLS`, as the policy-loss
kind's checks share calls); inputs-unchanged's snapshot run is deterministic's second. The
reference depends on the batch only, not on the split: one oracle call per batch serves
every check and every function of one config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from hypothesis import strategies as st

from pytest_polgrad.core.kinds import SHARED_CALLS, CallStore, remember
from pytest_polgrad.kinds.policy_loss.kind import SEARCH_ROWS, SEARCH_TOKENS, realistic_batches
from pytest_polgrad.strategies import batches
from pytest_polgrad.strategies._cache import choice
from pytest_polgrad.strategies._sample import composite, sample
from pytest_polgrad.strategies._splits import SPLIT_FAMILIES, Split, splits

if TYPE_CHECKING:
    from pytest_polgrad.kinds.policy_loss.oracle import Oracle, OracleResult


def drawn_batches(
    ctx: Any, max_batch: int, max_length: int | None = None
) -> st.SearchStrategy[Any]:
    """The batches a training step is drawn on: the step's options and reference decide
    the dtype, shapes (``max_length``: the options' by default), advantages, clip and which
    optional logprobs are drawn."""
    cfg = ctx.policy
    return batches(
        min_batch=1,
        max_batch=max_batch,
        max_length=ctx.options.max_length if max_length is None else max_length,
        dtype=ctx.tolerance.input_dtype,
        advantage_shape=ctx.options.advantages,
        clip=cfg.clip,
        with_ref_logprobs=cfg.kl_in_loss,
        with_rollout_logprobs=cfg.is_correction is not None,
        with_rewards=False,
        padding="nan" if ctx.options.padding_nan else "garbage",
    )


def search_bounds(options: Any) -> tuple[int, int]:
    """Rows and tokens of the drawn steps: the policy loss's search sizes (at most 8 x 256,
    capped by ``max_batch`` / ``max_length``); the realistic sizes come as extra steps
    (:func:`realistic_steps`), as in the policy-loss pool."""
    return min(SEARCH_ROWS, options.max_batch), min(SEARCH_TOKENS, options.max_length)


def realistic_steps(
    ctx: Any, seed: int, *, world: int | None, fold: Callable[[Split, int], Split]
) -> list[StepBatch]:
    """The policy-loss pool's realistic-size batches (``REALISTIC_SIZES``: 64 x 384 and
    9 x 4096, capped by ``max_batch`` / ``max_length``; float16 smaller), each with one split
    of every family drawn under ``seed`` (:func:`family_splits`)."""
    cfg, options = ctx.policy, ctx.options
    shape = {
        "dtype": ctx.tolerance.input_dtype,
        "domain": "semantic",
        "max_log_ratio": None,
        "clip": cfg.clip,
        "advantage_shape": options.advantages,
        "with_ref_logprobs": cfg.kl_in_loss,
        "with_rollout_logprobs": cfg.is_correction is not None,
        "holes": False,
        "padding": "nan" if options.padding_nan else "garbage",
    }
    found = [b.as_kwargs() for b in realistic_batches(shape, options, seed)]

    def _all(draw: st.DrawFn) -> list[StepBatch]:
        return [with_splits(draw, tensors, world=world, fold=fold) for tensors in found]

    (steps,) = sample(composite(_all), seed, 1)
    return steps


__all__ = [
    "FAMILY_SHAPES",
    "StepBatch",
    "cached_corpus",
    "expected",
    "family_splits",
    "keep_fresh",
    "realistic_steps",
    "reuse",
    "search_bounds",
    "take_fresh",
    "with_splits",
]

FAMILY_SHAPES: dict[str, tuple[int, int]] = {
    "full-batch": (1, 1),
    "micro-batches": (1, 4),
    "data-parallel": (4, 2),
    "generation-steps": (2, 4),
}
"""``family: (max ranks, max micro-batches per rank)`` of the drawn splits (simulated; on a
real process group the ranks go up to ``world_size``). Every scaling bug of the suite shows
with two micro-batches of unequal token counts, two ranks of unequal token counts, or
``steps_per_generation != gradient_accumulation_steps``; more micro-batches only add calls
(docs/engine.md, "The training step's splits")."""

_NEED = {"full-batch": 1, "micro-batches": 2, "data-parallel": 2, "generation-steps": 1}


@dataclasses.dataclass(frozen=True, eq=False)
class StepBatch:
    """One pooled batch (canonical tensors) and its split of each family it has rows for;
    ``shared`` names the family whose split the non-semantic checks run."""

    batch: Mapping[str, torch.Tensor]
    splits: Mapping[str, Split]
    shared: str

    def split_for(self, family: str | None) -> Split:
        """The split of ``family`` (None: ``shared``'s); the full-batch split when the
        batch has too few rows for it (the family's check then skips the step)."""
        return self.splits.get(self.shared if family is None else family, self.splits["full-batch"])

    def as_kwargs(self) -> dict[str, Any]:
        return {**self.batch, "split": self.split_for(None)}

    def to_snippet(self) -> str:  # pragma: no cover - checks see the prepared StepInputs
        raise NotImplementedError("a StepBatch is prepared into a StepInputs before a check")

    def describe(self) -> str:
        mask = self.batch["response_mask"]
        return f"B={mask.shape[0]}, T={mask.shape[1]}, {len(self.splits)} splits"


def family_splits(
    draw: st.DrawFn, lengths: list[int], *, world: int | None
) -> tuple[dict[str, Split], str]:
    """One split of each family the rows allow (:data:`FAMILY_SHAPES`; ``world``: the real
    process group's size, which bounds the ranks instead), and the shared family."""
    out: dict[str, Split] = {}
    for family in SPLIT_FAMILIES:
        if len(lengths) < _NEED[family]:
            continue
        ranks, micro = FAMILY_SHAPES[family]
        if world is not None and ranks > 1:
            ranks = world
        out[family] = draw(splits(lengths, family=family, max_ranks=ranks, max_micro_batches=micro))
    shared = draw(choice(tuple(out)))
    return out, shared


def step_batches(
    drawn: st.SearchStrategy[Any], *, world: int | None, fold: Callable[[Split, int], Split]
) -> st.SearchStrategy[StepBatch]:
    """Pooled steps: a batch of ``drawn`` and :func:`family_splits` (folded onto ``world``
    ranks on a real process group)."""

    def _steps(draw: st.DrawFn) -> StepBatch:
        return with_splits(draw, draw(drawn).as_kwargs(), world=world, fold=fold)

    return composite(_steps)


def with_splits(
    draw: st.DrawFn,
    tensors: dict[str, torch.Tensor],
    *,
    world: int | None,
    fold: Callable[[Split, int], Split],
) -> StepBatch:
    """``tensors`` with :func:`family_splits` drawn for their rows (folded onto ``world``
    ranks on a real process group)."""
    lengths = tensors["response_mask"].sum(dim=1).tolist()
    found, shared = family_splits(draw, lengths, world=world)
    if world is not None:
        found = {f: fold(s, world) for f, s in found.items()}
    return StepBatch(tensors, found, shared)


# ---- one accumulation per (function, step, split) ---------------------------------------


def _key(
    ctx: Any, inputs: Mapping[str, Any], tag: str
) -> tuple[tuple[Hashable, ...], tuple[torch.Tensor, ...]]:
    tensors = tuple(v for _, v in sorted(inputs.items()) if isinstance(v, torch.Tensor))
    key = (tag, id(ctx.fn), ctx.options_key, inputs["split"], *map(id, tensors))
    return key, tensors


A = TypeVar("A")


def reuse(ctx: Any, inputs: Mapping[str, Any], make: Callable[[], A]) -> A:
    """``make()`` (the accumulation of ``inputs``' split), once per function, options and
    step while the engine screens with a store; afresh without one (search, shrinking,
    re-runs). An entry goes when a batch tensor is freed."""
    store = SHARED_CALLS.get()
    if store is None:
        return make()
    key, tensors = _key(ctx, inputs, "step")
    hit = store.get(key)
    if hit is not None and hit[0] is ctx.fn:
        found: A = hit[1]
        return found
    made = make()
    remember(store, key, (ctx.fn, made), tensors)
    return made


def keep_fresh(ctx: Any, inputs: Mapping[str, Any], acc: object) -> None:
    """Keep a second, separate accumulation (inputs-unchanged's) for :func:`take_fresh`."""
    store = SHARED_CALLS.get()
    if store is not None:
        key, tensors = _key(ctx, inputs, "fresh")
        remember(store, key, (ctx.fn, acc), tensors)


def take_fresh(ctx: Any, inputs: Mapping[str, Any]) -> Any:
    """The accumulation :func:`keep_fresh` kept for this step (None if none)."""
    store = SHARED_CALLS.get()
    if store is None:
        return None
    hit = store.pop(_key(ctx, inputs, "fresh")[0], None)
    return hit[1] if hit is not None and hit[0] is ctx.fn else None


# ---- one oracle result per (config, kink band, batch) -----------------------------------

_ORACLE = CallStore()
_CONFIG_KEYS = CallStore()


def _config_key(oracle: Oracle) -> str:
    key = (id(oracle),)
    hit: str | None = _CONFIG_KEYS.get(key)
    if hit is None:
        hit = repr(oracle.config)
        remember(_CONFIG_KEYS, key, hit, (oracle,))
    return hit


def expected(oracle: Oracle, batch: Mapping[str, Any], kink_eps: float) -> OracleResult:
    """``oracle`` on ``batch``'s tensors (the split plays no part), cached while they live:
    the reference of the whole step is the same for every split, check and function."""
    tensors = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
    owners = tuple(tensors[k] for k in sorted(tensors))
    key = (_config_key(oracle), kink_eps, *map(id, owners))
    hit: OracleResult | None = _ORACLE.get(key)
    if hit is None:
        # the step is judged on the conservative scales only: no native-precision fields
        hit = oracle(tensors, kink_eps=kink_eps, native=False)
        remember(_ORACLE, key, hit, owners)
    return hit


# ---- the corpus, built once per dtype and advantage shape -------------------------------

_CORPUS: dict[tuple[Hashable, ...], dict[str, Any]] = {}


def cached_corpus(key: tuple[Hashable, ...], build: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``build()`` once per ``key``: every check and function screens the same corpus
    tensors, so their accumulations and oracle results are shared too."""
    if key not in _CORPUS:
        _CORPUS[key] = build()
    return _CORPUS[key]
