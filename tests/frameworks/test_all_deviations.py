"""The DEVIATIONS table: well formed, at least ten entries, every node id collectable.

A demonstrating test that fails fails the tier by itself; ``conftest.py`` also fails the
run when one of them is skipped.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
