"""OpenRLHF 0.11.2 ``PolicyLoss`` marked with the kit."""

from _marking import define_cases

define_cases("openrlhf", globals())
