"""The reproduce snippet of every non-policy kind runs as printed (new-user trial): a
deliberately wrong function of each kind fails under the marker in a pytester project
(a module in ``tests/`` without ``__init__.py``, one function parametrized); its report's
snippet, saved outside the project and run as ``python FILE`` from the directory it
names, runs and prints the mismatch the report states (the same function output and
reference value at the reported position).

One in-process pytest run serves every kind; each function runs one check with a small
example budget (every wrong function fails on the canonical corpus already). The suite's
snippet interpreter (``tests/helpers/snippet_driver.py``, one ``import torch`` per test process)
runs every snippet, each as ``python FILE`` would: its own directory, ``sys.path``
without the working directory and reset between snippets, the project's modules a
previous snippet imported dropped.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest

from pytest_polgrad.core.engine import build_context, run_check
from pytest_polgrad.core.options import ConformanceOptions
from tests.helpers import inline_run
from tests.helpers.snippet_driver import run_snippets

pytest_plugins = ["pytester"]

PROJECT = '''
import pytest
import torch


def _tok(logprobs, old_logprobs, advantages, response_mask):
    r = torch.exp(torch.where(response_mask, logprobs - old_logprobs, 0.0))
    a = advantages[:, None]
    per = torch.maximum(-a * r, -a * r.clamp(0.8, 1.28))
    return torch.where(response_mask, per, 0.0)


@pytest.mark.polgrad_conforms("dapo", kind="training_step", checks=["micro-batches"])
def step_local_mean(logprobs, old_logprobs, advantages, response_mask):
    """Token-mean of the micro-batch, not of the optimizer step."""
    return _tok(logprobs, old_logprobs, advantages, response_mask).sum() / response_mask.sum()


@pytest.mark.polgrad_conforms("dapo", kind="training_step", checks=["masked-positions"])
def step_leaky(logprobs, old_logprobs, advantages, response_mask, global_tokens):
    tok = _tok(logprobs, old_logprobs, advantages, response_mask)
    return (tok.sum() + 1e-3 * logprobs.sum()) / global_tokens


@pytest.mark.polgrad_conforms("dapo", kind="training_step", checks=["deterministic"])
def step_noisy(logprobs, old_logprobs, advantages, response_mask, global_tokens):
    tok = _tok(logprobs, old_logprobs, advantages, response_mask)
    return tok.sum() / global_tokens * (1 + 1e-3 * torch.rand(()))


def _grpo(rewards, group_ids, unbiased):
    out = torch.zeros_like(rewards)
    for g in group_ids.unique():
        rows = group_ids == g
        r = rewards[rows]
        if r.numel() > 1:
            out[rows] = (r - r.mean()) / (r.std(unbiased=unbiased) + 1e-6)
    return out


@pytest.mark.polgrad_conforms("grpo", kind="advantages", checks=["value"])
def adv_population_std(rewards, group_ids, response_mask):
    return _grpo(rewards, group_ids, unbiased=False)


@pytest.mark.polgrad_conforms("grpo", kind="advantages", checks=["group-isolation"])
def adv_batch_std(rewards, group_ids, response_mask):
    out = torch.zeros_like(rewards)
    for g in group_ids.unique():
        rows = group_ids == g
        out[rows] = rewards[rows] - rewards[rows].mean()
    return out / (rewards.std() + 1e-6)


@pytest.mark.polgrad_conforms("grpo", kind="advantages", checks=["group-order"])
def adv_contiguous(rewards, group_ids, response_mask):
    """Assumes each group's rows are contiguous and of one size."""
    _, counts = torch.unique(group_ids, return_counts=True)
    r = rewards.reshape(-1, int(counts[0]))
    out = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)
    return out.nan_to_num(0.0).reshape(-1)


@pytest.mark.polgrad_conforms("ppo", kind="advantages", checks=["no-gradient-leak"])
def adv_gae_reads_padding(token_rewards, values, response_mask):
    """GAE (gamma 1, lambda 0.95) bootstrapping from the value after the last token."""
    rows, width = token_rewards.shape
    adv = torch.zeros_like(token_rewards)
    last = torch.zeros(rows, dtype=token_rewards.dtype)
    for t in reversed(range(width)):
        after = values[:, t + 1] if t + 1 < width else torch.zeros(rows, dtype=values.dtype)
        last = token_rewards[:, t] + after - values[:, t] + 0.95 * last
        adv[:, t] = last
    return adv * response_mask


