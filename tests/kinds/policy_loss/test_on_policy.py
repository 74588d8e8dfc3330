"""The on-policy check through a sequence ratio (issue 27, section 1.1).

At ``old_logprobs = logprobs`` every gate, clip and weight is 1, and a token-ratio surrogate
has REINFORCE's gradient ``g[b, t] = -w_b A[b, t]`` token by token. Through GSPO's sequence
ratio ``s_b = exp(mean_t lr[b, t])`` the gradient at every token of row ``b`` is
``(1/L_b) sum_t g[b, t]`` instead: equal to ``g`` when the advantages are constant along
the row, not when they vary (``advantages="token"``), where the old check raised a false
alarm on the reference's own GSPO (2e3x the tolerance on the corpus batch ``ragged``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from polgrad_reference import RatioKind, get_algorithm
from pytest_polgrad import ConformanceError, assert_conforms
from tests.helpers.sample_losses import reference_loss

Tensor = torch.Tensor


def _in_dtype(fn: Callable[..., Tensor], dtype: torch.dtype) -> Callable[..., Tensor]:
    """``fn`` computing in ``dtype`` (the float32 case: float64 inputs downcast)."""

    def inner(**kw: Tensor) -> Tensor:
        cast = {k: v.to(dtype) if v.is_floating_point() else v for k, v in kw.items()}
        return fn(**cast).to(kw["logprobs"].dtype)

    inner.__signature__ = fn.__signature__  # type: ignore[attr-defined]
    inner.__name__ = inner.__qualname__ = fn.__name__
    return inner


@pytest.mark.parametrize("name", ["gspo", "luspo", "gmpo", "sapo", "gspo_token"])
@pytest.mark.parametrize(
    ("inside", "options"),
    [
        ("float64", {}),
        ("float32", {}),
        ("inputs", {"dtype": "bfloat16"}),
    ],
    ids=["float64", "float32", "bfloat16-inputs"],
)
def test_the_references_own_loss_with_token_advantages_passes_every_check(
    name: str, inside: str, options: dict[str, Any]
) -> None:
    """Issue 27: the reference's GSPO marked ``advantages="token"`` failed ``on-policy``."""
    fn = reference_loss(get_algorithm(name).loss, f"{name}_ref")
    if inside == "float32":
        fn = _in_dtype(fn, torch.float32)
    report = assert_conforms(fn, name, advantages="token", max_examples=20, **options)
    ran = {r.check for r in report.results}
    assert "on-policy" in ran
    assert report.ok


def test_on_policy_still_tells_a_sequence_ratio_from_a_token_one() -> None:
    """GSPO-token (per-token gradient) marked as GSPO with token advantages: the row mean
    is not the token's own gradient, so on-policy fails; with row-constant advantages the
    two coincide and it passes."""
    fn = reference_loss(get_algorithm("gspo").loss.replace(ratio=RatioKind.SEQUENCE_TOKEN))
    with pytest.raises(ConformanceError, match="averaged over each row"):
        assert_conforms(fn, "gspo", advantages="token", max_examples=5, checks=("on-policy",))
    assert assert_conforms(fn, "gspo", max_examples=20, checks=("on-policy",)).ok


def test_on_policy_rejects_a_sequence_ratio_where_the_token_ratio_belongs() -> None:
    """The converse: GSPO's sequence ratio marked as GRPO (token ratio) with token
    advantages gives the row mean where REINFORCE's token gradient belongs."""
    fn = reference_loss(get_algorithm("grpo").loss.replace(ratio=RatioKind.SEQUENCE))
    with pytest.raises(ConformanceError, match="on-policy"):
        assert_conforms(fn, "grpo", advantages="token", max_examples=5, checks=("on-policy",))
