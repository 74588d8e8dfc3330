"""A conformance suite with ``distributed=`` markers under pytest-xdist (docs/conformance.md,
"Across workers and machines"): ``--dist loadfile`` keeps a module's items, and so its
pool of rank processes, on one worker; ``--dist loadgroup`` does not group under pytest
9.2 (pytest-xdist#1386), so it is not what the docs recommend."""

from __future__ import annotations

import re

import pytest

STEPS = """
import pytest
from tests.kinds.training_step import distributed_steps as S

mark = dict(kind="training_step", distributed="ddp", checks=("data-parallel", "deterministic"))
good = pytest.mark.polgrad_conforms("dapo", **mark)(S.token_mean_global)
bad = pytest.mark.polgrad_conforms("dapo", **mark)(S.bug_rank_tokens)
"""

GROUPED = """
import os
import pytest

@pytest.mark.xdist_group("ranks")
@pytest.mark.parametrize("i", range(4))
def test_grouped(i):
    print("WORKER", os.environ.get("PYTEST_XDIST_WORKER"))
"""


def _workers(out: str, name: str) -> set[str]:
    return set(re.findall(rf"\[(gw\d+)\][^\n]*{name}", out))


def test_loadfile_keeps_a_modules_distributed_items_on_one_worker(pytester) -> None:  # type: ignore[no-untyped-def]
    pytester.makepyfile(test_steps=STEPS)
    pytester.makepyfile(test_other="def test_free():\n    pass\n")
    result = pytester.runpytest_subprocess(
        "-n", "2", "--dist", "loadfile", "-v", "-p", "no:cacheprovider", "-p", "no:randomly",
        "--polgrad-max-examples=2", f"--rootdir={pytester.path}",
    )  # fmt: skip
    out = result.stdout.str()
    assert len(_workers(out, "test_steps.py::")) == 1, out
    assert "PASSED test_steps.py::good[dapo-data-parallel]" in out, out
    assert "FAILED test_steps.py::bad[dapo-data-parallel]" in out, out
    result.assert_outcomes(passed=4, failed=1)


def test_loadgroup_does_not_group_under_this_pytest(pytester) -> None:  # type: ignore[no-untyped-def]
    """pytest-xdist#1386: the xdist_group mark is ignored under pytest 9.2; when this fails,
    xdist groups again and the docs may recommend loadgroup."""
    pytester.makepyfile(test_grouped=GROUPED)
    result = pytester.runpytest_subprocess(
        "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider", "-p", "no:randomly"
    )  # fmt: skip
    result.assert_outcomes(passed=4)
    if len(_workers(result.stdout.str(), "test_grouped")) == 1:
        pytest.fail("--dist loadgroup groups again: update docs/conformance.md")


pytest_plugins = ["pytester"]
