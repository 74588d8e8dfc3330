"""The bias a truncating sampler's renormalised logprobs put into the trainer/rollout ratio.

A sampler with temperature ``tau``, top-k and top-p draws from ``q_K(v) = p(v) / M`` on its
kept set ``K`` (``polgrad_reference.sampler_kept_mask``), ``p = softmax(z / tau)`` and
``M = sum_{v in K} p(v)`` the kept mass. When it reports ``log q_K(y)`` (vLLM
``logprobs_mode="processed_logprobs"``) and the trainer scores the same token over the
full vocabulary, ``log p(y)``, the importance ratio is

    w = exp(log p(y) - log q_K(y)) = M     for every kept y,

whichever token was drawn (TRL #6789 states the same closed form). ``w`` is not a policy
change: it is ``<= 1`` by construction, ``>= top_p`` under top-p alone, and a
sequence-level ratio multiplies it over the response, ``prod_t M_t``. This module computes
``M_t`` from the logits at every response token, so the bias is known before any loss
sees it; :func:`polgrad_reference.diagnostics.logprob_mismatch` measures the realised
ratios (this bias plus engine noise) from the two logprob tensors.

TRL #6789 (PR #7269's table: Qwen2.5-1.5B-Instruct, vLLM 0.28, temperature 1,
``top_p=0.8, top_k=1024``): mean ratio 0.896, 51.8% of tokens outside ``[0.9, 1.1]``.
Reproduced qualitatively on a synthetic batch (``bench/logprobs_figures.py``: V = 32768,
Zipf-shaped logits ``-s log(rank)`` plus N(0, 0.5^2) noise with the exponent ``s``
uniform in [1.05, 6] per position, 32 x 64 tokens, temperature 1): at ``top_p=0.8`` the
mean ratio is 0.895 (median 0.904) and 48.5% of tokens lie outside ``[0.9, 1.1]``, every
ratio in ``[0.8, 1]``; at ``top_p=0.95`` 0.966 and 0%; at ``top_k=50`` 0.969 (min 0.43)
and 8.9%; at ``top_p=1, top_k=0`` exactly 1 and 0%. The synthetic numbers depend on the
chosen entropy profile; the closed form ``w = M`` does not. Tests:
``tests/reference/diagnostics/test_sampling.py``; docs: ``docs/logprobs.md``.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .. import _validate as v
from ..errors import ConfigError, InputError
from ..logprobs import sampler_kept_mask
from ._common import COMPUTE, DiagnosticResult

__all__ = ["SamplingBias", "sampling_bias"]

_CHUNK_ELEMENTS = 1 << 24


@dataclasses.dataclass(frozen=True)
class SamplingBias(DiagnosticResult):
    """Kept-mass bias of the trainer/rollout ratio on one batch."""

    namespace = "sampling"

    temperature: float
    top_p: float
    top_k: int
    n_tokens: int
    n_sequences: int
    mean_ratio: float
    """Token mean of ``w_t = M_t`` (1 when nothing is truncated)."""
    median_ratio: float
    min_ratio: float
    mean_log_ratio: float
    """Token mean of ``log M_t``: the shift of ``k1``-style log-ratio statistics."""
    band: tuple[float, float]
    frac_outside_band: float
    """Fraction of response tokens with ``w_t`` outside ``band``."""
    mean_kept_tokens: float
    """Mean size of the kept set ``|K_t|``."""
    mean_sequence_log_ratio: float
    """Mean over rows with tokens of ``sum_t log M_t``: the log of the bias a
    sequence-level ratio (``prod_t w_t``) carries."""
    min_sequence_log_ratio: float
    min_row_mean_ratio: float
    max_row_frac_outside: float
    n_outside_kept: int | None
    """With ``tokens``: response tokens outside the kept set (this sampler cannot have
    drawn them: the parameters or the logits do not match the rollout); else None."""
    token_ratio: torch.Tensor = dataclasses.field(repr=False, compare=False)
    """``[B, T]`` float64 ``w_t = M_t``, 1 at padding."""
    row_mean_ratio: torch.Tensor = dataclasses.field(repr=False, compare=False)
    """``[B]`` float64 row means of ``w_t`` (NaN for a row with no response token)."""
    row_frac_outside: torch.Tensor = dataclasses.field(repr=False, compare=False)
    """``[B]`` float64 row fractions outside ``band`` (NaN for an empty row)."""
    row_log_ratio: torch.Tensor = dataclasses.field(repr=False, compare=False)
    """``[B]`` float64 ``sum_t log M_t`` (0 for an empty row)."""

    def _metrics(self) -> dict[str, float]:
        out = {
            "mean_ratio": self.mean_ratio,
            "median_ratio": self.median_ratio,
            "min_ratio": self.min_ratio,
            "mean_log_ratio": self.mean_log_ratio,
            "frac_outside_band": self.frac_outside_band,
            "mean_kept_tokens": self.mean_kept_tokens,
            "mean_sequence_log_ratio": self.mean_sequence_log_ratio,
            "min_sequence_log_ratio": self.min_sequence_log_ratio,
            "min_row_mean_ratio": self.min_row_mean_ratio,
            "max_row_frac_outside": self.max_row_frac_outside,
            "n_tokens": float(self.n_tokens),
        }
        if self.n_outside_kept is not None:
            out["n_outside_kept"] = float(self.n_outside_kept)
        return out

    def summary(self) -> str:
        lo, hi = self.band
        outside = (
            f"; {self.n_outside_kept} token(s) outside the kept set" if self.n_outside_kept else ""
        )
        return (
            f"sampling bias (temperature={self.temperature:g}, top_p={self.top_p:g}, "
            f"top_k={self.top_k}): ratio = kept mass, mean {self.mean_ratio:.4f} "
            f"(min {self.min_ratio:.4f}), outside [{lo:g}, {hi:g}]="
            f"{self.frac_outside_band:.2%} of {self.n_tokens} tokens, mean sequence "
            f"log-ratio {self.mean_sequence_log_ratio:.4g}{outside}"
        )


def _band(band: object) -> tuple[float, float]:
    if not (isinstance(band, tuple) and len(band) == 2):
        raise ConfigError(f"band must be a (low, high) tuple of ratios, got {band!r}")
    lo, hi = (float(x) for x in band)
    if not 0.0 < lo < 1.0 < hi:
        raise ConfigError(f"band must satisfy 0 < low < 1 < high, got {band!r}")
    return lo, hi


def sampling_bias(
    *,
    response_mask: torch.Tensor,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = 0,
    logits: torch.Tensor | None = None,
    logprobs: torch.Tensor | None = None,
    tokens: torch.Tensor | None = None,
    band: tuple[float, float] = (0.9, 1.1),
) -> SamplingBias:
    """Kept mass ``M_t`` (the trainer/rollout ratio a renormalising sampler produces) at
    every response token, and its summaries.

    Exactly one of ``logits`` (``[B, T, V]``, untempered) or ``logprobs`` (``[B, T, V]``,
    the full-vocabulary ``log_softmax`` of the untempered logits: equal to the logits up
    to a per-position constant, so treated the same). Both are aligned with
    ``response_mask`` ``[B, T]``: position ``t`` holds the distribution the token at ``t``
    was drawn from (from a causal forward pass, the logits of ``t - 1``). ``temperature``,
    ``top_p``, ``top_k`` are the rollout's sampling parameters
    (``polgrad_reference.sampler_kept_mask``); ``tokens`` ``[B, T]`` (optional) are the
    drawn tokens, counted when outside the kept set. float64 internally.
    """
    if (logits is None) == (logprobs is None):
        raise ConfigError("pass exactly one of logits and logprobs (full-vocabulary, [B, T, V])")
    name = "logits" if logits is not None else "logprobs"
    z = v.require_float_tensor(name, logits if logits is not None else logprobs)
    lo, hi = _band(band)
    mask = v.require_response_mask(response_mask, sized=True, nonempty=False)
    b, t = mask.shape
    if z.dim() != 3 or tuple(z.shape[:2]) != (b, t) or z.shape[2] == 0:
        raise InputError(
            f"{name} must have shape [B, T, V] = [{b}, {t}, V >= 1] like response_mask, "
            f"got {list(z.shape)}"
        )
    tensors = {name: z, "response_mask": mask}
    y = None
    if tokens is not None:
        y = v.require_tensor("tokens", tokens)
        if y.dtype.is_floating_point or y.dtype == torch.bool or y.dtype.is_complex:
            raise InputError(f"tokens must be an integer tensor of token ids, got {y.dtype}")
        v.require_shape("tokens", y, (b, t), "[B, T] like response_mask")
        tensors["tokens"] = y
    v.require_same_device(tensors)
    if not bool(mask.any()):
        raise InputError("response_mask selects no token; a diagnostic needs at least one")
    # the sampling parameters are validated by sampler_kept_mask; check them once up front
    probe = torch.zeros(1, dtype=COMPUTE)
    sampler_kept_mask(logits=probe, temperature=temperature, top_p=top_p, top_k=top_k)
    tau = float(temperature)
    vocab = z.shape[2]
    idx = mask.nonzero()
    step = max(1, _CHUNK_ELEMENTS // vocab)
    log_m_parts, kept_parts, outside = [], [], 0
    for c in range(0, idx.shape[0], step):
        bi, ti = idx[c : c + step, 0], idx[c : c + step, 1]
        zc = z[bi, ti].detach().to(COMPUTE)
        bad = torch.isnan(zc).any(dim=1) | (zc == math.inf).any(dim=1)
        bad |= (zc == -math.inf).all(dim=1)
        if bool(bad.any()):
            hit = torch.zeros_like(mask)
            hit[bi[bad], ti[bad]] = True
            raise InputError(
                f"{name} hold NaN or +inf, or are -inf over the whole vocabulary, at "
                f"response positions {v.format_positions(hit)}"
            )
        kept = sampler_kept_mask(logits=zc, temperature=tau, top_p=top_p, top_k=top_k)
        u = zc / tau
        log_m = torch.logsumexp(torch.where(kept, u, -math.inf), dim=1) - torch.logsumexp(u, dim=1)
        log_m_parts.append(torch.clamp(log_m, max=0.0))  # M <= 1; rounding can give +1 ulp
        kept_parts.append(kept.sum(dim=1).to(COMPUTE))
        if y is not None:
            yc = y[bi, ti].long()
            in_range = (yc >= 0) & (yc < vocab)
            inside = kept.gather(1, torch.where(in_range, yc, 0)[:, None])[:, 0] & in_range
            outside += int((~inside).sum())
    log_m = torch.cat(log_m_parts)
    ratio = torch.exp(log_m)
    token_log = torch.zeros((b, t), dtype=COMPUTE, device=mask.device)
    token_log[idx[:, 0], idx[:, 1]] = log_m
    token_ratio = torch.exp(token_log)
    out_band = ((token_ratio < lo) | (token_ratio > hi)) & mask
    lengths = mask.sum(dim=1).to(COMPUTE)
    has = lengths > 0
    row_log = token_log.sum(dim=1)
    row_mean = torch.where(mask, token_ratio, 0.0).sum(dim=1) / lengths
    row_frac = out_band.sum(dim=1).to(COMPUTE) / lengths
    return SamplingBias(
        temperature=tau,
        top_p=float(top_p),
        top_k=int(top_k),
        n_tokens=int(ratio.numel()),
        n_sequences=b,
        mean_ratio=float(ratio.mean()),
        median_ratio=float(ratio.median()),
        min_ratio=float(ratio.min()),
        mean_log_ratio=float(log_m.mean()),
        band=(lo, hi),
        frac_outside_band=float(out_band.sum()) / ratio.numel(),
        mean_kept_tokens=float(torch.cat(kept_parts).mean()),
        mean_sequence_log_ratio=float(row_log[has].mean()),
        min_sequence_log_ratio=float(row_log[has].min()),
        min_row_mean_ratio=float(row_mean[has].min()),
        max_row_frac_outside=float(row_frac[has].max()),
        n_outside_kept=None if y is None else outside,
        token_ratio=token_ratio,
        row_mean_ratio=row_mean,
        row_frac_outside=row_frac,
        row_log_ratio=row_log,
    )
