"""Reproduction snippets too long to print are saved under pytest's basetemp and the report
names the file (a realistic-size failure printed some 800 lines per failing check)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_polgrad.core import saved_snippets
from tests.helpers import inline_run

pytest_plugins = ["pytester"]

LONG = "# pytest-polgrad reproduction: save it as a file and run it with python from /x\n" + (
    "x = 1\n" * saved_snippets.INLINE_LINES
)


def test_without_a_directory_every_snippet_is_printed_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(saved_snippets, "_directory", None)
    lines = saved_snippets.reproduce_lines(LONG, "f", "value")
    assert lines == ["  reproduce (standalone):", "", *LONG.splitlines()]


def test_a_long_snippet_is_saved_and_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(saved_snippets, "_directory", lambda: tmp_path)
    short = saved_snippets.reproduce_lines("x = 1\n", "f", "value")
    assert short == ["  reproduce (standalone):", "", "x = 1"]
    lines = saved_snippets.reproduce_lines(LONG, "loss[grpo]", "value")
    (saved,) = tmp_path.iterdir()
    assert saved.read_text() == LONG and saved.name.startswith("loss_grpo_-value-")
    assert lines[0].endswith(f"{len(LONG.splitlines())} lines, too long to print, saved as")
    assert lines[1].strip() == str(saved)
    assert lines[2].strip() == "# pytest-polgrad reproduction: run it with python from /x"
    assert saved_snippets.reproduce_lines(LONG, "loss[grpo]", "value") == lines  # same file


def test_a_marked_function_saves_its_long_snippet_under_the_basetemp(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The saved file is the snippet the report would print; the nested session puts the
    outer one's directory back when it ends."""
    pytester.makepyfile(
        test_eps="""
import pytest
import torch


@pytest.mark.polgrad_conforms("grpo", checks=["value"])
def eps_03(logprobs, old_logprobs, advantages, response_mask):
    ratio = torch.exp(torch.where(response_mask, logprobs - old_logprobs, 0.0))
    a = advantages[:, None]
    per = torch.maximum(-a * ratio, -a * ratio.clamp(0.7, 1.3))
    per = torch.where(response_mask, per, 0.0)
    return (per.sum(dim=1) / response_mask.sum(dim=1)).mean()
"""
    )
    outer = saved_snippets.current()
    args = ("-p", "no:cacheprovider", "-p", "no:randomly", "--polgrad-max-examples=5")
    printed = inline_run.run(pytester, *args).stdout.str()
    assert "too long to print" not in printed
    start = printed.index("  reproduce (standalone):") + len("  reproduce (standalone):\n\n")
    snippet = printed[start : printed.index("\n  replay ")]
    monkeypatch.setattr(saved_snippets, "INLINE_LINES", 5)
    report = inline_run.run(pytester, *args, "--basetemp", str(pytester.path / "base"))
    report.assert_outcomes(failed=1)
    text = report.stdout.str()
    assert "lines, too long to print, saved as" in text
    (saved,) = (pytester.path / "base" / "polgrad").iterdir()
    assert f"    {saved}" in text.splitlines()
    assert saved.read_text().strip() == snippet.strip()
    assert saved_snippets.current() is outer


def test_a_session_that_stops_in_configure_keeps_the_outer_directory(
    pytester: pytest.Pytester,
) -> None:
    """A bad ini value stops the plugin's configure before it saved the outer directory;
    its unconfigure must not then forget that directory (it did: the outer suite's long
    snippets were printed whole after such a nested run)."""
    pytester.makeini("[pytest]\npolgrad_profile = bogus\n")
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    outer = saved_snippets.current()
    assert outer is not None  # this suite runs under the plugin
    result = inline_run.run(pytester, "-p", "no:cacheprovider")
    assert result.ret != 0
    assert saved_snippets.current() is outer
