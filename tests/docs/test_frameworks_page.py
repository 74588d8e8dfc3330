"""docs/frameworks.md: the examples that need no framework run as written in the default
suite (the others, in the frameworks tier: tests/frameworks/test_all_docs_marking.py)."""

from __future__ import annotations

import pytest

from tests.docs.frameworks_page import BLOCKS, MAIN, TIER, needs_frameworks
from tests.helpers import inline_run

pytest_plugins = ["pytester"]


def test_every_block_is_run_by_one_tier() -> None:
    """Each block is a framework block (tier) or not (here), and both kinds exist: one
    helper per framework in the tier, the tables here."""
    assert [n for _, n in TIER] == [
        "test_polgrad_verl_adapter",
        "test_polgrad_verl",
        "test_polgrad_openrlhf",
        "test_polgrad_verl_entry_points",
        "test_polgrad_trl_entry_points",
        "test_polgrad_openrlhf_entry_points",
    ]
    assert [n for _, n in MAIN] == ["test_polgrad_deviations"]
    assert len(BLOCKS) == len(TIER) + len(MAIN)
    assert needs_frameworks("from pytest_polgrad.frameworks import verl\n")
    assert needs_frameworks("from verl.trainer.ppo import core_algos\n")
    assert not needs_frameworks("from pytest_polgrad.frameworks import DEVIATIONS, PINS\n")


@pytest.mark.parametrize(("code", "name"), MAIN, ids=[n for _, n in MAIN])
def test_the_block_runs_as_written(pytester: pytest.Pytester, code: str, name: str) -> None:
    pytester.makepyfile(**{name: code})
    result = inline_run.run(pytester, "-p", "no:cacheprovider", "-q")
    outcomes = result.parseoutcomes()
    assert result.ret == 0 and outcomes.get("passed", 0) >= 1, result.stdout.str()[-3000:]
