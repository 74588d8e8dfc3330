"""The reproduce snippet of every non-policy kind runs as printed (new-user trial): a
deliberately wrong function of each kind fails under the marker in a pytester project
(a module in ``tests/`` without ``__init__.py``, one function parametrized); its report's
snippet, saved outside the project and run by a fresh ``python`` from the directory it
names, runs and prints the mismatch the report states (the same function output and
reference value at the reported position).

One in-process pytest run serves every kind; each function runs one check with a small
example budget (every wrong function fails on the canonical corpus already). One fresh
interpreter runs every snippet (one ``import torch``), each as ``python FILE`` would: its
own directory, ``sys.path`` without the working directory and reset between snippets, the
project's modules a previous snippet imported dropped.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch  # noqa: F401  (imported before the in-process run, which drops what it imports)

from pytest_polgrad.engine import build_context, run_check
from pytest_polgrad.options import ConformanceOptions

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


@pytest.mark.polgrad_conforms("grpo", kind="advantages", checks=["value"])
def adv_population_std(rewards, group_ids, response_mask):
    out = torch.zeros_like(rewards)
    for g in group_ids.unique():
        rows = group_ids == g
        r = rewards[rows]
        if r.numel() > 1:
            out[rows] = (r - r.mean()) / (r.std(unbiased=False) + 1e-6)
    return out


@pytest.mark.polgrad_conforms("grpo", kind="kl", checks=["value"])
def kl_sign_flipped(logprobs, ref_logprobs, response_mask):
    lr = torch.where(response_mask, logprobs - ref_logprobs, 0.0)
    return torch.exp(lr) - 1 - lr


@pytest.mark.polgrad_conforms("dapo", kind="aggregation", checks=["value"])
def agg_seq_mean(x, response_mask):
    m = response_mask.to(x.dtype)
    return ((x * m).sum(1) / m.sum(1)).mean()


@pytest.mark.polgrad_conforms("dapo", kind="aggregation", checks=["inputs-unchanged"])
def agg_writes_mask(x, response_mask):
    out = (x * response_mask).sum() / response_mask.sum()
    response_mask.zero_()
    return out


@pytest.mark.polgrad_conforms("ppo", kind="value_loss", checks=["value"])
def value_without_half(values, old_values, returns, response_mask):
    clipped = old_values + (values - old_values).clamp(-0.2, 0.2)
    per = torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    return (per * response_mask).sum() / response_mask.sum()


@pytest.mark.parametrize("scale", [2.0])
@pytest.mark.polgrad_conforms("entropy", kind="entropy", checks=["value"])
def entropy_scaled(logits, response_mask, scale):
    h = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    return scale * torch.where(response_mask, h, 0.0).sum() / response_mask.sum()
'''

# function (as collected) -> the labels its snippet prints the compared quantities under
CASES: dict[str, tuple[str, str]] = {
    "step_local_mean": ("accumulated gradient", "full-batch reference gradient"),
    "adv_population_std": ("function", "reference"),
    "kl_sign_flipped": ("function", "reference"),
    "agg_seq_mean": ("function", "reference"),
    "agg_writes_mask": ("", ""),
    "value_without_half": ("function", "reference"),
    "entropy_scaled[scale=2.0]": ("function", "reference"),
}

HEAD = "  reproduce (standalone):\n"

DRIVER = """
import contextlib, io, json, os, runpy, sys, traceback
base = [p for p in sys.path if p not in ("", ".", os.getcwd())]  # as `python file` has it
out = {}
for case, path, cwd in json.loads(sys.argv[1]):
    sys.path[:] = base  # what one snippet put on sys.path does not help the next
    for name in [n for n, m in sys.modules.items()  # nor what it imported from the project
                 if (getattr(m, "__file__", None) or "").startswith(cwd)]:
        del sys.modules[name]
    os.chdir(cwd)
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            runpy.run_path(path, run_name="__main__")
    except BaseException:
        out[case] = "FAILED\\n" + traceback.format_exc()
    else:
        out[case] = buffer.getvalue()
print(json.dumps(out))
"""
RUN_FROM = re.compile(
    r"# pytest-polgrad reproduction: save it as a file and run it with python from (.*)"
)
NUMBER = r"-?(?:\d+(?:\.\d*)?(?:e[-+]?\d+)?|inf|nan)"
ENTRY = re.compile(rf"^  (\([\d, ]*\))\s+({NUMBER})\s+({NUMBER})$", re.M)
SCALAR = re.compile(rf"^  \S.*?\s+({NUMBER})\s+({NUMBER})$", re.M)


def _report(text: str, name: str) -> str:
    """The failure report of ``name`` in pytest's output."""
    start = text.index(f"{name} does not conform to")
    end = text.find("\n  replay ", start)
    return text[start:end]


def _snippet(report: str) -> str:
    body = report.split(HEAD, 1)[1]
    return "\n".join(line[4:] for line in body.splitlines())


def _printed(stdout: str, label: str) -> Any:
    line = next(x for x in stdout.splitlines() if x.startswith(label + ":"))
    return ast.literal_eval(line[len(label) + 1 :].strip())


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_ADDOPTS"):
        monkeypatch.delenv(name, raising=False)
    tests = pytester.mkdir("tests")
    (tests / "test_kinds.py").write_text(PROJECT)
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:xdist",
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
    for name in CASES:
        report = _report(text, name)
        code = _snippet(report)
        match = RUN_FROM.search(code)
        assert match, code
        assert Path(match.group(1)) == root
        assert "sys.path[:0] = ['tests', '.']" in code, code
        assert f"from test_kinds import {name.split('[')[0]}" in code, code
        path = elsewhere / f"{name.split('[')[0]}.py"
        path.write_text(code)
        jobs.append((name, str(path), str(root)))
        reports[name] = (report, code)
    out = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(jobs)],
        capture_output=True,
        text=True,
        cwd=elsewhere,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    for name, stdout in json.loads(out.stdout).items():
        report, code = reports[name]
        assert not stdout.startswith("FAILED"), f"{name}:\n{stdout}\n{code}"
        _assert_mismatch(name, CASES[name], report, stdout)
    parametrized = _snippet(_report(text, "entropy_scaled[scale=2.0]"))
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


def _assert_mismatch(name: str, labels: tuple[str, str], report: str, stdout: str) -> None:
    """What the report states is what the snippet prints."""
    label, against = labels
    if not label:  # inputs-unchanged
        assert "modified its input response_mask in place" in report, report
        assert "inputs modified in place: ['response_mask']" in stdout, stdout
        return
    largest = next(x for x in stdout.splitlines() if x.startswith("largest difference:"))
    assert float(largest.split()[2]) > 1e-6, (name, stdout)
    entries = ENTRY.findall(report)
    if entries:  # a tensor: the snippet's values at the reported position
        position, expected, actual = entries[0]
        pos = ast.literal_eval(position)
        pos = pos if isinstance(pos, tuple) else (pos,)
        for which, value in ((label, actual), (against, expected)):
            printed = _printed(stdout, which)
            for i in pos:
                printed = printed[i]
            assert printed == pytest.approx(float(value), rel=1e-9, abs=1e-12), (name, stdout)
        return
    expected, actual = SCALAR.findall(report.split("quantity", 1)[1])[0]
    assert _printed(stdout, label) == pytest.approx(float(actual), rel=1e-9), (name, stdout)
    assert _printed(stdout, against) == pytest.approx(float(expected), rel=1e-9), stdout
