"""The registry: immutable specs, cited, with open knobs as data; derive() copies.

Every constant of every entry is pinned here next to the source it comes from."""

from __future__ import annotations

import dataclasses

import pytest

from polgrad_reference import (
    ALGORITHMS,
    Aggregation,
    ClipBounds,
    ConfigError,
    CovarianceSelection,
    DivergenceMask,
    GammaWeight,
    ISLevel,
    ISMode,
    PolicyLossConfig,
    QuadraticPenalty,
    RatioKind,
    SoftGate,
    SurrogateKind,
    describe_algorithm,
    get_algorithm,
)

NAMES = [
    "bypass_pg", "cispo", "clip_cov", "dapo", "dppo_kl", "dppo_tv", "dr_grpo", "dro", "gmpo",
    "gpg", "grpo", "grpo_geo_rs", "grpo_mis", "grpo_seq_mis", "grpo_seq_tis", "grpo_tis", "gspo",
    "gspo_token", "icepop", "kl_cov", "luspo", "ppo", "ppo_dual_clip", "reinforce_pp", "rloo",
    "sapo", "scalerl_cispo", "vespo",
]  # fmt: skip


def test_the_algorithms() -> None:
    assert sorted(ALGORITHMS) == NAMES and len(NAMES) >= 20
    for name, spec in ALGORITHMS.items():
        assert spec.name == name and spec.sources, name


def test_paper_constants() -> None:
    dapo, gspo = ALGORITHMS["dapo"].loss, ALGORITHMS["gspo"].loss
    assert (dapo.clip.eps_low, dapo.clip.eps_high) == (0.2, 0.28)
    assert dapo.aggregation is Aggregation.TOKEN_MEAN and dapo.kl is None
    assert (gspo.clip.eps_low, gspo.clip.eps_high) == (3e-4, 4e-4)
    assert gspo.ratio is RatioKind.SEQUENCE
    assert ALGORITHMS["gspo_token"].loss.ratio is RatioKind.SEQUENCE_TOKEN
    grpo = ALGORITHMS["grpo"].loss
    assert grpo.aggregation is Aggregation.SEQ_MEAN_TOKEN_MEAN
    assert grpo.kl is not None and grpo.kl.coef == 0.04 and grpo.kl_in_loss
    assert ALGORITHMS["dr_grpo"].loss.aggregation is Aggregation.TOKEN_SUM_NORM
    assert ALGORITHMS["dr_grpo"].advantage.scale_by_std is False
    assert ALGORITHMS["cispo"].loss.surrogate is SurrogateKind.CISPO
    assert ALGORITHMS["cispo"].loss.clip.eps_low is None
    assert ALGORITHMS["grpo_tis"].loss.is_correction is not None


def test_registry_is_read_only_and_specs_frozen() -> None:
    with pytest.raises(TypeError):
        ALGORITHMS["mine"] = ALGORITHMS["grpo"]  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ALGORITHMS["grpo"].name = "x"  # type: ignore[misc]


def test_derive_copies_and_routes_fields() -> None:
    before = ALGORITHMS["dr_grpo"]
    derived = before.derive(budget=8, eps_high=0.28)
    assert derived.loss.budget == 8 and derived.loss.clip.eps_high == 0.28
    assert ALGORITHMS["dr_grpo"] is before and before.loss.budget == 4096
    token_mean = before.derive(aggregation="token-mean")
    assert token_mean.loss.budget is None  # dropped with the aggregation that needs it
    with pytest.raises(ConfigError, match="budget must be a positive integer"):
        before.derive(budget=0)
    with pytest.raises(ConfigError, match="advantage must be an AdvantageConfig"):
        before.derive(advantage="grpo")


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(
        ConfigError, match=r"unknown algorithm 'grpo2' \(did you mean 'grpo'\?\); known"
    ):
        get_algorithm("grpo2")
    with pytest.raises(ConfigError, match=r"unknown algorithm 'gpro' \(did you mean 'grpo'\?\)"):
        get_algorithm("gpro")
    with pytest.raises(ConfigError, match="known: bypass_pg, cispo, clip_cov"):
        get_algorithm("xyz")


