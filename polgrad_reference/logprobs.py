"""Per-token log-probabilities of sampled tokens: the trainer's, from logits, and the ones a
truncating sampler reports.

**Trainer side** (:func:`token_logprobs` for padded ``[B, T, V]`` logits,
:func:`packed_token_logprobs` for a packed ``[N, V]`` stream with ``cu_seqlens`` or
``position_ids``). With ``u = z / tau`` (temperature applied once, to the logits, before
the log-softmax) and ``m = max_v u_v``,

    logp = log softmax(u)[y] = (u_y - m) - log sum_v exp(u_v - m).

The max shift leaves the value unchanged and keeps every ``exp`` at most 1, so logits of
any size (``1e4``) are exact; ``-inf`` logits (a masked vocabulary) contribute
``exp(-inf) = 0``. Which logits score which token is the ``shift``:

- ``shift="next"``: the logits at position ``s`` predict the token at ``s + 1`` (the
  causal-LM convention: Hugging Face ``*ForCausalLM`` shifts labels this way in its loss;
  TRL's ``selective_log_softmax(logits[:, :-1], input_ids[:, 1:])``; verl's rolled labels).
- ``shift="none"``: the logits are already aligned with the tokens they score (the caller
  sliced or rolled them, or they are a sampler's per-step logits).

Where the result lands is the ``align``. ``align="token"`` (default): ``out[t]`` is the
logprob *of* ``input_ids[t]``; under ``shift="next"`` the first token of each sequence has
no logits predicting it. ``align="logits"``: ``out[s]`` is computed *from* ``logits[s]``;
under ``shift="next"`` the last position of each sequence has no next token. A position
without a prediction is exactly 0, and ``response_mask`` (in the output's alignment) may
not select it. In a packed stream "each sequence" is each ``cu_seqlens`` segment: no
position ever reads logits or a token of another sequence (a ``torch.roll`` over the whole
stream does, at every boundary).

Positions ``response_mask`` leaves out are exactly 0 and their logits and tokens are never
read (they may hold NaN or an ignore index such as ``-100``); gradients reach only the
logits rows that were read. A sampled token whose logit is ``-inf`` has probability 0:
that is an ``InputError`` naming the positions, not a silent ``-inf`` (a ratio built on it
would be ``inf`` or NaN). Computed in float64 for float64 logits and in float32 otherwise
(bfloat16/float16 logits are upcast first: the temperature division and the log-softmax
both run in float32; :func:`log_softmax_rounding_error` measures what bfloat16 would
lose). ``vocab_chunk`` computes the normaliser in chunks of the vocabulary (two passes:
the max, then the shifted sum), never holding an upcast ``[n, V]`` copy.

**Sampler side** (:func:`sampler_logprobs`): the logprob a truncating sampler reports when
it renormalises over the tokens it keeps (vLLM ``logprobs_mode="processed_logprobs"``;
vLLM V1 ``Sampler``: temperature, then top-k, then top-p on the top-k-renormalised
distribution). Its gap to the trainer's full-vocabulary logprob is ``log`` of the kept
mass, the same for every kept token (TRL #6789);
``polgrad_reference.diagnostics.sampling_bias`` measures it on a batch. Derivations and
figures: ``docs/logprobs.md``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from enum import Enum

import torch

from . import _validate as v
from .errors import ConfigError, InputError, InputTypeError, NumericalError

__all__ = [
    "LogProbAlign",
    "LogProbShift",
    "LogSoftmaxRoundingError",
    "cu_seqlens_from_position_ids",
    "log_softmax_rounding_error",
    "packed_token_logprobs",
    "sampler_kept_mask",
    "sampler_log_softmax",
    "sampler_logprobs",
    "token_logprobs",
]

_CHUNK_ELEMENTS = 1 << 24
_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


class LogProbShift(str, Enum):
    """Which logits score which token."""

    NEXT = "next"
    """``logits[s]`` predicts ``input_ids[s + 1]`` (causal LM, labels shifted by one)."""
    NONE = "none"
    """``logits[t]`` scores ``input_ids[t]`` (already aligned)."""


class LogProbAlign(str, Enum):
    """Where a logprob lands in the output (it matters only under ``shift="next"``)."""

    TOKEN = "token"
    """``out[t]`` is the logprob of ``input_ids[t]``: first position of a sequence is 0."""
    LOGITS = "logits"
    """``out[s]`` is computed from ``logits[s]``: last position of a sequence is 0."""


# ------------------------------------------------------------------------ validation


def _enum(cls: type[LogProbShift] | type[LogProbAlign], name: str, value: object) -> str:
    try:
        return str(cls(value).value)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in cls)
        raise ConfigError(f"{name} must be one of {allowed}, got {value!r}") from None


def _temperature(value: object, name: str = "temperature") -> float:
    """A finite temperature ``> 0`` (``0`` is greedy decoding: no distribution to score)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name} must be a real number > 0, got {value!r}")
    tau = float(value)
    if not (math.isfinite(tau) and tau > 0.0):
        raise ConfigError(
            f"{name} must be finite and > 0, got {value!r} (temperature 0 is greedy "
            "decoding: the argmax has logprob 0 and there is no distribution to score)"
        )
    return tau


