"""pytest-polgrad: conformance test-kit for LLM policy-gradient losses.

Importing this package (which pytest does for every session through the ``pytest11``
entry point) must not import torch: the public names below are resolved lazily.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "assert_conforms": "pytest_polgrad.api",
    "ConformanceError": "pytest_polgrad.api",
    "ConformanceReport": "pytest_polgrad.api",
    "CheckResult": "pytest_polgrad.core.engine",
    "CHECKS": "pytest_polgrad.kinds.policy_loss.checks",
    "canonical_corpus": "pytest_polgrad.core.corpus",
}

__all__ = [
    "CHECKS",
    "CheckResult",
    "ConformanceError",
    "ConformanceReport",
    "__version__",
    "assert_conforms",
    "canonical_corpus",
]

if TYPE_CHECKING:
    from pytest_polgrad.api import ConformanceError, ConformanceReport, assert_conforms
    from pytest_polgrad.core.corpus import canonical_corpus
    from pytest_polgrad.core.engine import CheckResult
    from pytest_polgrad.kinds.policy_loss.checks import CHECKS


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pytest_polgrad' has no attribute {name!r}")
