"""Diagnosis of a failing policy loss: which registered semantics it computes."""
