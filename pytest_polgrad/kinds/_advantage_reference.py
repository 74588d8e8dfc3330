"""The reference side of the advantages kind: the semantics a marker names
(:class:`AdvantageReference`, :data:`REFERENCES`), the float64 oracle over a batch, the
tolerance scale, the canonical corpus and the candidate semantics the diagnosis ranks.
Nothing here calls the function under test (that is :mod:`.advantages`)."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from polgrad_reference import ALGORITHMS, AdvantageConfig, AdvantageEstimator
from polgrad_reference.advantages import (
    OPENRLHF_WHITENING,
    REFERENCE_WHITENING,
    VERL_WHITENING,
    Whitening,
    discounted_returns,
    gae,
    grpo_advantages,
    opo_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
    token_level_rewards,
)
from polgrad_reference.advantages import (
    _whiten as whiten_validated,
)
from pytest_polgrad.core.kinds import CallStore, remember
from pytest_polgrad.strategies import RewardBatch

__all__ = [
    "CORPUS_VERSION",
    "GROUPED",
    "INPUT_NAMES",
    "OUTCOME",
    "REFERENCES",
    "SEQUENCE",
    "WHITENINGS",
    "AdvantageReference",
    "advantage_corpus",
    "candidates",
    "expected_advantages",
    "tolerance_scale",
]

INPUT_NAMES = ("rewards", "group_ids", "response_mask", "token_rewards", "values", "dones")
CORPUS_VERSION = 1
_E = AdvantageEstimator
SEQUENCE = (_E.GRPO, _E.RLOO, _E.OPO)
OUTCOME = (*SEQUENCE, _E.REINFORCE_PP_BASELINE)
"""Estimators of one scalar reward per response (per-token rewards are outcome-only)."""
GROUPED = (_E.GRPO, _E.RLOO, _E.OPO, _E.REINFORCE_PP_BASELINE)

WHITENINGS: Mapping[str, Whitening] = {
    "reference": REFERENCE_WHITENING,
    "verl": VERL_WHITENING,
    "openrlhf": OPENRLHF_WHITENING,
}
"""Named whitening conventions (``whitening=`` on the marker)."""


def _references() -> dict[str, AdvantageConfig]:
    out = {name: spec.advantage for name, spec in ALGORITHMS.items()}
    out["opo"] = AdvantageConfig(_E.OPO)
    out["reinforce_pp_baseline"] = AdvantageConfig(_E.REINFORCE_PP_BASELINE)
    out["gae"] = AdvantageConfig(_E.GAE, gamma=1.0, lam=0.95, whiten=True)
    return out


REFERENCES: Mapping[str, AdvantageConfig] = _references()
"""Reference names for ``kind="advantages"``: every registry algorithm's advantage config,
plus ``opo``, ``reinforce_pp_baseline`` and ``gae`` (gamma 1, lambda 0.95, whitened)."""


@dataclasses.dataclass(frozen=True)
class AdvantageReference:
    """One advantage semantics: the estimator config, the whitening convention, the place
    of GRPO's ``std_eps``, and whether episode ends (``dones``) are honoured."""

    config: AdvantageConfig
    whitening: Whitening | None = None
    """``None``: the reference whitening with ``unbiased=config.unbiased_std``."""
    eps_in_sqrt: bool = False
    ignore_dones: bool = False

    @property
    def whitener(self) -> Whitening:
        if self.whitening is not None:
            return self.whitening
        return dataclasses.replace(REFERENCE_WHITENING, unbiased=self.config.unbiased_std)

    @property
    def whitens(self) -> bool:
        est = self.config.estimator
        return est in (_E.REINFORCE_PP, _E.REINFORCE_PP_BASELINE) or self.config.whiten

    def computes(self, batch: RewardBatch) -> bool:
        """Whether ``batch`` lies in this reference's domain: whitening takes its mean and
        variance over every response token of the batch and needs at least 2 of them for
        the unbiased variance, 1 for the biased (:func:`polgrad_reference.whiten` raises
        below that). A batch outside it is left out of this reference's pool and corpus: it
        is no evidence for or against a function (docs/conformance.md, "Advantages")."""
        if not self.whitens:
            return True
        return int(batch.response_mask.sum()) >= 1 + int(self.whitener.unbiased)

    @property
    def sequence_level(self) -> bool:
        return self.config.estimator in SEQUENCE

    def describe(self) -> str:
        """One line naming every choice, e.g. ``grpo: (r - mean) / (std + 1e-06), ...``."""
        c = self.config
        est = c.estimator
        single = {"zero": "singletons 0", "raw": "singletons keep their reward"}.get(
            c.singleton.value, "singletons raise"
        )
        if est is _E.GRPO:
            if not c.scale_by_std:
                text = f"grpo without std scaling: r - mean (Dr.GRPO), {single}"
            else:
                std = "sample std (Bessel)" if c.unbiased_std else "population std"
                div = f"sqrt(var + {c.std_eps:g})" if self.eps_in_sqrt else f"std + {c.std_eps:g}"
                text = f"grpo: (r - mean) / ({div}), {std}, {single}"
        elif est is _E.RLOO:
            text = f"rloo: r - mean of the others = G/(G-1) (r - mean), {single}"
        elif est is _E.OPO:
            text = f"opo: r - sum L r / sum L (length-weighted baseline), {single}"
        elif est is _E.REINFORCE_PP:
            text = f"reinforce_pp: returns (gamma {c.gamma:g})"
        elif est is _E.REINFORCE_PP_BASELINE:
            text = f"reinforce_pp_baseline: r - group mean, returns (gamma {c.gamma:g}), {single}"
        else:
            dones = ", ignoring dones" if self.ignore_dones else ""
            text = f"gae (gamma {c.gamma:g}, lambda {c.lam:g}{dones})"
        if self.whitens:
            text += f", whitened ({self.whitener.describe()})"
        return text

    def names(self) -> list[str]:
        """Reference names whose config equals this one (with the default whitening)."""
        if self.eps_in_sqrt or self.ignore_dones:
            return []
        default = dataclasses.replace(REFERENCE_WHITENING, unbiased=self.config.unbiased_std)
        if self.whitens and self.whitening not in (None, default):
            return []
        return [n for n, cfg in REFERENCES.items() if cfg == self.config]


