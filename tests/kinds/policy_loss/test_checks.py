"""Every check catches a deliberately wrong loss and passes a correct one.

Checks run in-process through ``run_check`` with a reduced example budget; the failing
check must be the one named, and the report must carry the shrunk batch snippet.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pytest_polgrad.core.engine import applicable_checks, build_context, resolve_config, run_check
from pytest_polgrad.core.options import parse_marker
from tests.helpers import sample_losses as L

CASES: list[tuple[str, str, Callable[..., Any], Callable[..., Any]]] = [
    # check, reference, correct, wrong
    ("value", "dapo", L.dapo, L.dapo_wrong_eps),
    ("gradient", "cispo", L.cispo, L.cispo_no_stop_gradient),
    ("masked-positions", "dapo", L.dapo, L.dapo_grad_into_padding),
    ("padding-values", "dapo", L.dapo, L.dapo_leaky),
    ("padding-columns", "dapo", L.dapo, L.dapo_padded_width),
    ("inputs-unchanged", "dapo", L.dapo, L.dapo_inplace),
    ("deterministic", "dapo", L.dapo, L.dapo_nondeterministic),
    ("extreme-finite", "dapo", L.dapo, L.dapo_ratio_of_probs),
    ("micro-batch", "grpo", L.grpo_no_kl, L.grpo_token_mean),
    ("on-policy", "cispo", L.cispo, L.cispo_no_stop_gradient),
]
CISPO = {"eps_high": 2.0}  # cispo's registry entry truncates at 1 + 2.0 = 3, as the samples


def _run(
    fn: Callable[..., Any],
    reference: str,
    check: str,
    examples: int = 60,
    *,
    diagnose: bool = True,
    **options: Any,
) -> Any:
    if reference == "cispo":
        options = {**CISPO, **options}
    ctx = build_context(fn, parse_marker((reference,), options))
    return run_check(
        ctx, check, max_examples=examples, base_seed=0, replay="pytest ...", diagnose=diagnose
    )


def test_every_check_has_a_case() -> None:
    from pytest_polgrad.kinds.policy_loss.checks import CHECKS

    assert sorted(c for c, *_ in CASES) == sorted(CHECKS)


@pytest.mark.parametrize(
    ("check", "reference", "correct", "wrong"), CASES, ids=[c[0] for c in CASES]
)
def test_check_passes_the_correct_loss(
    check: str, reference: str, correct: Any, wrong: Any
) -> None:
    result = _run(correct, reference, check)
    assert result.passed, result.report
    assert result.examples >= 10


@pytest.mark.parametrize(
    ("check", "reference", "correct", "wrong"), CASES, ids=[c[0] for c in CASES]
)
def test_check_catches_the_wrong_loss(check: str, reference: str, correct: Any, wrong: Any) -> None:
    result = _run(wrong, reference, check)
    assert not result.passed
    assert f"check {check!r} failed" in result.report
    assert "reproduce (standalone" in result.report and "torch.tensor(" in result.report
    assert "replay     pytest ..." in result.report


def test_a_check_is_one_entry_of_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26: the marker's check names, the report's diagnosis and the snippet's lines
    all come from the :class:`Check` itself. An entry added to ``CHECKS`` alone is a name
    the marker accepts (in report order), and a misspelt one is refused listing it."""
    from pytest_polgrad.core.options import ConformanceOptions, MarkerError
    from pytest_polgrad.kinds.policy_loss import checks

    extra = checks.Check("my-check", "a property", lambda ctx, batch: 0.0)
    monkeypatch.setitem(checks.CHECKS, "my-check", extra)
    assert ConformanceOptions("dapo", checks=("my-check",)).checks == ("my-check",)
    with pytest.raises(MarkerError, match=r"did you mean 'my-check'.*on-policy, my-check, golden"):
        ConformanceOptions("dapo", expect={"my-chek": "r"})
    semantic = {c.name for c in checks.CHECKS.values() if c.semantic}
    assert semantic == {"value", "gradient", "on-policy", "padding-columns", "micro-batch"}


def test_applicability_follows_the_config() -> None:
    grpo = parse_marker(("grpo",), {})
    dapo = parse_marker(("dapo",), {})
    packed = parse_marker(("dapo",), {"layout": "packed"})
    assert "micro-batch" in applicable_checks(resolve_config(grpo), grpo)
    assert "micro-batch" not in applicable_checks(resolve_config(dapo), dapo)
    assert "padding-columns" not in applicable_checks(resolve_config(packed), packed)
    rloo = parse_marker(("rloo",), {})
    assert "on-policy" not in applicable_checks(resolve_config(rloo), rloo)


def test_value_failure_diagnoses_the_semantics_actually_implemented() -> None:
    result = _run(L.grpo_token_mean, "grpo", "value")
    assert not result.passed
    assert "matches token-mean, token ratio, pg_clip eps 0.2/0.2" in result.diagnosis
    assert "the reference 'grpo' is seq-mean-token-mean" in result.diagnosis
    result = _run(L.dapo, "grpo", "value")
    assert "pg_clip eps 0.2/0.28, no KL term — dapo" in result.diagnosis


# Checks whose tolerance depends on the input precision, at float32 and bfloat16 inputs:
# the wrong loss is still caught and the correct one passes. (bfloat16 'value' cannot see
# eps 0.2 vs 0.28 within u_bf16 * K of the loss; the gradient does, see
# tests/kinds/policy_loss/test_false_alarms.py. 'deterministic' drift of 1e-15 is below
# float32's rounding.)
LOW_PRECISION = [
    (case, dtype)
    for case in CASES
    for dtype in ("float32", "bfloat16")
    if case[0] not in ("deterministic",) and (case[0], dtype) != ("value", "bfloat16")
]


@pytest.mark.parametrize(
    ("case", "dtype"), LOW_PRECISION, ids=[f"{c[0]}-{d}" for c, d in LOW_PRECISION]
)
def test_checks_at_low_precision_inputs(case: Any, dtype: str) -> None:
    check, reference, correct, wrong = case
    # only the verdicts are asserted: no diagnosis (the failing path's costliest part)
    assert _run(correct, reference, check, 30, dtype=dtype, diagnose=False).passed
    assert not _run(wrong, reference, check, 30, dtype=dtype, diagnose=False).passed
