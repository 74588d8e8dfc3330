"""Training steps for the distributed runner's tests and benchmark (imported in the ranks).

Kept apart from the test module so a rank imports torch and the reference only. Every
step computes DAPO's per-token surrogate with the reference (token-sum aggregation, so
only the scaling differs) and then scales the micro-batch loss as a trainer would.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from polgrad_reference import get_algorithm, policy_loss

if TYPE_CHECKING:
    from pytest_polgrad.strategies import Split

DAPO = get_algorithm("dapo").loss
T = torch.Tensor
LENGTHS = (1, 2, 1, 3, 6, 5, 6, 4)
"""Response lengths of the test step's 8 rows: ranks and micro-batches hold very different
token counts (world 2: 7 and 21 tokens; world 4: 3, 4, 11 and 10)."""


def split_of(world: int) -> Split:
    """Two micro-batches per rank, rows in order (imported here, not in the ranks)."""
    from pytest_polgrad.strategies import Split

    if world == 2:
        return Split((((0, 1), (2, 3)), ((4, 5), (6, 7))))
    return Split((((0,), (1,)), ((2,), (3,)), ((4,), (5,)), ((6,), (7,))))


def step_batch(dtype: torch.dtype = torch.float64, seed: int = 0) -> dict[str, torch.Tensor]:
    """8 right-padded rows of :data:`LENGTHS` (width 6), NaN at padding, ratios near 1."""
    g = torch.Generator().manual_seed(seed)
    b, width = len(LENGTHS), max(LENGTHS)
    mask = torch.arange(width)[None, :] < torch.tensor(LENGTHS)[:, None]
    lp = -(torch.rand((b, width), generator=g, dtype=torch.float64) * 2 + 0.1)
    old = lp - (torch.rand((b, width), generator=g, dtype=torch.float64) - 0.5) * 0.3
    adv = torch.randn(b, generator=g, dtype=torch.float64)
    nan = torch.tensor(float("nan"), dtype=torch.float64)
    return {
        "logprobs": torch.where(mask, lp, nan).to(dtype),
        "old_logprobs": torch.where(mask, old, nan).to(dtype),
        "advantages": adv.to(dtype),
        "response_mask": mask,
    }


def token_losses(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
) -> torch.Tensor:
    """DAPO's per-token surrogate ``[b, T]``, 0 at padding (an empty micro-batch: zeros
    that still depend on ``logprobs``, as a trainer's forward on no rows does)."""
    if not bool(response_mask.any()):
        return logprobs * 0.0
    out = policy_loss(
        DAPO.replace(aggregation="token-sum", budget=None),
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        advantages=advantages,
        response_mask=response_mask,
    )
    return torch.where(response_mask, out.token_loss, 0.0)


# ------------------------------------------------------------------ correct scalings


def token_mean_global(
    logprobs: T,
    old_logprobs: T,
    advantages: T,
    response_mask: T,
    global_tokens: int,
    world_size: int,
) -> torch.Tensor:
    """Token-mean over the step's global token count, times the world size (the
    all-reduce mean divides by it): DAPO arXiv:2503.14476 Eq. 8 under data parallelism."""
    tok = token_losses(logprobs, old_logprobs, advantages, response_mask)
    return tok.sum() / global_tokens * world_size


def token_mean_all_reduced(
    logprobs: T, old_logprobs: T, advantages: T, response_mask: T, rank_tokens: int, world_size: int
) -> torch.Tensor:
    """The global count made by the step itself: this rank's token count all-reduced (SUM)
    over the process group, as verl, prime-rl and OpenRLHF do."""
    count = torch.tensor(float(rank_tokens), dtype=torch.float64)
    dist.all_reduce(count)
    tok = token_losses(logprobs, old_logprobs, advantages, response_mask)
    return tok.sum() / count.to(tok.dtype) * world_size


def token_mean_backward_itself(
    logprobs: T,
    old_logprobs: T,
    advantages: T,
    response_mask: T,
    global_tokens: int,
    world_size: int,
) -> None:
    """As :func:`token_mean_global`, but the step calls ``backward()`` and returns None."""
    loss = token_mean_global(logprobs, old_logprobs, advantages, response_mask, global_tokens,
                             world_size)  # fmt: skip
    torch.autograd.backward(loss)  # what loss.backward() does


