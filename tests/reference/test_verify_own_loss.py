"""polgrad_reference.verify on the user's own loss (issue 29, "The verify API on the user's
own loss"): gradcheck, the formula check and the bandit take any callable with the
policy-loss calling convention; every way of stopping a gradient is seen; the NaN padding
``ragged_batch`` returns is masked; a failure names the party at fault."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from polgrad_reference import ALGORITHMS, policy_loss
from polgrad_reference.errors import InputError, InputTypeError
from polgrad_reference.verify import (
    CodePathChanged,
    SoftmaxBandit,
    VerificationError,
    check_gradient_formula,
    gradcheck_policy_loss,
    ragged_batch,
    train,
)

Tensor = torch.Tensor
T = torch.Tensor
F64 = torch.float64
CAP = 3.0  # the registry's CISPO: eps_high = 2, so min(r, 1 + 2)


def _core(batch: dict[str, Any]) -> dict[str, Any]:
    keys = ("logprobs", "old_logprobs", "advantages", "response_mask")
    return {k: batch[k] for k in keys}


def _weight(logprobs: Tensor, old_logprobs: Tensor, response_mask: Tensor) -> Tensor:
    return torch.exp(torch.where(response_mask, logprobs - old_logprobs, 0.0)).clamp(max=CAP)


def _cispo(w: Tensor, logprobs: Tensor, advantages: Tensor, response_mask: Tensor) -> Tensor:
    per = -w * advantages[:, None] * logprobs
    return torch.where(response_mask, per, 0.0).sum() / response_mask.sum()


# A correct CISPO (arXiv:2506.13585 Eq. 4: -sg(min(r, 3)) A log pi, token-mean) with the
# stop-gradient written each way a user writes it.


def cispo_detach(logprobs: T, old_logprobs: T, advantages: T, response_mask: T) -> T:
    w = _weight(logprobs, old_logprobs, response_mask).detach()
    return _cispo(w, logprobs, advantages, response_mask)


def cispo_torch_detach(logprobs: T, old_logprobs: T, advantages: T, response_mask: T) -> T:
    w = torch.detach(_weight(logprobs, old_logprobs, response_mask))
    return _cispo(w, logprobs, advantages, response_mask)


def cispo_data(logprobs: T, old_logprobs: T, advantages: T, response_mask: T) -> T:
    w = _weight(logprobs, old_logprobs, response_mask).data
    return _cispo(w, logprobs, advantages, response_mask)


def cispo_no_grad(logprobs: T, old_logprobs: T, advantages: T, response_mask: T) -> T:
    with torch.no_grad():
        w = _weight(logprobs, old_logprobs, response_mask)
    return _cispo(w, logprobs, advantages, response_mask)


def cispo_grad_disabled(logprobs: T, old_logprobs: T, advantages: T, response_mask: T) -> T:
    with torch.set_grad_enabled(False):
        w = _weight(logprobs, old_logprobs, response_mask)
    return _cispo(w, logprobs, advantages, response_mask)


def cispo_detach_(logprobs: T, old_logprobs: T, advantages: T, response_mask: T) -> T:
    w = _weight(logprobs, old_logprobs, response_mask)
    w.detach_()
    return _cispo(w, logprobs, advantages, response_mask)


def cispo_clone_detach(logprobs: T, old_logprobs: T, advantages: T, response_mask: T) -> T:
    log_r = torch.where(response_mask, logprobs - old_logprobs, 0.0).clone().detach()
    return _cispo(torch.exp(log_r).clamp(max=CAP), logprobs, advantages, response_mask)


SPELLINGS: dict[str, Callable[..., Tensor]] = {
    "Tensor.detach": cispo_detach,
    "torch.detach": cispo_torch_detach,
    ".data": cispo_data,
    "torch.no_grad": cispo_no_grad,
    "set_grad_enabled(False)": cispo_grad_disabled,
    "detach_": cispo_detach_,
    "clone().detach()": cispo_clone_detach,
}


def cispo_no_stop_gradient(logprobs: T, old_logprobs: T, advantages: T, response_mask: T) -> T:
    """The same value, the weight not detached: its gradient flows into the ratio."""
    w = _weight(logprobs, old_logprobs, response_mask)
    return _cispo(w, logprobs, advantages, response_mask)


def cispo_gradient(logprobs: T, old_logprobs: T, advantages: T, response_mask: T) -> T:
    """The derivation: ``d/d lp_t = -min(r_t, 3) A / N`` (NaN at padding, left unmasked)."""
    w = torch.exp(logprobs - old_logprobs).clamp(max=CAP)
    return -w * advantages[:, None] / response_mask.sum()


def _batch(seed: int = 0) -> dict[str, Any]:
    return _core(ragged_batch("cispo", seed=seed))


# ------------------------------------------------------------ every stop-gradient spelling


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_every_stop_gradient_spelling_passes_gradcheck(spelling: str) -> None:
    """Before: only ``Tensor.detach`` was frozen, so ``torch.detach(w)``, ``.data`` and
    ``no_grad`` regions were measured without their stop-gradient and rejected."""
    fn = SPELLINGS[spelling]
    batch = _batch()
    result = gradcheck_policy_loss(fn, **batch)
    assert result.ok, result.summary()
    lp = batch["logprobs"].clone().requires_grad_()
    out = policy_loss(ALGORITHMS["cispo"].loss, **{**batch, "logprobs": lp})
    (want,) = torch.autograd.grad(out.loss, lp)
    assert torch.allclose(result.analytic, want, rtol=1e-14, atol=1e-17)
    assert bool((result.analytic != 0)[batch["response_mask"]].all())


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_every_stop_gradient_spelling_passes_the_formula_check(spelling: str) -> None:
    batch = _batch(1)
    check = check_gradient_formula(
        SPELLINGS[spelling], cispo_gradient, batch, wrt="logprobs", where=batch["response_mask"]
    )
    assert check.ok and check.formula_error < 0.1, check.summary()


def test_item_and_tolist_are_stop_gradients() -> None:
    x0 = torch.tensor([0.3, -1.2, 2.0], dtype=F64)

    def scaled(x: Tensor) -> Tensor:
        return (x.sum().item() * x).sum() + (torch.tensor(x.tolist(), dtype=F64) * x).sum()

    def grad(x: Tensor) -> Tensor:
        return x.sum() + x  # d/dx_i [c * sum x + sum(sg(x) x)] with c = sg(sum x)

    assert check_gradient_formula(scaled, grad, {"x": x0}, wrt="x").ok


class _Square(torch.autograd.Function):
    """``x^2`` with a hand-written backward ``2 x g`` (``scale`` 1) or a wrong one."""

    scale = 1.0

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        ctx.save_for_backward(x)
        return x.detach() * x.detach()  # the forward of a Function runs without gradient

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def]
        (x,) = ctx.saved_tensors
        return _Square.scale * 2 * x * g


def test_a_custom_function_forward_is_not_a_stop_gradient(monkeypatch: pytest.MonkeyPatch) -> None:
    x0 = {"x": torch.tensor([0.5, -1.5, 2.0], dtype=F64)}

    def fn(x: Tensor) -> Tensor:
        out: Tensor = _Square.apply(x).sum()  # type: ignore[no-untyped-call]
        return out

    def grad(x: Tensor) -> Tensor:
        return 2 * x

    assert check_gradient_formula(fn, grad, x0, wrt="x").ok
    monkeypatch.setattr(_Square, "scale", 1.01)
    with pytest.raises(VerificationError, match="fn's backward: autograd disagrees"):
        check_gradient_formula(fn, grad, x0, wrt="x")


@pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad=True")
def test_a_code_path_is_held_at_the_base_point_and_a_changed_one_is_named() -> None:
    x0 = torch.tensor([1e-9, 1.0], dtype=F64)

    def branchy(x: Tensor) -> Tensor:
        if float(x[0]) >= 0:  # float() is a cut: replayed, so x0 - h takes this branch too
            return (x * x).sum()
        return x.sum()

    assert check_gradient_formula(branchy, lambda x: 2 * x, {"x": x0}, wrt="x", step=1e-6).ok
    calls = [0]

    def drifting(x: Tensor) -> Tensor:  # another number of cuts on its second call
        calls[0] += 1
        return x.detach().sum() * x.sum() if calls[0] == 1 else (x * x).sum()

    with pytest.raises(CodePathChanged, match="another code path at a perturbed point"):
        check_gradient_formula(drifting, lambda x: 2 * x, {"x": x0}, wrt="x")


# ------------------------------------------------------------- any calling convention


def test_gradcheck_takes_the_returns_of_the_calling_convention() -> None:
    batch = _batch()

    def as_tuple(
        logprobs: T, old_logprobs: T, advantages: T, response_mask: T
    ) -> tuple[T, dict[str, float]]:
        return cispo_detach(logprobs, old_logprobs, advantages, response_mask), {"clipfrac": 0.0}

    def as_dict(**kwargs: Tensor) -> dict[str, Tensor]:
        return {"loss": cispo_detach(**_core(kwargs)), "entropy": torch.zeros(())}

    def reference(**kwargs: Tensor) -> object:
        return policy_loss(ALGORITHMS["cispo"].loss, **_core(kwargs))  # a PolicyLossOutput

    results = [gradcheck_policy_loss(f, **batch) for f in (as_tuple, as_dict, reference)]
    assert all(r.ok for r in results)
    assert torch.equal(results[0].analytic, results[2].analytic)
    assert gradcheck_policy_loss("cispo", **batch).ok  # a registry name too


def test_gradcheck_bad_callables_are_named() -> None:
    batch = _batch()
    with pytest.raises(InputError, match="takes no 'logprobs' parameter"):
        gradcheck_policy_loss(lambda response_mask: response_mask.sum(), **batch)
    with pytest.raises(InputError, match="required parameter 'beta'"):
        gradcheck_policy_loss(lambda logprobs, beta: logprobs.sum(), **batch)
    with pytest.raises(InputTypeError, match="returned float"):
        gradcheck_policy_loss(lambda logprobs: 1.0, **batch)
    with pytest.raises(InputTypeError, match="returned a tensor of shape"):
        gradcheck_policy_loss(lambda logprobs: logprobs, **batch)
    with pytest.raises(VerificationError, match="not differentiable in logprobs"):
        gradcheck_policy_loss(lambda logprobs: logprobs.detach().nansum(), **batch)
    with pytest.raises(InputTypeError, match="PolicyLossConfig, a registry name or a callable"):
        gradcheck_policy_loss(3, **batch)  # type: ignore[arg-type]


def test_train_optimises_the_bandit_with_the_users_own_loss() -> None:
    bandit = SoftmaxBandit(rewards=torch.tensor([0.0, 0.3, 1.0, 0.2]), ref_logits=torch.zeros(4))
    for fn in (cispo_no_grad, cispo_data):
        run = train(fn, bandit, steps=150, seed=0)
        assert run.best_arm_probability > 0.9 and int(torch.argmax(run.logits)) == 2
    same = train(ALGORITHMS["cispo"].loss, bandit, steps=20, seed=3)
    mine = train(cispo_torch_detach, bandit, steps=20, seed=3, advantage="cispo")
    assert torch.allclose(same.logits, mine.logits, rtol=1e-12, atol=1e-14)


# ------------------------------------------------------------------ padding is masked


def test_nan_padding_is_masked_by_where() -> None:
    """Before: ``where=`` multiplied by the mask, NaN * 0 = NaN, and every check failed
    with "nan x tol", the right loss and formula included."""
    batch = _batch()
    mask = batch["response_mask"]
    assert bool(torch.isnan(batch["logprobs"][~mask]).all())
    assert bool(torch.isnan(cispo_gradient(**batch)[~mask]).all())  # the formula reads padding
    check = check_gradient_formula(cispo_detach, cispo_gradient, batch, wrt="logprobs", where=mask)
    assert check.ok and math.isfinite(check.formula_error) and math.isfinite(check.autograd_error)
    assert bool((check.formula[~mask] == 0).all())


def test_a_loss_that_masks_by_multiplying_is_told_why_it_is_nan() -> None:
    def multiplies(logprobs: T, old_logprobs: T, advantages: T, response_mask: T) -> T:
        w = torch.exp(logprobs - old_logprobs).clamp(max=CAP).detach()
        per = -w * advantages[:, None] * logprobs * response_mask
        return per.sum() / response_mask.sum()

    with pytest.raises(VerificationError, match="NaN at padding, which a loss must not read"):
        gradcheck_policy_loss(multiplies, **_batch())
    garbage = _core(ragged_batch("cispo", seed=0, padding="garbage"))
    assert bool(torch.isfinite(garbage["logprobs"]).all())
    assert gradcheck_policy_loss(multiplies, **garbage).ok


def test_a_gradient_at_padding_fails_gradcheck() -> None:
    def leaks(logprobs: T, old_logprobs: T, advantages: T, response_mask: T) -> T:
        leak = 1e-3 * torch.where(response_mask, 0.0, logprobs.nan_to_num()).sum()
        return cispo_detach(logprobs, old_logprobs, advantages, response_mask) + leak

    garbage = _core(ragged_batch("cispo", seed=0, padding="garbage"))
    with pytest.raises(VerificationError, match=r"gradient at padding position .* not 0"):
        gradcheck_policy_loss(leaks, **garbage)


# --------------------------------------------------------------- the right party blamed


def test_a_missing_stop_gradient_is_named_as_such() -> None:
    """Before: blamed on "the formula (a wrong derivation?)"; the formula was right."""
    batch = _batch()
    with pytest.raises(VerificationError) as info:
        check_gradient_formula(
            cispo_no_stop_gradient, cispo_gradient, batch, wrt="logprobs",
            where=batch["response_mask"],
        )  # fmt: skip
    text = str(info.value)
    assert text.startswith("a missing stop-gradient in cispo_no_stop_gradient:")
    assert "clamp" in text and "test_verify_own_loss.py:" in text
    assert "wrong derivation" not in text.split("(formula vs")[0].split("or the derivation")[0]


def test_an_extra_stop_gradient_is_named_as_such() -> None:
    batch = _batch()

    def full_gradient(logprobs: T, old_logprobs: T, advantages: T, response_mask: T) -> T:
        r = torch.exp(logprobs - old_logprobs)
        inside = (r < CAP).to(F64)  # d min(r, 3) / d lp = r below the cap
        a = advantages[:, None]
        return (-r.clamp(max=CAP) * a - inside * r * a * logprobs) / response_mask.sum()

    with pytest.raises(VerificationError, match=r"^an extra stop-gradient in cispo_no_grad:"):
        check_gradient_formula(
            cispo_no_grad, full_gradient, batch, wrt="logprobs", where=batch["response_mask"]
        )
    assert check_gradient_formula(
        cispo_no_stop_gradient, full_gradient, batch, wrt="logprobs", where=batch["response_mask"]
    ).ok


def test_a_wrong_derivation_is_blamed_on_the_disagreement_not_a_stop_gradient() -> None:
    batch = _batch()

    def halved(**kw: Tensor) -> Tensor:
        return 0.5 * cispo_gradient(**_core(kw))

    with pytest.raises(VerificationError, match=r"^the formula and cispo_detach disagree"):
        check_gradient_formula(
            cispo_detach, halved, batch, wrt="logprobs", where=batch["response_mask"]
        )


# ------------------------------------------------------------- the worked example (docs)

PAGE = Path(__file__).resolve().parents[2] / "docs" / "derivations" / "own-loss.md"
FENCE = re.compile(r"^```(\w*)(.*)$")


def _page_blocks(text: str) -> list[tuple[str, str | None, list[str]]]:
    """``(language, title, lines)`` of every fenced block of a markdown page."""
    out: list[tuple[str, str | None, list[str]]] = []
    lines = iter(text.splitlines())
    for line in lines:
        m = FENCE.match(line)
        if m is None:
            continue
        title = re.search(r'title="([^"]+)"', m.group(2))
        body = list(itertools.takewhile(lambda x: not x.startswith("```"), lines))
        out.append((m.group(1), title.group(1) if title else None, body))
    return out


def _pattern(line: str) -> re.Pattern[str]:
    """A documented output line: ``*`` matches anything, the rest literally."""
    return re.compile(".*".join(re.escape(part) for part in line.split("*")))


def test_the_worked_example_runs_as_written(tmp_path: Path) -> None:
    """docs/derivations/own-loss.md: its files written as titled, the console block's
    ``python SCRIPT`` run as ``python SCRIPT`` would run it from that directory, and every
    output line shown printed, in order."""
    from tests.helpers.snippet_driver import run_scripts

    blocks = _page_blocks(PAGE.read_text())
    for _, title, body in blocks:
        if title is not None:
            (tmp_path / title).write_text("\n".join(body) + "\n")
    consoles = [body for lang, _, body in blocks if lang == "console"]
    assert len(consoles) == 1 and consoles[0][0].startswith("$ python ")
    script = consoles[0][0].removeprefix("$ python ").strip()
    printed = run_scripts([("own-loss", tmp_path / script, tmp_path, ())])["own-loss"]
    assert not printed.startswith("FAILED"), printed
    got = printed.splitlines()
    expected = consoles[0][1:]
    assert len(got) == len(expected), printed
    for want, line in zip(expected, got, strict=True):
        assert _pattern(want).fullmatch(line), f"documented:\n{want}\nprinted:\n{line}"
