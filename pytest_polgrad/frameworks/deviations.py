"""The DEVIATIONS table: differences between published equations and shipped defaults.

Each entry names the framework release, the component, a neutral description (what the
shipped code computes next to what the source equation says; not a bug report: these are
defensible engineering choices that are otherwise invisible to the person training a
model) and the node id of the test in ``tests/frameworks/`` that demonstrates it on the
installed package. The frameworks tier fails unless every node id is collected and passes
(``tests/frameworks/conftest.py``; an expected failure declared with ``expect=`` passes).
"""

from __future__ import annotations

import dataclasses

__all__ = ["DEVIATIONS", "Deviation"]


@dataclasses.dataclass(frozen=True)
class Deviation:
    """A demonstrated difference between a published equation and a shipped default."""

    framework: str
    version: str
    component: str
    description: str
    nodeid: str


_P = "tests/frameworks/test_verl_policy_losses.py::"
_T = "tests/frameworks/test_trl_grpo_loss.py::"
_O = "tests/frameworks/test_openrlhf_policy_loss.py::"
_C = "tests/frameworks/test_all_components.py::"
_K = "tests/frameworks/test_all_kinds.py::"
_S = "tests/frameworks/test_all_training_steps.py::"
_L = "tests/frameworks/test_all_logprobs.py::"
_G = "tests/frameworks/test_all_distributed_steps.py::"

