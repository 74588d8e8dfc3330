"""Implementations behind the plugin's fixtures (imported lazily: they need torch)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from polgrad_reference import (
    ALGORITHMS,
    ConfigError,
    PolicyLossConfig,
    PolicyLossOutput,
    get_algorithm,
    policy_loss,
)
from pytest_polgrad.core.corpus import canonical_corpus
from pytest_polgrad.core.options import did_you_mean

__all__ = ["make_batch", "make_oracle"]


def make_oracle(
    reference: str | PolicyLossConfig, **overrides: Any
) -> Callable[..., PolicyLossOutput]:
    """The reference as a function of keyword tensors, computed in float64."""
    if isinstance(reference, PolicyLossConfig):
        cfg = reference.replace(**overrides) if overrides else reference
    else:
        if reference not in ALGORITHMS:
            raise ConfigError(
                f"polgrad_oracle: unknown algorithm {reference!r}"
                f"{did_you_mean(reference, ALGORITHMS)}; known: {', '.join(sorted(ALGORITHMS))}"
            )
        cfg = get_algorithm(reference).derive(**overrides).loss

    def oracle(**batch: torch.Tensor) -> PolicyLossOutput:
        x = {k: v.double() if v.is_floating_point() else v for k, v in batch.items()}
        return policy_loss(cfg, **x)

    oracle.config = cfg  # type: ignore[attr-defined]
    return oracle


def make_batch(
    name: str = "ragged", *, dtype: torch.dtype = torch.float64, advantages: str = "sequence"
) -> dict[str, torch.Tensor]:
    """A canonical corpus batch by name (see
    :func:`pytest_polgrad.core.corpus.canonical_corpus`)."""
    corpus = canonical_corpus(dtype=dtype, advantages=advantages)
    if name not in corpus:
        raise ValueError(
            f"polgrad_batch: unknown canonical batch {name!r}{did_you_mean(name, corpus)}; "
            f"known: {', '.join(corpus)}"
        )
    return corpus[name]
