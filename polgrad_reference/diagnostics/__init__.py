"""Diagnostics: run pathologies from tensors a training loop already has, each with a
stated null distribution and a calibrated alarm (``docs/diagnostics.md``).

- :func:`importance_ess`: ESS/n of the trainer/rollout importance weights.
- :func:`logprob_mismatch`: k1/k2/k3, TV, chi2, tails and catastrophic tokens, with an
  exact sign test against the trainer's own re-scoring noise floor.
- :func:`clip_report`: clip-region fractions and the exact killed-gradient set.
- :func:`entropy_from_logprobs` / :func:`entropy_from_logits`,
  :func:`logprob_advantage_covariance`, :func:`entropy_trend` (permutation changepoint).
- :func:`length_bias`: the length drive of an aggregation with a calibrated interval.
- :class:`RunMonitor`: CUSUM over a run with whole-run false-alarm probability <= alpha.
- :func:`sampling_bias`: the kept-mass bias a truncating sampler puts into the ratio.

Torch only; every detector computes in float64 on its inputs' device.
"""

from __future__ import annotations

from ._common import DiagnosticResult
from .clip import ClipReport, clip_report
from .covariance import LogprobAdvantageCovariance, logprob_advantage_covariance
from .entropy import EntropyEstimate, entropy_from_logits, entropy_from_logprobs
from .ess import ImportanceESS, importance_ess, lognormal_ess
from .length import LengthBias, length_bias
from .mismatch import LogprobMismatch, logprob_mismatch
from .monitor import (
    Alarm,
    MonitoredStatistic,
    MonitorReport,
    RunMonitor,
    cusum_paths,
    cusum_threshold,
)
from .sampling import SamplingBias, sampling_bias
from .trend import ChangepointTest, entropy_trend

__all__ = [
    "Alarm",
    "ChangepointTest",
    "ClipReport",
    "DiagnosticResult",
    "EntropyEstimate",
    "ImportanceESS",
    "LengthBias",
    "LogprobAdvantageCovariance",
    "LogprobMismatch",
    "MonitorReport",
    "MonitoredStatistic",
    "RunMonitor",
    "SamplingBias",
    "clip_report",
    "cusum_paths",
    "cusum_threshold",
    "entropy_from_logits",
    "entropy_from_logprobs",
    "entropy_trend",
    "importance_ess",
    "length_bias",
    "lognormal_ess",
    "logprob_advantage_covariance",
    "logprob_mismatch",
    "sampling_bias",
]
