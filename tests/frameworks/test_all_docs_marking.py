"""docs/frameworks.md "Marking your own framework code": every block that needs a framework
runs as written, as a test module of its own, against the installed frameworks (goldens
recorded, every item passes; the blocks are listed in tests/docs/frameworks_page.py, which
also runs the others in the default suite). A ``test_all_*`` module: it needs all three
frameworks, so the default suite leaves it out."""

from __future__ import annotations

import pytest

from tests.docs.frameworks_page import TIER

pytest_plugins = ["pytester"]


@pytest.mark.parametrize(("code", "name"), TIER, ids=[name for _, name in TIER])
def test_the_block_runs_as_written(pytester: pytest.Pytester, code: str, name: str) -> None:
    pytester.makepyfile(**{name: code})
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--polgrad-max-examples=10", "--snapshot-update", timeout=600
    )
    outcomes = result.parseoutcomes()
    assert result.ret == 0, result.stdout.str()[-4000:]
    assert not outcomes.get("failed"), result.stdout.str()[-3000:]  # xfailed: declared
    assert outcomes.get("passed", 0) >= 7, result.stdout.str()[-2000:]  # checks and goldens
