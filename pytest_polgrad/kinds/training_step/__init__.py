"""The training-step kind: micro-batch, accumulation and data-parallel scaling."""
