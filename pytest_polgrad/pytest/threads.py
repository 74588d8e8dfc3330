"""torch's intra-op threads in pytest-xdist workers (``--polgrad-torch-threads``).

torch starts an OpenMP pool as wide as the machine in every process. Under ``pytest -n
auto`` that is ``workers x cores`` threads on ``cores`` cores, and the small kernels a check
runs (indexing, reductions over a 64 x 384 batch) then cost milliseconds of thread
hand-offs instead of microseconds: on 2 cores with 2 workers, a training-step and
realistic-size test file ran 5x slower (104 s against 20 s). ``auto`` therefore gives each
xdist worker its share of the CPUs the process may run on, at the first polgrad item (so
loading the plugin still imports no torch), unless ``OMP_NUM_THREADS`` says otherwise or
the worker already uses fewer; outside xdist it changes nothing. An integer sets that
many threads in each process, at its first polgrad item; ``keep`` never touches torch.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["apply", "parse", "share"]


def parse(raw: object, where: str) -> str:
    """``"auto"`` (also for None: not given), ``"keep"`` or a number of threads from 1 to
    the CPUs this process may run on, as text; ``ValueError`` otherwise (torch crashes on
    an absurd count rather than refusing it)."""
    text = "auto" if raw is None else str(raw).strip()
    if text in ("auto", "keep"):
        return text
    cpus = _cpus()
    if text.isdigit() and 1 <= int(text) <= cpus:
        return text
    raise ValueError(
        f"{where} must be 'auto', 'keep' or a number of threads from 1 to {cpus} (the CPUs "
        f"this process may use), got {raw!r}"
    )


def _cpus() -> int:
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)


def share(config: Any) -> int | None:
    """The thread count ``auto`` asks for in this process (None: leave torch alone)."""
    workerinput = getattr(config, "workerinput", None)
    count = workerinput.get("workercount") if isinstance(workerinput, dict) else None
    if count is None:
        count = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if count is None or os.environ.get("OMP_NUM_THREADS"):
        return None
    return max(1, _cpus() // max(1, int(count)))


def apply(setting: str, config: Any) -> None:
    """Set torch's intra-op threads for ``setting`` (called once, at the first item)."""
    if setting == "keep":
        return
    wanted = share(config) if setting == "auto" else int(setting)
    if wanted is None:
        return
    import torch  # here, at the first item: the plugin itself loads without torch

    if setting != "auto" or torch.get_num_threads() > wanted:
        torch.set_num_threads(wanted)
