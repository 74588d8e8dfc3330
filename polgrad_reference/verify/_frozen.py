"""Stop-gradients frozen at a base point: the smooth function whose gradient autograd
computes for a loss that stops gradients.

A loss ``L(x)`` that contains stop-gradients ``sg(h(x))`` has, by definition, the gradient
of ``F_{x0}(x) = L(x)`` with every ``sg(h(x))`` replaced by the constant ``h(x0)``: at
``x = x0`` the values agree, and ``grad F_{x0}(x0)`` is exactly what autograd returns for
``L`` (``sg`` contributes no derivative). ``F_{x0}`` has no stop-gradient, so central finite
differences of ``F_{x0}`` around ``x0`` check autograd's answer — including on branches
(CISPO's detached weight, GSPO-token's detached sequence ratio, the truncated IS weight,
straight-through KL) where finite differences of ``L`` itself would measure the derivative
the stop-gradient removes.

What counts as a stop-gradient is read off autograd itself, not off how it is spelled:
an operation **whose inputs carry a gradient and whose result does not**. That covers
``Tensor.detach``, ``torch.detach(w)``, ``w.data``, ``w.detach_()``, every operation in a
``torch.no_grad()`` or ``set_grad_enabled(False)`` region (the first one that reads a
tensor with a gradient is the cut; the rest compute from it),
``.item()``, ``.tolist()`` and ``float(w)``, and results autograd gives no derivative
(comparisons, ``argmax``: piecewise constant, so holding them fixed changes nothing
there). The operations inside a custom ``torch.autograd.Function``'s ``forward`` run
without gradient too, but its ``backward`` defines their derivative: they are not cuts.

The replacement is done without touching the loss code: the first call (with ``x``
requiring grad) records the result of every cut in call order; later calls, also with
``x`` requiring grad, get the recorded results back in the same order (in-place cuts such
as ``detach_`` are overwritten in place). The code path must not change between calls
(the same cuts, operation by operation, with the same shapes); a mismatch raises
:class:`CodePathChanged`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from ._errors import VerificationError

__all__ = ["CodePathChanged", "FrozenStopGradients", "carries_gradient", "inside_custom_function"]

_APPLY = torch.autograd.Function.apply.__func__.__code__  # type: ignore[attr-defined]


class CodePathChanged(VerificationError):
    """The loss made other stop-gradient cuts at a perturbed point than at the base point."""


def carries_gradient(value: object) -> bool:
    """True for a tensor that requires grad."""
    return isinstance(value, torch.Tensor) and value.requires_grad


def inside_custom_function() -> bool:
    """True while a ``torch.autograd.Function``'s ``forward`` runs (its ``apply`` frame is
    on the stack)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is _APPLY:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _key(func: Callable[..., Any]) -> object:
    """What identifies an operation across calls: a property's ``__get__`` (``Tensor.data``,
    ``Tensor.shape``) is a new bound method each time; its descriptor is not."""
    if getattr(func, "__name__", None) == "__get__":
        return getattr(func, "__self__", func)
    return func


def _name(func: Callable[..., Any]) -> str:
    """``detach``, ``data``, ``exp``: the operation's name as the user wrote it."""
    return str(getattr(_key(func), "__name__", None) or repr(func))


class _Cut:
    """One stop-gradient: the operation, and the replaced leaves of its result."""

    __slots__ = ("func", "key", "leaves", "signature")

    def __init__(self, func: Callable[..., Any], leaves: dict[int, object]) -> None:
        self.func = func
        self.key = _key(func)
        self.leaves = leaves
        self.signature = _signature(leaves)


def _signature(leaves: dict[int, object]) -> tuple[object, ...]:
    return tuple(
        (i, tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else (i, type(v))
        for i, v in leaves.items()
    )


class _Replay(TorchFunctionMode):
    def __init__(self, recorded: list[_Cut] | None) -> None:
        super().__init__()
        self.recorded = recorded
        self.seen: list[_Cut] = []

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        inputs, _ = tree_flatten((args, kwargs))
        carried = any(carries_gradient(t) for t in inputs)  # before: detach_ clears it
        out = func(*args, **kwargs)
        if not carried:
            return out
        leaves, spec = tree_flatten(out)
        cut = {i: leaf for i, leaf in enumerate(leaves) if not carries_gradient(leaf)}
        if not cut or (not torch.is_grad_enabled() and inside_custom_function()):
            return out
        index = len(self.seen)
        if self.recorded is None:
            kept = {
                i: leaf.detach().clone() if isinstance(leaf, torch.Tensor) else leaf
                for i, leaf in cut.items()
            }
            self.seen.append(_Cut(func, kept))
            return out
        here = _Cut(func, cut)
        self.seen.append(here)
        if index >= len(self.recorded):
            raise CodePathChanged(
                f"the loss stopped a gradient more often at a perturbed point than at the base "
                f"point (cut {index}: {_name(func)}); its code path depends on the input there: "
                "move the base point away from the branch point"
            )
        base = self.recorded[index]
        if base.key is not here.key or base.signature != here.signature:
            raise CodePathChanged(
                f"the loss took another code path at a perturbed point: stop-gradient cut "
                f"{index} is {_name(func)} there and {_name(base.func)} at the base point (or "
                "its shapes differ); move the base point away from the branch point"
            )
        args_ids = {id(t) for t in inputs if isinstance(t, torch.Tensor)}
        for i, value in base.leaves.items():
            leaf = leaves[i]
            if isinstance(value, torch.Tensor):
                if isinstance(leaf, torch.Tensor) and id(leaf) in args_ids:  # in place
                    with torch.no_grad():
                        leaf.copy_(value)
                    continue
                leaves[i] = value.clone()
            else:
                leaves[i] = value
        return tree_unflatten(leaves, spec)


class FrozenStopGradients:
    """Wrap ``fn`` so that its stop-gradients are evaluated once, at the first call.

    ``frozen = FrozenStopGradients(fn); frozen(x0)`` records; ``frozen(x)`` then computes
    ``F_{x0}(x)``. Call it with the differentiated input requiring grad (and gradients
    enabled) every time, so that the cuts are the same operations; use a fresh instance
    per base point.
    """

    def __init__(self, fn: Callable[..., torch.Tensor]) -> None:
        self.fn = fn
        self.recorded: list[_Cut] | None = None

    @property
    def cuts(self) -> int:
        """How many stop-gradient cuts the base point made (0 before the first call)."""
        return 0 if self.recorded is None else len(self.recorded)

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        mode = _Replay(self.recorded)
        with mode:
            out = self.fn(*args, **kwargs)
        if self.recorded is None:
            self.recorded = mode.seen
        elif len(mode.seen) != len(self.recorded):
            raise CodePathChanged(
                f"the loss stopped a gradient {len(mode.seen)} times at a perturbed point and "
                f"{len(self.recorded)} times at the base point; its code path depends on the "
                "input there: move the base point away from the branch point"
            )
        return out
