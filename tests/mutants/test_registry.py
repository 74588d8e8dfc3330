"""Every constant of every registry entry, pinned next to the sources it comes from.

The mutation audit of issue 13 found registry constants no test pinned (REINFORCE++'s
KL-in-reward coefficient, GRPO's ``scale_by_std``, PPO's GAE lambda): any change survived.
Here every field of every entry's loss and advantage config is compared with the value
its sources give (a paper's equation/section or a framework file, quoted above each entry
from ``AlgorithmSpec.sources``); the knobs the sources leave open are named too, with the
registry's choice (``AlgorithmSpec.unstated``). Changing a constant means changing it here,
with its source.
"""

from __future__ import annotations

import dataclasses
import enum

import pytest

from polgrad_reference import ALGORITHMS

PINS: dict[str, str] = {
    # arXiv:1707.06347 Eq. 7 (clipped surrogate), Sec. 6.1 (eps = 0.2)
    # arXiv:1506.02438 Eq. 16 (GAE)
    # open knobs (registry's choice): aggregation, advantage.gamma, advantage.lam
    "ppo": (
        "ratio=token surrogate=pg_clip clip.eps_low=0.2 clip.eps_high=0.2 clip.dual_clip=None "
        "clip.bounds=relative aggregation=token-mean budget=None is_correction=None kl=None "
        "params=None adv.estimator=gae adv.scale_by_std=True adv.std_eps=1e-06 "
        "adv.unbiased_std=True adv.singleton=zero adv.gamma=1.0 adv.lam=0.95 adv.whiten=False"
    ),
    # arXiv:2402.03300 Eq. 3 (1/G sum_i 1/|o_i| sum_t), Eq. 4 (k3 KL in the loss)
    # arXiv:2402.03300 Sec. 4.1.2 (group-normalised outcome advantages)
    # arXiv:2402.03300 Sec. 4.2 (KL coefficient 0.04)
    # open knobs (registry's choice): clip, advantage.std_eps, advantage.unbiased_std
    "grpo": (
        "ratio=token surrogate=pg_clip clip.eps_low=0.2 clip.eps_high=0.2 clip.dual_clip=None "
        "clip.bounds=relative aggregation=seq-mean-token-mean budget=None is_correction=None "
        "kl.estimator=k3 kl.placement=loss kl.coef=0.04 kl.aggregation=None "
        "kl.ratio_weight=none kl.ratio_cap=None params=None adv.estimator=grpo "
        "adv.scale_by_std=True adv.std_eps=1e-06 adv.unbiased_std=True adv.singleton=zero "
        "adv.gamma=1.0 adv.lam=1.0 adv.whiten=False"
    ),
    # arXiv:2503.20783 Sec. 3.1 (no 1/|o_i|, no std; divide by a constant)
    # arXiv:2503.20783 released code: the constant is the generation budget
    # open knobs (registry's choice): budget, clip
    "dr_grpo": (
        "ratio=token surrogate=pg_clip clip.eps_low=0.2 clip.eps_high=0.2 clip.dual_clip=None "
        "clip.bounds=relative aggregation=token-sum-norm budget=4096 is_correction=None kl=None "
        "params=None adv.estimator=grpo adv.scale_by_std=False adv.std_eps=1e-06 "
        "adv.unbiased_std=True adv.singleton=zero adv.gamma=1.0 adv.lam=1.0 adv.whiten=False"
    ),
    # arXiv:2503.14476 Eq. 8 (token-level mean over the batch)
    # arXiv:2503.14476 Sec. 3.1 (clip-higher: eps_low 0.2, eps_high 0.28)
    # arXiv:2503.14476 Sec. 2.3 (no KL term)
    # open knobs (registry's choice): advantage.std_eps, advantage.unbiased_std
    "dapo": (
        "ratio=token surrogate=pg_clip clip.eps_low=0.2 clip.eps_high=0.28 clip.dual_clip=None "
        "clip.bounds=relative aggregation=token-mean budget=None is_correction=None kl=None "
        "params=None adv.estimator=grpo adv.scale_by_std=True adv.std_eps=1e-06 "
        "adv.unbiased_std=True adv.singleton=zero adv.gamma=1.0 adv.lam=1.0 adv.whiten=False"
    ),
    # arXiv:2507.18071 Eq. 5-7 (length-normalised sequence ratio, sequence clipping)
    # arXiv:2507.18071 Sec. 5.1 (clip ranges 3e-4 / 4e-4)
    # open knobs (registry's choice): advantage.std_eps, advantage.unbiased_std
    "gspo": (
        "ratio=sequence surrogate=pg_clip clip.eps_low=0.0003 clip.eps_high=0.0004 "
        "clip.dual_clip=None clip.bounds=relative aggregation=seq-mean-token-mean budget=None "
        "is_correction=None kl=None params=None adv.estimator=grpo adv.scale_by_std=True "
        "adv.std_eps=1e-06 adv.unbiased_std=True adv.singleton=zero adv.gamma=1.0 adv.lam=1.0 "
        "adv.whiten=False"
    ),
    # arXiv:2507.18071 Eq. 13-14 (GSPO-token)
    # open knobs (registry's choice): advantage.std_eps, advantage.unbiased_std
    "gspo_token": (
        "ratio=sequence_token surrogate=pg_clip clip.eps_low=0.0003 clip.eps_high=0.0004 "
        "clip.dual_clip=None clip.bounds=relative aggregation=seq-mean-token-mean budget=None "
        "is_correction=None kl=None params=None adv.estimator=grpo adv.scale_by_std=True "
        "adv.std_eps=1e-06 adv.unbiased_std=True adv.singleton=zero adv.gamma=1.0 adv.lam=1.0 "
        "adv.whiten=False"
    ),
    # arXiv:2506.13585 Eq. 4 (sg(clipped IS weight) * A * log pi, token-level mean)
    # arXiv:2506.13585 Sec. 3.1 (no lower bound on the IS weight)
    # open knobs (registry's choice): clip.eps_high, advantage.std_eps, advantage.unbiased_std
    "cispo": (
        "ratio=token surrogate=cispo clip.eps_low=None clip.eps_high=2.0 clip.dual_clip=None "
        "clip.bounds=relative aggregation=token-mean budget=None is_correction=None kl=None "
        "params=None adv.estimator=grpo adv.scale_by_std=True adv.std_eps=1e-06 "
        "adv.unbiased_std=True adv.singleton=zero adv.gamma=1.0 adv.lam=1.0 adv.whiten=False"
    ),
    # arXiv:2402.14740 Eq. 6 (leave-one-out baseline)
    # arXiv:2402.14740 Sec. 3 (whole completion is one action: sum of token log-probs)
    # open knobs (registry's choice): kl.coef
    "rloo": (
        "ratio=token surrogate=reinforce clip.eps_low=0.2 clip.eps_high=0.2 clip.dual_clip=None "
        "clip.bounds=relative aggregation=seq-mean-token-sum budget=None is_correction=None "
        "kl.estimator=k1 kl.placement=reward kl.coef=0.05 kl.aggregation=None "
        "kl.ratio_weight=none kl.ratio_cap=None params=None adv.estimator=rloo "
        "adv.scale_by_std=True adv.std_eps=1e-06 adv.unbiased_std=True adv.singleton=zero "
        "adv.gamma=1.0 adv.lam=1.0 adv.whiten=False"
    ),
    # arXiv:2501.03262 Sec. 3 (token-level KL penalty in the reward, PPO clip, global
    #   advantage normalisation)
    # open knobs (registry's choice): kl.coef, aggregation
    "reinforce_pp": (
        "ratio=token surrogate=pg_clip clip.eps_low=0.2 clip.eps_high=0.2 clip.dual_clip=None "
        "clip.bounds=relative aggregation=token-mean budget=None is_correction=None "
        "kl.estimator=k1 kl.placement=reward kl.coef=0.01 kl.aggregation=None "
        "kl.ratio_weight=none kl.ratio_cap=None params=None adv.estimator=reinforce_pp "
        "adv.scale_by_std=True adv.std_eps=1e-06 adv.unbiased_std=True adv.singleton=zero "
        "adv.gamma=1.0 adv.lam=1.0 adv.whiten=True"
    ),
    # Yao et al. 2025, 'Your efficient RL framework secretly brings you off-policy RL
    #   training' (token-level TIS, cap C = 2)
    # verl#2953 (truncated IS correction for rollout/trainer logprob mismatch)
    # arXiv:2402.03300 Eq. 3 (the GRPO loss it corrects)
    # open knobs (registry's choice): clip, advantage.std_eps, advantage.unbiased_std
    "grpo_tis": (
        "ratio=token surrogate=pg_clip clip.eps_low=0.2 clip.eps_high=0.2 clip.dual_clip=None "
        "clip.bounds=relative aggregation=seq-mean-token-mean budget=None "
        "is_correction.level=token is_correction.mode=truncate is_correction.cap=2.0 "
        "is_correction.low=None is_correction.high=None is_correction.weight=level "
        "kl.estimator=k3 kl.placement=loss kl.coef=0.04 kl.aggregation=None "
        "kl.ratio_weight=none kl.ratio_cap=None params=None adv.estimator=grpo "
        "adv.scale_by_std=True adv.std_eps=1e-06 adv.unbiased_std=True adv.singleton=zero "
        "adv.gamma=1.0 adv.lam=1.0 adv.whiten=False"
    ),
    # arXiv:1912.09729 Eq. 5 (dual clip, c = 3)
    # verl 0.9.1 verl/trainer/ppo/core_algos.py compute_policy_loss_vanilla (clip_ratio_c =
    #   3.0, always applied)
    # open knobs (registry's choice): aggregation
    "ppo_dual_clip": (
        "ratio=token surrogate=pg_clip clip.eps_low=0.2 clip.eps_high=0.2 clip.dual_clip=3.0 "
        "clip.bounds=relative aggregation=token-mean budget=None is_correction=None kl=None "
        "params=None adv.estimator=gae adv.scale_by_std=True adv.std_eps=1e-06 "
        "adv.unbiased_std=True adv.singleton=zero adv.gamma=1.0 adv.lam=0.95 adv.whiten=False"
    ),
    # arXiv:2511.20347 (sigmoid gate 4/tau sigmoid(tau (r - 1)); tau_pos 1.0, tau_neg 1.05)
    # verl 0.9.1 verl/trainer/ppo/core_algos.py compute_policy_loss_sapo (seq-mean-token-mean,
    #   whatever loss_agg_mode)
    # trl 1.16.0 trl/trainer/grpo_trainer.py (GRPOTrainer._compute_loss) loss_type='sapo'
    #   (temperature per advantage sign, A <= 0 takes tau_neg)
    # open knobs (registry's choice): advantage.std_eps, advantage.unbiased_std
    "sapo": (
        "ratio=token surrogate=sapo clip.eps_low=0.2 clip.eps_high=0.2 clip.dual_clip=None "
        "clip.bounds=relative aggregation=seq-mean-token-mean budget=None is_correction=None "
        "kl=None params.tau_pos=1.0 params.tau_neg=1.05 adv.estimator=grpo "
        "adv.scale_by_std=True adv.std_eps=1e-06 adv.unbiased_std=True adv.singleton=zero "
        "adv.gamma=1.0 adv.lam=1.0 adv.whiten=False"
    ),
    # arXiv:2507.20673 Eq. 6 (geometric mean of token ratios, clipped in log space)
    # arXiv:2507.20673 Sec. 4 (clip range (e^-0.4, e^0.4))
    # verl 0.9.1 verl/trainer/ppo/core_algos.py compute_policy_loss_geo_mean (mean over
    #   sequences)
    # open knobs (registry's choice): advantage.std_eps, advantage.unbiased_std
    "gmpo": (
        "ratio=token surrogate=gmpo clip.eps_low=0.4 clip.eps_high=0.4 clip.dual_clip=None "
        "clip.bounds=relative aggregation=seq-mean-token-mean budget=None is_correction=None "
        "kl=None params=None adv.estimator=grpo adv.scale_by_std=True adv.std_eps=1e-06 "
        "adv.unbiased_std=True adv.singleton=zero adv.gamma=1.0 adv.lam=1.0 adv.whiten=False"
    ),
    # arXiv:2602.04879 (divergence trust region on the sampled token's probability)
    # arXiv:2602.04879 Sec. 5.4 (truncated IS weight with a large cap instead of dual clip)
    # verl 0.9.1 verl/trainer/ppo/core_algos.py compute_policy_loss_dppo_tv (cap clip_ratio_c
    #   = 20)
    # open knobs (registry's choice): params.delta_low, params.delta_high, aggregation,
    #   advantage.std_eps, advantage.unbiased_std
    "dppo_tv": (
        "ratio=token surrogate=dppo_tv clip.eps_low=0.2 clip.eps_high=0.2 clip.dual_clip=None "
        "clip.bounds=relative aggregation=token-mean budget=None is_correction=None kl=None "
        "params.delta_low=0.2 params.delta_high=0.2 params.is_cap=20.0 adv.estimator=grpo "
        "adv.scale_by_std=True adv.std_eps=1e-06 adv.unbiased_std=True adv.singleton=zero "
        "adv.gamma=1.0 adv.lam=1.0 adv.whiten=False"
    ),
    # arXiv:2602.04879 (binary KL between Bernoulli(p_old) and Bernoulli(p))
    # verl 0.9.1 verl/trainer/ppo/core_algos.py compute_policy_loss_dppo_kl (cap clip_ratio_c
    #   = 20)
    # open knobs (registry's choice): params.delta_low, params.delta_high, aggregation,
    #   advantage.std_eps, advantage.unbiased_std
    "dppo_kl": (
        "ratio=token surrogate=dppo_kl clip.eps_low=0.2 clip.eps_high=0.2 clip.dual_clip=None "
        "clip.bounds=relative aggregation=token-mean budget=None is_correction=None kl=None "
        "params.delta_low=0.2 params.delta_high=0.2 params.is_cap=20.0 adv.estimator=grpo "
        "adv.scale_by_std=True adv.std_eps=1e-06 adv.unbiased_std=True adv.singleton=zero "
        "adv.gamma=1.0 adv.lam=1.0 adv.whiten=False"
    ),
    # arXiv:2504.02546 (plain policy gradient -A log pi, no ratio, no clip, no KL)
    # verl 0.9.1 verl/trainer/ppo/core_algos.py compute_policy_loss_gpg and
    #   compute_gpg_outcome_advantage
    # open knobs (registry's choice): advantage.alpha, aggregation
    "gpg": (
        "ratio=token surrogate=reinforce clip.eps_low=0.2 clip.eps_high=0.2 clip.dual_clip=None "
        "clip.bounds=relative aggregation=token-mean budget=None is_correction=None kl=None "
        "params=None adv.estimator=grpo adv.scale_by_std=False adv.std_eps=1e-06 "
        "adv.unbiased_std=True adv.singleton=zero adv.gamma=1.0 adv.lam=1.0 adv.whiten=False"
    ),
    # arXiv:2505.22617 Sec. 4 (detach the gradient of a few high-covariance tokens)
    # verl 0.9.1 verl/trainer/ppo/core_algos.py compute_policy_loss_clip_cov (fraction 2e-4,
    #   window (1, 5))
    # open knobs (registry's choice): token_selection, aggregation, advantage.std_eps,
    #   advantage.unbiased_std
    "clip_cov": (
        "ratio=token surrogate=clip_cov clip.eps_low=0.2 clip.eps_high=0.2 clip.dual_clip=None "
        "clip.bounds=relative aggregation=token-mean budget=None is_correction=None kl=None "
        "params.fraction=0.0002 params.low=1.0 params.high=5.0 params.kl_coef=1.0 params.seed=0 "
        "adv.estimator=grpo adv.scale_by_std=True adv.std_eps=1e-06 adv.unbiased_std=True "
        "adv.singleton=zero adv.gamma=1.0 adv.lam=1.0 adv.whiten=False"
    ),
    # arXiv:2505.22617 Sec. 4 (KL penalty |log r| on the top-k covariance tokens)
    # verl 0.9.1 verl/trainer/ppo/core_algos.py compute_policy_loss_kl_cov (fraction 2e-4,
    #   coefficient 1.0; verl's ActorConfig passes ppo_kl_coef = 0.1, an open knob)
    # open knobs (registry's choice): token_selection, params.kl_coef, aggregation,
    #   advantage.std_eps, advantage.unbiased_std
    "kl_cov": (
        "ratio=token surrogate=kl_cov clip.eps_low=0.2 clip.eps_high=0.2 clip.dual_clip=None "
        "clip.bounds=relative aggregation=token-mean budget=None is_correction=None kl=None "
        "params.fraction=0.0002 params.low=1.0 params.high=5.0 params.kl_coef=1.0 params.seed=0 "
        "adv.estimator=grpo adv.scale_by_std=True adv.std_eps=1e-06 adv.unbiased_std=True "
        "adv.singleton=zero adv.gamma=1.0 adv.lam=1.0 adv.whiten=False"
    ),
    # verl 0.9.1 verl/trainer/ppo/core_algos.py compute_policy_loss_dro (-(A log pi - beta/2
    #   (log r)^2))
    # open knobs (registry's choice): params.beta, aggregation, advantage.std_eps,
    #   advantage.unbiased_std
    "dro": (
        "ratio=token surrogate=dro clip.eps_low=0.2 clip.eps_high=0.2 clip.dual_clip=None "
        "clip.bounds=relative aggregation=token-mean budget=None is_correction=None kl=None "
        "params.beta=1.0 adv.estimator=grpo adv.scale_by_std=True adv.std_eps=1e-06 "
        "adv.unbiased_std=True adv.singleton=zero adv.gamma=1.0 adv.lam=1.0 adv.whiten=False"
    ),
    # arXiv:2602.05261 (GSPO with each sequence's loss scaled by its length)
    # trl 1.16.0 trl/trainer/grpo_trainer.py (GRPOTrainer._compute_loss) loss_type='luspo'
    #   ((per_token_loss * mask).sum(-1).mean())
    # open knobs (registry's choice): clip, advantage.std_eps, advantage.unbiased_std
    "luspo": (
        "ratio=sequence surrogate=pg_clip clip.eps_low=0.0003 clip.eps_high=0.0004 "
        "clip.dual_clip=None clip.bounds=relative aggregation=seq-mean-token-sum budget=None "
        "is_correction=None kl=None params=None adv.estimator=grpo adv.scale_by_std=True "
        "adv.std_eps=1e-06 adv.unbiased_std=True adv.singleton=zero adv.gamma=1.0 adv.lam=1.0 "
        "adv.whiten=False"
    ),
    # arXiv:2602.10693 (gamma weighting phi(w) = e^lambda w^k e^(-lambda w) of the sequence IS
    #   ratio)
    # trl 1.16.0 trl/trainer/grpo_trainer.py (GRPOTrainer._compute_loss) loss_type='vespo' and
    #   get_gamma_weights (k/lambda 2/3 for A >= 0, 3/2 else; token-mean over the batch)
    # open knobs (registry's choice): advantage.std_eps, advantage.unbiased_std
    "vespo": (
        "ratio=token surrogate=vespo clip.eps_low=0.2 clip.eps_high=0.2 clip.dual_clip=None "
        "clip.bounds=relative aggregation=token-mean budget=None is_correction=None kl=None "
        "params.k_pos=2.0 params.lambda_pos=3.0 params.k_neg=3.0 params.lambda_neg=2.0 "
        "adv.estimator=grpo adv.scale_by_std=True adv.std_eps=1e-06 adv.unbiased_std=True "
        "adv.singleton=zero adv.gamma=1.0 adv.lam=1.0 adv.whiten=False"
    ),
    # arXiv:2510.13786 (CISPO with eps_max = 5)
    # trl 1.16.0 trl/trainer/grpo_trainer.py (GRPOTrainer._compute_loss) loss_type='cispo':
    #   clamp(r, max=epsilon_high), epsilon_high the cap itself
    # open knobs (registry's choice): advantage.std_eps, advantage.unbiased_std
    "scalerl_cispo": (
        "ratio=token surrogate=cispo clip.eps_low=None clip.eps_high=5.0 clip.dual_clip=None "
        "clip.bounds=absolute aggregation=token-mean budget=None is_correction=None kl=None "
        "params=None adv.estimator=grpo adv.scale_by_std=True adv.std_eps=1e-06 "
        "adv.unbiased_std=True adv.singleton=zero adv.gamma=1.0 adv.lam=1.0 adv.whiten=False"
    ),
    # trl 1.16.0 trl/trainer/grpo_trainer.py (GRPOTrainer._compute_loss)
    #   vllm_importance_sampling_mode='token_mask' (ratio > C_max -> 0; C_max 3.0)
    # open knobs (registry's choice): loss, clip, advantage.std_eps, advantage.unbiased_std
    "grpo_mis": (
        "ratio=token surrogate=pg_clip clip.eps_low=0.2 clip.eps_high=0.2 clip.dual_clip=None "
        "clip.bounds=relative aggregation=seq-mean-token-mean budget=None "
        "is_correction.level=token is_correction.mode=zero is_correction.cap=None "
        "is_correction.low=None is_correction.high=3.0 is_correction.weight=level kl=None "
        "params=None adv.estimator=grpo adv.scale_by_std=True adv.std_eps=1e-06 "
        "adv.unbiased_std=True adv.singleton=zero adv.gamma=1.0 adv.lam=1.0 adv.whiten=False"
    ),
    # verl 0.9.1 verl/trainer/ppo/rollout_corr_helper.py and trainer/config/algorithm.py:
    #   rollout_is='sequence', rollout_is_threshold 2.0 (the defaults)
    # verl#2953 (truncated IS correction for rollout/trainer mismatch)
    # open knobs (registry's choice): loss, clip, advantage.std_eps, advantage.unbiased_std
    "grpo_seq_tis": (
        "ratio=token surrogate=pg_clip clip.eps_low=0.2 clip.eps_high=0.2 clip.dual_clip=None "
        "clip.bounds=relative aggregation=seq-mean-token-mean budget=None "
        "is_correction.level=sequence is_correction.mode=truncate is_correction.cap=2.0 "
        "is_correction.low=None is_correction.high=None is_correction.weight=level kl=None "
        "params=None adv.estimator=grpo adv.scale_by_std=True adv.std_eps=1e-06 "
        "adv.unbiased_std=True adv.singleton=zero adv.gamma=1.0 adv.lam=1.0 adv.whiten=False"
    ),
    # trl 1.16.0 trl/trainer/grpo_trainer.py (GRPOTrainer._compute_loss)
    #   vllm_importance_sampling_mode='sequence_mask' (the default), C_max 3.0
    # open knobs (registry's choice): loss, clip, advantage.std_eps, advantage.unbiased_std
    "grpo_seq_mis": (
        "ratio=token surrogate=pg_clip clip.eps_low=0.2 clip.eps_high=0.2 clip.dual_clip=None "
        "clip.bounds=relative aggregation=seq-mean-token-mean budget=None "
        "is_correction.level=sequence is_correction.mode=zero is_correction.cap=None "
        "is_correction.low=None is_correction.high=3.0 is_correction.weight=level kl=None "
        "params=None adv.estimator=grpo adv.scale_by_std=True adv.std_eps=1e-06 "
        "adv.unbiased_std=True adv.singleton=zero adv.gamma=1.0 adv.lam=1.0 adv.whiten=False"
    ),
    # arXiv:2510.18855 (IcePop: zero the gradient of tokens whose training/inference
    #   probability ratio leaves [alpha, beta])
    # verl 0.9.1 verl/trainer/ppo/rollout_corr_helper.py and trainer/config/algorithm.py
    #   decoupled_token_icepop (band 0.5_5.0; weights outside set to 0, response_mask unchanged)
    # open knobs (registry's choice): loss, clip, advantage.std_eps, advantage.unbiased_std
    "icepop": (
        "ratio=token surrogate=pg_clip clip.eps_low=0.2 clip.eps_high=0.2 clip.dual_clip=None "
        "clip.bounds=relative aggregation=seq-mean-token-mean budget=None "
        "is_correction.level=token is_correction.mode=zero is_correction.cap=None "
        "is_correction.low=0.5 is_correction.high=5.0 is_correction.weight=level kl=None "
        "params=None adv.estimator=grpo adv.scale_by_std=True adv.std_eps=1e-06 "
        "adv.unbiased_std=True adv.singleton=zero adv.gamma=1.0 adv.lam=1.0 adv.whiten=False"
    ),
    # verl 0.9.1 verl/trainer/ppo/rollout_corr_helper.py and trainer/config/algorithm.py
    #   decoupled_geo_rs: rollout_rs='seq_mean_k1', threshold 0.999_1.001
    # verl 0.9.1 rollout_corr_helper.py compute_rollout_rejection_mask tests
    #   mean(log(pi_rollout / pi_old)) against log(0.999), log(1.001): in rho = pi_old /
    #   pi_rollout that is [1/1.001, 1/0.999]
    # open knobs (registry's choice): loss, clip, advantage.std_eps, advantage.unbiased_std
    "grpo_geo_rs": (
        "ratio=token surrogate=pg_clip clip.eps_low=0.2 clip.eps_high=0.2 clip.dual_clip=None "
        "clip.bounds=relative aggregation=seq-mean-token-mean budget=None "
        "is_correction.level=geometric is_correction.mode=mask is_correction.cap=None "
        "is_correction.low=0.9990009990009991 is_correction.high=1.001001001001001 "
        "is_correction.weight=one kl=None params=None adv.estimator=grpo adv.scale_by_std=True "
        "adv.std_eps=1e-06 adv.unbiased_std=True adv.singleton=zero adv.gamma=1.0 adv.lam=1.0 "
        "adv.whiten=False"
    ),
    # verl 0.9.1 verl/trainer/ppo/core_algos.py compute_policy_loss_bypass_mode,
    #   loss_type='reinforce': -A log pi sg(min(pi / pi_rollout, C)) with old_logprobs =
    #   rollout_logprobs
    # verl 0.9.1 verl/trainer/ppo/rollout_corr_helper.py and trainer/config/algorithm.py
    #   bypass_pg_is (rollout_is='sequence', threshold 2.0)
    # open knobs (registry's choice): aggregation, advantage.std_eps, advantage.unbiased_std
    "bypass_pg": (
        "ratio=sequence_product surrogate=cispo clip.eps_low=None clip.eps_high=2.0 "
        "clip.dual_clip=None clip.bounds=absolute aggregation=token-mean budget=None "
        "is_correction=None kl=None params=None adv.estimator=grpo adv.scale_by_std=True "
        "adv.std_eps=1e-06 adv.unbiased_std=True adv.singleton=zero adv.gamma=1.0 adv.lam=1.0 "
        "adv.whiten=False"
    ),
}


