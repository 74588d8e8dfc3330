"""verl 0.9.1 and OpenRLHF 0.11.2 aggregation, KL and advantage functions marked with the
kit's ``aggregation``, ``kl`` and ``advantages`` kinds (the framework options set are in
each function's body; docs/frameworks.md lists them)."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_polgrad.frameworks import openrlhf, verl

_WIDTH = (
    "verl's seq-mean-token-sum-norm divides by loss_mask.shape[-1] unless loss_scale_factor is set"
)

# ---------------------------------------------------------------------------- aggregation


@pytest.mark.polgrad_conforms("token-mean", kind="aggregation")
def verl_agg_token_mean(loss_mat: Any, loss_mask: Any) -> Any:
    return verl.agg_loss(loss_mat=loss_mat, loss_mask=loss_mask, loss_agg_mode="token-mean")


@pytest.mark.polgrad_conforms("token-sum", kind="aggregation")
def verl_agg_token_sum(loss_mat: Any, loss_mask: Any) -> Any:
    return verl.agg_loss(loss_mat=loss_mat, loss_mask=loss_mask, loss_agg_mode="token-sum")


@pytest.mark.polgrad_conforms("seq-mean-token-sum", kind="aggregation")
def verl_agg_seq_mean_token_sum(loss_mat: Any, loss_mask: Any) -> Any:
    return verl.agg_loss(loss_mat=loss_mat, loss_mask=loss_mask, loss_agg_mode="seq-mean-token-sum")


@pytest.mark.polgrad_conforms("seq-mean-token-mean", kind="aggregation")
def verl_agg_seq_mean_token_mean(loss_mat: Any, loss_mask: Any) -> Any:
    return verl.agg_loss(
        loss_mat=loss_mat, loss_mask=loss_mask, loss_agg_mode="seq-mean-token-mean"
    )


@pytest.mark.polgrad_conforms("token-sum-norm", kind="aggregation", budget=4096)
def verl_agg_token_sum_norm_fixed(loss_mat: Any, loss_mask: Any) -> Any:
    return verl.agg_loss(
        loss_mat=loss_mat,
        loss_mask=loss_mask,
        loss_agg_mode="seq-mean-token-sum-norm",
        loss_scale_factor=4096,
    )


@pytest.mark.polgrad_conforms(
    "token-sum-norm",
    kind="aggregation",
    budget=4096,
    expect={"value": _WIDTH, "gradient": _WIDTH, "padding-columns": _WIDTH},
)
def verl_agg_token_sum_norm_default(loss_mat: Any, loss_mask: Any) -> Any:
    return verl.agg_loss(
        loss_mat=loss_mat, loss_mask=loss_mask, loss_agg_mode="seq-mean-token-sum-norm"
    )


@pytest.mark.polgrad_conforms("token-mean", kind="aggregation")
def openrlhf_aggregate_token_level(losses: Any, loss_mask: Any) -> Any:
    return openrlhf.aggregate_loss(loss=losses, loss_mask=loss_mask, token_level_loss=True)


@pytest.mark.polgrad_conforms("seq-mean-token-mean", kind="aggregation")
def openrlhf_aggregate_sequence_level(losses: Any, loss_mask: Any) -> Any:
    return openrlhf.aggregate_loss(loss=losses, loss_mask=loss_mask, token_level_loss=False)


# -------------------------------------------------------------------------------------- KL


@pytest.mark.polgrad_conforms("k1", kind="kl")
def verl_kl_k1(logprob: Any, ref_logprob: Any) -> Any:
    return verl.kl_penalty(logprobs=logprob, ref_logprobs=ref_logprob, kl_penalty="k1")


@pytest.mark.polgrad_conforms("k2", kind="kl")
def verl_kl_k2(logprob: Any, ref_logprob: Any) -> Any:
    return verl.kl_penalty(logprobs=logprob, ref_logprobs=ref_logprob, kl_penalty="k2")


@pytest.mark.polgrad_conforms("k3", kind="kl", clamp=10.0)
def verl_kl_low_var_kl(logprob: Any, ref_logprob: Any) -> Any:
    return verl.kl_penalty(logprobs=logprob, ref_logprobs=ref_logprob, kl_penalty="low_var_kl")


@pytest.mark.polgrad_conforms("k3+", kind="kl", clamp=10.0)
def verl_kl_k3_straight_through(logprob: Any, ref_logprob: Any) -> Any:
    return verl.kl_penalty(logprobs=logprob, ref_logprobs=ref_logprob, kl_penalty="k3+")


_K1_CLAMP = "compute_approx_kl clamps every estimator's value to [-10, 10], k1 included"


@pytest.mark.polgrad_conforms("k1", kind="kl", expect={"value": _K1_CLAMP, "gradient": _K1_CLAMP})
def openrlhf_kl_k1(log_probs: Any, ref_log_probs: Any) -> Any:
    return openrlhf.approx_kl(logprobs=log_probs, ref_logprobs=ref_log_probs, kl_estimator="k1")


@pytest.mark.polgrad_conforms("k3", kind="kl", clamp=10.0)
def openrlhf_kl_k3(log_probs: Any, ref_log_probs: Any) -> Any:
    return openrlhf.approx_kl(logprobs=log_probs, ref_logprobs=ref_log_probs, kl_estimator="k3")


# ------------------------------------------------------------------------------ advantages


def _index(group_ids: Any) -> Any:
    return group_ids.numpy()  # verl's `uid` column is a numpy array of group ids


@pytest.mark.polgrad_conforms("grpo", kind="advantages", singleton="raw")
def verl_grpo_advantages(rewards: Any, group_ids: Any, response_mask: Any) -> Any:
    return verl.compute_advantage(
        "grpo", rewards=rewards, response_mask=response_mask, index=_index(group_ids)
    )


@pytest.mark.polgrad_conforms("dr_grpo", kind="advantages", singleton="raw")
def verl_grpo_advantages_unscaled(rewards: Any, group_ids: Any, response_mask: Any) -> Any:
    return verl.compute_advantage(
        "grpo",
        rewards=rewards,
        response_mask=response_mask,
        index=_index(group_ids),
        norm_adv_by_std_in_grpo=False,
    )


@pytest.mark.polgrad_conforms("rloo", kind="advantages", singleton="raw")
def verl_rloo_advantages(rewards: Any, group_ids: Any, response_mask: Any) -> Any:
    return verl.compute_advantage(
        "rloo", rewards=rewards, response_mask=response_mask, index=_index(group_ids)
    )
