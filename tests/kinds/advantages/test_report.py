"""The advantages kind's report shows the failing batch as the function sees it (new-user
trial): for a GRPO estimator with population std taking ``(rewards, group_ids)`` the
header read "group(s) of sizes [4, 4, 4, 4] (groups, groups, groups, groups)" (the corpus
batch's name as a reward pattern) and "with token_rewards, values, dones", and the
reproduce snippet built about 60 lines of those tensors (1000.0 at padding) that neither
the function nor the reference reads. Now both show only what the function takes and the
reference needs, drawn batches keep their per-group reward patterns, the mask is one line
rebuilt from the response lengths, and the snippet still runs and shows the mismatch.
"""

from __future__ import annotations

import ast
from typing import Any

import pytest
import torch

from pytest_polgrad import ConformanceError, assert_conforms
from pytest_polgrad.api import ConformanceReport
from pytest_polgrad.core.engine import build_context
from pytest_polgrad.core.options import parse_marker
from pytest_polgrad.strategies import RewardBatch
from tests.helpers.snippet_driver import run_snippets
from tests.kinds.advantages.test_kind import gae_ignores_dones, grpo_population_std

HEAD = "\n  reproduce (standalone):\n\n"


def _report(fn: Any, reference: str) -> ConformanceReport:
    with pytest.raises(ConformanceError) as info:
        assert_conforms(fn, reference, kind="advantages", checks=("value",), max_examples=5)
    return info.value.report


def _parts(text: str) -> tuple[str, str, str]:
    """``(inputs line, run-from directory, snippet code)`` of a report."""
    inputs = next(ln for ln in text.splitlines() if ln.startswith("  inputs "))
    code = text.split(HEAD, 1)[1]
    first = code.splitlines()[0]
    prefix = "# pytest-polgrad reproduction: save it as a file and run it with python from "
    assert first.startswith(prefix), first
    return inputs, first[len(prefix) :], code


def _assigned(code: str) -> set[str]:
    tree = ast.parse(code)
    return {
        t.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name)
    }


@pytest.fixture(scope="module")
def grpo(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str, str]:
    """The population-std report's parts, and what its snippet prints run as ``python
    FILE`` (saved outside the directory it names) in a fresh interpreter."""
    text = _report(grpo_population_std, "grpo").results[0].report
    inputs, run_from, code = _parts(text)
    stdout = run_snippets([("grpo", code, run_from)], tmp_path_factory.mktemp("adv"))["grpo"]
    return text, inputs, code, stdout


def test_the_header_names_only_what_the_function_reads(grpo: tuple[str, str, str, str]) -> None:
    _, inputs, _, _ = grpo
    assert "group(s) of sizes [4, 4, 4, 4], response lengths [" in inputs, inputs
    assert "(groups" not in inputs, inputs
    assert "token_rewards" not in inputs and "values" not in inputs, inputs
    assert "dones" not in inputs, inputs
    assert inputs.endswith("(the canonical corpus batch 'groups')"), inputs


def test_the_snippet_builds_only_what_the_function_and_reference_read(
    grpo: tuple[str, str, str, str],
) -> None:
    _, _, code, _ = grpo
    built = _assigned(code)
    assert {"rewards", "group_ids", "response_mask", "inputs"} <= built
    assert not {"token_rewards", "values", "dones"} & built, built
    assert "1000.0" not in code
    assert "Whitening" not in code and "token_level_rewards" not in code  # nothing unused
    assert (
        "inputs = dict(rewards=rewards, group_ids=group_ids, response_mask=response_mask)" in code
    )
    start = code.index("rewards = torch.tensor(")
    assert code[start : code.index("inputs = dict(")].count("\n") == 3  # one line per tensor


def test_the_snippet_runs_and_shows_the_reported_mismatch(
    grpo: tuple[str, str, str, str],
) -> None:
    text, _, _, stdout = grpo
    assert not stdout.startswith("FAILED"), stdout
    printed = {
        ln.split(":", 1)[0]: ast.literal_eval(ln.split(":", 1)[1].strip())
        for ln in stdout.splitlines()
        if ln.startswith(("function:", "reference:"))
    }
    table = text.split("  position ", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    assert table
    for row in table:  # "(7,)   expected   actual"
        position, expected, actual = row.split()
        b = int(position.strip("(),"))
        assert printed["reference"][b] == pytest.approx(float(expected), rel=1e-15)
        assert printed["function"][b] == pytest.approx(float(actual), rel=1e-15)
        assert float(expected) != pytest.approx(float(actual), rel=1e-6)


def test_the_mask_line_rebuilds_the_mask_exactly(grpo: tuple[str, str, str, str]) -> None:
    _, _, code, _ = grpo
    line = next(ln for ln in code.splitlines() if ln.startswith("response_mask = "))
    namespace: dict[str, Any] = {"torch": torch}
    exec(line, namespace)
    lengths = [1, 3, 6, 2, 5, 4, 1, 6, 2, 2, 3, 6, 6, 1, 4, 5]  # the corpus batch 'groups'
    expected = torch.arange(7)[None, :] < torch.tensor(lengths)[:, None]
    assert torch.equal(namespace["response_mask"], expected)


def test_tensors_the_function_takes_stay_in_header_and_snippet() -> None:
    """GAE taking ``values`` and ``dones`` (but not ``token_rewards``, built by the kit from
    ``rewards``): those two stay, ``token_rewards`` goes."""
    text = _report(gae_ignores_dones, "gae").results[0].report
    inputs, _, code = _parts(text)
    assert inputs.split(" (the canonical corpus")[0].endswith(", with values, dones"), inputs
    built = _assigned(code)
    assert {"values", "dones"} <= built and "token_rewards" not in built, built


def _batch(kinds: tuple[str, ...]) -> RewardBatch:
    mask = torch.tensor([[True, False], [True, True], [True, False]])
    return RewardBatch(
        rewards=torch.tensor([1.0, 0.0, 0.5], dtype=torch.float64),
        group_ids=torch.tensor([0, 0, 1]),
        response_mask=mask,
        token_rewards=torch.zeros(3, 2, dtype=torch.float64),
        values=torch.zeros(3, 2, dtype=torch.float64),
        dones=torch.zeros(3, 2, dtype=torch.bool),
        kinds=kinds,
    )


def test_a_drawn_batch_keeps_its_reward_patterns_under_a_label() -> None:
    from pytest_polgrad.kinds.advantages import shown_batch

    ctx = build_context(grpo_population_std, parse_marker(("grpo",), {"kind": "advantages"}))
    drawn = shown_batch(ctx, _batch(("binary", "equal")))
    assert drawn.describe() == (
        "B=3 in 2 group(s) of sizes [2, 1] (rewards per group: binary, equal), "
        "response lengths [1, 2, 1], T=2, float64"
    )
    corpus = shown_batch(ctx, _batch(("groups", "groups")))
    assert corpus.describe() == (
        "B=3 in 2 group(s) of sizes [2, 1], response lengths [1, 2, 1], T=2, float64"
    )
    assert drawn.token_rewards is None and drawn.values is None and drawn.dones is None
