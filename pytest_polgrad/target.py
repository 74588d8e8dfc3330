"""Calling the function under test: signature-driven keyword tensors, layout conversion at
the edge, return-value extraction, and clear verdicts when the function misbehaves."""

from __future__ import annotations

import dataclasses
import inspect
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .options import ConformanceOptions
from .strategies import left_to_right, pack, right_to_left, row_extents, unpack

__all__ = ["INPUT_NAMES", "Evaluation", "FunctionUnderTest", "Verdict"]

INPUT_NAMES = (
    "logprobs",
    "old_logprobs",
    "advantages",
    "response_mask",
    "ref_logprobs",
    "rollout_logprobs",
    "cu_seqlens",
)


class Verdict(AssertionError):
    """The function under test did something no check can compare: raised, returned a
    non-scalar / integer / non-tensor, or a loss not differentiable in ``logprobs``."""


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One call of the function under test, brought back to the canonical layout."""

    loss: torch.Tensor
    """The scalar loss, detached (in the dtype the function returned)."""
    grad: torch.Tensor | None
    """d loss / d logprobs as ``[B, T]`` right-padded, or None when not asked for."""
    inputs: dict[str, torch.Tensor]
    """The tensors exactly as passed (after the call: the function may have written them)."""
    before: dict[str, torch.Tensor] | None
    """Copies of ``inputs`` taken before the call, when asked for."""


def _pick_loss(result: object, key: str | int | None) -> object:
    if isinstance(result, Mapping):
        k = "loss" if key is None else key
        if k not in result:
            raise Verdict(
                f"the function returned a dict without key {k!r} "
                f"(keys: {sorted(map(str, result))}); name the loss with "
                "polgrad_conforms(..., loss='key')"
            )
        return result[k]
    if isinstance(result, (tuple, list)):
        i = 0 if key is None else key
        if not isinstance(i, int) or not -len(result) <= i < len(result):
            raise Verdict(
                f"the function returned a {type(result).__name__} of {len(result)} items; "
                f"loss={key!r} does not index it"
            )
        return result[i]
    return result


def _as_loss(value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise Verdict(
            f"the function returned {type(value).__name__} {value!r:.60}, not a tensor; the loss "
            "must be a scalar tensor computed from logprobs"
        )
    if value.numel() != 1 or value.dim() > 1:
        raise Verdict(
            f"the function returned a tensor of shape {list(value.shape)}; the loss must be a "
            "scalar (did it skip the aggregation?)"
        )
    if not value.is_floating_point():
        raise Verdict(f"the function returned a {value.dtype} tensor; the loss must be floating")
    return value.reshape(())


class FunctionUnderTest:
    """Wraps a loss function: which inputs it takes, and how to call it on a batch."""

    def __init__(self, fn: Callable[..., Any], options: ConformanceOptions) -> None:
        self.fn = fn
        self.options = options
        params = inspect.signature(fn).parameters.values()
        var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        named = {p.name for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL}
        self.takes = tuple(n for n in INPUT_NAMES if var_kw or n in named)
        if "logprobs" not in self.takes:
            raise Verdict(
                f"{getattr(fn, '__qualname__', fn)!r} has no 'logprobs' parameter; a marked loss "
                f"function takes keyword tensors among {', '.join(INPUT_NAMES)}"
            )

    @property
    def name(self) -> str:
        return str(getattr(self.fn, "__qualname__", repr(self.fn)))

    @property
    def takes_ref(self) -> bool:
        return "ref_logprobs" in self.takes

    def _layout_inputs(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        layout = self.options.layout
        mask = batch["response_mask"]
        out = {n: batch[n].detach().clone() for n in self.takes if n in batch}
        if layout == "right":
            return out
        extents = row_extents(mask)
        for name, t in out.items():
            if t.dim() == 2:  # token tensors move; [B] advantages stay as they are
                out[name] = right_to_left(t, extents) if layout == "left" else pack(t, extents)[0]
        if layout == "packed" and "cu_seqlens" in self.takes:
            out["cu_seqlens"] = pack(mask, extents)[1]
        return out

    def _canonical_grad(
        self, grad: torch.Tensor, batch: Mapping[str, torch.Tensor]
    ) -> torch.Tensor:
        mask = batch["response_mask"]
        if self.options.layout == "left":
            return left_to_right(grad, row_extents(mask))
        if self.options.layout == "packed":
            cu = pack(mask, row_extents(mask))[1]
            return unpack(grad, cu, width=mask.shape[1], fill=0.0)
        return grad

    def call(
        self,
        batch: Mapping[str, torch.Tensor],
        *,
        grad: bool = True,
        snapshot: bool = False,
    ) -> Evaluation:
        """Call the function on a canonical batch; raise :class:`Verdict` on misbehaviour."""
        inputs = self._layout_inputs(batch)
        inputs["logprobs"].requires_grad_(grad)
        before = {k: v.detach().clone() for k, v in inputs.items()} if snapshot else None
        try:
            result = self.fn(**inputs)
        except Exception as exc:  # the function's own error is the finding
            frames = traceback.format_exception_only(type(exc), exc)
            raise Verdict(
                f"the function raised on a valid batch: {''.join(frames).strip()}"
            ) from exc
        loss = _as_loss(_pick_loss(result, self.options.loss))
        g = None
        if grad:
            if not loss.requires_grad:
                raise Verdict(
                    "the returned loss is not differentiable in logprobs (no grad_fn: it was "
                    "detached, computed with torch.no_grad(), or does not use logprobs)"
                )
            try:
                (g,) = torch.autograd.grad(loss, inputs["logprobs"], allow_unused=True)
            except RuntimeError as exc:
                raise Verdict(f"backward through the returned loss failed: {exc}") from exc
            if g is None:
                raise Verdict("the returned loss does not depend on logprobs (gradient is None)")
            g = self._canonical_grad(g, batch)
        return Evaluation(loss.detach(), g, inputs, before)
