"""docs/frameworks.md "Marking your own framework code": every block runs as written, as
a test module of its own, against the installed frameworks (goldens recorded, every item
passes). A ``test_all_*`` module: it needs all three frameworks, so the default suite
leaves it out."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

PAGE = Path(__file__).parents[2] / "docs" / "frameworks.md"
SECTION = PAGE.read_text().split("## Marking your own framework code", 1)[1].split("\n## ", 1)[0]
BLOCKS = re.findall(
    r"```python\n(# tests/(\w+)\.py in your repository\n.*?)```", SECTION, flags=re.S
)


def test_the_section_has_its_blocks() -> None:
    names = [name for _, name in BLOCKS]
    assert names == ["test_polgrad_verl_adapter", "test_polgrad_verl", "test_polgrad_openrlhf"]


@pytest.mark.parametrize(("code", "name"), BLOCKS, ids=[name for _, name in BLOCKS])
def test_the_block_runs_as_written(pytester: pytest.Pytester, code: str, name: str) -> None:
    pytester.makepyfile(**{name: code})
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--polgrad-max-examples=10", "--snapshot-update", timeout=300
    )
    assert result.ret == 0, result.stdout.str()[-4000:]
    passed = result.parseoutcomes().get("passed", 0)
    assert passed >= 10, result.stdout.str()[-2000:]  # the checks and the golden ran