# ---- the oracle -------------------------------------------------------------------------


def _f64(kw: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: t.to(torch.float64) if t.is_floating_point() else t for k, t in kw.items()}


def expected_advantages(
    ref: AdvantageReference, kw: Mapping[str, torch.Tensor], takes: frozenset[str]
) -> torch.Tensor:
    """The reference advantages in float64 (``[B]`` or ``[B, T]``) for the tensors a
    function taking ``takes`` receives."""
    t = _f64(kw)
    c = ref.config
    est = c.estimator
    mask = t["response_mask"]
    ids = t["group_ids"]
    if est is _E.GRPO:
        adv = grpo_advantages(
            rewards=t["rewards"],
            scale_by_std=c.scale_by_std,
            std_eps=c.std_eps,
            unbiased_std=c.unbiased_std,
            singleton=c.singleton,
            eps_in_sqrt=ref.eps_in_sqrt,
            group_ids=ids,
        )
    elif est is _E.RLOO:
        adv = rloo_advantages(rewards=t["rewards"], singleton=c.singleton, group_ids=ids)
    elif est is _E.OPO:
        adv = opo_advantages(
            rewards=t["rewards"], response_mask=mask, singleton=c.singleton, group_ids=ids
        )
    if est in SEQUENCE:
        if not c.whiten:
            return adv
        rows = torch.ones((adv.shape[0], 1), dtype=torch.bool)
        return whiten_validated(adv[:, None], rows, ref.whitener, what="rewards has")[:, 0]
    token = t.get("token_rewards") if "token_rewards" in takes and est not in OUTCOME else None
    if est is _E.REINFORCE_PP:
        return reinforce_pp_advantages(
            response_mask=mask,
            rewards=t["rewards"],
            token_rewards=token,
            gamma=c.gamma,
            whitening=ref.whitener,
        )
    if est is _E.REINFORCE_PP_BASELINE:
        return reinforce_pp_baseline_advantages(
            rewards=t["rewards"],
            response_mask=mask,
            token_rewards=token,
            gamma=c.gamma,
            singleton=c.singleton,
            whitening=ref.whitener,
            group_ids=ids,
        )
    per_token = token_level_rewards(response_mask=mask, rewards=t["rewards"], token_rewards=token)
    dones = t.get("dones") if "dones" in takes and not ref.ignore_dones else None
    out, _ = gae(
        token_rewards=per_token,
        values=t["values"],
        response_mask=mask,
        gamma=c.gamma,
        lam=c.lam,
        dones=dones,
    )
    return whiten_validated(out, mask, ref.whitener) if c.whiten else out


