"""Adapters for OpenRLHF 0.11.2 (``openrlhf.models.loss``, ``openrlhf.models.utils``).

OpenRLHF's wheel has no CPU-only install: ``openrlhf/__init__.py`` and
``openrlhf/models/__init__.py`` import the actor and model code (flash-attn, DeepSpeed,
vLLM), and ``models/utils.py`` imports ``deepspeed`` at module level for
``set_z3_leaf_modules`` only. The loader below executes the two installed source files
themselves, ``models/utils.py`` and ``models/loss.py``, under their real module names, with
placeholder parent packages (their ``__init__`` is not run) and, when DeepSpeed is not
installed, a placeholder ``deepspeed`` module that no loss function touches. The loss code
runs unchanged.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable
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
    "value_loss",
]

Tensor = torch.Tensor

_MODULES = ("openrlhf.models.utils", "openrlhf.models.loss")


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
    """``{"utils": openrlhf.models.utils, "loss": openrlhf.models.loss}``, loaded from the
    installed files as described in the module docstring (once per process)."""
    require_installed("openrlhf")
    if all(name in sys.modules for name in _MODULES):
        return {name.rsplit(".", 1)[1]: sys.modules[name] for name in _MODULES}
    root = _package_dir()
    _placeholder_package("openrlhf", root)
    _placeholder_package("openrlhf.models", root / "models")
    placeholder = None
    if "deepspeed" not in sys.modules and importlib.util.find_spec("deepspeed") is None:
        placeholder = sys.modules["deepspeed"] = types.ModuleType("deepspeed")
    out = {}
    for name in _MODULES:
        short = name.rsplit(".", 1)[1]
        spec = importlib.util.spec_from_file_location(name, root / "models" / f"{short}.py")
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
