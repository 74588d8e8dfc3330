"""The golden-snapshot workflow end to end, in pytest sessions run inside this process
(``tests/helpers/inline_run.py``; ``-n 2`` has real worker processes), serially and with
``-n 2``: golden items (48 under ``-n 2``, 36 serially) and user snapshots are recorded,
float noise passes, semantic changes, new, removed, corrupted and raising functions fail
clearly, ``--snapshot-update`` accepts exactly what changed (and deletes what is unused),
and nothing unrelated is touched.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from pytest_polgrad.core.corpus import CORPUS_VERSION, canonical_corpus
from pytest_polgrad.core.golden_format import parse
from tests.helpers import inline_run

# Each kind of item a few times (each golden item costs ~50 ms of the kit's own work per
# session, four sessions per mode): enough that under -n 2 both workers record, compare and
# update items of every kind.
SEMANTIC = range(16, 24)  # clip eps_high 0.28 -> 0.2 in step 2
NOISY = range(0, 24)  # relative noise 3e-11 (changes the written text, within tolerance)
REMOVED = range(24, 28)
CORRUPT = 28
RAISING = 29
ADDED = 4  # the last ADDED of the n golden items appear in step 2
SHOWN = SEMANTIC[-3]  # the semantic change whose report is read in full

CONFTEST = """
import pytest
from pytest_polgrad.core.golden_format import PolgradSnapshotExtension

@pytest.fixture
def polgrad_snapshot(snapshot):
    return snapshot.use_extension(PolgradSnapshotExtension)
"""

LOSSES = """
import json
from pathlib import Path

import pytest
import torch

STATE = json.loads(Path(__file__).with_name("state.json").read_text())


def make(i):
    eps_high = 0.2 if i in STATE["semantic"] else 0.28
    noise = 3e-11 if i in STATE["noisy"] else 0.0

    def loss(logprobs, old_logprobs, advantages, response_mask):
        if i in STATE["raising"]:
            raise RuntimeError("deliberately broken")
        ratio = torch.exp(logprobs - old_logprobs)
        adv = advantages[:, None]
        tok = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1 + eps_high))
        return (tok * response_mask).sum() / response_mask.sum() * (1 + i / 100) * (1 + noise)

    loss.__name__ = loss.__qualname__ = f"loss_{i:03d}"
    return pytest.mark.polgrad_conforms("dapo", checks=("golden",))(loss)


for i in STATE["present"]:
    globals()[f"loss_{i:03d}"] = make(i)


def test_unrelated(snapshot):
    assert snapshot == {"kept": [1, 2, 3]}


def test_special_values(polgrad_snapshot):
    t = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1.5])
    assert polgrad_snapshot == {
        "floats": t,
        "half": t.half(),
        "empty": torch.zeros(0, 3),
        "ints": torch.arange(3),
        "mask": torch.tensor([True, False]),
        "py": [2.5, 3, True, "text", None],
    }


def test_user_loss(polgrad_snapshot):
    assert polgrad_snapshot == {"loss": torch.tensor(STATE["user_loss"], dtype=torch.float64)}
"""

OTHER = """
import pytest
import torch


@pytest.mark.polgrad_conforms("grpo", checks=("golden",))
def other_loss(logprobs, old_logprobs, advantages, response_mask):
    ratio = torch.exp(logprobs - old_logprobs)
    return -(advantages[:, None] * ratio * response_mask).sum() / response_mask.sum()
