"""False-alarm sweep of the training-step, aggregation, KL and logprobs kinds: every correct
implementation in their test modules passes every check for several ``--polgrad-seed``
values (small batches, a few drawn inputs after the canonical corpus per check and seed),
and the float64 ones also with ``strict=True``."""

from __future__ import annotations

from typing import Any

import pytest

from tests.kinds import _sweep_verdicts as runs
from tests.kinds.aggregation import test_kind as agg
from tests.kinds.kl import test_kind as kl
from tests.kinds.logprobs import test_kind as logprobs
from tests.kinds.training_step import test_kind as step

SEEDS = range(4)
SIZES: dict[str, Any] = runs.SIZES
FLOAT64_ARITHMETIC = {step.token_mean_step, step.seq_mean_token_mean_step, agg.token_mean,
                      agg.seq_mean_token_sum, kl.k3, kl.k3_plus, logprobs.plain,
                      logprobs.packed_ok}  # fmt: skip


def _cases() -> list[tuple[str, Any, str, dict[str, Any]]]:
    out = []
    for fn, ref, opts in step.CORRECT:
        opts = dict(opts)
        if "budget" in opts:
            opts["overrides"] = {"budget": opts.pop("budget")}
        out.append(("training_step", fn, ref, opts))
    out.append(("training_step", step.gspo_step, "gspo", {}))
    out.append(("training_step", step.token_mean_step, "dapo", {"advantages": "token"}))
    out += [("aggregation", fn, ref, dict(opts)) for fn, ref, opts in agg.CORRECT]
    out += [("kl", fn, ref, dict(opts)) for fn, ref, opts, _ in kl.CORRECT]
    out.append(("kl", kl.k3_plus_clamped, "k3+", {"overrides": {"clamp": 10}}))
    for fn, ref, opts in logprobs.CORRECT:
        opts = dict(opts)
        if "temperature" in opts:
            opts["overrides"] = {"temperature": opts.pop("temperature")}
        out.append(("logprobs", fn, ref, opts))
    return out


CASES = _cases()


@pytest.mark.parametrize(
    ("kind", "fn", "reference", "options"),
    CASES,
    ids=[f"{k}-{f.__name__}-{r}-{o.get('dtype', 'float64')}" for k, f, r, o in CASES],
)
def test_correct_implementation_passes_every_check_for_every_seed(
    kind: str, fn: Any, reference: str, options: dict[str, Any]
) -> None:
    stricts = (False, True) if fn in FLOAT64_ARITHMETIC and "dtype" not in options else (False,)
    for strict in stricts:  # runs at small sizes, 3 inputs per check (tests/kinds/_sweep_verdicts)
        for check in runs.check_names(kind, fn, reference, options, strict=strict):
            for seed in SEEDS:
                result = runs.result(
                    kind, fn, reference, options, check=check, seed=seed, strict=strict
                )
                assert result.passed, (strict, seed, result.report)
