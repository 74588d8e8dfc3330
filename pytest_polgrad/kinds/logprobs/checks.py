"""The checks of the logprobs kind, each one property of ``logp = log softmax(z / tau)[y]``
(docs/logprobs.md, "The kind")."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import torch

from polgrad_reference import PolgradError
from pytest_polgrad.core.kinds import KindCheck
from pytest_polgrad.core.tolerance import Tolerance
from pytest_polgrad.core.verdicts import CheckFailure, Verdict
from pytest_polgrad.kinds._token_checks import against_own, unchanged_inputs
from pytest_polgrad.kinds._tokens import bitwise_equal, compare_tensor
from pytest_polgrad.strategies._logits import read_positions

from .calls import LogprobsContext, call_logprobs, passed_inputs
from .reference import expected_logprobs, logprob_scales, rows_read

__all__ = ["CHECKS", "boundary_crossings", "reference_of"]


def reference_of(
    ctx: LogprobsContext, kw: Mapping[str, Any]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(expected, expected_grad, scale, grad_scale)`` at the function's temperature."""
    tau = ctx.temperature(kw)
    try:
        expected, grad = expected_logprobs(ctx.reference, kw, temperature=tau)
    except PolgradError as exc:
        raise Verdict(f"the reference cannot compute this batch: {exc}") from exc
    scale, grad_scale = logprob_scales(ctx.reference, kw, expected, grad, temperature=tau)
    return expected, grad, scale, grad_scale


def _value(ctx: LogprobsContext, kw: Mapping[str, Any], what: str = "logprobs") -> float:
    res = call_logprobs(ctx, kw, grad=False)
    expected, _, scale, _ = reference_of(ctx, kw)
    tau = ctx.temperature(kw)
    return compare_tensor(
        ctx, res.out, expected, scale, kw["response_mask"], what, f" (temperature {tau:g})"
    )


def _check_value(ctx: Any, kw: Mapping[str, Any]) -> float:
    return _value(ctx, kw)


def _check_temperature(ctx: Any, kw: Mapping[str, Any]) -> float:
    return _value(ctx, kw, "logprobs at a temperature other than 1")


def _check_gradient(ctx: Any, kw: Mapping[str, Any]) -> float:
    res = call_logprobs(ctx, kw)
    assert res.grad is not None
    _, expected, _, scale = reference_of(ctx, kw)
    rows = rows_read(kw["response_mask"], ctx.reference)
    where = rows[:, :, None].expand_as(expected)
    err = compare_tensor(ctx, res.grad, expected, scale, where, "gradient w.r.t. logits")
    leak = (res.grad != 0) & ~where
    if bool(leak.any()):
        pos = [tuple(p) for p in leak.nonzero()[:4].tolist()]
        raise CheckFailure(
            "gradient flows into logits rows that no selected position reads, at "
            f"(row, position, vocab) {pos}",
            entries=[(p, 0.0, float(res.grad[p])) for p in pos],
        )
    return err


def _check_masked_vocab(ctx: Any, kw: Mapping[str, Any]) -> float:
    err = _value(ctx, kw, "logprobs with -inf (masked) vocabulary entries")
    res = call_logprobs(ctx, kw)
    assert res.grad is not None
    rows = rows_read(kw["response_mask"], ctx.reference)
    dead = (kw["logits"] == -math.inf) & rows[:, :, None]
    bad = dead & ~(res.grad == 0)
    if bool(bad.any()):
        pos = [tuple(p) for p in bad.nonzero()[:4].tolist()]
        raise CheckFailure(
            f"the gradient at -inf (masked) vocabulary entries is not exactly 0 at {pos}",
            entries=[(p, 0.0, float(res.grad[p])) for p in pos],
        )
    return err


def _check_float32(ctx: Any, kw: Mapping[str, Any]) -> float:
    """The result must be float32 arithmetic on the upcast logits: judged with float32's
    tolerance alone (no allowance for a half-precision log-softmax or result)."""
    strict = dataclasses.replace(
        ctx,
        tolerance=Tolerance(torch.float32, strict=True, factor=ctx.options.tolerance),
        worst=0.0,
        notes=set(),
    )
    res = call_logprobs(ctx, kw, grad=False)
    expected, _, scale, _ = reference_of(ctx, kw)
    dtype = str(kw["logits"].dtype).removeprefix("torch.")
    err = compare_tensor(
        strict,
        res.out,
        expected,
        scale,
        kw["response_mask"],
        "logprobs",
        f" of float32 arithmetic on the upcast {dtype} logits (result dtype "
        f"{str(res.out.dtype).removeprefix('torch.')})",
    )
    ctx.worst = max(ctx.worst, err)
    return err


