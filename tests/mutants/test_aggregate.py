"""``polgrad_reference.aggregate``: the calling convention the mutation run left unpinned.

Tensor arguments are keyword-only (the project's rule; a positional ``mask`` / ``mode``
swap is the bug it prevents): ``aggregate(x, response_mask=..., mode=...)``, ``x`` also
by keyword. cosmic-ray's ``*`` -> ``/`` mutant of the signature survived the suite.
"""

from __future__ import annotations

import pytest
import torch

from polgrad_reference import aggregate, microbatch_token_weights, token_weights

MASK = torch.tensor([[True, False], [True, True]])
X = torch.tensor([[1.0, 5.0], [2.0, 4.0]], dtype=torch.float64)


def test_aggregate_takes_every_argument_by_keyword() -> None:
    got = aggregate(x=X, response_mask=MASK, mode="token-mean")
    assert got.item() == pytest.approx(7.0 / 3, rel=1e-15)


@pytest.mark.parametrize(
    "call",
    [
        lambda: aggregate(X, MASK, "token-mean"),  # type: ignore[call-arg]
        lambda: token_weights(MASK, "token-mean", 8),  # type: ignore[call-arg]
        lambda: microbatch_token_weights(MASK, "token-mean", 1),  # type: ignore[call-arg]
    ],
)
def test_options_are_keyword_only(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError, match="positional"):
        call()
