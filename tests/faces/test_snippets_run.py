"""Report snippets run as printed, from the directory the report names, and reproduce what
the check did (issue 14): one per check, in every layout where it matters, for a function
under a ``tests/`` directory without ``__init__.py`` (pytester project), for a function
made by a factory and collected under another name, and for one that cannot be imported.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_polgrad.core.engine import build_context, run_check
from pytest_polgrad.core.options import parse_marker
from tests.helpers import inline_run
from tests.helpers import sample_losses as L
from tests.helpers.snippet_driver import run_snippets
from tests.kinds.policy_loss.test_sweep_correct import _float32_inside

pytest_plugins = ["pytester"]

HEAD = "\n  reproduce (standalone):\n\n"
"""The report's header line of the snippet: the same for every kind."""
FIRST = re.compile(r"# pytest-polgrad reproduction: (.*)")
"""The snippet's first line: how to run it, as every kind's snippet opens."""


def _snippet(report: str) -> tuple[str, str]:
    """``(instruction, code)`` of a report's reproduce section; the instruction is the
    snippet's first line, a comment (asserted)."""
    assert HEAD in report, report
    body = report.split(HEAD, 1)[1].split("\n  replay ")[0]
    code = body
    match = FIRST.fullmatch(code.splitlines()[0])
    assert match, code
    return match.group(1), code


def _run_from(instruction: str) -> str:
    prefix = "save it as a file and run it with python from "
    assert instruction.startswith(prefix), instruction
    return instruction[len(prefix) :]


def _execute(code: str, tmp_path: Path, cwd: str) -> str:
    """Run ``code`` saved as a file outside ``cwd`` (so only what the snippet puts on
    sys.path helps), from ``cwd``, in the suite's snippet interpreter
    (:func:`tests.helpers.snippet_driver.run_snippets`: as ``python FILE`` runs it, the project's
    modules imported afresh); return its stdout."""
    stdout = run_snippets([("repro", code, cwd)], tmp_path)["repro"]
    assert not stdout.startswith("FAILED"), stdout + "\n" + code
    return stdout


def _failing(fn: Callable[..., Any], reference: str, check: str, **options: Any) -> str:
    ctx = build_context(fn, parse_marker((reference,), options))
    result = run_check(ctx, check, max_examples=40, base_seed=0, replay="pytest x")
    assert not result.passed, f"{check} did not fail"
    return result.report


def _number(stdout: str, label: str) -> float:
    line = next(x for x in stdout.splitlines() if x.startswith(label))
    return float(line.split(":")[-1].split()[0])


CISPO = {"eps_high": 2.0}
CASES: list[tuple[str, str, Callable[..., Any], dict[str, Any], str]] = [
    # check, reference, wrong loss, options, what the snippet must show
    ("value", "dapo", L.dapo_wrong_eps, {}, "function:"),
    ("value", "dapo", L.dapo_wrong_eps, {"layout": "left"}, "function:"),
    ("value", "dapo", L.dapo_wrong_eps, {"layout": "packed"}, "function:"),
    ("gradient", "cispo", L.cispo_no_stop_gradient, CISPO, "largest gradient difference"),
    ("on-policy", "cispo", L.cispo_no_stop_gradient, CISPO, "largest gradient difference"),
    ("masked-positions", "dapo", L.dapo_grad_into_padding, {}, "largest |gradient| at padding"),
    ("padding-values", "dapo", L.dapo_leaky, {}, "loss:"),
    ("padding-columns", "dapo", L.dapo_padded_width, {}, "loss:"),
    ("micro-batch", "grpo", L.grpo_token_mean, {}, "loss:"),
    ("micro-batch", "grpo", L.grpo_token_mean, {"layout": "left"}, "loss:"),
    ("inputs-unchanged", "dapo", L.dapo_inplace, {}, "inputs modified in place: ['old_logprobs']"),
    ("deterministic", "dapo", L.dapo_nondeterministic, {}, "same loss twice: False"),
    ("extreme-finite", "dapo", L.dapo_ratio_of_probs, {}, "loss finite: False"),
]


IDS = [f"{c[0]}-{c[3].get('layout', 'right')}" for c in CASES]


def _script_report(tmp: Path) -> str:
    """What :data:`SCRIPT` prints, run as a script (``__main__``) from ``tmp``."""
    import contextlib
    import io
    import runpy

    script = tmp / "check_my_loss.py"
    script.write_text(SCRIPT)
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp)
        runpy.run_path(str(script), run_name="__main__")
    return buffer.getvalue()


@dataclasses.dataclass(frozen=True)
class Made:
    """A report made in this process, and how its snippet is run."""

    report: str = ""
    code: str = ""
    """The snippet as run (a pasted definition in place)."""
    cwd: str = ""
    error: str = ""
    """Why the report or its snippet could not be made (the case's test fails with it)."""