"""


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    # The inner run must not believe it is an xdist worker of the outer run.
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_ADDOPTS"):
        monkeypatch.delenv(name, raising=False)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_losses=LOSSES, test_other=OTHER)
    return pytester


def set_state(pytester: pytest.Pytester, *, step: int, n: int) -> None:
    changed = step >= 2
    added = range(n - ADDED, n)
    present = [i for i in range(n) if (i not in REMOVED if changed else i not in added)]
    state = {
        "present": present,
        "semantic": list(SEMANTIC) if changed else [],
        "noisy": list(NOISY) if changed else [],
        "raising": [RAISING] if step in (2, 3) else [],
        "user_loss": 1.5 if changed else 1.0,
    }
    (pytester.path / "state.json").write_text(json.dumps(state))


def files(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted((root / "__snapshots__").rglob("*"))
        if p.is_file()
    }


def golden(i: int) -> str:
    return f"__snapshots__/test_losses/loss_{i:03d}[dapo-golden].polgrad"


def loss_value(content: bytes) -> float:
    doc = parse(content.decode(), source="golden")
    assert doc.corpus == CORPUS_VERSION
    assert len(doc.entries) == 2 * len(canonical_corpus())  # every batch: loss, grad
    return float(doc.entries["ragged/loss"].values[0])


def run(pytester: pytest.Pytester, workers: list[str], *args: str) -> pytest.RunResult:
    return inline_run.run(pytester, "-p", "no:cacheprovider", *workers, *args, cold=True)


def summary(result: pytest.RunResult) -> str:
    lines = result.outlines
    start = max(i for i, line in enumerate(lines) if "snapshot report summary" in line)
    return lines[start + 1]


@pytest.mark.parametrize(("workers", "n"), [([], 36), (["-n", "2"], 48)], ids=["serial", "xdist"])
def test_golden_lifecycle(project: pytest.Pytester, workers: list[str], n: int) -> None:
    """``n`` golden items (the last :data:`ADDED` added in step 2) and four other tests."""
    root = project.path
    added = range(n - ADDED, n)
    # 1. First run with --snapshot-update records every golden and user snapshot.
    set_state(project, step=1, n=n)
    result = run(project, workers, "--snapshot-update")
    assert result.ret == 0, result.stdout.str()
    assert result.parseoutcomes()["passed"] == n - len(added) + 4
    assert summary(result) == f"{n - len(added) + 4} snapshots generated."
    recorded = files(root)
    base = loss_value(recorded[golden(0)][0])
    for i in range(n):
        if i in added:
            assert golden(i) not in recorded
        else:  # every item wrote its own, complete file (no loss, no mix-up)
            assert math.isclose(loss_value(recorded[golden(i)][0]), base * (1 + i / 100))
    unrelated = {k: v for k, v in recorded.items() if "test_losses/loss_" not in k}
    assert sorted(unrelated) == [
        "__snapshots__/test_losses.ambr",
        "__snapshots__/test_losses/test_special_values.polgrad",
        "__snapshots__/test_losses/test_user_loss.polgrad",
        "__snapshots__/test_other/other_loss[grpo-golden].polgrad",
    ]
    special = recorded["__snapshots__/test_losses/test_special_values.polgrad"][0].decode()
    assert "floats[3] = -0" in special and "half[0] = nan" in special and "empty: " in special

    # 2. Changes: noise passes; semantic, new, corrupted and raising fail; removed unused.
    set_state(project, step=2, n=n)
    path = root / golden(CORRUPT)
    path.write_text(path.read_text().replace("ragged/grad[1,1] = ", "ragged/grad[1,1] = x"))
    before = files(root)
    result = run(project, workers)
    assert result.ret == 1
    outcomes = result.parseoutcomes()
    failing = len(SEMANTIC) + len(added) + 3  # + corrupted, raising, test_user_loss
    assert (outcomes["failed"], outcomes["passed"]) == (failing, n - len(REMOVED) + 4 - failing)
    assert summary(result).endswith(f"{len(REMOVED)} snapshots unused.")
    out = result.stdout.str()
    assert re.search(rf"loss_{SHOWN:03d} \(reference dapo\) does not match", out)
    # the short summary names the failure, not a module path cut at the terminal's width
    failed = rf"FAILED \S*loss_{SHOWN:03d}\[dapo-golden\] - GoldenMismatch: golden"
    assert re.search(failed, out), out
    assert re.search(r"  clip-boundaries/grad\[0,2\]: stored -0\.\d+, received 0 \(", out)
    assert f"{root / golden(SHOWN)} (- stored, + received):" in out
    assert f"no golden snapshot of loss_{n - 2:03d} (reference dapo) is recorded yet" in out
    assert re.search(
        re.escape(f"corrupted or hand-edited snapshot: {root / golden(CORRUPT)}, line 18, ")
        + r"entry 'ragged/grad': 'x0\.\d+' is not a float64 value",
        out,
    )
    assert (
        f"loss_{RAISING:03d} (reference dapo) could not be evaluated on canonical batch "
        "'ragged': the function raised on a valid batch: RuntimeError: deliberately broken" in out
    )
    assert "loss: stored 1, received 1.5" in out  # the user's own polgrad_snapshot test
    assert files(root) == before  # a plain run writes nothing

    # 3. --snapshot-update accepts exactly what changed and deletes what is unused.
    result = run(project, workers, "--snapshot-update")
    assert result.ret == 1  # the raising function still fails ...
    assert result.parseoutcomes()["failed"] == 1
    changed = len(SEMANTIC) + 2  # + the corrupted file, test_user_loss
    assert summary(result) == (
        f"{n - len(REMOVED) + 4 - len(added) - changed} snapshots passed. "
        f"{len(added)} snapshots generated. {changed} snapshots updated. "
        f"{len(REMOVED)} unused snapshots deleted."
    )
    after = files(root)
    for i in range(n):
        key = golden(i)
        if i in REMOVED:
            assert key not in after
        elif i in added:
            assert math.isclose(loss_value(after[key][0]), base * (1 + i / 100))
        elif i in SEMANTIC:  # rewritten only where values moved, never for the noise
            old, new = recorded[key][0].decode(), after[key][0].decode()
            moved = [
                (a, b) for a, b in zip(old.splitlines(), new.splitlines(), strict=False) if a != b
            ]
            assert moved
            for a, b in moved:
                x, y = float(a.split(" = ")[1]), float(b.split(" = ")[1])
                assert abs(x - y) > 1e-6 * max(abs(x), abs(y)), (a, b)
        elif i == CORRUPT:
            assert after[key][0] == recorded[key][0]  # re-recorded, same values as step 1
        else:  # noisy, raising (retained) and unchanged files are not even rewritten
            assert after[key] == recorded[key], key
    for key in unrelated:
        if "test_user_loss" not in key:
            assert after[key] == recorded[key], key

    # 4. The next plain run passes with nothing unused, and writes nothing.
    set_state(project, step=4, n=n)
    result = run(project, workers)
    assert result.ret == 0, result.stdout.str()
    assert summary(result) == f"{n - len(REMOVED) + 4} snapshots passed."
    assert files(root) == after


REFUSING = """
import os
import pytest


