"""``assert_conforms``'s summary and ``--polgrad-report`` show the function's own time apart
from the kit's (issue 32), so a slow run is blamed on the right party. No timed threshold:
the function's share is bounded below by its own ``time.sleep`` and above by the whole."""

from __future__ import annotations

import json
import re
import time

import pytest
import torch

from pytest_polgrad import assert_conforms
from tests.helpers import inline_run
from tests.helpers import sample_losses as L

pytest_plugins = ["pytester"]

DELAY = 0.005


def test_the_summary_has_a_time_row_whose_parts_add_up() -> None:
    report = assert_conforms(L.dapo, "dapo", max_examples=6)
    for r in report.results:
        assert 0.0 <= r.function_seconds <= r.seconds, r
    assert report.seconds == sum(r.seconds for r in report.results)
    assert 0.0 < report.function_seconds <= report.seconds
    (row,) = [line for line in report.summary().splitlines() if line.startswith("  time ")]
    found = re.fullmatch(
        r"  time +([0-9.]+) s: the function's own calls ([0-9.]+) s, the kit ([0-9.]+) s", row
    )
    assert found is not None, row
    total, own, kit = (float(x) for x in found.groups())
    assert own <= total and abs(total - own - kit) <= 0.0015, row


def test_a_slow_function_is_blamed_on_the_function() -> None:
    calls = [0]

    def slow_dapo(
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
    ) -> torch.Tensor:
        calls[0] += 1
        time.sleep(DELAY)
        return L.dapo(logprobs, old_logprobs, advantages, response_mask)

    report = assert_conforms(slow_dapo, "dapo", max_examples=6, checks=("value", "gradient"))
    assert report.function_seconds >= calls[0] * DELAY > 0, (report.function_seconds, calls)
    assert report.function_seconds <= report.seconds


LOSS = """
import pytest
import torch


@pytest.mark.polgrad_conforms("dapo", checks=["value", "gradient"])
def good(logprobs, old_logprobs, advantages, response_mask):
    r = torch.exp(torch.where(response_mask, logprobs - old_logprobs, 0.0))
    a = advantages[:, None]
    per = torch.maximum(-a * r, -a * r.clamp(0.8, 1.28))
    return torch.where(response_mask, per, 0.0).sum() / response_mask.sum()
"""


def test_the_json_report_has_each_checks_times(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_losses=LOSS)
    report = pytester.path / "r.json"
    result = inline_run.run(
        pytester,
        "-p",
        "no:cacheprovider",
        "--polgrad-max-examples=6",
        f"--polgrad-report={report}",
        cold=True,
    )
    entries = json.loads(report.read_text())
    assert {e["check"] for e in entries} == {"value", "gradient"}
    for e in entries:
        assert 0.0 <= e["function_seconds"] <= e["seconds"], e
    assert any(e["function_seconds"] > 0 for e in entries), entries
    assert re.search(
        r"time in checks [0-9.]+ s: the functions' own calls [0-9.]+ s, the kit",
        result.stdout.str(),
    ), result.stdout.str()
