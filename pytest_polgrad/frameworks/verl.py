"""Adapters for verl 0.9.1 (``verl.trainer.ppo.core_algos``) in the kit's conventions.

Each adapter takes keyword tensors ``[B, T]`` right-padded with a bool ``response_mask``
and calls the installed verl function unchanged; the only translations are the ones a verl
trainer performs itself (an ``ActorConfig`` built with the options named, token-level
advantages). verl is imported on the first call, never at import time.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from typing import Any

import torch

from pytest_polgrad.frameworks._adapt import require_installed

__all__ = [
    "ACTOR_REQUIRED",
    "POLICY_LOSS_MODES",
    "actor_config",
    "agg_loss",
    "compute_advantage",
    "entropy",
    "kl_penalty",
    "logprobs",
    "logprobs_rmpad",
    "policy_loss",
    "training_step",
    "value_loss",
]

Tensor = torch.Tensor

POLICY_LOSS_MODES = (
    "vanilla",
    "dppo_tv",
    "dppo_kl",
    "gspo",
    "sapo",
    "gpg",
    "clip_cov",
    "kl_cov",
    "geo_mean",
    "dro",
    "cispo",
    "bypass_mode",
)
"""The ``actor.policy_loss.loss_mode`` values registered by verl 0.9.1."""

ACTOR_REQUIRED: Mapping[str, Any] = {
    "strategy": "fsdp",
    "rollout_n": 1,
    "ppo_micro_batch_size_per_gpu": 1,
}
"""``ActorConfig`` fields that have no default (``MISSING``) in verl 0.9.1; the values do
not enter any loss (gspo, sapo and cispo assert a real ``ActorConfig``)."""


def _core() -> Any:
    require_installed("verl")
    return importlib.import_module("verl.trainer.ppo.core_algos")


def actor_config(**options: Any) -> Any:
    """``verl.workers.config.ActorConfig(strategy="fsdp", rollout_n=1,
    ppo_micro_batch_size_per_gpu=1, **options)``; ``policy_loss={...}`` fields go to its
    ``PolicyLossConfig`` and ``rollout_correction={...}`` to the latter's
    ``RolloutCorrectionConfig``."""
    require_installed("verl")
    actor = importlib.import_module("verl.workers.config.actor")
    ActorConfig, PolicyLossConfig = actor.ActorConfig, actor.PolicyLossConfig

    policy = dict(options.pop("policy_loss", {}))
    correction = policy.pop("rollout_correction", None)
    cfg = ActorConfig(**ACTOR_REQUIRED, **options)
    pl = cfg.policy_loss if cfg.policy_loss is not None else PolicyLossConfig()
    if correction is not None:
        pl = dataclasses.replace(
            pl, rollout_correction=dataclasses.replace(pl.rollout_correction, **correction)
        )
    if policy:
        pl = dataclasses.replace(pl, **policy)
    return dataclasses.replace(cfg, policy_loss=pl)


def _token_advantages(advantages: Tensor, like: Tensor) -> Tensor:
    # verl's losses take [B, T] advantages; a [B] input is broadcast over the row as
    # verl's advantage estimators do (scores.unsqueeze(-1) * response_mask).
    return advantages[:, None].expand_as(like) if advantages.dim() == 1 else advantages


def policy_loss(
    mode: str, *, loss_agg_mode: str = "token-mean", **options: Any
) -> Callable[..., Tensor]:
    """A loss function ``(logprobs, old_logprobs, advantages, response_mask) -> loss`` that
    calls ``core_algos.get_policy_loss_fn(mode)(old_log_prob=old_logprobs,
    log_prob=logprobs, advantages=[B, T], response_mask=response_mask,
    loss_agg_mode=loss_agg_mode, config=actor_config(**options))`` and returns its loss.

    ``global_batch_info={...}`` (an ``ActorConfig`` field: ``dp_size``,
    ``batch_num_tokens``, ``global_batch_size``, ``loss_scale_factor``) is passed to
    ``agg_loss`` by every mode except sapo and geo_mean.
    """
    if mode not in POLICY_LOSS_MODES:
        raise ValueError(f"mode must be one of {', '.join(POLICY_LOSS_MODES)}, got {mode!r}")
    config_options = dict(options)

    def verl_policy_loss(
        *, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
    ) -> Tensor:
        fn = _core().get_policy_loss_fn(mode)
        loss, _metrics = fn(
            old_log_prob=old_logprobs,
            log_prob=logprobs,
            advantages=_token_advantages(advantages, logprobs),
            response_mask=response_mask,
            loss_agg_mode=loss_agg_mode,
            config=actor_config(**config_options),
        )
        return loss  # type: ignore[no-any-return]

    verl_policy_loss.__qualname__ = f"verl_{mode}"
    return verl_policy_loss


def agg_loss(
    *, loss_mat: Tensor, loss_mask: Tensor, loss_agg_mode: str, **global_batch_info: Any
) -> Tensor:
    """``core_algos.agg_loss(loss_mat, loss_mask, loss_agg_mode, **global_batch_info)``."""
    out: Tensor = _core().agg_loss(
        loss_mat=loss_mat, loss_mask=loss_mask, loss_agg_mode=loss_agg_mode, **global_batch_info
    )
    return out


def kl_penalty(*, logprobs: Tensor, ref_logprobs: Tensor, kl_penalty: str) -> Tensor:
    """``core_algos.kl_penalty(logprob, ref_logprob, kl_penalty)``: the per-token penalty
    (``k1``/``kl``, ``abs``, ``k2``/``mse``, ``k3``/``low_var_kl``, with ``+``)."""
    out: Tensor = _core().kl_penalty(logprobs, ref_logprobs, kl_penalty)
    return out


def value_loss(
    *,
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    response_mask: Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
) -> Tensor:
    """``core_algos.compute_value_loss(vpreds=values, returns, values=old_values, ...)[0]``."""
    loss, _clipfrac = _core().compute_value_loss(
        vpreds=values,
        returns=returns,
        values=old_values,
        response_mask=response_mask,
        cliprange_value=cliprange_value,
        loss_agg_mode=loss_agg_mode,
    )
    return loss  # type: ignore[no-any-return]


def compute_advantage(
    estimator: str,
    *,
    rewards: Tensor,
    response_mask: Tensor,
    index: Any,
    **options: Any,
) -> Tensor:
    """Outcome advantages ``[B, T]`` of ``core_algos.get_adv_estimator_fn(estimator)`` with
    the scalar ``rewards`` ``[B]`` placed on each row's last response token (as verl's
    reward manager does) and ``index`` the group id of each row (``uid``)."""
    core = _core()
    lengths = response_mask.sum(-1)
    scores = torch.zeros(response_mask.shape, dtype=rewards.dtype)
    rows = torch.arange(response_mask.shape[0])
    scores[rows, (lengths - 1).clamp(min=0)] = rewards
    fn = core.get_adv_estimator_fn(estimator)
    advantages, _returns = fn(
        token_level_rewards=scores, response_mask=response_mask, index=index, **options
    )
    return advantages  # type: ignore[no-any-return]


def _step_counts(
    rank_tokens: int | None, world_size: int, global_tokens: int, device: torch.device
) -> tuple[int, int]:
    """``(dp_size, batch_num_tokens)`` as verl's engine finds them: on a real process group
    the rank's response-token count all-reduced (SUM) over the group and the group's size
    (``forward_backward_batch``, ``workers/engine/fsdp/transformer_impl.py``); without one
    (or without ``rank_tokens``), the kit's own step-wide counts (the same numbers)."""
    dist = torch.distributed
    if rank_tokens is not None and dist.is_available() and dist.is_initialized():
        count = torch.tensor(rank_tokens, dtype=torch.int64, device=device)
        dist.all_reduce(count, op=dist.ReduceOp.SUM)
        return dist.get_world_size(), int(count)
    return world_size, global_tokens


