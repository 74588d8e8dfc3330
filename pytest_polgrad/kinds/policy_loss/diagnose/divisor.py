"""Shifted divisors: a loss whose normaliser is off by a whole number of tokens or rows.

A hand-written aggregation often divides by a count that is off by one: each row's length
``L_b + 1`` (seq-mean-token-mean, GRPO arXiv:2402.03300 Eq. 3 divides by ``|o_i|``), the
token count ``N + 1`` (token-mean, DAPO arXiv:2503.14476 Eq. 8 divides by ``sum_i |o_i|``)
or the row count ``B + 1``. Such a loss re-weights a candidate's rows: with the
candidate's per-row contributions ``c_b`` (``loss = sum_b c_b``) and the factors
``rho_b = D_b / D'_b`` (the divisor the candidate uses over the shifted one), the loss is
``sum_b rho_b c_b`` and its gradient is the candidate's scaled by ``rho_b`` row by row (a
row's terms depend on that row's tokens only). One reference evaluation per batch thus
tests every shift, and no backward pass is needed to rank them.
"""

from __future__ import annotations

import dataclasses
import enum

import torch

from polgrad_reference import Aggregation, PolicyLossOutput

__all__ = ["OFFSETS", "Divisor", "DivisorOf", "divisors_for", "row_terms"]

OFFSETS = (1, -1, 2, -2)
"""The shifts tried, in tokens or rows (a negative shift is floored at 1 for row lengths:
``(mask.sum(-1) - 1).clamp(min=1)``, the only finite form on one-token rows)."""


class DivisorOf(str, enum.Enum):
    """Which count a candidate divides by."""

    LENGTH = "length"
    """Each row's token count ``L_b`` (seq-mean-token-mean)."""
    TOKENS = "tokens"
    """The batch's token count ``N`` (token-mean)."""
    ROWS = "rows"
    """The row count ``B`` (the seq-mean modes; token-sum-norm's ``B * budget``)."""


_KINDS = {
    Aggregation.TOKEN_MEAN: (DivisorOf.TOKENS,),
    Aggregation.SEQ_MEAN_TOKEN_MEAN: (DivisorOf.LENGTH, DivisorOf.ROWS),
    Aggregation.SEQ_MEAN_TOKEN_SUM: (DivisorOf.ROWS,),
    Aggregation.TOKEN_SUM_NORM: (DivisorOf.ROWS,),
}


@dataclasses.dataclass(frozen=True)
class Divisor:
    """A candidate's divisor ``of`` shifted by ``offset``."""

    of: DivisorOf
    offset: int
    aggregation: Aggregation

    def factors(self, mask: torch.Tensor) -> torch.Tensor | None:
        """``rho_b`` as ``[B, 1]`` float64 for the aggregated ``mask``; ``None`` where the
        shifted count is not positive (a row or batch count cannot be)."""
        m = mask.to(torch.float64)
        lengths = m.sum(dim=1, keepdim=True)
        if self.of is DivisorOf.LENGTH:
            shifted = (lengths + self.offset).clamp(min=1.0)
            return torch.where(lengths > 0, lengths / shifted, 1.0)
        if self.of is DivisorOf.TOKENS:
            count = float(m.sum())
        elif self.aggregation is Aggregation.TOKEN_SUM_NORM:
            count = float(mask.shape[0])
        else:  # seq-mean modes count the rows that hold tokens (polgrad_reference.aggregate)
            count = float((lengths > 0).sum())
        if count + self.offset < 1:
            return None
        return torch.full_like(lengths, count / (count + self.offset))

    def describe(self) -> str:
        sign = "+" if self.offset > 0 else "-"
        k = abs(self.offset)
        unit = ("token" if self.of is not DivisorOf.ROWS else "row") + ("s" if k > 1 else "")
        if self.of is DivisorOf.LENGTH:
            floor = " (at least 1)" if self.offset < 0 else ""
            what = f"each row's token sum is divided by its length {sign} {k}{floor}"
            base = "its length"
        elif self.of is DivisorOf.TOKENS:
            what = f"the token sum is divided by the token count {sign} {k}"
            base = "the token count"
        else:
            what = f"the sum over rows is divided by the row count {sign} {k}"
            base = "the row count"
        count = "one" if k == 1 else str(k)
        return f"{what} instead of {base}, a divisor off by {count} {unit}"


def divisors_for(aggregation: Aggregation) -> list[Divisor]:
    """Every shift :data:`OFFSETS` of every count ``aggregation`` divides by."""
    kinds = _KINDS.get(aggregation, ())
    return [Divisor(of, k, aggregation) for of in kinds for k in OFFSETS]


def row_terms(out: PolicyLossOutput) -> torch.Tensor | None:
    """``c_b``, each row's contribution to ``out.loss`` (``[B, 1]`` float64, padding
    excluded); ``None`` when an as-loss KL term has its own aggregation weights (its rows
    would shift by another divisor)."""
    if out.kl is not None and out.kl_weights is not None:
        return None
    mask = out.response_mask
    per = torch.where(mask, out.token_loss.detach() * out.weights, 0.0)
    if out.kl is not None:
        per = per + out.kl_coef * torch.where(mask, out.kl.detach() * out.weights, 0.0)
    return per.sum(dim=1, keepdim=True).to(torch.float64)
