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
    "CheckResult": "pytest_polgrad.engine",
    "CHECKS": "pytest_polgrad.checks",
    "canonical_corpus": "pytest_polgrad.corpus",
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
    from .api import ConformanceError, ConformanceReport, assert_conforms
    from .checks import CHECKS
    from .corpus import canonical_corpus
    from .engine import CheckResult


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pytest_polgrad' has no attribute {name!r}")
