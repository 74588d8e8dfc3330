"""Nothing lost on ``--snapshot-update`` (issue 15): a session that stops early (``-x``,
``--maxfail``, Ctrl-C, a collection error, a crashed xdist worker) deletes no snapshot, and
an item that fails keeps its snapshot; an obsolete snapshot of a removed test is still
deleted by a complete session. Counted as files and their SHA-256, serially and ``-n 2``,
in sessions run inside this process (``tests/helpers/inline_run.py``, cold).

Each case is shown to lose files without the guard (``-p no:polgrad-snapshot-guard``), so
the test can fail for the bug it names.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.helpers import inline_run

pytest_plugins = ["pytester"]

N = 6  # golden-only marked functions; plus 3 plain syrupy snapshots in one .ambr file

MODULE = """
import json
import os
from pathlib import Path

import pytest
import torch

STATE = json.loads(Path(__file__).with_name("state.json").read_text())


def make(i):
    def loss(logprobs, old_logprobs, advantages, response_mask):
        if i in STATE["raise"]:
            raise RuntimeError("deliberately broken")
        if i == STATE["interrupt"]:
            raise KeyboardInterrupt
        if i == STATE["crash"]:
            os._exit(3)
        ratio = torch.exp(logprobs - old_logprobs)
        per = -advantages[:, None] * ratio
        return torch.where(response_mask, per, 0.0).sum() / response_mask.sum() * (1 + i / 100)

    return pytest.mark.polgrad_conforms("dapo", checks=("golden",))(loss)


for i in range(STATE["n"]):
    globals()[f"loss_{i}"] = make(i)


@pytest.mark.parametrize("k", range(3))
def test_plain(snapshot, k):
    if k in STATE["plain_raise"]:
        raise RuntimeError("fails before its snapshot assertion")
    assert snapshot == {"k": k}
"""


def _state(root: Path, **changes: object) -> None:
    state = {"n": N, "raise": [], "plain_raise": [], "interrupt": -1, "crash": -1, **changes}
    (root / "state.json").write_text(json.dumps(state))


def _hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((root / "__snapshots__").rglob("*"))
        if p.is_file()
    }


def _restore(root: Path, files: dict[str, bytes]) -> None:
    for p in (root / "__snapshots__").rglob("*"):
        if p.is_file():
            p.unlink()
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content)


_RECORDED: dict[str, bytes] = {}


@pytest.fixture
def recorded(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> tuple[pytest.Pytester, dict[str, bytes]]:
    """The project with every snapshot recorded (recorded once, then restored as bytes)."""
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_ADDOPTS"):
        monkeypatch.delenv(name, raising=False)
    pytester.makepyfile(test_goldens=MODULE)
    _state(pytester.path)
    if not _RECORDED:
        result = _run(pytester, [], "--snapshot-update")
        assert result.ret == 0, result.stdout.str()
        _RECORDED.update(
            (str(p.relative_to(pytester.path)), p.read_bytes())
            for p in (pytester.path / "__snapshots__").rglob("*")
            if p.is_file()
        )
    else:
        _restore(pytester.path, _RECORDED)
    assert len(_RECORDED) == N + 1  # one .polgrad per golden item, one .ambr
    return pytester, dict(_RECORDED)


def _run(pytester: pytest.Pytester, workers: list[str], *args: str) -> pytest.RunResult:
    """One session in this process (``tests/helpers/inline_run.py``, cold); ``-n 2`` still has real
    worker processes, so ``os._exit`` only ever runs in a worker (``crashed-worker`` has
    no serial case: in-process it would end the test process itself)."""
    return inline_run.run(
        pytester, "-p", "no:cacheprovider", "-p", "no:randomly", *workers, *args, cold=True
    )


CASES: dict[str, tuple[dict[str, object], list[str], bool, bool]] = {
    # name: (state changes, extra args, serial?, xdist?)
    "x-first-fails": ({"raise": [0]}, ["-x"], True, True),
    # under xdist, -x is --maxfail=1: one code path (xdist's DSession counts failures
    # against config maxfail), so --maxfail=2 runs serially only
    "maxfail-2": ({"raise": [0, 1]}, ["--maxfail=2"], True, False),
    "ctrl-c": ({"interrupt": 2}, [], True, True),
    "collection-error": ({}, ["COLLECTION_ERROR"], True, True),
    "crashed-worker": ({"crash": 2}, [], False, True),
}


APPLICABLE = [
    pytest.param(case, mode, id=f"{case}-{mode}")
    for case in sorted(CASES)
    for mode, applies in zip(("serial", "xdist"), CASES[case][2:], strict=True)
    if applies
]


@pytest.mark.parametrize(("case", "mode"), APPLICABLE)
def test_an_early_stop_deletes_no_snapshot(
    recorded: tuple[pytest.Pytester, dict[str, bytes]], case: str, mode: str
) -> None:
    pytester, files = recorded
    changes, args, _, _ = CASES[case]
    root = pytester.path
    workers = ["-n", "2"] if mode == "xdist" else []
    if "COLLECTION_ERROR" in args:
        args = []
        pytester.makepyfile(test_broken="def broken(:\n")
    before = _hashes(root)
    _state(root, **changes)
    result = _run(pytester, workers, "--snapshot-update", *args)
    assert result.ret != 0
    if case == "ctrl-c":  # in-process too, pytest ends the session as interrupted
        assert result.ret == pytest.ExitCode.INTERRUPTED, result.stdout.str()
    assert _hashes(root) == before, result.stdout.str()
    result.stdout.fnmatch_lines(["*polgrad: --snapshot-update did not run every item*deleted*"])
    # The same run without the guard loses files: the test can fail for this bug.
    if case in ("x-first-fails", "maxfail-2", "ctrl-c", "collection-error") and mode == "serial":
        _run(pytester, workers, "--snapshot-update", *args, "-p", "no:polgrad-snapshot-guard")
        assert len(_hashes(root)) < len(before)
        _restore(root, files)


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_a_complete_update_keeps_failed_items_and_deletes_obsolete_ones(
    recorded: tuple[pytest.Pytester, dict[str, bytes]], workers: list[str]
) -> None:
    pytester, files = recorded
    root = pytester.path
    before = _hashes(root)
    # loss_5 is removed from the module (obsolete); loss_0, loss_1 and test_plain[0] fail
    # before their snapshot assertion.
    _state(root, n=N - 1, **{"raise": [0, 1], "plain_raise": [0]})
    result = _run(pytester, workers, "--snapshot-update")
    assert result.ret == 1
    after = _hashes(root)
    obsolete = "__snapshots__/test_goldens/loss_5[dapo-golden].polgrad"
    assert obsolete not in after
    assert after == {k: v for k, v in before.items() if k != obsolete}
    assert "1 unused snapshot deleted" in result.stdout.str()
    # Without the guard syrupy also removes test_plain[0] from the .ambr file.
    _restore(root, files)
    _run(pytester, workers, "--snapshot-update", "-p", "no:polgrad-snapshot-guard")
    assert (
        _hashes(root)["__snapshots__/test_goldens.ambr"]
        != before["__snapshots__/test_goldens.ambr"]
    )
