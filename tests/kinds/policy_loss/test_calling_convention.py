"""The calling convention (issue 15) and the ``device=`` / ``holes=`` options (issue 14):
accepted parameter spellings, one clear signature error, ``sys.exit()`` as a verdict,
``KeyboardInterrupt`` propagating, CUDA tensors in and CPU gradients out, and masks with
holes through every layout."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch

from pytest_polgrad import ConformanceError, assert_conforms
from pytest_polgrad.core.calls import (
    ALIASES,
    DeviceUnavailable,
    FunctionUnderTest,
    SignatureError,
    guarded_call,
    resolve_parameters,
)
from pytest_polgrad.core.engine import build_context, run_check
from pytest_polgrad.core.options import MarkerError, parse_marker
from pytest_polgrad.core.verdicts import Verdict
from tests.helpers import sample_losses as L

Tensor = torch.Tensor
BATCH = {
    "logprobs": torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, -7.0]], dtype=torch.float64),
    "old_logprobs": torch.tensor([[-1.1, -0.4, -2.0], [-0.2, -1.0, -7.0]], dtype=torch.float64),
    "advantages": torch.tensor([1.0, -0.5], dtype=torch.float64),
    "response_mask": torch.tensor([[True, True, True], [True, True, False]]),
}


def _options(**kw: Any) -> Any:
    return parse_marker(("dapo",), kw)


# ------------------------------------------------------------------------ spellings


def verl_style(
    log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    return L.dapo(log_prob, old_log_prob, advantages, response_mask)


def openrlhf_style(
    log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, action_mask: Tensor
) -> Tensor:
    return L.dapo(log_probs, old_log_probs, advantages, action_mask)


def trl_style(
    per_token_logps: Tensor,
    old_per_token_logps: Tensor,
    advantages: Tensor,
    completion_mask: Tensor,
) -> Tensor:
    return L.dapo(per_token_logps, old_per_token_logps, advantages, completion_mask)


@pytest.mark.parametrize("fn", [verl_style, openrlhf_style, trl_style])
def test_framework_spellings_are_accepted(fn: Any) -> None:
    assert assert_conforms(fn, "dapo", max_examples=10, checks=("value", "gradient")).ok
    fut = FunctionUnderTest(fn, _options())
    assert fut.takes == ("logprobs", "old_logprobs", "advantages", "response_mask")


def test_aliases_are_unambiguous() -> None:
    spellings = [a for names in ALIASES.values() for a in names]
    assert len(spellings) == len(set(spellings))
    assert not set(spellings) & set(ALIASES)
    assert "attention_mask" not in spellings


def test_an_alias_keeps_catching_a_wrong_loss() -> None:
    def wrong(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
        return L.dapo_wrong_eps(log_probs, old_log_probs, advantages, mask)

    with pytest.raises(ConformanceError, match="check 'value' failed"):
        assert_conforms(wrong, "dapo", max_examples=20, checks=("value",))


def _two_names(logprobs: Tensor, log_probs: Tensor, advantages: Tensor) -> Tensor:
    return logprobs.sum()


def _unknown_required(logprobs: Tensor, old_logprobs: Tensor, clip_ratio: float) -> Tensor:
    return logprobs.sum()


def _attention(logprobs: Tensor, old_logprobs: Tensor, attention_mask: Tensor) -> Tensor:
    return logprobs.sum()


def _positional_only(logprobs: Tensor, /, old_logprobs: Tensor) -> Tensor:
    return logprobs.sum()


def _no_logprobs(old_logprobs: Tensor, advantages: Tensor) -> Tensor:
    return old_logprobs.sum()


@pytest.mark.parametrize(
    ("fn", "said"),
    [
        (_two_names, "parameters 'logprobs' and 'log_probs' both name logprobs"),
        (_unknown_required, "required parameter 'clip_ratio' is not an input the kit provides"),
        (_attention, "'attention_mask' is not accepted: in the Hugging Face convention"),
        (_positional_only, "parameter 'logprobs' is positional-only"),
        (_no_logprobs, "has no 'logprobs' parameter"),
    ],
)
def test_one_clear_signature_error(fn: Any, said: str) -> None:
    with pytest.raises(SignatureError) as info:
        FunctionUnderTest(fn, _options())
    message = str(info.value)
    assert said in message
    assert isinstance(info.value, TypeError) and isinstance(info.value, Verdict)
    if fn is not _no_logprobs:
        assert "logprobs (or log_probs, log_prob, logp" in message  # the accepted names
        assert message.count("\n") == 0  # one line, no traceback


def test_optional_extra_parameters_are_left_at_their_defaults() -> None:
    def loss(
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        clip_high: float = 0.28,
    ) -> Tensor:
        return L.dapo(logprobs, old_logprobs, advantages, response_mask)

    assert resolve_parameters(loss) == {n: n for n in FunctionUnderTest(loss, _options()).takes}


def _bypass(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    rollout_logprobs: Tensor,
) -> Tensor:
    """verl's bypass mode spells its rollout logprobs ``rollout_logprobs``."""
    return L.dapo(logprobs, old_logprobs, advantages, response_mask)


