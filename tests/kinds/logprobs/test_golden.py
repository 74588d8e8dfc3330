"""The logprobs kind's golden: recorded with ``--snapshot-update`` on the canonical corpus,
replayed green, and a function whose logprobs drift (the temperature applied twice) fails
the golden item against the recorded file; the recorded data is tolerant of the function's
covers every corpus batch, finite, never positive."""

from __future__ import annotations

import pytest

from pytest_polgrad.core.kinds import get_kind
from pytest_polgrad.core.options import ConformanceOptions
from tests.helpers import inline_run
from tests.kinds.logprobs.test_kind import plain

pytest_plugins = ["pytester"]

MARKED = """
import os

import pytest
import torch

TWICE = os.environ.get("LOGPROBS_TWICE") == "1"


@pytest.mark.polgrad_conforms("next-token", kind="logprobs")
def logprobs(logits, input_ids, response_mask, temperature):
    tau = temperature * temperature if TWICE else temperature
    lp = torch.log_softmax(logits.double() / tau, dim=-1)
    out = torch.zeros(input_ids.shape, dtype=lp.dtype)
    out[:, 1:] = lp[:, :-1].gather(-1, input_ids[:, 1:, None])[..., 0]
    return torch.where(response_mask, out, 0.0)
"""


def test_the_golden_is_recorded_replayed_and_catches_a_drift(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_lp=MARKED)
    args = ("-p", "no:cacheprovider", "-p", "no:randomly", "--polgrad-max-examples=4", "-rA")
    first = inline_run.run(pytester, *args, "--snapshot-update")
    assert first.ret == 0, first.stdout.str()
    recorded = sorted(pytester.path.glob("__snapshots__/**/*.polgrad"))
    assert [p.name for p in recorded] == ["logprobs[next-token-golden].polgrad"], recorded
    text = recorded[0].read_text()
    assert "logprobs" in text and "grad" in text
    again = inline_run.run(pytester, *args)
    assert again.ret == 0, again.stdout.str()
    assert "PASSED test_lp.py::logprobs[next-token-golden]" in again.stdout.str()
    monkeypatch.setenv("LOGPROBS_TWICE", "1")
    drift = inline_run.run(pytester, *args, "-k", "golden")
    drift.assert_outcomes(failed=1)
    assert recorded[0].read_text() == text  # a failing golden never rewrites the file


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_golden_data_covers_the_corpus_and_is_tolerant_of_its_own_rounding(dtype: str) -> None:
    kind = get_kind("logprobs")
    opts = ConformanceOptions("next-token", kind="logprobs", dtype=dtype)
    ctx = kind.context(plain, "plain", kind.resolve(opts), opts)
    golden = kind.golden(ctx)
    assert set(golden.data) == set(kind.corpus(ctx))
    for entry in golden.data.values():
        assert set(entry) == {"logprobs", "grad"}
        assert entry["grad"].dim() == 3 and entry["logprobs"].dim() == 2
        assert bool(entry["logprobs"].isfinite().all()) and float(entry["logprobs"].max()) <= 0