def _sentinels(ctx: LogprobsContext, out: torch.Tensor, mask: torch.Tensor) -> None:
    positive = torch.isfinite(out) & (out > 0)
    if bool(positive.any()):
        pos = [tuple(p) for p in positive.nonzero()[:4].tolist()]
        values = sorted({float(out[p]) for p in pos})
        where = (
            "positions the mask leaves out" if not bool((positive & mask).any()) else "positions"
        )
        raise CheckFailure(
            f"the function returns logprob(s) {values} > 0 (probability > 1) at {where} {pos}: "
            "a sentinel such as 1.0 at padding turns a sum over the row (an entropy estimate "
            "-sum logp, a ratio) wrong (TRL #2022 / #6121: entropy < 0); use 0 and a mask",
            entries=[(p, 0.0, float(out[p])) for p in pos],
        )


def _own(ctx: LogprobsContext, kw: Mapping[str, Any], other: Mapping[str, Any], why: str) -> float:
    base = call_logprobs(ctx, kw, grad=False)
    _sentinels(ctx, base.out, kw["response_mask"])
    out = call_logprobs(ctx, other, grad=False).out[:, : kw["response_mask"].shape[1]]
    _, _, scale, _ = reference_of(ctx, kw)
    with against_own(why):
        own = base.out.to(torch.float64).nan_to_num(0.0)
        return compare_tensor(ctx, out, own, scale, kw["response_mask"], "logprobs")


def _check_padding_values(ctx: Any, kw: Mapping[str, Any]) -> float:
    mask = kw["response_mask"]
    rows = rows_read(mask, ctx.reference)
    _, ids_at = _ids_read(ctx, mask)
    g = torch.Generator().manual_seed(5)
    z = kw["logits"]
    junk = ((torch.rand(z.shape, generator=g, dtype=torch.float64) * 2 - 1) * 3e3).to(z.dtype)
    other_ids = torch.randint(0, z.shape[2], kw["input_ids"].shape, generator=g)
    other = {
        **kw,
        "logits": torch.where(rows[:, :, None], z, junk),
        "input_ids": torch.where(ids_at, kw["input_ids"], other_ids),
    }
    return _own(ctx, kw, other, "with other logits and token ids where no selected position reads")


