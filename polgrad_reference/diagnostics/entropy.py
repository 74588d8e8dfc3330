"""Policy entropy of the sampled responses: estimated from sampled-token logprobs, or
exact from logits.

Token-mean entropy ``H = (1/N) sum_{b,t} H(pi(. | context_bt))`` over the ``N`` response
tokens. Two estimators:

- sampled (``entropy_from_logprobs``): ``-log pi(y_bt | context)`` at the sampled token.
  Its conditional expectation given the context is ``H(pi(. | context))`` (the definition
  of entropy), so by the tower rule the token mean is unbiased for ``H`` *when the tokens
  were sampled from the same policy that scores them* (on-policy). Off-policy (rollout
  engine != trainer, or after an update) it estimates the cross-entropy instead.
- exact (``entropy_from_logits``): ``H_bt = -sum_v p_v log p_v``, ``p = softmax(z_bt)``,
  from the full logits (``polgrad_reference.token_entropy``), valid on- or off-policy;
  ``-inf`` logits (masked vocabulary) contribute 0.

The standard error treats rows as the independent units (tokens within a response are
dependent): ``Var(H_hat) = B/(B-1) * sum_b (S_b - H_hat L_b)^2 / N^2`` with ``S_b`` the
row's sum (the ratio-estimator delta method: Cochran 1977, *Sampling Techniques*,
ch. 6). ``interval(level)`` is ``mean +- t_{B-1}((1 + level)/2) stderr``: the normal
quantile ``1.96 stderr`` covered only 0.85-0.88 at ``B = 4`` (nominal 0.95); the Student-t
one with ``B - 1`` degrees of freedom covers within Monte Carlo error from ``B = 2``
(``bench/calibration.py``); one row has no interval ("too few rows to decide").
Tests: ``tests/reference/diagnostics/test_entropy.py``.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .. import _validate as v
from ..entropy import sampled_token_entropy, token_entropy
from ..errors import ConfigError, InputError
from ._common import COMPUTE, DiagnosticResult, student_t_quantile

__all__ = ["MIN_ROWS_INTERVAL", "EntropyEstimate", "entropy_from_logits", "entropy_from_logprobs"]

MIN_ROWS_INTERVAL = 2
"""Rows from which :meth:`EntropyEstimate.interval` is calibrated (``bench/calibration.py``)."""

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

    def interval(self, level: float = 0.95) -> tuple[float, float]:
        """``mean +- t_{B-1}((1 + level) / 2) stderr``; raises ``InputError`` ("too few rows
        to decide") below ``MIN_ROWS_INTERVAL`` rows."""
        if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
            raise ConfigError(f"level must be a confidence level in (0, 1), got {level!r}")
        if self.n_sequences < MIN_ROWS_INTERVAL:
            raise InputError(
                f"too few rows to decide: an entropy interval needs at least "
                f"{MIN_ROWS_INTERVAL} rows (got {self.n_sequences})"
            )
        half = student_t_quantile(0.5 + level / 2.0, self.n_sequences - 1) * self.stderr
        return self.mean - half, self.mean + half

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
    see the module docstring); per token :func:`polgrad_reference.sampled_token_entropy`,
    which rejects ``logprobs > 0``."""
    h = sampled_token_entropy(logprobs=logprobs, response_mask=response_mask)
    return _estimate("sampled", h.detach().to(COMPUTE), response_mask)


def _explain_bad_logits(logits: torch.Tensor, mask: torch.Tensor) -> None:
    """Slow path: name the bad ``[B, T]`` positions of the whole batch (a chunk's own
    error would count rows from the chunk's start)."""
    nan = torch.isnan(logits).any(dim=-1) & mask
    if bool(nan.any()):
        raise InputError(f"logits hold NaN at response positions {v.format_positions(nan)}")
    pinf = (logits == math.inf).any(dim=-1) & mask
    if bool(pinf.any()):
        raise InputError(f"logits hold +inf at response positions {v.format_positions(pinf)}")
    dead = (logits == -math.inf).all(dim=-1) & mask
    if bool(dead.any()):
        raise InputError(
            "every logit is -inf (no token has positive probability) at response positions "
            f"{v.format_positions(dead)}"
        )


def entropy_from_logits(*, logits: torch.Tensor, response_mask: torch.Tensor) -> EntropyEstimate:
    """Exact entropy of ``softmax(logits)`` at every response token, ``logits`` ``[B, T, V]``
    (per token :func:`polgrad_reference.token_entropy`).

    Computed in float64 for float64 logits and in float32 otherwise (bfloat16/float16
    inputs are upcast), in row chunks so the upcast copy stays below ``2^24`` elements.
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
        rows = slice(start, start + rows_per_chunk)
        try:
            h = token_entropy(logits=z[rows].detach().to(work), response_mask=mask[rows])
        except InputError:
            _explain_bad_logits(z, mask)
            raise
        parts.append(h.to(COMPUTE))
    return _estimate("exact", torch.cat(parts), mask)
