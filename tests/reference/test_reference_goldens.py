"""The reference's own goldens: every registry algorithm's loss, per-token objective and
gradient on the canonical corpus, stored under the top-level ``snapshots/`` folder.

Any change to the reference's semantics shows up here as a snapshot diff in review; accept
an intended one with ``pytest tests/reference/test_reference_goldens.py --snapshot-update``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from syrupy.assertion import SnapshotAssertion
from syrupy.location import PyTestLocation

from polgrad_reference import (
    ALGORITHMS,
    ClipConfig,
    ISCorrection,
    KLConfig,
    PolicyLossConfig,
    policy_loss,
)
from pytest_polgrad.core.corpus import CORPUS_VERSION, canonical_corpus
from pytest_polgrad.core.golden_format import (
    EntryScale,
    PolgradSnapshotExtension,
    Tolerant,
    compare,
    flatten,
    parse,
)
from pytest_polgrad.core.tolerance import Tolerance
from pytest_polgrad.kinds.policy_loss.oracle import Oracle

SNAPSHOTS = Path(__file__).resolve().parents[2] / "snapshots"
STRICT = Tolerance(torch.float64, strict=True)  # the reference computes exactly in float64


class ReferenceGoldens(PolgradSnapshotExtension):
    """Stores this module's snapshots in ``snapshots/test_reference_goldens/``."""

    @classmethod
    def dirname(cls, *, test_location: PyTestLocation) -> str:
        return str(SNAPSHOTS / test_location.basename)


def reference_golden(cfg: PolicyLossConfig, advantages: str) -> Tolerant:
    """``{batch: {loss, token_loss, grad}}`` of ``cfg`` on the corpus, with the engine's
    float64 tolerance (loss and gradient scales from the oracle)."""
    data: dict[str, dict[str, torch.Tensor]] = {}
    scales: dict[str, EntryScale] = {}
    oracle = Oracle(cfg)
    for name, batch in canonical_corpus(advantages=advantages).items():
        logprobs = batch["logprobs"].clone().requires_grad_()
        optional = {k: batch[k] for k in oracle.needs}
        out = policy_loss(
            cfg,
            logprobs=logprobs,
            old_logprobs=batch["old_logprobs"],
            advantages=batch["advantages"],
            response_mask=batch["response_mask"],
            **optional,
        )
        (grad,) = torch.autograd.grad(out.loss, logprobs)
        token_loss = torch.where(batch["response_mask"], out.token_loss.detach(), 0.0)
        data[name] = {"loss": out.loss.detach(), "token_loss": token_loss, "grad": grad}
        ref = oracle(batch, kink_eps=STRICT.loosest)
        scales[f"{name}/loss"] = EntryScale(ref.value_scale, count=ref.n_tokens)
        scales[f"{name}/grad"] = EntryScale(ref.grad_scale, skip=ref.ambiguous)
    return Tolerant(data, tolerance=STRICT, scales=scales, corpus=CORPUS_VERSION)


@pytest.mark.parametrize("advantages", ["sequence", "token"])
@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_reference_golden(snapshot: SnapshotAssertion, algorithm: str, advantages: str) -> None:
    golden = reference_golden(ALGORITHMS[algorithm].loss, advantages)
    assert snapshot.use_extension(ReferenceGoldens) == golden


_GRPO = ALGORITHMS["grpo"].loss
VARIANTS: dict[str, PolicyLossConfig] = {
    # framework modes that are configs rather than registry entries (docs/losses.md, kl.md)
    "verl-cispo-two-sided": ALGORITHMS["cispo"].loss.replace(clip=ClipConfig(0.2, 0.28)),
    "verl-k3-plus": _GRPO.replace(kl=KLConfig(estimator="k3+", coef=0.04)),
    "trl-k3-ratio-weighted": _GRPO.replace(
        kl=KLConfig(estimator="k3", coef=0.04, ratio_weight="undetached")
    ),
    "openrlhf-k3-unbiased-gradient": _GRPO.replace(
        kl=KLConfig(estimator="k3+", coef=0.04, ratio_weight="gradient", ratio_cap=10.0)
    ),
    "openrlhf-seq-mask-is": _GRPO.replace(
        kl=None,
        is_correction=ISCorrection(
            level="geometric", mode="zero", low=0.5, high=5.0, weight="token"
        ),
    ),
    "openrlhf-clip-is": _GRPO.replace(kl=None, is_correction=ISCorrection(low=0.5, cap=5.0)),
}


