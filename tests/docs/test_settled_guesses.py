"""The questions a maintainer had to guess at (issue 27, section 2), each answered in
docs/conformance.md with the test below that shows the answer holds."""

from __future__ import annotations

import ast
import builtins
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from polgrad_reference import get_algorithm
from pytest_polgrad import ConformanceError, assert_conforms
from pytest_polgrad.core.options import MarkerError
from tests.helpers.sample_losses import reference_loss

Tensor = torch.Tensor


def _per_token_pg(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor) -> Tensor:
    """DAPO's per-token clipped surrogate (eps 0.2 / 0.28), ``[b, T]``."""
    ratio = torch.exp(logprobs - old_logprobs)
    adv = advantages[:, None]
    return torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.28))


def _failed(fn: Any, reference: Any, **options: Any) -> list[str]:
    try:
        report = assert_conforms(fn, reference, **options)
    except ConformanceError as exc:
        report = exc.report
    return sorted(r.check for r in report.results if not r.passed)


def test_a_training_step_takes_the_frameworks_spellings() -> None:
    """The policy loss's spellings hold for a step too: a step spelled as OpenRLHF's
    ``PolicyLoss`` (``log_probs``, ``old_log_probs``, ``action_mask``) conforms exactly as
    the same step under the canonical names does."""

    def spelled(
        log_probs: Tensor,
        old_log_probs: Tensor,
        advantages: Tensor,
        action_mask: Tensor,
        global_tokens: int,
        world_size: int,
    ) -> Tensor:
        per_token = _per_token_pg(log_probs, old_log_probs, advantages)
        return (per_token * action_mask).sum() / global_tokens * world_size

    def canonical(
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        global_tokens: int,
        world_size: int,
    ) -> Tensor:
        return spelled(logprobs, old_logprobs, advantages, response_mask, global_tokens, world_size)

    options = {
        "kind": "training_step",
        "max_examples": 3,
        "checks": ("full-batch", "micro-batches"),
    }
    assert _failed(spelled, "dapo", **options) == []
    assert _failed(canonical, "dapo", **options) == []
    assert _failed(spelled, "grpo", **options) == _failed(canonical, "grpo", **options) != []


def test_a_step_returns_the_loss_as_the_engine_differentiates_it() -> None:
    """The kit sums the gradients of what the step returns and applies no factor: a
    DeepSpeed step whose loss the engine divides by ``gradient_accumulation_steps``
    conforms when it returns the loss after that division, and is 1/k-off (failing
    ``micro-batches``) when it returns the loss before it."""

    def scaled_up(
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        global_tokens: int,
        world_size: int,
        gradient_accumulation_steps: int,
    ) -> Tensor:
        # a DeepSpeed trainer multiplies by k, knowing that engine.backward divides by k
        per_token = _per_token_pg(logprobs, old_logprobs, advantages)
        total = (per_token * response_mask).sum() / global_tokens * world_size
        return total * gradient_accumulation_steps

    def as_differentiated(**kw: Any) -> Tensor:
        out: Tensor = scaled_up(**kw) / kw["gradient_accumulation_steps"]  # what backward sees
        return out

    as_differentiated.__signature__ = inspect.signature(scaled_up)  # type: ignore[attr-defined]
    options = {"kind": "training_step", "max_examples": 5, "checks": ("micro-batches",)}
    assert _failed(as_differentiated, "dapo", **options) == []
    assert _failed(scaled_up, "dapo", **options) == ["micro-batches"]


def test_a_per_token_entropy_may_omit_the_mask() -> None:
    """Per-token entropies without ``response_mask`` pass (padding is not compared); a
    token-mean bonus without it averages the padding too and fails ``value``."""

    def per_token(logits: Tensor) -> Tensor:
        logp = torch.log_softmax(logits, dim=-1)
        return -(logp.exp() * logp).sum(-1)

    def bonus(logits: Tensor) -> Tensor:
        return per_token(logits).mean()

    checks = ("value", "gradient")
    assert _failed(per_token, "entropy", kind="entropy", max_examples=3, checks=checks) == []
    assert "value" in _failed(bonus, "entropy", kind="entropy", max_examples=3, checks=checks)