def test_a_required_input_the_reference_does_not_read_is_one_signature_error() -> None:
    """bypass_pg has no rollout-IS correction, so no batch carries rollout_logprobs: one
    SignatureError saying so, not a TypeError on every batch of every check (a new user's
    trial); with a default the function is called without it."""
    with pytest.raises(
        SignatureError, match=r"requires parameter 'rollout_logprobs'.*old_logprobs"
    ):
        assert_conforms(_bypass, "bypass_pg", max_examples=5)
    with pytest.raises(SignatureError, match=r"'ref_logprobs'.*no KL term in the loss"):
        assert_conforms(lambda logprobs, ref_logprobs: logprobs.sum(), "dapo", max_examples=5)

    def optional(
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        rollout_logprobs: Tensor | None = None,
    ) -> Tensor:
        assert rollout_logprobs is None
        return L.dapo(logprobs, old_logprobs, advantages, response_mask)

    assert assert_conforms(optional, "dapo", max_examples=5, checks=["value"]).ok


def test_var_keyword_takes_every_input_by_its_canonical_name() -> None:
    def loss(log_probs: Tensor, **kw: Tensor) -> Tensor:
        return L.dapo(log_probs, kw["old_logprobs"], kw["advantages"], kw["response_mask"])

    params = resolve_parameters(loss)
    assert params["logprobs"] == "log_probs" and params["response_mask"] == "response_mask"
    assert assert_conforms(loss, "dapo", max_examples=5, checks=("value",)).ok


# -------------------------------------------------------------- misbehaving functions