@pytest.mark.parametrize("advantages", ["sequence", "token"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_golden(snapshot: SnapshotAssertion, variant: str, advantages: str) -> None:
    golden = reference_golden(VARIANTS[variant], advantages)
    assert snapshot.use_extension(ReferenceGoldens) == golden


def _stored(algorithm: str) -> str:
    return (SNAPSHOTS / "test_reference_goldens" / f"{_name(algorithm)}.polgrad").read_text()


def _name(algorithm: str) -> str:
    return f"test_reference_golden[{algorithm}-sequence]"


def _differences(stored: str, golden: Tolerant) -> list[str]:
    received = parse(PolgradSnapshotExtension().serialize(golden))
    return [d.describe() for d in compare(parse(stored), received, golden).differences]


def test_reference_goldens_cover_every_algorithm_and_entry() -> None:
    files = sorted(p.name for p in (SNAPSHOTS / "test_reference_goldens").glob("*.polgrad"))
    assert set(files) == {
        f"test_reference_golden[{a}-{adv}].polgrad"
        for a in ALGORITHMS
        for adv in ("sequence", "token")
    } | {
        f"test_variant_golden[{v}-{adv}].polgrad" for v in VARIANTS for adv in ("sequence", "token")
    }
    doc = parse(_stored("dapo"))
    assert doc.corpus == CORPUS_VERSION
    batches = canonical_corpus()
    assert list(doc.entries) == [
        f"{b}/{q}" for b in batches for q in ("loss", "token_loss", "grad")
    ]


def test_reference_goldens_catch_a_semantic_change() -> None:
    """The goldens can fail: DAPO with a symmetric clip (eps_high 0.2, not 0.28) differs
    exactly where ratios fall between 1.2 and 1.28 with a positive advantage."""
    changed = ALGORITHMS["dapo"].derive(eps_high=0.2).loss
    differences = _differences(_stored("dapo"), reference_golden(changed, "sequence"))
    assert differences
    assert any(d.startswith("clip-boundaries/grad[0,2]: stored ") for d in differences)
    assert any(d.startswith("clip-boundaries/loss: stored ") for d in differences)


def test_reference_goldens_ignore_float_noise() -> None:
    golden = reference_golden(ALGORITHMS["grpo"].loss, "sequence")
    noisy = {
        batch: {k: v * (1 + 4 * 2.0**-53) for k, v in quantities.items()}
        for batch, quantities in golden.data.items()  # type: ignore[attr-defined]
    }
    stored = _stored("grpo")
    assert _differences(stored, golden) == []
    assert (
        _differences(stored, Tolerant(noisy, golden.tolerance, golden.scales, golden.corpus)) == []
    )
    assert flatten(noisy, corpus=CORPUS_VERSION).entries.keys() == parse(stored).entries.keys()


def test_the_corpus_tells_every_is_correction_apart() -> None:
    """The ``rollout-mismatch`` batch (corpus version 2) crosses every importance-sampling
    threshold the registry uses, so the goldens (and the diagnosis, which ranks on the
    same corpus) tell the corrections apart: every pair of IS-corrected registry entries,
    and each against no correction, differs there beyond the goldens' tolerance. (On
    version 1 every rollout ratio lay in [0.905, 1.105]: truncating at 2, masking at 3 and
    IcePop's band all gave the same outputs.)"""
    corrected = sorted(n for n, spec in ALGORITHMS.items() if spec.loss.is_correction)
    assert len(corrected) >= 5, corrected
    goldens = {n: reference_golden(ALGORITHMS[n].loss, "sequence") for n in corrected}
    plain = {n: ALGORITHMS[n].loss.replace(is_correction=None) for n in corrected}
    for name in corrected:
        without = _differences(_stored(name), reference_golden(plain[name], "sequence"))
        assert any(d.startswith("rollout-mismatch/") for d in without), name
        for other in corrected:
            if other != name and ALGORITHMS[other].loss.replace(is_correction=None) == plain[name]:
                apart = _differences(_stored(name), goldens[other])
                assert any(d.startswith("rollout-mismatch/") for d in apart), (name, other)
