"""What every detector shares (docs/diagnostics.md, "Conventions"): frozen results with a
one-line and a full summary and namespaced float metrics; no tensor created without an
explicit device (checked on the CPU with a TorchFunctionMode that rejects device-less
factory calls, and on CUDA when one is present); torch-only imports.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, cast

import pytest
import torch
from torch.overrides import TorchFunctionMode

from polgrad_reference import PolicyLossConfig, RatioKind
from polgrad_reference import diagnostics as D
from tests.helpers.fresh_imports import loaded_after

FACTORIES = {
    torch.zeros, torch.ones, torch.empty, torch.full, torch.arange, torch.linspace,
    torch.logspace, torch.eye, torch.tensor, torch.as_tensor, torch.rand, torch.randn,
    torch.randint, torch.randperm, torch.scalar_tensor,
}  # fmt: skip


class NoImplicitDevice(TorchFunctionMode):
    """Fails any tensor factory called without ``device=`` (it would land on the CPU)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in FACTORIES and kwargs.get("device") is None:
            raise AssertionError(f"{func.__name__} called without device=")
        return func(*args, **kwargs)


def _inputs(device: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    b, t, v = 12, 10, 7
    mask = torch.arange(t)[None] < torch.randint(2, t + 1, (b, 1), generator=g)
    logits = torch.randn((b, t, v), generator=g, dtype=torch.float64)
    lp = torch.log_softmax(logits, -1)[..., 0]
    out = {
        "mask": mask,
        "logits": logits,
        "lp": lp,
        "rollout": lp + 0.05 * torch.randn((b, t), generator=g, dtype=torch.float64),
        "rescored": lp + 0.01 * torch.randn((b, t), generator=g, dtype=torch.float64),
        "adv": torch.randn(b, generator=g, dtype=torch.float64),
        "series": torch.randn(40, generator=g, dtype=torch.float64),
    }
    return {
        k: x.to(device=device, dtype=dtype if x.is_floating_point() else x.dtype)
        for k, x in out.items()
    }


def _run_all(x: dict[str, torch.Tensor]) -> dict[str, Any]:
    mask, lp, adv = x["mask"], x["lp"], x["adv"]
    results: dict[str, Any] = {
        "ess": D.importance_ess(
            trainer_logprobs=lp, rollout_logprobs=x["rollout"], response_mask=mask
        ),
        "mismatch": D.logprob_mismatch(
            trainer_logprobs=lp,
            rollout_logprobs=x["rollout"],
            rescored_logprobs=x["rescored"],
            response_mask=mask,
        ),
        "clip": D.clip_report(
            PolicyLossConfig(ratio=RatioKind.SEQUENCE),
            logprobs=lp,
            old_logprobs=x["rollout"],
            advantages=adv,
            response_mask=mask,
        ),
        "entropy_sampled": D.entropy_from_logprobs(logprobs=lp, response_mask=mask),
        "entropy_exact": D.entropy_from_logits(logits=x["logits"], response_mask=mask),
        "cov": D.logprob_advantage_covariance(logprobs=lp, advantages=adv, response_mask=mask),
        "trend": D.entropy_trend(x["series"], n_permutations=19),
        "length": D.length_bias(advantages=adv, response_mask=mask, aggregation="token-mean"),
    }
    mon = D.RunMonitor(["z"], horizon=5)
    mon.update({"z": results["cov"].z})
    results["monitor"] = mon.report()
    return results


def test_results_are_frozen_with_summaries_and_namespaced_float_metrics() -> None:
    for name, res in _run_all(_inputs("cpu", torch.float64)).items():
        assert dataclasses.is_dataclass(res) and not isinstance(res, type), name
        res = cast(Any, res)  # a result class of its own: summary(), report(), as_metrics()
        field = dataclasses.fields(res)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(res, field, None)
        one = res.summary()
        assert one and "\n" not in one and str(res) == one, name
        full = res.report().splitlines()
        assert full[0] == one and len(full) > 2, name
        metrics = res.as_metrics()
        assert metrics and all(k.startswith(res.namespace + "/") for k in metrics), name
        assert all(type(v) is float and math.isfinite(v) for v in metrics.values()), name
        assert set(res.as_metrics(prefix="diag/")) == {"diag/" + k for k in metrics}


def test_no_factory_call_without_an_explicit_device() -> None:
    with pytest.raises(AssertionError, match="zeros called without device="), NoImplicitDevice():
        torch.zeros(3)  # the guard itself works
    x = _inputs("cpu", torch.float32)
    with NoImplicitDevice():
        _run_all(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_detector_accepts_low_precision_inputs(dtype: torch.dtype) -> None:
    low = _run_all(_inputs("cpu", dtype))
    ref = _run_all(
        {k: v.double() if v.is_floating_point() else v for k, v in _inputs("cpu", dtype).items()}
    )
    for name in low:
        a, b = low[name].as_metrics(), ref[name].as_metrics()
        assert a.keys() == b.keys()
        for k in a:  # upcast is exact; only the float32 softmax of exact entropy differs
            assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-7), (name, k)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_results_match_cpu() -> None:  # pragma: no cover - needs a GPU
    cpu = _run_all(_inputs("cpu", torch.float32))
    with NoImplicitDevice():
        gpu = _run_all(_inputs("cuda", torch.float32))
    assert gpu["clip"].killed.device.type == "cuda"
    for name in cpu:
        a, b = cpu[name].as_metrics(), gpu[name].as_metrics()
        for k in a:
            if name == "trend" and k in ("p_value", "alarm"):
                continue  # permutations come from the device's generator
            assert b[k] == pytest.approx(a[k], rel=1e-6, abs=1e-9), (name, k)


def test_diagnostics_import_torch_only() -> None:
    """In a fresh interpreter (``tests/helpers/fresh_imports.py``)."""
    loaded = loaded_after("polgrad_reference.diagnostics")
    assert "polgrad_reference.diagnostics" in loaded and "torch" in loaded
    heavy = ("pytest", "hypothesis", "syrupy", "matplotlib")
    bad = [m for m in heavy if m in loaded]
    assert not bad, bad


def test_the_plugin_fixture_returns_the_module(request: pytest.FixtureRequest) -> None:
    get: Callable[[str], Any] = request.getfixturevalue
    assert get("polgrad_diagnostics") is D
