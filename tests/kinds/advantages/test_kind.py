"""The advantages kind through the public API: correct estimators pass every check (float64,
float32 internally, bfloat16 inputs, left padding, the [num_prompts, G] layout), and
realistic wrong ones fail with a diagnosis naming what they compute (docs/conformance.md,
"Advantages")."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch

from pytest_polgrad import assert_conforms
from pytest_polgrad.api import ConformanceError, ConformanceReport
from pytest_polgrad.core.options import ConformanceOptions, MarkerError
from pytest_polgrad.kinds._advantage_reference import advantage_corpus
from tests.helpers import inline_run

BUDGET = 12


def _run(fn: Callable[..., Any], reference: str, **options: Any) -> ConformanceReport:
    try:
        return assert_conforms(
            fn, reference, kind="advantages", max_examples=BUDGET, seed=1, **options
        )
    except ConformanceError as exc:
        return exc.report


def _failed(report: ConformanceReport) -> dict[str, Any]:
    return {r.check: r for r in report.results if not r.passed}


# ---------------------------------------------------------------- implementations


def _groups(group_ids: torch.Tensor) -> list[torch.Tensor]:
    return [group_ids == g for g in sorted(set(group_ids.tolist()))]


def grpo_loop(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """(r - mean) / (std + 1e-6) per group, Bessel, singletons 0: the reference 'grpo'."""
    out = torch.zeros_like(rewards)
    for m in _groups(group_ids):
        r = rewards[m]
        if r.numel() > 1:
            out[m] = (r - r.mean()) / (r.std() + 1e-6)
    return out


def grpo_float32(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """The same in float32 internally."""
    return grpo_loop(rewards.float(), group_ids).to(rewards.dtype)


def grpo_population_std(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(rewards)
    for m in _groups(group_ids):
        r = rewards[m]
        if r.numel() > 1:
            out[m] = (r - r.mean()) / (r.std(unbiased=False) + 1e-6)
    return out


def grpo_eps_in_sqrt(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(rewards)
    for m in _groups(group_ids):
        r = rewards[m]
        if r.numel() > 1:
            out[m] = (r - r.mean()) / torch.sqrt(r.var() + 1e-6)
    return out


def grpo_no_std(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(rewards)
    for m in _groups(group_ids):
        out[m] = rewards[m] - rewards[m].mean()
    return out


def grpo_batch_mean(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Forgets the groups for the mean (a batch-wide baseline)."""
    out = torch.zeros_like(rewards)
    mean = rewards.mean()
    for m in _groups(group_ids):
        r = rewards[m]
        if r.numel() > 1:
            out[m] = (r - mean) / (r.std() + 1e-6)
    return out


def grpo_verl_style(
    token_rewards: torch.Tensor, response_mask: torch.Tensor, group_ids: torch.Tensor
) -> torch.Tensor:
    """verl 0.9.1's convention: scores = sum of token rewards, singleton mean 0 / std 1,
    result broadcast to [B, T] times the mask (re-implemented here)."""
    scores = token_rewards.sum(dim=-1)
    out = scores.clone()
    for m in _groups(group_ids):
        r = scores[m]
        mean, std = (r.mean(), r.std()) if r.numel() > 1 else (0.0, 1.0)
        out[m] = (r - mean) / (std + 1e-6)
    return out[:, None] * response_mask


def grpo_grouped(rewards: torch.Tensor) -> torch.Tensor:
    """[num_prompts, G] layout."""
    mean = rewards.mean(dim=1, keepdim=True)
    if rewards.shape[1] == 1:
        return torch.zeros_like(rewards)
    return (rewards - mean) / (rewards.std(dim=1, keepdim=True) + 1e-6)


