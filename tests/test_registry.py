"""The registry: ten immutable specs, cited, with open knobs as data; derive() copies."""

from __future__ import annotations

import dataclasses

import pytest

from polgrad_reference import (
    ALGORITHMS,
    Aggregation,
    ConfigError,
    RatioKind,
    SurrogateKind,
    describe_algorithm,
    get_algorithm,
)

NAMES = [
    "cispo", "dapo", "dr_grpo", "grpo", "grpo_tis", "gspo", "gspo_token", "ppo", "reinforce_pp",
    "rloo",
]  # fmt: skip


def test_the_ten_algorithms() -> None:
    assert sorted(ALGORITHMS) == NAMES
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
    with pytest.raises(ConfigError, match="unknown algorithm 'grpo2'; known: cispo, dapo"):
        get_algorithm("grpo2")


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
