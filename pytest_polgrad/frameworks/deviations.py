"""The DEVIATIONS table (filled below)."""

from __future__ import annotations

import dataclasses

__all__ = ["DEVIATIONS", "Deviation"]


@dataclasses.dataclass(frozen=True)
class Deviation:
    """A demonstrated difference between a published equation and a shipped default."""

    framework: str
    version: str
    component: str
    description: str
    nodeid: str


DEVIATIONS: tuple[Deviation, ...] = ()
