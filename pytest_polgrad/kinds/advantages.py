"""The advantages kind: ``advantages(rewards, group_ids, response_mask[, token_rewards,
values, dones]) -> [B] or [B, T]``, compared with ``polgrad_reference.advantages`` in
float64.

The function takes any of the keyword tensors in :data:`INPUT_NAMES` (by parameter name;
``**kwargs`` takes all) and returns the advantages (or a tuple/dict whose first item /
``"advantages"`` entry they are). The reference sees what the function sees: per-token
rewards and episode ends enter it only when the function takes them. A function that does
not take ``rewards`` but takes ``token_rewards`` gets the per-token rewards with each
outcome reward placed at the row's last response token (verl's ``token_level_rewards``).
Sequence-level estimators may return ``[B]`` or the row value broadcast to ``[B, T]``
(compared at response positions). ``grouped=True`` passes ``rewards`` as
``[num_prompts, G]`` (contiguous groups of equal size, no ``group_ids``); ``layout="left"``
left-pads the token tensors at the edge (and reads a ``[B, T]`` result back).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import torch

from polgrad_reference import AdvantageConfig, AdvantageEstimator, PolgradError
from polgrad_reference.advantages import (
    Whitening,
    token_level_rewards,
)
from pytest_polgrad.core.calls import on_canonical_batch
from pytest_polgrad.core.clock import charged
from pytest_polgrad.core.golden_format import EntryScale, Tolerant
from pytest_polgrad.core.kinds import Diagnosis, Kind, KindCheck
from pytest_polgrad.core.options import ConformanceOptions, MarkerError, did_you_mean
from pytest_polgrad.core.snippets import (
    check_lines,
    config_source,
    importable,
    kind_snippet,
    pick_line,
)
from pytest_polgrad.core.verdicts import CheckFailure, Verdict
from pytest_polgrad.kinds._advantage_reference import (
    CORPUS_VERSION,
    GROUPED,
    INPUT_NAMES,
    OUTCOME,
    REFERENCES,
    SEQUENCE,
    WHITENINGS,
    AdvantageReference,
    advantage_corpus,
    candidates,
    expected_advantages,
    tolerance_scale,
)
from pytest_polgrad.kinds._packed import call_in_layout, for_layout, snippet_call, snippet_helper
from pytest_polgrad.kinds._tokens import (
    TokenContext,
    bitwise_equal,
    parameters,
    tolerance_for,
    unknown_overrides,
    worst_entries,
)
from pytest_polgrad.strategies import (
    REWARD_KINDS,
    RewardBatch,
    left_to_right,
    reward_batches,
    right_to_left,
    row_extents,
)
from pytest_polgrad.strategies._sample import filtered
from pytest_polgrad.strategies._snippet import tensor_literal

__all__ = [
    "CORPUS_VERSION",
    "INPUT_NAMES",
    "KIND",
    "REFERENCES",
    "WHITENINGS",
    "AdvantageReference",
    "AdvantagesKind",
    "expected_advantages",
]

_E = AdvantageEstimator

# ---- calling the function ----------------------------------------------------------------


@dataclasses.dataclass
class AdvantagesContext(TokenContext):
    """:class:`~pytest_polgrad.kinds._tokens.TokenContext` for the advantages kind."""

    grouped: bool = False


def _rebuilds_token_rewards(ctx: AdvantagesContext) -> bool:
    """Whether the function gets per-token rewards built by the kit (the outcome reward at
    the last token, plus the drawn token rewards for token-level estimators), which are
    exactly 0 at padding (verl's ``token_level_rewards`` convention)."""
    outcome = ctx.config.config.estimator in OUTCOME
    return "token_rewards" in ctx.takes and ("rewards" not in ctx.takes or outcome)


def _edge_inputs(ctx: AdvantagesContext, kw: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """The tensors the function takes, converted to its layout, as fresh clones."""
    out: dict[str, Any] = {}
    mask = kw["response_mask"]
    outcome = ctx.config.config.estimator in OUTCOME
    if _rebuilds_token_rewards(ctx):
        out["token_rewards"] = token_level_rewards(
            response_mask=mask,
            rewards=kw["rewards"],
            token_rewards=None if outcome else kw.get("token_rewards"),
        )
    for name in INPUT_NAMES:
        if name in ctx.takes and name in kw and name not in out:
            out[name] = kw[name].detach().clone()
    if ctx.grouped:
        _, counts = torch.unique(kw["group_ids"], return_counts=True)
        out["rewards"] = out["rewards"].reshape(-1, int(counts[0]))
        out.pop("group_ids", None)
    if ctx.options.layout == "left":
        extents = row_extents(mask)
        for name, t in out.items():
            if t.dim() == 2 and not (ctx.grouped and name == "rewards"):
                out[name] = right_to_left(t, extents)
    return out


def _pick(result: object, key: object) -> object:
    if isinstance(result, Mapping):
        k = "advantages" if key is None else key
        if k not in result:
            raise Verdict(
                f"the function returned a dict without key {k!r} (keys: "
                f"{sorted(map(str, result))}); name the entry with loss='key'"
            )
        return result[k]
    if isinstance(result, (tuple, list)) and result:
        index = 0 if key is None else key
        if not isinstance(index, int) or not -len(result) <= index < len(result):
            raise Verdict(
                f"the function returned a {type(result).__name__} of {len(result)} items; "
                f"loss={key!r} does not index it"
            )
        return result[index]
    return result


def call_advantages(
    ctx: AdvantagesContext, kw: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Call the function; return its advantages in the canonical layout (``[B]`` or
    right-padded ``[B, T]``, detached) and the tensors it was given (after the call)."""
    given = _edge_inputs(ctx, kw)
    mask = kw["response_mask"]
    result = call_in_layout(ctx.options, ctx.fn, given, mask, "a valid batch of rewards")
    adv = _pick(result, ctx.options.loss)
    b, width = mask.shape
    if not isinstance(adv, torch.Tensor) or not adv.is_floating_point():
        raise Verdict(
            f"the function returned {type(adv).__name__}"
            + (f" of dtype {adv.dtype}" if isinstance(adv, torch.Tensor) else "")
            + "; advantages must be a floating tensor [B] or [B, T]"
        )
    adv = adv.detach()
    if ctx.grouped and adv.dim() == 2 and adv.numel() == b and adv.shape != mask.shape:
        adv = adv.reshape(b)
    if adv.shape not in ((b,), (b, width)):
        raise Verdict(
            f"the function returned advantages of shape {list(adv.shape)}; expected [B] = "
            f"[{b}] or [B, T] = [{b}, {width}]"
        )
    if adv.dim() == 2 and ctx.options.layout == "left":
        adv = left_to_right(adv, row_extents(mask))
    return adv, given


def _compare(
    ctx: AdvantagesContext,
    kw: Mapping[str, torch.Tensor],
    actual: torch.Tensor,
    expected: torch.Tensor,
    what: str = "advantages",
    rows: torch.Tensor | None = None,
    keep: torch.Tensor | None = None,
) -> float:
    """``rows`` (bool ``[B]``): judge only those rows; ``keep`` (bool, ``actual``'s shape):
    only those entries."""
    mask = kw["response_mask"]
    if expected.dim() == 2 and actual.dim() == 1:
        raise Verdict(
            "the function returned [B] advantages, but the reference estimator "
            f"{ctx.config.config.estimator.value!r} is token-level ([B, T])"
        )
    scale = tolerance_scale(ctx.config, kw, expected)
    if expected.dim() == 1 and actual.dim() == 2:
        expected = expected[:, None].expand_as(actual)
        scale = scale[:, None].expand_as(actual)
    where = mask if expected.dim() == 2 else torch.ones_like(expected, dtype=torch.bool)
    if rows is not None:
        where = where & (rows[:, None] if where.dim() == 2 else rows)
    if keep is not None:
        where = where & keep
    cmp, ratios = ctx.tolerance.tensor(actual, expected, scale, where)
    if not cmp.ok:
        bad = int((ratios > 1).sum())
        shown = "row" if expected.dim() == 1 else "response position"
        raise CheckFailure(
            f"{what} differ from the reference at {bad} {shown}(s), worst by "
            f"{cmp.error:.3g}x the tolerance",
            entries=worst_entries(ratios, expected, actual.to(torch.float64)),
            error=cmp.error,
        )
    return ctx.record(cmp, what)


def _reference(ctx: AdvantagesContext, kw: Mapping[str, torch.Tensor]) -> torch.Tensor:
    try:
        return expected_advantages(ctx.config, kw, ctx.takes)
    except PolgradError as exc:  # the reference itself refuses the batch (e.g. 0/0)
        raise Verdict(f"the reference cannot compute this batch: {exc}") from exc


# ---- checks -------------------------------------------------------------------------------


def _runs(ctx: Any, check: str) -> bool:
    """Whether ``check`` runs for this function (``checks=`` on the marker): a check hands a
    finding to another only when that one runs, so that no finding is lost."""
    wanted = ctx.options.checks
    return wanted is None or check in wanted


def _equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise equality, NaN equal to NaN."""
    return (a == b) | (torch.isnan(a) & torch.isnan(b))


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(_equal(a, b).all())


def _stateful(ctx: Any, kw: Mapping[str, Any], first: torch.Tensor, check: str) -> bool:
    """After ``check`` failed on ``kw``: whether a second call differs from ``first`` (the
    function's result there) while the deterministic check runs; the failure is then
    that check's finding (a stateful or random function), and a note says so."""
    if not _runs(ctx, "deterministic") or _same(call_advantages(ctx, kw)[0], first):
        return False
    ctx.notes.add(
        f"{check} judged only batches on which two calls give the same result (the function "
        "is not deterministic: the deterministic check's finding)"
    )
    return True


def _check_value(
    ctx: Any, kw: Mapping[str, Any], check: str = "value", rows: torch.Tensor | None = None
) -> float:
    """The function against the reference (on ``rows`` only, when given)."""
    actual, _ = call_advantages(ctx, kw)
    try:
        return _compare(ctx, kw, actual, _reference(ctx, kw), rows=rows)
    except CheckFailure:
        if _stateful(ctx, kw, actual, check):
            return 0.0
        raise


def _unit_scale(kw: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same batch with each group's rewards divided by its largest ``|reward|`` (the
    whole batch's without ``group_ids``): the extreme domain's scales undone."""
    rewards = kw["rewards"].to(torch.float64)
    ids = kw.get("group_ids", torch.zeros(rewards.shape[0], dtype=torch.int64))
    scale = torch.ones_like(rewards)
    for label in set(ids.tolist()):
        rows = ids == label
        top = rewards[rows].abs().max()
        if bool(top > 0) and bool(torch.isfinite(top)):
            scale[rows] = top
    out = dict(kw)
    out["rewards"] = (rewards / scale).to(kw["rewards"].dtype)
    return out


def _check_extreme(ctx: Any, kw: Mapping[str, Any]) -> float:
    """The value check on the extreme domain, judging only what scale changes: a batch on
    which the function is also wrong with its rewards at unit scale (:func:`_unit_scale`)
    is the value check's finding (a wrong std read as a scale bug), not this check's."""
    try:
        return _check_value(ctx, kw, "extreme-values")
    except CheckFailure:
        if not _runs(ctx, "value"):
            raise
        try:
            _check_value(ctx, _unit_scale(kw), "extreme-values")
        except CheckFailure:
            ctx.notes.add(
                "extreme-values judged only batches on which the function is right with the "
                "rewards at unit scale (a deviation there is the value check's)"
            )
            return 0.0
        raise


def _degenerate_rows(kw: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Bool ``[B]``: rows of singleton groups and of groups whose rewards are all equal."""
    ids, rewards = kw["group_ids"].tolist(), kw["rewards"].tolist()
    members: dict[int, list[int]] = {}
    for row, label in enumerate(ids):
        members.setdefault(label, []).append(row)
    out = torch.zeros(len(ids), dtype=torch.bool)
    for group in members.values():
        if len(group) == 1 or len({rewards[r] for r in group}) == 1:
            out[group] = True
    return out


def _check_degenerate(ctx: Any, kw: Mapping[str, Any]) -> float:
    """The reference's advantages at the rows of singleton and constant-reward groups only
    (the other rows are the value check's: a wrong std there must not be reported as a
    singleton bug)."""
    if "group_ids" not in kw or "rewards" not in kw:
        return _check_value(ctx, kw, "singleton-constant")
    rows = _degenerate_rows(kw)
    if not bool(rows.any()):
        return 0.0  # a corpus batch with no such group: nothing of this check's to judge
    return _check_value(ctx, kw, "singleton-constant", rows=rows)


def _own(
    ctx: Any,
    kw: Mapping[str, torch.Tensor],
    actual: torch.Tensor,
    base: torch.Tensor,
    check: str,
    perm: torch.Tensor | None = None,
) -> float:
    """Compare the function's result on changed inputs (``actual``) with its own result
    ``base`` on ``kw``, judging only what the change did: an entry non-finite in both (a
    NaN advantage, the value or singleton-constant check's finding) is the same; and when
    the two differ, a second call on the original inputs (``kw``, or ``moved[inverse of
    perm]``) that differs from ``base`` is the deterministic check's finding
    (:func:`_stateful`), not ``check``'s."""
    both = ~torch.isfinite(base) & ~torch.isfinite(actual)
    same = both & _equal(base, actual)
    expected = base.to(torch.float64).nan_to_num(0.0)
    try:
        return _compare(ctx, kw, actual, expected, keep=~same)
    except CheckFailure:
        if perm is None:
            original, first = kw, base
        else:
            inverse = torch.argsort(perm)
            original = {k: t[inverse] for k, t in kw.items()}
            first = base[inverse]
        if _stateful(ctx, original, first, check):
            return 0.0
        raise


def _permutation(kw: Mapping[str, torch.Tensor], *, contiguous: bool) -> torch.Tensor:
    """Groups in reverse order, rows within each group rotated by one, then (unless
    ``contiguous``, the ``[num_prompts, G]`` layout) the groups' rows interleaved
    round-robin, so a function that assumes contiguous groups shows (deterministic)."""
    ids = kw["group_ids"].tolist()
    groups: list[list[int]] = []
    for label in reversed(list(dict.fromkeys(ids))):
        rows = [i for i, g in enumerate(ids) if g == label]
        groups.append(rows[1:] + rows[:1])
    if contiguous:
        order = [i for rows in groups for i in rows]
    else:
        depth = max(len(rows) for rows in groups)
        order = [rows[k] for k in range(depth) for rows in groups if k < len(rows)]
    return torch.tensor(order, dtype=torch.int64)


def _check_order(ctx: Any, kw: Mapping[str, Any]) -> float:
    """The function's own result on the permuted batch is its result, permuted."""
    perm = _permutation(kw, contiguous=ctx.grouped)
    moved = {k: t[perm] for k, t in kw.items()}
    base, _ = call_advantages(ctx, kw)
    out, _ = call_advantages(ctx, moved)
    try:
        return _own(ctx, moved, out, base[perm], "group-order", perm)
    except CheckFailure as exc:
        raise CheckFailure(
            f"reordering the groups and the rows within each group: {exc.message} "
            "(compared with the function's own result, permuted: it depends on the order)",
            entries=exc.entries,
            error=exc.error,
        ) from None


def _check_isolation(ctx: Any, kw: Mapping[str, Any]) -> float:
    """Changing one group's rewards leaves every other group's advantages unchanged."""
    ids = kw["group_ids"]
    first = ids[0]
    if bool((ids == first).all()):
        return 0.0
    changed = dict(kw)
    bump = torch.where(ids == first, kw["rewards"] * 2.0 + 1.0, kw["rewards"])
    changed["rewards"] = bump.to(kw["rewards"].dtype)
    before, _ = call_advantages(ctx, kw)
    after, _ = call_advantages(ctx, changed)
    others = ids != first
    if before.dim() == 2:
        others = others[:, None] & kw["response_mask"]
    moved = others & ~((before == after) | (torch.isnan(before) & torch.isnan(after)))
    if bool(moved.any()):
        if _stateful(ctx, kw, before, "group-isolation"):
            return 0.0
        pos = [tuple(p) for p in moved.nonzero()[:4].tolist()]
        raise CheckFailure(
            f"changing the rewards of group {int(first)} only changed the advantages of "
            f"other groups at {pos}: the estimator mixes groups (a batch-wide mean or std?)",
            entries=[(p, float(before[p]), float(after[p])) for p in pos],
        )
    return 0.0


def _check_gradient(ctx: Any, kw: Mapping[str, Any]) -> float:
    """No gradient flows into padding positions of the per-token inputs (exactly 0 there,
    never NaN), when the advantages carry gradient at all."""
    given = _edge_inputs(ctx, kw)
    leaves = {
        k: t.requires_grad_(True)
        for k, t in given.items()
        if t.is_floating_point() and k in ("rewards", "token_rewards", "values")
    }
    mask = kw["response_mask"]
    result = call_in_layout(ctx.options, ctx.fn, given, mask, "a valid batch of rewards")
    adv = _pick(result, ctx.options.loss)
    if not isinstance(adv, torch.Tensor) or not adv.requires_grad:
        ctx.notes.add("advantages are detached from rewards and values (no gradient flows)")
        return 0.0
    weights = torch.linspace(0.5, 1.5, adv.numel(), dtype=adv.dtype).reshape(adv.shape)
    with charged():  # the backward through the function's result is its own
        grads = torch.autograd.grad((adv * weights).sum(), list(leaves.values()), allow_unused=True)
    for name, g in zip(leaves, grads, strict=True):
        if g is None:
            continue
        if ctx.options.layout == "left" and g.dim() == 2:
            g = left_to_right(g, row_extents(mask))
        rebuilt = name == "token_rewards" and _rebuilds_token_rewards(ctx)  # 0 at padding
        if not rebuilt and g.dim() == 2 and g.shape == mask.shape and bool((g[~mask] != 0).any()):
            # (NaN != 0 too: a NaN gradient at padding is a leak)
            pos = [tuple(p) for p in ((g != 0) & ~mask).nonzero()[:4].tolist()]
            raise CheckFailure(
                f"gradient flows into padding positions of {name} at {pos}: padding values "
                "reach the advantages",
                entries=[(p, 0.0, float(g[p])) for p in pos],
            )
    return 0.0


def _regarble(kw: Mapping[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """The same batch with different garbage at padding of every float token tensor."""
    mask = kw["response_mask"]
    g = torch.Generator().manual_seed(seed)
    out = dict(kw)
    for name, t in kw.items():
        if t.is_floating_point() and t.dim() == 2:
            junk = (torch.rand(t.shape, generator=g, dtype=torch.float64) * 2 - 1) * 7e3
            out[name] = torch.where(mask, t, junk.to(t.dtype))
    return out


def _check_padding_values(ctx: Any, kw: Mapping[str, Any]) -> float:
    """Other garbage at padding leaves the function's own result unchanged."""
    if bool(kw["response_mask"].all()):
        return 0.0
    before, _ = call_advantages(ctx, kw)
    after, _ = call_advantages(ctx, _regarble(kw, 7))
    try:
        return _own(ctx, kw, after, before, "padding-values")
    except CheckFailure as exc:
        raise CheckFailure(
            f"with other values at padding: {exc.message} (padding values reach the result)",
            entries=exc.entries,
            error=exc.error,
        ) from None


def _check_padding_columns(ctx: Any, kw: Mapping[str, Any]) -> float:
    extra = 3
    wide: dict[str, torch.Tensor] = {}
    for name, t in kw.items():
        if t.dim() == 2:
            fill: Any = False if t.dtype == torch.bool else 123.0
            wide[name] = torch.nn.functional.pad(t, (0, extra), value=fill)
        else:
            wide[name] = t
    base, _ = call_advantages(ctx, kw)
    out, _ = call_advantages(ctx, wide)
    if out.dim() == 2:
        out = out[:, : kw["response_mask"].shape[1]]
    try:
        return _own(ctx, kw, out, base, "padding-columns")
    except CheckFailure as exc:
        raise CheckFailure(
            f"with {extra} more padding columns: {exc.message} (the result depends on the "
            "padded width)",
            entries=exc.entries,
            error=exc.error,
        ) from None


def _check_inputs_unchanged(ctx: Any, kw: Mapping[str, Any]) -> float:
    before = _edge_inputs(ctx, kw)
    _, given = call_advantages(ctx, kw)
    for name, t in given.items():
        same = bitwise_equal(t, before[name])
        if not bool(same.all()):
            pos = [tuple(p) for p in (~same).nonzero()[:4].tolist()]
            raise CheckFailure(
                f"the function modified its input {name!r} in place at {pos}",
                entries=[(p, float(before[name][p]), float(t[p])) for p in pos],
            )
    return 0.0


def _check_deterministic(ctx: Any, kw: Mapping[str, Any]) -> float:
    first, _ = call_advantages(ctx, kw)
    second, _ = call_advantages(ctx, kw)
    same = (first == second) | (torch.isnan(first) & torch.isnan(second))
    if not bool(same.all()):
        pos = [tuple(p) for p in (~same).nonzero()[:4].tolist()]
        raise CheckFailure(
            "the function returned different advantages for the same batch on two calls",
            entries=[(p, float(first[p]), float(second[p])) for p in pos],
        )
    return 0.0


# ---- the kind -----------------------------------------------------------------------------

_OVERRIDES = frozenset(
    {
        "estimator",
        "scale_by_std",
        "std_eps",
        "unbiased_std",
        "singleton",
        "gamma",
        "lam",
        "whiten",
        "whitening",
        "eps_in_sqrt",
        "grouped",
    }
)


def _kind_check(
    name: str, summary: str, run: Callable[[Any, Mapping[str, Any]], float], **kw: Any
) -> KindCheck:
    return KindCheck(name=name, summary=summary, run=run, **kw)


_CHECKS: dict[str, KindCheck] = {
    c.name: c
    for c in (
        _kind_check("value", "advantages equal the reference estimator", _check_value),
        _kind_check(
            "extreme-values",
            "advantages equal the reference for rewards scaled from 1e-3 to 1e15 (judged on "
            "batches where they do at unit scale)",
            _check_extreme,
            domain="extreme",
        ),
        _kind_check(
            "singleton-constant",
            "singleton and constant-reward groups get the documented advantage, not NaN",
            _check_degenerate,
            domain="degenerate",
        ),
        _kind_check(
            "group-order",
            "reordering groups and the responses within a group reorders the advantages",
            _check_order,
        ),
        _kind_check(
            "group-isolation",
            "a group's rewards change only that group's advantages",
            _check_isolation,
        ),
        _kind_check(
            "no-gradient-leak",
            "no gradient flows from the advantages into padding positions of the inputs",
            _check_gradient,
            semantic=False,
        ),
        _kind_check(
            "padding-values",
            "values at padding positions do not change the advantages",
            _check_padding_values,
            semantic=False,
        ),
        _kind_check(
            "padding-columns",
            "extra padding columns do not change the advantages",
            _check_padding_columns,
            semantic=False,
        ),
        _kind_check(
            "inputs-unchanged",
            "the function does not modify its inputs in place",
            _check_inputs_unchanged,
            semantic=False,
        ),
        _kind_check(
            "deterministic",
            "the same batch gives the same advantages twice",
            _check_deterministic,
            semantic=False,
        ),
    )
}


def _override(options: ConformanceOptions) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split the marker's overrides into config fields and reference knobs."""
    unknown_overrides("advantages", options, _OVERRIDES)
    over = dict(options.overrides)
    knobs: dict[str, Any] = {
        k: over.pop(k) for k in ("whitening", "eps_in_sqrt", "grouped") if k in over
    }
    return over, knobs


class AdvantagesKind(Kind):
    """The advantages :class:`~pytest_polgrad.core.kinds.Kind` (see the module docstring)."""

    name = "advantages"
    summary = (
        "advantages(rewards [B], group_ids [B], response_mask [B, T][, token_rewards, values, "
        "dones]) -> advantages [B] or [B, T]"
    )
    override_keys = _OVERRIDES

    def resolve(self, options: ConformanceOptions) -> AdvantageReference:
        ref = options.reference
        fields, knobs = _override(options)
        if isinstance(ref, AdvantageReference):
            base = ref
        elif isinstance(ref, AdvantageConfig):
            base = AdvantageReference(ref)
        elif isinstance(ref, str) and ref in REFERENCES:
            base = AdvantageReference(REFERENCES[ref])
        else:
            names = sorted(REFERENCES)
            raise MarkerError(
                f"the advantages kind takes a reference among {names} or an AdvantageConfig, "
                f"got {ref!r}{did_you_mean(ref, names)}"
            )
        try:
            cfg = base.config.replace(**fields) if fields else base.config
        except PolgradError as exc:
            raise MarkerError(f"advantages override: {exc}") from exc
        whitening = base.whitening
        if "whitening" in knobs:
            w = knobs["whitening"]
            if isinstance(w, str) and w in WHITENINGS:
                whitening = WHITENINGS[w]
            elif isinstance(w, Whitening):
                whitening = w
            else:
                raise MarkerError(
                    f"whitening must be one of {sorted(WHITENINGS)} or a Whitening, got {w!r}"
                    + did_you_mean(w, WHITENINGS)
                )
        for flag in ("eps_in_sqrt", "grouped"):
            if flag in knobs and not isinstance(knobs[flag], bool):
                raise MarkerError(f"{flag} must be True or False, got {knobs[flag]!r}")
        if knobs.get("grouped") and cfg.estimator not in GROUPED:
            raise MarkerError(f"grouped=True needs a group estimator, not {cfg.estimator.value!r}")
        return AdvantageReference(
            cfg,
            whitening=whitening,
            eps_in_sqrt=bool(knobs.get("eps_in_sqrt", base.eps_in_sqrt)),
            ignore_dones=base.ignore_dones,
        )

    def checks(self, config: Any, options: ConformanceOptions) -> list[KindCheck]:
        ref: AdvantageReference = config
        est = ref.config.estimator
        skip = set()
        if est not in GROUPED:
            skip |= {"singleton-constant", "group-isolation"}
        if ref.whitens or est not in SEQUENCE:
            skip.add("group-isolation")
        return for_layout([c for n, c in _CHECKS.items() if n not in skip], options)

    def check(self, name: str) -> KindCheck | None:
        return _CHECKS.get(name)

    def context(
        self, fn: Callable[..., Any], name: str, config: Any, options: ConformanceOptions
    ) -> AdvantagesContext:
        ref: AdvantageReference = config
        takes = parameters(fn, INPUT_NAMES)
        est = ref.config.estimator
        need = {"rewards", "token_rewards"}
        if not takes & need:
            raise Verdict(
                f"{name} takes none of rewards, token_rewards; an advantages function takes "
                f"keyword tensors among {', '.join(INPUT_NAMES)}"
            )
        grouped = bool(options.overrides.get("grouped", False))
        if est in GROUPED and "group_ids" not in takes and not grouped:
            raise Verdict(
                f"{name} takes no group_ids; pass them, or declare grouped=True to receive "
                "rewards as [num_prompts, G]"
            )
        if est is _E.GAE and "values" not in takes:
            raise Verdict(f"{name} takes no values; GAE needs the critic's values [B, T]")
        return AdvantagesContext(
            fn=fn,
            name=name,
            options=options,
            config=ref,
            tolerance=tolerance_for(options),
            takes=takes,
            grouped=grouped,
        )

    # -- inputs --

    def _shape(self, ctx: Any, check: KindCheck) -> dict[str, Any]:
        ref: AdvantageReference = ctx.config
        est = ref.config.estimator
        options: ConformanceOptions = ctx.options
        dtype = ctx.tolerance.input_dtype
        shape: dict[str, Any] = dict(
            dtype=dtype,
            max_length=min(12, options.max_length),
            max_groups=min(4, options.max_batch),
            max_group_size=16 if dtype is not torch.float16 else 8,
            token_rewards=est not in OUTCOME,
            values=est is _E.GAE,
            dones=est is _E.GAE,
            padding="nan" if options.padding_nan else "garbage",
            equal_sizes=ctx.grouped,
            shuffle=False if ctx.grouped else None,
        )
        if dtype is torch.float16:
            shape["kinds"] = ("binary", "equal", "grid", "one-hot")
        if check.domain == "extreme":
            shape["domain"] = "extreme"
        if check.domain == "degenerate":
            shape.update(kinds=("equal", "binary"), max_group_size=3)
        return shape

    def pool_key(self, ctx: Any, check: KindCheck) -> Hashable:
        return tuple(sorted((k, repr(v)) for k, v in self._shape(ctx, check).items()))

    def strategy(self, ctx: Any, check: KindCheck) -> Any:
        shape = self._shape(ctx, check)
        if check.domain == "degenerate":
            drawn = filtered(reward_batches(min_group_size=1, **shape), _degenerate)
        else:
            drawn = reward_batches(**shape)
        ref: AdvantageReference = ctx.config
        # a batch the reference cannot compute (whitening over one token) is not drawn
        return filtered(drawn, ref.computes) if ref.whitens else drawn

    def corpus(self, ctx: Any) -> dict[str, RewardBatch]:
        found = advantage_corpus(ctx.tolerance.input_dtype, grouped=ctx.grouped)
        ref: AdvantageReference = ctx.config
        return {name: b for name, b in found.items() if ref.computes(b)}

    def corpus_for(self, ctx: Any, check: KindCheck) -> dict[str, RewardBatch]:
        """No canonical batch has extreme reward scales: ``extreme-values`` runs on its own
        domain only (on the corpus it would repeat ``value``'s finding under its name)."""
        return {} if check.domain == "extreme" else self.corpus(ctx)

    # -- reports --

    def diagnose(self, ctx: Any, inputs: Any) -> Diagnosis:
        return diagnose_advantages(ctx, inputs)

    def snippet(self, ctx: Any, inputs: Any, check: KindCheck) -> str:
        return advantages_snippet(ctx, inputs, check)

    def shown(self, ctx: Any, inputs: Any) -> RewardBatch:
        """The failing batch as the function sees it (:func:`shown_batch`)."""
        return shown_batch(ctx, inputs)

    def golden(self, ctx: Any) -> Tolerant:
        data: dict[str, dict[str, torch.Tensor]] = {}
        scales: dict[str, EntryScale] = {}
        for name, batch in self.corpus(ctx).items():
            kw = batch.as_kwargs()
            with on_canonical_batch(name):
                out, _ = call_advantages(ctx, kw)
            data[name] = {"advantages": out}
            own = out.to(torch.float64).nan_to_num(0.0, 0.0, 0.0).abs()
            scales[f"{name}/advantages"] = EntryScale(own + own.max() + 1e-300)
        return Tolerant(data, tolerance=ctx.tolerance, scales=scales, corpus=CORPUS_VERSION)


def _degenerate(batch: RewardBatch) -> bool:
    return any(s == 1 for s in batch.group_sizes) or "equal" in batch.kinds


# ---- diagnosis ----------------------------------------------------------------------------


def _error(
    ctx: AdvantagesContext,
    cand: AdvantageReference,
    observed: Mapping[str, tuple[Mapping[str, torch.Tensor], torch.Tensor]],
) -> float:
    probe = dataclasses.replace(ctx, config=cand, worst=0.0, notes=set())
    worst = 0.0
    for kw, actual in observed.values():
        try:
            expected = expected_advantages(cand, kw, ctx.takes)
            worst = max(worst, _compare(probe, kw, actual, expected))
        except CheckFailure as exc:
            worst = max(worst, exc.error)
        except (PolgradError, Verdict):
            return math.inf
    return worst


def _label(ref: AdvantageReference) -> str:
    names = ref.names()
    if len(names) > 3:
        names = [*names[:3], f"and {len(names) - 3} more registry entries"]
    return ref.describe() + (f" — {', '.join(names)}" if names else "")


def diagnose_advantages(ctx: AdvantagesContext, inputs: Any) -> Diagnosis:
    """Which candidate semantics the function computes on the corpus (and on ``inputs``)."""
    observed = {}
    for name, batch in advantage_corpus(ctx.tolerance.input_dtype, grouped=ctx.grouped).items():
        kw = batch.as_kwargs()
        try:
            observed[name] = (kw, call_advantages(ctx, kw)[0])
        except Verdict as exc:
            return Diagnosis(f"could not evaluate the function on corpus batch {name!r}: {exc}", "")
    ranked = sorted(
        ((c, _error(ctx, c, observed)) for c in candidates(ctx.config)), key=lambda x: x[1]
    )
    best, err = ranked[0]
    reference = f"the reference {ctx.options.reference_id!r} is {ctx.config.describe()}"
    if err > 1.0:
        return Diagnosis(
            f"no candidate semantics matches on the corpus; the closest is {_label(best)} "
            f"(off by {err:.3g} tolerances); {reference}",
            "",
        )
    if best == ctx.config:
        text = f"the function matches the reference on the corpus ({_label(best)})"
    else:
        text = f"this advantage function matches {_label(best)} on the corpus; {reference}"
    if inputs is not None:
        kw = inputs.as_kwargs()
        try:
            ok = _error(ctx, best, {"failing": (kw, call_advantages(ctx, kw)[0])}) <= 1.0
        except Verdict:
            ok = False
        if not ok:
            text += "; that match does not hold on the failing batch (a batch-dependent deviation)"
    short = best.names()
    return Diagnosis(text, short[0] if short else best.describe())


# ---- the failing batch as reported ----------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class ShownBatch(RewardBatch):
    """A failing batch as a report shows it: only the tensors the function and the
    reference read (:func:`shown_batch`), described in those terms."""

    def describe(self) -> str:
        """E.g. ``B=6 in 2 group(s) of sizes [4, 2] (rewards per group: binary, equal),
        response lengths [1, 3, ...], T=5, float64[, with token_rewards]``."""
        patterns = f" (rewards per group: {', '.join(self.kinds)})" if self.kinds else ""
        extra = [n for n in ("token_rewards", "values", "dones") if getattr(self, n) is not None]
        lengths = [int(n) for n in self.response_mask.sum(dim=1)]
        return (
            f"B={self.rewards.shape[0]} in {len(self.group_sizes)} group(s) of sizes "
            f"{self.group_sizes}{patterns}, response lengths {lengths}, "
            f"T={self.response_mask.shape[1]}, {str(self.rewards.dtype).removeprefix('torch.')}"
            + (f", with {', '.join(extra)}" if extra else "")
        )


def shown_batch(ctx: AdvantagesContext, inputs: RewardBatch) -> ShownBatch:
    """``inputs`` without the tensors neither the function nor the reference reads (a
    GRPO estimator taking ``(rewards, group_ids)`` reads no ``token_rewards``, ``values``
    or ``dones``; :func:`expected_advantages` reads per-token rewards only for a token-level
    estimator of a function that takes them), and without reward-pattern labels that
    are not patterns (a corpus batch's are its name, which the report states). The check
    gives the same outcome on it: :func:`_edge_inputs` passes the function only what it
    takes (``rewards``, ``group_ids`` and ``response_mask`` stay: the kit reads them)."""
    est = ctx.config.config.estimator
    read = {
        "token_rewards": "token_rewards" in ctx.takes and est not in OUTCOME,
        "values": "values" in ctx.takes,
        "dones": "dones" in ctx.takes,
    }
    fields = {f.name: getattr(inputs, f.name) for f in dataclasses.fields(RewardBatch)}
    for name, kept in read.items():
        if not kept:
            fields[name] = None
    if not set(inputs.kinds) <= set(REWARD_KINDS):
        fields["kinds"] = ()
    return ShownBatch(**fields)


def _mask_lines(inputs: RewardBatch) -> tuple[str, str] | None:
    """``(literal line, compact line)``: the response mask's literal as the batch's
    snippet writes it, and the one line that rebuilds it from the response lengths (None
    when the mask is not right-padded, which the canonical layout always is)."""
    mask = inputs.response_mask
    lengths = [int(n) for n in mask.sum(dim=1)]
    width = mask.shape[1]
    if not torch.equal(mask, torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]):
        return None
    literal = f"response_mask = {tensor_literal(mask)}"
    compact = (
        f"response_mask = torch.arange({width})[None, :] < torch.tensor({lengths})[:, None]"
        "  # right-padded: row b holds its response length of True"
    )
    return literal, compact


# ---- the snippet --------------------------------------------------------------------------


def _run_lines(ctx: AdvantagesContext, fn_name: str, grad: bool) -> list[str]:
    """``run(inputs)``: the tensors the function takes, as :func:`call_advantages` builds
    them, the call, and its advantages back in the canonical layout."""
    outcome = ctx.config.config.estimator in OUTCOME
    left = ctx.options.layout == "left"
    takes = [n for n in INPUT_NAMES if n in ctx.takes]
    lines = [
        *snippet_helper(ctx.options),
        "",
        "",
        f"def run(inputs, grad={grad}):",
        '    """Call the function as the check did; with grad, the gradients of',
        "    sum(advantages * linspace(0.5, 1.5)) w.r.t. its float inputs (as the check",
        '    takes them)."""',
        "    mask = inputs['response_mask']",
        "    kw = {}",
    ]
    if _rebuilds_token_rewards(ctx):
        token = "None" if outcome else "inputs.get('token_rewards')"
        lines += [
            "    # per-token rewards built by the kit: the outcome reward at the last token"
            + ("" if outcome else ", plus the drawn per-token rewards"),
            "    kw['token_rewards'] = token_level_rewards(response_mask=mask, "
            f"rewards=inputs['rewards'], token_rewards={token})",
        ]
    lines += [
        f"    for name in {takes!r}:",
        "        if name in inputs and name not in kw:",
        "            kw[name] = inputs[name].detach().clone()",
    ]
    if ctx.grouped:
        lines += [
            "    _, counts = torch.unique(inputs['group_ids'], return_counts=True)",
            "    kw['rewards'] = kw['rewards'].reshape(-1, int(counts[0]))  # [num_prompts, G]",
            "    kw.pop('group_ids', None)",
        ]
    if left:
        keep = " and not name == 'rewards'" if ctx.grouped else ""
        lines += [
            "    extents = row_extents(mask)  # the function takes left-padded token tensors",
            "    kw = {name: right_to_left(t, extents) if t.dim() == 2" + keep + " else t",
            "          for name, t in kw.items()}",
        ]
    lines += [
        "    leaves = {}",
        "    if grad:",
        "        leaves = {k: t.requires_grad_(True) for k, t in kw.items()",
        "                  if t.is_floating_point()",
        "                  and k in ('rewards', 'token_rewards', 'values')}",
        "    before = {k: v.detach().clone() for k, v in kw.items()}",
        f"    out = {snippet_call(ctx.options, fn_name)}",
        pick_line(ctx.options.loss, "advantages"),
        "    grads = None",
        "    if grad:",
        "        weights = torch.linspace(0.5, 1.5, out.numel(), dtype=out.dtype)",
        "        weights = weights.reshape(out.shape)",
        "        found = torch.autograd.grad((out * weights).sum(), list(leaves.values()),",
        "                                    allow_unused=True)",
        "        grads = dict(zip(leaves, found))",
    ]
    if left:
        lines += [
            "        grads = {k: left_to_right(g, extents) if g is not None and g.dim() == 2",
            "                 else g for k, g in grads.items()}",
        ]
    lines += ["    adv = out.detach()"]
    if ctx.grouped:
        lines += [
            "    if adv.dim() == 2 and adv.numel() == mask.shape[0] and adv.shape != mask.shape:",
            "        adv = adv.reshape(mask.shape[0])",
        ]
    if left:
        lines += ["    adv = left_to_right(adv, extents) if adv.dim() == 2 else adv"]
    lines += ["    return adv, grads, kw, before"]
    return lines


def advantages_snippet(ctx: AdvantagesContext, inputs: RewardBatch, check: KindCheck) -> str:
    """Standalone Python: the function called as ``check`` called it, the float64 reference
    advantages (:func:`expected_advantages`, the estimator written out), and what the check
    compared."""
    ref: AdvantageReference = ctx.config
    where = importable(ctx.fn, ctx.name)
    takes = sorted(ctx.takes)
    definitions = [
        "",
        "",
        f"REFERENCE = {config_source(ref)}",
        f"TAKES = frozenset({takes!r})  # what the function takes: the reference sees the same",
        *_run_lines(ctx, where.call, check.name == "no-gradient-leak"),
        "",
        "",
        "def reference(inputs, out):",
        f'    """The float64 reference: {ref.describe()}."""',
        "    return expected_advantages(REFERENCE, inputs, TAKES), None",
    ]
    kw = inputs.as_kwargs()
    mask = "inputs['response_mask']"
    if check.name == "group-order":
        perm = _permutation(kw, contiguous=ctx.grouped).tolist()
        lines = [
            "",
            "out, grad, passed, before = run(inputs)",
            "# the check: groups in reverse order, the rows of each group rotated by one"
            + ("" if ctx.grouped else ", the groups' rows interleaved"),
            f"perm = torch.tensor({perm!r})",
            "moved = {k: t[perm] for k, t in inputs.items()}",
            "out2, _, _, _ = run(moved)",
            "show('function on the reordered batch', out2, 'its result on the original, "
            "reordered', out[perm], moved['response_mask'])",
        ]
    elif check.name == "group-isolation":
        lines = [
            "",
            "out, grad, passed, before = run(inputs)",
            "# the check: change the rewards of the first row's group only",
            "ids = inputs['group_ids']",
            "changed = dict(inputs)",
            "changed['rewards'] = torch.where(ids == ids[0], inputs['rewards'] * 2.0 + 1.0, "
            "inputs['rewards']).to(inputs['rewards'].dtype)",
            "out2, _, _, _ = run(changed)",
            "others = ids != ids[0]",
            f"others = others[:, None] & {mask} if out.dim() == 2 else others",
            "moved = others & ~((out == out2) | (out.isnan() & out2.isnan()))",
            "print('advantages of other groups that changed (must be none):',",
            "      [(p, out[p].item(), out2[p].item())",
            "       for p in map(tuple, moved.nonzero().tolist())])",
        ]
    elif check.name == "no-gradient-leak":
        skip = ("token_rewards",) if _rebuilds_token_rewards(ctx) else ()
        lines = [
            "",
            "out, grads, passed, before = run(inputs)",
            f"mask = {mask}",
            "for name, g in grads.items():",
            f"    if g is not None and g.shape == mask.shape and name not in {skip!r}:",
            "        print(f'largest |gradient| at padding of {name} (must be 0):',",
            "              g.double().masked_fill(mask, 0.0).abs().max().item())",
        ]
    elif check.name == "padding-values":
        other = [
            "g = torch.Generator().manual_seed(7)",
            "other = dict(inputs)",
            "for name, t in inputs.items():",
            "    if t.is_floating_point() and t.dim() == 2:",
            "        junk = (torch.rand(t.shape, generator=g, dtype=torch.float64) * 2 - 1) * 7e3",
            f"        other[name] = torch.where({mask}, t, junk.to(t.dtype))",
        ]
        lines = check_lines("same", other=other, grads=False, what="other values at padding")
    elif check.name == "padding-columns":
        other = [
            "other = {n: torch.nn.functional.pad(t, (0, 3), value=False if t.dtype == torch.bool "
            "else 123.0)",
            "         if t.dim() == 2 else t for n, t in inputs.items()}",
        ]
        lines = check_lines("same", other=other, grads=False, what="3 more padding columns")
    else:  # value, extreme-values, singleton-constant; inputs-unchanged, deterministic
        mode = check.name if check.name in ("inputs-unchanged", "deterministic") else "value"
        lines = check_lines(mode)
    body = "\n".join([*definitions, *lines])
    helpers = [n for n in ("Whitening", "token_level_rewards") if f"{n}(" in body]
    imports = ["from polgrad_reference import AdvantageConfig"]
    if helpers:  # only what the snippet calls
        imports.append(f"from polgrad_reference.advantages import {', '.join(helpers)}")
    imports.append(
        "from pytest_polgrad.kinds.advantages import AdvantageReference, expected_advantages"
    )
    if ctx.options.layout == "left":
        imports.append(
            "from pytest_polgrad.strategies import left_to_right, right_to_left, row_extents"
        )
    literals = inputs.to_snippet()
    compact = _mask_lines(inputs)
    if compact is not None and compact[0] in literals:
        literals = literals.replace(compact[0], compact[1])
    return kind_snippet(
        where, imports=imports, inputs=literals, definitions=definitions, check=lines
    )


KIND = AdvantagesKind()
