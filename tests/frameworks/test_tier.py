"""The frameworks tier runs on the pinned releases (and says so when it cannot run)."""

from __future__ import annotations

import pytest
from _tier import MISSING

from pytest_polgrad.frameworks import PINS
from pytest_polgrad.frameworks._adapt import installed_version


def test_frameworks_tier_environment() -> None:
    if MISSING:
        pytest.skip(
            f"frameworks tier not collected: {', '.join(MISSING)} not installed "
            "(`make frameworks` builds .venv-frameworks and runs it)"
        )
    versions = {fw: installed_version(fw) for fw in PINS}
    assert versions == {fw: pin.version for fw, pin in PINS.items()}, (
        f"installed {versions}; the adapters and recordings are for the pins in "
        "pytest_polgrad/frameworks/_pins.py (use the drift command for newer releases)"
    )