@dataclasses.dataclass(frozen=True, eq=False)
class _TrainingStep:
    """verl's actor step for one micro-batch (see :func:`training_step`). A module-level
    class holding only plain options, so the distributed runner can pickle it and the
    ranks import it by name."""

    mode: str
    loss_agg_mode: str
    options: Mapping[str, Any]

    def __call__(
        self,
        *,
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        world_size: int,
        global_tokens: int,
        global_rows: int,
        rank_tokens: int | None = None,
    ) -> Tensor:
        dp_size, num_tokens = _step_counts(rank_tokens, world_size, global_tokens, logprobs.device)
        info = {
            "dp_size": dp_size,
            "batch_num_tokens": num_tokens,
            "global_batch_size": global_rows,
            "loss_scale_factor": None,
        }
        loss, _metrics = _core().get_policy_loss_fn(self.mode)(
            old_log_prob=old_logprobs,
            log_prob=logprobs,
            advantages=_token_advantages(advantages, logprobs),
            response_mask=response_mask,
            loss_agg_mode=self.loss_agg_mode,
            config=actor_config(**dict(self.options), global_batch_info=info),
        )
        return loss  # type: ignore[no-any-return]


def training_step(
    mode: str, *, loss_agg_mode: str = "token-mean", **options: Any
) -> Callable[..., Tensor]:
    """One micro-batch's loss as verl 0.9.1's actor computes it for ``backward()``
    (``workers/utils/losses.py`` ``ppo_loss``): the policy loss of ``mode`` with
    ``config.global_batch_info = {"dp_size": D, "batch_num_tokens": N, "global_batch_size":
    global_rows, "loss_scale_factor": None}``, where ``N`` and ``D`` are the step-wide
    counts verl's engine all-reduces before the micro-batches run
    (``workers/engine/fsdp/transformer_impl.py``): on a real process group the step
    all-reduces ``rank_tokens`` itself (when the caller passes it), as the engine does;
    otherwise it takes the kit's ``global_tokens`` and ``world_size``. For the kit's
    ``training_step`` kind.

    The returned callable is a module-level class's instance (plain options only), so it
    runs under ``distributed="ddp"`` / ``"fsdp"`` as it is.
    """
    if mode not in POLICY_LOSS_MODES:
        raise ValueError(f"mode must be one of {', '.join(POLICY_LOSS_MODES)}, got {mode!r}")
    return _TrainingStep(mode, loss_agg_mode, dict(options))


