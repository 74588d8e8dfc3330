"""Benchmark: the four figures of issue 8 section 1, medians over runs in one process.

1. a full default run (every applicable check, 100 examples) of one correct marked
   function, from a cold process state (each run uses a fresh ``--polgrad-seed``, so no
   pooled batch or cached oracle result of an earlier run is reused);
2. ten correct marked functions with the same options, in one process, in total;
3. the value + gradient checks of one correct function (sharing its calls between the
   two checks, as ``assert_conforms`` and one marked function's items do) against the
   bare forward+backward of the function plus the oracle on the very same (distinct)
   batches (recorded by a second, untimed run on the same pool, then replayed): first
   from a cold state (the pool is drawn), then for another function with the same options
   (the pool is shared); ``--repeats`` pairs per run, each on a new pool, and the ratio
   is the median of each pair's (the bare replay runs right after its checks segment, so
   the machine's drift between segments cancels; one cold segment is about 0.1 s);
4. the failing path: the value check of a wrong loss (clip eps 0.3 against "grpo"), with
   the search, shrinking, diagnosis and report.

Each timed segment starts from a settled heap (``gc.collect()`` then ``gc.freeze()``):
a full pass of the cyclic collector walks every live object (about 180 000 after
importing torch, Hypothesis and the kit: 0.1 s here), so one that happened to fall inside
a 0.1 s segment doubled it; frozen, a pass walks what the segment itself allocated. The
project's own suite freezes after collection for the same reason (``tests/conftest.py``).

Only the public engine entry points are used, so the same script times an older checkout
(``PYTHONPATH=/path/to/old/checkout python bench/conformance.py``). Targets (issue 8):
(1) <= 1.0 s, (2) <= 4 s, (3) <= 1.5x, (4) no slower than before.
Run: ``python bench/conformance.py [--runs 5] [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from pytest_polgrad.core.engine import applicable_checks, build_context, resolve_config, run_check
from pytest_polgrad.core.options import parse_marker

Tensor = torch.Tensor


def _grpo(eps: float) -> Callable[..., Tensor]:
    def loss(
        logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
    ) -> Tensor:
        """A hand-written GRPO policy term (seq-mean-token-mean, clip ``eps``)."""
        ratio = torch.exp(torch.where(response_mask, logprobs - old_logprobs, 0.0))
        a = advantages[:, None]
        per = torch.maximum(-a * ratio, -a * ratio.clamp(1.0 - eps, 1.0 + eps))
        per = torch.where(response_mask, per, 0.0)
        return (per.sum(dim=1) / response_mask.sum(dim=1)).mean()

    return loss


grpo_loss = _grpo(0.2)


def _shared() -> dict[str, Any]:
    """``shared=`` (one store of calls for one function's checks, as ``assert_conforms`` and
    the plugin pass) for engines that take it; older ones do not."""
    import inspect

    if "shared" not in inspect.signature(run_check).parameters:
        return {}
    from pytest_polgrad.core.kinds import CallStore

    return {"shared": CallStore()}


def _full_run(fn: Callable[..., Any], options: Any, seed: int, examples: int) -> None:
    shared = _shared()
    for check in applicable_checks(resolve_config(options), options):
        ctx = build_context(fn, options)
        result = run_check(
            ctx, check, max_examples=examples, base_seed=seed, diagnose=False, **shared
        )
        assert result.passed, result.report


def _named(name: str) -> dict[str, str]:
    """``name=`` for engines whose ``build_context`` takes it (older ones do not)."""
    import inspect

    return {"name": name} if "name" in inspect.signature(build_context).parameters else {}


def _value_and_gradient(
    fn: Callable[..., Any], options: Any, seed: int, examples: int, name: str | None = None
) -> None:
    """The value and gradient checks of ``fn``, sharing its calls (as one marked
    function's items and ``assert_conforms`` do)."""
    ctx = build_context(fn, options, **_named(name)) if name else build_context(fn, options)
    shared = _shared()
    for check in ("value", "gradient"):
        result = run_check(ctx, check, max_examples=examples, base_seed=seed, **shared)
        assert result.passed, result.report


def _digest(batch: dict[str, Tensor]) -> bytes:
    h = hashlib.sha1()
    for name in ("logprobs", "old_logprobs", "advantages", "response_mask"):
        t = batch[name]
        h.update(str((name, tuple(t.shape), t.dtype)).encode())
        h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.digest()


def _settled() -> float:
    """``time.perf_counter()`` after settling the heap (see the module docstring)."""
    gc.collect()
    gc.freeze()
    return time.perf_counter()


def _bare(ctx: Any, batch: dict[str, Tensor]) -> None:
    """What any comparison needs: the function's and the oracle's forward+backward."""
    lp = batch["logprobs"].detach().clone().requires_grad_()
    inputs = {k: batch[k] for k in ("old_logprobs", "advantages", "response_mask")}
    torch.autograd.grad(grpo_loss(lp, **inputs), lp)
    ctx.oracle(batch, kink_eps=ctx.tolerance.loosest)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--examples", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1000, help="first run's base seed")
    parser.add_argument(
        "--repeats", type=int, default=5, help="figure 3's cold and warm pairs per run"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    options = parse_marker(("grpo",), {})
    n_checks = len(applicable_checks(resolve_config(options), options))
    full_t, ten_t, vg_t, bare_t, fail_t = [], [], [], [], []
    warm_t: list[float] = []
    warm_bare_t: list[float] = []
    recorded: dict[bytes, dict[str, Tensor]] = {}

    def recording() -> Callable[..., Tensor]:
        """A new function object each time (the same loss), recording its batches."""

        def recording_loss(
            logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor
        ) -> Tensor:
            batch = dict(logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages)
            batch = {k: v.detach().clone() for k, v in batch.items()}
            batch["response_mask"] = response_mask.clone()
            recorded.setdefault(_digest(batch), batch)
            return grpo_loss(logprobs, old_logprobs, advantages, response_mask)

        return recording_loss

    seed = args.seed
    for _ in range(args.runs):
        seed += 1
        t0 = _settled()
        _full_run(grpo_loss, options, seed, args.examples)
        full_t.append(time.perf_counter() - t0)

        seed += 1
        ten = [_grpo(0.2) for _ in range(10)]  # ten distinct function objects
        t0 = _settled()
        for fn in ten:
            _full_run(fn, options, seed, args.examples)
        ten_t.append(time.perf_counter() - t0)

        for _ in range(args.repeats):  # each on a new pool: one cold segment is ~0.1 s
            seed += 1
            t0 = _settled()
            _value_and_gradient(_grpo(0.2), options, seed, args.examples)
            vg_t.append(time.perf_counter() - t0)
            # the batches that run saw, recorded by a second, untimed run on the same pool
            # (recording clones and hashes every batch: it must not weigh on the figure)
            recorded.clear()
            _value_and_gradient(recording(), options, seed, args.examples, name="recorder")
            batches = list(recorded.values())
            ctx = build_context(grpo_loss, options)
            t0 = _settled()
            for batch in batches:
                _bare(ctx, batch)
            bare_t.append(time.perf_counter() - t0)
            # the same checks again for another function with the same options: the
            # common case when several functions or checks share one pool
            t0 = _settled()
            _value_and_gradient(_grpo(0.2), options, seed, args.examples, name="another")
            warm_t.append(time.perf_counter() - t0)
            # copies: the oracle's cache (per batch tensors) must not serve the bare replay
            copies = [{k: v.clone() for k, v in batch.items()} for batch in batches]
            t0 = _settled()
            for batch in copies:
                _bare(ctx, batch)
            warm_bare_t.append(time.perf_counter() - t0)

        seed += 1
        ctx = build_context(_grpo(0.3), options)  # a new function: nothing cached for it
        t0 = _settled()
        result = run_check(ctx, "value", max_examples=args.examples, base_seed=seed)
        fail_t.append(time.perf_counter() - t0)
        assert not result.passed

    full, ten_s, vg, bare, fail, warm, warm_bare = (
        statistics.median(x) for x in (full_t, ten_t, vg_t, bare_t, fail_t, warm_t, warm_bare_t)
    )
    # figure 3's ratios pair each checks segment with the bare replay right after it
    cold_ratio = statistics.median(a / b for a, b in zip(vg_t, bare_t, strict=True))
    warm_ratio = statistics.median(a / b for a, b in zip(warm_t, warm_bare_t, strict=True))
    print(
        f"torch {torch.__version__}, 1 thread, {args.examples} examples per check, "
        f"{args.runs} runs (medians), reference 'grpo', default options"
    )
    print(f"1. full default run, {n_checks} checks, one function   {full:7.3f} s   (target <= 1.0)")
    print(f"2. ten functions, same options, one process   {ten_s:7.3f} s   (target <= 4)")
    print(f"3. value+gradient checks                      {vg:7.3f} s")
    print(f"   bare fwd+bwd of fn + oracle, same batches  {bare:7.3f} s   ({len(batches)} batches)")
    print(f"   ratio                                      {cold_ratio:7.3f} x   (target <= 1.5)")
    print(f"   same, another function, same options      {warm:7.3f} s")
    print(f"   bare fwd+bwd of fn + oracle, same batches  {warm_bare:7.3f} s")
    print(f"   ratio                                      {warm_ratio:7.3f} x")
    print(f"4. failing path (value, search+shrink+report) {fail:7.3f} s")


if __name__ == "__main__":
    main()