def grpo_in_place(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    out = grpo_loop(rewards, group_ids)
    rewards.sub_(rewards.mean())  # centres the caller's tensor
    return out


def rloo_ok(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(rewards)
    for m in _groups(group_ids):
        r = rewards[m]
        if r.numel() > 1:
            out[m] = r - (r.sum() - r) / (r.numel() - 1)
    return out


def opo_ok(
    rewards: torch.Tensor, group_ids: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    lengths = response_mask.sum(dim=1).to(rewards.dtype)
    out = torch.zeros_like(rewards)
    for m in _groups(group_ids):
        if int(m.sum()) > 1:
            out[m] = rewards[m] - (lengths[m] * rewards[m]).sum() / lengths[m].sum()
    return out


def _gae_loop(
    rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    dones: torch.Tensor | None,
    gamma: float,
    lam: float,
) -> torch.Tensor:
    """Mask-aware backward recursion (works for any padding side); outcome at the last
    token."""
    b, width = response_mask.shape
    adv = torch.zeros(b, width, dtype=torch.float64)
    v = values.detach().double()
    for row in range(b):
        pos = response_mask[row].nonzero().flatten().tolist()
        nxt_v, nxt_a = 0.0, 0.0
        for k in reversed(range(len(pos))):
            t = pos[k]
            r = float(rewards[row].detach()) if k == len(pos) - 1 else 0.0
            cont = 0.0 if dones is not None and bool(dones[row, t]) else 1.0
            delta = r + gamma * cont * nxt_v - float(v[row, t])
            a = delta + gamma * lam * cont * nxt_a
            adv[row, t] = a
            nxt_v, nxt_a = float(v[row, t]), a
    return adv


def _whiten(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    vals = x[mask]
    mean, var = vals.mean(), vals.var(unbiased=unbiased)
    return torch.where(mask, (x - mean) * torch.rsqrt(var + 1e-8), 0.0)


def gae_ok(
    rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor, dones: torch.Tensor
) -> torch.Tensor:
    adv = _gae_loop(rewards, values, response_mask, dones, 1.0, 0.95)
    return _whiten(adv, response_mask).to(values.dtype)


def gae_ignores_dones(
    rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor, dones: torch.Tensor
) -> torch.Tensor:
    adv = _gae_loop(rewards, values, response_mask, None, 1.0, 0.95)
    return _whiten(adv, response_mask).to(values.dtype)


def gae_whitens_padding(
    rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor, dones: torch.Tensor
) -> torch.Tensor:
    adv = _gae_loop(rewards, values, response_mask, dones, 1.0, 0.95)
    flat = adv.flatten()  # statistics over every position, padding included
    return torch.where(response_mask, (adv - flat.mean()) * torch.rsqrt(flat.var() + 1e-8), 0.0)


def reinforce_pp_ok(rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    returns = torch.where(response_mask, rewards.double()[:, None], 0.0)  # gamma 1
    return _whiten(returns, response_mask).to(rewards.dtype)


def reinforce_pp_openrlhf(rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    returns = torch.where(response_mask, rewards.double()[:, None], 0.0)
    vals = returns[response_mask]
    mean, var = vals.mean(), vals.var(unbiased=False)
    return torch.where(response_mask, (returns - mean) * var.clamp(min=1e-8).rsqrt(), 0.0)


def grpo_std_floor(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """A 'safe' std floor of 1e-2 instead of the + 1e-6: wrong for small reward scales."""
    out = torch.zeros_like(rewards)
    for m in _groups(group_ids):
        r = rewards[m]
        if r.numel() > 1:
            out[m] = (r - r.mean()) / r.std().clamp(min=1e-2)
    return out


def grpo_contiguous(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Assumes rows of a group are adjacent: splits wherever the id changes."""
    out = torch.zeros_like(rewards)
    start = 0
    for i in range(1, rewards.numel() + 1):
        if i == rewards.numel() or bool(group_ids[i] != group_ids[start]):
            r = rewards[start:i]
            if r.numel() > 1:
                out[start:i] = (r - r.mean()) / (r.std() + 1e-6)
            start = i
    return out


def gae_bootstraps_from_padding(
    rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor, dones: torch.Tensor
) -> torch.Tensor:
    """Differentiable GAE that bootstraps the last token from the value at the next column
    (padding) instead of 0, and never masks."""
    b, width = values.shape
    last = response_mask.sum(dim=1) - 1
    r = torch.zeros_like(values)
    r[torch.arange(b), last] = rewards
    nxt = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], dim=1)
    cont = (~dones).to(values.dtype)
    delta = r + cont * nxt - values
    adv, acc = [], torch.zeros_like(values[:, 0])
    for t in reversed(range(width)):
        acc = delta[:, t] + 0.95 * cont[:, t] * acc
        adv.append(acc)
    a = torch.stack(adv[::-1], dim=1)
    vals = a[response_mask]
    return torch.where(response_mask, (a - vals.mean()) * torch.rsqrt(vals.var() + 1e-8), 0.0)


def gae_whiten_padded_count(
    rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor, dones: torch.Tensor
) -> torch.Tensor:
    """Masked sums divided by the padded element count B * T."""
    adv = _gae_loop(rewards, values, response_mask, dones, 1.0, 0.95)
    m = response_mask.to(adv.dtype)
    mean = (adv * m).sum() / m.numel()
    var = (((adv - mean) * m) ** 2).sum() / (m.numel() - 1)
    return torch.where(response_mask, (adv - mean) * torch.rsqrt(var + 1e-8), 0.0)


class RunningBaseline:
    """REINFORCE with a moving-average baseline kept across calls (stateful)."""

    def __init__(self) -> None:
        self.baseline = 0.0

    def __call__(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        out = grpo_loop(rewards, group_ids) - 0.01 * self.baseline
        self.baseline = 0.9 * self.baseline + 0.1 * float(rewards.detach().mean())
        return out


def running_baseline(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    return _RUNNING(rewards, group_ids)


_RUNNING = RunningBaseline()


# ---------------------------------------------------------------- correct ones pass


@pytest.mark.parametrize(
    ("fn", "reference", "options"),
    [
        (grpo_loop, "grpo", {}),
        (grpo_float32, "grpo", {}),
        (grpo_loop, "grpo", {"dtype": "bfloat16"}),
        (grpo_float32, "grpo", {"dtype": "float32"}),
        (grpo_no_std, "dr_grpo", {"singleton": "zero"}),
        (grpo_verl_style, "grpo", {"singleton": "raw"}),
        (grpo_grouped, "grpo", {"grouped": True}),
        (rloo_ok, "rloo", {}),
        (opo_ok, "opo", {}),
        (gae_ok, "gae", {}),
        (gae_ok, "gae", {"layout": "left"}),
        (gae_ok, "gae", {"dtype": "float32"}),
        (reinforce_pp_ok, "reinforce_pp", {}),
        (reinforce_pp_openrlhf, "reinforce_pp", {"whitening": "openrlhf"}),
    ],
    ids=lambda x: getattr(x, "__name__", None) or (str(x) if not isinstance(x, dict) else None),
)
def test_correct_estimators_pass_every_check(
    fn: Callable[..., Any], reference: str, options: dict[str, Any]
) -> None:
    report = _run(fn, reference, **options)
    assert report.ok, str(report)
    assert {r.check for r in report.results} >= {"value", "group-order", "deterministic"}


# ---------------------------------------------------------------- wrong ones are named


@pytest.mark.parametrize(
    ("fn", "reference", "options", "check", "words"),
    [
        (grpo_population_std, "grpo", {}, "value", "population std"),
        (grpo_eps_in_sqrt, "grpo", {}, "value", "sqrt(var + 1e-06)"),
        (grpo_no_std, "grpo", {}, "value", "without std scaling: r - mean (Dr.GRPO)"),
        (grpo_no_std, "rloo", {}, "value", "r - mean (Dr.GRPO)"),
        (grpo_verl_style, "grpo", {}, "singleton-constant", "singletons keep their reward"),
        (gae_ignores_dones, "gae", {}, "value", "ignoring dones"),
        (reinforce_pp_openrlhf, "reinforce_pp", {}, "value", "population variance"),
        (rloo_ok, "grpo", {}, "value", "rloo: r - mean of the others"),
        (opo_ok, "grpo", {"scale_by_std": False}, "value", "opo: r - sum L r / sum L"),
    ],
    ids=lambda x: getattr(x, "__name__", None) or (x if isinstance(x, str) else None),
)
def test_wrong_estimators_are_flagged_with_a_diagnosis(
    fn: Callable[..., Any], reference: str, options: dict[str, Any], check: str, words: str
) -> None:
    # one verdict: the named check alone (its pool, corpus, shrink and diagnosis are the
    # same as in a run of every check; the other checks' verdicts are not looked at)
    failed = _failed(_run(fn, reference, checks=[check], **options))
    assert check in failed, sorted(failed)
    assert words in failed[check].diagnosis, failed[check].diagnosis


@pytest.mark.parametrize(
    ("fn", "reference", "check", "words"),
    [
        (grpo_batch_mean, "grpo", "group-isolation", "mixes groups"),
        (gae_whitens_padding, "gae", "value", "differ from the reference"),
        (grpo_in_place, "grpo", "inputs-unchanged", "modified its input 'rewards' in place"),
        (grpo_std_floor, "grpo", "extreme-values", "differ from the reference"),
        (grpo_contiguous, "grpo", "group-order", "depends on the order"),
        (gae_bootstraps_from_padding, "gae", "no-gradient-leak", "gradient flows into padding"),
        (gae_bootstraps_from_padding, "gae", "padding-values", "padding values reach the result"),
        (gae_whiten_padded_count, "gae", "padding-columns", "depends on the padded width"),
        (running_baseline, "grpo", "deterministic", "different"),
    ],
    ids=lambda x: getattr(x, "__name__", None) or (x if isinstance(x, str) else None),
)
def test_structural_bugs_fail_the_check_that_names_them(
    fn: Callable[..., Any], reference: str, check: str, words: str
) -> None:
    failed = _failed(_run(fn, reference, checks=[check]))  # one verdict, as above
    assert check in failed, sorted(failed)
    assert words in failed[check].message


def test_the_report_carries_a_standalone_snippet() -> None:
    failed = _failed(_run(grpo_population_std, "grpo", checks=["value"]))
    report = failed["value"].report
    assert "rewards = torch.tensor(" in report and "group_ids = torch.tensor(" in report
    code = report.split("reproduce (standalone):", 1)[1].split("\n  replay", 1)[0]
    namespace: dict[str, Any] = {}
    exec(code, namespace)  # the snippet runs on its own, exactly as printed
    assert namespace["rewards"].dtype == torch.float64


# ---------------------------------------------------------------- marker options


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"std_epz": 1e-6}, "did you mean 'std_eps'"),
        ({"whitening": "verll"}, "did you mean 'verl'"),
        ({"grouped": "yes"}, "grouped must be True or False"),
        ({"singleton": "none"}, "singleton must be one of"),
    ],
)
def test_bad_overrides_are_marker_errors(options: dict[str, Any], words: str) -> None:
    with pytest.raises(MarkerError, match=words.replace("(", r"\(").replace(")", r"\)")):
        assert_conforms(grpo_loop, "grpo", kind="advantages", max_examples=1, **options)


def test_unknown_reference_suggests_a_name() -> None:
    with pytest.raises(MarkerError, match="did you mean 'grpo'"):
        assert_conforms(grpo_loop, "grpoo", kind="advantages", max_examples=1)


# ---------------------------------------------------------------- the marker (pytester)

pytest_plugins = ["pytester"]

MARKED = """
import pytest
import torch


def _grpo(rewards, group_ids, unbiased=True):
    out = torch.zeros_like(rewards)
    for g in sorted(set(group_ids.tolist())):
        m = group_ids == g
        r = rewards[m]
        if r.numel() > 1:
            out[m] = (r - r.mean()) / (r.std(unbiased=unbiased) + 1e-6)
    return out


@pytest.mark.polgrad_conforms("grpo", kind="advantages")
def good(rewards, group_ids):
    return _grpo(rewards, group_ids)


@pytest.mark.polgrad_conforms("grpo", kind="advantages", checks=["value"])
def population(rewards, group_ids):
    return _grpo(rewards, group_ids, unbiased=False)
"""


def test_the_marker_generates_items_goldens_and_a_diagnosis(pytester: pytest.Pytester) -> None:
    import json

    pytester.makepyfile(test_adv=MARKED)
    args = ("-p", "no:cacheprovider", "--polgrad-max-examples=8", "-p", "no:randomly")
    first = inline_run.run(pytester, *args, "--snapshot-update", "-k", "good")
    first.assert_outcomes(passed=11)  # 10 checks + golden (recorded)
    report = pytester.path / "report.json"
    result = inline_run.run(pytester, *args, f"--polgrad-report={report}")
    result.assert_outcomes(passed=11, failed=1)
    assert "population std" in result.stdout.str()  # the diagnosis in the failure report
    rows = json.loads(report.read_text())
    ids = {r["nodeid"] for r in rows}
    assert {"test_adv.py::good[grpo-group-order]", "test_adv.py::good[grpo-golden]"} <= ids
    assert {r["kind"] for r in rows} == {"advantages"}
    # a semantic change of the recorded function shows up as a golden diff
    pytester.makepyfile(
        test_adv=MARKED.replace(
            "return _grpo(rewards, group_ids)\n",
            "return _grpo(rewards, group_ids, unbiased=False)\n",
            1,
        )
    )
    changed = inline_run.run(pytester, *args, "-k", "good and golden")
    changed.assert_outcomes(failed=1)
    assert "does not match" in changed.stdout.str()


# ------------------------------------------------- batches outside the reference's domain


def reinforce_pp_guarded(rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Correct REINFORCE++ that returns 0 where whitening is undefined (one response token
    in the batch: no unbiased variance), where verl raises and the reference refuses."""
    returns = torch.where(response_mask, rewards.double()[:, None], 0.0)
    if int(response_mask.sum()) < 2:
        return torch.zeros_like(returns).to(rewards.dtype)
    return _whiten(returns, response_mask).to(rewards.dtype)


@pytest.mark.parametrize("seed", [0, 2, 4])
def test_a_batch_the_reference_cannot_whiten_is_not_drawn(seed: int) -> None:
    """Issue 27: at 100 examples the pool drew a batch with a single response token and
    a correct reinforce_pp failed value / extreme-values with "the reference cannot
    compute this batch", which expect= cannot excuse (seeds 0, 2 and 4 drew one)."""
    report = assert_conforms(
        reinforce_pp_guarded, "reinforce_pp", kind="advantages", max_examples=100, seed=seed
    )
    assert report.ok, str(report)


def test_the_domain_is_the_references_whitening_count() -> None:
    """Whitening needs 2 response tokens (unbiased) or 1 (biased); without whitening every
    batch is in the domain."""
    from pytest_polgrad.kinds.advantages import KIND

    one = advantage_corpus(torch.float64)["groups"]
    one = dataclasses.replace(
        one,
        rewards=one.rewards[:1],
        group_ids=one.group_ids[:1],
        response_mask=torch.tensor([[True, False]]),
    )
    unbiased = KIND.resolve(ConformanceOptions("reinforce_pp", kind="advantages"))
    biased = KIND.resolve(
        ConformanceOptions("reinforce_pp", kind="advantages", overrides={"whitening": "openrlhf"})
    )
    grpo = KIND.resolve(ConformanceOptions("grpo", kind="advantages"))
    assert not unbiased.computes(one)
    assert biased.computes(one)
    assert grpo.computes(one)