def test_a_derived_config_is_the_reference() -> None:
    """A setting no marker keyword reaches (clip_cov's token fraction) is set by passing
    the derived loss config: the reference loss at fraction 0.5 conforms to it, and not
    to the registry's fraction 2e-4."""
    derived = get_algorithm("clip_cov").derive(fraction=0.5).loss
    fn = reference_loss(derived, "clip_cov_half")
    assert _failed(fn, derived, max_examples=3, checks=("value",)) == []
    assert _failed(fn, "clip_cov", max_examples=3, checks=("value",)) == ["value"]


def test_token_rewards_are_zero_at_padding_only_without_rewards() -> None:
    """A function taking ``token_rewards`` alone gets verl's token-level rewards (0 at
    padding); one taking ``rewards`` too gets the drawn per-token rewards, garbage at
    padding."""
    seen: dict[str, set[float]] = {"alone": set(), "both": set()}

    def alone(token_rewards: Tensor, response_mask: Tensor) -> Tensor:
        seen["alone"] |= set(token_rewards[~response_mask].tolist())
        raise RuntimeError("recorded")

    def both(rewards: Tensor, token_rewards: Tensor, response_mask: Tensor) -> Tensor:
        seen["both"] |= set(token_rewards[~response_mask].tolist())
        raise RuntimeError("recorded")

    for fn in (alone, both):
        with pytest.raises(ConformanceError):
            assert_conforms(fn, "reinforce_pp", kind="advantages", max_examples=2)
    assert seen["alone"] == {0.0}
    assert seen["both"] - {0.0}


def test_an_aggregation_may_name_its_values_loss() -> None:
    """OpenRLHF's ``aggregate_loss(loss, loss_mask, ...)`` spelling: an aggregation taking
    its per-token values as ``loss`` is read as the kind's ``x`` (one table of value names,
    ``kinds.aggregation.VALUE_NAMES``), so it is marked without a wrapper; a token mean so
    spelled conforms to ``token-mean`` and not to ``seq-mean-token-mean``."""

    def openrlhf_style(loss: Tensor, loss_mask: Tensor) -> Tensor:
        m = loss_mask.to(loss.dtype)
        return (loss * m).sum() / m.sum()

    options = {"kind": "aggregation", "max_examples": 3, "checks": ("value", "gradient")}
    assert _failed(openrlhf_style, "token-mean", **options) == []
    assert _failed(openrlhf_style, "seq-mean-token-mean", **options) == ["gradient", "value"]


def test_grpo_on_a_loss_without_ref_logprobs_is_compared_without_its_kl_term() -> None:
    """``"grpo"`` has a k3 KL term in the loss (coef 0.04). A function without a
    ``ref_logprobs`` parameter is compared with that term left out, and the report says
    so; give the function a ``ref_logprobs`` parameter and the term is included: the same
    policy-only loss then fails ``value``. ``kl=None`` leaves it out explicitly, with no
    note (a ``ref_logprobs`` parameter then needs a default: no batch carries it)."""
    policy_term = get_algorithm("grpo").derive(kl=None).loss
    without = reference_loss(policy_term, "grpo_policy_term")

    def with_ref(
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        ref_logprobs: Tensor | None = None,
    ) -> Tensor:
        return without(
            logprobs=logprobs,
            old_logprobs=old_logprobs,
            advantages=advantages,
            response_mask=response_mask,
        )

    checks = ("value", "gradient")
    report = assert_conforms(without, "grpo", max_examples=3, checks=checks)
    notes = {n for r in report.results for n in r.notes}
    assert any("without the reference's as-loss KL term" in n for n in notes), notes
    assert "value" in _failed(with_ref, "grpo", max_examples=3, checks=checks)
    explicit = assert_conforms(with_ref, "grpo", kl=None, max_examples=3, checks=checks)
    assert not any("KL term" in n for r in explicit.results for n in r.notes)


def test_an_algorithm_option_without_a_marker_keyword_is_a_derived_config() -> None:
    """frameworks.md's ``dppo_tv(is_cap=3)`` is written
    ``polgrad_conforms(get_algorithm("dppo_tv").derive(is_cap=3.0).loss, id="dppo_tv")``:
    DPPO's IS cap has no marker keyword (``is_cap=3.0`` on the marker, or in
    ``overrides=``, is a ``MarkerError`` naming it). The reference's own DPPO-TV at cap 3
    conforms to the derived config and not to the registry's cap of 20."""
    derived = get_algorithm("dppo_tv").derive(is_cap=3.0).loss
    fn = reference_loss(derived, "dppo_tv_cap_3")
    checks = ("value", "gradient")
    assert _failed(fn, derived, id="dppo_tv", max_examples=3, checks=checks) == []
    assert _failed(fn, "dppo_tv", max_examples=3, checks=checks) == ["gradient", "value"]
    for spelled in ({"is_cap": 3.0}, {"overrides": {"is_cap": 3.0}}):
        with pytest.raises(MarkerError, match="is_cap"):
            assert_conforms(fn, "dppo_tv", max_examples=1, **spelled)


