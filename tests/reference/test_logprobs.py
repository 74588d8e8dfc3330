"""Per-token logprobs of sampled tokens and the truncating sampler's logprobs
(docs/logprobs.md).

Several properties are written as checks over an implementation and run twice: on the
reference (must pass) and on a deliberately wrong one (must fail), so each test is shown
to catch the bug it names: a ``torch.roll`` over a packed stream, temperature applied
twice or not at all, a log-softmax without the max shift, top-p before top-k.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from polgrad_reference.errors import ConfigError, InputError, InputTypeError
from polgrad_reference.logprobs import (
    cu_seqlens_from_position_ids,
    log_softmax_rounding_error,
    packed_token_logprobs,
    sampler_kept_mask,
    sampler_log_softmax,
    sampler_logprobs,
    token_logprobs,
)

F64 = torch.float64
INF = math.inf
NAN = math.nan


def _batch(
    seed: int, b: int = 3, t: int = 6, v: int = 11, dtype: torch.dtype = F64, scale: float = 2.0
) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    z = (scale * torch.randn((b, t, v), generator=g, dtype=F64)).to(dtype)
    ids = torch.randint(0, v, (b, t), generator=g)
    return z, ids


def _naive(z: torch.Tensor, ids: torch.Tensor, tau: float, shift: str, align: str) -> torch.Tensor:
    """float64 ``log_softmax`` + gather, the shift done by slicing."""
    lsm = torch.log_softmax(z.double() / tau, dim=-1)
    if shift == "none":
        return lsm.gather(-1, ids[..., None])[..., 0]
    scored = lsm[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
    zero = torch.zeros_like(scored[:, :1])
    return torch.cat([zero, scored] if align == "token" else [scored, zero], dim=1)


def _loop(z: list[float], y: int, tau: float) -> float:
    """``log softmax(z / tau)[y]`` in Python floats (math.fsum), ``-inf`` entries skipped."""
    u = [x / tau for x in z]
    m = max(u)
    return (u[y] - m) - math.log(math.fsum(math.exp(x - m) for x in u if x != -INF))


# ------------------------------------------------------------------ agreement, padded


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    ("shift", "align"), [("next", "token"), ("next", "logits"), ("none", "token")]
)
@pytest.mark.parametrize("tau", [1.0, 0.6, 1.7])
def test_agrees_with_naive_float64_log_softmax(
    seed: int, shift: str, align: str, tau: float
) -> None:
    z, ids = _batch(seed)
    out = token_logprobs(logits=z, input_ids=ids, shift=shift, temperature=tau, align=align)
    assert out.dtype == F64 and out.shape == ids.shape
    torch.testing.assert_close(out, _naive(z, ids, tau, shift, align), rtol=1e-14, atol=1e-14)


def test_agrees_with_a_python_loop() -> None:
    z, ids = _batch(7, b=2, t=4, v=5)
    z[0, 1, 3] = -INF
    ids[0, 2] = 0
    out = token_logprobs(logits=z, input_ids=ids, shift="next", temperature=0.8)
    for b in range(2):
        assert out[b, 0] == 0.0
        for t in range(1, 4):
            want = _loop(z[b, t - 1].tolist(), int(ids[b, t]), 0.8)
            assert float(out[b, t]) == pytest.approx(want, rel=1e-14, abs=1e-15)


def test_float32_input_agrees_to_float32_rounding() -> None:
    z, ids = _batch(3, b=4, t=8, v=257, dtype=torch.float32, scale=4.0)
    out = token_logprobs(logits=z, input_ids=ids, shift="next", temperature=0.7)
    assert out.dtype == torch.float32
    want = _naive(z, ids, 0.7, "next", "token")
    err = (out.double() - want).abs()
    assert float(err.max()) < 64 * 2**-24 * (1.0 + float(want.abs().max()))


def test_shift_none_and_next_differ_by_exactly_one_position() -> None:
    """The shift is the whole difference: next[t] == none computed on logits moved by one."""
    z, ids = _batch(5)
    nxt = token_logprobs(logits=z, input_ids=ids, shift="next", temperature=1.0)
    moved = torch.cat([z[:, :1], z[:, :-1]], dim=1)
    none = token_logprobs(logits=moved, input_ids=ids, shift="none", temperature=1.0)
    assert torch.equal(nxt[:, 1:], none[:, 1:]) and bool((nxt[:, 0] == 0).all())
    # and the two alignments hold the same numbers, one place apart
    lg = token_logprobs(logits=z, input_ids=ids, shift="next", temperature=1.0, align="logits")
    assert torch.equal(lg[:, :-1], nxt[:, 1:]) and bool((lg[:, -1] == 0).all())


# --------------------------------------------------------------- stability and -inf


def _shift_stable(fn: Callable[..., torch.Tensor]) -> None:
    """``log softmax(z + c) == log softmax(z)``: at ``c = 1e4`` (where ``exp`` overflows in
    every dtype) the result is finite and equal up to the rounding of ``z + c``."""
    z, ids = _batch(2)
    base = fn(logits=z, input_ids=ids, shift="next", temperature=1.0)
    for c in (1e4, -1e4):
        out = fn(logits=z + c, input_ids=ids, shift="next", temperature=1.0)
        assert bool(torch.isfinite(out).all())
        torch.testing.assert_close(out, base, rtol=0, atol=1e-10)


def _unshifted(*, logits: torch.Tensor, input_ids: torch.Tensor, **_: Any) -> torch.Tensor:
    """Mutant: ``z_y - log sum exp z`` without the max shift."""
    lse = torch.log(torch.exp(logits[:, :-1]).sum(-1))
    scored = logits[:, :-1].gather(-1, input_ids[:, 1:, None])[..., 0] - lse
    return torch.cat([torch.zeros_like(scored[:, :1]), scored], dim=1)


def test_max_shift_keeps_large_logits_exact() -> None:
    _shift_stable(token_logprobs)
    with pytest.raises(AssertionError):
        _shift_stable(_unshifted)


def test_large_spread_of_logits_is_exact() -> None:
    z = torch.tensor([[[0.0, 1e4, -1e4], [2e4, 0.0, 2e4]]], dtype=F64)
    ids = torch.tensor([[0, 1]])
    out = token_logprobs(logits=z, input_ids=ids, shift="none", temperature=1.0)
    assert out.tolist() == [[-1e4, -2e4 - math.log(2.0)]]


def test_minus_inf_logits_are_a_masked_vocabulary() -> None:
    z, ids = _batch(4, v=9)
    dead = torch.zeros_like(z, dtype=torch.bool)
    dead[..., 6:] = True  # the last 3 ids are masked everywhere
    z = z.masked_fill(dead, -INF)
    ids = ids % 6
    out = token_logprobs(logits=z, input_ids=ids, shift="next", temperature=0.9)
    want = _naive(z[..., :6], ids, 0.9, "next", "token")  # the same over the live ids
    torch.testing.assert_close(out, want, rtol=1e-14, atol=1e-14)
    # the gradient is finite and exactly 0 at the masked entries
    zg = z.clone().requires_grad_(True)
    token_logprobs(logits=zg, input_ids=ids, shift="next", temperature=0.9).sum().backward()  # type: ignore[no-untyped-call]
    assert zg.grad is not None and bool(torch.isfinite(zg.grad).all())
    assert bool((zg.grad[dead] == 0).all())


def test_sampled_token_with_minus_inf_logit_is_an_error_naming_it() -> None:
    z, ids = _batch(4)
    z[1, 2, int(ids[1, 3])] = -INF
    with pytest.raises(InputError, match=r"-inf.*probability 0.*\(1, 3\)"):
        token_logprobs(logits=z, input_ids=ids, shift="next", temperature=1.0)
    # not read when the mask leaves the position out
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[:, 0] = False
    mask[1, 3] = False
    out = token_logprobs(logits=z, input_ids=ids, shift="next", temperature=1.0, response_mask=mask)
    assert out[1, 3] == 0.0


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (NAN, "NaN at logits positions \\(0, 1\\) \\(scoring positions \\(0, 2\\)\\)"),
        (INF, "\\+inf at logits positions \\(0, 1\\)"),
    ],
)
def test_nan_and_plus_inf_logits_are_named(value: float, message: str) -> None:
    z, ids = _batch(6)
    z[0, 1, 4] = value
    with pytest.raises(InputError, match=message):
        token_logprobs(logits=z, input_ids=ids, shift="next", temperature=1.0)


def test_all_minus_inf_row_is_an_error() -> None:
    z, ids = _batch(6)
    z[2, 4] = -INF
    with pytest.raises(InputError, match=r"-inf over the whole vocabulary.*\(2, 4\)"):
        token_logprobs(logits=z, input_ids=ids, shift="none", temperature=1.0)


# ----------------------------------------------------------------- dtypes and chunks


def test_bfloat16_logits_give_a_float32_result() -> None:
    z, ids = _batch(8, b=4, t=16, v=512, scale=4.0)
    zb = (z + 20.0).bfloat16()
    out = token_logprobs(logits=zb, input_ids=ids, shift="next", temperature=0.7)
    assert out.dtype == torch.float32
    # exactly the float32 computation on the upcast logits
    assert torch.equal(
        out, token_logprobs(logits=zb.float(), input_ids=ids, shift="next", temperature=0.7)
    )
    exact = _naive(zb, ids, 0.7, "next", "token")
    lsm_bf16 = torch.log_softmax(zb / 0.7, dim=-1)  # what a bf16 trainer would compute
    bf16 = _naive(lsm_bf16.double(), ids, 1.0, "next", "token")
    err_ref = float((out.double() - exact).abs().max())
    err_bf16 = float((bf16 - exact).abs().max())
    assert err_ref < 1e-4 < err_bf16 and err_ref * 100 < err_bf16


@pytest.mark.parametrize("chunk", [1, 3, 7, 11, 40])
@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16])
def test_chunked_over_vocabulary_agrees(chunk: int, dtype: torch.dtype) -> None:
    z, ids = _batch(9, v=11, dtype=dtype, scale=5.0)
    z[0, 2, 5] = -INF
    z[1, :, :4] = -INF
    ids[1] = 4 + ids[1] % 7
    full = token_logprobs(logits=z, input_ids=ids, shift="next", temperature=0.8)
    chunked = token_logprobs(
        logits=z, input_ids=ids, shift="next", temperature=0.8, vocab_chunk=chunk
    )
    tol = 1e-14 if dtype == F64 else 2e-6
    torch.testing.assert_close(chunked, full, rtol=tol, atol=tol)
    # gradients agree too (float64)
    if dtype == F64:
        grads = []
        for vc in (None, chunk):
            zg = z.clone().requires_grad_(True)
            token_logprobs(
                logits=zg, input_ids=ids, shift="next", temperature=0.8, vocab_chunk=vc
            ).sum().backward()  # type: ignore[no-untyped-call]
            grads.append(zg.grad)
        torch.testing.assert_close(grads[0], grads[1], rtol=1e-13, atol=1e-15)


def test_gradient_is_one_hot_minus_softmax_over_temperature() -> None:
    """``d logp / dz = (onehot(y) - softmax(z / tau)) / tau`` on the row read, 0 elsewhere."""
    z, ids = _batch(10, b=2, t=4, v=6)
    tau = 0.7
    mask = torch.tensor([[False, True, False, True], [False, False, True, False]])
    zg = z.clone().requires_grad_(True)
    out = token_logprobs(
        logits=zg, input_ids=ids, shift="next", temperature=tau, response_mask=mask
    )
    out.sum().backward()  # type: ignore[no-untyped-call]
    want = torch.zeros_like(z)
    for b, t in mask.nonzero().tolist():
        row = -torch.softmax(z[b, t - 1] / tau, dim=-1)
        row[ids[b, t]] += 1.0
        want[b, t - 1] += row / tau
    assert zg.grad is not None
    torch.testing.assert_close(zg.grad, want, rtol=1e-13, atol=1e-15)
    zs = z[:1, :3, :4].clone().requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda x: token_logprobs(
            logits=x, input_ids=ids[:1, :3] % 4, shift="next", temperature=tau
        ),
        (zs,),
    )


# -------------------------------------------------------------------- temperature


def _temperature_once(fn: Callable[..., torch.Tensor]) -> None:
    z, ids = _batch(11)
    for tau in (0.5, 2.0):
        out = fn(logits=z, input_ids=ids, shift="next", temperature=tau)
        torch.testing.assert_close(
            out, _naive(z, ids, tau, "next", "token"), rtol=1e-12, atol=1e-12
        )


def _twice(**kw: Any) -> torch.Tensor:
    return token_logprobs(**{**kw, "temperature": kw["temperature"] ** 2})


def _missing(**kw: Any) -> torch.Tensor:
    return token_logprobs(**{**kw, "temperature": 1.0})


def _after_softmax(**kw: Any) -> torch.Tensor:
    """Mutant: divides the log-probabilities, not the logits."""
    out: torch.Tensor = token_logprobs(**{**kw, "temperature": 1.0}) / kw["temperature"]
    return out


def test_temperature_applied_once_to_the_logits() -> None:
    _temperature_once(token_logprobs)
    for mutant in (_twice, _missing, _after_softmax):
        with pytest.raises(AssertionError):
            _temperature_once(mutant)


# ------------------------------------------------------------------- response mask


def test_masked_positions_are_zero_and_never_read() -> None:
    z, ids = _batch(12)
    mask = torch.tensor([[False, True, True, False, False, False]] * 3)
    z_dirty, ids_dirty = z.clone(), ids.clone()
    z_dirty[:, 2:] = NAN  # logits rows 2.. score positions 3..: never read
    ids_dirty[:, 3:] = -100  # an ignore index at unread positions
    out = token_logprobs(
        logits=z_dirty, input_ids=ids_dirty, shift="next", temperature=1.0, response_mask=mask
    )
    full = token_logprobs(logits=z, input_ids=ids, shift="next", temperature=1.0)
    assert torch.equal(out, torch.where(mask, full, 0.0))
    zg = z.clone().requires_grad_(True)
    token_logprobs(
        logits=zg, input_ids=ids, shift="next", temperature=1.0, response_mask=mask
    ).sum().backward()  # type: ignore[no-untyped-call]
    assert (
        zg.grad is not None
        and bool((zg.grad[:, 2:] == 0).all())
        and bool((zg.grad[:, 0] != 0).any())
    )


def test_mask_selecting_a_position_without_prediction_is_an_error() -> None:
    z, ids = _batch(12)
    mask = torch.ones_like(ids, dtype=torch.bool)
    with pytest.raises(InputError, match=r"first position of a row.*\(0, 0\), \(1, 0\)"):
        token_logprobs(logits=z, input_ids=ids, shift="next", temperature=1.0, response_mask=mask)
    with pytest.raises(InputError, match=r"last position of a row.*\(0, 5\)"):
        token_logprobs(
            logits=z,
            input_ids=ids,
            shift="next",
            temperature=1.0,
            response_mask=mask,
            align="logits",
        )
    out = token_logprobs(logits=z, input_ids=ids, shift="none", temperature=1.0, response_mask=mask)
    assert bool((out != 0).all())


# ------------------------------------------------------------------------- packed


def _pack(
    z: torch.Tensor, ids: torch.Tensor, lengths: list[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    zs = torch.cat([z[b, :n] for b, n in enumerate(lengths)])
    ys = torch.cat([ids[b, :n] for b, n in enumerate(lengths)])
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return zs, ys, cu


@pytest.mark.parametrize("align", ["token", "logits"])
@pytest.mark.parametrize("seed", range(3))
def test_packed_equals_padded_row_by_row(align: str, seed: int) -> None:
    z, ids = _batch(seed, b=4, t=7)
    lengths = [7, 3, 1, 5]
    zs, ys, cu = _pack(z, ids, lengths)
    packed = packed_token_logprobs(
        logits=zs, input_ids=ys, shift="next", temperature=0.9, cu_seqlens=cu, align=align
    )
    padded = token_logprobs(logits=z, input_ids=ids, shift="next", temperature=0.9, align=align)
    for b, n in enumerate(lengths):
        seg = packed[int(cu[b]) : int(cu[b + 1])]
        if align == "token":  # row b's first n tokens read nothing beyond them
            assert torch.equal(seg, padded[b, :n])
        else:  # the last position of the sequence has no next token: 0, not pad-scored
            assert torch.equal(seg[: n - 1], padded[b, : n - 1]) and seg[n - 1] == 0.0
    pos = torch.cat([torch.arange(n) for n in lengths])
    by_pos = packed_token_logprobs(
        logits=zs, input_ids=ys, shift="next", temperature=0.9, position_ids=pos, align=align
    )
    assert torch.equal(by_pos, packed)
    assert torch.equal(cu_seqlens_from_position_ids(pos), cu)


def test_packed_with_empty_sequences_and_a_mask() -> None:
    z, ids = _batch(1, b=3, t=4)
    zs, ys, cu = _pack(z, ids, [4, 0, 3])
    mask = torch.tensor([False, True, True, False, False, True, True])
    out = packed_token_logprobs(
        logits=zs, input_ids=ys, shift="next", temperature=1.0, cu_seqlens=cu, response_mask=mask
    )
    full = packed_token_logprobs(
        logits=zs, input_ids=ys, shift="next", temperature=1.0, cu_seqlens=cu
    )
    assert torch.equal(out, torch.where(mask, full, 0.0))
    assert full[0] == 0.0 and full[4] == 0.0  # first token of each non-empty sequence


def _rolled(
    *, logits: torch.Tensor, input_ids: torch.Tensor, temperature: float, **_: Any
) -> torch.Tensor:
    """Mutant: verl-style ``torch.roll`` of the labels over the whole packed stream
    (verl #6475), then back to token alignment."""
    labels = torch.roll(input_ids, shifts=-1)
    lp = torch.log_softmax(logits.double() / temperature, -1).gather(-1, labels[:, None])[:, 0]
    out = torch.roll(lp, shifts=1)
    out[0] = 0.0
    return out


def _never_reads_across(fn: Callable[..., torch.Tensor]) -> None:
    """Under ``shift="next"``: (1) the first token of every sequence gets 0, (2) changing a
    sequence's last logits row or the next sequence's first token changes nothing."""
    z, ids = _batch(13, b=4, t=5)
    lengths = [5, 2, 4, 3]
    zs, ys, cu = _pack(z, ids, lengths)
    kw = {"shift": "next", "temperature": 1.0, "cu_seqlens": cu}
    base = fn(logits=zs, input_ids=ys, **kw)
    starts = cu[:-1].long()
    assert bool((base[starts] == 0).all()), "a sequence's first token was scored"
    for k in range(len(lengths) - 1):
        last, first = int(cu[k + 1]) - 1, int(cu[k + 1])
        z2, y2 = zs.clone(), ys.clone()
        z2[last] = torch.randn(z2.shape[1], dtype=F64, generator=torch.Generator().manual_seed(k))
        y2[first] = (y2[first] + 1) % z2.shape[1]
        out = fn(logits=z2, input_ids=y2, **kw)
        assert torch.equal(out, base), f"reads across the boundary after sequence {k}"


def test_packed_never_reads_across_a_sequence_boundary() -> None:
    _never_reads_across(packed_token_logprobs)
    with pytest.raises(AssertionError):
        _never_reads_across(_rolled)


# ------------------------------------------------------------------------ validation


def _call(**over: Any) -> torch.Tensor:
    z, ids = _batch(0)
    kw: dict[str, Any] = {"logits": z, "input_ids": ids, "shift": "next", "temperature": 1.0}
    return token_logprobs(**{**kw, **over})


@pytest.mark.parametrize(
    ("over", "error", "match"),
    [
        ({"logits": [[1.0]]}, InputTypeError, "logits must be a torch.Tensor"),
        (
            {"logits": torch.zeros(3, 6, 11, dtype=torch.int64)},
            InputTypeError,
            "logits must have a floating-point",
        ),
        ({"logits": torch.zeros(3, 6)}, InputError, r"logits must have shape \[B, T, V\]"),
        ({"input_ids": torch.zeros(3, 6)}, InputTypeError, "input_ids must be an integer tensor"),
        (
            {"input_ids": torch.zeros(3, 5, dtype=torch.int64)},
            InputError,
            "input_ids must have shape",
        ),
        (
            {"input_ids": torch.full((3, 6), 11)},
            InputError,
            r"input_ids must lie in \[0, V\) = \[0, 11\)",
        ),
        ({"shift": "previous"}, ConfigError, "shift must be one of 'next', 'none'"),
        ({"align": "left"}, ConfigError, "align must be one of"),
        ({"temperature": 0.0}, ConfigError, "temperature must be finite and > 0"),
        ({"temperature": -1.0}, ConfigError, "temperature must be finite and > 0"),
        ({"temperature": True}, ConfigError, "temperature must be a real number"),
        ({"temperature": INF}, ConfigError, "temperature must be finite"),
        ({"response_mask": torch.ones(3, 6)}, InputTypeError, "response_mask must be a torch.bool"),
        (
            {"response_mask": torch.ones(3, 5, dtype=torch.bool)},
            InputError,
            "response_mask must have shape",
        ),
        ({"vocab_chunk": 0}, ConfigError, "vocab_chunk must be a positive integer"),
    ],
)
def test_bad_padded_input_names_the_argument(over: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        _call(**over)


def _packed_call(**over: Any) -> torch.Tensor:
    z, ids = _batch(0, b=2, t=4)
    zs, ys, cu = _pack(z, ids, [4, 4])
    kw: dict[str, Any] = {
        "logits": zs,
        "input_ids": ys,
        "shift": "next",
        "temperature": 1.0,
        "cu_seqlens": cu,
    }
    return packed_token_logprobs(**{**kw, **over})


@pytest.mark.parametrize(
    ("over", "error", "match"),
    [
        ({"logits": torch.zeros(2, 4, 11)}, InputError, r"packed logits must have shape \[N, V\]"),
        (
            {"input_ids": torch.zeros(7, dtype=torch.int64)},
            InputError,
            r"input_ids must have shape \[N\]",
        ),
        ({"cu_seqlens": None}, ConfigError, "exactly one of cu_seqlens and position_ids"),
        (
            {"position_ids": torch.arange(8)},
            ConfigError,
            "exactly one of cu_seqlens and position_ids",
        ),
        (
            {"cu_seqlens": torch.tensor([0, 4, 7])},
            InputError,
            "cu_seqlens must run from 0 to N = 8",
        ),
        (
            {"cu_seqlens": torch.tensor([0, 5, 3, 8])},
            InputError,
            "cu_seqlens must be non-decreasing",
        ),
        ({"cu_seqlens": torch.tensor([0.0, 8.0])}, InputTypeError, "cu_seqlens must be an integer"),
        (
            {"cu_seqlens": None, "position_ids": torch.tensor([0, 1, 2, 4, 0, 1, 2, 3])},
            InputError,
            r"position_ids must restart at 0 or count up by one, but break at positions \(3\)",
        ),
        (
            {"cu_seqlens": None, "position_ids": torch.tensor([1, 2, 3, 4, 0, 1, 2, 3])},
            InputError,
            "position_ids must start at 0",
        ),
        (
            {"response_mask": torch.ones(8, dtype=torch.bool)},
            InputError,
            r"first position of a sequence.*0 \(sequence 0\), 4 \(sequence 1\)",
        ),
    ],
)
def test_bad_packed_input_names_the_argument(over: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        _packed_call(**over)


def test_packed_errors_name_the_sequence() -> None:
    z, ids = _batch(0, b=2, t=4)
    zs, ys, cu = _pack(z, ids, [4, 4])
    zs[5, 2] = NAN  # row 5 scores position 6 of the stream: sequence 1
    with pytest.raises(
        InputError,
        match=r"NaN at logits positions 5 \(sequence 1\) \(scoring positions 6 \(sequence 1\)\)",
    ):
        packed_token_logprobs(logits=zs, input_ids=ys, shift="next", temperature=1.0, cu_seqlens=cu)


# ----------------------------------------------------------------- rounding figure


def test_rounding_error_is_zero_in_float64_and_ordered_by_precision() -> None:
    z, ids = _batch(14, b=8, t=16, v=1024, scale=4.0)
    zb = z.bfloat16()
    errs = {
        d: log_softmax_rounding_error(logits=zb, labels=ids, temperature=0.7, compute_dtype=d)
        for d in (F64, torch.float32, torch.bfloat16)
    }
    assert errs[F64].max_abs == 0.0 and errs[F64].n == 8 * 16
    assert 0.0 < errs[torch.float32].max_abs < 1e-4 < errs[torch.bfloat16].max_abs
    assert errs[torch.bfloat16].compute_dtype == "bfloat16"
    e = errs[torch.bfloat16]
    assert e.mean_abs <= e.rms <= e.max_abs and e.max_ratio_error == pytest.approx(
        math.expm1(e.max_abs), rel=0.2
    )
    whole = log_softmax_rounding_error(logits=zb, compute_dtype=torch.bfloat16)
    assert whole.n == zb.numel() and set(whole.as_dict()) >= {"max_abs", "rms"}
    with pytest.raises(ConfigError, match="compute_dtype"):
        log_softmax_rounding_error(logits=zb, compute_dtype=torch.int32)
    with pytest.raises(InputError, match="labels must lie in"):
        log_softmax_rounding_error(logits=zb, labels=ids + 1024)


# --------------------------------------------------------------------------- sampler


def _kept_by_loop(z: list[float], tau: float, top_p: float, top_k: int) -> set[int]:
    """The kept set by its definition, in Python floats: top-k by value (ties kept), then
    top-p on the top-k-renormalised distribution (keep v iff the mass strictly more
    probable than v is < top_p)."""
    u = [x / tau for x in z]
    live = [i for i, x in enumerate(u) if x != -INF]
    if 0 < top_k < len(u):
        kth = sorted(u, reverse=True)[top_k - 1]
        live = [i for i in live if u[i] >= kth]
    if top_p >= 1.0:
        return set(live)
    m = max(u[i] for i in live)
    s = math.fsum(math.exp(u[i] - m) for i in live)
    q = {i: math.exp(u[i] - m) / s for i in live}
    return {i for i in live if math.fsum(q[j] for j in live if q[j] > q[i]) < top_p}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    ("top_p", "top_k"), [(1.0, 0), (0.8, 0), (0.5, 0), (1.0, 3), (0.9, 4), (0.3, 2), (0.95, 30)]
)
def test_kept_set_matches_its_definition(seed: int, top_p: float, top_k: int) -> None:
    z, _ = _batch(seed, b=2, t=3, v=12, scale=1.5)
    z[0, 0, 2] = -INF
    kept = sampler_kept_mask(logits=z, temperature=0.8, top_p=top_p, top_k=top_k)
    for b in range(2):
        for t in range(3):
            want = _kept_by_loop(z[b, t].tolist(), 0.8, top_p, top_k)
            assert set(kept[b, t].nonzero().flatten().tolist()) == want


def test_ties_at_both_thresholds_are_kept() -> None:
    z = torch.log(torch.tensor([0.3, 0.2, 0.2, 0.2, 0.1], dtype=F64))
    # top-k = 2: the 2nd value 0.2 is tied three ways -> all four kept
    assert sampler_kept_mask(logits=z, temperature=1.0, top_k=2).tolist() == [True] * 4 + [False]
    # top-p = 0.4: mass above the 0.2s is 0.3 < 0.4 -> the whole tie is kept
    assert sampler_kept_mask(logits=z, temperature=1.0, top_p=0.4).tolist() == [True] * 4 + [False]
    # top-p = 0.29: the mass above the 0.2s already reaches it -> the tie is dropped (not
    # 0.3 itself: softmax(log 0.3) is 0.29999999999999993 in float64, below 0.3)
    assert sampler_kept_mask(logits=z, temperature=1.0, top_p=0.29).tolist() == [True] + [False] * 4


def _top_p_first(
    *, logits: torch.Tensor, temperature: float, top_p: float, top_k: int
) -> torch.Tensor:
    """Mutant: top-p on the full distribution, then top-k."""
    a = sampler_kept_mask(logits=logits, temperature=temperature, top_p=top_p)
    b = sampler_kept_mask(logits=logits, temperature=temperature, top_k=top_k)
    return a & b


def _top_k_then_top_p(fn: Callable[..., torch.Tensor]) -> None:
    # p = (0.4, 0.3, 0.2, 0.1), top_k = 2 -> (4/7, 3/7); top_p = 0.5 then keeps only the first
    z = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=F64))
    kept = fn(logits=z, temperature=1.0, top_p=0.5, top_k=2)
    assert kept.tolist() == [True, False, False, False]


