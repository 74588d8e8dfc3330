"""TRL 1.16.0 ``GRPOTrainer._compute_loss`` (loss types, IS level, KL) marked with the kit."""

from _marking import define_cases

define_cases("trl", globals())
