"""Packed (THD / varlen) batches for every token kind (issue 31, docs/packed.md).

- The padded-vs-packed sweep: every correct implementation of ``tests/kinds/test_sweep.py``
  (and the correct entropy, value-loss and advantage estimators) gets the same verdict on
  every check padded and packed; packed, it runs behind :func:`from_packed`, the
  remove-padding path that pads the stream back (as verl's ``pad_input`` does), so a
  difference can only come from the kit's packing.
- Functions written for the stream (segments from ``cu_seqlens`` or ``position_ids``) pass;
  the same functions reading one token across a sequence boundary fail and are named, in
  the aggregation, value-loss and advantages kinds.
- A packed failure's snippet runs as printed and calls the function on the stream.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch

from pytest_polgrad import assert_conforms
from pytest_polgrad.api import ConformanceError, ConformanceReport
from pytest_polgrad.core.options import ConformanceOptions
from pytest_polgrad.kinds._packed import Packing, call_in_layout
from tests.kinds import _sweep_verdicts as runs
from tests.kinds import test_sweep as sweep
from tests.kinds.advantages import test_kind as adv
from tests.kinds.entropy import test_kind as ent
from tests.kinds.value_loss import test_kind as val

T = torch.Tensor
_ROWS = ("rewards", "group_ids")  # [B] inputs: never token streams
_SEQ = "seq-mean-token-mean"


def from_packed(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (written for right-padded ``[B, T]`` tensors) behind a packed signature: each
    ``[N, ...]`` stream is padded back to ``[B, max L_b, ...]`` from ``cu_seqlens``, and each
    ``[B, max L_b, ...]`` result packed again."""

    def packed(**kw: Any) -> Any:
        cu = kw.pop("cu_seqlens")
        lengths = (cu[1:] - cu[:-1]).to(torch.int64)
        n, rows = int(cu[-1]), lengths.shape[0]
        width = int(lengths.max()) if rows else 0
        keep = torch.arange(width)[None, :] < lengths[:, None]

        def pad(name: str, v: Any) -> Any:
            if not torch.is_tensor(v) or v.dim() == 0 or v.shape[0] != n or name in _ROWS:
                return v
            if name == "advantages" and v.dim() == 1 and n == rows:
                return v  # one token per row: [B] and [N] agree
            full = v.new_zeros((rows, width, *v.shape[1:]))
            full[keep] = v
            return full

        out = fn(**{k: pad(k, v) for k, v in kw.items()})

        def repack(v: Any) -> Any:
            if torch.is_tensor(v) and tuple(v.shape[:2]) == (rows, width) and v.dim() >= 2:
                return v[keep]
            return v

        if isinstance(out, tuple):
            return tuple(repack(v) for v in out)
        if isinstance(out, dict):
            return {k: repack(v) for k, v in out.items()}
        return repack(out)

    sig = inspect.signature(fn)
    params = [*sig.parameters.values()]
    params.append(inspect.Parameter("cu_seqlens", inspect.Parameter.KEYWORD_ONLY))
    packed.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    packed.__name__ = packed.__qualname__ = f"{fn.__name__}_packed"
    return packed


def _sweep_cases() -> list[tuple[str, Any, str, dict[str, Any]]]:
    out = list(sweep.CASES)
    out = [c for c in out if "layout" not in c[3]]  # written for the stream already
    out += [("entropy", fn, "entropy", {}) for fn in (ent.per_token_ok, ent.bonus_ok)]
    out.append(("entropy", ent.per_token_float32, "entropy", {"dtype": "bfloat16"}))
    out += [
        ("value_loss", val.value_loss_ok, "ppo", {}),
        ("value_loss", val.value_loss_float32, "ppo", {"dtype": "float32"}),
        (
            "value_loss",
            val.value_loss_seq_mean,
            "ppo",
            {"overrides": {"aggregation": "seq-mean-token-mean"}},
        ),
        ("advantages", adv.gae_ok, "gae", {}),
        ("advantages", adv.grpo_loop, "grpo", {}),
        ("advantages", adv.reinforce_pp_ok, "reinforce_pp", {}),
    ]
    return out


CASES = _sweep_cases()
SEEDS = range(2)


