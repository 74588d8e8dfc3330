"""The DEVIATIONS table: well formed, at least ten entries, every node id collectable.

A demonstrating test that fails fails the tier by itself; ``conftest.py`` also fails the
run when one of them is skipped.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_polgrad.frameworks import DEVIATIONS, PINS

ROOT = Path(__file__).resolve().parents[2]


def test_deviation_node_ids_are_collected() -> None:
    ids = sorted({d.nodeid for d in DEVIATIONS})
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            *ids,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    collected = {line.strip() for line in out.stdout.splitlines()}
    missing = [nid for nid in ids if nid not in collected]
    assert out.returncode == 0 and not missing, (
        f"DEVIATIONS name node ids that are not collected: {missing}\n{out.stdout[-2000:]}"
        f"{out.stderr[-2000:]}"
    )


def test_deviation_table_is_well_formed() -> None:
    assert len(DEVIATIONS) >= 10
    assert len({d.nodeid for d in DEVIATIONS}) == len(DEVIATIONS)
    for d in DEVIATIONS:
        frameworks = [f.strip() for f in d.framework.split(",")]
        versions = [v.strip() for v in d.version.split(",")]
        assert [PINS[f].version for f in frameworks] == versions, d
        assert d.nodeid.startswith("tests/frameworks/test_"), d
        assert d.description and d.component, d


# Functions whose every declared check is a deviation of its own, so each is a row of the
# table and pinned at its size: a training step's splits are distinct accumulation paths
# (the kind runs no golden to pin a bare reason), and TRL's bias-corrected KL moves the
# value, the gradient and the on-policy point differently (issue 27, finding 2).
REGISTERED_IN_FULL = [
    ("test_all_training_steps", "verl_geo_mean_step"),
    ("test_all_training_steps", "trl_dapo_step"),
    ("test_trl_grpo_loss", "trl_grpo_kl_bias_corrected"),
]


@pytest.mark.parametrize(("module", "function"), REGISTERED_IN_FULL)
def test_every_declared_check_is_registered_and_pinned(module: str, function: str) -> None:
    fn = getattr(importlib.import_module(module), function)
    declared = {}
    for mark in fn.pytestmark:
        if mark.name == "polgrad_conforms" and mark.kwargs.get("expect"):
            ref = mark.kwargs.get("id") or mark.args[0]
            for check, why in mark.kwargs["expect"].items():
                declared[f"tests/frameworks/{module}.py::{function}[{ref}-{check}]"] = why
    assert declared, f"{function} declares no deviation"
    rows = {d.nodeid: d for d in DEVIATIONS}
    missing = sorted(set(declared) - set(rows))
    assert not missing, f"declared with expect= but not in DEVIATIONS: {missing}"
    unpinned = sorted(n for n, why in declared.items() if not isinstance(why, tuple))
    assert not unpinned, (
        f"declared without a size (expect={{check: (reason, max_error)}}): {unpinned}"
    )