def test_top_k_applies_before_top_p() -> None:
    _top_k_then_top_p(sampler_kept_mask)
    with pytest.raises(AssertionError):
        _top_k_then_top_p(_top_p_first)


@pytest.mark.parametrize(("top_p", "top_k"), [(1.0, 0), (0.8, 0), (1.0, 5), (0.7, 8)])
def test_sampler_distribution_sums_to_one_over_the_kept_set(top_p: float, top_k: int) -> None:
    z, _ = _batch(15, b=3, t=5, v=40, scale=2.0)
    lq = sampler_log_softmax(logits=z, temperature=0.7, top_p=top_p, top_k=top_k)
    kept = sampler_kept_mask(logits=z, temperature=0.7, top_p=top_p, top_k=top_k)
    assert torch.equal(torch.isfinite(lq), kept)
    torch.testing.assert_close(lq.exp().sum(-1), torch.ones(3, 5, dtype=F64), rtol=0, atol=1e-14)
    # renormalised: each kept token's probability is its full-vocab one divided by the kept mass
    p = torch.softmax(z / 0.7, dim=-1)
    mass = torch.where(kept, p, 0.0).sum(-1, keepdim=True)
    torch.testing.assert_close(torch.where(kept, lq.exp(), 0.0), torch.where(kept, p / mass, 0.0))