def _ids_read(ctx: LogprobsContext, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return read_positions(mask, ctx.reference.shift, ctx.reference.align)


def _check_padding_columns(ctx: Any, kw: Mapping[str, Any]) -> float:
    pad = torch.nn.functional.pad
    wide = {
        **kw,
        "logits": pad(kw["logits"], (0, 0, 0, 3), value=4.0),
        "input_ids": pad(kw["input_ids"], (0, 3), value=0),
        "response_mask": pad(kw["response_mask"], (0, 3), value=False),
    }
    return _own(ctx, kw, wide, "with 3 more padding columns")


def _check_inputs_unchanged(ctx: Any, kw: Mapping[str, Any]) -> float:
    before = passed_inputs(ctx, kw)
    res = call_logprobs(ctx, kw)
    unchanged_inputs(res.given, before)
    return 0.0


def _check_deterministic(ctx: Any, kw: Mapping[str, Any]) -> float:
    a = call_logprobs(ctx, kw)
    b = call_logprobs(ctx, kw)
    assert a.grad is not None and b.grad is not None
    if not (bool(bitwise_equal(a.out, b.out).all()) and bool(bitwise_equal(a.grad, b.grad).all())):
        raise CheckFailure(
            "the function returned different results for the same batch on two calls"
        )
    return 0.0


def _perturbed(kw: Mapping[str, Any], keep: torch.Tensor, seed: int) -> dict[str, Any]:
    """``kw`` with the logits rows and token ids of every position outside ``keep`` (a
    ``[B, T]`` bool) replaced by other finite logits and valid ids."""
    g = torch.Generator().manual_seed(seed)
    z = kw["logits"]
    junk = (torch.randn(z.shape, generator=g, dtype=torch.float64) * 3.0).to(z.dtype)
    ids = torch.randint(0, z.shape[2], kw["input_ids"].shape, generator=g)
    return {
        **kw,
        "logits": torch.where(keep[:, :, None], z, junk),
        "input_ids": torch.where(keep, kw["input_ids"], ids),
    }


def _changed(a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor, tol: Tolerance) -> torch.Tensor:
    """Entries of ``a`` and ``b`` that differ beyond rounding (NaN equal to NaN)."""
    same = bitwise_equal(a, b)
    diff = (a.double() - b.double()).abs()
    eps = max(torch.finfo(p).eps for p in tol.precisions)
    return ~same & ~(diff <= 32 * eps * scale)


def boundary_crossings(
    ctx: LogprobsContext, kw: Mapping[str, Any]
) -> list[tuple[int, int, list[int]]]:
    """For each sequence ``k`` whose outputs (at any of its positions, selected or not)
    change when only other sequences' logits and tokens change: ``(k, neighbour, stream
    positions)``, ``neighbour`` the sequence whose change alone moves it (adjacent ones
    tried first: a roll's wrap-around reaches the far end), or -1 when no single one does."""
    lengths = kw["lengths"]
    b, width = kw["response_mask"].shape
    cols = torch.arange(width)[None, :]
    inside = cols < lengths[:, None]
    base = call_logprobs(ctx, kw, grad=False)
    z = kw["logits"].detach().to(torch.float64)
    mag = torch.where(torch.isfinite(z), z, 0.0).abs().amax(dim=2)
    scale = 1.0 + base.out.double().abs().nan_to_num(0.0) + mag + math.log(z.shape[2])
    starts = torch.cumsum(lengths, 0) - lengths
    found = []
    for k in range(b):
        if int(lengths[k]) == 0:
            continue
        row = torch.zeros(b, dtype=torch.bool)
        row[k] = True
        keep = row[:, None] & inside
        out = call_logprobs(ctx, _perturbed(kw, keep | ~inside, 11 + k), grad=False).out
        moved = _changed(out[k], base.out[k], scale[k], ctx.tolerance) & inside[k]
        if not bool(moved.any()):
            continue
        neighbour = -1
        order = [k + 1, k - 1, *(j for j in range(b) if abs(j - k) > 1)]
        for j in order:  # adjacent first; a roll's wrap-around reaches the far end
            if 0 <= j < b and int(lengths[j]) > 0:
                only = torch.zeros(b, dtype=torch.bool)
                only[j] = True
                keep_j = ~(only[:, None] & inside)
                out_j = call_logprobs(ctx, _perturbed(kw, keep_j, 23 + j), grad=False).out
                if bool(
                    (_changed(out_j[k], base.out[k], scale[k], ctx.tolerance) & inside[k]).any()
                ):
                    neighbour = j
                    break
        positions = [int(starts[k]) + int(t) for t in moved.nonzero().flatten().tolist()]
        found.append((k, neighbour, positions))
    return found


def describe_crossing(k: int, neighbour: int, positions: list[int]) -> str:
    """``reads across the boundary of sequence 3 ...`` for one crossing."""
    side = (
        f" (its output there changes with sequence {neighbour}'s logits or tokens alone)"
        if neighbour >= 0
        else ""
    )
    return (
        f"reads across the boundary of sequence {k}: its output at stream position(s) "
        f"{positions[:4]} depends on another sequence{side}"
    )


def _check_packed_boundary(ctx: Any, kw: Mapping[str, Any]) -> float:
    crossings = boundary_crossings(ctx, kw)
    if crossings:
        k, neighbour, positions = crossings[0]
        more = f" (and {len(crossings) - 1} more sequence(s))" if len(crossings) > 1 else ""
        raise CheckFailure(
            f"the function {describe_crossing(k, neighbour, positions)}{more}; a torch.roll "
            "over the packed stream pulls the next sequence's first token into a sequence's "
            "last position (verl #6475): shift within each cu_seqlens segment"
        )
    return 0.0


# every check by name, in report order
CHECKS: dict[str, KindCheck] = {
    c.name: c
    for c in (
        KindCheck(
            "value",
            "per-token logprobs equal log softmax(z / tau)[y] with the stated shift",
            _check_value,
        ),
        KindCheck(
            "gradient",
            "d logp / d logits equals (onehot - softmax(z / tau)) / tau on rows read, 0 elsewhere",
            _check_gradient,
        ),
        KindCheck(
            "temperature",
            "at temperatures other than 1, the temperature divides the logits once",
            _check_temperature,
            domain="temperature",
        ),
        KindCheck(
            "large-logits",
            "logits offset by +-1e4 give exact, finite logprobs (needs the max shift)",
            _check_value,
            domain="extreme",
        ),
        KindCheck(
            "masked-vocab",
            "-inf logits (a masked vocabulary) are left out of the normaliser, gradient 0 there",
            _check_masked_vocab,
            domain="masked-vocab",
        ),
        KindCheck(
            "large-vocab",
            "a production-size vocabulary (computed in chunks or not) gives the same logprobs",
            _check_value,
            domain="large-vocab",
        ),
        KindCheck(
            "float32-log-softmax",
            "from half-precision logits, the log-softmax is computed in float32",
            _check_float32,
        ),
        KindCheck(
            "packed-boundary",
            "no output of a packed sequence depends on another sequence's logits or tokens",
            _check_packed_boundary,
            domain="packed",
        ),
        KindCheck(
            "padding-values",
            "logits and token ids nobody reads do not change the result; no sentinel > 0",
            _check_padding_values,
            semantic=False,
        ),
        KindCheck(
            "padding-columns",
            "extra padding columns do not change the result",
            _check_padding_columns,
            semantic=False,
        ),
        KindCheck(
            "inputs-unchanged",
            "the function does not modify its inputs in place",
            _check_inputs_unchanged,
            semantic=False,
        ),
        KindCheck(
            "deterministic",
            "the same batch gives the same result and gradient twice",
            _check_deterministic,
            semantic=False,
        ),
    )
}


def applicable(layout: str, dtype: str) -> list[KindCheck]:
    """The checks for a marker: ``float32-log-softmax`` for half-precision inputs only,
    ``packed-boundary`` for the packed layout only, ``padding-columns`` for padded only."""
    skip = set()
    if dtype not in ("bfloat16", "float16"):
        skip.add("float32-log-softmax")
    if layout != "packed":
        skip.add("packed-boundary")
    else:
        skip.add("padding-columns")
    return [c for n, c in CHECKS.items() if n not in skip]
