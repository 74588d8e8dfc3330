"""Every kind's reproduce section opens the same way (new-user trial): the report's header
line is ``reproduce (standalone):`` and the snippet's first line is the comment saying how
to run it (``pytest_polgrad.core.snippets.how_to_run``). The policy-loss snippets read
``reproduce (standalone; save it ...):`` and started with an import, unlike the others.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

from pytest_polgrad.core.engine import build_context, run_check
from pytest_polgrad.core.options import ConformanceOptions, parse_marker
from tests.helpers import sample_losses as L

HEAD = "\n  reproduce (standalone):\n\n"
FIRST = re.compile(r"# pytest-polgrad reproduction: (.*)")
IMPORTABLE = re.compile(r"save it as a file and run it with python from (\S.*)")


def _first_line(report: str) -> str:
    """The snippet's first line, after the report's header line (asserted to be there)."""
    assert HEAD in report, report
    assert "reproduce (standalone;" not in report, report
    return report.split(HEAD, 1)[1].splitlines()[0]


def _policy_report(fn: Callable[..., Any]) -> str:
    ctx = build_context(fn, parse_marker(("dapo",), {}))
    result = run_check(ctx, "value", max_examples=10, base_seed=0, replay="pytest x")
    assert not result.passed
    return result.report


def _aggregation_report(fn: Callable[..., Any]) -> str:
    options = ConformanceOptions("dapo", kind="aggregation", checks=("value",))
    result = run_check(build_context(fn, options), "value", max_examples=2, base_seed=0)
    assert not result.passed
    return result.report


def agg_seq_mean(x: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Sequence-mean where 'dapo' token-means: fails the aggregation kind's value."""
    m = response_mask.to(x.dtype)
    return ((x * m).sum(1) / m.sum(1)).mean()


def _closure() -> tuple[Callable[..., Any], Callable[..., Any]]:
    def wrong_loss(
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
    ) -> torch.Tensor:
        return L.dapo_wrong_eps(logprobs, old_logprobs, advantages, response_mask)

    def wrong_agg(x: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
        return agg_seq_mean(x, response_mask)

    return wrong_loss, wrong_agg


@pytest.mark.parametrize("kind", ["policy_loss", "aggregation"])
def test_an_importable_functions_snippet_opens_with_where_to_run_it(kind: str) -> None:
    if kind == "policy_loss":
        report = _policy_report(L.dapo_wrong_eps)
    else:
        report = _aggregation_report(agg_seq_mean)
    match = FIRST.fullmatch(_first_line(report))
    assert match, report
    where = IMPORTABLE.fullmatch(match.group(1))
    assert where, match.group(1)
    assert where.group(1) == os.getcwd()


@pytest.mark.parametrize("kind", ["policy_loss", "aggregation"])
def test_an_unimportable_functions_snippet_opens_with_the_paste_instruction(kind: str) -> None:
    wrong_loss, wrong_agg = _closure()
    if kind == "policy_loss":
        report, name = _policy_report(wrong_loss), "wrong_loss"
    else:
        report, name = _aggregation_report(wrong_agg), "wrong_agg"
    assert _first_line(report) == (
        f"# pytest-polgrad reproduction: paste the definition of {name} where marked, then "
        f"save it as a file and run it with python from {os.getcwd()}"
    )


def test_the_policy_and_kind_reproduce_sections_have_one_shape() -> None:
    """Header line, then a blank line, then the comment: the same text before the path."""
    policy = _policy_report(L.dapo_wrong_eps)
    kind = _aggregation_report(agg_seq_mean)

    def opening(report: str) -> str:
        start = report.index("  reproduce (standalone")
        return report[start:].split(" python from ", 1)[0]

    assert opening(policy) == opening(kind)