def _exits(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    sys.exit(3)


class _ExitInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        return x.sum()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        sys.exit("from backward")


def _exits_in_backward(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    out: Tensor = _ExitInBackward.apply(  # type: ignore[no-untyped-call]
        torch.where(response_mask, logprobs, 0.0)
    )
    return out


@pytest.mark.parametrize(
    ("fn", "said"),
    [(_exits, "the function called sys.exit(3)"), (_exits_in_backward, "backward called sys.exit")],
)
def test_sys_exit_is_a_verdict_not_a_process_exit(fn: Any, said: str) -> None:
    with pytest.raises(Verdict, match=said.replace("(", r"\(").replace(")", r"\)")):
        FunctionUnderTest(fn, _options()).call(BATCH)
    with pytest.raises(ConformanceError) as info:
        assert_conforms(fn, "dapo", max_examples=5, checks=("value", "gradient"))
    assert said in str(info.value)


def _interrupted(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    raise KeyboardInterrupt


def test_keyboard_interrupt_propagates() -> None:
    with pytest.raises(KeyboardInterrupt):
        guarded_call(_interrupted, BATCH)
    with pytest.raises(KeyboardInterrupt):
        assert_conforms(_interrupted, "dapo", max_examples=5, checks=("value",))


def test_guarded_call_names_the_error_and_the_input() -> None:
    def bad(**kw: Any) -> None:
        raise ValueError("shape mismatch")

    with pytest.raises(Verdict, match="raised on corpus batch 'ragged': ValueError: shape"):
        guarded_call(bad, {}, "corpus batch 'ragged'")
    assert guarded_call(lambda **kw: kw["x"] + 1, {"x": 1}) == 2


# ------------------------------------------------------------------------ device=


def _device_seen(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    devices = {t.device.type for t in (logprobs, old_logprobs, advantages, response_mask)}
    if devices != {"cuda"}:
        raise AssertionError(f"received tensors on {devices}")
    return L.dapo(logprobs, old_logprobs, advantages, response_mask)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_device_cuda_without_cuda_is_a_clear_error() -> None:
    fut = FunctionUnderTest(L.dapo, _options(device="cuda"))  # collection does not fail
    with pytest.raises(DeviceUnavailable, match="device='cuda': CUDA is not available") as info:
        fut.call(BATCH)
    assert isinstance(info.value, MarkerError) and "drop device=" in str(info.value)
    with pytest.raises(DeviceUnavailable):
        assert_conforms(L.dapo, "dapo", device="cuda", max_examples=2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_cuda_sends_cuda_tensors_and_compares_on_cpu() -> None:
    fut = FunctionUnderTest(_device_seen, _options(device="cuda"))
    ev = fut.call(BATCH)
    assert ev.loss.device.type == "cpu" and ev.grad is not None and ev.grad.device.type == "cpu"
    assert ev.inputs["logprobs"].device.type == "cuda"
    for layout in ("right", "left", "packed"):
        report = assert_conforms(
            _device_seen, "dapo", device="cuda", layout=layout, max_examples=10
        )
        assert report.ok
    with pytest.raises(ConformanceError, match="check 'value' failed"):
        assert_conforms(L.dapo_wrong_eps, "dapo", device="cuda", max_examples=20, checks=("value",))
    with pytest.raises(ConformanceError, match="check 'inputs-unchanged' failed"):
        assert_conforms(L.dapo_inplace, "dapo", device="cuda", max_examples=10)
    count = torch.cuda.device_count()
    with pytest.raises(DeviceUnavailable, match=f"has {count} CUDA device"):
        FunctionUnderTest(L.dapo, _options(device=f"cuda:{count}")).call(BATCH)


# ------------------------------------------------------------------------- holes=


def _hole_blind(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """Wrong with multi-turn masks: treats every position up to a row's last response
    token as a response token (a length-based mask), so holes count."""
    cols = torch.arange(response_mask.shape[1])
    last = (response_mask.long() * (cols + 1)).amax(dim=1)
    prefix = cols[None, :] < last[:, None]
    return L.dapo(torch.nan_to_num(logprobs), torch.nan_to_num(old_logprobs), advantages, prefix)


def _dapo_packed(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    cu_seqlens: Tensor,
) -> Tensor:
    """Correct DAPO on packed 1-D streams: each row's advantage spread over its span."""
    spans = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    adv = torch.repeat_interleave(advantages, spans)[None, :]
    per = L._ppo_per_token(
        logprobs[None, :], old_logprobs[None, :], adv[:, :], response_mask[None, :], 0.2, 0.28
    )
    return L._token_mean(per, response_mask[None, :])


@pytest.mark.parametrize("layout", ["right", "left", "packed"])
def test_holes_pass_a_correct_loss_in_every_layout(layout: str) -> None:
    fn = _dapo_packed if layout == "packed" else L.dapo
    assert assert_conforms(fn, "dapo", holes=True, layout=layout, max_examples=15).ok


def test_holes_catch_a_length_based_mask() -> None:
    assert assert_conforms(_hole_blind, "dapo", max_examples=15, checks=("value",)).ok
    with pytest.raises(ConformanceError):
        assert_conforms(_hole_blind, "dapo", holes=True, max_examples=15, checks=("value",))


def test_holes_need_a_response_mask_parameter() -> None:
    def no_mask(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor) -> Tensor:
        return (-advantages[:, None] * logprobs).mean()

    with pytest.raises(SignatureError, match="holes=True draws response masks with holes"):
        FunctionUnderTest(no_mask, _options(holes=True))


def test_holes_reach_the_micro_batch_and_padding_checks() -> None:
    ctx = build_context(L.grpo_no_kl, parse_marker(("grpo",), {"holes": True}))
    for check in ("micro-batch", "padding-values", "padding-columns", "masked-positions"):
        assert run_check(ctx, check, max_examples=10, base_seed=0).passed