@pytest.fixture(autouse=True)
def refuse_writes(monkeypatch):
    if os.path.exists("refuse"):  # a read-only snapshot directory (we run as root here)
        def refuse(src, dst):
            raise PermissionError(13, "Permission denied", str(dst))

        monkeypatch.setattr(os, "replace", refuse)
"""

ONE = """
import json
from pathlib import Path

import pytest
import torch

EPS = json.loads(Path(__file__).with_name("state.json").read_text())["eps_high"]


@pytest.mark.polgrad_conforms("dapo", checks=("golden",))
def loss(logprobs, old_logprobs, advantages, response_mask):
    ratio = torch.exp(logprobs - old_logprobs)
    adv = advantages[:, None]
    tok = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1 + EPS))
    return (tok * response_mask).sum() / response_mask.sum()
"""


def test_a_failed_write_is_not_reported_by_a_later_session(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot write error belongs to its session: a later session in the same process
    (a user's in-process pytester runs) reports its own mismatch, not the earlier write
    error (``pytest_polgrad.core.golden_format._WRITE_ERRORS`` is forgotten at session start)."""
    from pytest_polgrad.core import golden_format as snapshot

    monkeypatch.setattr(snapshot, "_WRITE_ERRORS", {})  # this test's sessions only
    pytester.makeconftest(REFUSING)
    pytester.makepyfile(test_one=ONE)
    state = pytester.path / "state.json"
    state.write_text(json.dumps({"eps_high": 0.28}))
    args = ("-p", "no:cacheprovider", "-p", "no:randomly")
    assert inline_run.run(pytester, *args, "--snapshot-update").ret == 0
    state.write_text(json.dumps({"eps_high": 0.2}))  # a semantic change
    (pytester.path / "refuse").write_text("")
    refused = inline_run.run(
        pytester, *args, "--snapshot-update", may_change=["snapshot._WRITE_ERRORS"]
    )
    assert refused.ret == 1
    refused.stdout.fnmatch_lines(["*could not write snapshot *loss*PermissionError*"])
    (pytester.path / "refuse").unlink()
    later = inline_run.run(pytester, *args, may_change=["snapshot._WRITE_ERRORS"])
    assert later.ret == 1
    text = later.stdout.str()
    assert "golden snapshot of loss (reference dapo) does not match" in text, text
    assert "could not write snapshot" not in text
