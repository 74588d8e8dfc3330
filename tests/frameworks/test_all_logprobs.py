"""The frameworks' logprob helpers marked with ``kind="logprobs"`` (issue 31): verl 0.9.1's
``logprobs_from_logits`` and its remove-padding path, TRL 1.16.0's
``selective_log_softmax``, OpenRLHF 0.11.2's ``log_probs_from_logits``. Each scores a label
under its own logits row (the callers shift first), so the reference is ``"aligned"``;
verl's remove-padding path rolls the packed ids by -1 itself (``"next-token-rolled"``).
From bfloat16 logits every one computes the log-softmax in bfloat16."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_polgrad.frameworks import openrlhf, trl, verl

_BF16 = "{} takes the log-softmax of bfloat16 logits in bfloat16 (no float32 upcast)"
_ROLL = (
    "torch.roll over the whole stream: each sequence's last position scores the next "
    "sequence's first token; verl drops that position after pad_input (no response token "
    "uses it)"
)


@pytest.mark.polgrad_conforms("aligned", kind="logprobs")
def verl_logprobs(logits: Any, labels: Any) -> Any:
    return verl.logprobs(logits=logits, labels=labels)


@pytest.mark.polgrad_conforms(
    "aligned",
    kind="logprobs",
    dtype="bfloat16",
    expect={"float32-log-softmax": _BF16.format("logprobs_from_logits_v2")},
)
def verl_logprobs_bf16(logits: Any, labels: Any) -> Any:
    return verl.logprobs(logits=logits, labels=labels)


@pytest.mark.polgrad_conforms(
    "next-token-rolled", kind="logprobs", layout="packed", expect={"packed-boundary": _ROLL}
)
def verl_logprobs_rmpad(logits: Any, input_ids: Any, cu_seqlens: Any) -> Any:
    return verl.logprobs_rmpad(logits=logits, input_ids=input_ids)


@pytest.mark.polgrad_conforms("aligned", kind="logprobs")
def trl_selective_log_softmax(logits: Any, labels: Any, temperature: float) -> Any:
    return trl.selective_log_softmax(logits=logits, index=labels, temperature=temperature)


@pytest.mark.polgrad_conforms(
    "aligned",
    kind="logprobs",
    dtype="bfloat16",
    expect={"float32-log-softmax": _BF16.format("selective_log_softmax")},
)
def trl_selective_log_softmax_bf16(logits: Any, labels: Any, temperature: float) -> Any:
    return trl.selective_log_softmax(logits=logits, index=labels, temperature=temperature)


@pytest.mark.polgrad_conforms("aligned", kind="logprobs")
def openrlhf_log_probs(logits: Any, labels: Any) -> Any:
    return openrlhf.log_probs(logits=logits, labels=labels)


@pytest.mark.polgrad_conforms(
    "aligned",
    kind="logprobs",
    dtype="bfloat16",
    expect={"float32-log-softmax": _BF16.format("log_probs_from_logits")},
)
def openrlhf_log_probs_bf16(logits: Any, labels: Any) -> Any:
    return openrlhf.log_probs(logits=logits, labels=labels)