def token_mean_float32_inside(
    logprobs: T,
    old_logprobs: T,
    advantages: T,
    response_mask: T,
    global_tokens: int,
    world_size: int,
) -> torch.Tensor:
    """The surrogate computed in float32 whatever the input dtype (bf16 inputs upcast)."""
    f = torch.float32
    tok = token_losses(logprobs.to(f), old_logprobs.to(f), advantages.to(f), response_mask)
    return tok.sum() / global_tokens * world_size


# ---------------------------------------------------------------------- known bugs


def bug_rank_tokens(
    logprobs: T, old_logprobs: T, advantages: T, response_mask: T, rank_tokens: int
) -> torch.Tensor:
    """prime-rl #2562: each rank divides by its own token count (no all-reduce) before the
    reducer's mean over ranks. Row weight ``1 / (W n_rank)`` instead of ``1 / N``."""
    tok = token_losses(logprobs, old_logprobs, advantages, response_mask)
    return tok.sum() / rank_tokens


def bug_mean_of_means(
    logprobs: T,
    old_logprobs: T,
    advantages: T,
    response_mask: T,
    micro_batch_tokens: int,
    gradient_accumulation_steps: int,
) -> torch.Tensor:
    """SkyRL PR #1296 / OpenRLHF #1249: token-mean of each micro-batch, divided by the
    accumulation steps. Row weight ``1 / (W K n_mb)``."""
    tok = token_losses(logprobs, old_logprobs, advantages, response_mask)
    return tok.sum() / micro_batch_tokens / gradient_accumulation_steps


def bug_accumulation_twice(
    logprobs: T,
    old_logprobs: T,
    advantages: T,
    response_mask: T,
    global_tokens: int,
    world_size: int,
    gradient_accumulation_steps: int,
) -> torch.Tensor:
    """ms-swift #10116: the global normaliser already covers the step, and the loss is
    divided by the accumulation steps again. ``1/K`` times the reference."""
    tok = token_losses(logprobs, old_logprobs, advantages, response_mask)
    return tok.sum() / global_tokens * world_size / gradient_accumulation_steps


def bug_no_world_size(
    logprobs: T, old_logprobs: T, advantages: T, response_mask: T, global_tokens: int
) -> torch.Tensor:
    """verl PRs #4510 / #5366: the global normaliser without the ``x world_size`` that the
    all-reduce mean's ``1/W`` needs. ``1/W`` times the reference."""
    tok = token_losses(logprobs, old_logprobs, advantages, response_mask)
    return tok.sum() / global_tokens


def bug_divides_by_empty(
    logprobs: T,
    old_logprobs: T,
    advantages: T,
    response_mask: T,
    micro_batch_tokens: int,
    global_tokens: int,
    world_size: int,
) -> torch.Tensor:
    """NeMo-RL #212: each micro-batch's token mean, weighted by its share of the step's
    tokens. Exact wherever a micro-batch has tokens; 0/0 = NaN on an empty one."""
    tok = token_losses(logprobs, old_logprobs, advantages, response_mask)
    mean = tok.sum() / response_mask.sum()
    return mean * (micro_batch_tokens / global_tokens) * world_size


# ------------------------------------------------- multi-term steps (judged by term)

KL_COEF, ENTROPY_COEF = 0.04, 0.01


def _kl_entropy(logprobs: T, old_logprobs: T, response_mask: T) -> tuple[T, T]:
    """Per-token k3 KL to ``old_logprobs`` (Schulman's estimator) and the sampled-token
    entropy estimate ``-logprobs``, both 0 at padding."""
    d = torch.where(response_mask, old_logprobs - logprobs, 0.0)
    kl = torch.where(response_mask, torch.exp(d) - d - 1.0, 0.0)
    entropy = torch.where(response_mask, -logprobs, 0.0)
    return kl, entropy


