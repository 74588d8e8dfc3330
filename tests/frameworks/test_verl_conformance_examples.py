"""docs/conformance.md's examples that mark verl 0.9.1's own functions (aggregation, KL,
advantages, value loss, entropy) run as written, as one test module, against the
installed verl: every item passes (goldens recorded), with the kit's bool masks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

PAGE = Path(__file__).parents[2] / "docs" / "conformance.md"
VERL_BLOCKS = [
    code
    for code in re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
    if re.search(r"^from verl\b", code, flags=re.M)
]


def test_the_verl_examples_run_as_written(pytester: pytest.Pytester) -> None:
    assert len(VERL_BLOCKS) >= 5
    pytester.makepyfile(test_conformance_examples="\n\n".join(VERL_BLOCKS))
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--polgrad-max-examples=5", "--snapshot-update", timeout=600
    )
    outcomes = result.parseoutcomes()
    assert result.ret == 0, result.stdout.str()[-4000:]
    assert not outcomes.get("failed") and not outcomes.get("error"), result.stdout.str()[-3000:]
    assert outcomes.get("passed", 0) >= 5 * 6, result.stdout.str()[-2000:]