def _verdicts(kind: str, fn: Any, reference: str, options: dict[str, Any]) -> dict[str, str]:
    """Each check's verdict over :data:`SEEDS`: ``""`` (passed) or its first report (the
    sweep's runs, tests/kinds/_sweep_verdicts: the padded ones are test_sweep's own)."""
    out = {}
    for check in runs.check_names(kind, fn, reference, options):
        results = [runs.result(kind, fn, reference, options, check=check, seed=s) for s in SEEDS]
        out[check] = next((r.report for r in results if not r.passed), "")
    return out


@pytest.mark.parametrize(
    ("kind", "fn", "reference", "options"),
    CASES,
    ids=[f"{k}-{f.__name__}-{r}-{o.get('dtype', 'float64')}" for k, f, r, o in CASES],
)
def test_every_correct_implementation_gets_the_same_verdict_padded_and_packed(
    kind: str, fn: Any, reference: str, options: dict[str, Any]
) -> None:
    padded = _verdicts(kind, fn, reference, options)
    packed = _verdicts(kind, from_packed(fn), reference, {**options, "layout": "packed"})
    assert set(padded) - set(packed) == {"padding-columns"} & set(padded), sorted(packed)
    assert set(packed) - set(padded) <= {"packed-boundary"}, sorted(packed)  # logprobs'
    assert {c: v for c, v in padded.items() if c in packed} == {c: packed[c] for c in padded
                                                                 if c in packed}  # fmt: skip
    assert not any(packed.values()), packed


# ------------------------------------------------ functions written for the stream


def _segments(cu_seqlens: T, reach: int = 0) -> list[slice]:
    """Each sequence's span of the stream; ``reach=1`` runs one token into the next
    sequence (the boundary bug)."""
    bounds = cu_seqlens.tolist()
    return [slice(a, b + reach) for a, b in itertools.pairwise(bounds)]


def _starts(position_ids: T) -> T:
    """``cu_seqlens`` rebuilt from ``position_ids`` that restart at 0."""
    starts = (position_ids == 0).nonzero().flatten()
    return torch.cat([starts, torch.tensor([position_ids.shape[0]])])


def agg_seq_mean(x: T, response_mask: T, cu_seqlens: T) -> T:
    """Seq-mean-token-mean over the stream's segments (GRPO)."""
    means = [x[s][response_mask[s]].mean() for s in _segments(cu_seqlens)]
    return torch.stack(means).mean()


def agg_seq_mean_by_position(x: T, response_mask: T, position_ids: T) -> T:
    means = [x[s][response_mask[s]].mean() for s in _segments(_starts(position_ids))]
    return torch.stack(means).mean()


def agg_seq_mean_across(x: T, response_mask: T, cu_seqlens: T) -> T:
    """Each segment runs one token into the next sequence."""
    means = [x[s][response_mask[s]].mean() for s in _segments(cu_seqlens, reach=1)]
    return torch.stack(means).mean()


def _value_seq_mean(values: T, old_values: T, returns: T, response_mask: T, cu: T, reach: int) -> T:
    clipped = old_values + (values - old_values).clamp(-0.2, 0.2)
    per = 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    return torch.stack([per[s][response_mask[s]].mean() for s in _segments(cu, reach)]).mean()


def value_seq_mean(values: T, old_values: T, returns: T, response_mask: T, cu_seqlens: T) -> T:
    return _value_seq_mean(values, old_values, returns, response_mask, cu_seqlens, 0)


def value_seq_mean_across(
    values: T, old_values: T, returns: T, response_mask: T, cu_seqlens: T
) -> T:
    return _value_seq_mean(values, old_values, returns, response_mask, cu_seqlens, 1)


def _gae(rewards: T, values: T, response_mask: T, cu: T, *, reset: bool) -> T:
    """GAE (gamma 1, lambda 0.95, outcome reward at each sequence's last response token)
    backwards over the stream, whitened over response tokens; without ``reset`` the
    recursion runs on from the next sequence (the varlen bug)."""
    v = values.detach().double()
    adv = torch.zeros(values.shape[0], dtype=torch.float64)
    nxt_v, nxt_a = 0.0, 0.0
    for row, s in reversed(list(enumerate(_segments(cu)))):
        if reset:
            nxt_v, nxt_a = 0.0, 0.0
        pos = (response_mask[s].nonzero().flatten() + s.start).tolist()
        for k in reversed(range(len(pos))):
            t = pos[k]
            r = float(rewards[row].detach()) if k == len(pos) - 1 else 0.0
            a = r + nxt_v - float(v[t]) + 0.95 * nxt_a
            adv[t], nxt_v, nxt_a = a, float(v[t]), a
    kept = adv[response_mask]
    white = (adv - kept.mean()) * torch.rsqrt(kept.var() + 1e-8)
    return torch.where(response_mask, white, 0.0).to(values.dtype)


