"""The policy-loss calling convention, as the harness calls a user's own loss.

A loss is a callable taking keyword tensors among :data:`INPUT_NAMES` (``logprobs``
required; the others those it lists, or all of them with ``**kwargs``) and returning the
scalar loss: a tensor, a tuple or list whose first item is one, a mapping with key
``"loss"``, or an object with a ``loss`` attribute (:class:`~polgrad_reference.PolicyLossOutput`).
A :class:`~polgrad_reference.PolicyLossConfig` or a registry name stands for
``policy_loss(cfg, ...).loss``. The names are the canonical ones of ``docs/conformance.md``
("Inputs"); wrap a function that spells them otherwise.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..config import PolicyLossConfig
from ..errors import InputError, InputTypeError
from ..loss import policy_loss
from ..registry import get_algorithm

__all__ = [
    "INPUT_NAMES",
    "LossLike",
    "as_loss",
    "loss_callable",
    "require_positive",
    "require_tolerance",
    "takes",
]

INPUT_NAMES = (
    "logprobs",
    "old_logprobs",
    "advantages",
    "response_mask",
    "ref_logprobs",
    "rollout_logprobs",
    "token_selection",
)
"""The keyword tensors of the policy-loss calling convention (``docs/conformance.md``)."""

LossLike = PolicyLossConfig | str | Callable[..., Any]
"""What the harness accepts as a loss: a config, a registry name, or a callable."""


def _label(fn: object) -> str:
    return str(getattr(fn, "__qualname__", None) or repr(fn))


def takes(fn: Callable[..., Any], offered: tuple[str, ...], *, what: str = "fn") -> tuple[str, ...]:
    """The names among ``offered`` that ``fn`` takes as keywords (all of them with
    ``**kwargs``). Raises :class:`InputError` for a required parameter not offered and for
    a positional-only one."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as exc:
        raise InputTypeError(f"{what}: cannot read the signature of {_label(fn)}: {exc}") from exc
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return offered
    names = []
    for p in params:
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            continue
        if p.name in offered:
            if p.kind is inspect.Parameter.POSITIONAL_ONLY:
                raise InputError(
                    f"{what}: parameter {p.name!r} of {_label(fn)} is positional-only; the "
                    "harness passes keywords"
                )
            names.append(p.name)
        elif p.default is inspect.Parameter.empty:
            raise InputError(
                f"{what}: required parameter {p.name!r} of {_label(fn)} is not among the "
                f"inputs given ({', '.join(offered)}); give it a default or wrap the function"
            )
    return tuple(names)


def as_loss(value: object, *, what: str = "the loss function") -> torch.Tensor:
    """The scalar floating tensor in ``value`` (see the module docstring)."""
    if isinstance(value, Mapping):
        if "loss" not in value:
            raise InputTypeError(
                f"{what} returned a mapping without key 'loss' (keys: {sorted(map(str, value))})"
            )
        value = value["loss"]
    elif isinstance(value, (tuple, list)):
        if not value:
            raise InputTypeError(f"{what} returned an empty {type(value).__name__}")
        value = value[0]
    elif not isinstance(value, torch.Tensor) and isinstance(
        getattr(value, "loss", None), torch.Tensor
    ):
        value = value.loss  # type: ignore[attr-defined]
    if not isinstance(value, torch.Tensor):
        raise InputTypeError(
            f"{what} returned {type(value).__name__} {value!r:.60}, not a tensor; it must "
            "return a scalar floating tensor computed from its inputs"
        )
    if value.numel() != 1 or value.dim() > 1:
        raise InputTypeError(
            f"{what} returned a tensor of shape {list(value.shape)}; it must return a scalar"
        )
    if not value.is_floating_point():
        raise InputTypeError(f"{what} returned a {value.dtype} tensor; it must be floating")
    return value.reshape(())


def loss_callable(
    loss: LossLike, offered: tuple[str, ...]
) -> tuple[Callable[[Mapping[str, torch.Tensor]], torch.Tensor], tuple[str, ...]]:
    """``(call, names)``: ``call(inputs)`` evaluates ``loss`` on the tensors of ``inputs``
    it takes (``names``, a subset of ``offered``) and returns the scalar loss tensor."""
    if isinstance(loss, str):
        loss = get_algorithm(loss).loss
    if isinstance(loss, PolicyLossConfig):
        cfg = loss
        names = tuple(n for n in offered if n in _config_needs(cfg))

        def call_config(inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
            return policy_loss(cfg, **{n: inputs[n] for n in names}).loss

        return call_config, names
    if not callable(loss):
        raise InputTypeError(
            f"loss must be a PolicyLossConfig, a registry name or a callable, got "
            f"{type(loss).__name__}"
        )
    fn = loss
    names = takes(fn, offered, what="loss")
    if "logprobs" not in names:
        raise InputError(
            f"loss {_label(fn)} takes no 'logprobs' parameter; a policy loss takes keyword "
            f"tensors among {', '.join(INPUT_NAMES)}"
        )

    def call_fn(inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return as_loss(fn(**{n: inputs[n] for n in names}), what=f"loss {_label(fn)}")

    return call_fn, names


def _config_needs(cfg: PolicyLossConfig) -> frozenset[str]:
    needs = {"logprobs", "old_logprobs", "advantages", "response_mask"}
    if cfg.kl_in_loss:
        needs.add("ref_logprobs")
    if cfg.is_correction is not None:
        needs.add("rollout_logprobs")
    if cfg.needs_selection:
        needs.add("token_selection")
    return frozenset(needs)


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputTypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    return float(value)


def require_positive(name: str, value: object) -> float:
    """``value`` as a float; :class:`InputError` unless finite and ``> 0``."""
    x = _number(name, value)
    if not (math.isfinite(x) and x > 0):
        raise InputError(f"{name} must be a positive finite float, got {value!r}")
    return x


def require_bool(name: str, value: object) -> bool:
    """``value`` itself; :class:`InputTypeError` unless it is a bool."""
    if not isinstance(value, bool):
        raise InputTypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def require_tolerance(rtol: object, atol: object) -> tuple[float, float]:
    """``(rtol, atol)``: each finite and ``>= 0``, not both 0 (a check that can fail)."""
    out = []
    for name, value in (("rtol", rtol), ("atol", atol)):
        x = _number(name, value)
        if not (math.isfinite(x) and x >= 0):
            raise InputError(f"{name} must be a finite float >= 0, got {value!r}")
        out.append(x)
    if out[0] == 0 and out[1] == 0:
        raise InputError("rtol and atol are both 0: no finite-difference gradient meets that")
    return out[0], out[1]
