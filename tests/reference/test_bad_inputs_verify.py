"""Issue 28, verify bullets: every public function of ``polgrad_reference.verify`` refuses
a bad argument with a named error (``InputError`` / ``InputTypeError``) whose message names
the argument; a negative, NaN, infinite or string tolerance or step is never taken (one
made ``check_gradient_formula(rtol=-1, atol=-1)`` pass a formula 50x wrong), and a
function without a gradient is a :class:`VerificationError` saying so."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from polgrad_reference import ConfigError, InputError, InputTypeError, KLEstimator
from polgrad_reference.verify import (
    GOLDEN_CASES,
    SoftmaxBandit,
    VerificationError,
    check_golden,
    check_gradient_formula,
    gradcheck_policy_loss,
    kl_loss_gradient,
    train,
)
from polgrad_reference.verify import ragged_batch as _ragged_batch

F64 = torch.float64
BAD = (InputError, InputTypeError, ConfigError)
ragged_batch: Any = _ragged_batch  # called with wrong types on purpose


def _square(x: torch.Tensor) -> torch.Tensor:
    return (x**2).sum()


def _twice(x: torch.Tensor) -> torch.Tensor:
    return 2 * x


def _x() -> torch.Tensor:
    return torch.tensor([0.3, -0.7], dtype=F64)


def _formula(**kw: Any) -> Any:
    args: dict[str, Any] = {"inputs": {"x": _x()}, "wrt": "x"}
    args.update(kw)
    return check_gradient_formula(args.pop("fn", _square), args.pop("formula", _twice), **args)


def _gradcheck(**kw: Any) -> Any:
    b = ragged_batch("grpo", seed=0, lengths=(1, 2), padding="garbage")
    args: dict[str, Any] = {k: b[k] for k in ("logprobs", "old_logprobs", "advantages")}
    args["response_mask"] = b["response_mask"]
    args.update(kw)
    return gradcheck_policy_loss(args.pop("loss", "grpo"), **args)


def _bandit() -> SoftmaxBandit:
    return SoftmaxBandit(torch.tensor([0.0, 1.0], dtype=F64), torch.zeros(2, dtype=F64))


def _train(**kw: Any) -> Any:
    args: dict[str, Any] = {"steps": 1, "group": 2, "prompts": 1, "epochs": 1}
    args.update(kw)
    return train(args.pop("loss", "grpo"), args.pop("bandit", _bandit()), **args)


def _kl(**kw: Any) -> Any:
    args: dict[str, Any] = {"samples": 4, "seed": 0}
    args.update(kw)
    bandit = args.pop("bandit", _bandit())
    logits = args.pop("logits", torch.zeros(2, dtype=F64))
    return kl_loss_gradient(bandit, logits, args.pop("estimator", KLEstimator.K3), **args)


def _golden(**kw: Any) -> Any:
    return check_golden(kw.pop("case", GOLDEN_CASES[0]), **kw)


_NUMBERS: dict[str, object] = {
    "negative": -1.0,
    "nan": math.nan,
    "inf": math.inf,
    "string": "1e-6",
    "bool": True,
    "None": None,
}

# (name, call, error, words in the message: the argument and what was expected)
VERIFY_CASES: list[tuple[str, Callable[[], Any], Any, str]] = []
for _fname, _call in (("check_gradient_formula", _formula), ("gradcheck_policy_loss", _gradcheck)):
    for _arg in ("rtol", "atol", "step"):
        for _label, _value in _NUMBERS.items():
            VERIFY_CASES.append(
                (
                    f"{_fname} {_arg}={_label}",
                    functools.partial(_call, **{_arg: _value}),
                    BAD,
                    _arg,
                )
            )
    VERIFY_CASES += [
        (f"{_fname} step=0", functools.partial(_call, step=0.0), InputError, "step"),
        (
            f"{_fname} rtol=atol=0",
            functools.partial(_call, rtol=0, atol=0),
            InputError,
            "rtol and atol",
        ),
        (
            f"{_fname} raise_on_failure='no'",
            functools.partial(_call, raise_on_failure="no"),
            InputTypeError,
            "raise_on_failure",
        ),
    ]
VERIFY_CASES += [
    ("check_gradient_formula inputs list", lambda: _formula(inputs=[1]), InputTypeError, "inputs"),
    ("check_gradient_formula wrt missing", lambda: _formula(wrt="y"), InputError, "wrt"),
    ("check_gradient_formula wrt int", lambda: _formula(wrt=3), InputError, "wrt"),
    ("check_gradient_formula fn not callable", lambda: _formula(fn=3), InputTypeError, "fn"),
    (
        "check_gradient_formula formula str",
        lambda: _formula(formula="2x"),
        InputTypeError,
        "formula",
    ),
    (
        "check_gradient_formula float32 input",
        lambda: _formula(inputs={"x": _x().float()}),
        InputTypeError,
        r"inputs\['x'\] must be a float64",
    ),
    (
        "check_gradient_formula list input",
        lambda: _formula(inputs={"x": [0.3]}),
        InputTypeError,
        r"inputs\['x'\]",
    ),
    (
        "check_gradient_formula where float",
        lambda: _formula(where=torch.ones(2)),
        InputTypeError,
        "where",
    ),
    (
        "check_gradient_formula where shape",
        lambda: _formula(where=torch.ones(3, dtype=torch.bool)),
        InputError,
        "where",
    ),
    (
        "check_gradient_formula formula returns a float",
        lambda: _formula(formula=lambda x: 2.0),
        InputTypeError,
        "formula must return a floating tensor",
    ),
    (
        "check_gradient_formula formula wrong shape",
        lambda: _formula(formula=lambda x: torch.zeros(3, dtype=F64)),
        InputError,
        "formula returned shape",
    ),
    (
        "check_gradient_formula detached fn",
        lambda: _formula(fn=lambda x: _square(x.detach())),
        VerificationError,
        "not differentiable",
    ),
    (
        "check_gradient_formula constant fn",
        lambda: _formula(fn=lambda x: torch.tensor(1.0, dtype=F64)),
        VerificationError,
        "not differentiable",
    ),
    (
        "check_gradient_formula fn returns a string",
        lambda: _formula(fn=lambda x: "loss"),
        BAD,
        "fn",
    ),
    (
        "gradcheck_policy_loss float32 logprobs",
        lambda: _gradcheck(logprobs=torch.zeros(2, 2)),
        InputTypeError,
        "logprobs",
    ),
    (
        "gradcheck_policy_loss float mask",
        lambda: _gradcheck(response_mask=torch.ones(2, 2)),
        InputTypeError,
        "response_mask",
    ),
    (
        "gradcheck_policy_loss mask shape",
        lambda: _gradcheck(response_mask=torch.ones(2, 3, dtype=torch.bool)),
        InputError,
        "response_mask",
    ),
    ("gradcheck_policy_loss loss int", lambda: _gradcheck(loss=3), BAD, "loss"),
    ("gradcheck_policy_loss loss unknown name", lambda: _gradcheck(loss="gpro"), BAD, "gpro"),
    ("ragged_batch seed str", lambda: ragged_batch("grpo", seed="a"), InputTypeError, "seed"),
    ("ragged_batch seed float", lambda: ragged_batch("grpo", seed=1.5), InputTypeError, "seed"),
    (
        "ragged_batch lengths empty",
        lambda: ragged_batch("grpo", seed=0, lengths=()),
        InputError,
        "lengths",
    ),
    (
        "ragged_batch lengths zero",
        lambda: ragged_batch("grpo", seed=0, lengths=(0,)),
        InputError,
        "lengths",
    ),
    (
        "ragged_batch lengths list",
        lambda: ragged_batch("grpo", seed=0, lengths=[1, 2]),
        InputError,
        "lengths",
    ),
    (
        "ragged_batch margin negative",
        lambda: ragged_batch("grpo", seed=0, margin=-1.0),
        InputError,
        "margin",
    ),
    (
        "ragged_batch margin nan",
        lambda: ragged_batch("grpo", seed=0, margin=math.nan),
        InputError,
        "margin",
    ),
    (
        "ragged_batch margin str",
        lambda: ragged_batch("grpo", seed=0, margin="0.1"),
        InputTypeError,
        "margin",
    ),
    (
        "ragged_batch padding zero",
        lambda: ragged_batch("grpo", seed=0, padding="zero"),
        InputError,
        "padding",
    ),
    ("ragged_batch cfg int", lambda: ragged_batch(3, seed=0), InputTypeError, "cfg"),
    ("train steps -1", lambda: _train(steps=-1), InputError, "steps"),
    ("train steps 0", lambda: _train(steps=0), InputError, "steps"),
    ("train steps 1.5", lambda: _train(steps=1.5), InputTypeError, "steps"),
    ("train steps str", lambda: _train(steps="10"), InputTypeError, "steps"),
    ("train group 0", lambda: _train(group=0), InputError, "group"),
    ("train group 1 for grpo", lambda: _train(group=1), InputError, "group"),
    ("train group bool", lambda: _train(group=True), InputTypeError, "group"),
    ("train prompts 0", lambda: _train(prompts=0), InputError, "prompts"),
    ("train epochs 0", lambda: _train(epochs=0), InputError, "epochs"),
    ("train epochs float", lambda: _train(epochs=2.0), InputTypeError, "epochs"),
    ("train lr nan", lambda: _train(lr=math.nan), InputError, "lr"),
    ("train lr inf", lambda: _train(lr=math.inf), InputError, "lr"),
    ("train lr negative", lambda: _train(lr=-0.5), InputError, "lr"),
    ("train lr zero", lambda: _train(lr=0.0), InputError, "lr"),
    ("train lr str", lambda: _train(lr="0.5"), InputTypeError, "lr"),
    ("train seed str", lambda: _train(seed="0"), InputTypeError, "seed"),
    ("train seed float", lambda: _train(seed=1.5), InputTypeError, "seed"),
    ("train bandit dict", lambda: _train(bandit={}), InputTypeError, "bandit"),
    ("train advantage int", lambda: _train(advantage=3), InputTypeError, "advantage"),
    ("train loss int", lambda: _train(loss=3), BAD, "loss"),
    (
        "SoftmaxBandit 2-D rewards",
        lambda: SoftmaxBandit(torch.zeros(2, 2, dtype=F64), torch.zeros(2, dtype=F64)),
        InputError,
        "rewards",
    ),
    (
        "SoftmaxBandit one arm",
        lambda: SoftmaxBandit(torch.zeros(1, dtype=F64), torch.zeros(1, dtype=F64)),
        InputError,
        "rewards",
    ),
    (
        "SoftmaxBandit NaN reward",
        lambda: SoftmaxBandit(torch.tensor([0.0, math.nan], dtype=F64), torch.zeros(2, dtype=F64)),
        InputError,
        "rewards",
    ),
    (
        "SoftmaxBandit list rewards",
        lambda: SoftmaxBandit([0.0, 1.0], torch.zeros(2, dtype=F64)),  # type: ignore[arg-type]
        InputError,
        "rewards",
    ),
    (
        "SoftmaxBandit inf ref_logits",
        lambda: SoftmaxBandit(torch.zeros(2, dtype=F64), torch.tensor([0.0, math.inf], dtype=F64)),
        InputError,
        "ref_logits",
    ),
    (
        "SoftmaxBandit shape mismatch",
        lambda: SoftmaxBandit(torch.zeros(2, dtype=F64), torch.zeros(3, dtype=F64)),
        InputError,
        "ref_logits",
    ),
    ("kl_loss_gradient samples 1", lambda: _kl(samples=1), InputError, "samples"),
    ("kl_loss_gradient samples str", lambda: _kl(samples="8"), InputTypeError, "samples"),
    ("kl_loss_gradient samples float", lambda: _kl(samples=8.0), InputTypeError, "samples"),
    ("kl_loss_gradient seed str", lambda: _kl(seed="0"), InputTypeError, "seed"),
    ("kl_loss_gradient seed float", lambda: _kl(seed=0.5), InputTypeError, "seed"),
    ("kl_loss_gradient estimator unknown", lambda: _kl(estimator="k9"), BAD, "estimator"),
    ("kl_loss_gradient bandit dict", lambda: _kl(bandit={}), InputTypeError, "bandit"),
    ("kl_loss_gradient logits list", lambda: _kl(logits=[0.0, 0.0]), InputTypeError, "logits"),
    (
        "kl_loss_gradient logits shape",
        lambda: _kl(logits=torch.zeros(3, dtype=F64)),
        InputError,
        "logits",
    ),
    (
        "kl_loss_gradient logits nan",
        lambda: _kl(logits=torch.tensor([0.0, math.nan], dtype=F64)),
        InputError,
        "logits",
    ),
    ("check_golden rtol negative", lambda: _golden(rtol=-1.0), InputError, "rtol"),
    ("check_golden atol nan", lambda: _golden(atol=math.nan), InputError, "atol"),
    ("check_golden rtol str", lambda: _golden(rtol="0"), InputTypeError, "rtol"),
    ("check_golden atol inf", lambda: _golden(atol=math.inf), InputError, "atol"),
    ("check_golden case str", lambda: _golden(case="grpo"), InputTypeError, "case"),
]

VERIFY_BAD_INPUTS = len(VERIFY_CASES)


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [pytest.param(c, e, w, id=n) for n, c, e, w in VERIFY_CASES],
)
def test_a_bad_verify_argument_is_refused_naming_it(
    call: Callable[[], Any], error: Any, words: str
) -> None:
    with pytest.raises(error, match=words):
        call()


def test_the_case_names_are_distinct() -> None:
    assert len({n for n, *_ in VERIFY_CASES}) == VERIFY_BAD_INPUTS


def test_negative_tolerances_no_longer_pass_a_formula_50x_wrong() -> None:
    """The issue's report: ``rtol=-1, atol=-1`` read "-0.948x tol" and passed."""
    with pytest.raises(InputError, match="rtol must be a finite float >= 0, got -1"):
        _formula(formula=lambda x: 100 * x, rtol=-1, atol=-1)
    with pytest.raises(VerificationError):
        _formula(formula=lambda x: 100 * x)