def entropy(
    *, logits: Tensor, response_mask: Tensor | None = None, loss_agg_mode: str | None = None
) -> Tensor:
    """Per-token ``verl.utils.torch_functional.entropy_from_logits(logits)`` ``[B, T]``
    (nats, ``logsumexp(z) - sum softmax(z) z``), or with ``loss_agg_mode`` the actor's
    bonus ``core_algos.compute_entropy_loss(logits, response_mask, loss_agg_mode)``."""
    if loss_agg_mode is None:
        require_installed("verl")
        functional = importlib.import_module("verl.utils.torch_functional")
        out: Tensor = functional.entropy_from_logits(logits)
        return out
    if response_mask is None:
        raise ValueError("entropy: loss_agg_mode needs response_mask")
    bonus: Tensor = _core().compute_entropy_loss(logits, response_mask, loss_agg_mode)
    return bonus


def logprobs(*, logits: Tensor, labels: Tensor) -> Tensor:
    """``verl.utils.torch_functional.logprobs_from_logits(logits, labels)``: the logprob of
    each label under its own logits row (no shift: verl's callers slice the logits first).
    Without flash-attn it takes ``logprobs_from_logits_v2``: float32/64 logits through
    ``logsumexp``, other dtypes through ``log_softmax`` in their own dtype."""
    require_installed("verl")
    functional = importlib.import_module("verl.utils.torch_functional")
    out: Tensor = functional.logprobs_from_logits(logits=logits, labels=labels)
    return out


def logprobs_rmpad(*, logits: Tensor, input_ids: Tensor) -> Tensor:
    """verl's remove-padding path (``log_probs_from_logits_response_rmpad``, the actor's
    ``use_remove_padding``): the packed ids rolled by -1 over the whole stream, then
    :func:`logprobs` of each row against the next id. Stream position ``s`` holds the
    logprob of token ``s + 1``; each sequence's last position reads the next sequence's
    first token, which no response position uses (verl slices it away after padding)."""
    return logprobs(logits=logits, labels=torch.roll(input_ids, shifts=-1, dims=0))
