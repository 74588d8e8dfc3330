"""The logprobs kind's reference: which logits score which token (``shift``), where the
result lands (``align``), the temperature, and the float64 value, gradient and error scale
of :func:`polgrad_reference.logprobs.token_logprobs` on a batch.

With ``u = z / tau`` and ``logp = log softmax(u)[y]`` (docs/logprobs.md), the gradient is
``d logp / d z = (onehot(y) - softmax(u)) / tau`` on the row read and 0 elsewhere.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import torch

from polgrad_reference.logprobs import token_logprobs

__all__ = [
    "REFERENCES",
    "LogprobsReference",
    "expected_logprobs",
    "logprob_scales",
    "rows_read",
]


@dataclasses.dataclass(frozen=True)
class LogprobsReference:
    """``shift``: ``"next"`` (logits at ``s`` predict the token at ``s + 1``) or ``"none"``
    (already aligned); ``align``: ``"token"`` (``out[t]`` is the logprob of token ``t``) or
    ``"logits"`` (``out[s]`` is computed from logits row ``s``); ``temperature``: the
    sampling temperature ``tau`` (the function's own when it takes no ``temperature``
    argument; otherwise the kit passes it and varies it)."""

    shift: str = "next"
    align: str = "token"
    temperature: float = 1.0

    def describe(self) -> str:
        if self.shift == "none":
            where = "log softmax(z[t] / tau)[y[t]] (no shift)"
        elif self.align == "token":
            where = "log softmax(z[t-1] / tau)[y[t]] (shift by one, under the token)"
        else:
            where = "log softmax(z[t] / tau)[y[t+1]] (shift by one, under the logits row)"
        return f"{where}, temperature once on the logits"


REFERENCES: Mapping[str, LogprobsReference] = {
    "next-token": LogprobsReference(),
    "next-token-rolled": LogprobsReference(align="logits"),
    "aligned": LogprobsReference(shift="none"),
}
"""``next-token``: the causal-LM shift, the logprob under its token (the layout a loss
wants: Hugging Face's shifted labels, TRL's ``logits[:, :-1]`` scored against
``input_ids[:, 1:]`` and padded back); ``next-token-rolled``: the same numbers one place
earlier, under the logits row that predicts them (labels rolled by -1, verl's
remove-padding path); ``aligned``: logits already aligned with their tokens."""


def rows_read(mask: torch.Tensor, ref: LogprobsReference) -> torch.Tensor:
    """``[B, T]`` bool: the logits rows the positions ``mask`` selects read."""
    if ref.shift == "none" or ref.align == "logits":
        return mask.clone()
    rows = torch.zeros_like(mask)
    rows[:, :-1] = mask[:, 1:]
    return rows


def expected_logprobs(
    ref: LogprobsReference, kw: Mapping[str, Any], *, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logp [B, T], d sum(logp) / d logits [B, T, V])`` in float64 on padded tensors;
    ``logp`` is 0 where ``response_mask`` is False."""
    z = kw["logits"].detach().to(torch.float64).clone().requires_grad_(True)
    lp = token_logprobs(
        logits=z,
        input_ids=kw["input_ids"],
        shift=ref.shift,
        align=ref.align,
        temperature=temperature,
        response_mask=kw["response_mask"],
    )
    (grad,) = torch.autograd.grad(lp.sum(), z)
    return lp.detach(), grad


def logprob_scales(
    ref: LogprobsReference,
    kw: Mapping[str, Any],
    expected: torch.Tensor,
    grad: torch.Tensor,
    *,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Magnitudes rounding errors are proportional to. Per token: ``|logp| + max_v |u_v| +
    log V`` (``u = z / tau`` on the row read: the max shift and the log-sum-exp cancel down
    to ``logp``). Per gradient entry: ``(p_v + onehot) / tau`` times that, plus the entry
    itself (``exp`` of a rounded argument errs relatively by its magnitude)."""
    mask = kw["response_mask"]
    rows = rows_read(mask, ref)
    z = kw["logits"].detach().to(torch.float64)
    vocab = z.shape[2]
    finite = torch.where(torch.isfinite(z), z, 0.0).abs().amax(dim=2) / temperature
    # the magnitude of the row each output position reads, moved under that position
    if ref.shift == "none" or ref.align == "logits":
        row_mag = finite
    else:
        row_mag = torch.zeros_like(finite)
        row_mag[:, 1:] = finite[:, :-1]
    per_token = torch.where(mask, expected.abs() + row_mag + math.log(max(vocab, 2)), 0.0)
    safe = torch.where(rows[:, :, None], z, 0.0) / temperature
    p = torch.softmax(safe, dim=2)
    if ref.shift == "none" or ref.align == "logits":
        row_scale = per_token
    else:
        row_scale = torch.zeros_like(per_token)
        row_scale[:, :-1] = per_token[:, 1:]
    g = grad.abs()
    grad_scale = g + (row_scale[:, :, None] + 1.0) * (p + 1.0 / vocab) / temperature
    grad_scale = torch.where(rows[:, :, None], grad_scale, 0.0)
    return per_token, grad_scale
