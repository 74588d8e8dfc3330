"""Golden files in pytest sessions (issue 28 items 1, 6, 7 and the golden bullets): two
ids never share a file and a collision left is an error, never an overwrite; a golden
that is a symbolic link or a directory is refused without reading or printing it; a
function name past 240 characters records its golden; ``polgrad_snapshot_dir`` outside
the rootdir is a usage error."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_polgrad.core.golden_format import golden_stem, parse
from tests.helpers import inline_run

pytest_plugins = ["pytester"]

LOSS = """
import pytest
import torch


def dapo(logprobs, old_logprobs, advantages, response_mask, scale=1.0):
    ratio = torch.exp(torch.where(response_mask, logprobs - old_logprobs, 0.0))
    a = advantages[:, None]
    per = torch.maximum(-a * ratio, -a * ratio.clamp(0.8, 1.28))
    return torch.where(response_mask, per, 0.0).sum() / response_mask.sum() * scale
"""

TWO_IDS = (
    LOSS
    + """

@pytest.mark.parametrize("scale", [pytest.param(1.0, id="a/b"), pytest.param(2.0, id="ab")])
@pytest.mark.polgrad_conforms("dapo", checks="golden")
def g(logprobs, old_logprobs, advantages, response_mask, scale):
    return dapo(logprobs, old_logprobs, advantages, response_mask, scale)
"""
)


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return inline_run.run(pytester, "-p", "no:cacheprovider", *args, cold=True)


def _loss(path: Path) -> float:
    return float(parse(path.read_text(), source=str(path)).entries["ragged/loss"].values[0])


def test_ids_differing_by_a_slash_record_two_goldens(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_two=TWO_IDS)
    result = _run(pytester, "--snapshot-update")
    assert result.ret == 0, result.stdout.str()
    folder = pytester.path / "__snapshots__" / "test_two"
    files = sorted(p.name for p in folder.iterdir())
    assert files == ["g[a%2Fb-dapo-golden].polgrad", "g[ab-dapo-golden].polgrad"], files
    assert _loss(folder / files[1]) == pytest.approx(2 * _loss(folder / files[0]), rel=1e-9)
    again = _run(pytester)
    assert again.ret == 0, again.stdout.str()
    assert again.parseoutcomes()["passed"] == 2
    assert "unused" not in again.stdout.str()


def test_a_collision_left_is_an_error_never_an_overwrite(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the file name made non-injective on purpose (as a hash collision would be),
    both items fail naming each other and neither writes."""
    from pytest_polgrad.core import golden_format

    monkeypatch.setattr(golden_format, "golden_stem", lambda name: name.replace("/", ""))
    pytester.makepyfile(test_two=TWO_IDS)
    result = _run(pytester, "--snapshot-update")
    assert result.ret == 1
    out = result.stdout.str()
    # Count the failure sections' own lines: the short summary repeats them only when the
    # terminal is wide enough, which differs between machines.
    named = [
        line
        for line in out.splitlines()
        if line.startswith("golden: ") and "its golden file would be shared with" in line
    ]
    assert len(named) == 2, out
    assert not (pytester.path / "__snapshots__" / "test_two").exists()


LONG = "loss_" + "x" * 300


def test_a_long_function_name_records_its_golden(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_long=LOSS
        + f"""

@pytest.mark.polgrad_conforms("dapo", checks="golden")
def {LONG}(logprobs, old_logprobs, advantages, response_mask):
    return dapo(logprobs, old_logprobs, advantages, response_mask)
"""
    )
    result = _run(pytester, "--snapshot-update")
    assert result.ret == 0, result.stdout.str()
    (stored,) = (pytester.path / "__snapshots__" / "test_long").iterdir()
    assert stored.name == golden_stem(f"{LONG}[dapo-golden]") + ".polgrad"
    again = _run(pytester)
    assert again.ret == 0, again.stdout.str()
    assert "unused" not in again.stdout.str()


ONE = (
    LOSS
    + """

@pytest.mark.polgrad_conforms("dapo", checks="golden")
def one(logprobs, old_logprobs, advantages, response_mask):
    return dapo(logprobs, old_logprobs, advantages, response_mask)
"""
)
SECRET = "top-secret-line-of-the-target"


@pytest.mark.parametrize("update", [False, True], ids=["run", "update"])
def test_a_symlinked_golden_is_refused_and_its_target_never_shown(
    pytester: pytest.Pytester, update: bool
) -> None:
    pytester.makepyfile(test_one=ONE)
    folder = pytester.path / "__snapshots__" / "test_one"
    folder.mkdir(parents=True)
    target = pytester.path / "secret.txt"
    target.write_text(f"format = 1\n{SECRET}\n")
    os.symlink(target, folder / "one[dapo-golden].polgrad")
    result = _run(pytester, *(["--snapshot-update"] if update else []))
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == 1
    assert "is a symbolic link; pytest-polgrad neither follows nor replaces one" in out
    assert SECRET not in out
    assert target.read_text() == f"format = 1\n{SECRET}\n"
    assert (folder / "one[dapo-golden].polgrad").is_symlink()


@pytest.mark.parametrize("update", [False, True], ids=["run", "update"])
def test_a_directory_at_the_golden_path_is_named(pytester: pytest.Pytester, update: bool) -> None:
    pytester.makepyfile(test_one=ONE)
    (pytester.path / "__snapshots__" / "test_one" / "one[dapo-golden].polgrad").mkdir(parents=True)
    result = _run(pytester, *(["--snapshot-update"] if update else []))
    out = result.stdout.str()
    assert result.ret == 1
    assert "is a directory, where this test's golden snapshot file belongs" in out
    assert "not recorded yet" not in out


@pytest.mark.parametrize("configured", ["../outside", "/tmp/polgrad-goldens", "a/../../b"])
def test_a_snapshot_dir_outside_the_rootdir_is_a_usage_error(
    pytester: pytest.Pytester, configured: str
) -> None:
    pytester.makeini(f"[pytest]\npolgrad_snapshot_dir = {configured}\n")
    pytester.makepyfile(test_one=ONE)
    result = _run(pytester, "--snapshot-update")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "is outside the rootdir" in result.stderr.str()
    assert not (pytester.path.parent / "outside").exists()


def test_a_snapshot_dir_inside_the_rootdir_is_used(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\npolgrad_snapshot_dir = goldens/./here\n")
    pytester.makepyfile(test_one=ONE)
    result = _run(pytester, "--snapshot-update")
    assert result.ret == 0, result.stdout.str()
    assert (pytester.path / "goldens" / "here" / "test_one" / "one[dapo-golden].polgrad").is_file()


GOLDEN_SAFETY_BAD_INPUTS = 1 + 1 + 1 + 2 + 2 + 3
"""Distinct bad inputs above: two ids one file, a forced collision, a long name, a
symlink (run, update), a directory (run, update), three outside snapshot dirs."""