def _ppo_clip(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor) -> Tensor:
    """PPO's per-token clipped surrogate (eps 0.2 / 0.2), ``[b, T]``."""
    ratio = torch.exp(logprobs - old_logprobs)
    adv = advantages[:, None]
    return torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))


def test_dr_grpo_at_the_padded_width_is_checked_times_the_width() -> None:
    """verl's default ``seq-mean-token-sum-norm`` divides by ``B * T`` with ``T`` the
    padded width, a budget no fixed ``budget=`` equals. Multiplying the loss by ``T`` in
    the marked function leaves ``sum x / B``, Dr.GRPO at ``budget=1``: every check holds,
    ``padding-columns`` included, and a loss dividing by the longest row instead of ``T``
    fails ``value``."""

    def verl_default(
        logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
    ) -> Tensor:
        per_token = _ppo_clip(logprobs, old_logprobs, advantages) * response_mask
        return per_token.sum() / (per_token.shape[0] * per_token.shape[1])

    def longest_row(
        logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
    ) -> Tensor:
        per_token = _ppo_clip(logprobs, old_logprobs, advantages) * response_mask
        return per_token.sum() / (per_token.shape[0] * response_mask.sum(-1).max())

    def times_width(fn: Any) -> Any:
        def marked(
            logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
        ) -> Tensor:
            out: Tensor = fn(logprobs, old_logprobs, advantages, response_mask)
            return out * response_mask.shape[-1]

        return marked

    checks = ("value", "gradient", "masked-positions", "padding-columns")
    options = {"budget": 1, "max_examples": 3, "checks": checks}
    assert _failed(times_width(verl_default), "dr_grpo", **options) == []
    assert "value" in _failed(times_width(longest_row), "dr_grpo", **options)
    assert "padding-columns" in _failed(verl_default, "dr_grpo", **options)


_MASK_KINDS = [
    ("policy_loss", "grpo", ("logprobs", "old_logprobs", "advantages")),
    ("training_step", "dapo", ("logprobs", "old_logprobs", "advantages", "global_tokens")),
    ("aggregation", "token-mean", ("loss_mat",)),
    ("kl", "k3", ("logprobs", "ref_logprobs")),
    ("advantages", "grpo", ("rewards", "group_ids")),
    ("value_loss", "ppo", ("values", "old_values", "returns")),
    ("entropy", "entropy", ("logits",)),
]


@pytest.mark.parametrize(
    ("kind", "reference", "inputs"), _MASK_KINDS, ids=[k for k, *_ in _MASK_KINDS]
)
def test_every_kind_passes_the_mask_as_bool(
    kind: str, reference: str, inputs: tuple[str, ...]
) -> None:
    """docs/conformance.md: ``response_mask`` is a ``torch.bool`` tensor for every kind, so
    a framework function doing arithmetic on it (verl's ``1 - mask``) is given
    ``response_mask.long()`` by the marked function."""
    seen: set[torch.dtype] = set()

    def record(**kw: Tensor) -> Tensor:
        seen.add(kw["response_mask"].dtype)
        raise RuntimeError("recorded")

    params = [
        inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY) for n in (*inputs, "response_mask")
    ]
    record.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    with pytest.raises(ConformanceError):
        assert_conforms(record, reference, kind=kind, max_examples=1)
    assert seen == {torch.bool}


CONFORMANCE = Path(__file__).parents[2] / "docs" / "conformance.md"
_BLOCKS = re.findall(r"```python\n(.*?)```", CONFORMANCE.read_text(), flags=re.S)


def _free_names(code: str) -> set[str]:
    """Names a block reads that it neither imports, defines, assigns nor takes as a
    parameter (builtins aside)."""
    tree = ast.parse(code)
    bound = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return read - bound


@pytest.mark.parametrize("code", _BLOCKS, ids=[f"block{i}" for i in range(len(_BLOCKS))])
def test_every_conformance_example_is_self_contained(code: str) -> None:
    """Each Python example of docs/conformance.md parses on its own and imports or
    defines every name it uses (``pytest``, the framework function it marks, ...)."""
    assert _free_names(code) == set(), code
