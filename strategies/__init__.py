"""Hypothesis strategies for policy-gradient loss inputs (``pytest_polgrad.strategies``).

The whole-batch strategy :func:`batches` draws :class:`Batch` objects; the component
strategies (:func:`lengths`, :func:`response_masks`, :func:`logprobs`,
:func:`log_ratio_gaps`, :func:`advantages`, :func:`groups`, :func:`loss_configs`,
:func:`algorithm_names`) compose into custom ones. Layout converters move tensors between
right-padded, left-padded and packed rows exactly. See ``docs/strategies.md``.
"""

from __future__ import annotations

from ._advantages import advantages
from ._batch import Batch, build, build_many
from ._configs import algorithm_names, loss_configs
from ._domain import DEFAULT_CLIPS, DOMAINS, EXTREME, SEMANTIC, SUPPORTED_DTYPES, Domain
from ._draw import batches
from ._groups import Groups, groups
from ._layout import Layout, left_to_right, pack, right_to_left, row_extents, unpack
from ._logits import LOGPROB_PATTERNS, LogprobBatch, logprob_batches
from ._masks import lengths, response_masks
from ._plan import BatchPlan
from ._rewards import (
    LOGIT_PATTERNS,
    REWARD_KINDS,
    LogitBatch,
    RewardBatch,
    ValueBatch,
    logit_batches,
    reward_batches,
    value_batches,
)
from ._splits import SPLIT_FAMILIES, Split, StepInfo, splits
from ._values import log_ratio_gaps, logprobs

__all__ = [
    "DEFAULT_CLIPS",
    "DOMAINS",
    "EXTREME",
    "LOGIT_PATTERNS",
    "LOGPROB_PATTERNS",
    "REWARD_KINDS",
    "SEMANTIC",
    "SPLIT_FAMILIES",
    "SUPPORTED_DTYPES",
    "Batch",
    "BatchPlan",
    "Domain",
    "Groups",
    "Layout",
    "LogitBatch",
    "LogprobBatch",
    "RewardBatch",
    "Split",
    "StepInfo",
    "ValueBatch",
    "advantages",
    "algorithm_names",
    "batches",
    "build",
    "build_many",
    "groups",
    "left_to_right",
    "lengths",
    "log_ratio_gaps",
    "logit_batches",
    "logprob_batches",
    "logprobs",
    "loss_configs",
    "pack",
    "response_masks",
    "reward_batches",
    "right_to_left",
    "row_extents",
    "splits",
    "unpack",
    "value_batches",
]
