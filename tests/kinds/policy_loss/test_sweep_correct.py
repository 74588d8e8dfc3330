"""The false-alarm sweep (issue 14): every correct loss in the test suite passes every
check on 30 pooled batches per check at the default sizes (realistic-size batches of up to
64 rows and 4096 tokens included), computing in float64, in float32 internally, and fed
float32, bfloat16 and float16 inputs (strict too, where the function's arithmetic is the
input dtype's, and for half-precision inputs computed in float32, which strict judges at
float32). A
false alarm on correct code is as bad as a missed bug.

The budget is in pooled batches and dtypes: the canonical corpus batches every check
runs first count toward ``max_examples`` and are the same for every seed, so one call
with 30 pooled batches sees as many distinct batches as three seeds with 10 each, without
running the corpus three times (the pool's choices are uniform and seeded: a seed is just
another draw). One item per (mode, loss). The sizes are the ones users run: at batches
capped to 4 x 24 the sweep missed three false alarms that only long rows show
(docs/tolerance.md); ``python bench/false_alarms.py`` runs it at other seeds by hand.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest
import torch

from examples.minitrainer.losses import compute_cispo_loss, compute_policy_loss
from pytest_polgrad import ConformanceError, assert_conforms
from pytest_polgrad.core.corpus import canonical_corpus
from tests.helpers import sample_losses as L

Tensor = torch.Tensor
CORPUS = len(canonical_corpus())
POOLED = 30
"""Pooled batches per check after the canonical corpus (26 drawn, 4 at realistic sizes);
the registry's other entries get a third of it."""


def _example_dapo(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """examples/test_minitrainer_conformance.py::dapo_loss (token advantages)."""
    loss, _ = compute_policy_loss(old_logprobs, logprobs, advantages, response_mask, 0.2, 0.28)
    return loss


def _example_grpo(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """examples/test_minitrainer_conformance.py::grpo_loss (token advantages)."""
    loss, _ = compute_policy_loss(
        old_logprobs, logprobs, advantages, response_mask, agg="seq-mean-token-mean"
    )
    return loss


def _example_cispo(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
) -> Tensor:
    """examples/test_minitrainer_conformance.py::cispo_loss (token advantages)."""
    return compute_cispo_loss(logprobs, old_logprobs, advantages, response_mask)


# (label, reference, function, marker options)
Case = tuple[str, str, Callable[..., Any], dict[str, Any]]
EXTRA: list[Case] = [
    ("grpo_no_kl", "grpo", L.grpo_no_kl, {}),
    ("example_dapo", "dapo", _example_dapo, {"advantages": "token"}),
    ("example_grpo", "grpo", _example_grpo, {"advantages": "token"}),
    ("example_cispo", "cispo", _example_cispo, {"advantages": "token"}),
]
CORRECT: list[Case] = [(n, n, fn, {}) for n, fn in L.CORRECT.items()] + EXTRA


def _float32_inside(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` computing in float32: on float64 inputs a common internal downcast, on
    bfloat16 inputs the upcast trainers do; the loss is returned in the inputs' dtype."""

    def inner(**kw: Tensor) -> Tensor:
        cast = {k: v.float() if v.is_floating_point() else v for k, v in kw.items()}
        out: Tensor = fn(**cast)
        return out.to(kw["logprobs"].dtype)

    inner.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    inner.__name__ = inner.__qualname__ = f"{fn.__name__}_float32_inside"
    return inner


# mode: (wrap, marker options); strict where the arithmetic is the input dtype's
MODES: dict[str, tuple[Callable[[Callable[..., Any]], Callable[..., Any]], dict[str, Any]]] = {
    "float64": (lambda f: f, {}),
    "float64-strict": (lambda f: f, {"strict": True}),
    "float32-inside": (_float32_inside, {}),
    "float32-inputs": (lambda f: f, {"dtype": "float32", "strict": True}),
    "bfloat16-inputs": (lambda f: f, {"dtype": "bfloat16"}),
    # fed bfloat16 and computing in float32 (as verl and TRL do): judged at float32
    "bfloat16-upcast-strict": (_float32_inside, {"dtype": "bfloat16", "strict": True}),
    # float16, whose range (65504) a correct loss exceeds on extreme-domain batches
    "float16-inputs": (lambda f: f, {"dtype": "float16"}),
    "float16-upcast-strict": (_float32_inside, {"dtype": "float16", "strict": True}),
}


@pytest.mark.parametrize("case", CORRECT, ids=[c[0] for c in CORRECT])
@pytest.mark.parametrize("mode", list(MODES))
def test_every_correct_loss_passes_every_check_at_default_sizes(mode: str, case: Case) -> None:
    wrap, mode_options = MODES[mode]
    label, reference, fn, options = case
    if reference == "cispo":
        options = {**options, "eps_high": 2.0}
    try:
        assert_conforms(
            wrap(fn), reference, max_examples=CORPUS + POOLED, seed=0, **options, **mode_options
        )
    except ConformanceError as exc:
        pytest.fail(f"false alarm on {label}:\n{str(exc)[:6000]}", pytrace=False)


def _reference_function(name: str) -> Callable[..., Any]:
    """The registry entry ``name`` computed by the reference itself, taking exactly the
    tensors its config needs (a stand-in for the framework-mode entries that have no
    independent implementation in the suite: the sweep then probes the tolerance model
    on their surrogates, kinks and corrections)."""
    from polgrad_reference import ALGORITHMS

    return L.reference_loss(ALGORITHMS[name].loss, f"reference_{name}")


def _registry_rest() -> list[str]:
    from polgrad_reference import ALGORITHMS

    return sorted(set(ALGORITHMS) - set(L.CORRECT))


@pytest.mark.parametrize("name", _registry_rest())
@pytest.mark.parametrize("mode", list(MODES))
def test_every_registry_entry_passes_every_check_at_default_sizes(mode: str, name: str) -> None:
    wrap, mode_options = MODES[mode]
    fn = _reference_function(name)
    try:
        budget = CORPUS + POOLED // 3
        assert_conforms(wrap(fn), name, max_examples=budget, seed=0, **mode_options)
    except ConformanceError as exc:
        pytest.fail(f"false alarm on {name}:\n{str(exc)[:6000]}", pytrace=False)