def _made_here(tmp: Path) -> dict[str, Made]:
    """The snippets the tests below take from reports made in this process, each built on
    its own: an error fails that case's test only."""

    def parametrized() -> str:
        bound = functools.partial(dapo_with_clip_high, clip_high=0.2)
        ctx = build_context(bound, parse_marker(("dapo",), {}), name="dapo_with_clip_high[0.2]")
        result = run_check(ctx, "value", max_examples=40, base_seed=0, replay="pytest x")
        assert not result.passed
        return result.report

    def adapter() -> str:
        ctx = build_context(adapter_made, parse_marker(("dapo",), {}), name="adapter_made")
        result = run_check(ctx, "value", max_examples=40, base_seed=0, replay="pytest x")
        assert not result.passed
        return result.report

    makers: dict[str, Callable[[], str]] = {
        "adapter": adapter,
        "named-loss": lambda: _failing(loss, "dapo", "value"),
        "aliased": lambda: _failing(_dapo_log_probs, "dapo", "value"),
        "factory": lambda: _failing(factory_made, "dapo", "value"),
        "parametrized": parametrized,
        "script": lambda: _script_report(tmp),
    }
    out: dict[str, Made] = {}
    for case, make in makers.items():
        try:
            report = make()
            instruction, code = _snippet(report)
            if case == "script":  # the reader pastes the definition where marked
                marker = "# paste its definition (and what it uses) here, named wrong."
                definition = SCRIPT.split("\n\n\ntry:")[0].split("\n\n\n", 1)[1]
                out[case] = Made(report, code.replace(marker, definition), str(tmp))
            else:
                out[case] = Made(report, code, _run_from(instruction))
        except BaseException:
            out[case] = Made(error=traceback.format_exc())
    return out


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Made]:
    return _made_here(tmp_path_factory.mktemp("script"))


@pytest.fixture(scope="module")
def reproduced(tmp_path_factory: pytest.TempPathFactory, made: dict[str, Made]) -> dict[str, str]:
    """Every case's snippet, and those of :func:`_made_here`, each saved as its own file
    outside the directory it runs from, run in the suite's snippet interpreter (one torch
    import for every snippet of the suite's process, instead of one per case)."""
    jobs = []
    for case, (check, reference, wrong, options, _) in zip(IDS, CASES, strict=True):
        instruction, code = _snippet(_failing(wrong, reference, check, **options))
        jobs.append((case, code, _run_from(instruction)))
    jobs += [(case, one.code, one.cwd) for case, one in made.items() if not one.error]
    return run_snippets(jobs, tmp_path_factory.mktemp("snippets"))


def _made(made: dict[str, Made], case: str) -> tuple[str, str]:
    """``(instruction, code)`` of the snippet in the report made for ``case``."""
    one = made[case]
    if one.error:
        pytest.fail(one.error, pytrace=False)
    return _snippet(one.report)


def _ran(reproduced: dict[str, str], case: str) -> str:
    stdout = reproduced[case]
    assert not stdout.startswith("FAILED"), stdout
    return stdout


@pytest.mark.parametrize(("check", "reference", "wrong", "options", "shown"), CASES, ids=IDS)
def test_the_snippet_reproduces_the_check(
    check: str,
    reference: str,
    wrong: Any,
    options: dict[str, Any],
    shown: str,
    reproduced: dict[str, str],
) -> None:
    stdout = reproduced[f"{check}-{options.get('layout', 'right')}"]
    assert not stdout.startswith("FAILED"), stdout
    assert shown in stdout, stdout
    if check == "value":
        printed = stdout.split()
        assert float(printed[1]) != pytest.approx(float(printed[3]), rel=1e-6)
    if check in ("gradient", "on-policy"):
        assert _number(stdout, "largest gradient difference") > 1e-6
    if check == "on-policy":  # REINFORCE's loss value is never compared, nor printed as such
        assert "reference:" not in stdout and "loss (not compared" in stdout, stdout
    if check in ("padding-values", "padding-columns", "micro-batch"):
        # what changed is reproduced: the loss or the gradient differs
        line = next(x for x in stdout.splitlines() if x.startswith("loss:")).split()
        loss_moved = float(line[1]) != pytest.approx(float(line[-1]), rel=1e-9, abs=1e-12)
        assert loss_moved or _number(stdout, "largest gradient difference") > 1e-9, stdout


def test_the_micro_batch_snippet_micro_batches() -> None:
    _, code = _snippet(_failing(L.grpo_token_mean, "grpo", "micro-batch"))
    assert "for b in range(rows):" in code and "run({k: v[b : b + 1]" in code


