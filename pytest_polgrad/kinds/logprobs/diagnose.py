"""What a failing logprobs function computes instead: which logits score which token (off
by one position, no shift, shifted the wrong way), how the temperature enters (not at all,
twice, on the log-probabilities, multiplied), the log-softmax in half precision, and, packed,
which sequence boundary it reads across."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from pytest_polgrad.core.kinds import Diagnosis
from pytest_polgrad.core.verdicts import CheckFailure, Verdict
from pytest_polgrad.kinds._tokens import compare_tensor

from .calls import LogprobsContext, call_logprobs
from .checks import boundary_crossings, describe_crossing, reference_of
from .corpus import corpus_batch

__all__ = ["Candidate", "candidate_logprobs", "diagnose_logprobs"]

_READS = ("next-token", "next-logits", "none", "backward")
_TEMPS = ("once", "missing", "twice", "on-logprobs", "multiplied")


@dataclasses.dataclass(frozen=True)
class Candidate:
    """``reads``: which (row, token) pair position ``t`` holds — ``next-token`` (row
    ``t - 1``, token ``t``), ``next-logits`` (row ``t``, token ``t + 1``), ``none`` (row and
    token ``t``), ``backward`` (row ``t + 1``, token ``t``: shifted the wrong way);
    ``temperature``: ``once`` (``z / tau``), ``missing`` (``z``), ``twice`` (``z / tau^2``),
    ``on-logprobs`` (``log softmax(z) / tau``), ``multiplied`` (``z * tau``); ``half``: the
    log-softmax in the logits' half precision."""

    reads: str
    temperature: str = "once"
    half: bool = False


def _reads_of(shift: str, align: str) -> str:
    if shift == "none":
        return "none"
    return "next-token" if align == "token" else "next-logits"


def candidate_logprobs(cand: Candidate, kw: Mapping[str, Any], tau: float) -> torch.Tensor:
    """``[B, T]`` float64 logprobs under ``cand`` (NaN where it reads outside the row)."""
    z = kw["logits"].detach()
    z = z if cand.half and z.dtype in (torch.bfloat16, torch.float16) else z.to(torch.float64)
    u = {
        "once": lambda: z / tau,
        "missing": lambda: z,
        "twice": lambda: z / tau / tau,
        "on-logprobs": lambda: z,
        "multiplied": lambda: z * tau,
    }[cand.temperature]()
    lsm = torch.log_softmax(u, dim=-1)
    if cand.temperature == "on-logprobs":
        lsm = lsm / tau
    lsm = lsm.to(torch.float64)
    ids = kw["input_ids"]
    width, vocab = lsm.shape[1], lsm.shape[2]
    t = torch.arange(width)
    row, tok = {
        "next-token": (t - 1, t),
        "next-logits": (t, t + 1),
        "none": (t, t),
        "backward": (t + 1, t),
    }[cand.reads]
    ok = (row >= 0) & (row < width) & (tok >= 0) & (tok < width)
    r, k = row.clamp(0, width - 1), tok.clamp(0, width - 1)
    y = ids[:, k].clamp(0, vocab - 1)
    out = lsm[:, r, :].gather(2, y[:, :, None])[:, :, 0]
    return torch.where(ok[None, :], out, math.nan)


def _candidates(ctx: LogprobsContext, half: bool, taus: set[float]) -> Iterator[Candidate]:
    ref = ctx.reference
    own = Candidate(_reads_of(ref.shift, ref.align))
    yield own
    temps = _TEMPS if taus - {1.0} else ("once",)
    for reads, temp, low in itertools.product(_READS, temps, (False, True) if half else (False,)):
        cand = Candidate(reads, temp, low)
        if cand != own:
            yield cand