@pytest.mark.parametrize("name", NAMES)
def test_describe_algorithm_card(name: str) -> None:
    card = describe_algorithm(name)
    spec = ALGORITHMS[name]
    assert card.startswith(f"{name}: {spec.title}")
    for source in spec.sources:
        assert source in card
    for knob in spec.unstated:
        assert knob.knob in card
    assert spec.loss.aggregation.value in card


# ------------------------------------------------------------ framework-mode entries


def _loss(name: str) -> PolicyLossConfig:
    return ALGORITHMS[name].loss


def test_sapo_constants_arxiv_2511_20347_verl_trl() -> None:
    sapo = _loss("sapo")
    assert sapo.surrogate is SurrogateKind.SAPO and sapo.ratio is RatioKind.TOKEN
    assert sapo.params == SoftGate(tau_pos=1.0, tau_neg=1.05)  # paper; TRL 1.16.0 defaults
    assert sapo.aggregation is Aggregation.SEQ_MEAN_TOKEN_MEAN  # verl forces it, TRL 'sapo'


def test_gmpo_constants_arxiv_2507_20673() -> None:
    gmpo = _loss("gmpo")
    assert gmpo.surrogate is SurrogateKind.GMPO
    assert (gmpo.clip.eps_low, gmpo.clip.eps_high) == (0.4, 0.4)  # (e^-0.4, e^0.4), Sec. 4
    assert gmpo.aggregation is Aggregation.SEQ_MEAN_TOKEN_MEAN  # verl geo_mean: mean over rows


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
def test_dppo_constants_verl_core_algos(name: str) -> None:
    dppo = _loss(name)
    assert dppo.surrogate is SurrogateKind(name)
    # verl 0.9.1: clip_ratio (0.2) read as the divergence threshold, clip_ratio_c = 20
    assert dppo.params == DivergenceMask(delta_low=0.2, delta_high=0.2, is_cap=20.0)
    assert dppo.aggregation is Aggregation.TOKEN_MEAN
    knobs = {u.knob for u in ALGORITHMS[name].unstated}
    assert {"params.delta_low", "params.delta_high", "params.is_cap"} <= knobs
    assert ALGORITHMS[name].derive(delta_high=0.1).loss.params == DivergenceMask(delta_high=0.1)


def test_gpg_constants_arxiv_2504_02546() -> None:
    gpg = ALGORITHMS["gpg"]
    assert gpg.loss.surrogate is SurrogateKind.REINFORCE and gpg.loss.kl is None
    assert gpg.loss.aggregation is Aggregation.TOKEN_MEAN  # verl compute_policy_loss_gpg
    assert gpg.advantage.scale_by_std is False  # group-centred, not std-scaled
    assert any(u.knob == "advantage.alpha" for u in gpg.unstated)


def test_covariance_constants_arxiv_2505_22617_verl() -> None:
    clip_cov, kl_cov = _loss("clip_cov"), _loss("kl_cov")
    assert clip_cov.params == CovarianceSelection(fraction=2e-4, low=1.0, high=5.0)
    assert (clip_cov.clip.eps_low, clip_cov.clip.eps_high) == (0.2, 0.2)
    # verl 0.9.1 compute_policy_loss_kl_cov's own coefficient 1.0; ActorConfig passes 0.1
    assert kl_cov.params == CovarianceSelection(fraction=2e-4, kl_coef=1.0)
    assert any(u.knob == "params.kl_coef" and u.value == 1.0 for u in ALGORITHMS["kl_cov"].unstated)
    assert clip_cov.needs_selection and kl_cov.needs_selection


def test_dro_constants_verl_core_algos() -> None:
    dro = ALGORITHMS["dro"]
    assert dro.loss.params == QuadraticPenalty(beta=1.0)
    assert any(u.knob == "params.beta" for u in dro.unstated)  # verl ships no default


def test_luspo_constants_arxiv_2602_05261_trl() -> None:
    luspo = _loss("luspo")
    assert luspo.ratio is RatioKind.SEQUENCE and luspo.surrogate is SurrogateKind.PG_CLIP
    # TRL 1.16.0 'luspo': (per_token_loss * mask).sum(-1).mean()
    assert luspo.aggregation is Aggregation.SEQ_MEAN_TOKEN_SUM
    assert luspo.clip == _loss("gspo").clip