def card(spec: object) -> str:
    """Every field of the entry's loss and advantage configs as ``name=value`` words."""

    def flat(obj: object, prefix: str) -> list[str]:
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            out: list[str] = []
            for f in dataclasses.fields(obj):
                out += flat(getattr(obj, f.name), f"{prefix}.{f.name}" if prefix else f.name)
            return out
        value = obj.value if isinstance(obj, enum.Enum) else obj
        return [f"{prefix}={value!r}".replace("'", "")]

    return " ".join(flat(spec.loss, "") + flat(spec.advantage, "adv"))  # type: ignore[attr-defined]


def test_every_entry_is_pinned() -> None:
    assert sorted(PINS) == sorted(ALGORITHMS)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_registry_constants_are_the_cited_ones(name: str) -> None:
    want = dict(w.split("=", 1) for w in PINS[name].split())
    got = dict(w.split("=", 1) for w in card(ALGORITHMS[name]).split())
    changed = {
        k: (want.get(k), got.get(k)) for k in want.keys() | got.keys() if want.get(k) != got.get(k)
    }
    assert not changed, f"{name}: (pinned, registry) differ: {changed}"


def test_the_card_sees_a_changed_constant() -> None:
    """The comparison is not vacuous: a derived copy with another lambda differs."""
    ppo = ALGORITHMS["ppo"]
    other = dataclasses.replace(ppo, advantage=dataclasses.replace(ppo.advantage, lam=0.9))
    assert card(other) != card(ppo) and card(ppo) == PINS["ppo"]
    assert "adv.lam=0.9" in card(other)
