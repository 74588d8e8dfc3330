"""The function's own time, apart from the kit's (issue 32).

Where the kit calls the function under test (:func:`pytest_polgrad.core.calls.guarded_call`,
and the backward through the loss it returned, :meth:`FunctionUnderTest.call`), the time
inside is *charged* to the function; the engine reads :func:`spent` before and after a
check, so a result says how long the check took (``seconds``) and how much of it the
function's own calls took (``function_seconds``); the rest, ``seconds -
function_seconds``, is the kit's: drawing the pool, the reference, the comparisons, the
search, shrinking, diagnosis and report. A charge inside another charge (a function
the kit calls from inside the function's call) counts once. Torch-free: the plugin loads
without torch.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["charged", "spent"]

_SPENT = [0.0]
_DEPTH = [0]


def spent() -> float:
    """Seconds charged to functions under test so far in this process (a running total:
    take differences)."""
    return _SPENT[0]


@contextmanager
def charged() -> Iterator[None]:
    """Charge the wall time of the block to the function under test (once, however deeply
    charges nest)."""
    if _DEPTH[0]:
        yield
        return
    _DEPTH[0] += 1
    start = time.perf_counter()
    try:
        yield
    finally:
        _SPENT[0] += time.perf_counter() - start
        _DEPTH[0] -= 1
