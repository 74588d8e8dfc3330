"""Policy entropy of the sampled responses: estimated from sampled-token logprobs, or
exact from logits.

Token-mean entropy ``H = (1/N) sum_{b,t} H(pi(. | context_bt))`` over the ``N`` response
tokens. Two estimators:

- sampled (``entropy_from_logprobs``): ``-log pi(y_bt | context)`` at the sampled token.
  Its conditional expectation given the context is ``H(pi(. | context))`` (the definition
  of entropy), so by the tower rule the token mean is unbiased for ``H`` *when the tokens
  were sampled from the same policy that scores them* (on-policy). Off-policy (rollout
  engine != trainer, or after an update) it estimates the cross-entropy instead.
- exact (``entropy_from_logits``): ``H_bt = sum_v entr(softmax(z_bt)_v)`` from the full
  logits, valid on- or off-policy; ``-inf`` logits (masked vocabulary) contribute 0.

The standard error treats rows as the independent units (tokens within a response are
dependent): ``Var(H_hat) = B/(B-1) * sum_b (S_b - H_hat L_b)^2 / N^2`` with ``S_b`` the
row's sum (the ratio-estimator delta method: Cochran 1977, *Sampling Techniques*,
ch. 6).
Tests: ``tests/test_diagnostics_entropy.py``.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .. import _validate as v
from ..errors import InputError, NumericalError
from ._common import COMPUTE, DiagnosticResult, token_tensors

__all__ = ["EntropyEstimate", "entropy_from_logits", "entropy_from_logprobs"]

_CHUNK_ELEMENTS = 1 << 24


@dataclasses.dataclass(frozen=True)
class EntropyEstimate(DiagnosticResult):
    """Token-mean entropy (nats) with its row-clustered standard error."""

    namespace = "entropy"

    method: str
    """``"sampled"`` (on-policy Monte Carlo) or ``"exact"`` (from logits)."""
    mean: float
    stderr: float
    """Row-clustered standard error; ``inf`` for a single row (not estimable)."""
    n_tokens: int
    n_sequences: int
    min_sequence_mean: float
    max_sequence_mean: float

    def _metrics(self) -> dict[str, float]:
        return {
            "mean": self.mean,
            "stderr": self.stderr,
            "min_sequence_mean": self.min_sequence_mean,
            "max_sequence_mean": self.max_sequence_mean,
            "n_tokens": float(self.n_tokens),
        }

    def summary(self) -> str:
        return (
            f"entropy ({self.method}) {self.mean:.4f} +- {self.stderr:.2g} nats/token "
            f"over {self.n_tokens} tokens in {self.n_sequences} rows"
        )


def _estimate(method: str, per_token: torch.Tensor, mask: torch.Tensor) -> EntropyEstimate:
    """Ratio estimator ``sum S_b / sum L_b`` and its clustered standard error; ``per_token``
    is float64 and 0 at padding."""
    sums = per_token.sum(dim=1)
    lengths = mask.sum(dim=1).to(COMPUTE)
    n = float(lengths.sum())
    h = float(sums.sum()) / n
    rows = sums.numel()
    if rows > 1:
        resid = sums - h * lengths
        stderr = math.sqrt(rows / (rows - 1) * float(resid.square().sum())) / n
    else:
        stderr = math.inf
    seq_mean = sums / lengths
    return EntropyEstimate(
        method=method,
        mean=h,
        stderr=stderr,
        n_tokens=int(n),
        n_sequences=rows,
        min_sequence_mean=float(seq_mean.min()),
        max_sequence_mean=float(seq_mean.max()),
    )


def entropy_from_logprobs(
    *, logprobs: torch.Tensor, response_mask: torch.Tensor
) -> EntropyEstimate:
    """Monte Carlo entropy ``mean(-logprobs)`` of the sampled tokens (valid on-policy only,
    see the module docstring). ``logprobs`` are ``<= 0`` at response tokens."""
    mask, t = token_tensors(response_mask, {"logprobs": logprobs})
    lp = t["logprobs"]
    bad = mask & (lp > 0)
    if bool(bad.any()):
        raise InputError(
            "logprobs must be log-probabilities (<= 0) at response tokens, but are > 0 at "
            f"positions {v.format_positions(bad)} (max {float(lp[bad].max()):.4g})"
        )
    return _estimate("sampled", -lp, mask)


def _explain_bad_logits(logits: torch.Tensor, bad: torch.Tensor) -> None:
    """Slow path: name why the entropy is not finite at the ``bad`` ``[B, T]`` positions."""
    nan = torch.isnan(logits).any(dim=-1) & bad
    if bool(nan.any()):
        raise InputError(f"logits hold NaN at response positions {v.format_positions(nan)}")
    pinf = (logits == math.inf).any(dim=-1) & bad
    if bool(pinf.any()):
        raise InputError(f"logits hold +inf at response positions {v.format_positions(pinf)}")
    raise InputError(
        "every logit is -inf (no token has positive probability) at response positions "
        f"{v.format_positions(bad)}"
    )


def entropy_from_logits(*, logits: torch.Tensor, response_mask: torch.Tensor) -> EntropyEstimate:
    """Exact entropy of ``softmax(logits)`` at every response token, ``logits`` ``[B, T, V]``.

    Computed in float64 for float64 logits and in float32 otherwise (bfloat16/float16
    inputs are upcast), in row chunks so the temporary stays below ``2^24`` elements.
    """
    z = v.require_float_tensor("logits", logits)
    mask = v.require_response_mask(response_mask)
    if z.dim() != 3 or tuple(z.shape[:2]) != tuple(mask.shape) or z.shape[2] == 0:
        raise InputError(
            f"logits must have shape [B, T, V] = [{mask.shape[0]}, {mask.shape[1]}, V >= 1] "
            f"like response_mask, got {list(z.shape)}"
        )
    v.require_same_device({"logits": z, "response_mask": mask})
    work = torch.float64 if z.dtype == torch.float64 else torch.float32
    rows_per_chunk = max(1, _CHUNK_ELEMENTS // max(1, z.shape[1] * z.shape[2]))
    parts = []
    for start in range(0, z.shape[0], rows_per_chunk):
        chunk = z[start : start + rows_per_chunk].detach().to(work)
        parts.append(torch.special.entr(torch.softmax(chunk, dim=-1)).sum(dim=-1))
    per_token = torch.cat(parts).to(COMPUTE)
    bad = mask & ~torch.isfinite(per_token)
    if bool(bad.any()):
        _explain_bad_logits(z, bad)
    if not bool(torch.isfinite(per_token[mask]).all()):  # pragma: no cover - defensive
        raise NumericalError("the entropy is not finite although the logits are")
    return _estimate("exact", torch.where(mask, per_token, 0.0), mask)
