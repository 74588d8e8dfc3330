"""Adapters for OpenRLHF 0.11.2 (``openrlhf.models.loss``, ``openrlhf.models.utils``).

OpenRLHF's wheel has no CPU-only install: ``openrlhf/__init__.py`` and
``openrlhf/models/__init__.py`` import the actor and model code (flash-attn, DeepSpeed,
vLLM), and ``models/utils.py`` imports ``deepspeed`` at module level for
``set_z3_leaf_modules`` only. The loader below executes the two installed source files
themselves, ``models/utils.py``, ``models/loss.py`` and ``utils/loss_utils.py`` (the
step's loss normaliser; it imports torch only), under their real module names, with
placeholder parent packages (their ``__init__`` is not run) and, when DeepSpeed is not
installed, a placeholder ``deepspeed`` module that no loss function touches. The loss code
runs unchanged.
"""

from __future__ import annotations

import dataclasses
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from pytest_polgrad.frameworks._adapt import require_installed

__all__ = [
    "aggregate_loss",
    "approx_kl",
    "entropy",
    "load",
    "log_probs",
    "policy_loss",
    "training_step",
    "value_loss",
]

Tensor = torch.Tensor

_MODULES = ("openrlhf.models.utils", "openrlhf.models.loss", "openrlhf.utils.loss_utils")
"""Loaded from their files; ``load()`` keys them by their last part."""


def _package_dir() -> Path:
    spec = importlib.util.find_spec("openrlhf")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("openrlhf is installed but its package directory was not found")
    return Path(next(iter(spec.submodule_search_locations)))


def _placeholder_package(name: str, path: Path) -> None:
    if name in sys.modules:
        return
    module = types.ModuleType(name)
    module.__path__ = [str(path)]
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    sys.modules[name] = module


def load() -> dict[str, types.ModuleType]:
    """``{"utils": openrlhf.models.utils, "loss": openrlhf.models.loss, "loss_utils":
    openrlhf.utils.loss_utils}``, loaded from the installed files as described in the
    module docstring (once per process)."""
    require_installed("openrlhf")
    if all(name in sys.modules for name in _MODULES):
        return {name.rsplit(".", 1)[1]: sys.modules[name] for name in _MODULES}
    root = _package_dir()
    _placeholder_package("openrlhf", root)
    _placeholder_package("openrlhf.models", root / "models")
    _placeholder_package("openrlhf.utils", root / "utils")
    placeholder = None
    if "deepspeed" not in sys.modules and importlib.util.find_spec("deepspeed") is None:
        placeholder = sys.modules["deepspeed"] = types.ModuleType("deepspeed")
    out = {}
    for name in _MODULES:
        short = name.rsplit(".", 1)[1]
        where = root.joinpath(*name.split(".")[1:-1], f"{short}.py")
        if name in sys.modules:  # loaded by an earlier call
            out[short] = sys.modules[name]
            continue
        spec = importlib.util.spec_from_file_location(name, where)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {name} from {root}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        finally:
            if placeholder is not None and short == "utils":
                # Only utils.py's own global refers to it: other packages (transformers,
                # accelerate) must keep seeing DeepSpeed as not installed.
                del sys.modules["deepspeed"]
        out[short] = module
    return out


def policy_loss(**options: Any) -> Callable[..., Tensor]:
    """A loss function ``(logprobs, old_logprobs, advantages, response_mask[,
    rollout_logprobs]) -> loss`` returning ``PolicyLoss(**options)(log_probs=logprobs,
    old_log_probs=old_logprobs, advantages=[B, T], action_mask=response_mask)[0]``.

    ``[B]`` advantages are broadcast over the row, as OpenRLHF's experience maker does for
    outcome rewards. With ``is_correction_level != "off"`` the function also takes
    ``rollout_logprobs``.
    """
    loss_cls = load()["loss"].PolicyLoss
    module = loss_cls(**options)
    corrected = options.get("is_correction_level", "off") != "off"

    def call(
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        rollout_logprobs: Tensor | None,
    ) -> Tensor:
        adv = advantages[:, None].expand_as(logprobs) if advantages.dim() == 1 else advantages
        out = module(
            log_probs=logprobs,
            old_log_probs=old_logprobs,
            advantages=adv,
            action_mask=response_mask,
            rollout_log_probs=rollout_logprobs,
        )
        return out[0]  # type: ignore[no-any-return]

    if corrected:

        def openrlhf_policy_loss_is(
            *,
            logprobs: Tensor,
            old_logprobs: Tensor,
            advantages: Tensor,
            response_mask: Tensor,
            rollout_logprobs: Tensor,
        ) -> Tensor:
            return call(logprobs, old_logprobs, advantages, response_mask, rollout_logprobs)

        return openrlhf_policy_loss_is

    def openrlhf_policy_loss(
        *, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
    ) -> Tensor:
        return call(logprobs, old_logprobs, advantages, response_mask, None)

    return openrlhf_policy_loss


