"""What a function under test returned, checked: shared by the token kinds
(:func:`pytest_polgrad.kinds._tokens.require_scalar`) and the training step's rank
processes (:mod:`pytest_polgrad.kinds.training_step.distributed`), which load this too, so
it imports torch only."""

from __future__ import annotations

import torch

__all__ = ["scalar_result"]


def scalar_result(value: object, what: str, error: type[Exception]) -> torch.Tensor:
    """``value`` as a 0-d floating tensor (one element, at most one dimension), else
    ``error`` saying, after ``what``, what came back instead."""
    if not isinstance(value, torch.Tensor):
        raise error(f"{what}: the function returned {type(value).__name__}, not a tensor")
    if value.numel() != 1 or value.dim() > 1:
        raise error(f"{what}: the function returned shape {list(value.shape)}, not a scalar")
    if not value.is_floating_point():
        raise error(f"{what}: the function returned a {value.dtype} tensor, not a float")
    return value.reshape(())
