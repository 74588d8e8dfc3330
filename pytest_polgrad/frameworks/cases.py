"""The adapter catalogue: each framework configuration the kit checks, with the reference
config it equals and the published algorithm it is named after.

This module imports no framework (the default suite reads it). A :class:`Case` names the
adapter factory and the exact framework options it sets; ``equals`` is the point of the
loss algebra the framework code computes (checked by every kit check in the frameworks
tier, and against the recorded outputs in the default suite); ``claims`` is the registry
algorithm the option is named after, and ``expect`` the checks on which the two differ
(each a row of :data:`~pytest_polgrad.frameworks.DEVIATIONS`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from polgrad_reference import CovarianceSelection, KLConfig, KLRatioWeight

__all__ = ["CASES", "PADDED_WIDTH", "Case", "Reference"]

PADDED_WIDTH = "padded-width"
"""An override value meaning "this batch's padded width ``T``" (verl's default
``seq-mean-token-sum-norm`` normaliser). A reference holding it is batch-dependent: it is
checked on the recorded corpus outputs, batch by batch, and never used as a marker."""


@dataclasses.dataclass(frozen=True)
class Reference:
    """A registry algorithm and marker overrides (``polgrad_conforms(name, **overrides)``)."""

    name: str
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def batch_dependent(self) -> bool:
        """True when an override is :data:`PADDED_WIDTH` (resolved per batch)."""
        return any(v == PADDED_WIDTH for v in self.overrides.values())

    def resolve(self, width: int) -> Reference:
        """This reference with :data:`PADDED_WIDTH` replaced by ``width``."""
        return Reference(
            self.name,
            MappingProxyType(
                {k: width if v == PADDED_WIDTH else v for k, v in self.overrides.items()}
            ),
        )

    def describe(self) -> str:
        """``name`` or ``name(key=value, ...)``."""
        if not self.overrides:
            return self.name
        inner = ", ".join(f"{k}={v!r}" for k, v in sorted(self.overrides.items()))
        return f"{self.name}({inner})"


@dataclasses.dataclass(frozen=True)
class Case:
    """One framework entry point under one set of options."""

    id: str
    """A Python identifier; the marked function's name in ``tests/frameworks/``."""
    framework: str
    entry: str
    """The framework function (or method) called."""
    factory: str
    """The adapter factory in ``pytest_polgrad.frameworks.<framework>``."""
    options: Mapping[str, Any]
    """Keyword arguments of the factory: the framework options the adapter sets."""
    advantages: str
    """``"sequence"`` (``[B]``) or ``"token"`` (``[B, T]``), as the kit draws them."""
    equals: Reference
    claims: Reference | None = None
    expect: Mapping[str, str | tuple[str, float]] = dataclasses.field(default_factory=dict)
    """The checks on which ``claims`` differs: a reason, or ``(reason, max_error)`` to pin
    the deviation's size on the canonical corpus (as the marker's ``expect=``)."""
    takes_ref: bool = False
    note: str = ""
    rtol: float = 1e-9
    """Relative tolerance of the recorded-output comparison (float64 inputs)."""
    shipped_expect: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Checks on which even ``equals`` differs, outside the corpus (a clamp the reference
    does not model); declared on the shipped marker."""

    def __post_init__(self) -> None:
        if not self.id.isidentifier():
            raise ValueError(f"Case.id must be a Python identifier, got {self.id!r}")
        if self.advantages not in ("sequence", "token"):
            raise ValueError(f"advantages must be 'sequence' or 'token', got {self.advantages!r}")
        if self.expect and self.claims is None:
            raise ValueError(f"{self.id}: expect= needs the claimed reference it differs from")
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))
        object.__setattr__(self, "expect", MappingProxyType(dict(self.expect)))
        object.__setattr__(self, "shipped_expect", MappingProxyType(dict(self.shipped_expect)))


def _r(name: str, **overrides: Any) -> Reference:
    return Reference(name, MappingProxyType(overrides))


_BIAS_VALUE = (
    "use_bias_correction_kl (default True) adds r * k3, not k3: the KL term's value differs "
    "wherever the ratio is not 1"
)
_DUAL = "verl applies the dual-clip floor -c*A with c = clip_ratio_c = 3 to every A < 0 token"
_DPPO_CAP = (
    "verl truncates the IS weight at ActorConfig.clip_ratio_c, default 3.0 (the dual-clip "
    "constant); the function's fallback 20 (DPPO Sec. 5.4: a large cap) is never reached"
)
_TOKEN_MEAN = "token-mean over the batch's response tokens; the GRPO paper averages per sequence"

_VERL = (
    Case(
        id="verl_vanilla",
        framework="verl",
        entry="core_algos.compute_policy_loss_vanilla",
        factory="policy_loss",
        options={"mode": "vanilla", "loss_agg_mode": "token-mean"},
        advantages="token",
        equals=_r("ppo", dual_clip=3.0),
        claims=_r("grpo", dual_clip=3.0),
        expect={"value": _TOKEN_MEAN, "gradient": _TOKEN_MEAN},
        note="ActorConfig defaults: clip_ratio 0.2, clip_ratio_c 3.0, loss_agg_mode token-mean",
    ),
    Case(
        id="verl_vanilla_seq_mean_token_mean",
        framework="verl",
        entry="core_algos.compute_policy_loss_vanilla",
        factory="policy_loss",
        options={"mode": "vanilla", "loss_agg_mode": "seq-mean-token-mean"},
        advantages="token",
        equals=_r("grpo", dual_clip=3.0),
        claims=_r("grpo"),
        expect={"value": _DUAL, "gradient": _DUAL},
    ),
    Case(
        id="verl_vanilla_clip_higher",
        framework="verl",
        entry="core_algos.compute_policy_loss_vanilla",
        factory="policy_loss",
        options={"mode": "vanilla", "loss_agg_mode": "token-mean", "clip_ratio_high": 0.28},
        advantages="token",
        equals=_r("dapo", dual_clip=3.0),
    ),
    Case(
        id="verl_vanilla_token_sum",
        framework="verl",
        entry="core_algos.compute_policy_loss_vanilla",
        factory="policy_loss",
        options={"mode": "vanilla", "loss_agg_mode": "token-sum"},
        advantages="token",
        equals=_r("ppo", dual_clip=3.0, aggregation="token-sum"),
    ),
    Case(
        id="verl_vanilla_seq_mean_token_sum",
        framework="verl",
        entry="core_algos.compute_policy_loss_vanilla",
        factory="policy_loss",
        options={"mode": "vanilla", "loss_agg_mode": "seq-mean-token-sum"},
        advantages="token",
        equals=_r("ppo", dual_clip=3.0, aggregation="seq-mean-token-sum"),
    ),
    Case(
        id="verl_vanilla_token_sum_norm",
        framework="verl",
        entry="core_algos.compute_policy_loss_vanilla",
        factory="policy_loss",
        options={
            "mode": "vanilla",
            "loss_agg_mode": "seq-mean-token-sum-norm",
            "global_batch_info": {"loss_scale_factor": 4096},
        },
        advantages="token",
        equals=_r("dr_grpo", dual_clip=3.0, budget=4096),
        note="a fixed loss_scale_factor makes it Dr.GRPO's constant normaliser",
    ),
    Case(
        id="verl_vanilla_token_sum_norm_default",
        framework="verl",
        entry="core_algos.compute_policy_loss_vanilla",
        factory="policy_loss",
        options={"mode": "vanilla", "loss_agg_mode": "seq-mean-token-sum-norm"},
        advantages="token",
        equals=_r("dr_grpo", dual_clip=3.0, budget=PADDED_WIDTH),
        claims=_r("dr_grpo", dual_clip=3.0, budget=4096),
        expect={
            "value": "without loss_scale_factor verl divides by the padded width "
            "loss_mask.shape[-1]; Dr.GRPO divides by a fixed generation budget",
            "padding-columns": "divides by the padded width, which padding columns change",
        },
        note="equals: budget = the batch's padded width, so it is checked on the recorded "
        "corpus outputs (batch by batch), not marked",
    ),
    Case(
        id="verl_gspo",
        framework="verl",
        entry="core_algos.compute_policy_loss_gspo",
        factory="policy_loss",
        options={"mode": "gspo", "loss_agg_mode": "token-mean"},
        advantages="sequence",
        equals=_r("gspo_token", eps_low=0.2, eps_high=0.2, aggregation="token-mean"),
        claims=_r("gspo_token"),
        expect={
            "value": "verl's gspo takes the actor's loss_agg_mode (default token-mean) and "
            "clip_ratio (default 0.2); GSPO is seq-mean with eps 3e-4/4e-4",
            "gradient": "token-mean and eps 0.2 instead of GSPO's seq-mean and 3e-4/4e-4",
        },
    ),
    Case(
        id="verl_gspo_paper_settings",
        framework="verl",
        entry="core_algos.compute_policy_loss_gspo",
        factory="policy_loss",
        options={
            "mode": "gspo",
            "loss_agg_mode": "seq-mean-token-mean",
            "clip_ratio_low": 3e-4,
            "clip_ratio_high": 4e-4,
        },
        advantages="sequence",
        equals=_r("gspo_token"),
    ),
    Case(
        id="verl_cispo",
        framework="verl",
        entry="core_algos.compute_policy_loss_cispo",
        factory="policy_loss",
        options={"mode": "cispo", "loss_agg_mode": "token-mean", "clip_ratio_high": 2.0},
        advantages="token",
        equals=_r("cispo", eps_low=0.2),
        claims=_r("cispo"),
        expect={
            "value": "verl's cispo clamps the IS weight from below too (1 - clip_ratio_low, "
            "default 0.8); CISPO bounds it from above only",
            "gradient": "the IS weight is truncated at 1 - clip_ratio_low from below",
        },
    ),
    Case(
        id="verl_gpg",
        framework="verl",
        entry="core_algos.compute_policy_loss_gpg",
        factory="policy_loss",
        options={"mode": "gpg", "loss_agg_mode": "token-mean"},
        advantages="token",
        equals=_r("gpg"),
    ),
    Case(
        id="verl_sapo",
        framework="verl",
        entry="core_algos.compute_policy_loss_sapo",
        factory="policy_loss",
        options={"mode": "sapo", "loss_agg_mode": "token-mean"},
        advantages="token",
        equals=_r("sapo"),
        note="loss_agg_mode token-mean is passed and not applied (seq-mean-token-mean)",
    ),
    Case(
        id="verl_geo_mean",
        framework="verl",
        entry="core_algos.compute_policy_loss_geo_mean",
        factory="policy_loss",
        options={
            "mode": "geo_mean",
            "loss_agg_mode": "token-mean",
            "clip_ratio_low": 0.4,
            "clip_ratio_high": 0.4,
        },
        note="ActorConfig.clip_ratio_low/high default to 0.2 (not None), so clip_ratio alone "
        "does not set the range",
        advantages="sequence",
        equals=_r("gmpo"),
    ),
    Case(
        id="verl_dppo_tv",
        framework="verl",
        entry="core_algos.compute_policy_loss_dppo_tv",
        factory="policy_loss",
        options={"mode": "dppo_tv", "loss_agg_mode": "token-mean"},
        advantages="token",
        equals=_r("dppo_tv", is_cap=3.0),
        claims=_r("dppo_tv"),
        expect={"value": _DPPO_CAP, "gradient": _DPPO_CAP},
    ),
    Case(
        id="verl_dppo_kl",
        framework="verl",
        entry="core_algos.compute_policy_loss_dppo_kl",
        factory="policy_loss",
        options={"mode": "dppo_kl", "loss_agg_mode": "token-mean"},
        advantages="token",
        equals=_r("dppo_kl", is_cap=3.0),
        claims=_r("dppo_kl"),
        expect={"value": _DPPO_CAP, "gradient": _DPPO_CAP},
    ),
    Case(
        id="verl_kl_cov",
        framework="verl",
        entry="core_algos.compute_policy_loss_kl_cov",
        factory="policy_loss",
        options={"mode": "kl_cov", "loss_agg_mode": "token-mean"},
        advantages="token",
        equals=_r(
            "kl_cov",
            params=CovarianceSelection(fraction=2e-4, low=1.0, high=5.0, kl_coef=0.1, seed=0),
        ),
        note="ActorConfig.policy_loss.ppo_kl_coef defaults to 0.1 (the function's own "
        "fallback, 1.0, applies to configs without the field)",
    ),
    Case(
        id="verl_dro",
        framework="verl",
        entry="core_algos.compute_policy_loss_dro",
        factory="policy_loss",
        options={"mode": "dro", "loss_agg_mode": "token-mean", "policy_loss": {"dro_beta": 1.0}},
        advantages="token",
        equals=_r("dro"),
    ),
)

_TRL = (
    Case(
        id="trl_default",
        framework="trl",
        entry="GRPOTrainer._compute_loss",
        factory="grpo_loss",
        options={},
        advantages="sequence",
        equals=_r("ppo"),
        claims=_r("dapo"),
        expect={
            "value": "loss_type='dapo' (the default) keeps epsilon_high = epsilon = 0.2; "
            "DAPO's clip-higher is 0.28",
            "gradient": "upper clip 1.2 instead of DAPO's 1.28",
        },
        note="defaults: loss_type dapo, epsilon 0.2, epsilon_high None, beta 0",
    ),
    Case(
        id="trl_grpo",
        framework="trl",
        entry="GRPOTrainer._compute_loss",
        factory="grpo_loss",
        options={"loss_type": "grpo"},
        advantages="sequence",
        equals=_r("grpo"),
    ),
    Case(
        id="trl_dapo",
        framework="trl",
        entry="GRPOTrainer._compute_loss",
        factory="grpo_loss",
        options={"loss_type": "dapo", "epsilon_high": 0.28},
        advantages="sequence",
        equals=_r("dapo"),
    ),
    Case(
        id="trl_bnpo",
        framework="trl",
        entry="GRPOTrainer._compute_loss",
        factory="grpo_loss",
        options={"loss_type": "bnpo"},
        advantages="sequence",
        equals=_r("ppo"),
    ),
    Case(
        id="trl_dr_grpo",
        framework="trl",
        entry="GRPOTrainer._compute_loss",
        factory="grpo_loss",
        options={"loss_type": "dr_grpo", "max_completion_length": 4096},
        advantages="sequence",
        equals=_r("dr_grpo", budget=4096),
    ),
    Case(
        id="trl_cispo",
        framework="trl",
        entry="GRPOTrainer._compute_loss",
        factory="grpo_loss",
        options={"loss_type": "cispo", "epsilon_high": 2.0},
        advantages="sequence",
        equals=_r("cispo", eps_high=1.0),
        claims=_r("cispo"),
        expect={
            "value": "TRL's cispo caps the IS weight at epsilon_high itself; CISPO's cap is "
            "1 + eps_high",
            "gradient": "IS weight capped at epsilon_high = 2.0, not 1 + 2.0",
        },
    ),
    Case(
        id="trl_gspo",
        framework="trl",
        entry="GRPOTrainer._compute_loss",
        factory="grpo_loss",
        options={
            "loss_type": "grpo",
            "importance_sampling_level": "sequence",
            "epsilon": 3e-4,
            "epsilon_high": 4e-4,
        },
        advantages="sequence",
        equals=_r("gspo"),
    ),
    Case(
        id="trl_luspo",
        framework="trl",
        entry="GRPOTrainer._compute_loss",
        factory="grpo_loss",
        options={"loss_type": "luspo", "importance_sampling_level": "sequence"},
        advantages="sequence",
        equals=_r("luspo", eps_low=0.2, eps_high=0.2),
    ),
    Case(
        id="trl_grpo_kl_bias_corrected",
        framework="trl",
        entry="GRPOTrainer._compute_loss",
        factory="grpo_loss",
        options={"loss_type": "grpo", "beta": 0.04},
        advantages="sequence",
        equals=_r("grpo", kl=KLConfig(coef=0.04, ratio_weight=KLRatioWeight.UNDETACHED)),
        claims=_r("grpo"),
        expect={
            # sizes on the canonical corpus: 17x, 9.15e3x, 745x; pinned at about 1.5x
            "value": (_BIAS_VALUE, 26.0),
            "gradient": (
                "use_bias_correction_kl (default True) multiplies k3 by the undetached "
                "ratio, which changes the gradient even on-policy",
                1.4e4,
            ),
            "on-policy": ("the k3 term's gradient includes d ratio * k3", 1.1e3),
        },
        takes_ref=True,
    ),
    Case(
        id="trl_grpo_kl",
        framework="trl",
        entry="GRPOTrainer._compute_loss",
        factory="grpo_loss",
        options={"loss_type": "grpo", "beta": 0.04, "use_bias_correction_kl": False},
        advantages="sequence",
        equals=_r("grpo"),
        takes_ref=True,
    ),
    Case(
        id="trl_sapo",
        framework="trl",
        entry="GRPOTrainer._compute_loss",
        factory="grpo_loss",
        options={"loss_type": "sapo"},
        advantages="sequence",
        equals=_r("sapo"),
        rtol=1e-6,
        note="the temperatures come from torch.where on Python floats, so float32: tau_neg "
        "is float32(1.05), a relative 5e-8 off in float64",
    ),
    Case(
        id="trl_vespo",
        framework="trl",
        entry="GRPOTrainer._compute_loss",
        factory="grpo_loss",
        options={"loss_type": "vespo"},
        advantages="sequence",
        equals=_r("vespo"),
        shipped_expect={
            "gradient": "TRL clamps the sequence log-ratio to [log 1e-8, 20] before the gamma "
            "weight (get_gamma_weights), so long rows far off-policy get a different weight",
        },
    ),
    Case(
        id="trl_cispo_scalerl",
        framework="trl",
        entry="GRPOTrainer._compute_loss",
        factory="grpo_loss",
        options={"loss_type": "cispo", "epsilon_high": 5.0},
        advantages="sequence",
        equals=_r("scalerl_cispo"),
    ),
)

_OPENRLHF = (
    Case(
        id="openrlhf_default",
        framework="openrlhf",
        entry="openrlhf.models.loss.PolicyLoss",
        factory="policy_loss",
        options={},
        advantages="token",
        equals=_r("ppo"),
        claims=_r("grpo"),
        expect={"value": _TOKEN_MEAN, "gradient": _TOKEN_MEAN},
        note="defaults: clip_eps 0.2/0.2, no dual clip, token_level_loss True",
    ),
    Case(
        id="openrlhf_sequence_level",
        framework="openrlhf",
        entry="openrlhf.models.loss.PolicyLoss",
        factory="policy_loss",
        options={"token_level_loss": False},
        advantages="token",
        equals=_r("grpo"),
    ),
    Case(
        id="openrlhf_dual_clip",
        framework="openrlhf",
        entry="openrlhf.models.loss.PolicyLoss",
        factory="policy_loss",
        options={"dual_clip": 3.0, "clip_eps_high": 0.28},
        advantages="token",
        equals=_r("dapo", dual_clip=3.0),
    ),
    Case(
        id="openrlhf_gspo",
        framework="openrlhf",
        entry="openrlhf.models.loss.PolicyLoss",
        factory="policy_loss",
        options={"policy_loss_type": "gspo", "clip_eps_low": 3e-4, "clip_eps_high": 4e-4},
        advantages="sequence",
        equals=_r("gspo"),
    ),
)

CASES: tuple[Case, ...] = _VERL + _TRL + _OPENRLHF
"""Every adapter configuration, verl first, then TRL, then OpenRLHF."""
