"""The frameworks' own training steps on a real process group (issue 30, acceptance 2).

verl 0.9.1's actor loss with ``global_batch_info`` (its step all-reduces the rank's token
count as verl's engine does), TRL 1.16.0's ``_compute_loss`` with ``num_items_in_batch``
and OpenRLHF 0.11.2's actor loss with ``_optimizer_step_loss_norm`` (all-reducing the
window's counts) and DeepSpeed's ``1 / gas``, each adapter itself marked (a module-level
class's instance, which the rank processes import by name) with ``distributed="ddp"`` (and
``"fsdp"``) on 2 and on 4 gloo ranks (``world_size=``): the framework's reducer averages
the gradients. The registered deviations are the simulated path's
(``test_all_training_steps.py``), declared with the same ``expect=``, and the verdicts are
the same at both world sizes.

One pool of ranks per world size serves the module (stopped at its end; a world-4 marker
also runs its 2- and 3-rank draws on the 2-rank pool, ``execute.fold``); run it with
``-n 0``, or on one xdist worker, so the ranks start once.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_all_training_steps import _GENERATION, _GEO  # the simulated path's declarations

from pytest_polgrad.frameworks import openrlhf, trl, verl
from pytest_polgrad.kinds.training_step import distributed as D

# The checks whose splits hold more than one rank (run on the group), and the one-rank
# micro-batch split beside them (simulated: nothing to reduce).
CHECKS = ("micro-batches", "data-parallel", "generation-steps")
ON_GROUP = {"kind": "training_step", "distributed": "ddp", "world_size": 2, "checks": CHECKS}
ON_FSDP = {**ON_GROUP, "distributed": "fsdp"}  # the same pool of 2 ranks, FSDP2 per call

_NO_GROUP = (
    "simulated ranks have no process group: OpenRLHF's _optimizer_step_loss_norm all-reduces "
    "nothing and takes dp_size 1, so each rank divides by its own tokens"
)


@pytest.fixture(scope="module", autouse=True)
def _stop_pools() -> Iterator[None]:
    yield
    D.shutdown(zygote=False)  # the idle zygote serves the next module's pools
    assert D.pools() == []


verl_token_mean_ddp = pytest.mark.polgrad_conforms(
    "ppo", dual_clip=3.0, advantages="token", **ON_GROUP
)(verl.training_step("vanilla", loss_agg_mode="token-mean"))

verl_geo_mean_ddp = pytest.mark.polgrad_conforms(
    "gmpo",
    expect={"micro-batches": _GEO, "data-parallel": _GEO, "generation-steps": _GEO},
    **ON_GROUP,
)(
    verl.training_step(
        "geo_mean", loss_agg_mode="token-mean", clip_ratio_low=0.4, clip_ratio_high=0.4
    )
)

trl_dapo_ddp = pytest.mark.polgrad_conforms(
    "dapo", expect={"generation-steps": _GENERATION}, **ON_GROUP
)(trl.training_step(loss_type="dapo", epsilon_high=0.28))

openrlhf_token_mean_ddp = pytest.mark.polgrad_conforms("ppo", advantages="token", **ON_GROUP)(
    openrlhf.training_step()
)

openrlhf_sequence_level_ddp = pytest.mark.polgrad_conforms("grpo", advantages="token", **ON_GROUP)(
    openrlhf.training_step(token_level_loss=False)
)

# FSDP2 (fully_shard, the gradient reduce-scattered with an average): one step each.
verl_token_mean_fsdp = pytest.mark.polgrad_conforms(
    "ppo", dual_clip=3.0, advantages="token", **ON_FSDP
)(verl.training_step("vanilla", loss_agg_mode="token-mean"))

trl_dapo_fsdp = pytest.mark.polgrad_conforms(
    "dapo", expect={"generation-steps": _GENERATION}, **ON_FSDP
)(trl.training_step(loss_type="dapo", epsilon_high=0.28))

openrlhf_token_mean_fsdp = pytest.mark.polgrad_conforms("ppo", advantages="token", **ON_FSDP)(
    openrlhf.training_step()
)

# World size 4: the same steps and declarations on a 4-rank group (a drawn split of 4
# ranks runs there; one of 2 or 3 ranks on the 2-rank pool).
ON_GROUP_4 = {**ON_GROUP, "world_size": 4}
ON_FSDP_4 = {**ON_FSDP, "world_size": 4}

verl_token_mean_ddp4 = pytest.mark.polgrad_conforms(
    "ppo", dual_clip=3.0, advantages="token", **ON_GROUP_4
)(verl.training_step("vanilla", loss_agg_mode="token-mean"))

verl_geo_mean_ddp4 = pytest.mark.polgrad_conforms(
    "gmpo",
    expect={"micro-batches": _GEO, "data-parallel": _GEO, "generation-steps": _GEO},
    **ON_GROUP_4,
)(
    verl.training_step(
        "geo_mean", loss_agg_mode="token-mean", clip_ratio_low=0.4, clip_ratio_high=0.4
    )
)

trl_dapo_ddp4 = pytest.mark.polgrad_conforms(
    "dapo", expect={"generation-steps": _GENERATION}, **ON_GROUP_4
)(trl.training_step(loss_type="dapo", epsilon_high=0.28))

openrlhf_token_mean_ddp4 = pytest.mark.polgrad_conforms("ppo", advantages="token", **ON_GROUP_4)(
    openrlhf.training_step()
)

openrlhf_sequence_level_ddp4 = pytest.mark.polgrad_conforms(
    "grpo", advantages="token", **ON_GROUP_4
)(openrlhf.training_step(token_level_loss=False))

verl_token_mean_fsdp4 = pytest.mark.polgrad_conforms(
    "ppo", dual_clip=3.0, advantages="token", **ON_FSDP_4
)(verl.training_step("vanilla", loss_agg_mode="token-mean"))

trl_dapo_fsdp4 = pytest.mark.polgrad_conforms(
    "dapo", expect={"generation-steps": _GENERATION}, **ON_FSDP_4
)(trl.training_step(loss_type="dapo", epsilon_high=0.28))

openrlhf_token_mean_fsdp4 = pytest.mark.polgrad_conforms("ppo", advantages="token", **ON_FSDP_4)(
    openrlhf.training_step()
)

# The same OpenRLHF step on the simulated ranks: correct where a single process is
# (micro-batches), per-rank token counts where the real group would all-reduce them.
openrlhf_token_mean_simulated = pytest.mark.polgrad_conforms(
    "ppo",
    kind="training_step",
    advantages="token",
    checks=("micro-batches", "data-parallel"),
    expect={"data-parallel": _NO_GROUP},
)(openrlhf.training_step())