def multi_term_global(
    logprobs: T, old_logprobs: T, advantages: T, response_mask: T, global_tokens: int,
    world_size: int, gradient_accumulation_steps: int,
) -> dict[str, T]:  # fmt: skip
    """policy + kl_coef * KL - entropy_coef * entropy, every term token-mean over the step's
    global token count times the world size (each its own aggregation, all correct)."""
    scale = world_size / global_tokens
    policy = token_losses(logprobs, old_logprobs, advantages, response_mask).sum() * scale
    kl, entropy = _kl_entropy(logprobs, old_logprobs, response_mask)
    terms = {"policy": policy, "kl": KL_COEF * kl.sum() * scale,
             "entropy": -ENTROPY_COEF * entropy.sum() * scale}  # fmt: skip
    return {"loss": terms["policy"] + terms["kl"] + terms["entropy"], **terms}


def bug_kl_term_k_fold(
    logprobs: T, old_logprobs: T, advantages: T, response_mask: T, global_tokens: int,
    world_size: int, gradient_accumulation_steps: int,
) -> dict[str, T]:  # fmt: skip
    """The KL term normalised per micro-batch while the policy term is right: its gradient
    grows K-fold with K micro-batches (the verl PR #6957 pattern, on the KL term)."""
    out = multi_term_global(logprobs, old_logprobs, advantages, response_mask, global_tokens,
                            world_size, gradient_accumulation_steps)  # fmt: skip
    out["kl"] = out["kl"] * gradient_accumulation_steps
    out["loss"] = out["policy"] + out["kl"] + out["entropy"]
    return out


def bug_entropy_mean_of_means(
    logprobs: T, old_logprobs: T, advantages: T, response_mask: T, global_tokens: int,
    world_size: int, gradient_accumulation_steps: int, micro_batch_tokens: int,
) -> dict[str, T]:  # fmt: skip
    """The entropy bonus as each micro-batch's own token mean over the accumulation steps
    (SkyRL PR #1296's pattern on the entropy term)."""
    out = multi_term_global(logprobs, old_logprobs, advantages, response_mask, global_tokens,
                            world_size, gradient_accumulation_steps)  # fmt: skip
    _kl, entropy = _kl_entropy(logprobs, old_logprobs, response_mask)
    mean = entropy.sum() / micro_batch_tokens / gradient_accumulation_steps
    out["entropy"] = -ENTROPY_COEF * mean
    out["loss"] = out["policy"] + out["kl"] + out["entropy"]
    return out


# ------------------------------------------------------------------ faulty functions


def raises_on_rank_1(logprobs: T, response_mask: T, rank: int) -> torch.Tensor:
    """Raises ValueError on rank 1 only (the other ranks then wait for it)."""
    if rank == 1:
        raise ValueError("boom on rank 1")
    return torch.where(response_mask, logprobs, 0.0).sum()


HANG_MARK = "POLGRAD_TEST_HANG_MARK"
"""Environment variable: a file :func:`hangs_on_rank_1` creates before it sleeps."""


def hangs_on_rank_1(logprobs: T, response_mask: T, rank: int) -> torch.Tensor:
    """Sleeps for an hour on rank 1 (after touching ``$POLGRAD_TEST_HANG_MARK``)."""
    if rank == 1:
        mark = os.environ.get(HANG_MARK)
        if mark:
            with open(mark, "w") as f:
                f.write(str(os.getpid()))
        time.sleep(3600)
    return torch.where(response_mask, logprobs, 0.0).sum()


def exits_on_rank_1(logprobs: T, response_mask: T, rank: int) -> torch.Tensor:
    """Ends rank 1's process with ``os._exit(7)`` (no exception to catch)."""
    if rank == 1:
        os._exit(7)
    return torch.where(response_mask, logprobs, 0.0).sum()


def modifies_advantages(
    logprobs: T,
    old_logprobs: T,
    advantages: T,
    response_mask: T,
    global_tokens: int,
    world_size: int,
) -> torch.Tensor:
    """Correct scaling, but writes into its ``advantages`` input in place."""
    loss = token_mean_global(logprobs, old_logprobs, advantages, response_mask, global_tokens,
                             world_size)  # fmt: skip
    advantages.mul_(2.0)
    return loss


