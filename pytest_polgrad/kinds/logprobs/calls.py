"""Calling a logprobs function: its parameters, the layout it takes (padded ``[B, T, V]``
or a packed ``[N, V]`` stream with ``cu_seqlens`` / ``position_ids``), and its result
brought back to the padded layout the checks compare in."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from pytest_polgrad.core.clock import charged
from pytest_polgrad.core.verdicts import Verdict
from pytest_polgrad.kinds._tokens import TokenContext, call_guarded, pick_output
from pytest_polgrad.strategies._logits import pack_rows, unpack_rows

from .reference import LogprobsReference

__all__ = ["INPUT_NAMES", "LogprobsContext", "Result", "call_logprobs", "passed_inputs"]

INPUT_NAMES = (
    "logits",
    "input_ids",
    "labels",
    "response_mask",
    "temperature",
    "cu_seqlens",
    "position_ids",
)


@dataclasses.dataclass
class LogprobsContext(TokenContext):
    """:class:`~pytest_polgrad.kinds._tokens.TokenContext` plus the layout the function
    takes (``"right"`` or ``"packed"``), the name of its token ids (``input_ids`` or
    ``labels``) and, packed, of its boundaries (``cu_seqlens`` or ``position_ids``)."""

    layout: str = "right"
    ids_name: str = "input_ids"
    bounds_name: str = "cu_seqlens"

    @property
    def takes_temperature(self) -> bool:
        return "temperature" in self.takes

    @property
    def reference(self) -> LogprobsReference:
        ref: LogprobsReference = self.config
        return ref

    def temperature(self, kw: Mapping[str, Any]) -> float:
        """The temperature the function computes at: the input's when it takes one, else
        the marker's (its own)."""
        if self.takes_temperature:
            return float(kw["temperature"])
        return self.reference.temperature


@dataclasses.dataclass
class Result:
    """The function's output ``[B, T]`` (padded, as returned: dtype kept, detached), its
    gradient ``[B, T, V]`` of the sum over selected positions (or None) and what it was
    passed (in its own layout)."""

    out: torch.Tensor
    grad: torch.Tensor | None
    given: dict[str, Any]
    raw: torch.Tensor
    """The output in the function's own layout ([B, T] or [N])."""


def passed_inputs(ctx: LogprobsContext, kw: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments the function gets for padded inputs ``kw`` (copies)."""
    lengths = kw["lengths"]
    z, ids, mask = kw["logits"], kw["input_ids"], kw["response_mask"]
    if ctx.layout == "packed":
        width = mask.shape[1]
        cu = torch.zeros(lengths.shape[0] + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(lengths, 0).to(torch.int32)
        pos = torch.arange(width, dtype=torch.int64).expand(lengths.shape[0], width)
        tensors: dict[str, Any] = {
            "logits": pack_rows(z, lengths),
            ctx.ids_name: pack_rows(ids, lengths),
            "response_mask": pack_rows(mask, lengths),
            "cu_seqlens": cu,
            "position_ids": pack_rows(pos, lengths),
        }
    else:
        tensors = {"logits": z, ctx.ids_name: ids, "response_mask": mask}
    tensors["temperature"] = float(kw["temperature"])
    return {
        n: (v.detach().clone() if isinstance(v, torch.Tensor) else v)
        for n, v in tensors.items()
        if n in ctx.takes
    }


def call_logprobs(ctx: LogprobsContext, kw: Mapping[str, Any], *, grad: bool = True) -> Result:
    """Call the function on padded inputs ``kw`` in its layout; the result and gradient
    come back padded (packed: 0 beyond each sequence's length)."""
    given = passed_inputs(ctx, kw)
    if grad:
        given["logits"].requires_grad_(True)
    out = pick_output(
        call_guarded(ctx.fn, given, "a valid batch of logits"), ctx.options.loss, "logprobs"
    )
    ids = given.get(ctx.ids_name, None)
    want = list(ids.shape) if ids is not None else list(given["logits"].shape[:-1])
    if not isinstance(out, torch.Tensor) or not out.is_floating_point():
        raise Verdict(
            f"the function returned {type(out).__name__}; per-token logprobs must be a "
            f"floating tensor of shape {want}"
        )
    if list(out.shape) != want:
        raise Verdict(
            f"the function returned shape {list(out.shape)}; expected {want} (one logprob "
            "per token position, in the layout of its token ids)"
        )
    lengths = kw["lengths"]
    mask = kw["response_mask"]
    width = mask.shape[1]
    raw = out
    padded = out.detach()
    if ctx.layout == "packed":
        padded = unpack_rows(padded, lengths, width)
    if not grad:
        return Result(padded, None, given, raw.detach())
    if not out.requires_grad:
        raise Verdict("the returned logprobs are not differentiable in logits (no grad_fn)")
    sel = pack_rows(mask, lengths) if ctx.layout == "packed" else mask
    total = torch.where(sel, out, torch.zeros((), dtype=out.dtype)).sum()
    with charged():  # the backward through the function's result is its own
        (g,) = torch.autograd.grad(total, given["logits"], allow_unused=True)
    if g is None:
        raise Verdict("the returned logprobs do not depend on logits (gradient is None)")
    if ctx.layout == "packed":
        g = unpack_rows(g, lengths, width)
    return Result(padded, g, given, raw.detach())
