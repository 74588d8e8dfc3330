"""The logprobs kind: where the logprobs every loss takes come from (see :mod:`.kind`)."""
