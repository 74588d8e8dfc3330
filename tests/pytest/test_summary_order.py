"""The summary row's diagnosis does not depend on the order the rows arrive in (under
xdist the golden item's "golden not recorded yet" could come first and hide the
diagnosis of the failing value/gradient checks; found by a new-user trial)."""

from __future__ import annotations

from typing import Any

from pytest_polgrad.plugin import summary_rows


def _row(check: str, status: str, match: str = "", golden: str | None = None) -> dict[str, Any]:
    return {
        "function": "wrong_eps",
        "kind": "policy_loss",
        "reference": "dapo",
        "check": check,
        "status": status,
        "worst": 5.0,
        "match": match,
        "golden": golden,
    }


def test_the_diagnosis_wins_over_a_missing_golden_in_any_order() -> None:
    rows = [
        _row("golden", "failed", "golden not recorded yet", "missing"),
        _row("value", "failed", "is token-mean, pg_clip eps 0.2/0.2 — ppo"),
        _row("gradient", "failed", "is token-mean, pg_clip eps 0.2/0.2 — ppo"),
    ]
    for ordering in (rows, rows[::-1], rows[1:] + rows[:1]):
        (line,) = summary_rows(list(ordering))
        assert line[-1] == "is token-mean, pg_clip eps 0.2/0.2 — ppo"


def test_a_golden_only_failure_still_says_so() -> None:
    rows = [_row("golden", "failed", "golden not recorded yet", "missing"), _row("value", "passed")]
    (line,) = summary_rows(rows)
    assert line[-1] == "golden not recorded yet"
