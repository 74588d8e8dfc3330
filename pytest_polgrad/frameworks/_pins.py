"""The pinned framework releases the adapters were written against, with provenance.

``sha256`` is the digest of the exact wheel the framework tier installs (pip verifies it:
``pytest_polgrad/frameworks/requirements.txt`` uses ``--hash``); the recorded outputs in
``snapshots/frameworks/`` carry the same version and digest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["PINS", "Pin"]


@dataclasses.dataclass(frozen=True)
class Pin:
    """One framework release: distribution name, version, wheel file and its sha256."""

    framework: str
    distribution: str
    version: str
    wheel: str
    sha256: str


PINS: Mapping[str, Pin] = MappingProxyType(
    {
        "verl": Pin(
            "verl",
            "verl",
            "0.9.1",
            "verl-0.9.1-py3-none-any.whl",
            "db6e6f2a8d9d5808d9ec32d357a42319fdc6967df688ff9d9810050f49bfdd14",
        ),
        "trl": Pin(
            "trl",
            "trl",
            "1.16.0",
            "trl-1.16.0-py3-none-any.whl",
            "c4726e139dd40e1a41661511c639c8a68416782b2e3e8c0befebd77bb7ba0396",
        ),
        "openrlhf": Pin(
            "openrlhf",
            "openrlhf",
            "0.11.2",
            "openrlhf-0.11.2-cp311-cp311-manylinux1_x86_64.whl",
            "c969d70db03a70724c3d8a5a01186c6e0728bce624fb3dff95e39b5396acefa6",
        ),
    }
)
"""Framework name -> its pinned release."""