def test_sampler_logprob_is_trainer_logprob_minus_log_kept_mass() -> None:
    z, _ = _batch(16, b=4, t=6, v=50, scale=2.0)
    tau, top_p, top_k = 0.9, 0.8, 20
    lq = sampler_log_softmax(logits=z, temperature=tau, top_p=top_p, top_k=top_k)
    g = torch.Generator().manual_seed(0)
    y = torch.multinomial(lq.exp().reshape(-1, 50), 1, generator=g).reshape(4, 6)  # drawn by it
    rollout = sampler_logprobs(logits=z, tokens=y, temperature=tau, top_p=top_p, top_k=top_k)
    trainer = token_logprobs(logits=z, input_ids=y, shift="none", temperature=tau)
    kept = sampler_kept_mask(logits=z, temperature=tau, top_p=top_p, top_k=top_k)
    log_mass = torch.logsumexp(torch.where(kept, z / tau, -INF), -1) - torch.logsumexp(z / tau, -1)
    torch.testing.assert_close(trainer - rollout, log_mass, rtol=0, atol=1e-13)
    assert bool((log_mass < 0).all())


def test_untruncated_sampler_equals_the_trainer() -> None:
    z, ids = _batch(17)
    rollout = sampler_logprobs(logits=z, tokens=ids, temperature=1.3)
    trainer = token_logprobs(logits=z, input_ids=ids, shift="none", temperature=1.3)
    torch.testing.assert_close(rollout, trainer, rtol=0, atol=1e-14)