def test_vespo_constants_arxiv_2602_10693_trl() -> None:
    vespo = _loss("vespo")
    assert vespo.params == GammaWeight(k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0)
    assert vespo.aggregation is Aggregation.TOKEN_MEAN  # TRL's dapo-style normaliser


def test_cispo_variants_trl_scalerl_and_verl_bypass() -> None:
    trl = _loss("scalerl_cispo")
    assert trl.clip.bounds is ClipBounds.ABSOLUTE and (trl.clip.low, trl.clip.high) == (None, 5.0)
    bypass = _loss("bypass_pg")  # verl bypass_pg_is: sequence IS weight, threshold 2.0
    assert bypass.surrogate is SurrogateKind.CISPO
    assert bypass.ratio is RatioKind.SEQUENCE_PRODUCT and bypass.clip.high == 2.0


def test_ppo_dual_clip_constant_arxiv_1912_09729() -> None:
    assert _loss("ppo_dual_clip").clip.dual_clip == 3.0


@pytest.mark.parametrize(
    ("name", "level", "mode", "bounds"),
    [
        ("grpo_tis", ISLevel.TOKEN, ISMode.TRUNCATE, (None, None, 2.0)),  # Yao et al. C = 2
        ("grpo_mis", ISLevel.TOKEN, ISMode.ZERO, (None, 3.0, None)),  # TRL C_max 3.0
        ("grpo_seq_tis", ISLevel.SEQUENCE, ISMode.TRUNCATE, (None, None, 2.0)),  # verl default
        ("grpo_seq_mis", ISLevel.SEQUENCE, ISMode.ZERO, (None, 3.0, None)),  # TRL default mode
        ("icepop", ISLevel.TOKEN, ISMode.ZERO, (0.5, 5.0, None)),  # verl IcePop preset
        ("grpo_geo_rs", ISLevel.GEOMETRIC, ISMode.MASK, (1 / 1.001, 1 / 0.999, None)),
    ],
)
def test_rollout_is_constants(
    name: str, level: ISLevel, mode: ISMode, bounds: tuple[float | None, ...]
) -> None:
    corr = _loss(name).is_correction
    assert corr is not None
    assert (corr.level, corr.mode, (corr.low, corr.high, corr.cap)) == (level, mode, bounds)


def test_every_entry_cites_a_paper_or_a_framework_file() -> None:
    for name, spec in ALGORITHMS.items():
        assert all(
            ("arXiv:" in s) or (".py" in s) or ("#" in s) or ("Yao" in s) for s in spec.sources
        )
        assert spec.sources, name


def test_derive_routes_params_fields_and_checks_aggregation_names() -> None:
    sapo = ALGORITHMS["sapo"].derive(tau_neg=2.0)
    assert sapo.loss.params == SoftGate(tau_pos=1.0, tau_neg=2.0)
    assert ALGORITHMS["sapo"].loss.params == SoftGate()
    with pytest.raises(
        ConfigError, match=r"aggregation must be one of .*did you mean 'token-mean'\?"
    ):
        ALGORITHMS["dapo"].derive(aggregation="token_mean")
    with pytest.raises(ConfigError, match="needs params=QuadraticPenalty"):
        ALGORITHMS["dapo"].derive(surrogate="dro")
    with pytest.raises(ConfigError, match=r"unknown override\(s\) \['tau'\]; allowed: .*tau_neg"):
        ALGORITHMS["sapo"].derive(tau=1.0)


def test_params_defaults_are_the_frameworks_defaults() -> None:
    # verl 0.9.1 workers/config/actor.py PolicyLossConfig / ActorConfig; TRL 1.16.0 GRPOConfig
    cov = CovarianceSelection()
    assert (cov.fraction, cov.low, cov.high, cov.kl_coef, cov.seed) == (2e-4, 1.0, 5.0, 1.0, 0)
    assert (SoftGate().tau_pos, SoftGate().tau_neg) == (1.0, 1.05)  # verl tau_pos/tau_neg, TRL
    dm = DivergenceMask()
    assert (dm.delta_low, dm.delta_high, dm.is_cap) == (0.2, 0.2, 20.0)  # clip_ratio*, _c = 20
    gw = GammaWeight()
    assert (gw.k_pos, gw.lambda_pos, gw.k_neg, gw.lambda_neg) == (2.0, 3.0, 3.0, 2.0)  # TRL vespo_*
