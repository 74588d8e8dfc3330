"""Stop-gradients frozen at a base point: the smooth function whose gradient autograd
computes for a loss written with ``detach``.

A loss ``L(x)`` that contains stop-gradients ``sg(h(x))`` has, by definition, the gradient
of ``F_{x0}(x) = L(x)`` with every ``sg(h(x))`` replaced by the constant ``h(x0)``: at
``x = x0`` the values agree, and ``grad F_{x0}(x0)`` is exactly what autograd returns for
``L`` (``sg`` contributes no derivative). ``F_{x0}`` has no stop-gradient, so central finite
differences of ``F_{x0}`` around ``x0`` check autograd's answer — including on branches
(CISPO's detached weight, GSPO-token's detached sequence ratio, the truncated IS weight,
straight-through KL) where finite differences of ``L`` itself would measure the derivative
the stop-gradient removes.

The replacement is done without touching the loss code: the first call records the output
of every ``Tensor.detach`` in call order; later calls (the perturbed ones) get the recorded
tensors back in the same order. The code path must not change between calls (the same
number and shapes of ``detach`` calls); a mismatch raises.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["FrozenStopGradients"]


class _Replay(TorchFunctionMode):
    def __init__(self, recorded: list[torch.Tensor] | None) -> None:
        super().__init__()
        self.recorded = recorded
        self.seen: list[torch.Tensor] = []

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        if func is not torch.Tensor.detach:
            return out
        index = len(self.seen)
        if self.recorded is None:
            self.seen.append(out.clone())
            return out
        if index >= len(self.recorded) or self.recorded[index].shape != out.shape:
            raise RuntimeError(
                "the loss took a different code path at the perturbed point (detach call "
                f"{index} does not match the base point's); move the base point away from it"
            )
        self.seen.append(out)
        return self.recorded[index]


class FrozenStopGradients:
    """Wrap ``fn`` so that its stop-gradients are evaluated once, at the first call.

    ``frozen = FrozenStopGradients(fn); frozen(x0)`` records; ``frozen(x)`` then computes
    ``F_{x0}(x)``. Use a fresh instance per base point.
    """

    def __init__(self, fn: Callable[..., torch.Tensor]) -> None:
        self.fn = fn
        self.recorded: list[torch.Tensor] | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        mode = _Replay(self.recorded)
        with mode:
            out = self.fn(*args, **kwargs)
        if self.recorded is None:
            self.recorded = mode.seen
        elif len(mode.seen) != len(self.recorded):
            raise RuntimeError(
                f"the loss called detach {len(mode.seen)} times at a perturbed point, "
                f"{len(self.recorded)} times at the base point"
            )
        return out
