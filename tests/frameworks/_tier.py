"""Which frameworks of the tier are installed (read by ``conftest.py`` and ``test_tier.py``)."""

from __future__ import annotations

from pytest_polgrad.frameworks import PINS
from pytest_polgrad.frameworks._adapt import installed_version

MISSING = [fw for fw in PINS if installed_version(fw) is None]
"""Pinned frameworks not installed here, in ``PINS`` order."""
