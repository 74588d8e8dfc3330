"""``pytest_polgrad.kinds.policy_loss.checks``: what the sampled ``make mutate`` run left unpinned.

- the self-comparison gradient scale includes the function's own gradient per row
  (``|g| + max_row |g|``): a correct loss 3000x the reference's, computed in float32,
  accumulates its micro-batches within its own rounding and must pass (with ``-`` for
  ``+`` it fails at ~1e6 tolerances: a false alarm);
- ``padding-columns`` does not apply to the packed layout, whatever string object the
  layout name is (``is not`` for ``!=`` survived with interned literals);
- a failure's table lists only entries beyond tolerance.
"""

from __future__ import annotations

import torch

from polgrad_reference import ALGORITHMS
from pytest_polgrad import assert_conforms
from pytest_polgrad.core.options import ConformanceOptions
from pytest_polgrad.kinds.policy_loss.checks import CHECKS, _worst_entries


def scaled_float32_grpo(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
) -> torch.Tensor:
    """3001.7 x GRPO's seq-mean-token-mean PPO-clip loss, computed in float32."""
    lp, old, adv = logprobs.float(), old_logprobs.float(), advantages.float()
    r = torch.exp(lp - old)
    per_token = torch.maximum(-adv[:, None] * r, -adv[:, None] * r.clamp(0.8, 1.2))
    m = response_mask.float()
    rows = (per_token * m).sum(1) / m.sum(1)
    return (rows.mean() * 3001.7).double()


def test_micro_batch_scale_follows_the_functions_own_gradient() -> None:
    report = assert_conforms(
        scaled_float32_grpo, "grpo", kl=None, checks=("micro-batch",), max_examples=50
    )
    assert report.ok, report.summary()


def test_padding_columns_never_applies_to_a_packed_layout() -> None:
    cfg = ALGORITHMS["dapo"].loss
    applies = CHECKS["padding-columns"].applies
    literal = "packed"
    built = "".join(["pack", "ed"])  # equal to the literal, not the same object
    assert built == literal and built is not literal
    assert not applies(cfg, ConformanceOptions(reference="dapo", layout=built))
    assert applies(cfg, ConformanceOptions(reference="dapo", layout="right"))


def test_failure_table_lists_only_entries_beyond_tolerance() -> None:
    ratios = torch.tensor([[0.5, 3.0, 1.0], [0.0, 2.0, 0.9]], dtype=torch.float64)
    expected = torch.arange(6, dtype=torch.float64).view(2, 3)
    entries = _worst_entries(ratios, expected, -expected)
    assert [pos for pos, _, _ in entries] == [(0, 1), (1, 1)]
    assert entries[0][1:] == (1.0, -1.0)