@pytest.mark.polgrad_conforms("grpo", kind="kl", checks=["value"])
def kl_sign_flipped(logprobs, ref_logprobs, response_mask):
    lr = torch.where(response_mask, logprobs - ref_logprobs, 0.0)
    return torch.exp(lr) - 1 - lr


@pytest.mark.polgrad_conforms("grpo", kind="kl", checks=["gradient", "padding-values"])
def kl_straight_through_unmasked(logprobs, ref_logprobs, response_mask):
    """k3's value with k2's gradient (not the reference k3's), plus a term reading padding."""
    lr = ref_logprobs - logprobs
    k2 = 0.5 * lr * lr
    k = k2 - k2.detach() + (torch.exp(lr) - 1 - lr).detach()
    return (k * response_mask).sum() / response_mask.sum() + 1e-3 * logprobs.exp().mean()


@pytest.mark.polgrad_conforms("dapo", kind="aggregation", checks=["value"])
def agg_seq_mean(x, response_mask):
    m = response_mask.to(x.dtype)
    return ((x * m).sum(1) / m.sum(1)).mean()


@pytest.mark.polgrad_conforms("dapo", kind="aggregation", checks=["inputs-unchanged"])
def agg_writes_mask(x, response_mask):
    out = (x * response_mask).sum() / response_mask.sum()
    response_mask.zero_()
    return out


@pytest.mark.polgrad_conforms("dapo", kind="aggregation", checks=["padding-columns"])
def agg_padded_width(x, response_mask):
    return (x * response_mask).sum() / response_mask.numel()


def _value_per_token(values, old_values, returns):
    clipped = old_values + (values - old_values).clamp(-0.2, 0.2)
    return torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)


@pytest.mark.polgrad_conforms("ppo", kind="value_loss", checks=["value"])
def value_without_half(values, old_values, returns, response_mask):
    per = _value_per_token(values, old_values, returns)
    return (per * response_mask).sum() / response_mask.sum()


@pytest.mark.polgrad_conforms("ppo", kind="value_loss", checks=["gradient"])
def value_detached_clip(values, old_values, returns, response_mask):
    clipped = (old_values + (values - old_values).clamp(-0.2, 0.2)).detach()
    per = 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    return (per * response_mask).sum() / response_mask.sum()


def _entropy(logits):
    return -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)


@pytest.mark.parametrize("scale", [2.0])
@pytest.mark.polgrad_conforms("entropy", kind="entropy", checks=["value"])
def entropy_scaled(logits, response_mask, scale):
    return scale * torch.where(response_mask, _entropy(logits), 0.0).sum() / response_mask.sum()


@pytest.mark.polgrad_conforms("entropy", kind="entropy", checks=["gradient", "padding-values"])
def entropy_detached_leaky(logits, response_mask):
    p = torch.softmax(logits, -1).detach()
    h = -(p * torch.log_softmax(logits, -1)).sum(-1)
    return (h * response_mask).sum() / response_mask.sum() + 1e-6 * _entropy(logits).sum()


@pytest.mark.polgrad_conforms("grpo", kind="aggregation", layout="packed", checks=["value"])
def agg_packed_across(x, response_mask, cu_seqlens):
    """Each sequence's span runs one token into the next one."""
    b = cu_seqlens.tolist()
    means = [x[s:e + 1][response_mask[s:e + 1]].mean() for s, e in zip(b[:-1], b[1:])]
    return torch.stack(means).mean()


@pytest.mark.polgrad_conforms("next-token", kind="logprobs", checks=["value"])
def logprobs_no_shift(logits, input_ids, response_mask, temperature):
    lp = torch.log_softmax(logits.double() / temperature, dim=-1)
    return torch.where(response_mask, lp.gather(-1, input_ids[..., None])[..., 0], 0.0)


