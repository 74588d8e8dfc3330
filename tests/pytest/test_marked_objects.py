"""Every marked object either works or is a collection error that says what to do; items,
rows and snippets use the name pytest collected; ``parametrize`` gives one set of items
per parameter set with the parameters bound; a first run reports missing goldens in one
summary line, and a partial run never says "conforms" (issues 14 and 15)."""

from __future__ import annotations

import json

import pytest

from tests.helpers import inline_run

pytest_plugins = ["pytester"]

ARGS = ("-p", "no:cacheprovider", "-p", "no:randomly", "--polgrad-max-examples=5")

MODULE = """
import functools

import pytest
import torch


def _dapo(logprobs, old_logprobs, advantages, response_mask, hi=0.28):
    r = torch.exp(torch.where(response_mask, logprobs - old_logprobs, 0.0))
    a = advantages[:, None]
    per = torch.maximum(-a * r, -a * r.clamp(0.8, 1.0 + hi))
    return torch.where(response_mask, per, 0.0).sum() / response_mask.sum()


conforms = pytest.mark.polgrad_conforms("dapo", checks="value")  # an alias: no items

lam = conforms(lambda logprobs, old_logprobs, advantages, response_mask: _dapo(
    logprobs, old_logprobs, advantages, response_mask))
part = conforms(functools.partial(_dapo, hi=0.2))


class Loss:
    def __call__(self, logprobs, old_logprobs, advantages, response_mask):
        return _dapo(logprobs, old_logprobs, advantages, response_mask)


inst = conforms(Loss())


class TestGroup:
    @pytest.mark.polgrad_conforms("dapo", checks=("value",))
    def method(self, logprobs, old_logprobs, advantages, response_mask):
        return _dapo(logprobs, old_logprobs, advantages, response_mask)


def make(hi):
    @pytest.mark.polgrad_conforms("dapo", checks=("value",))
    def loss(logprobs, old_logprobs, advantages, response_mask):
        return _dapo(logprobs, old_logprobs, advantages, response_mask, hi=hi)
    return loss


made_028 = make(0.28)
made_020 = make(0.2)


@pytest.mark.parametrize("hi", [0.28, pytest.param(0.2, id="low")])
@pytest.mark.parametrize("scale", [1.0])
@pytest.mark.polgrad_conforms("dapo", checks=("value", "golden"))
def param(logprobs, old_logprobs, advantages, response_mask, hi, scale):
    return _dapo(logprobs, old_logprobs, advantages, response_mask, hi=hi) * scale


@pytest.mark.parametrize("hi", [
    pytest.param(0.28, marks=pytest.mark.polgrad_conforms("dapo", checks="value")),
    pytest.param(0.2, marks=pytest.mark.polgrad_conforms("ppo", checks="value")),
])
def per_param(logprobs, old_logprobs, advantages, response_mask, hi):
    return _dapo(logprobs, old_logprobs, advantages, response_mask, hi=hi)
"""


def _report(pytester: pytest.Pytester, *extra: str) -> tuple[dict[str, str], str]:
    report = pytester.path / "r.json"
    result = inline_run.run(pytester, *ARGS, f"--polgrad-report={report}", *extra)
    data = json.loads(report.read_text())
    return {r["nodeid"].split("::", 1)[1]: r["status"] for r in data}, result.stdout.str()


def test_every_marked_form_generates_its_items(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_forms=MODULE)
    status, text = _report(pytester)
    assert status == {
        "lam[dapo-value]": "passed",
        "part[dapo-value]": "failed",  # eps_high 0.2 bound into the partial
        "inst[dapo-value]": "passed",
        "TestGroup::method[dapo-value]": "passed",
        "made_028[dapo-value]": "passed",
        "made_020[dapo-value]": "failed",
        "param[scale=1.0-hi=0.28-dapo-value]": "passed",
        "param[scale=1.0-low-dapo-value]": "failed",
        "param[scale=1.0-hi=0.28-dapo-golden]": "failed",  # not recorded yet
        "param[scale=1.0-low-dapo-golden]": "failed",
        "per_param[hi=0.28-dapo-value]": "passed",  # each parameter set its own reference
        "per_param[hi=0.2-ppo-value]": "passed",
    }
    rows = {line.split()[0] for line in text.splitlines() if " policy_loss " in line}
    assert {"made_028", "made_020", "param[scale=1.0-hi=0.28]", "param[scale=1.0-low]"} <= rows
    assert "made_020 does not conform to 'dapo'" in text  # the collected name, not 'loss'
    assert "missing 1 required positional argument" not in text


