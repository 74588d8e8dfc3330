"""Issue 28 item 4: every command line the kit prints is shell-quoted (``shlex.quote``). A
parametrize id written to break out of the replay line's quotes stays one word: the line,
run by bash, runs pytest on that one node and nothing else."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_polgrad.core import saved_snippets
from pytest_polgrad.core.snippets import Importable, how_to_run
from tests.helpers import inline_run

HOSTILE = "x'; touch PWNED; echo '"

PROJECT = f"""
import pytest
import torch


@pytest.mark.parametrize("low", [pytest.param(0.7, id={HOSTILE!r})])
@pytest.mark.polgrad_conforms("dapo", checks=["value"])
def wrong(logprobs, old_logprobs, advantages, response_mask, low):
    ratio = torch.exp(torch.where(response_mask, logprobs - old_logprobs, 0.0))
    a = advantages[:, None]
    per = torch.maximum(-a * ratio, -a * ratio.clamp(low, 1.3))
    per = torch.where(response_mask, per, 0.0)
    return per.sum() / response_mask.sum()
"""


def test_a_hostile_id_stays_one_word_of_the_replay_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_hostile=PROJECT)
    args = ("-p", "no:cacheprovider", "-p", "no:randomly", "--polgrad-max-examples=5")
    result = inline_run.run(pytester, *args, "-k", "value", cold=True)
    result.assert_outcomes(failed=1)
    # on a wide terminal pytest's short summary repeats the failure message: the same line twice
    lines = set(re.findall(r"replay     (pytest .*)$", result.stdout.str(), re.MULTILINE))
    assert len(lines) == 1, lines
    (line,) = lines
    words = shlex.split(line)
    node = f"test_hostile.py::wrong[{HOSTILE}-dapo-value]"
    assert words[:2] == ["pytest", node], line
    assert words[2:] == ["-p", "no:randomly", "--polgrad-seed=0", "--polgrad-max-examples=5"]
    # run as printed, by bash, with this interpreter's pytest first on PATH
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    ran = subprocess.run(
        ["bash", "-c", line + " -p no:cacheprovider"],
        cwd=pytester.path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert not (pytester.path / "PWNED").exists(), ran.stdout
    assert ran.returncode == 1, ran.stdout + ran.stderr  # pytest: the one item fails
    assert "1 failed in" in ran.stdout and "does not conform to 'dapo'" in ran.stdout


def test_shell_word_quotes_every_word_and_round_trips() -> None:
    for text in ("t.py::f[grpo-value]", "t.py::f", HOSTILE, "a b", "", "$(id)", "`id`"):
        quoted = saved_snippets.shell_word(text)
        assert quoted.startswith("'") and shlex.split(quoted) == [text]


def test_the_snippet_header_quotes_its_directory() -> None:
    where = Importable("f", "m", None, run_from=f"/tmp/{HOSTILE}")
    header = how_to_run(where)
    directory = header.removeprefix("save it as a file and run it with python from ")
    assert shlex.split(directory) == [f"/tmp/{HOSTILE}"]
