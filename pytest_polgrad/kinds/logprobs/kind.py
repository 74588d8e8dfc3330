"""The logprobs kind: ``logprobs(logits, input_ids, response_mask, temperature) -> [B, T]``
(padded ``[B, T, V]`` logits) or ``-> [N]`` (a packed ``[N, V]`` stream with
``cu_seqlens`` or ``position_ids``, ``layout="packed"``): the log-probability of each
sampled token, compared with :func:`polgrad_reference.logprobs.token_logprobs` in float64.

The marker states the convention: the reference ``"next-token"`` (logits at ``s``
predict the token at ``s + 1``, the result under its token), ``"next-token-rolled"`` (the
same under the logits row) or ``"aligned"`` (no shift); ``shift=`` / ``align=`` override
them and ``temperature=`` is the function's own temperature when it takes no
``temperature`` argument (when it does, the kit passes one and varies it). Token ids may
be named ``input_ids`` or ``labels``. Checks: :mod:`.checks`; docs/logprobs.md, "The
logprobs kind".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import torch

from pytest_polgrad.core.golden_format import EntryScale, Tolerant
from pytest_polgrad.core.kinds import Diagnosis, Kind, KindCheck
from pytest_polgrad.core.options import ConformanceOptions, MarkerError, did_you_mean
from pytest_polgrad.core.verdicts import Verdict
from pytest_polgrad.kinds._token_checks import corpus_golden
from pytest_polgrad.kinds._tokens import parameters, tolerance_for
from pytest_polgrad.strategies._logits import LogprobBatch, logprob_batches

from .calls import INPUT_NAMES, LogprobsContext, call_logprobs
from .checks import CHECKS, applicable, reference_of
from .corpus import CORPUS_VERSION, corpus_batch, large_vocab_batch
from .diagnose import diagnose_logprobs
from .reference import REFERENCES, LogprobsReference
from .snippet import logprobs_snippet

__all__ = ["KIND", "REFERENCES", "LogprobsKind", "LogprobsReference"]

_OVERRIDES = frozenset({"shift", "align", "temperature"})
_TEMPERATURES = (0.5, 0.7, 1.5, 2.0)
"""What the ``temperature`` check passes a function that takes a temperature."""


class LogprobsKind(Kind):
    """The logprobs :class:`~pytest_polgrad.core.kinds.Kind` (see the module docstring)."""

    name = "logprobs"
    summary = (
        "logprobs(logits [B, T, V] | [N, V], input_ids [B, T] | [N], response_mask, "
        "temperature, cu_seqlens) -> [B, T] | [N] per-token logprobs"
    )
    override_keys = _OVERRIDES

    def resolve(self, options: ConformanceOptions) -> LogprobsReference:
        ref = options.reference
        if isinstance(ref, LogprobsReference):
            base = ref
        elif isinstance(ref, str) and ref in REFERENCES:
            base = REFERENCES[ref]
        else:
            names = sorted(REFERENCES)
            raise MarkerError(
                f"the logprobs kind takes a reference among {names} or a LogprobsReference, "
                f"got {ref!r}{did_you_mean(ref, names)}"
            )
        over = dict(options.overrides)
        keys = sorted(_OVERRIDES)
        for key in over:
            if key not in _OVERRIDES:
                raise MarkerError(
                    f"the logprobs kind got unknown override {key!r}{did_you_mean(key, keys)}; "
                    f"allowed: {keys}"
                )
        if "shift" in over and over["shift"] not in ("next", "none"):
            raise MarkerError(f"shift must be 'next' or 'none', got {over['shift']!r}")
        if "align" in over and over["align"] not in ("token", "logits"):
            raise MarkerError(f"align must be 'token' or 'logits', got {over['align']!r}")
        if "temperature" in over:
            tau = over["temperature"]
            if (
                isinstance(tau, bool)
                or not isinstance(tau, (int, float))
                or not math.isfinite(tau)
                or tau <= 0
            ):
                raise MarkerError(f"temperature must be a finite number > 0, got {tau!r}")
            over["temperature"] = float(tau)
        if options.layout not in ("right", "packed"):
            raise MarkerError(
                f"the logprobs kind takes right-padded [B, T, V] or packed [N, V] logits "
                f"(layout='right' or 'packed'), got layout={options.layout!r}"
            )
        return dataclasses.replace(base, **over)

    def checks(self, config: Any, options: ConformanceOptions) -> list[KindCheck]:
        return applicable(options.layout, options.dtype)

    def check(self, name: str) -> KindCheck | None:
        return CHECKS.get(name)

    def context(
        self, fn: Callable[..., Any], name: str, config: Any, options: ConformanceOptions
    ) -> LogprobsContext:
        takes: frozenset[str] = parameters(fn, INPUT_NAMES)
        if "logits" not in takes:
            raise Verdict(
                f"{name} has no 'logits' parameter; a logprobs function takes logits and the "
                "token ids (input_ids or labels)"
            )
        ids = "input_ids" if "input_ids" in takes else "labels" if "labels" in takes else ""
        if not ids:
            raise Verdict(f"{name} takes neither 'input_ids' nor 'labels' (the sampled tokens)")
        if "input_ids" in takes and "labels" in takes:
            takes = takes - {"labels"}  # **kwargs: pass the ids once
        bounds = "cu_seqlens"
        if options.layout == "packed":
            if "cu_seqlens" not in takes and "position_ids" not in takes:
                raise Verdict(
                    f"{name} takes neither 'cu_seqlens' nor 'position_ids'; layout='packed' "
                    "needs one to know where each sequence ends"
                )
            bounds = "cu_seqlens" if "cu_seqlens" in takes else "position_ids"
            if {"cu_seqlens", "position_ids"} <= takes:
                takes = takes - {"position_ids"}
        else:
            takes = takes - {"cu_seqlens", "position_ids"}
        return LogprobsContext(
            fn=fn,
            name=name,
            options=options,
            config=config,
            tolerance=tolerance_for(options),
            takes=frozenset(takes),
            layout=options.layout,
            ids_name=ids,
            bounds_name=bounds,
        )

    def _shape(self, ctx: Any, check: KindCheck) -> dict[str, Any]:
        ref: LogprobsReference = ctx.config
        taus: tuple[float, ...] = (ref.temperature,)
        if check.domain == "temperature" and ctx.takes_temperature:
            taus = _TEMPERATURES
        patterns = {
            "extreme": ("large",),
            "masked-vocab": ("excluded",),
            "temperature": ("normal", "peaked"),
            "packed": ("normal", "peaked"),
            "large-vocab": ("normal",),
        }.get(check.domain, ("normal", "peaked", "uniform"))
        big = check.domain == "large-vocab"
        return dict(
            max_batch=2 if big else min(4, ctx.options.max_batch),
            max_length=max(2, min(4 if big else 8, ctx.options.max_length)),
            min_vocab=4096 if big else 2,
            max_vocab=20000 if big else 16,
            patterns=patterns,
            temperatures=taus,
            shift=ref.shift,
            align=ref.align,
            dtype=ctx.tolerance.input_dtype,
            padding="nan" if ctx.options.padding_nan else "garbage",
        )

    def pool_key(self, ctx: Any, check: KindCheck) -> Hashable:
        return tuple(sorted((k, repr(v)) for k, v in self._shape(ctx, check).items()))

    def strategy(self, ctx: Any, check: KindCheck) -> Any:
        return logprob_batches(**self._shape(ctx, check))

    def _tau(self, ctx: LogprobsContext) -> float:
        return 0.7 if ctx.takes_temperature else ctx.reference.temperature

    def corpus(self, ctx: Any) -> dict[str, LogprobBatch]:
        return {"ragged": corpus_batch(ctx.config, ctx.tolerance.input_dtype, self._tau(ctx))}

    def corpus_for(self, ctx: Any, check: KindCheck) -> Mapping[str, LogprobBatch]:
        ref, dtype, tau = ctx.config, ctx.tolerance.input_dtype, self._tau(ctx)
        if check.domain == "extreme":
            return {"large": corpus_batch(ref, dtype, tau, "large")}
        if check.domain == "masked-vocab":
            return {"masked-vocab": corpus_batch(ref, dtype, tau, "masked-vocab")}
        if check.domain == "large-vocab":
            return {"large-vocab": large_vocab_batch(ref, dtype, tau)}
        if check.domain == "temperature" and ctx.takes_temperature:
            return {f"tau-{t:g}": corpus_batch(ref, dtype, t) for t in (0.7, 2.0)}
        return self.corpus(ctx)

    def diagnose(self, ctx: Any, inputs: Any) -> Diagnosis:
        return diagnose_logprobs(ctx, inputs)

    def snippet(self, ctx: Any, inputs: Any, check: KindCheck) -> str:
        return logprobs_snippet(ctx, inputs, check)

    def golden(self, ctx: Any) -> Tolerant:
        def entry(kw: Mapping[str, Any], res: Any) -> Any:
            assert res.grad is not None
            _, _, scale, grad_scale = reference_of(ctx, kw)
            zero = torch.zeros((), dtype=res.out.dtype)
            data = {"logprobs": torch.where(kw["response_mask"], res.out, zero), "grad": res.grad}
            return data, {"logprobs": EntryScale(scale), "grad": EntryScale(grad_scale)}

        return corpus_golden(self.corpus(ctx), lambda kw: call_logprobs(ctx, kw), entry,
                             tolerance=ctx.tolerance, version=CORPUS_VERSION)  # fmt: skip


KIND = LogprobsKind()