def _describe(cand: Candidate, own: str, tau: float, takes: bool) -> list[str]:
    parts = []
    if cand.reads != own:
        text = {
            ("next-token", "next-logits"): "off by one position: out[t] holds the logprob of "
            "token t (from logits row t - 1), one place after the reference's align='logits'",
            ("next-logits", "next-token"): "off by one position: out[t] holds the logprob of "
            "token t + 1 (from logits row t), one place before the reference's align='token'",
            ("none", "next-token"): "missing shift: logits at t score the token at t itself",
            ("none", "next-logits"): "missing shift: logits at t score the token at t itself",
            (
                "backward",
                "next-token",
            ): "shifted the wrong way: logits at t + 1 score the token at t",
            (
                "backward",
                "next-logits",
            ): "shifted the wrong way: logits at t + 1 score the token at t",
            (
                "backward",
                "none",
            ): "an extra shift the wrong way: logits at t + 1 score the token at t",
        }.get((cand.reads, own))
        parts.append(text or f"an extra shift: logits and tokens paired as {cand.reads!r}")
    if cand.temperature != "once":
        side = (
            ""
            if takes
            else " (the function takes no temperature: the rollout applied it, the trainer not)"
        )
        parts.append(
            {
                "missing": f"temperature not applied: computes at temperature 1, not {tau:g}{side}",
                "twice": f"temperature applied twice: log softmax(z / tau^2) at tau = {tau:g}",
                "on-logprobs": "temperature applied to the log-probabilities, not the logits: "
                "log softmax(z) / tau",
                "multiplied": "logits multiplied by the temperature, not divided",
            }[cand.temperature]
        )
    if cand.half:
        parts.append("log-softmax computed in the logits' half precision, not float32")
    return parts


def _error(
    ctx: LogprobsContext, cand: Candidate, observed: list[tuple[Mapping[str, Any], torch.Tensor]]
) -> float:
    probe = dataclasses.replace(ctx, worst=0.0, notes=set())
    worst = 0.0
    for kw, out in observed:
        tau = ctx.temperature(kw)
        expected = candidate_logprobs(cand, kw, tau)
        _, _, scale, _ = reference_of(ctx, kw)
        try:
            worst = max(
                worst, compare_tensor(probe, out, expected, scale, kw["response_mask"], "x")
            )
        except CheckFailure as exc:
            worst = max(worst, exc.error)
    return worst


def diagnose_logprobs(ctx: LogprobsContext, inputs: Any) -> Diagnosis:
    """Packed: the first sequence boundary the function reads across, if any; then the
    closest candidate on the corpus and the failing input."""
    kw_fail = inputs.as_kwargs()
    if ctx.layout == "packed":
        try:
            crossings = boundary_crossings(ctx, kw_fail)
        except (Verdict, CheckFailure):
            crossings = []
        if crossings:
            k, neighbour, positions = crossings[0]
            text = describe_crossing(k, neighbour, positions)
            return Diagnosis(f"this function {text}", text.split(":", 1)[0])
    tau = 0.7 if ctx.takes_temperature else ctx.reference.temperature
    dtype = ctx.tolerance.input_dtype
    observed = []
    for batch in (corpus_batch(ctx.reference, dtype, tau), inputs):
        kw = batch.as_kwargs()
        try:
            observed.append((kw, call_logprobs(ctx, kw, grad=False).out))
        except Verdict as exc:
            return Diagnosis(f"could not evaluate the function: {exc}", "")
    half = dtype in (torch.bfloat16, torch.float16)
    taus = {ctx.temperature(kw) for kw, _ in observed}
    ranked = sorted(
        ((c, _error(ctx, c, observed)) for c in _candidates(ctx, half, taus)), key=lambda x: x[1]
    )
    best, err = ranked[0]
    ref = ctx.reference
    own = _reads_of(ref.shift, ref.align)
    reference = f"the reference {ctx.options.reference_id!r} is {ref.describe()}"
    if err > 1.0:
        return Diagnosis(
            f"no candidate pairing of logits, tokens and temperature matches (closest off by "
            f"{err:.3g} tolerances); {reference}",
            "",
        )
    shown_tau = next(iter(sorted(taus - {1.0})), 1.0)
    parts = _describe(best, own, shown_tau, ctx.takes_temperature)
    if not parts:
        return Diagnosis(f"the function matches the reference here ({ref.describe()})", "reference")
    return Diagnosis(
        f"this function's logprobs are {'; '.join(parts)}; {reference}",
        "; ".join(p.split(":")[0] for p in parts),
    )
