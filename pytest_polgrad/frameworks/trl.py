"""Adapter for TRL 1.16.0 ``GRPOTrainer._compute_loss`` in the kit's conventions.

The loss method runs unchanged on CPU tensors, on a trainer instance built without a model:
``object.__new__(GRPOTrainer)`` given the attributes ``GRPOTrainer.__init__`` derives from a
real ``GRPOConfig(use_cpu=True, report_to="none", ...)`` (trl/trainer/grpo_trainer.py,
lines 782-983 of 1.16.0), a real ``Accelerator(cpu=True)``, and a stand-in for
``_get_per_token_logps_and_entropies`` that returns the test's ``logprobs`` (entropies
zero, no auxiliary loss). TRL is imported on the first call.
"""

from __future__ import annotations

import dataclasses
import importlib
import tempfile
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

import torch

from pytest_polgrad.frameworks._adapt import require_installed

__all__ = [
    "LOSS_TYPES",
    "entropy",
    "grpo_config",
    "grpo_loss",
    "selective_log_softmax",
    "training_step",
]

Tensor = torch.Tensor

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
"""``GRPOConfig.loss_type`` values of TRL 1.16.0."""

_OUTPUT_DIR = tempfile.gettempdir()


def grpo_config(**options: Any) -> Any:
    """``trl.GRPOConfig(output_dir=<tmp>, use_cpu=True, report_to="none", **options)``."""
    require_installed("trl")
    grpo_config_cls = importlib.import_module("trl").GRPOConfig
    return grpo_config_cls(output_dir=_OUTPUT_DIR, use_cpu=True, report_to="none", **options)


class _Model:
    """What ``_compute_loss`` reads of the model: ``training`` (train-mode scaling)."""

    training = True


class _Ranks:
    """A real ``Accelerator(cpu=True)`` that reports ``num_processes = world_size``: what
    ``_compute_loss`` reads of a data-parallel run (each rank computes its own loss; the
    gradient all-reduce is the kit's). Everything else is the real accelerator's."""

    def __init__(self, accelerator: Any, world_size: int) -> None:
        self._accelerator = accelerator
        self.num_processes = world_size

    def __getattr__(self, name: str) -> Any:
        return getattr(self._accelerator, name)


def _trainer(args: Any, *, gradient_accumulation_steps: int, world_size: int = 1) -> Any:
    accelerator_cls = importlib.import_module("accelerate").Accelerator
    trainer_cls = importlib.import_module("trl").GRPOTrainer

    t = object.__new__(trainer_cls)
    # The attributes GRPOTrainer.__init__ sets from `args` (trl 1.16.0), nothing else.
    t.args = args
    t.model = _Model()
    accelerator = accelerator_cls(cpu=True)
    t.accelerator = accelerator if world_size == 1 else _Ranks(accelerator, world_size)
    t.loss_type = args.loss_type
    t.importance_sampling_level = args.importance_sampling_level
    t.off_policy_mask_threshold = args.off_policy_mask_threshold
    t.top_entropy_quantile = args.top_entropy_quantile
    t.entropy_coef = args.entropy_coef
    t.use_adaptive_entropy = args.use_adaptive_entropy
    t._entropy_bonus_enabled = t.entropy_coef != 0.0 or t.use_adaptive_entropy
    t._last_world_entropy = float("inf")
    t._entropy_window_stats = None
    t.epsilon_low = args.epsilon
    t.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    t.beta = args.beta
    t.max_completion_length = args.max_completion_length
    t.use_vllm = args.use_vllm
    t.vllm_importance_sampling_correction = args.vllm_importance_sampling_correction
    t.vllm_importance_sampling_mode = args.vllm_importance_sampling_mode
    t.aux_loss_enabled = False
    t.router_aux_loss_coef = 0.0
    t.current_gradient_accumulation_steps = gradient_accumulation_steps
    t._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    return t


def grpo_loss(*, num_items_in_batch: str | int = "local", **options: Any) -> Callable[..., Tensor]:
    """A loss function ``(logprobs, old_logprobs, advantages, response_mask[,
    ref_logprobs]) -> loss`` that returns ``GRPOTrainer._compute_loss(model, inputs)`` for a
    trainer configured with ``GRPOConfig(**options)`` (see :func:`grpo_config`). It takes
    ``ref_logprobs`` (required) only when ``beta != 0``: at TRL's default ``beta=0.0`` it
    takes none, so a marker compares it with the reference's loss without the KL term.

    ``inputs`` carries ``old_per_token_logps=old_logprobs``, ``ref_per_token_logps`` (when
    ``beta != 0``), ``advantages`` ``[B]``, ``completion_mask`` (``int64``, as TRL builds it)
    and ``num_items_in_batch``: the batch's response-token count (``"local"``, what a
    single-process run with one accumulation step passes) or a fixed integer.
    """
    require_installed("trl")
    args = grpo_config(**options)
    steps = int(args.gradient_accumulation_steps)

    def trl_grpo_loss_with_kl(
        *,
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        ref_logprobs: Tensor,
    ) -> Tensor:
        trainer = _trainer(args, gradient_accumulation_steps=steps)
        count = (
            response_mask.sum()
            if num_items_in_batch == "local"
            else torch.tensor(num_items_in_batch)
        )
        return _call(
            trainer, logprobs, old_logprobs, advantages, response_mask, ref_logprobs, count
        )

    if args.beta != 0.0:
        return trl_grpo_loss_with_kl

    # beta == 0 (TRL's default): TRL reads no reference log-probs, so the function takes
    # none; a marker then compares with the reference's loss without its KL term.
    def trl_grpo_loss(
        *, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
    ) -> Tensor:
        trainer = _trainer(args, gradient_accumulation_steps=steps)
        count = (
            response_mask.sum()
            if num_items_in_batch == "local"
            else torch.tensor(num_items_in_batch)
        )
        return _call(trainer, logprobs, old_logprobs, advantages, response_mask, None, count)

    return trl_grpo_loss


