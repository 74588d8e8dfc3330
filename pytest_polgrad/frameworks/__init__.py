"""Adapters that call the released verl, TRL and OpenRLHF loss code in the kit's conventions.

One module per framework (:mod:`.verl`, :mod:`.trl`, :mod:`.openrlhf`); each imports its
framework on first use only, so this package imports without any framework installed.
:data:`PINS` names the releases (version, wheel sha256), :data:`DEVIATIONS` the
demonstrated differences between published equations and shipped defaults, and
:data:`CASES` the adapter configurations with the reference config each one equals (the
default suite checks those claims against the recorded outputs in
``snapshots/frameworks/``). Nothing outside this package imports a framework.
"""

from __future__ import annotations

from pytest_polgrad.frameworks._pins import PINS, Pin
from pytest_polgrad.frameworks.deviations import DEVIATIONS, Deviation

__all__ = ["DEVIATIONS", "PINS", "Deviation", "Pin"]
