"""Framework components other than policy losses, against the reference library.

verl 0.9.1 ``agg_loss``, ``kl_penalty``, advantage estimators and ``compute_value_loss``;
TRL 1.16.0 defaults; OpenRLHF 0.11.2 ``aggregate_loss``, ``compute_approx_kl`` and
``ValueLoss``. Equalities are checked in float64 on the canonical corpus and on seeded
ragged batches (value and gradient); each ``test_deviation_*`` demonstrates one row of
``pytest_polgrad.frameworks.DEVIATIONS`` and fails if the framework stops showing it.
(These components are compared directly until the kit's kl / aggregation / advantages /
value-loss kinds exist; see docs/frameworks.md.)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch

from polgrad_reference import (
    aggregate,
    clipped_value_loss,
    grpo_advantages,
    kl_estimate,
    rloo_advantages,
)
from polgrad_reference.advantages import opo_advantages
from pytest_polgrad.core.corpus import canonical_corpus
from pytest_polgrad.frameworks import openrlhf, trl, verl

F64 = torch.float64


def _ragged(seed: int, b: int = 5, t: int = 9) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    lengths[0] = t  # one full row, so T is the longest row
    mask = torch.arange(t)[None, :] < lengths[:, None]
    out = {
        "x": torch.randn((b, t), generator=g, dtype=F64),
        "lp": -torch.rand((b, t), generator=g, dtype=F64) * 3,
        "ref": torch.empty(0),  # set below: within 1 of lp, where no framework clamps k3
        "mask": mask,
    }
    out["ref"] = out["lp"] + (torch.rand((b, t), generator=g, dtype=F64) * 2 - 1)
    return out


def _batches() -> list[dict[str, torch.Tensor]]:
    out = [_ragged(seed) for seed in range(4)]
    for batch in canonical_corpus(dtype=F64).values():
        out.append(
            {
                "x": batch["logprobs"] - batch["old_logprobs"],
                "lp": batch["logprobs"],
                "ref": batch["ref_logprobs"],
                "mask": batch["response_mask"],
            }
        )
    return out


def _value_and_grad(fn: Any, x: torch.Tensor) -> tuple[float, torch.Tensor]:
    x = x.detach().clone().requires_grad_(True)
    out = fn(x)
    (grad,) = torch.autograd.grad(out, x)
    return float(out), grad


# --------------------------------------------------------------------------- aggregation

_VERL_MODES = {
    "token-mean": "token-mean",
    "token-sum": "token-sum",
    "seq-mean-token-sum": "seq-mean-token-sum",
    "seq-mean-token-mean": "seq-mean-token-mean",
}


@pytest.mark.parametrize("verl_mode", sorted(_VERL_MODES))
def test_verl_agg_loss_equals_reference_aggregation(verl_mode: str) -> None:
    for batch in _batches():
        mask = batch["mask"]
        v_val, v_grad = _value_and_grad(
            lambda x, m=mask: verl.agg_loss(loss_mat=x, loss_mask=m, loss_agg_mode=verl_mode),
            batch["x"],
        )
        r_val, r_grad = _value_and_grad(
            lambda x, m=mask: aggregate(x, response_mask=m, mode=_VERL_MODES[verl_mode]),
            batch["x"],
        )
        assert v_val == pytest.approx(r_val, rel=1e-12, abs=1e-14)
        torch.testing.assert_close(v_grad, r_grad, rtol=1e-12, atol=1e-14)


def test_verl_token_sum_norm_with_scale_factor_is_dr_grpo() -> None:
    for batch in _batches():
        mask = batch["mask"]
        v_val, v_grad = _value_and_grad(
            lambda x, m=mask: verl.agg_loss(
                loss_mat=x,
                loss_mask=m,
                loss_agg_mode="seq-mean-token-sum-norm",
                loss_scale_factor=4096,
            ),
            batch["x"],
        )
        r_val, r_grad = _value_and_grad(
            lambda x, m=mask: aggregate(x, response_mask=m, mode="token-sum-norm", budget=4096),
            batch["x"],
        )
        assert v_val == pytest.approx(r_val, rel=1e-12, abs=1e-16)
        torch.testing.assert_close(v_grad, r_grad, rtol=1e-12, atol=1e-16)


def test_deviation_verl_token_sum_norm_divides_by_padded_width() -> None:
    batch = _ragged(0)
    x, mask = batch["x"], batch["mask"]
    width = mask.shape[1]
    default = float(
        verl.agg_loss(loss_mat=x, loss_mask=mask, loss_agg_mode="seq-mean-token-sum-norm")
    )
    assert default == pytest.approx(
        float(aggregate(x, response_mask=mask, mode="token-sum-norm", budget=width)), rel=1e-12
    )
    pad = torch.zeros((x.shape[0], 3), dtype=F64)
    wider = float(
        verl.agg_loss(
            loss_mat=torch.cat([x, pad], 1),
            loss_mask=torch.cat([mask, pad.bool()], 1),
            loss_agg_mode="seq-mean-token-sum-norm",
        )
    )
    assert wider == pytest.approx(default * width / (width + 3), rel=1e-12)


@pytest.mark.parametrize("token_level", [True, False])
def test_openrlhf_aggregate_loss_equals_reference(token_level: bool) -> None:
    mode = "token-mean" if token_level else "seq-mean-token-mean"
    for batch in _batches():
        mask = batch["mask"]
        o_val, o_grad = _value_and_grad(
            lambda x, m=mask: openrlhf.aggregate_loss(
                loss=x, loss_mask=m.to(F64), token_level_loss=token_level
            ),
            batch["x"],
        )
        r_val, r_grad = _value_and_grad(
            lambda x, m=mask: aggregate(x, response_mask=m, mode=mode), batch["x"]
        )
        # OpenRLHF's sequence mode divides each row by (L + 1e-8): a relative 1e-8 / L.
        assert o_val == pytest.approx(r_val, rel=1e-7, abs=1e-14)
        torch.testing.assert_close(o_grad, r_grad, rtol=1e-7, atol=1e-14)


# ---------------------------------------------------------------------------- empty rows


def _with_empty_row() -> tuple[torch.Tensor, torch.Tensor]:
    batch = _ragged(1, b=4)
    mask = batch["mask"].clone()
    mask[2] = False
    return batch["x"], mask


def test_deviation_empty_rows_verl_and_openrlhf_drop_them_trl_counts_them() -> None:
    x, mask = _with_empty_row()
    nonempty = mask.any(1)
    paper = float(aggregate(x[nonempty], response_mask=mask[nonempty], mode="seq-mean-token-mean"))
    v = float(verl.agg_loss(loss_mat=x, loss_mask=mask, loss_agg_mode="seq-mean-token-mean"))
    o = float(openrlhf.aggregate_loss(loss=x, loss_mask=mask.to(F64), token_level_loss=False))
    assert v == pytest.approx(paper, rel=1e-12)
    assert o == pytest.approx(paper, rel=1e-7)
    # TRL's grpo loss divides each row by max(L, 1) and averages over all B rows: the empty
    # row counts as a zero in the batch mean.
    lp = torch.zeros_like(x)
    adv = torch.tensor([1.0, -0.5, 2.0, 0.25], dtype=F64)
    t = float(
        trl.grpo_loss(loss_type="grpo")(
            logprobs=lp, old_logprobs=lp, advantages=adv, response_mask=mask
        )
    )
    on_policy_rows = -adv[nonempty]
    assert t == pytest.approx(float(on_policy_rows.sum() / 4), rel=1e-12)
    assert t != pytest.approx(float(on_policy_rows.mean()), rel=1e-6)


# ------------------------------------------------------------------------------------ KL


@pytest.mark.parametrize("name", ["k1", "k2", "k3", "low_var_kl", "mse", "kl"])
def test_verl_kl_penalty_equals_reference_in_range(name: str) -> None:
    base = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}.get(name, name)
    for batch in _batches():
        mask = batch["mask"]
        v_val, v_grad = _value_and_grad(
            lambda lp, m=mask, b=batch: (
                verl.kl_penalty(logprobs=lp, ref_logprobs=b["ref"], kl_penalty=name) * m
            ).sum(),
            batch["lp"],
        )
        r_val, r_grad = _value_and_grad(
            lambda lp, m=mask, b=batch: kl_estimate(
                base, logprobs=lp, ref_logprobs=b["ref"], response_mask=m
            ).sum(),
            batch["lp"],
        )
        assert v_val == pytest.approx(r_val, rel=1e-12, abs=1e-14)
        torch.testing.assert_close(v_grad * batch["mask"], r_grad, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("name", ["k1+", "k3+"])
def test_verl_straight_through_kl_equals_reference(name: str) -> None:
    for batch in _batches():
        mask = batch["mask"]
        v_val, v_grad = _value_and_grad(
            lambda lp, m=mask, b=batch: (
                verl.kl_penalty(logprobs=lp, ref_logprobs=b["ref"], kl_penalty=name) * m
            ).sum(),
            batch["lp"],
        )
        r_val, r_grad = _value_and_grad(
            lambda lp, m=mask, b=batch: kl_estimate(
                name, logprobs=lp, ref_logprobs=b["ref"], response_mask=m
            ).sum(),
            batch["lp"],
        )
        assert v_val == pytest.approx(r_val, rel=1e-12, abs=1e-14)
        torch.testing.assert_close(v_grad * batch["mask"], r_grad, rtol=1e-10, atol=1e-14)


def test_deviation_verl_k3_is_clamped_at_10() -> None:
    lp = torch.tensor([[-8.0, -1.0]], dtype=F64)
    ref = torch.tensor([[-1.0, -1.2]], dtype=F64)  # ref - lp = 7: k3 = e^7 - 8 ~ 1089
    mask = torch.ones_like(lp, dtype=torch.bool)
    exact = kl_estimate("k3", logprobs=lp, ref_logprobs=ref, response_mask=mask)
    shipped = verl.kl_penalty(logprobs=lp, ref_logprobs=ref, kl_penalty="k3")
    assert float(exact[0, 0]) > 1000.0
    assert float(shipped[0, 0]) == 10.0
    assert float(shipped[0, 1]) == pytest.approx(float(exact[0, 1]), rel=1e-12)


@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
def test_openrlhf_approx_kl_equals_reference_in_range(name: str) -> None:
    for batch in _batches():
        mask = batch["mask"]
        o = openrlhf.approx_kl(logprobs=batch["lp"], ref_logprobs=batch["ref"], kl_estimator=name)
        r = kl_estimate(name, logprobs=batch["lp"], ref_logprobs=batch["ref"], response_mask=mask)
        # compute_approx_kl casts its inputs to float32 (log_probs.float()).
        assert o.dtype == torch.float32
        torch.testing.assert_close((o.double() * mask), r, rtol=2e-6, atol=1e-6)


def test_deviation_openrlhf_k1_is_clamped_at_10() -> None:
    lp = torch.tensor([[-0.5, -1.0, -14.0]], dtype=F64)
    ref = torch.tensor([[-13.0, -1.2, -1.0]], dtype=F64)  # log-ratios 12.5, 0.2, -13
    mask = torch.ones_like(lp, dtype=torch.bool)
    exact = kl_estimate("k1", logprobs=lp, ref_logprobs=ref, response_mask=mask)
    shipped = openrlhf.approx_kl(logprobs=lp, ref_logprobs=ref, kl_estimator="k1")
    assert exact[0].tolist() == pytest.approx([12.5, 0.2, -13.0])
    assert shipped[0].tolist() == pytest.approx([10.0, 0.2, -10.0], rel=1e-6)


def test_deviation_openrlhf_k3_is_clamped_at_10() -> None:
    lp = torch.tensor([[-8.0, -1.0]], dtype=F64)
    ref = torch.tensor([[-1.0, -1.2]], dtype=F64)
    mask = torch.ones_like(lp, dtype=torch.bool)
    exact = kl_estimate("k3", logprobs=lp, ref_logprobs=ref, response_mask=mask)
    shipped = openrlhf.approx_kl(logprobs=lp, ref_logprobs=ref, kl_estimator="k3")
    assert float(exact[0, 0]) > 1000.0
    assert float(shipped[0, 0]) == 10.0


def test_openrlhf_unbiased_gradient_is_ratio_weighted_k1_score() -> None:
    # unbiased_gradient=True: value of the estimator, gradient w * (logprobs - ref) with
    # w = exp(logprobs - old) detached: the reverse-KL score-function gradient.
    batch = _ragged(2)
    old = batch["lp"] - 0.1
    lp = batch["lp"].clone().float().requires_grad_(True)
    out = openrlhf.approx_kl(
        logprobs=lp,
        ref_logprobs=batch["ref"],
        old_logprobs=old,
        kl_estimator="k3",
        unbiased_gradient=True,
    )
    (grad,) = torch.autograd.grad(out.sum(), lp)
    w = torch.exp(batch["lp"] - old)
    expected = w * (batch["lp"] - batch["ref"])
    torch.testing.assert_close(grad.double(), expected, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------- advantages


_ONE_PLUS_EPS_F32 = float(torch.tensor(1.0) + 1e-6)  # verl adds eps to a float32 std of 1


def _groups(seed: int) -> tuple[torch.Tensor, np.ndarray, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    sizes = [4, 3, 1, 2]
    ids = np.array([i for i, n in enumerate(sizes) for _ in range(n)])
    rewards = torch.randn(len(ids), generator=g, dtype=F64)
    rewards[4:7] = torch.tensor([1.0, 0.0, 1.0], dtype=F64)  # ties
    b = len(ids)
    lengths = torch.randint(1, 7, (b,), generator=g)
    mask = torch.arange(6)[None, :] < lengths[:, None]
    return rewards, ids, mask


def _row_values(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    rows = (adv * mask).sum(1) / mask.sum(1)
    torch.testing.assert_close(adv * mask, rows[:, None] * mask)  # constant along the row
    return rows


@pytest.mark.parametrize("scale", [True, False])
def test_verl_grpo_advantages_equal_reference(scale: bool) -> None:
    for seed in range(3):
        rewards, ids, mask = _groups(seed)
        shipped = verl.compute_advantage(
            "grpo", rewards=rewards, response_mask=mask, index=ids, norm_adv_by_std_in_grpo=scale
        )
        expected = grpo_advantages(
            rewards=rewards,
            group_ids=torch.as_tensor(ids),
            scale_by_std=scale,
            std_eps=1e-6,
            unbiased_std=True,
            singleton="raw",
        )
        rows = _row_values(shipped, mask)
        grouped = torch.as_tensor(ids != 2)  # the group of size one is checked below
        torch.testing.assert_close(rows[grouped], expected[grouped], rtol=1e-12, atol=1e-12)
        # verl: mean 0 and std 1 for a lone sample, so r / (1 + eps) (r when not scaled);
        # its std placeholder is torch.tensor(1.0), float32, so 1 + eps is rounded to float32.
        lone = float(rewards[~grouped]) / (_ONE_PLUS_EPS_F32 if scale else 1.0)
        assert float(rows[~grouped]) == pytest.approx(lone, rel=1e-14)


def test_deviation_verl_grpo_singleton_group_keeps_its_reward() -> None:
    rewards, ids, mask = _groups(0)
    shipped = _row_values(
        verl.compute_advantage("grpo", rewards=rewards, response_mask=mask, index=ids), mask
    )
    lone = 7  # the group of size one
    assert float(shipped[lone]) == pytest.approx(
        float(rewards[lone]) / _ONE_PLUS_EPS_F32, rel=1e-14
    )
    paper = grpo_advantages(rewards=rewards, group_ids=torch.as_tensor(ids))
    assert float(paper[lone]) == 0.0
    assert float(rewards[lone]) != 0.0


def test_verl_rloo_advantages_equal_reference() -> None:
    for seed in range(3):
        rewards, ids, mask = _groups(seed)
        shipped = verl.compute_advantage("rloo", rewards=rewards, response_mask=mask, index=ids)
        expected = rloo_advantages(rewards=rewards, group_ids=torch.as_tensor(ids), singleton="raw")
        torch.testing.assert_close(_row_values(shipped, mask), expected, rtol=1e-12, atol=1e-12)


def test_verl_opo_advantages_equal_reference() -> None:
    for seed in range(3):
        rewards, ids, mask = _groups(seed)
        shipped = verl.compute_advantage("opo", rewards=rewards, response_mask=mask, index=ids)
        expected = opo_advantages(
            rewards=rewards, response_mask=mask, group_ids=torch.as_tensor(ids), singleton="raw"
        )
        torch.testing.assert_close(_row_values(shipped, mask), expected, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------- value loss


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_verl_value_loss_equals_reference(mode: str) -> None:
    for seed in range(3):
        b = _ragged(seed)
        old = b["x"] + 0.3 * b["ref"]
        returns = b["x"] - b["lp"]
        v_val, v_grad = _value_and_grad(
            lambda v, b=b, old=old, ret=returns: verl.value_loss(
                values=v,
                old_values=old,
                returns=ret,
                response_mask=b["mask"],
                cliprange_value=0.2,
                loss_agg_mode=mode,
            ),
            b["x"],
        )
        r_val, r_grad = _value_and_grad(
            lambda v, b=b, old=old, ret=returns: clipped_value_loss(
                values=v,
                old_values=old,
                returns=ret,
                response_mask=b["mask"],
                clip_range=0.2,
                mode=mode,
            ),
            b["x"],
        )
        assert v_val == pytest.approx(r_val, rel=1e-12)
        torch.testing.assert_close(v_grad, r_grad, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("clip", [None, 0.2])
def test_openrlhf_value_loss_equals_reference(clip: float | None) -> None:
    for seed in range(3):
        b = _ragged(seed)
        old = b["x"] + 0.3 * b["ref"]
        returns = b["x"] - b["lp"]
        o_val, o_grad = _value_and_grad(
            lambda v, b=b, old=old, ret=returns: openrlhf.value_loss(
                values=v,
                old_values=old,
                returns=ret,
                response_mask=b["mask"].to(F64),
                clip_eps=clip,
            ),
            b["x"],
        )
        r_val, r_grad = _value_and_grad(
            lambda v, b=b, old=old, ret=returns: clipped_value_loss(
                values=v, old_values=old, returns=ret, response_mask=b["mask"], clip_range=clip
            ),
            b["x"],
        )
        assert o_val == pytest.approx(r_val, rel=1e-12)
        torch.testing.assert_close(o_grad, r_grad, rtol=1e-12, atol=1e-14)


# ----------------------------------------------------------------- options and defaults


def test_deviation_verl_sapo_ignores_loss_agg_mode() -> None:
    batch = canonical_corpus(dtype=F64, advantages="token")["ragged"]
    kw = {k: batch[k] for k in ("logprobs", "old_logprobs", "advantages", "response_mask")}
    sapo = {
        m: float(verl.policy_loss("sapo", loss_agg_mode=m)(**kw))
        for m in ("token-mean", "seq-mean-token-mean", "token-sum")
    }
    gspo = {
        m: float(verl.policy_loss("gspo", loss_agg_mode=m)(**kw))
        for m in ("token-mean", "seq-mean-token-mean", "token-sum")
    }
    assert len(set(sapo.values())) == 1, sapo  # always seq-mean-token-mean
    assert len(set(gspo.values())) == 3, gspo  # gspo does apply the mode


def test_deviation_trl_docstring_names_another_default_is_mode() -> None:
    from trl import GRPOConfig

    field = {f.name: f for f in dataclasses.fields(GRPOConfig)}["vllm_importance_sampling_mode"]
    assert field.default == "sequence_mask"
    doc = GRPOConfig.__doc__ or ""
    line = next(s for s in doc.splitlines() if '"token_truncate"' in s)
    assert "(default)" in line


def test_deviation_verl_clip_cov_selection_is_random() -> None:
    # Clip-Cov (arXiv:2505.22617) detaches a random subset of the tokens whose covariance
    # lies in [clip_cov_lb, clip_cov_ub]; verl draws it with torch.randperm from the global
    # generator, so two calls on the same batch differ unless the caller seeds torch.
    g = torch.Generator().manual_seed(0)
    b, t = 8, 64
    adv = torch.randn((b, t), generator=g, dtype=F64) * 3
    lp = -torch.rand((b, t), generator=g, dtype=F64) * 3
    mask = torch.ones((b, t), dtype=torch.bool)
    fn = verl.policy_loss(
        "clip_cov", loss_agg_mode="token-mean", policy_loss={"clip_cov_ratio": 0.05}
    )
    kw = {"logprobs": lp, "old_logprobs": lp, "advantages": adv, "response_mask": mask}
    torch.manual_seed(1)
    first = float(fn(**kw))
    torch.manual_seed(2)
    second = float(fn(**kw))
    torch.manual_seed(1)
    again = float(fn(**kw))
    assert first != second
    assert first == again
