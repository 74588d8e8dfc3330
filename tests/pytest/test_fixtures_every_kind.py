"""``polgrad_oracle`` and ``polgrad_batch`` for every kind (issue 27: they covered policy
losses only): the batch is one of the kind's corpus inputs under the names a marked
function receives, and the oracle is that kind's reference, checked against an
independent formula (and against a wrong reference, which must differ)."""

from __future__ import annotations

import pytest
import torch

from polgrad_reference import ConfigError
from pytest_polgrad.pytest.fixtures import make_batch, make_oracle
from tests.helpers import inline_run

pytest_plugins = ["pytester"]

Tensor = torch.Tensor


def _k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k3 = exp(ref - lp) - (ref - lp) - 1 (arXiv:2402.03300 Eq. 4)."""
    d = ref_logprobs - logprobs
    return torch.exp(d) - d - 1


def test_kl_oracle_is_the_penalty_at_response_positions() -> None:
    batch = make_batch("ragged", kind="kl")
    assert {"logprobs", "ref_logprobs", "response_mask"} <= set(batch)
    mask = batch["response_mask"]
    expected = _k3(batch["logprobs"].double(), batch["ref_logprobs"].double())
    got = make_oracle("k3", kind="kl")(**batch)
    assert torch.allclose(got[mask], expected[mask], rtol=1e-12, atol=0)
    wrong = make_oracle("k1", kind="kl")(**batch)
    assert not torch.allclose(wrong[mask], expected[mask])


def test_aggregation_oracle_is_the_modes_equation() -> None:
    batch = make_batch("ragged", kind="aggregation")
    x, mask = batch["x"].double(), batch["response_mask"]
    token_mean = x[mask].sum() / mask.sum()
    rows = [x[b][mask[b]].mean() for b in range(x.shape[0]) if mask[b].any()]
    seq_mean = torch.stack(rows).mean()
    assert torch.allclose(make_oracle("token-mean", kind="aggregation")(**batch), token_mean)
    got = make_oracle("seq-mean-token-mean", kind="aggregation")(**batch)
    assert torch.allclose(got, seq_mean) and not torch.allclose(got, token_mean)


def test_entropy_oracle_is_the_softmax_entropy() -> None:
    batch = make_batch("ragged", kind="entropy")
    assert set(batch) == {"logits", "response_mask"}
    logp = torch.log_softmax(batch["logits"].double(), dim=-1)
    expected = -(logp.exp() * logp).sum(-1)
    mask = batch["response_mask"]
    got = make_oracle("entropy", kind="entropy")(**batch)
    assert torch.allclose(got[mask], expected[mask], rtol=1e-12, atol=0)
    negated = make_oracle("entropy_loss", kind="entropy")(**batch)
    assert torch.allclose(negated[mask], -expected[mask], rtol=1e-12, atol=0)


def test_advantages_oracle_is_the_group_normalised_reward() -> None:
    """GRPO: (r - mean_g) / (std_g + 1e-6), Bessel-corrected std; Dr.GRPO: r - mean_g."""
    batch = make_batch("groups", kind="advantages")
    r, ids = batch["rewards"].double(), batch["group_ids"]
    centred = torch.empty_like(r)
    scaled = torch.empty_like(r)
    for g in ids.unique():
        s = ids == g
        centred[s] = r[s] - r[s].mean()
        scaled[s] = centred[s] / (r[s].std() + 1e-6) if int(s.sum()) > 1 else 0.0
    given = {k: batch[k] for k in ("rewards", "group_ids", "response_mask")}
    assert torch.allclose(make_oracle("grpo", kind="advantages")(**given), scaled)
    assert torch.allclose(make_oracle("dr_grpo", kind="advantages")(**given), centred)


def test_value_loss_oracle_is_the_clipped_squared_error() -> None:
    """PPO: 1/2 max((v - R)^2, (clip(v, v_old +- 0.2) - R)^2), token-mean."""
    batch = make_batch("ragged", kind="value_loss")
    v, old, ret = (batch[k].double() for k in ("values", "old_values", "returns"))
    mask = batch["response_mask"]
    clipped = old + (v - old).clamp(-0.2, 0.2)
    per_token = 0.5 * torch.maximum((v - ret) ** 2, (clipped - ret) ** 2)
    expected = per_token[mask].mean()
    assert torch.allclose(make_oracle("ppo", kind="value_loss")(**batch), expected)
    unclipped = make_oracle("unclipped", kind="value_loss")(**batch)
    assert not torch.allclose(unclipped, expected)


def test_training_step_batch_carries_its_split_and_the_oracle_is_the_full_batch_loss() -> None:
    batch = make_batch("micro-batches", kind="training_step")
    assert "split" in batch and {"logprobs", "response_mask"} <= set(batch)
    tensors = {k: v for k, v in batch.items() if k != "split" and k != "rollout_logprobs"}
    step = make_oracle("grpo", kind="training_step")(**tensors)
    assert torch.equal(step.loss, make_oracle("grpo")(**tensors).loss)


def test_bad_kind_and_batch_are_named_errors() -> None:
    with pytest.raises(ConfigError, match=r"polgrad_oracle: .*kind"):
        make_oracle("k3", kind="kll")
    with pytest.raises(ValueError, match="unknown canonical batch 'raged' of kind 'kl'"):
        make_batch("raged", kind="kl")
    with pytest.raises(ConfigError, match="polgrad_batch: "):
        make_batch("ragged", kind="kl", reference="k9")


def test_the_fixtures_take_kind(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_fixture_kinds="""
        import torch

        def test_kl(polgrad_oracle, polgrad_batch):
            batch = polgrad_batch("ragged", kind="kl")
            penalty = polgrad_oracle("k3", kind="kl", clamp=10)(**batch)
            assert penalty.shape == batch["logprobs"].shape

        def test_entropy(polgrad_oracle, polgrad_batch):
            batch = polgrad_batch("ragged", kind="entropy", dtype=torch.float32)
            assert batch["logits"].dtype == torch.float32
            assert polgrad_oracle("entropy", kind="entropy")(**batch).dtype == torch.float64
        """
    )
    result = inline_run.run(pytester, "-p", "no:cacheprovider", "-q")
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.assert_outcomes(passed=2)