def gae_packed(rewards: T, values: T, response_mask: T, cu_seqlens: T) -> T:
    return _gae(rewards, values, response_mask, cu_seqlens, reset=True)


def gae_across(rewards: T, values: T, response_mask: T, cu_seqlens: T) -> T:
    return _gae(rewards, values, response_mask, cu_seqlens, reset=False)


def _run(fn: Callable[..., Any], reference: str, kind: str, **options: Any) -> ConformanceReport:
    try:
        return assert_conforms(fn, reference, kind=kind, layout="packed", max_examples=6,
                               seed=1, **options)  # fmt: skip
    except ConformanceError as exc:
        return exc.report


STREAM = [
    (ent.per_token_ok, "entropy", "entropy", {}),
    (ent.bonus_ok, "entropy", "entropy", {"dtype": "float32"}),
    (agg_seq_mean, "grpo", "aggregation", {}),
    (agg_seq_mean_by_position, "grpo", "aggregation", {"dtype": "bfloat16"}),
    (value_seq_mean, "ppo", "value_loss", {"overrides": {"aggregation": "seq-mean-token-mean"}}),
    (gae_packed, "gae", "advantages", {"overrides": {"gamma": 1.0, "lam": 0.95}}),
    (gae_packed, "gae", "advantages", {"dtype": "float32"}),
]


@pytest.mark.parametrize(
    ("fn", "reference", "kind", "options"), STREAM, ids=[f"{c[2]}-{c[0].__name__}" for c in STREAM]
)
def test_functions_written_for_the_stream_pass_every_check(
    fn: Callable[..., Any], reference: str, kind: str, options: dict[str, Any]
) -> None:
    report = _run(fn, reference, kind, **options)
    assert report.ok, str(report)
    checks = {r.check for r in report.results}
    assert "value" in checks and "padding-columns" not in checks, checks


ACROSS = [
    (agg_seq_mean_across, "grpo", "aggregation", {}),
    (value_seq_mean_across, "ppo", "value_loss",
     {"overrides": {"aggregation": "seq-mean-token-mean"}}),
    (gae_across, "gae", "advantages", {}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("fn", "reference", "kind", "options"), ACROSS, ids=[f"{c[2]}-{c[0].__name__}" for c in ACROSS]
)
def test_reading_across_a_sequence_boundary_fails_value(
    fn: Callable[..., Any], reference: str, kind: str, options: dict[str, Any]
) -> None:
    report = _run(fn, reference, kind, **options)
    failed = {r.check: r for r in report.results if not r.passed}
    assert "value" in failed, str(report)
    assert "layout='packed'" in failed["value"].report or "cu_seqlens" in failed["value"].report


def test_packing_round_trips_and_passes_the_bounds() -> None:
    mask = torch.tensor([[True, True, False], [False, True, True], [True, False, False]])
    p = Packing.of(mask)
    assert p.lengths.tolist() == [2, 3, 1] and p.tokens == 6
    x = torch.arange(9.0).reshape(3, 3)
    assert p.pack(x).tolist() == [0.0, 1.0, 3.0, 4.0, 5.0, 6.0]
    assert p.unpack(p.pack(x)).tolist() == [[0, 1, 0], [3, 4, 5], [6, 0, 0]]
    assert p.bounds()["cu_seqlens"].tolist() == [0, 2, 5, 6]
    assert p.bounds()["position_ids"].tolist() == [0, 1, 0, 1, 2, 0]
    seen: dict[str, T] = {}

    def fn(x: T, response_mask: T, position_ids: T) -> T:
        seen.update(x=x, mask=response_mask, pos=position_ids)
        x.mul_(2.0)  # written back, so inputs-unchanged sees it
        return x * 1.0

    opts = ConformanceOptions("dapo", kind="aggregation", layout="packed")
    given = {"x": x.clone(), "response_mask": mask}
    out = call_in_layout(opts, fn, given, mask)
    assert seen["x"].shape == (6,) and "cu_seqlens" not in seen
    assert isinstance(out, torch.Tensor) and out.shape == (3, 3)
    assert given["x"].tolist() == [[0, 2, 2], [6, 8, 10], [12, 7, 8]]
