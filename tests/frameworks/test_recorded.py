"""Default suite (no framework installed): the catalogue's account of verl, TRL and
OpenRLHF against their recorded outputs (``snapshots/frameworks/``).

For every case, the reference config it is said to equal reproduces the framework's
recorded loss and gradient on every canonical-corpus batch, and where the case names a
deviation from the algorithm its option is called after, that algorithm's reference does
not. The recordings carry the pinned version and wheel sha256 and the corpus version.
"""

from __future__ import annotations

import pytest

from pytest_polgrad.core.corpus import CORPUS_VERSION
from pytest_polgrad.frameworks import PINS
from pytest_polgrad.frameworks.cases import CASES, Case, Reference
from pytest_polgrad.frameworks.recorded import compare_outputs, load, reference_outputs


@pytest.mark.parametrize("framework", sorted(PINS))
def test_recording_provenance(framework: str) -> None:
    doc = load(framework)
    pin = PINS[framework]
    assert (doc["framework"], doc["version"], doc["wheel"], doc["sha256"]) == (
        framework,
        pin.version,
        pin.wheel,
        pin.sha256,
    )
    assert doc["corpus_version"] == CORPUS_VERSION, (
        "the canonical corpus changed since the recording; re-record with "
        "`make frameworks` then `.venv-frameworks/bin/python -m pytest_polgrad.frameworks record`"
    )


@pytest.mark.parametrize("framework", sorted(PINS))
def test_every_case_is_recorded(framework: str) -> None:
    recorded = set(load(framework)["cases"])
    cases = {c.id for c in CASES if c.framework == framework}
    assert recorded == cases, (
        f"not recorded: {sorted(cases - recorded)}; recorded but not in CASES: "
        f"{sorted(recorded - cases)}"
    )


def _recorded(case: Case) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = load(case.framework)["cases"][case.id]
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_recorded_outputs_equal_the_claimed_reference(case: Case) -> None:
    diff = compare_outputs(reference_outputs(case, case.equals), _recorded(case), rtol=case.rtol)
    assert not diff, f"{case.id} does not equal {case.equals.describe()}:\n" + "\n".join(diff)


_DEVIATING = [c for c in CASES if c.claims is not None and {"value", "gradient"} & set(c.expect)]


@pytest.mark.parametrize("case", _DEVIATING, ids=[c.id for c in _DEVIATING])
def test_recorded_outputs_differ_from_the_named_algorithm(case: Case) -> None:
    assert case.claims is not None
    diff = compare_outputs(reference_outputs(case, case.claims), _recorded(case), rtol=1e-6)
    assert diff, (
        f"{case.id} now equals {case.claims.describe()} on the corpus although "
        f"{sorted(case.expect)} are declared as deviations"
    )


@pytest.mark.parametrize(
    ("case_id", "wrong"),
    [
        ("verl_vanilla", Reference("ppo")),  # without verl's dual clip
        ("trl_grpo", Reference("ppo")),  # token-mean instead of seq-mean-token-mean
        ("trl_cispo", Reference("cispo")),  # relative cap instead of TRL's absolute one
        ("verl_vanilla_token_sum_norm_default", Reference("dr_grpo", {"budget": 4096})),
    ],
)
def test_a_wrong_claim_is_caught(case_id: str, wrong: Reference) -> None:
    case = next(c for c in CASES if c.id == case_id)
    assert compare_outputs(reference_outputs(case, wrong), _recorded(case), rtol=case.rtol)
