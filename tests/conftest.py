"""Test-suite settings: a Hypothesis profile without deadlines (CI machines are shared)."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile(
    "polgrad-dev",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("polgrad-dev")