def _vocab_chunk(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"vocab_chunk must be a positive integer or None, got {value!r}")
    return value


def _ids(name: str, value: object) -> torch.Tensor:
    """An integer tensor of token ids (bool and float ids are rejected, not cast)."""
    t = v.require_tensor(name, value)
    if t.dtype not in _INT_DTYPES:
        raise InputTypeError(
            f"{name} must be an integer tensor of token ids, got {t.dtype}; "
            f"pass {name}.long() if it holds whole numbers"
        )
    return t


def _work_dtype(z: torch.Tensor) -> torch.dtype:
    return torch.float64 if z.dtype == torch.float64 else torch.float32


def _rows_per_chunk(vocab: int) -> int:
    return max(1, _CHUNK_ELEMENTS // max(1, vocab))


# ------------------------------------------------------------------------- the core


def _logsumexp(
    u_of: Callable[[slice], torch.Tensor], vocab: int, chunk: int | None
) -> torch.Tensor:
    """``log sum_v exp(u_v)`` over the last dim; ``u_of(cols)`` returns those columns of
    ``u`` (already divided by the temperature, in the working dtype). With ``chunk``,
    two passes over column chunks: ``m = max u``, then ``m + log sum exp(u - m)``; ``m``
    is a constant of the shift (detached), so the gradient is the softmax either way."""
    if chunk is None or chunk >= vocab:
        return torch.logsumexp(u_of(slice(0, vocab)), dim=-1)
    cols = [slice(c, min(c + chunk, vocab)) for c in range(0, vocab, chunk)]
    m = torch.stack([u_of(c).detach().amax(dim=-1) for c in cols]).amax(dim=0)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # all -inf (or NaN): no shift
    s = torch.zeros_like(m)
    for c in cols:
        s = s + torch.exp(u_of(c) - m[:, None]).sum(dim=-1)
    return m + torch.log(s)


def _explain_rows(
    z: torch.Tensor,
    rows: torch.Tensor,
    out_pos: torch.Tensor,
    labels: torch.Tensor,
    lse: torch.Tensor,
    lp: torch.Tensor,
    where: Callable[[torch.Tensor], str],
    tau: float,
) -> None:
    """Slow path after a non-finite result: name the logits rows, the output positions
    they score, and the cause."""
    n = z.shape[0]

    def at(idx: torch.Tensor) -> str:
        hit = torch.zeros(n, dtype=torch.bool, device=z.device)
        hit[idx] = True
        return where(hit)

    def flag(bad_rows: torch.Tensor) -> str:
        return at(out_pos[bad_rows])

    def both(bad_rows: torch.Tensor) -> str:
        return f"logits positions {at(rows[bad_rows])} (scoring positions {flag(bad_rows)})"

    zr = z[rows]
    nan = torch.isnan(zr).any(dim=-1)
    if bool(nan.any()):
        raise InputError(f"logits hold NaN at {both(nan)}")
    pinf = (zr == math.inf).any(dim=-1)
    if bool(pinf.any()):
        raise InputError(f"logits hold +inf at {both(pinf)}")
    dead = (zr == -math.inf).all(dim=-1)
    if bool(dead.any()):
        raise InputError(
            "logits are -inf over the whole vocabulary (no token has probability > 0) at "
            f"{both(dead)}"
        )
    zero = zr.gather(1, labels[:, None])[:, 0] == -math.inf
    if bool(zero.any()):
        raise InputError(
            "the sampled token's logit is -inf (probability 0: no sampler can draw it) at "
            f"positions {flag(zero)}; check the token ids and the vocabulary mask"
        )
    bad = ~(torch.isfinite(lse) & torch.isfinite(lp))
    raise NumericalError(
        f"logits / temperature (temperature={tau:g}) overflow {lse.dtype} at positions "
        f"{flag(bad)}; use a larger temperature or float64 logits"
    )


def _score(
    z: torch.Tensor,
    ids: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    *,
    shift: str,
    align: str,
    tau: float,
    select: torch.Tensor | None,
    chunk: int | None,
    where: Callable[[torch.Tensor], str],
    what: str,
) -> torch.Tensor:
    """Logprobs of a flat stream: ``z`` ``[N, V]``, ``ids`` ``[N]``, ``starts``/``ends``
    ``[N]`` bool (first/last position of each sequence). ``where`` formats a flat ``[N]``
    bool as positions in the caller's layout; ``what`` names a sequence ("row", "sequence")."""
    n, vocab = z.shape
    dev = z.device
    pos = torch.arange(n, device=dev)
    if shift == LogProbShift.NONE.value:
        rows, label_pos, valid = pos, pos, torch.ones(n, dtype=torch.bool, device=dev)
    elif align == LogProbAlign.TOKEN.value:
        rows, label_pos, valid = pos - 1, pos, ~starts
    else:
        rows, label_pos, valid = pos, pos + 1, ~ends
    if select is None:
        used = valid
    else:
        orphan = select & ~valid
        if bool(orphan.any()):
            edge = "first" if align == LogProbAlign.TOKEN.value else "last"
            reason = (
                "no logits predict the first token of a sequence"
                if edge == "first"
                else "the last position of a sequence has no next token"
            )
            raise InputError(
                f"response_mask selects the {edge} position of a {what} under shift='next', "
                f"align={align!r}, at positions {where(orphan)}: {reason}"
            )
        used = select
    out_pos = used.nonzero().flatten()
    rows, label_pos = rows[out_pos], label_pos[out_pos]
    labels = ids[label_pos].long()
    bad_id = (labels < 0) | (labels >= vocab)
    if bool(bad_id.any()):
        hit = torch.zeros(n, dtype=torch.bool, device=dev)
        hit[label_pos[bad_id]] = True
        shown = sorted({int(x) for x in labels[bad_id][:6].tolist()})
        raise InputError(
            f"input_ids must lie in [0, V) = [0, {vocab}) where a logprob is computed, got "
            f"{shown} at positions {where(hit)}"
        )
    work = _work_dtype(z)
    step = _rows_per_chunk(vocab)
    parts = []
    for c in range(0, rows.numel(), step):
        r, y = rows[c : c + step], labels[c : c + step]
        zr = z[r]

        def u_of(cols: slice, zr: torch.Tensor = zr) -> torch.Tensor:
            return zr[:, cols].to(work) / tau

        lse = _logsumexp(u_of, vocab, chunk)
        lp = zr.gather(1, y[:, None])[:, 0].to(work) / tau - lse
        if not bool(torch.isfinite(lp).all()):
            sl = slice(c, c + step)
            _explain_rows(z, r, out_pos[sl], y, lse, lp, where, tau)
        parts.append(lp)
    values = torch.cat(parts) if parts else torch.zeros(0, dtype=work, device=dev)
    out = torch.zeros(n, dtype=work, device=dev)
    return out.index_put((out_pos,), values)


# ------------------------------------------------------------------------ trainer side


def token_logprobs(
    *,
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    shift: LogProbShift | str,
    temperature: float,
    response_mask: torch.Tensor | None = None,
    align: LogProbAlign | str = LogProbAlign.TOKEN,
    vocab_chunk: int | None = None,
) -> torch.Tensor:
    """``[B, T]`` logprobs ``log softmax(logits[b, s] / temperature)[input_ids[b, t]]`` of
    the sampled tokens, padded layout (module docstring: ``s = t - 1`` under
    ``shift="next"``, ``s = t`` under ``"none"``; ``align`` places the result).

    ``logits`` ``[B, T, V]`` float, ``input_ids`` ``[B, T]`` integer, ``response_mask``
    ``[B, T]`` bool in the output's alignment (``None``: every position that has a
    prediction). Positions not computed are exactly 0. Each row is its own sequence: under
    ``shift="next"`` column 0 (``align="token"``) or column ``T - 1`` (``"logits"``) has
    no prediction. float64 in, float64 out; any other float dtype computes in float32.
    """
    z = v.require_float_tensor("logits", logits)
    if z.dim() != 3 or z.shape[0] == 0 or z.shape[1] == 0 or z.shape[2] == 0:
        raise InputError(f"logits must have shape [B, T, V] with B, T, V >= 1, got {list(z.shape)}")
    b, t, vocab = z.shape
    ids = _ids("input_ids", input_ids)
    v.require_shape("input_ids", ids, (b, t), "[B, T] of logits")
    tensors = {"logits": z, "input_ids": ids}
    select = None
    if response_mask is not None:
        select = v.require_bool_mask("response_mask", response_mask)
        v.require_shape("response_mask", select, (b, t), "[B, T] of logits")
        tensors["response_mask"] = select
    v.require_same_device(tensors)
    col = torch.arange(t, device=z.device).expand(b, t)
    out = _score(
        z.reshape(b * t, vocab),
        ids.reshape(b * t),
        (col == 0).reshape(-1),
        (col == t - 1).reshape(-1),
        shift=_enum(LogProbShift, "shift", shift),
        align=_enum(LogProbAlign, "align", align),
        tau=_temperature(temperature),
        select=None if select is None else select.reshape(-1),
        chunk=_vocab_chunk(vocab_chunk),
        where=lambda flat: v.format_positions(flat.reshape(b, t)),
        what="row",
    )
    return out.reshape(b, t)


def cu_seqlens_from_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """``cu_seqlens`` ``[B + 1]`` int32 of a packed stream whose ``position_ids`` ``[N]``
    restart at 0 at each sequence and count up by one within it (FlashAttention varlen and
    the remove-padding paths pack this way)."""
    p = _ids("position_ids", position_ids)
    if p.dim() != 1 or p.numel() == 0:
        raise InputError(f"position_ids must have shape [N] with N >= 1, got {list(p.shape)}")
    p = p.long()
    if int(p[0]) != 0:
        raise InputError(f"position_ids must start at 0, got {int(p[0])} at position 0")
    broken = torch.zeros_like(p, dtype=torch.bool)
    broken[1:] = (p[1:] != 0) & (p[1:] != p[:-1] + 1)
    if bool(broken.any()):
        raise InputError(
            "position_ids must restart at 0 or count up by one, but break at positions "
            f"{v.format_positions(broken)}"
        )
    starts = (p == 0).nonzero().flatten()
    end = torch.tensor([p.numel()], device=p.device)
    return torch.cat([starts, end]).to(torch.int32)


def _boundaries(
    n: int, cu_seqlens: object, position_ids: object, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(cu, starts, ends)`` of a packed stream of ``n`` positions."""
    if (cu_seqlens is None) == (position_ids is None):
        raise ConfigError("pass exactly one of cu_seqlens and position_ids for a packed stream")
    if position_ids is not None:
        p = _ids("position_ids", position_ids)
        v.require_shape("position_ids", p, (n,), "[N] of logits")
        cu = cu_seqlens_from_position_ids(p).long().to(device)
    else:
        raw = _ids("cu_seqlens", cu_seqlens)
        if raw.dim() != 1 or raw.numel() < 2:
            raise InputError(
                f"cu_seqlens must have shape [B + 1] with B >= 1, got {list(raw.shape)}"
            )
        cu = raw.long().to(device)
        if int(cu[0]) != 0 or int(cu[-1]) != n:
            raise InputError(
                f"cu_seqlens must run from 0 to N = {n}, got {int(cu[0])} ... {int(cu[-1])}"
            )
        down = cu[1:] < cu[:-1]
        if bool(down.any()):
            raise InputError(
                "cu_seqlens must be non-decreasing, but decreases after entries "
                f"{v.format_positions(down)}"
            )
    lengths = cu[1:] - cu[:-1]
    nonempty = lengths > 0
    starts = torch.zeros(n, dtype=torch.bool, device=device)
    ends = torch.zeros(n, dtype=torch.bool, device=device)
    starts[cu[:-1][nonempty]] = True
    ends[cu[1:][nonempty] - 1] = True
    return cu, starts, ends


def packed_token_logprobs(
    *,
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    shift: LogProbShift | str,
    temperature: float,
    cu_seqlens: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    response_mask: torch.Tensor | None = None,
    align: LogProbAlign | str = LogProbAlign.TOKEN,
    vocab_chunk: int | None = None,
) -> torch.Tensor:
    """``[N]`` logprobs of a packed stream: ``logits`` ``[N, V]``, ``input_ids`` ``[N]``,
    sequences given by ``cu_seqlens`` ``[B + 1]`` (integer, ``0 = c_0 <= ... <= c_B = N``;
    empty sequences allowed) or by ``position_ids`` ``[N]`` restarting at 0 (exactly one).

    Each sequence is scored on its own, as :func:`token_logprobs` scores a row: under
    ``shift="next"`` its first position (``align="token"``) or its last (``"logits"``)
    has no prediction and is 0, so no value ever depends on another sequence's logits or
    tokens. ``response_mask`` ``[N]`` bool in the output's alignment.
    """
    z = v.require_float_tensor("logits", logits)
    if z.dim() != 2 or z.shape[0] == 0 or z.shape[1] == 0:
        raise InputError(
            f"packed logits must have shape [N, V] with N, V >= 1, got {list(z.shape)}"
        )
    n = z.shape[0]
    ids = _ids("input_ids", input_ids)
    v.require_shape("input_ids", ids, (n,), "[N] of logits")
    tensors = {"logits": z, "input_ids": ids}
    select = None
    if response_mask is not None:
        select = v.require_bool_mask("response_mask", response_mask)
        v.require_shape("response_mask", select, (n,), "[N] of logits")
        tensors["response_mask"] = select
    v.require_same_device(tensors)
    cu, starts, ends = _boundaries(n, cu_seqlens, position_ids, z.device)
    seq_of = torch.searchsorted(cu[1:], torch.arange(n, device=z.device), right=True)

    def where(flat: torch.Tensor) -> str:
        idx = flat.nonzero().flatten()
        listed = [f"{int(p)} (sequence {int(seq_of[p])})" for p in idx[:6]]
        more = idx.numel() - len(listed)
        return ", ".join(listed) + (f" and {more} more" if more > 0 else "")

    return _score(
        z,
        ids,
        starts,
        ends,
        shift=_enum(LogProbShift, "shift", shift),
        align=_enum(LogProbAlign, "align", align),
        tau=_temperature(temperature),
        select=select,
        chunk=_vocab_chunk(vocab_chunk),
        where=where,
        what="sequence",
    )


# ------------------------------------------------------------------- precision figure


@dataclasses.dataclass(frozen=True)
class LogSoftmaxRoundingError:
    """Error of a log-softmax computed in ``compute_dtype`` against float64 on the same
    logits (:func:`log_softmax_rounding_error`)."""

    compute_dtype: str
    n: int
    """Number of logprobs compared."""
    max_abs: float
    """``max |lp_low - lp_exact|`` (nats)."""
    mean_abs: float
    rms: float
    max_ratio_error: float
    """``max |exp(lp_low - lp_exact) - 1|``: the error it puts into an importance ratio."""
    mean_ratio_error: float

    def as_dict(self) -> dict[str, float]:
        return {
            "n": float(self.n),
            "max_abs": self.max_abs,
            "mean_abs": self.mean_abs,
            "rms": self.rms,
            "max_ratio_error": self.max_ratio_error,
            "mean_ratio_error": self.mean_ratio_error,
        }


def log_softmax_rounding_error(
    *,
    logits: torch.Tensor,
    labels: torch.Tensor | None = None,
    temperature: float = 1.0,
    compute_dtype: torch.dtype = torch.bfloat16,
) -> LogSoftmaxRoundingError:
    """Measure ``log_softmax(z.to(d) / tau)`` computed in ``d = compute_dtype`` against
    ``log_softmax(z.double() / tau)`` (``logits`` ``[..., V]``, finite). Logits already in
    ``d`` (a bfloat16 model's output, ``d = bfloat16``) count only the computation; wider
    logits count their own rounding to ``d`` as well.

    With ``labels`` (``[...]`` integer, aligned with the logits) the error is measured at
    those tokens (the sampled ones, which are what a ratio sees); without, at every entry
    of the vocabulary. The division by the temperature happens in ``d`` too, as a trainer
    that casts its logits to bfloat16 would do it.
    """
    z = v.require_float_tensor("logits", logits)
    if z.dim() < 1 or z.shape[-1] == 0 or z.numel() == 0:
        raise InputError(f"logits must have shape [..., V] with V >= 1, got {list(z.shape)}")
    if not bool(torch.isfinite(z).all()):
        raise InputError("logits must be finite to measure the rounding error")
    if not (isinstance(compute_dtype, torch.dtype) and compute_dtype.is_floating_point):
        raise ConfigError(f"compute_dtype must be a torch floating dtype, got {compute_dtype!r}")
    tau = _temperature(temperature)
    zd = z.detach()
    exact = torch.log_softmax(zd.double() / tau, dim=-1)
    low = torch.log_softmax(zd.to(compute_dtype) / tau, dim=-1).double()
    if labels is not None:
        y = _ids("labels", labels)
        v.require_shape("labels", y, tuple(z.shape[:-1]), "[...] of logits")
        if bool(((y < 0) | (y >= z.shape[-1])).any()):
            raise InputError(f"labels must lie in [0, V) = [0, {z.shape[-1]})")
        exact = exact.gather(-1, y.long()[..., None])
        low = low.gather(-1, y.long()[..., None])
    err = (low - exact).flatten()
    ratio = torch.expm1(err).abs()
    return LogSoftmaxRoundingError(
        compute_dtype=str(compute_dtype).removeprefix("torch."),
        n=err.numel(),
        max_abs=float(err.abs().max()),
        mean_abs=float(err.abs().mean()),
        rms=float(err.square().mean().sqrt()),
        max_ratio_error=float(ratio.max()),
        mean_ratio_error=float(ratio.mean()),
    )


# ------------------------------------------------------------------------ sampler side


def _sampling_params(temperature: object, top_p: object, top_k: object) -> tuple[float, float, int]:
    tau = _temperature(temperature)
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)):
        raise ConfigError(f"top_p must be a real number in (0, 1], got {top_p!r}")
    p = float(top_p)
    if not 0.0 < p <= 1.0:
        raise ConfigError(f"top_p must lie in (0, 1] (1 disables it), got {top_p!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ConfigError(
            f"top_k must be an integer >= 0 (0 disables it; vLLM's older -1 is spelt 0 "
            f"here), got {top_k!r}"
        )
    return tau, p, top_k


def _kept(u: torch.Tensor, p: float, k: int) -> torch.Tensor:
    """Kept set of ``u = z / tau`` ``[n, V]`` (finite max per row): top-k, then top-p of
    the top-k-renormalised distribution; ties at either threshold are kept."""
    keep = u > -math.inf
    vocab = u.shape[-1]
    if 0 < k < vocab:
        kth = torch.topk(u, k, dim=-1).values[:, -1:]
        keep = keep & (u >= kth)
    if p < 1.0:
        q = torch.softmax(torch.where(keep, u, -math.inf), dim=-1)
        desc, order = torch.sort(q, dim=-1, descending=True)
        above = torch.zeros_like(desc)  # mass before each entry in sort order
        above[:, 1:] = torch.cumsum(desc, dim=-1)[:, :-1]
        # mass strictly more probable than the entry: the value at its tie group's first
        # index (the running max of the indices where a new value starts)
        col = torch.arange(desc.shape[-1], device=desc.device).expand_as(desc)
        new_value = torch.ones_like(keep)
        new_value[:, 1:] = desc[:, 1:] != desc[:, :-1]
        first = torch.where(new_value, col, 0).cummax(dim=-1).values
        strict = above.gather(-1, first)
        keep_sorted = strict < p
        keep = keep & torch.zeros_like(keep).scatter(-1, order, keep_sorted)
    return keep


def _sampler_rows(
    logits: object, tau: float, p: float, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(z, u, kept)``: ``u = z / tau`` in the working dtype, both flattened to ``[n, V]``."""
    z = v.require_float_tensor("logits", logits)
    if z.dim() < 1 or z.shape[-1] == 0:
        raise InputError(f"logits must have shape [..., V] with V >= 1, got {list(z.shape)}")
    z2 = z.reshape(-1, z.shape[-1])
    bad = torch.isnan(z2).any(dim=-1) | (z2 == math.inf).any(dim=-1)
    bad |= (z2 == -math.inf).all(dim=-1)
    if bool(bad.any()):
        where = v.format_positions(bad.reshape(z.shape[:-1])) if z.dim() > 1 else "()"
        raise InputError(
            f"logits hold NaN or +inf, or are -inf over the whole vocabulary, at positions {where}"
        )
    u = z2.to(_work_dtype(z)) / tau
    if not bool(torch.isfinite(u.amax(dim=-1)).all()):
        raise NumericalError(f"logits / temperature (temperature={tau:g}) overflow {u.dtype}")
    with torch.no_grad():
        kept = _kept(u.detach(), p, k)
    return z, u, kept


def sampler_kept_mask(
    *, logits: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0
) -> torch.Tensor:
    """``[..., V]`` bool: the tokens a temperature / top-k / top-p sampler can draw.

    With ``u = logits / temperature``: top-k keeps ``u_v >= `` the k-th largest ``u``
    (every tie with the k-th value is kept; ``top_k = 0`` or ``>= V`` keeps all); top-p
    then works on ``q = softmax(u)`` renormalised over the top-k set and keeps ``v`` iff
    the mass of the strictly more probable tokens is ``< top_p`` (the smallest
    most-probable set reaching ``top_p``, with every token tied at the boundary kept;
    ``top_p = 1`` keeps all). This is vLLM V1's order (``apply_top_k_top_p``); vLLM breaks
    a tie at the top-p boundary by sort position, the reference keeps the whole tie.
    ``-inf`` logits are never kept.
    """
    tau, p, k = _sampling_params(temperature, top_p, top_k)
    z, _, kept = _sampler_rows(logits, tau, p, k)
    return kept.reshape(z.shape)


def sampler_log_softmax(
    *, logits: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0
) -> torch.Tensor:
    """``[..., V]``: the sampler's distribution in log space, ``u_v - log sum_{w in K}
    exp(u_w)`` on the kept set ``K`` (:func:`sampler_kept_mask`) and ``-inf`` outside;
    ``exp`` sums to 1 over ``K``. float64 for float64 logits, float32 otherwise."""
    tau, p, k = _sampling_params(temperature, top_p, top_k)
    z, u, kept = _sampler_rows(logits, tau, p, k)
    return torch.log_softmax(torch.where(kept, u, -math.inf), dim=-1).reshape(z.shape)


def sampler_logprobs(
    *,
    logits: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = 0,
    response_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """The logprob a truncating sampler reports for the token it drew:
    ``log q_K(y) = u_y - log sum_{w in K} exp(u_w)``, ``u = logits / temperature``,
    renormalised over the kept set ``K`` (:func:`sampler_kept_mask`: temperature, then
    top-k, then top-p). ``logits`` ``[..., V]`` are the sampler's logits *at the step that
    drew* ``tokens`` ``[...]`` (aligned, no shift).

    Against the trainer's full-vocabulary ``log softmax(u)[y]`` the difference is
    ``log M`` with ``M = sum_{w in K} softmax(u)_w`` the kept mass, for every kept ``y``.
    A token outside ``K`` could not have been drawn: ``InputError`` naming the positions.
    Positions ``response_mask`` (``[...]`` bool) leaves out are 0.
    """
    tau, p, k = _sampling_params(temperature, top_p, top_k)
    z, u, kept = _sampler_rows(logits, tau, p, k)
    y = _ids("tokens", tokens)
    v.require_shape("tokens", y, tuple(z.shape[:-1]), "[...] of logits without V")
    tensors = {"logits": z, "tokens": y}
    sel = torch.ones(y.shape, dtype=torch.bool, device=z.device)
    if response_mask is not None:
        sel = v.require_bool_mask("response_mask", response_mask)
        v.require_shape("response_mask", sel, tuple(y.shape), "[...] like tokens")
        tensors["response_mask"] = sel
    v.require_same_device(tensors)
    sel1, y1 = sel.reshape(-1), y.reshape(-1).long()
    vocab = z.shape[-1]
    out_of_range = sel1 & ((y1 < 0) | (y1 >= vocab))
    if bool(out_of_range.any()):
        raise InputError(
            f"tokens must lie in [0, V) = [0, {vocab}) at the selected positions "
            f"{v.format_positions(out_of_range.reshape(y.shape))}"
        )
    y1 = torch.where(sel1, y1, 0)
    inside = kept.gather(1, y1[:, None])[:, 0]
    outside = sel1 & ~inside
    if bool(outside.any()):
        raise InputError(
            f"tokens at positions {v.format_positions(outside.reshape(y.shape))} are outside "
            f"the sampler's kept set (temperature={tau:g}, top_p={p:g}, top_k={k}): this "
            "sampler cannot have drawn them"
        )
    lq = torch.log_softmax(torch.where(kept, u, -math.inf), dim=-1)
    lp = lq.gather(1, y1[:, None])[:, 0]
    return torch.where(sel1, lp, torch.zeros_like(lp)).reshape(y.shape)
