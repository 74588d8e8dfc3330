"""Implementations behind the plugin's fixtures (imported lazily: they need torch).

Both factories take the marker's ``kind=`` (default ``"policy_loss"``): the oracle is the
kind's reference computed in float64, the batch one of the kind's canonical corpus inputs
as the keyword tensors a marked function of that kind receives."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from polgrad_reference import (
    ALGORITHMS,
    ConfigError,
    PolicyLossConfig,
    PolicyLossOutput,
    aggregate,
    get_algorithm,
    policy_loss,
)
from pytest_polgrad.core.corpus import canonical_corpus
from pytest_polgrad.core.kinds import get_kind
from pytest_polgrad.core.options import ConformanceOptions, did_you_mean, parse_marker
from pytest_polgrad.kinds import advantages as _adv
from pytest_polgrad.kinds import entropy as _ent
from pytest_polgrad.kinds import kl as _kl
from pytest_polgrad.kinds import value_loss as _vl

__all__ = ["make_batch", "make_oracle"]


def _options(where: str, reference: Any, kind: str, options: dict[str, Any]) -> ConformanceOptions:
    try:
        return parse_marker((reference,), {"kind": kind, **options})
    except ValueError as exc:  # MarkerError: the marker's own message, naming the argument
        raise ConfigError(f"{where}: {exc}") from None


def _resolve(where: str, kind: str, options: ConformanceOptions) -> Any:
    try:
        return get_kind(kind).resolve(options)
    except ValueError as exc:  # MarkerError: a reference or override the kind refuses
        raise ConfigError(f"{where}: {exc}") from None


def make_oracle(
    reference: Any, *, kind: str = "policy_loss", **overrides: Any
) -> Callable[..., Any]:
    """The reference as a function of keyword tensors, computed in float64.

    ``kind="policy_loss"`` and ``"training_step"`` (the whole step): ``PolicyLossOutput``;
    ``"aggregation"``: the aggregate of ``x`` (scalar); ``"kl"``: the per-token penalty
    ``[B, T]``; ``"advantages"``: the advantages of the tensors given (``token_rewards``
    and ``dones`` enter only when given, as for a marked function); ``"value_loss"``: the
    loss (scalar); ``"entropy"``: the per-token entropy ``[B, T]``. ``overrides`` are the
    marker's overrides of that kind."""
    if kind not in ("policy_loss", "training_step"):
        return _kind_oracle(reference, kind, overrides)
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


def _kind_oracle(reference: Any, kind: str, overrides: dict[str, Any]) -> Callable[..., Any]:
    """The oracle of the token kinds, from the kind's own reference computation."""

    options = _options("polgrad_oracle", reference, kind, overrides)
    cfg = _resolve("polgrad_oracle", kind, options)

    def f64(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.double() if v.is_floating_point() else v for k, v in batch.items()}

    def oracle(**batch: torch.Tensor) -> torch.Tensor:
        x = f64(batch)
        if kind == "aggregation":
            mask = x["response_mask"]
            values = torch.where(mask, x["x"], 0.0)
            return aggregate(values, response_mask=mask, mode=cfg.mode, budget=cfg.budget)
        if kind == "kl":
            out: torch.Tensor = _kl._expected(cfg, _kl._ref_formula(cfg), x, False).value
            return out
        if kind == "advantages":
            return _adv.expected_advantages(cfg, x, frozenset(x))
        if kind == "value_loss":
            loss, _grad = _vl.expected_value_loss(cfg, x)
            return torch.tensor(loss, dtype=torch.float64)
        if kind == "entropy":
            h, _grad = _ent.expected_entropy(cfg, x, scalar=False)
            return h
        raise ConfigError(
            f"polgrad_oracle: kind={kind!r} has no oracle; the kinds with one: policy_loss, "
            "training_step, aggregation, kl, advantages, value_loss, entropy"
        )

    oracle.config = cfg  # type: ignore[attr-defined]
    return oracle


def make_batch(
    name: str = "ragged",
    *,
    dtype: torch.dtype = torch.float64,
    advantages: str = "sequence",
    kind: str = "policy_loss",
    reference: Any = None,
) -> dict[str, Any]:
    """A canonical corpus batch by name (see
    :func:`pytest_polgrad.core.corpus.canonical_corpus`); with ``kind=`` one of that kind's
    corpus inputs (``reference``: the marker's reference, default the kind's first)."""
    if kind != "policy_loss":
        return _kind_batch(name, kind, reference, dtype)
    corpus = canonical_corpus(dtype=dtype, advantages=advantages)
    if name not in corpus:
        raise ValueError(
            f"polgrad_batch: unknown canonical batch {name!r}{did_you_mean(name, corpus)}; "
            f"known: {', '.join(corpus)}"
        )
    return corpus[name]


_DEFAULT_REFERENCE = {
    "training_step": "grpo",
    "aggregation": "token-mean",
    "kl": "k3",
    "advantages": "grpo",
    "value_loss": "ppo",
    "entropy": "entropy",
    "logprobs": "next-token",
}


def _kind_batch(name: str, kind: str, reference: Any, dtype: torch.dtype) -> dict[str, Any]:
    """The kind's corpus input ``name`` as the keyword tensors its functions receive."""
    names = {v: k for k, v in _DTYPES.items()}
    if dtype not in names:
        raise ConfigError(f"polgrad_batch: dtype must be one of {sorted(names, key=str)}")
    ref = reference if reference is not None else _DEFAULT_REFERENCE.get(kind, kind)
    options = _options("polgrad_batch", ref, kind, {"dtype": names[dtype]})
    k = get_kind(kind)

    def takes_everything(**inputs: Any) -> Any:  # the context of a function taking all
        raise NotImplementedError

    ctx = k.context(
        takes_everything, "polgrad_batch", _resolve("polgrad_batch", kind, options), options
    )
    corpus = k.corpus(ctx)
    if name not in corpus:
        raise ValueError(
            f"polgrad_batch: unknown canonical batch {name!r} of kind {kind!r}"
            f"{did_you_mean(name, corpus)}; known: {', '.join(corpus)}"
        )
    inputs = corpus[name]
    return dict(inputs.as_kwargs()) if hasattr(inputs, "as_kwargs") else dict(inputs)


_DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
