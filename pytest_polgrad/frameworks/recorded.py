"""Recorded framework outputs on the canonical corpus, and the reference's account of them.

``snapshots/frameworks/<framework>.json`` holds, for every case of
:data:`~pytest_polgrad.frameworks.cases.CASES`, the framework's loss and its gradient with
respect to ``logprobs`` on each canonical-corpus batch (float64 inputs), with the
provenance of the numbers: framework version, wheel and sha256, corpus version, torch
version. :func:`record` computes them (frameworks installed); :func:`reference_outputs`
computes what a reference config gives on the same batches (no framework needed), which is
how the default suite checks the catalogue's claims against the recorded numbers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import import_module
from pathlib import Path
from typing import Any

import torch

from polgrad_reference import PolicyLossConfig, get_algorithm, policy_loss
from pytest_polgrad.core.corpus import CORPUS_VERSION, canonical_corpus
from pytest_polgrad.frameworks._adapt import require_installed
from pytest_polgrad.frameworks._pins import PINS
from pytest_polgrad.frameworks.cases import CASES, Case, Reference

__all__ = [
    "SNAPSHOT_DIR",
    "Outputs",
    "compare_outputs",
    "load",
    "record",
    "reference_config",
    "reference_outputs",
    "snapshot_path",
    "write",
]

Outputs = dict[str, dict[str, Any]]
"""``{batch: {"loss": float, "grad": [[float, ...], ...]}}``."""

SNAPSHOT_DIR = Path(__file__).resolve().parents[2] / "snapshots" / "frameworks"
"""The repository's ``snapshots/frameworks/`` (recorded outputs are repository data)."""


def snapshot_path(framework: str, directory: Path | None = None) -> Path:
    """``<directory or SNAPSHOT_DIR>/<framework>.json``."""
    return (directory or SNAPSHOT_DIR) / f"{framework}.json"


def _batches(case: Case) -> dict[str, dict[str, torch.Tensor]]:
    return canonical_corpus(dtype=torch.float64, advantages=case.advantages)


def _inputs(case: Case, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    names = ["logprobs", "old_logprobs", "advantages", "response_mask"]
    if case.takes_ref:
        names.append("ref_logprobs")
    out = {n: batch[n].clone() for n in names}
    out["logprobs"].requires_grad_(True)
    return out


def _outputs(loss: torch.Tensor, logprobs: torch.Tensor) -> dict[str, Any]:
    (grad,) = torch.autograd.grad(loss, logprobs, allow_unused=True)
    if grad is None:
        grad = torch.zeros_like(logprobs)
    return {"loss": float(loss.detach()), "grad": grad.detach().tolist()}


def record_case(case: Case) -> Outputs:
    """The framework's outputs for ``case`` on every corpus batch (framework installed)."""
    module = import_module(f"pytest_polgrad.frameworks.{case.framework}")
    options = dict(case.options)
    positional = [options.pop("mode")] if "mode" in options else []
    fn = getattr(module, case.factory)(*positional, **options)
    out: Outputs = {}
    for name, batch in _batches(case).items():
        inputs = _inputs(case, batch)
        out[name] = _outputs(fn(**inputs), inputs["logprobs"])
    return out


def record(framework: str) -> dict[str, Any]:
    """The snapshot document of ``framework``: provenance and every case's outputs."""
    version = require_installed(framework)
    pin = PINS[framework]
    return {
        "framework": framework,
        "version": version,
        "wheel": pin.wheel if version == pin.version else None,
        "sha256": pin.sha256 if version == pin.version else None,
        "corpus_version": CORPUS_VERSION,
        "torch": torch.__version__,
        "cases": {c.id: record_case(c) for c in CASES if c.framework == framework},
    }


def write(document: Mapping[str, Any], directory: Path | None = None) -> Path:
    """Write a snapshot document (sorted keys, one file per framework)."""
    path = snapshot_path(str(document["framework"]), directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    return path


def load(framework: str, directory: Path | None = None) -> dict[str, Any]:
    """The recorded snapshot document of ``framework``."""
    doc: dict[str, Any] = json.loads(snapshot_path(framework, directory).read_text())
    return doc


def reference_config(ref: Reference, *, with_kl: bool) -> PolicyLossConfig:
    """The loss config of ``ref`` (registry entry + overrides); the KL term is dropped
    unless ``with_kl`` (as the kit does for a function without ``ref_logprobs``)."""
    cfg = get_algorithm(ref.name).derive(**dict(ref.overrides)).loss
    return cfg if with_kl else cfg.replace(kl=None)


def reference_outputs(case: Case, ref: Reference) -> Outputs:
    """What ``ref`` gives on the corpus batches ``case`` is recorded on (float64)."""
    out: Outputs = {}
    for name, batch in _batches(case).items():
        resolved = ref.resolve(int(batch["response_mask"].shape[1]))
        cfg = reference_config(resolved, with_kl=case.takes_ref)
        inputs = _inputs(case, batch)
        result = policy_loss(cfg, **inputs)
        out[name] = _outputs(result.loss, inputs["logprobs"])
    return out


def compare_outputs(
    expected: Outputs, actual: Outputs, *, rtol: float = 1e-9, atol: float = 1e-12
) -> list[str]:
    """Differences beyond ``atol + rtol * |expected|``, one line each (empty: they agree)."""
    lines: list[str] = []
    for batch in sorted(set(expected) | set(actual)):
        if batch not in expected or batch not in actual:
            lines.append(f"{batch}: present on one side only")
            continue
        e, a = expected[batch], actual[batch]
        if abs(e["loss"] - a["loss"]) > atol + rtol * abs(e["loss"]):
            lines.append(f"{batch}/loss: {e['loss']!r} vs {a['loss']!r}")
        ge = torch.tensor(e["grad"], dtype=torch.float64)
        ga = torch.tensor(a["grad"], dtype=torch.float64)
        if ge.shape != ga.shape:
            lines.append(f"{batch}/grad: shape {tuple(ge.shape)} vs {tuple(ga.shape)}")
            continue
        bad = (ge - ga).abs() > atol + rtol * ge.abs()
        for b, t in bad.nonzero().tolist()[:5]:
            lines.append(f"{batch}/grad[{b},{t}]: {ge[b, t].item()!r} vs {ga[b, t].item()!r}")
    return lines