def _divisor(ref: AdvantageReference, t: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Per-row ``std_g + eps`` of GRPO (1 for the other sequence estimators), float64."""
    c = ref.config
    if c.estimator is not _E.GRPO or not c.scale_by_std:
        return torch.ones_like(t["rewards"])
    centred = grpo_advantages(
        rewards=t["rewards"], group_ids=t["group_ids"], scale_by_std=False, singleton="zero"
    )
    _, inverse, counts = torch.unique(t["group_ids"], return_inverse=True, return_counts=True)
    n = counts[inverse].to(torch.float64)
    sq = torch.zeros(counts.shape[0], dtype=torch.float64).index_add(0, inverse, centred**2)
    dof = (n - 1.0).clamp(min=1.0) if c.unbiased_std else n
    std = (sq[inverse] / dof).sqrt()
    return torch.where(n == 1, 1.0, std + c.std_eps)


def _pre_whitening_std(ref: AdvantageReference, t: Mapping[str, torch.Tensor]) -> float:
    """Std over the response tokens of what a token-level estimator whitens (float64)."""
    c = ref.config
    mask = t["response_mask"]
    if c.estimator is _E.GAE:
        pre = expected_advantages(
            dataclasses.replace(ref, config=c.replace(whiten=False)), t, frozenset(t)
        )
    else:
        rewards = t["rewards"]
        token = t.get("token_rewards")
        if c.estimator is _E.REINFORCE_PP_BASELINE:
            rewards = grpo_advantages(
                rewards=rewards, group_ids=t["group_ids"], scale_by_std=False, singleton="zero"
            )
            token = None
        per_token = token_level_rewards(response_mask=mask, rewards=rewards, token_rewards=token)
        pre = discounted_returns(token_rewards=per_token, response_mask=mask, gamma=c.gamma)
    vals = pre[mask]
    return float(vals.std()) if vals.numel() > 1 else 1.0


_SCALES = CallStore()
"""(reference, output rank, the batch tensors' ids and versions) -> the parts of
:func:`tolerance_scale` that do not depend on the expected advantages, while they live."""


def _group_max_at(x: torch.Tensor, inverse: torch.Tensor, groups: int) -> torch.Tensor:
    top = torch.zeros(groups, dtype=x.dtype).scatter_reduce(
        0, inverse, x, "amax", include_self=False
    )
    return top[inverse]


def _batch_parts(
    ref: AdvantageReference, kw: Mapping[str, torch.Tensor], token: bool
) -> tuple[Any, ...]:
    """``[B]`` outputs: (group index per row, groups, the group's largest ``|reward|`` over
    the row's divisor, factor); ``[B, T]``: (mask, the inputs' size per row, over the
    pre-whitening std where the reference whitens, factor)."""
    t = _f64(kw)
    mask = t["response_mask"]
    r = t["rewards"].abs()
    if not token:
        _, inverse, counts = torch.unique(t["group_ids"], return_inverse=True, return_counts=True)
        groups = int(inverse.max()) + 1
        top = _group_max_at(r, inverse, groups) / _divisor(ref, t)
        return inverse, groups, top, 1.0 + math.sqrt(float(counts.max())) / 4.0
    inputs = r[:, None].expand_as(mask).clone()
    for name in ("token_rewards", "values"):
        if name in t:
            inputs = inputs + 2.0 * torch.where(mask, t[name], 0.0).abs()
    row = torch.where(mask, inputs, 0.0).sum(dim=1, keepdim=True)
    if ref.whitens:
        row = row.amax() / max(_pre_whitening_std(ref, t), 1e-300)
    return mask, row, 1.0 + math.sqrt(float(mask.sum())) / 4.0


def _cached_parts(
    ref: AdvantageReference, kw: Mapping[str, torch.Tensor], token: bool
) -> tuple[Any, ...]:
    """:func:`_batch_parts`, made once per reference and batch: kept while the batch's
    tensors live, and only while none was modified in place (the key holds their ids and
    versions)."""
    key = (ref, token, tuple((n, id(v), getattr(v, "_version", None)) for n, v in kw.items()))
    made = _SCALES.get(key)
    if made is None:
        made = _batch_parts(ref, kw, token)
        with contextlib.suppress(TypeError):  # an owner without weak references: every time
            remember(_SCALES, key, made, tuple(kw.values()))
    return made


def tolerance_scale(
    ref: AdvantageReference, kw: Mapping[str, torch.Tensor], expected: torch.Tensor
) -> torch.Tensor:
    """The magnitude rounding errors are proportional to, per compared element: the
    output's own size, its group's (or batch's) largest, and the inputs' size over the
    divisor (so cancelling rewards keep a meaningful tolerance)."""
    e = expected.abs()
    if expected.dim() == 1:
        inverse, groups, top_inputs, factor = _cached_parts(ref, kw, False)
        scale: torch.Tensor = (e + (_group_max_at(e, inverse, groups) + top_inputs)) * factor
        return scale
    mask, row, factor = _cached_parts(ref, kw, True)
    scale = (e + torch.where(mask, e, 0.0).amax() + row) * factor
    return scale


# ---- corpus -------------------------------------------------------------------------------

_NAN = float("nan")
_CORPUS: dict[str, tuple[list[list[float]], list[int]]] = {
    # groups: binary, grid with ties, constant, tiny spread (2^-12); ragged lengths
    "groups": (
        [
            [1.0, 0.0, 0.0, 1.0],
            [0.25, 1.0, -0.5, 2.0],
            [0.5, 0.5, 0.5, 0.5],
            [0.5, 0.5 + 2.0**-12, 0.5, 0.5],
        ],
        [1, 3, 6, 2, 5, 4, 1, 6, 2, 2, 3, 6, 6, 1, 4, 5],
    ),
    # a singleton, a pair and a triple of continuous rewards
    "singletons": ([[2.0], [-1.0, 0.75], [0.3, -0.2, 1.1]], [3, 1, 5, 2, 4, 6]),
    # one success in eight (the largest |A| of GRPO: (G - 1) / sqrt(G))
    "one-success": ([[0.0] * 7 + [1.0], [1.0] * 8], [6, 1, 4, 2, 6, 3, 5, 6] * 2),
}


def advantage_corpus(dtype: torch.dtype, *, grouped: bool = False) -> dict[str, RewardBatch]:
    """The canonical corpus (deterministic literals; ``grouped``: equal-size groups only)."""
    out = {}
    for name, (groups, lengths) in _CORPUS.items():
        if grouped and len({len(g) for g in groups}) > 1:
            continue
        rewards = [r for g in groups for r in g]
        labels = [10 * (i + 1) + 3 for i, g in enumerate(groups) for _ in g]
        width = max(lengths) + 1
        mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
        b = len(rewards)
        pattern = torch.tensor(
            [[((3 * i + 5 * j) % 7 - 3) / 8 for j in range(width)] for i in range(b)],
            dtype=torch.float64,
        )
        token_rewards = torch.where(mask, pattern / 4, 1e3)
        values = torch.where(mask, pattern.flip(1), -1e3)
        dones = torch.zeros_like(mask)
        for row in range(0, b, 3):
            if lengths[row] >= 3:
                dones[row, 1] = True
        out[name] = RewardBatch(
            rewards=torch.tensor(rewards, dtype=torch.float64).to(dtype),
            group_ids=torch.tensor(labels, dtype=torch.int64),
            response_mask=mask,
            token_rewards=token_rewards.to(dtype),
            values=values.to(dtype),
            dones=dones,
            kinds=tuple(name for _ in groups),
        )
    return out


# ---- diagnosis candidates ------------------------------------------------------------


def candidates(ref: AdvantageReference) -> Iterator[AdvantageReference]:
    """The semantics a function could be computing instead, the reference's own first."""
    c = ref.config
    yield ref
    singles = ("zero", "raw")
    whitenings = (
        None,
        VERL_WHITENING,
        OPENRLHF_WHITENING,
        REFERENCE_WHITENING,
        dataclasses.replace(REFERENCE_WHITENING, unbiased=False),
    )
    if c.estimator in SEQUENCE:
        for scale, unbiased, eps, single, inside in itertools.product(
            (True, False), (True, False), (c.std_eps, 1e-6, 1e-8, 1e-4), singles, (False, True)
        ):
            if not scale and (unbiased is not c.unbiased_std or eps != c.std_eps or inside):
                continue
            cfg = c.replace(
                estimator=_E.GRPO,
                scale_by_std=scale,
                unbiased_std=unbiased,
                std_eps=eps,
                singleton=single,
            )
            yield AdvantageReference(cfg, ref.whitening, eps_in_sqrt=inside)
        for est, single in itertools.product((_E.RLOO, _E.OPO), singles):
            yield AdvantageReference(c.replace(estimator=est, singleton=single), ref.whitening)
        return
    if c.estimator is _E.GAE:
        for gamma, lam, whiten, w, ignore in itertools.product(
            dict.fromkeys((c.gamma, 1.0, 0.99)),
            dict.fromkeys((c.lam, 0.95, 1.0)),
            (True, False),
            whitenings,
            (False, True),
        ):
            if not whiten and w is not None:
                continue
            cfg = c.replace(gamma=gamma, lam=lam, whiten=whiten)
            yield AdvantageReference(cfg, w, ignore_dones=ignore)
        return
    for est, gamma, w, single in itertools.product(
        (_E.REINFORCE_PP, _E.REINFORCE_PP_BASELINE),
        dict.fromkeys((c.gamma, 1.0, 0.99)),
        whitenings,
        singles,
    ):
        if est is _E.REINFORCE_PP and single != "zero":
            continue
        yield AdvantageReference(c.replace(estimator=est, gamma=gamma, singleton=single), w)