def test_sampler_rejects_a_token_it_cannot_draw() -> None:
    z = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.3, 0.1]], dtype=F64))
    y = torch.tensor([0, 2])
    with pytest.raises(InputError, match=r"positions \(1\) are outside the sampler's kept set"):
        sampler_logprobs(logits=z, tokens=y, temperature=1.0, top_k=2)
    out = sampler_logprobs(
        logits=z, tokens=y, temperature=1.0, top_k=2, response_mask=torch.tensor([True, False])
    )
    assert out[1] == 0.0 and float(out[0]) == pytest.approx(math.log(0.5 / 0.8), rel=1e-14)


@pytest.mark.parametrize(
    ("over", "error", "match"),
    [
        ({"top_p": 0.0}, ConfigError, r"top_p must lie in \(0, 1\]"),
        ({"top_p": 1.5}, ConfigError, r"top_p must lie in \(0, 1\]"),
        ({"top_k": -1}, ConfigError, "top_k must be an integer >= 0"),
        ({"top_k": 2.0}, ConfigError, "top_k must be an integer"),
        ({"temperature": 0}, ConfigError, "temperature 0 is greedy"),
        ({"tokens": torch.zeros(3)}, InputTypeError, "tokens must be an integer tensor"),
        ({"tokens": torch.zeros(2, dtype=torch.int64)}, InputError, "tokens must have shape"),
        ({"tokens": torch.tensor([0, 0, 7])}, InputError, r"tokens must lie in \[0, V\)"),
        (
            {"logits": torch.tensor([[0.0, NAN], [0.0, 1.0], [1.0, 1.0]])},
            InputError,
            r"NaN or \+inf.*\(0\)",
        ),
    ],
)
def test_bad_sampler_input_names_the_argument(
    over: dict[str, Any], error: type, match: str
) -> None:
    kw: dict[str, Any] = {
        "logits": torch.zeros(3, 4, dtype=F64),
        "tokens": torch.zeros(3, dtype=torch.int64),
        "temperature": 1.0,
    }
    with pytest.raises(error, match=match):
        sampler_logprobs(**{**kw, **over})
