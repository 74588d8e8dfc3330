"""Exception types raised by the reference library.

Every error subclasses both :class:`PolgradError` and the builtin ``ValueError`` or
``TypeError`` a caller would expect, so ``except ValueError`` keeps working.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "InputError",
    "InputTypeError",
    "NumericalError",
    "PolgradError",
]


class PolgradError(Exception):
    """Base class of every error raised by ``polgrad_reference``."""


class InputError(PolgradError, ValueError):
    """A tensor argument has the wrong shape, an invalid value, or an empty row."""


class InputTypeError(PolgradError, TypeError):
    """A tensor argument is not a tensor, or has the wrong dtype or device."""


class ConfigError(PolgradError, ValueError):
    """A configuration value is out of its documented range."""


class NumericalError(PolgradError, ValueError):
    """Valid-looking inputs led to an overflow (for example ``exp`` of a huge log-ratio)."""
