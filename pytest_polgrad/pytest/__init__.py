"""The pytest side: collection of marked functions, golden items, fixtures, notes."""