# ------------------------------------------- other aggregations (kind-level tests)

GRPO = get_algorithm("grpo").loss.replace(kl=None)
BUDGET = 64
"""The constant of the token-sum-norm steps (Dr.GRPO's generation budget, marker budget=64)."""


def _surrogate(cfg: object, logprobs: T, old_logprobs: T, advantages: T, response_mask: T) -> T:
    if not bool(response_mask.any()):  # an empty micro-batch
        return logprobs * 0.0
    out = policy_loss(
        cfg.replace(aggregation="token-sum", budget=None),  # type: ignore[attr-defined]
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        advantages=advantages,
        response_mask=response_mask,
    )
    return torch.where(response_mask, out.token_loss, 0.0)


def seq_mean_token_mean(
    logprobs: T, old_logprobs: T, advantages: T, response_mask: T, global_rows: int,
    world_size: int,
) -> torch.Tensor:  # fmt: skip
    """GRPO (arXiv:2402.03300 Eq. 3): each row's token mean, averaged over the step's rows,
    times the world size."""
    tok = _surrogate(GRPO, logprobs, old_logprobs, advantages, response_mask)
    return (tok.sum(dim=1) / response_mask.sum(dim=1)).sum() / global_rows * world_size


def seq_mean_token_sum_norm(
    logprobs: T, old_logprobs: T, advantages: T, response_mask: T, global_rows: int,
    world_size: int,
) -> torch.Tensor:  # fmt: skip
    """verl's seq-mean-token-sum-norm: each row's token sum over the constant budget,
    averaged over the step's rows, times the world size (verl PRs #4510 / #5366)."""
    tok = _surrogate(DAPO, logprobs, old_logprobs, advantages, response_mask)
    return (tok.sum(dim=1) / BUDGET).sum() / global_rows * world_size


def dr_grpo_constant(
    logprobs: T, old_logprobs: T, advantages: T, response_mask: T, global_rows: int,
    world_size: int,
) -> torch.Tensor:  # fmt: skip
    """Dr.GRPO (arXiv:2503.20783 Sec. 3.1): the token sum over the constant rows x budget."""
    tok = _surrogate(GRPO, logprobs, old_logprobs, advantages, response_mask)
    return tok.sum() / (global_rows * BUDGET) * world_size


def bug_sample_weighted(
    logprobs: T, old_logprobs: T, advantages: T, response_mask: T, micro_batch_rows: int,
    micro_batch_tokens: int, rank_rows: int,
) -> torch.Tensor:  # fmt: skip
    """verl #5625: each micro-batch's token mean weighted by its share of the rank's
    samples (not tokens)."""
    tok = token_losses(logprobs, old_logprobs, advantages, response_mask)
    return tok.sum() / micro_batch_tokens * (micro_batch_rows / rank_rows)


# ---------------------------------------------------------------- the critic's step


def _value_per_token(values: T, old_values: T, returns: T, response_mask: T) -> T:
    """PPO's clipped value loss per token (clip 0.2), 0 at padding."""
    from polgrad_reference.value import value_loss_per_token

    if not bool(response_mask.any()):
        return values * 0.0
    per_token = value_loss_per_token(values=values, old_values=old_values, returns=returns,
                                     response_mask=response_mask, clip_range=0.2)  # fmt: skip
    return torch.where(response_mask, per_token, 0.0)


def critic_global(
    values: T, old_values: T, returns: T, response_mask: T, global_tokens: int, world_size: int
) -> T:
    """The value loss token-mean over the step's global token count, times the world size."""
    return (
        _value_per_token(values, old_values, returns, response_mask).sum()
        / global_tokens
        * (world_size)
    )


def bug_critic_per_micro_batch(
    values: T, old_values: T, returns: T, response_mask: T, micro_batch_tokens: int
) -> T:
    """verl PR #6957: each micro-batch's own token mean, not divided by the accumulation
    steps (nor weighted): the gradient grows K-fold with K equal micro-batches."""
    return _value_per_token(values, old_values, returns, response_mask).sum() / micro_batch_tokens
