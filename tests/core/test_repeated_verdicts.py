"""One root cause, one full report: when several checks of one marked function end in the
same verdict (here torch's broadcast error from a missing ``advantages[:, None]``), the
first item in the process shows the whole report and the others the verdict and their
replay line (new-user trial: ten full reports, about 690 lines, for one mistake)."""

from __future__ import annotations

import pytest

from tests.helpers import inline_run

pytest_plugins = ["pytester"]

PROJECT = """
import pytest


@pytest.mark.polgrad_conforms("dapo", checks=["value", "gradient", "masked-positions"])
def loss(logprobs, old_logprobs, advantages, response_mask):
    return (logprobs * advantages * response_mask).sum() / response_mask.sum()
"""


def test_the_same_verdict_is_reported_in_full_once(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_v=PROJECT)
    result = inline_run.run(
        pytester, "-p", "no:cacheprovider", "-p", "no:randomly", "--polgrad-max-examples=5"
    )
    result.assert_outcomes(failed=3)
    # the failure reports, before the short summary (which, under CI=true, repeats the
    # first item's whole message)
    text = result.stdout.str().split("short test summary info")[0]
    assert text.count("reproduce (standalone") == 1
    assert text.count("write advantages[:, None]") >= 3  # every item names the cause
    assert text.count("(the same verdict as check 'value' of loss:") == 2
    for check in ("gradient", "masked-positions"):
        assert f"replay     pytest 'test_v.py::loss[dapo-{check}]'" in text
