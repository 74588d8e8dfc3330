"""What a fresh interpreter holds in ``sys.modules`` after importing a module of the
kit: one interpreter answers for every module of :data:`ORDER` (one ``import torch``
instead of one per test), importing them in that order.

Importing ``a.b`` imports its package ``a`` first, so after ``import a`` and then
``import a.b`` the interpreter holds exactly what a fresh ``import a.b`` leaves: each
answer is that of a fresh interpreter, as long as every module of :data:`ORDER` is a
submodule of the ones before it (checked at import).
"""

from __future__ import annotations

import functools
import itertools
import json
import subprocess
import sys

__all__ = ["ORDER", "loaded_after"]

ORDER = ("polgrad_reference", "polgrad_reference.diagnostics")
"""Each a submodule of the one before it."""

assert all(b.startswith(a + ".") for a, b in itertools.pairwise(ORDER)), ORDER

_CODE = """
import importlib, json, sys
out = {}
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
    out[name] = sorted(sys.modules)
print(json.dumps(out))
"""


@functools.cache
def _answers() -> dict[str, frozenset[str]]:
    out = subprocess.run(
        [sys.executable, "-c", _CODE, json.dumps(ORDER)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return {name: frozenset(names) for name, names in json.loads(out.stdout).items()}


def loaded_after(module: str) -> frozenset[str]:
    """The names in ``sys.modules`` of a fresh interpreter after ``import module``."""
    if module not in ORDER:
        raise ValueError(f"module must be one of {ORDER}, got {module!r}")
    return _answers()[module]
