"""One parameter resolver for every kind (issue 26): a training step written with the
frameworks' spellings (OpenRLHF's ``log_probs``, ``old_log_probs``, ``action_mask``) is
fed its inputs under those names, as a policy loss is, and its snippet calls it so."""

from __future__ import annotations

import pytest
import torch

from polgrad_reference import get_algorithm, policy_loss
from pytest_polgrad.core.calls import ALIASES, resolve_parameters
from pytest_polgrad.core.engine import CheckResult, build_context, run_check
from pytest_polgrad.core.options import ConformanceOptions, MarkerError
from pytest_polgrad.kinds._tokens import as_passed, parameters

DAPO = get_algorithm("dapo").loss.replace(aggregation="token-sum", budget=None)


T = torch.Tensor


def _tokens(logprobs: T, old_logprobs: T, advantages: T, mask: T) -> T:
    out = policy_loss(
        DAPO, logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages,
        response_mask=mask,
    )  # fmt: skip
    return torch.where(mask, out.token_loss, 0.0)


def openrlhf_step(
    log_probs: T,
    old_log_probs: T,
    advantages: T,
    action_mask: T,
    global_tokens: int,
    world_size: int,
) -> T:
    """Token-mean with the global token count, times the world size (correct)."""
    tok = _tokens(log_probs, old_log_probs, advantages, action_mask)
    return tok.sum() / global_tokens * world_size


def openrlhf_step_local(
    log_probs: T, old_log_probs: T, advantages: T, action_mask: T, world_size: int
) -> T:
    """Divides by the micro-batch's own token count: wrong across micro-batches."""
    tok = _tokens(log_probs, old_log_probs, advantages, action_mask)
    return tok.sum() / action_mask.sum() * world_size


def _run(fn, check: str, **options) -> CheckResult:  # type: ignore[no-untyped-def]
    ctx = build_context(fn, ConformanceOptions("dapo", kind="training_step", **options))
    return run_check(ctx, check, max_examples=10, base_seed=0, diagnose=False)


@pytest.mark.parametrize("check", ["full-batch", "micro-batches"])
def test_a_step_with_openrlhf_names_passes(check: str) -> None:
    result = _run(openrlhf_step, check)
    assert result.passed, result.report


def test_a_wrong_step_with_openrlhf_names_fails_and_its_snippet_uses_its_names() -> None:
    result = _run(openrlhf_step_local, "micro-batches")
    assert not result.passed
    assert "'response_mask': 'action_mask'" in result.report
    assert "'logprobs': 'log_probs'" in result.report


def test_distributed_refuses_an_aliased_step_by_name() -> None:
    with pytest.raises(MarkerError, match=r"openrlhf_step.*action_mask.*distributed="):
        build_context(
            openrlhf_step,
            ConformanceOptions("dapo", kind="training_step", distributed="ddp"),
            name="openrlhf_step",
        )


def test_one_resolver_strict_for_the_policy_loss_lenient_for_token_kinds() -> None:
    def f(log_probs, action_mask, extra):  # type: ignore[no-untyped-def]
        return log_probs

    names = ("logprobs", "response_mask")
    assert resolve_parameters(f, names, strict=False) == {
        "logprobs": "log_probs",
        "response_mask": "action_mask",
    }
    with pytest.raises(TypeError, match="required parameter 'extra'"):
        resolve_parameters(f, names)
    assert parameters(f, names) == frozenset()  # no aliases unless the kind asks
    takes = parameters(f, names, ALIASES)
    assert takes == frozenset(names)
    passed = as_passed(takes, {"logprobs": 1, "response_mask": 2})
    assert passed == {"log_probs": 1, "action_mask": 2}
