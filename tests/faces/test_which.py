"""``python -m pytest_polgrad which`` for every kind, one row per described match (issue 27:
it printed duplicate MATCH rows and covered policy losses only)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pytest_polgrad.__main__ import main

MODULE = """
import math

import pytest
import torch


@pytest.mark.polgrad_conforms("k1", kind="kl")
def kl_k3(logprobs, ref_logprobs):
    d = ref_logprobs - logprobs
    return torch.exp(d) - d - 1


@pytest.mark.polgrad_conforms("token-mean", kind="aggregation")
def agg_seq_mean(x, response_mask):
    m = response_mask.to(x.dtype)
    return ((x * m).sum(1) / m.sum(1)).mean()


@pytest.mark.polgrad_conforms("entropy", kind="entropy")
def entropy_bits(logits):
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1) / math.log(2)


@pytest.mark.polgrad_conforms("grpo", kind="advantages")
def adv_centred(rewards, group_ids):
    out = torch.zeros_like(rewards)
    for g in group_ids.unique():
        s = group_ids == g
        out[s] = rewards[s] - rewards[s].mean()
    return out


@pytest.mark.polgrad_conforms("ppo", kind="value_loss")
def value_unclipped(values, old_values, returns, response_mask):
    m = response_mask.to(values.dtype)
    return (0.5 * (values - returns) ** 2 * m).sum() / m.sum()


@pytest.mark.polgrad_conforms("dapo", kind="training_step")
def dapo_step_twice(
    logprobs, old_logprobs, advantages, response_mask, global_tokens, world_size,
    gradient_accumulation_steps,
):
    ratio = torch.exp(logprobs - old_logprobs)
    a = advantages[:, None]
    pt = torch.maximum(-a * ratio, -a * ratio.clamp(0.8, 1.28))
    return (pt * response_mask).sum() / global_tokens * world_size / gradient_accumulation_steps
"""

KINDS = [
    ("kl_k3", "kind='kl'", "k3, no clamp, in the loss"),
    ("agg_seq_mean", "kind='aggregation'", "seq-mean-token-mean"),
    ("entropy_bits", "kind='entropy'", "per-token H of the softmax in bits"),
    ("adv_centred", "kind='advantages'", "dr_grpo"),
    ("value_unclipped", "kind='value_loss'", "unclipped squared error x 1/2, token-mean"),
    ("dapo_step_twice", "kind='training_step'", "token-mean/step-over-accum"),
]


@pytest.mark.parametrize(("name", "kind", "match"), KINDS, ids=[k[0] for k in KINDS])
def test_which_names_what_a_function_of_any_kind_computes(
    name: str, kind: str, match: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each function implements something other than its marker's reference; ``which``
    names it from the kind's own diagnosis on its corpus, exit status 0."""
    (tmp_path / "kinds_mod.py").write_text(MODULE)
    status = main(["which", f"{tmp_path / 'kinds_mod.py'}::{name}"])
    out, err = capsys.readouterr()
    assert status == 0, err
    lines = out.splitlines()
    assert kind in lines[0]
    assert lines[1].split()[0] == "MATCH" and match in lines[1], out
    assert "diagnosis" in out


@dataclasses.dataclass
class _Row:
    text: str
    matches: bool
    error: float

    def describe(self) -> str:
        return self.text


def test_which_prints_each_row_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Points of the algebra that read the same (a knob the description does not print)
    are one row: the ranking below has three rows, not five."""
    from pytest_polgrad.kinds.policy_loss.diagnose import diagnosis

    ranked = [
        _Row("token-mean, token ratio, pg_clip eps 0.2/0.2 — ppo", True, 0.1),
        _Row("token-mean, token ratio, pg_clip eps 0.2/0.2 — ppo", True, 0.1),
        _Row("token-mean, token ratio, pg_clip eps 0.2/0.28 — dapo", False, 304.0),
        _Row("token-mean, token ratio, pg_clip eps 0.2/0.28 — dapo", False, 304.0),
        _Row("seq-mean-token-mean, token ratio, pg_clip eps 0.2/0.2 — grpo", False, 900.0),
    ]
    monkeypatch.setattr(diagnosis, "diagnose", lambda *a, **k: ranked)
    (tmp_path / "loss_mod.py").write_text(
        "import torch\n\n"
        "def tokmean(logprobs, old_logprobs, advantages, response_mask):\n"
        "    m = response_mask.to(logprobs.dtype)\n"
        "    pt = -advantages[:, None] * torch.exp(logprobs - old_logprobs)\n"
        "    return (pt * m).sum() / m.sum()\n"
    )
    assert main(["which", f"{tmp_path / 'loss_mod.py'}::tokmean", "--top", "5"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(("  MATCH", "  off by"))]
    assert len(rows) == 3 and len(set(rows)) == 3, out
    assert rows[0].split()[0] == "MATCH" and "ppo" in rows[0]