def _call(
    trainer: Any,
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    ref_logprobs: Tensor | None,
    num_items_in_batch: Tensor,
) -> Tensor:
    mask = response_mask.to(torch.int64)

    def per_token_logps_and_entropies(*_a: Any, **_k: Any) -> tuple[Tensor, Tensor, None]:
        return logprobs, torch.zeros_like(logprobs), None

    trainer._get_per_token_logps_and_entropies = per_token_logps_and_entropies
    b = logprobs.shape[0]
    inputs: dict[str, Any] = {
        "prompt_ids": torch.zeros((b, 1), dtype=torch.int64),
        "prompt_mask": torch.ones((b, 1), dtype=torch.int64),
        "completion_ids": torch.zeros(mask.shape, dtype=torch.int64),
        "completion_mask": mask,
        "advantages": advantages,
        "old_per_token_logps": old_logprobs,
        "num_items_in_batch": num_items_in_batch,
    }
    if ref_logprobs is not None:
        inputs["ref_per_token_logps"] = ref_logprobs
    loss: Tensor = trainer._compute_loss(trainer.model, inputs)
    return loss


_CONFIGS: dict[str, Any] = {}
"""``GRPOConfig`` objects by their options (one per split shape a process sees)."""


def _step_config(gradient_accumulation_steps: int, steps_per_generation: int, options: Any) -> Any:
    key = repr((gradient_accumulation_steps, steps_per_generation, sorted(options.items())))
    if key not in _CONFIGS:
        _CONFIGS[key] = grpo_config(
            gradient_accumulation_steps=gradient_accumulation_steps,
            steps_per_generation=steps_per_generation,
            **options,
        )
    return _CONFIGS[key]


@dataclasses.dataclass(frozen=True, eq=False)
class _TrainingStep:
    """TRL's ``_compute_loss`` for one micro-batch of an optimizer step (see
    :func:`training_step`). A module-level class holding only plain options, so the
    distributed runner can pickle it and the ranks import it by name."""

    options: Mapping[str, Any]

    def __call__(
        self,
        *,
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        world_size: int,
        gradient_accumulation_steps: int,
        steps_per_generation: int,
        generation_tokens: int,
    ) -> Tensor:
        require_installed("trl")
        args = _step_config(gradient_accumulation_steps, steps_per_generation, self.options)
        trainer = _trainer(
            args, gradient_accumulation_steps=gradient_accumulation_steps, world_size=world_size
        )
        return _call(
            trainer,
            logprobs,
            old_logprobs,
            advantages,
            response_mask,
            None,
            torch.tensor(generation_tokens),
        )


def training_step(**options: Any) -> Callable[..., Tensor]:
    """One micro-batch's ``GRPOTrainer._compute_loss`` inside an optimizer step, for the kit's
    ``training_step`` kind: ``GRPOConfig(gradient_accumulation_steps=k,
    steps_per_generation=s, **options)`` with the split's ``k`` and ``s``,
    ``current_gradient_accumulation_steps = k``, ``num_processes = world_size`` and
    ``inputs["num_items_in_batch"]`` = the response tokens of the whole generation batch on
    every rank (``generation_tokens``), as TRL's ``_prepare_inputs`` passes it (after its
    own gather of the counts across processes).

    The returned callable is a module-level class's instance (plain options only), so it
    runs under ``distributed="ddp"`` / ``"fsdp"`` as it is."""
    require_installed("trl")
    return _TrainingStep(dict(options))


def entropy(*, logits: Tensor) -> Tensor:
    """``trl.trainer.utils.entropy_from_logits(logits)``: per-token entropy ``[B, T]`` in
    nats, computed in chunks of rows (what ``GRPOTrainer`` logs and masks by entropy)."""
    require_installed("trl")
    out: Tensor = importlib.import_module("trl.trainer.utils").entropy_from_logits(logits)
    return out


def selective_log_softmax(*, logits: Tensor, index: Tensor, temperature: float = 1.0) -> Tensor:
    """``trl.trainer.utils.selective_log_softmax(logits, index, temperature)``: the logprob
    of each index under its own logits row divided by ``temperature`` (no shift: TRL's
    trainers drop the last logits row and the first token before the call)."""
    require_installed("trl")
    utils = importlib.import_module("trl.trainer.utils")
    out: Tensor = utils.selective_log_softmax(logits, index, temperature=temperature)
    return out
