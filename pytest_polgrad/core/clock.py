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
from types import TracebackType

__all__ = ["charged", "spent"]

_SPENT = [0.0]


class _Charge:
    """The context :func:`charged` returns: a plain ``__enter__``/``__exit__`` pair (a
    generator-based context manager cost about 1 us per call, some 2% of a passing run's
    time, which has tens of thousands of calls)."""

    __slots__ = ("_depth", "_start")

    def __init__(self) -> None:
        self._depth = 0
        self._start = 0.0

    def __enter__(self) -> None:
        if not self._depth:
            self._start = time.perf_counter()
        self._depth += 1

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._depth -= 1
        if not self._depth:
            _SPENT[0] += time.perf_counter() - self._start


_CHARGE = _Charge()


def spent() -> float:
    """Seconds charged to functions under test so far in this process (a running total:
    take differences)."""
    return _SPENT[0]


def charged() -> _Charge:
    """A context that charges the wall time of its block to the function under test (once,
    however deeply charges nest)."""
    return _CHARGE
