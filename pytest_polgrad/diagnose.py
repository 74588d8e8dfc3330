"""Diagnosis: which registered semantics does a function actually implement?

The function is evaluated on the canonical corpus and compared, within the engine's
tolerance model, against every point of a candidate space built from the loss algebra:
ratio kind x surrogate x clip range x aggregation (including token-sum-norm with the
batch's padded width as budget, a known framework variant) x KL term on/off. Candidates
are ranked by their worst error in units of tolerance; ``<= 1`` is a match.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator, Mapping

import torch

from polgrad_reference import (
    ALGORITHMS,
    Aggregation,
    ClipConfig,
    PolgradError,
    PolicyLossConfig,
    RatioKind,
    SurrogateKind,
)

from .corpus import canonical_corpus
from .oracle import Oracle
from .target import FunctionUnderTest, Verdict
from .tolerance import Tolerance

__all__ = ["Match", "describe_config", "diagnose", "holds_on"]


@dataclasses.dataclass(frozen=True)
class Match:
    """A candidate semantics and how far the function is from it (in tolerances)."""

    config: PolicyLossConfig
    error: float
    padded_width_budget: bool = False

    @property
    def matches(self) -> bool:
        return self.error <= 1.0

    def describe(self) -> str:
        text = describe_config(self.config)
        if self.padded_width_budget:
            text = text.replace(
                f"token-sum-norm (budget {self.config.budget})",
                "token-sum-norm dividing by the padded width T (a batch-dependent budget)",
            )
        names = registry_names(self.config)
        return text + (f" — {', '.join(names)}" if names else "")


def describe_config(cfg: PolicyLossConfig) -> str:
    """One line naming every semantic choice of a loss config."""
    clip = cfg.clip
    parts = [cfg.aggregation.value + (f" (budget {cfg.budget})" if cfg.budget else "")]
    parts.append(f"{cfg.ratio.value} ratio")
    if cfg.surrogate in (SurrogateKind.PG_CLIP, SurrogateKind.CISPO):
        dual = f", dual-clip {clip.dual_clip:g}" if clip.dual_clip else ""
        lo = "none" if clip.eps_low is None else f"{clip.eps_low:g}"
        hi = "none" if clip.eps_high is None else f"{clip.eps_high:g}"
        parts.append(f"{cfg.surrogate.value} eps {lo}/{hi}{dual}")
    else:
        parts.append(cfg.surrogate.value)
    if cfg.kl_in_loss:
        assert cfg.kl is not None
        parts.append(f"{cfg.kl.estimator.value} KL x {cfg.kl.coef:g} in the loss")
    else:
        parts.append("no KL term")
    if cfg.is_correction is not None:
        c = cfg.is_correction
        parts.append(f"rollout IS {c.level.value} {c.mode.value}")
    return ", ".join(parts)


def registry_names(cfg: PolicyLossConfig) -> list[str]:
    """Registry entries whose policy loss equals ``cfg``. A KL placed in the reward does
    not change the loss; an entry whose as-loss KL term is the only difference is named
    ``"<name> without its KL term"``."""
    out = []
    for name, spec in ALGORITHMS.items():
        loss = spec.loss if spec.loss.kl_in_loss else spec.loss.replace(kl=None)
        if loss == cfg:
            out.append(name)
        elif loss.kl_in_loss and loss.replace(kl=None) == cfg:
            out.append(f"{name} without its KL term")
    return out


def _clips(target: PolicyLossConfig) -> list[ClipConfig]:
    seen: list[ClipConfig] = [target.clip]
    extra = [spec.loss.clip for spec in ALGORITHMS.values()] + [
        ClipConfig(0.2, 0.28),
        ClipConfig(0.1, 0.1),
        ClipConfig(0.3, 0.3),
        ClipConfig(0.2, 0.2, dual_clip=3.0),
        ClipConfig(0.2, 0.28, dual_clip=3.0),
        ClipConfig(None, 0.2),
        ClipConfig(None, 0.28),
    ]
    for c in extra:
        if c not in seen:
            seen.append(c)
    return seen


def _candidates(
    target: PolicyLossConfig, width_budget: int
) -> Iterator[tuple[PolicyLossConfig, bool]]:
    budgets: list[tuple[int, bool]] = [(width_budget, True)]
    if target.budget is not None:
        budgets.insert(0, (target.budget, False))
    kls = [target.kl, None] if target.kl_in_loss else [None]
    for ratio, surr, clip, agg, kl in itertools.product(
        RatioKind, SurrogateKind, _clips(target), Aggregation, kls
    ):
        if surr in (SurrogateKind.REINFORCE, SurrogateKind.CISPO) and ratio is not RatioKind.TOKEN:
            continue
        if surr in (SurrogateKind.PG, SurrogateKind.REINFORCE) and clip != target.clip:
            continue  # the clip does not enter these surrogates
        for budget, padded in budgets if agg is Aggregation.TOKEN_SUM_NORM else [(None, False)]:
            try:
                cfg = target.replace(
                    ratio=ratio, surrogate=surr, clip=clip, aggregation=agg, budget=budget, kl=kl
                )
            except PolgradError:
                continue
            yield cfg, padded


def diagnose(
    fut: FunctionUnderTest,
    target: PolicyLossConfig,
    tolerance: Tolerance,
    *,
    top: int = 3,
) -> list[Match]:
    """Rank candidate semantics by how well they explain ``fut`` on the corpus; raises
    :class:`Verdict` when ``fut`` cannot be evaluated on a corpus batch.

    Each corpus batch is evaluated separately (a padded-width budget differs per batch);
    a candidate's error is its worst over batches and over loss and gradient.
    """
    corpus = canonical_corpus(dtype=tolerance.input_dtype, advantages=fut.options.advantages)
    observed: dict[str, tuple[float, torch.Tensor]] = {}
    for name, batch in corpus.items():
        try:
            ev = fut.call(batch)
        except Verdict as exc:
            raise Verdict(f"on canonical batch {name!r}: {exc}") from exc
        assert ev.grad is not None
        observed[name] = (float(ev.loss), ev.grad.to(torch.float64))
    errors: dict[tuple[int, bool], tuple[PolicyLossConfig, float]] = {}
    for name, batch in corpus.items():
        width = batch["response_mask"].shape[1]
        loss, grad = observed[name]
        for index, (cfg, padded) in enumerate(_candidates(target, width)):
            err = _error(cfg, batch, loss, grad, tolerance)
            key = (index, padded)
            prev = errors.get(key)
            errors[key] = (prev[0] if prev else cfg, max(err, prev[1] if prev else 0.0))
    ranked = sorted(
        (Match(cfg, err, padded) for (_, padded), (cfg, err) in errors.items()),
        key=lambda m: m.error,
    )
    return ranked[:top]


def holds_on(
    match: Match,
    fut: FunctionUnderTest,
    batch: Mapping[str, torch.Tensor],
    tolerance: Tolerance,
) -> bool:
    """Whether ``fut`` still matches ``match`` on one more batch (e.g. the failing one)."""
    cfg = match.config
    if match.padded_width_budget:
        cfg = cfg.replace(budget=batch["response_mask"].shape[1])
    try:
        ev = fut.call(batch)
    except Verdict:
        return False
    assert ev.grad is not None
    return _error(cfg, batch, float(ev.loss), ev.grad.to(torch.float64), tolerance) <= 1.0


def _error(
    cfg: PolicyLossConfig,
    batch: Mapping[str, torch.Tensor],
    loss: float,
    grad: torch.Tensor,
    tolerance: Tolerance,
) -> float:
    try:
        ref = Oracle(cfg)(batch, kink_eps=tolerance.loosest)
    except PolgradError:
        return math.inf
    value = tolerance.value(loss, ref.loss, ref.value_scale, ref.n_tokens).error
    where = batch["response_mask"] & ~ref.ambiguous
    g = tolerance.tensor(grad, ref.grad, ref.grad_scale, where)[0].error
    return max(value, g)
