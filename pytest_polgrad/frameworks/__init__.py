"""Adapters that call the released verl, TRL and OpenRLHF loss code in the kit's conventions.

One module per framework (:mod:`.verl`, :mod:`.trl`, :mod:`.openrlhf`); each imports its
framework on first use only, so this package imports without any framework installed.
:data:`PINS` names the releases (version, wheel sha256), :data:`DEVIATIONS` the
demonstrated differences between published equations and shipped defaults, and
:data:`CASES` the adapter configurations with the reference config each one equals (the
default suite checks those claims against the recorded outputs in
``snapshots/frameworks/``). Nothing outside this package imports a framework.

The "call it yourself" helpers are public: :mod:`.verl` (``policy_loss``,
``training_step``, ``kl_penalty``, ``compute_advantage``, ``value_loss``, ``entropy``,
``agg_loss``, ``actor_config``), :mod:`.trl` (``grpo_loss``, with ``beta`` its KL term,
``training_step``, ``entropy``, ``grpo_config``) and :mod:`.openrlhf` (``policy_loss``,
``approx_kl``, ``value_loss``, ``entropy``, ``aggregate_loss``, ``load``); each returns
or is a function of the kit's keyword tensors (docs/frameworks.md, "Call it yourself").
"""

from __future__ import annotations

from pytest_polgrad.frameworks import openrlhf, trl, verl
from pytest_polgrad.frameworks._pins import PINS, Pin
from pytest_polgrad.frameworks.deviations import DEVIATIONS, Deviation

__all__ = ["DEVIATIONS", "PINS", "Deviation", "Pin", "openrlhf", "trl", "verl"]