def test_aliased_parameter_names_reach_the_snippet(
    made: dict[str, Made], reproduced: dict[str, str]
) -> None:
    _, code = _made(made, "aliased")
    assert "'logprobs': 'log_probs'" in code and "'response_mask': 'action_mask'" in code
    assert "function:" in _ran(reproduced, "aliased")


def _dapo_log_probs(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    action_mask: torch.Tensor,
) -> torch.Tensor:
    return L.dapo_wrong_eps(log_probs, old_log_probs, advantages, action_mask)


def _make(hi: float) -> Callable[..., torch.Tensor]:
    def inner(
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
    ) -> torch.Tensor:
        per = L._ppo_per_token(logprobs, old_logprobs, advantages, response_mask, 0.2, hi)
        return L._token_mean(per, response_mask)

    return inner


factory_made = _make(0.2)
"""Collected as ``factory_made``; its ``__name__`` is ``inner``."""


def loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
) -> torch.Tensor:
    """A wrong loss named like the snippet's own variable (new-user trial: the snippet's
    ``run`` assigned ``loss`` and then called it: UnboundLocalError)."""
    return L.dapo_wrong_eps(logprobs, old_logprobs, advantages, response_mask)


adapter_made = _float32_inside(L.dapo_wrong_eps)
"""Made by a factory in another module (as a framework adapter's loss is: its
``__module__`` is the factory's) and bound here, where pytest collects it."""


def test_a_factory_made_function_is_imported_under_its_module_name(
    made: dict[str, Made], reproduced: dict[str, str]
) -> None:
    _, code = _made(made, "factory")
    assert "from tests.faces.test_snippets_run import factory_made" in code
    assert "function:" in _ran(reproduced, "factory")


def test_a_function_made_in_another_module_is_imported_where_it_is_bound(
    made: dict[str, Made], reproduced: dict[str, str]
) -> None:
    """New-user trial: a framework adapter's loss bound to a name in a test module read
    "cannot be imported (not as a top-level name of pytest_polgrad.frameworks.verl)"."""
    _, code = _made(made, "adapter")
    assert "from tests.faces.test_snippets_run import adapter_made" in code
    assert "function:" in _ran(reproduced, "adapter")


def test_a_function_named_like_a_snippet_variable_is_imported_under_an_alias(
    made: dict[str, Made], reproduced: dict[str, str]
) -> None:
    _, code = _made(made, "named-loss")
    assert "from tests.faces.test_snippets_run import loss as loss_under_test" in code
    assert "function:" in _ran(reproduced, "named-loss")


def test_an_unimportable_function_gets_a_paste_instruction() -> None:
    closure = _make(0.2)  # not a module attribute: cannot be imported
    report = _failing(closure, "dapo", "value")
    instruction, code = _snippet(report)
    assert instruction == (
        "paste the definition of inner where marked, then save it as a file and run it "
        f"with python from {os.getcwd()}"
    )
    assert "# paste its definition (and what it uses) here, named inner." in code
    assert "from __main__" not in code


PROJECT_LOSS = """
import pytest
import torch


@pytest.mark.polgrad_conforms("dapo", checks=["value", "micro-batch"])
def dapo_loss(logprobs, old_logprobs, advantages, response_mask):
    r = torch.exp(torch.where(response_mask, logprobs - old_logprobs, 0.0))
    a = advantages[:, None]
    per = torch.maximum(-a * r, -a * r.clamp(0.8, 1.2))
    return torch.where(response_mask, per, 0.0).sum() / response_mask.sum()
"""