@pytest.mark.polgrad_conforms(
    "next-token", kind="logprobs", layout="packed", checks=["packed-boundary"]
)
def logprobs_packed_roll(logits, input_ids, cu_seqlens, temperature):
    """torch.roll over the whole stream (verl #6475)."""
    lp = torch.log_softmax(logits.double() / temperature, dim=-1)
    picked = lp.gather(-1, torch.roll(input_ids, -1, dims=0)[:, None])[:, 0]
    return torch.roll(picked, 1, dims=0)
'''

VALUE = ("function", "reference")
OWN = ("function", "function on the original inputs")
GRADIENT = ("function gradient", "reference gradient")
PADDING = "largest |gradient| at padding (must be 0)"
# item (function as collected, check) -> how its snippet prints what the report states:
# (label of the function's quantity, label of the quantity it was compared with), or a
# line the snippet prints (with what the report says)
CASES: dict[tuple[str, str], tuple[str, str]] = {
    ("step_local_mean", "micro-batches"): (
        "accumulated gradient",
        "full-batch reference gradient",
    ),
    ("step_leaky", "masked-positions"): (PADDING, ""),
    ("step_noisy", "deterministic"): ("same result twice: False", "different results"),
    ("adv_population_std", "value"): VALUE,
    ("adv_batch_std", "group-isolation"): ("isolation", ""),
    ("adv_contiguous", "group-order"): (
        "function on the reordered batch",
        "its result on the original, reordered",
    ),
    ("adv_gae_reads_padding", "no-gradient-leak"): (
        "largest |gradient| at padding of values (must be 0)",
        "",
    ),
    ("kl_sign_flipped", "value"): VALUE,
    ("kl_straight_through_unmasked", "gradient"): GRADIENT,
    ("kl_straight_through_unmasked", "padding-values"): OWN,
    ("agg_seq_mean", "value"): VALUE,
    ("agg_writes_mask", "inputs-unchanged"): (
        "inputs modified in place: ['response_mask']",
        "modified its input response_mask in place",
    ),
    ("agg_padded_width", "padding-columns"): OWN,
    ("value_without_half", "value"): VALUE,
    ("value_detached_clip", "gradient"): GRADIENT,
    ("entropy_scaled[scale=2.0]", "value"): VALUE,
    ("entropy_detached_leaky", "gradient"): GRADIENT,
    ("entropy_detached_leaky", "padding-values"): OWN,
    ("agg_packed_across", "value"): VALUE,
    ("logprobs_no_shift", "value"): VALUE,
    ("logprobs_packed_roll", "packed-boundary"): (
        "sequence 0: its outputs move by",
        "reads across the boundary of sequence 0",
    ),
}

HEAD = "  reproduce (standalone):\n"

RUN_FROM = re.compile(
    r"# pytest-polgrad reproduction: save it as a file and run it with python from (.*)"
)
NUMBER = r"-?(?:\d+(?:\.\d*)?(?:e[-+]?\d+)?|inf|nan)"
ENTRY = re.compile(rf"^  (\([\d, ]*\))\s+({NUMBER})\s+({NUMBER})$", re.M)
SCALAR = re.compile(rf"^  \S.*?\s+({NUMBER})\s+({NUMBER})$", re.M)


def _report(text: str, name: str, check: str) -> str:
    """The failure report of ``check`` of ``name`` in pytest's output."""
    start = re.search(rf"{re.escape(name)} does not conform to '[^']+': check '{check}'", text)
    assert start, (name, check)
    end = text.find("\n  replay ", start.start())
    return text[start.start() : end]


def _snippet(report: str) -> str:
    body = report.split(HEAD, 1)[1]
    return body


def _line(stdout: str, label: str) -> str:
    """What the snippet printed after ``label:``."""
    found = [x for x in stdout.splitlines() if x.startswith(label + ":")]
    assert found, (label, stdout)
    return found[0][len(label) + 1 :].strip()


def _printed(stdout: str, label: str) -> Any:
    return ast.literal_eval(_line(stdout, label))


@pytest.fixture
def project(pytester: pytest.Pytester) -> tuple[str, Path]:
    tests = pytester.mkdir("tests")
    (tests / "test_kinds.py").write_text(PROJECT)
    result = inline_run.run(
        pytester, "-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:xdist",
        "--polgrad-max-examples=4",
    )  # fmt: skip
    result.assert_outcomes(failed=len(CASES))
    return result.stdout.str(), pytester.path


def test_every_kinds_snippet_runs_as_printed_and_shows_the_mismatch(
    project: tuple[str, Path], tmp_path: Path
) -> None:
    text, root = project
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    jobs, reports = [], {}
    for name, check in CASES:
        report = _report(text, name, check)
        code = _snippet(report)
        match = RUN_FROM.fullmatch(code.lstrip("\n").splitlines()[0])  # its first line
        assert match, code
        assert Path(match.group(1)) == root
        function = name.split("[")[0]
        assert "sys.path[:0] = ['tests', '.']" in code, code
        assert f"from test_kinds import {function}" in code, code
        jobs.append((f"{name} {check}", code, str(root)))
        reports[f"{name} {check}"] = (report, code, CASES[name, check])
    results = run_snippets(jobs, elsewhere)  # saved there, each run from the project root
    assert sorted(results) == sorted(reports)
    for case, stdout in results.items():
        report, code, labels = reports[case]
        assert not stdout.startswith("FAILED"), f"{case}:\n{stdout}\n{code}"
        _assert_mismatch(case, labels, report, stdout)
    parametrized = _snippet(_report(text, "entropy_scaled[scale=2.0]", "value"))
    assert "entropy_scaled = functools.partial(entropy_scaled, scale=2.0)" in parametrized


def test_an_unimportable_function_gets_the_paste_instruction() -> None:
    """The same import path as the policy-loss snippets: a closure cannot be imported."""

    def closure(x: Any, response_mask: Any) -> Any:
        return (x * response_mask).sum() / response_mask.numel()

    options = ConformanceOptions("dapo", kind="aggregation", checks=("value",))
    result = run_check(build_context(closure, options), "value", max_examples=2, base_seed=0)
    assert not result.passed
    code = _snippet(result.report)
    assert code.lstrip().startswith(
        "# pytest-polgrad reproduction: paste the definition of closure where marked"
    ), code
    assert "# paste its definition (and what it uses) here, named closure." in code
    assert "from tests." not in code and "from __main__" not in code
    compile(code, "snippet", "exec")


def _at(value: Any, position: tuple[int, ...]) -> Any:
    for i in position:
        value = value[i]
    return value


def _assert_mismatch(case: str, labels: tuple[str, str], report: str, stdout: str) -> None:
    """What the report states is what the snippet prints."""
    label, against = labels
    entries = [(ast.literal_eval(p), float(e), float(a)) for p, e, a in ENTRY.findall(report)]
    if label.startswith("largest |gradient| at padding"):  # the report's entries: (p, 0, g)
        largest = float(_line(stdout, label))
        assert entries and largest > 0, (case, stdout)
        assert largest >= max(abs(a) for _, _, a in entries), (case, stdout)
        return
    if label == "isolation":  # entries: (p, before, after) of rows of other groups
        moved = ast.literal_eval(_line(stdout, "advantages of other groups that changed "
                                               "(must be none)"))  # fmt: skip
        shown = {p: (b, a) for p, b, a in moved}
        for p, before, after in entries:
            assert shown[p] == pytest.approx((before, after), rel=1e-12), (case, stdout)
        return
    if not label.endswith(")") and ":" in label:  # a line the snippet prints
        assert label in stdout, (case, stdout)
        assert against in report, (case, report)
        return
    difference = float(_line(stdout, "largest absolute difference").split()[0])
    assert difference > 1e-9, (case, stdout)
    if entries:  # tensors: the snippet's values at the reported positions
        for position, expected, actual in entries:
            pos = position if isinstance(position, tuple) else (position,)
            got = (_at(_printed(stdout, label), pos), _at(_printed(stdout, against), pos))
            assert got == pytest.approx((actual, expected), rel=1e-9, abs=1e-12), (case, pos)
        return
    expected, actual = SCALAR.findall(report.split("quantity", 1)[1])[0]
    assert _printed(stdout, label) == pytest.approx(float(actual), rel=1e-9), (case, stdout)
    assert _printed(stdout, against) == pytest.approx(float(expected), rel=1e-9), stdout
