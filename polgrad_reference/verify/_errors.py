"""The verification harness's finding: a gradient (or expectation) that disagrees with
its reference. Kept apart so every module of the harness can raise it."""

from __future__ import annotations

__all__ = ["VerificationError"]


class VerificationError(AssertionError):
    """A verification found a gradient (or expectation) that disagrees with its reference."""