def test_a_snippet_for_a_function_under_tests_runs_from_the_named_directory(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """Issue 14: 'run from your repository root' raised ModuleNotFoundError for tests in a
    ``tests/`` directory (pytest's rootdir-relative ``prepend`` import puts ``tests/``, not
    the root, on sys.path)."""
    tests = pytester.mkdir("tests")
    (tests / "test_conformance.py").write_text(PROJECT_LOSS)
    result = inline_run.run(
        pytester, "-p", "no:cacheprovider", "-p", "no:randomly", "--polgrad-max-examples=10"
    )
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    instruction, code = _snippet(text[text.index("does not conform to 'dapo'") :])
    assert "sys.path[:0] = ['tests', '.']" in code
    assert "from test_conformance import dapo_loss" in code
    run_from = _run_from(instruction)
    assert Path(run_from) == pytester.path
    stdout = _execute(code, tmp_path, run_from)
    printed = stdout.split()
    assert printed[0] == "function:" and float(printed[1]) != pytest.approx(float(printed[3]))


def test_a_snippet_importing_the_projects_own_package_runs_when_saved_elsewhere(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """A new user's test imported the loss from the project's package (``pythonpath = .``):
    the snippet, saved outside the project and run from the directory the report names,
    must find that package too."""
    pkg = pytester.mkdir("mytrainer")
    (pkg / "__init__.py").write_text("")
    body = PROJECT_LOSS.split("def dapo_loss", 1)[1]
    (pkg / "loss.py").write_text(
        "import torch\n\n\ndef dapo_loss" + body.replace("def dapo_loss", "def dapo_loss")
    )
    tests = pytester.mkdir("tests")
    (tests / "test_conformance.py").write_text(
        "import pytest\n\nfrom mytrainer.loss import dapo_loss as _impl\n\n\n"
        '@pytest.mark.polgrad_conforms("dapo", checks=["value"])\n'
        "def dapo_loss(logprobs, old_logprobs, advantages, response_mask):\n"
        "    return _impl(logprobs, old_logprobs, advantages, response_mask)\n"
    )
    pytester.makeini("[pytest]\npythonpath = .\n")
    result = inline_run.run(
        pytester, "-p", "no:cacheprovider", "-p", "no:randomly", "--polgrad-max-examples=10"
    )
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    instruction, code = _snippet(text[text.index("does not conform to 'dapo'") :])
    stdout = _execute(code, tmp_path, _run_from(instruction))
    assert stdout.split()[0] == "function:"


SCRIPT = """
import torch
from pytest_polgrad import ConformanceError, assert_conforms


def wrong(logprobs, old_logprobs, advantages, response_mask):
    r = torch.exp(torch.where(response_mask, logprobs - old_logprobs, 0.0))
    a = advantages[:, None]
    per = torch.maximum(-a * r, -a * r.clamp(0.8, 1.2))
    return torch.where(response_mask, per, 0.0).sum() / response_mask.sum()


try:
    assert_conforms(wrong, "dapo", max_examples=10, checks=("value",))
except ConformanceError as exc:
    print(exc)
"""


def test_an_assert_conforms_snippet_from_a_script_says_how_to_paste(
    made: dict[str, Made], reproduced: dict[str, str]
) -> None:
    """Issue 14: snippets of functions defined in a script imported ``from __main__`` (the
    script is run as ``__main__`` with ``runpy``, as ``python check_my_loss.py`` runs it;
    the snippet, its definition pasted, runs in the snippet interpreter, not this process)."""
    instruction, code = _made(made, "script")
    assert instruction == (
        "paste the definition of wrong where marked, then save it as a file and run it "
        f"with python from {made['script'].cwd}"
    )
    assert "from __main__" not in code
    assert "# paste its definition (and what it uses) here, named wrong." in code
    printed = _ran(reproduced, "script").split()
    assert printed[0] == "function:" and float(printed[1]) != pytest.approx(float(printed[3]))


def dapo_with_clip_high(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_high: float = 0.28,
) -> torch.Tensor:
    per = L._ppo_per_token(logprobs, old_logprobs, advantages, response_mask, 0.2, clip_high)
    return L._token_mean(per, response_mask)


def test_a_parametrized_function_is_imported_and_rebound(
    made: dict[str, Made], reproduced: dict[str, str]
) -> None:
    """A ``@pytest.mark.parametrize`` item reaches the engine as a ``functools.partial``
    named ``fn[params]``: the snippet imports ``fn`` and binds the same parameters."""
    assert made["parametrized"].report.startswith("dapo_with_clip_high[0.2] does not conform")
    _, code = _made(made, "parametrized")
    assert "from tests.faces.test_snippets_run import dapo_with_clip_high" in code
    assert "functools.partial(dapo_with_clip_high, clip_high=0.2)" in code
    printed = _ran(reproduced, "parametrized").split()
    assert float(printed[1]) != pytest.approx(float(printed[3]), rel=1e-6)


def test_a_device_snippet_moves_the_inputs_and_brings_the_gradient_back() -> None:
    """``device="cuda"`` (context built without touching CUDA: availability is checked
    at the first call): the snippet sends the function the same device tensors."""
    from pytest_polgrad.kinds.policy_loss.checks import CHECKS
    from pytest_polgrad.kinds.policy_loss.snippet import snippet
    from pytest_polgrad.strategies import Batch

    ctx = build_context(L.dapo, parse_marker(("dapo",), {"device": "cuda"}))
    batch = Batch(
        logprobs=torch.tensor([[-1.0, -2.0]], dtype=torch.float64),
        old_logprobs=torch.tensor([[-1.1, -2.0]], dtype=torch.float64),
        advantages=torch.tensor([1.0], dtype=torch.float64),
        response_mask=torch.tensor([[True, False]]),
    )
    code = snippet(ctx, batch, CHECKS["value"])
    assert "kw[param] = t.to('cuda')" in code and "grad = grad.cpu()" in code
    compile(code, "snippet", "exec")
