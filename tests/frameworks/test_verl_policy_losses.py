"""verl 0.9.1 policy losses (``core_algos.get_policy_loss_fn``) marked with the kit."""

from _marking import define_cases

define_cases("verl", globals())
