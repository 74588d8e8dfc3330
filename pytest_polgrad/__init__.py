"""pytest-polgrad: conformance test-kit for LLM policy-gradient losses.

Importing this package (which pytest does for every session through the ``pytest11``
entry point) must not import torch; heavy names are resolved lazily on first use.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
