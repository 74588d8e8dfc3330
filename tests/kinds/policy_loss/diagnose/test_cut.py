"""A loss that ignores the tokens past a fixed position is named as such in the report's
diagnosis (a new-user trial's slice at 1500 tokens was only 'depends on the batch's lengths,
width or values')."""

from __future__ import annotations

import torch

from pytest_polgrad.core.engine import build_context
from pytest_polgrad.core.options import parse_marker
from pytest_polgrad.kinds.policy_loss.report import ignored_from

Tensor = torch.Tensor
OPTIONS = parse_marker(("grpo",), {})


def _grpo(lp: Tensor, old: Tensor, adv: Tensor, mask: Tensor, rows: Tensor) -> Tensor:
    ratio = torch.exp(torch.where(mask, lp - old, 0.0))
    a = adv[:, None]
    per = torch.where(mask, torch.maximum(-a * ratio, -a * ratio.clamp(0.8, 1.2)), 0.0)
    return (per.sum(dim=1) / rows).mean()


def correct(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    return _grpo(logprobs, old_logprobs, advantages, response_mask, response_mask.sum(dim=1))


def first_30(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """Looks at the first 30 tokens of each row only."""
    m = response_mask[:, :30]
    return _grpo(logprobs[:, :30], old_logprobs[:, :30], advantages, m, response_mask.sum(dim=1))


def drops_each_last(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """An off-by-one per row: each row's last token is left out (not a fixed position)."""
    lengths = response_mask.sum(dim=1, keepdim=True)
    cols = torch.arange(response_mask.shape[1])[None, :]
    m = response_mask & (cols < lengths - 1)
    return _grpo(logprobs, old_logprobs, advantages, m, response_mask.sum(dim=1))


def _batch(lengths: list[int], width: int) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(0)
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    old = -torch.rand(len(lengths), width, generator=g) * 2
    lp = old + (torch.rand(len(lengths), width, generator=g) - 0.5) * 0.1
    adv = torch.tensor([1.0, -1.0, 0.5][: len(lengths)])
    return dict(logprobs=lp, old_logprobs=old, advantages=adv, response_mask=mask)


def _cut(fn: object, lengths: list[int], width: int) -> int | None:
    return ignored_from(build_context(fn, OPTIONS), _batch(lengths, width))


def test_a_loss_that_stops_at_a_position_is_found_there() -> None:
    assert _cut(first_30, [40, 35, 20], 40) == 30


def test_nothing_is_named_for_a_correct_loss_or_a_per_row_bug() -> None:
    assert _cut(correct, [40, 35, 20], 40) is None
    assert _cut(drops_each_last, [40, 35, 20], 40) is None  # zeros before the cut too
    assert _cut(first_30, [28, 25, 20], 40) is None  # no response token past 30
