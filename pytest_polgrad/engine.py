"""The conformance engine: run one named check of one function with Hypothesis.

Each check is a Hypothesis property over batches drawn for the reference config; the
first failure is shrunk to a minimal batch and turned into a :class:`CheckResult` with a
full report. Runs are deterministic: the seed of every (function, reference, check)
is derived with SHA-256 from ``--polgrad-seed``, so every xdist worker and every rerun
draws the same batches. The Hypothesis example database is not used: nothing the user
stored there is read or written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable
from typing import Any

import torch
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from polgrad_reference import PolicyLossConfig, get_algorithm

from .checks import CHECKS, CheckFailure, Context
from .options import ConformanceOptions
from .oracle import Oracle
from .report import failure_report
from .strategies import EXTREME, Batch, batches
from .target import FunctionUnderTest, Verdict
from .tolerance import Tolerance

__all__ = ["CheckResult", "applicable_checks", "build_context", "resolve_config", "run_check"]

_DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """The outcome of one check; serialisable to JSON with :meth:`as_dict`."""

    function: str
    reference: str
    check: str
    passed: bool
    examples: int
    worst: float
    """Worst error seen, in units of tolerance (checks without tolerance report 0)."""
    message: str = ""
    report: str = ""
    diagnosis: str = ""
    match: str = ""
    """Short form of the diagnosis, for the summary table."""
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-compatible data (a non-finite ``worst`` becomes the string "inf")."""
        data = dataclasses.asdict(self)
        data["worst"] = self.worst if math.isfinite(self.worst) else "inf"
        return data


def resolve_config(options: ConformanceOptions) -> PolicyLossConfig:
    """The reference loss config with the marker's overrides applied."""
    ref = options.reference
    if isinstance(ref, PolicyLossConfig):
        return ref.replace(**options.overrides) if options.overrides else ref
    assert isinstance(ref, str)
    return get_algorithm(ref).derive(**options.overrides).loss


def build_context(fn: Callable[..., Any], options: ConformanceOptions) -> Context:
    """Wire a function, its reference oracle and the tolerance model together.

    A function without a ``ref_logprobs`` parameter is compared with the reference's KL
    term removed, and the report says so.
    """
    fut = FunctionUnderTest(fn, options)
    cfg = resolve_config(options)
    notes = set()
    if cfg.kl_in_loss and not fut.takes_ref:
        cfg = cfg.replace(kl=None)
        notes.add(
            "compared without the reference's as-loss KL term: the function takes no "
            "ref_logprobs (most current GRPO setups train without it)"
        )
    tol = Tolerance(_DTYPES[options.dtype], strict=options.strict, factor=options.tolerance)
    ctx = Context(fut=fut, oracle=Oracle(cfg), tolerance=tol, options=options)
    ctx.notes |= notes
    return ctx


def applicable_checks(cfg: PolicyLossConfig, options: ConformanceOptions) -> list[str]:
    """Names of the checks that generate items for this config and options, in order."""
    names = [n for n, c in CHECKS.items() if c.applies(cfg, options)]
    if options.checks is not None:
        names = [n for n in names if n in options.checks]
    return names


def derive_seed(base: int, *parts: str) -> int:
    """Stable 64-bit seed for a check (SHA-256, not Python's salted ``hash``)."""
    digest = hashlib.sha256(":".join([str(base), *parts]).encode()).digest()
    return int.from_bytes(digest[:8], "big")


def _strategy(ctx: Context, check_name: str) -> st.SearchStrategy[Any]:
    check = CHECKS[check_name]
    cfg = ctx.config
    dtype = ctx.tolerance.input_dtype
    # Keep a plain loss representable in the input dtype: |A| * exp(gap) summed over up to
    # max_batch * max_length tokens (binds for float16 only: gap <= log(65504 / 8192)).
    tokens = ctx.options.max_batch * ctx.options.max_length
    cap = max(1.0, math.log(torch.finfo(dtype).max / (4.0 * tokens)))
    bound = min(EXTREME.max_log_ratio, cap) if check.domain == "extreme" else None
    drawn = batches(
        max_log_ratio=bound,
        clip=cfg.clip,
        domain=check.domain,
        dtype=dtype,
        advantage_shape=ctx.options.advantages,  # type: ignore[arg-type]
        with_ref_logprobs=cfg.kl_in_loss,
        with_rollout_logprobs=cfg.is_correction is not None,
        with_rewards=False,
        max_batch=ctx.options.max_batch,
        max_length=ctx.options.max_length,
        padding="nan" if ctx.options.padding_nan else "garbage",
    )
    return drawn.map(_on_policy) if check.on_policy else drawn


def _on_policy(batch: Batch) -> Batch:
    """The same batch with ``old_logprobs`` (and ``rollout_logprobs``) set to ``logprobs``."""
    rollout = None if batch.rollout_logprobs is None else batch.logprobs.clone()
    return dataclasses.replace(
        batch, plan=None, old_logprobs=batch.logprobs.clone(), rollout_logprobs=rollout
    )


def run_check(
    ctx: Context,
    check_name: str,
    *,
    max_examples: int,
    base_seed: int,
    replay: str = "",
    diagnose: bool = True,
) -> CheckResult:
    """Run one check to completion: pass, or fail with a shrunk batch and a report."""
    check = CHECKS[check_name]
    counter = [0]
    last: list[Any] = [None]

    @settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        derandomize=False,
        phases=(Phase.explicit, Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
        print_blob=False,
    )
    @seed(derive_seed(base_seed, ctx.fut.name, ctx.options.reference_id, check_name))
    @given(batch=_strategy(ctx, check_name))
    def prop(batch: Any) -> None:
        counter[0] += 1
        last[0] = batch
        check.run(ctx, batch.as_kwargs())

    result = CheckResult(
        function=ctx.fut.name,
        reference=ctx.options.reference_id,
        check=check_name,
        passed=True,
        examples=0,
        worst=0.0,
    )
    try:
        prop()
    except (CheckFailure, Verdict) as exc:
        report, diagnosis, match = failure_report(
            ctx, check, exc, last[0], replay, diagnose=diagnose
        )
        result = dataclasses.replace(
            result,
            passed=False,
            worst=max(ctx.worst, getattr(exc, "error", math.inf)),
            message=str(exc),
            report=report,
            diagnosis=diagnosis,
            match=match,
        )
    else:
        result = dataclasses.replace(result, worst=ctx.worst)
    return dataclasses.replace(result, examples=counter[0], notes=tuple(sorted(ctx.notes)))