def test_a_marked_class_is_a_collection_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        "import pytest\n\n@pytest.mark.polgrad_conforms('dapo')\nclass Loss:\n"
        "    def __call__(self, logprobs, old_logprobs, advantages, response_mask):\n"
        "        return logprobs.sum()\n"
    )
    result = inline_run.run(pytester, *ARGS)
    assert result.ret == pytest.ExitCode.INTERRUPTED  # a collection error: never green
    result.stdout.fnmatch_lines(["*Loss: invalid @pytest.mark.polgrad_conforms: marks the class*"])
    assert "mark a def that calls it" in result.stdout.str()


def test_golden_first_run_is_one_summary_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_forms=MODULE)
    status, text = _report(pytester, "-k", "golden")
    assert set(status.values()) == {"failed"} and len(status) == 2
    assert (
        "2 goldens not recorded yet: review the functions, then run pytest --snapshot-update"
        in (text)
    )
    # one line per item, no diff, no traceback (counted where a line starts with it: the
    # short test summary repeats the message, untruncated when CI is set)
    lines = [ln for ln in text.splitlines() if ln.startswith("no golden snapshot of")]
    assert len(lines) == 2
    rows = [line for line in text.splitlines() if line.startswith("param[")]
    assert rows and all(line.endswith("golden not recorded yet") for line in rows)
    # Recorded, a run of only the golden items passes them but claims no conformance.
    _report(pytester, "-k", "golden", "--snapshot-update")
    status, text = _report(pytester, "-k", "golden")
    assert set(status.values()) == {"passed"}
    rows = [line for line in text.splitlines() if line.startswith("param[")]
    ends = "1 of 2 checks ran, all passed; not run: value (no overall verdict)"
    assert rows and all(line.endswith(ends) for line in rows), rows
    assert "conforms" not in "\n".join(rows)


def _token_mean(x, mask):  # type: ignore[no-untyped-def]
    import torch

    return torch.where(mask, x, 0.0).sum() / mask.sum()


def test_assert_conforms_takes_a_kind() -> None:
    from pytest_polgrad import ConformanceError, assert_conforms
    from pytest_polgrad.core.options import MarkerError

    report = assert_conforms(_token_mean, "dapo", kind="aggregation", max_examples=3)
    assert report.kind == "aggregation" and "padding-columns" in {r.check for r in report.results}
    with pytest.raises(ConformanceError, match=r"\(aggregation\)"):
        assert_conforms(_token_mean, "grpo", kind="aggregation", checks="value", max_examples=3)
    declared = assert_conforms(
        _token_mean,
        "grpo",
        kind="aggregation",
        checks="value",
        expect={"value": "token-mean, not seq-mean-token-mean"},
        max_examples=3,
    )
    assert declared.ok and declared.kind == "aggregation"
    with pytest.raises(MarkerError, match=r"unknown check 'valeu' \(did you mean 'value'\?\)"):
        assert_conforms(_token_mean, "dapo", kind="aggregation", checks="valeu")


def test_device_unavailable_is_a_clean_failure_and_skipif_applies(
    pytester: pytest.Pytester,
) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the items would run")
    pytester.makepyfile(
        "import pytest\nimport torch\n\n"
        "@pytest.mark.polgrad_conforms('dapo', checks=('value', 'golden'), device='cuda')\n"
        "def on_cuda(logprobs, old_logprobs, advantages, response_mask):\n"
        "    return (logprobs * response_mask).sum()\n\n"
        "@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')\n"
        "@pytest.mark.polgrad_conforms('dapo', checks=('value', 'golden'), device='cuda')\n"
        "def where_cuda(logprobs, old_logprobs, advantages, response_mask):\n"
        "    return (logprobs * response_mask).sum()\n"
    )
    result = inline_run.run(pytester, *ARGS)
    result.assert_outcomes(failed=2, skipped=2)
    text = result.stdout.str()
    assert text.count("device='cuda': CUDA is not available") >= 2
    assert "Traceback" not in text and "During handling" not in text