DEVIATIONS: tuple[Deviation, ...] = (
    Deviation(
        "verl",
        "0.9.1",
        "core_algos.compute_policy_loss_vanilla (ActorConfig defaults)",
        "the default loss_agg_mode is token-mean over the micro-batch's (or, with "
        "global_batch_info, the step's) response tokens; the GRPO objective (arXiv:2402.03300 "
        "Eq. 3) averages each sequence's tokens, then the sequences",
        _P + "verl_vanilla[grpo-value]",
    ),
    Deviation(
        "verl",
        "0.9.1",
        "core_algos.compute_policy_loss_vanilla",
        "the dual-clip floor -c*A (arXiv:1912.09729 Eq. 5) is applied to every A < 0 token "
        "with c = clip_ratio_c = 3.0; PPO's and GRPO's clipped surrogate has no such floor",
        _P + "verl_vanilla_seq_mean_token_mean[grpo-value]",
    ),
    Deviation(
        "verl",
        "0.9.1",
        "core_algos.agg_loss('seq-mean-token-sum-norm')",
        "without loss_scale_factor the sum is divided by the padded width "
        "loss_mask.shape[-1]; Dr.GRPO (arXiv:2503.20783 Sec. 3.1, released code) divides by "
        "a fixed generation budget, so appending padding columns changes verl's loss",
        _P + "verl_vanilla_token_sum_norm_default[dr_grpo-padding-columns]",
    ),
    Deviation(
        "verl",
        "0.9.1",
        "core_algos.agg_loss('seq-mean-token-sum-norm'), aggregation kind",
        "the same padded-width normaliser seen by the aggregation kind: the token weights are "
        "1 / (B * T_padded) instead of 1 / (B * budget)",
        _K + "verl_agg_token_sum_norm_default[token-sum-norm-padding-columns]",
    ),
    Deviation(
        "verl",
        "0.9.1",
        "core_algos.compute_policy_loss_gspo",
        "the GSPO-token ratio (arXiv:2507.18071 Eq. 13) aggregated with the actor's "
        "loss_agg_mode (default token-mean) and clipped with clip_ratio (default 0.2); GSPO "
        "averages per sequence and clips at 1 - 3e-4 / 1 + 4e-4 (Sec. 5.1)",
        _P + "verl_gspo[gspo_token-value]",
    ),
    Deviation(
        "verl",
        "0.9.1",
        "core_algos.compute_policy_loss_dppo_tv / dppo_kl",
        "the truncated IS weight is capped at ActorConfig.clip_ratio_c, whose default is 3.0 "
        "(the dual-clip constant); DPPO (arXiv:2602.04879 Sec. 5.4) recommends a large cap, "
        "and the function's own fallback of 20 is used only without that field",
        _P + "verl_dppo_tv[dppo_tv-value]",
    ),
    Deviation(
        "verl",
        "0.9.1",
        "core_algos.compute_policy_loss_sapo",
        "sapo always aggregates seq-mean-token-mean; the loss_agg_mode it is given is not "
        "applied (gspo, by contrast, applies it)",
        _C + "test_deviation_verl_sapo_ignores_loss_agg_mode",
    ),
    Deviation(
        "verl",
        "0.9.1",
        "core_algos.compute_policy_loss_cispo",
        "the IS weight is clamped to [1 - clip_ratio_low, 1 + clip_ratio_high] (default "
        "[0.8, 1.2]); CISPO (arXiv:2506.13585 Eq. 4, Sec. 3.1) bounds it from above only",
        _P + "verl_cispo[cispo-value]",
    ),
    Deviation(
        "verl",
        "0.9.1",
        "core_algos.kl_penalty('low_var_kl' / 'k3')",
        "the k3 estimate is clamped to [-10, 10] (and the log-ratio to [-20, 20]); k3 = "
        "r - 1 - log r (Schulman 2020) is unbounded",
        _C + "test_deviation_verl_k3_is_clamped_at_10",
    ),
    Deviation(
        "verl",
        "0.9.1",
        "core_algos.compute_grpo_outcome_advantage",
        "a group of one sample keeps its raw reward (mean 0, std 1, so r / (1 + eps)); the "
        "group-relative advantage of GRPO (arXiv:2402.03300 Sec. 4.1.2) of a lone sample is 0",
        _C + "test_deviation_verl_grpo_singleton_group_keeps_its_reward",
    ),
    Deviation(
        "verl",
        "0.9.1",
        "core_algos.compute_policy_loss_clip_cov",
        "the detached tokens are a random subset (torch.randperm on the global generator) of "
        "those whose covariance lies in [clip_cov_lb, clip_cov_ub] (arXiv:2505.22617 "
        "Clip-Cov); the loss of a batch depends on torch's global RNG state",
        _C + "test_deviation_verl_clip_cov_selection_is_random",
    ),
    Deviation(
        "verl",
        "0.9.1",
        "core_algos.compute_policy_loss_geo_mean, accumulation",
        "the GMPO loss (arXiv:2507.20673 Eq. 6) ends in torch.mean over the micro-batch's rows "
        "and ignores global_batch_info, so the accumulated gradient of a step split into "
        "micro-batches is a multiple of the full-batch one",
        _S + "verl_geo_mean_step[gmpo-micro-batches]",
    ),
    Deviation(
        "verl",
        "0.9.1",
        "core_algos.compute_policy_loss_geo_mean, data-parallel ranks",
        "the same per-micro-batch torch.mean when the step is split over data-parallel ranks "
        "(uneven ones included): each rank's loss is the mean over its own rows, so the "
        "averaged gradient is not the full batch's GMPO gradient (arXiv:2507.20673 Eq. 6)",
        _S + "verl_geo_mean_step[gmpo-data-parallel]",
    ),
    Deviation(
        "verl",
        "0.9.1",
        "core_algos.compute_policy_loss_geo_mean, steps_per_generation",
        "the same per-micro-batch torch.mean when a generation batch is split into several "
        "optimizer steps: each step's summed gradient is a multiple of that step's full-batch "
        "one, whatever global_batch_info says",
        _S + "verl_geo_mean_step[gmpo-generation-steps]",
    ),
    Deviation(
        "verl",
        "0.9.1",
        "core_algos.compute_policy_loss_geo_mean, accumulation on a real DDP group",
        "the same per-micro-batch torch.mean on 2 gloo ranks under DistributedDataParallel: "
        "the step's gradient after DDP's average is a multiple of the full-batch one, as on "
        "the simulated ranks",
        _G + "verl_geo_mean_ddp[gmpo-data-parallel]",
    ),
    Deviation(
        "verl",
        "0.9.1",
        "verl.utils.torch_functional.logprobs_from_logits (no flash-attn: logprobs_from_logits_v2)",
        "bfloat16 logits go through log_softmax in bfloat16; float32 logits through logsumexp. "
        "The logprob of the sampled token is then off by up to ~0.1 nats against a float32 "
        "log-softmax of the same logits (docs/logprobs.md, Precision)",
        _L + "verl_logprobs_bf16[aligned-float32-log-softmax]",
    ),
    Deviation(
        "verl",
        "0.9.1",
        "verl.utils.torch_functional.log_probs_from_logits_response_rmpad (use_remove_padding)",
        "the packed ids are rolled by -1 over the whole stream (torch.roll), so each "
        "sequence's last position scores the next sequence's first token; verl drops that "
        "position after pad_input, so no response token uses it (verl #6475 is the case "
        "where one did)",
        _L + "verl_logprobs_rmpad[next-token-rolled-packed-boundary]",
    ),
    Deviation(
        "verl, trl, openrlhf",
        "0.9.1, 1.16.0, 0.11.2",
        "sequence-mean aggregation, empty rows",
        "a row without response tokens: verl (agg_loss) and OpenRLHF (aggregate_loss) leave it "
        "out of the sequence mean, TRL's grpo loss counts it as a zero in the mean over B",
        _C + "test_deviation_empty_rows_verl_and_openrlhf_drop_them_trl_counts_them",
    ),
    Deviation(
        "trl",
        "1.16.0",
        "GRPOTrainer._compute_loss (GRPOConfig defaults)",
        "the default loss_type 'dapo' is token-mean with epsilon_high = epsilon = 0.2; DAPO "
        "(arXiv:2503.14476 Sec. 3.1) clips higher at 1 + 0.28, and GRPO averages per sequence",
        _T + "trl_default[dapo-value]",
    ),
    Deviation(
        "trl",
        "1.16.0",
        "GRPOTrainer._compute_loss(loss_type='cispo')",
        "the IS weight is capped at epsilon_high itself (clamp(ratio, max=epsilon_high)); "
        "CISPO's cap is 1 + eps_high (arXiv:2506.13585 Eq. 4)",
        _T + "trl_cispo[cispo-value]",
    ),
    Deviation(
        "trl",
        "1.16.0",
        "GRPOTrainer._compute_loss (beta > 0, use_bias_correction_kl)",
        "the k3 term is multiplied by the undetached policy ratio by default, which changes "
        "its gradient even on-policy; GRPO (arXiv:2402.03300 Eq. 4) adds k3 itself",
        _T + "trl_grpo_kl_bias_corrected[grpo-gradient]",
    ),
    Deviation(
        "trl",
        "1.16.0",
        "GRPOTrainer._compute_loss (beta > 0, use_bias_correction_kl), value",
        "the KL term is r * k3 with r = pi / pi_old; GRPO's (arXiv:2402.03300 Eq. 4) is k3, "
        "so the loss differs wherever the ratio is not 1",
        _T + "trl_grpo_kl_bias_corrected[grpo-value]",
    ),
    Deviation(
        "trl",
        "1.16.0",
        "GRPOTrainer._compute_loss (beta > 0, use_bias_correction_kl), on-policy",
        "at r = 1 the loss equals GRPO's, but d(r k3)/d log pi = k3 + d k3/d log pi: the "
        "on-policy gradient carries beta * k3 at every token on top of GRPO's",
        _T + "trl_grpo_kl_bias_corrected[grpo-on-policy]",
    ),
    Deviation(
        "trl",
        "1.16.0",
        "GRPOTrainer.get_gamma_weights (loss_type='vespo')",
        "the sequence log-ratio is clamped to [log 1e-8, 20] before the gamma weight "
        "phi(w) = e^lambda w^k e^(-lambda w) of VESPO (arXiv:2602.10693), so far off-policy "
        "long rows get phi at the clamp",
        _T + "trl_vespo[shipped-gradient]",
    ),
    Deviation(
        "trl",
        "1.16.0",
        "GRPOConfig.vllm_importance_sampling_mode",
        "the docstring marks 'token_truncate' as the default; the field's default is "
        "'sequence_mask'",
        _C + "test_deviation_trl_docstring_names_another_default_is_mode",
    ),
    Deviation(
        "trl",
        "1.16.0",
        "GRPOTrainer._compute_loss(loss_type='dapo'), accumulation",
        "num_items_in_batch counts the generation batch; rescaled by gradient_accumulation_steps"
        " / steps_per_generation it equals the optimizer step's token count only when every "
        "step of a generation batch holds as many tokens (DAPO Eq. 8 normalises by the step's)",
        _S + "trl_dapo_step[dapo-generation-steps]",
    ),
    Deviation(
        "trl",
        "1.16.0",
        "GRPOTrainer._compute_loss(loss_type='dapo'), accumulation on a real DDP group",
        "the same generation-batch normaliser on 2 gloo ranks under DistributedDataParallel "
        "(and FSDP2): the reduced gradient differs from the step's token-mean exactly as on "
        "the simulated ranks",
        _G + "trl_dapo_ddp[dapo-generation-steps]",
    ),
    Deviation(
        "trl",
        "1.16.0",
        "trl.trainer.utils.selective_log_softmax",
        "bfloat16 and float16 logits go through log_softmax row by row in their own dtype "
        "(float32/64 through logsumexp), off by up to ~0.1 nats against a float32 "
        "log-softmax",
        _L + "trl_selective_log_softmax_bf16[aligned-float32-log-softmax]",
    ),
    Deviation(
        "openrlhf",
        "0.11.2",
        "openrlhf.models.loss.PolicyLoss (defaults)",
        "token_level_loss=True (the default) is a token mean over the micro-batch; the GRPO "
        "objective (arXiv:2402.03300 Eq. 3) averages per sequence",
        _O + "openrlhf_default[grpo-value]",
    ),
    Deviation(
        "openrlhf",
        "0.11.2",
        "openrlhf.models.utils.compute_approx_kl('k1')",
        "every estimator's value is clamped to [-10, 10], k1 included; k1 = log pi - log ref "
        "is unbounded",
        _C + "test_deviation_openrlhf_k1_is_clamped_at_10",
    ),
    Deviation(
        "openrlhf",
        "0.11.2",
        "openrlhf.models.utils.compute_approx_kl('k3')",
        "k3 is clamped to [-10, 10] (its log-ratio at -10 first); k3 is unbounded",
        _C + "test_deviation_openrlhf_k3_is_clamped_at_10",
    ),
    Deviation(
        "openrlhf",
        "0.11.2",
        "openrlhf.models.utils.log_probs_from_logits",
        "bfloat16 logits go through log_softmax row by row in bfloat16 (float32/64 through "
        "a chunked logsumexp), off by up to ~0.1 nats against a float32 log-softmax",
        _L + "openrlhf_log_probs_bf16[aligned-float32-log-softmax]",
    ),
)
"""Every demonstrated deviation, verl first, then TRL, then OpenRLHF."""