def value_loss(
    *,
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    response_mask: Tensor,
    clip_eps: float | None = None,
    token_level_loss: bool = True,
) -> Tensor:
    """``ValueLoss(clip_eps, token_level_loss)(values, old_values, returns, action_mask)``."""
    module = load()["loss"].ValueLoss(clip_eps=clip_eps, token_level_loss=token_level_loss)
    out: Tensor = module(values, old_values, returns, action_mask=response_mask)
    return out


def aggregate_loss(*, loss: Tensor, loss_mask: Tensor, **options: Any) -> Tensor:
    """``openrlhf.models.loss.aggregate_loss(loss, loss_mask, **options)``."""
    out: Tensor = load()["loss"].aggregate_loss(loss, loss_mask, **options)
    return out


def approx_kl(
    *,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    old_logprobs: Tensor | None = None,
    kl_estimator: str = "k1",
    unbiased_gradient: bool = False,
) -> Tensor:
    """``openrlhf.models.utils.compute_approx_kl(log_probs, log_probs_base, log_probs_old,
    kl_estimator, unbiased_gradient)``: the per-token estimate."""
    out: Tensor = load()["utils"].compute_approx_kl(
        logprobs,
        ref_logprobs,
        log_probs_old=old_logprobs,
        kl_estimator=kl_estimator,
        unbiased_gradient=unbiased_gradient,
    )
    return out


def entropy(*, logits: Tensor) -> Tensor:
    """``openrlhf.models.utils.compute_entropy(logits)``: per-token entropy ``[B, T]``
    in nats."""
    out: Tensor = load()["utils"].compute_entropy(logits)
    return out


def log_probs(*, logits: Tensor, labels: Tensor, temperature: float = 1.0) -> Tensor:
    """``openrlhf.models.utils.log_probs_from_logits(logits, labels, temperature)``: the
    logprob of each label under its own logits row divided by ``temperature`` (no shift:
    the actor slices ``logits[:, :-1]`` against ``labels[:, 1:]``). It divides the caller's
    logits in place (``logits.div_``) when ``temperature != 1``."""
    out: Tensor = load()["utils"].log_probs_from_logits(logits, labels, temperature=temperature)
    return out


def _window_mask(tokens: int, rows: int) -> Tensor:
    """A stand-in for the loss masks of a rank's optimizer-step window with ``tokens``
    response tokens over ``rows`` sequences, each non-empty while tokens last: the only two
    numbers ``_optimizer_step_loss_norm`` reads of them (``mask.sum()`` and the count of
    rows with a token)."""
    width = max(tokens, 1)
    mask = torch.zeros((max(rows, 1), width), dtype=torch.bool)
    filled = min(rows, tokens)
    mask[torch.arange(filled), 0] = True
    mask[0, 1 : 1 + tokens - filled] = True
    return mask


@dataclasses.dataclass(frozen=True, eq=False)
class _TrainingStep:
    """OpenRLHF's actor loss for one micro-batch of an optimizer step (see
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
        gradient_accumulation_steps: int,
        rank_tokens: int,
        rank_rows: int,
    ) -> Tensor:
        modules = load()
        gas = gradient_accumulation_steps
        dist = torch.distributed
        grouped = dist.is_available() and dist.is_initialized()
        dp_size = dist.get_world_size() if grouped else 1
        info = modules["loss_utils"]._optimizer_step_loss_norm(
            [_window_mask(rank_tokens, rank_rows)], None, dp_size, gas
        )
        adv = advantages[:, None].expand_as(logprobs) if advantages.dim() == 1 else advantages
        out = modules["loss"].PolicyLoss(**self.options)(
            logprobs, old_logprobs, adv, action_mask=response_mask, **info
        )
        loss: Tensor = out[0]
        return loss / gas  # DeepSpeed's engine.backward scales the loss by 1 / gas


def training_step(**options: Any) -> Callable[..., Tensor]:
    """One micro-batch's actor loss as OpenRLHF 0.11.2's ``PolicyLossActor.training_step``
    hands it to ``strategy.backward`` (``trainer/ray/ppo_actor.py``, the non-dynamic batch
    path): ``PolicyLoss(**options)(log_probs, old_log_probs, advantages, action_mask,
    **loss_batch_info)`` with ``loss_batch_info`` from ``utils/loss_utils.py``
    ``_optimizer_step_loss_norm`` (the rank's window token and sequence counts, all-reduced
    (SUM) over the process group when there is one, divided by ``gas``; ``dp_size`` the
    group's size), then DeepSpeed's ``1 / gas`` loss scaling of ``engine.backward``.

    ``iter_grad_accum_global_norm`` gives that function the loss masks of the rank's ``gas``
    micro-batches; the kit calls the step one micro-batch at a time, so the adapter passes
    one mask holding the rank's counts (``rank_tokens``, ``rank_rows``). Without a process
    group (the kit's simulated ranks) nothing is all-reduced and ``dp_size`` is 1: each
    rank normalises by its own tokens, as OpenRLHF does in a single process. The returned
    callable is a module-level class's instance, so it runs under ``distributed=`` as it
    is. ``[B]`` advantages are broadcast over the row."""
    load()
    return _TrainingStep(dict(options))
