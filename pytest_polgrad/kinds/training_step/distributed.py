"""The training step on a real process group: one process per rank, DDP or FSDP2.

The simulated check (:func:`pytest_polgrad.kinds.training_step.kind.accumulate`) sums each
rank's micro-batch gradients and averages the sums over ranks, as an all-reduce MEAN
does. This module runs the same step on a real ``torch.distributed`` process group (gloo
on the CPU, NCCL with one GPU per rank) and lets the framework do the accumulation and the
averaging:

* every rank holds a :class:`TokenModel`, whose one parameter ``theta`` ``[B, T]``
  (float64 zeros) has an entry per token of the WHOLE step; a micro-batch's logprobs are
  ``given_logprobs + theta[rows, :width]`` (in the given dtype), so the function under
  test sees exactly the simulated check's tensors and ``d loss / d theta`` is the
  per-token gradient ``d loss / d logprobs``;
* ``wrap="ddp"``: ``DistributedDataParallel`` with ``no_sync()`` on every micro-batch but
  the last of the accumulation; ``wrap="fsdp"``: FSDP2 ``fully_shard`` (``theta`` sharded
  along its rows) with ``set_requires_gradient_sync(False)`` but on the last micro-batch,
  the gradient gathered with ``full_tensor()``;
* after the step ``theta.grad = (1/W) sum_r sum_k d loss_{r,k} / d logprobs`` (``W``
  ranks, micro-batches ``k``): DDP all-reduces the accumulated gradients and divides them
  by the world size, FSDP2 reduce-scatters them with an average (torch 2.13
  ``DistributedDataParallel`` and ``fully_shard`` documentation), the quantity the
  simulated check computes; the loss is ``(1/W) sum_r sum_k loss_{r,k}``, summed in the
  simulated check's order.

:func:`accumulate_distributed` takes the simulated check's inputs (its context and step)
and returns a :class:`DistributedStep` with the fields of its result (``loss``, ``grad``,
``changed``). A step that calls ``torch.distributed.all_reduce`` itself runs as written:
the default process group is the step's.

Processes. Each rank is a process in a session of its own, with the parent's
``sys.path``, fed through a socket pair. On the CPU it is forked by the zygote: one
interpreter per parent process (``python -c``) that imported torch, and what DDP and FSDP2
import on their first use (``torch._dynamo``: seconds), once, and forks a rank per request
while it runs a single thread; so a pool starts in milliseconds after the first, also
when it replaces a killed one. With NCCL, or when the zygote cannot start or fork, a rank
is a fresh interpreter (``python -c``) importing all of that itself. Not
multiprocessing's ``fork`` (the parent's torch already runs threads), nor ``spawn`` (it
re-runs the parent's ``__main__`` in every rank and fails for a script without a
``__main__`` guard even when the step lives elsewhere), nor ``forkserver`` (its server
is not stopped with the pools and ranks; the zygote is, by :func:`shutdown`). Ranks
rendezvous through a ``file://`` store in a temporary directory (no port is bound for it;
gloo's pair sockets close with the processes). A pool of ranks per world size stays up
for the next call and is killed, session and all, after any failure, timeout or
``KeyboardInterrupt``; :func:`shutdown`, registered with :mod:`atexit`, stops every pool,
removes its directory and stops the zygote. Ranks and the zygote ignore SIGINT (the
parent kills them) and end themselves when their stdin, a pipe from the parent, closes
(the parent died). The function under test is sent by reference
(``module.qualname``, as :mod:`pickle` does), so it must be importable at module level;
a module pytest imported from a file not on ``sys.path`` is loaded from that file, and a
script's ``__main__`` is run as ``__mp_main__`` (its guarded block does not run).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import datetime
import faulthandler
import importlib.util
import inspect
import json
import math
import os
import pickle
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from multiprocessing import connection as mp_connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel

from polgrad_reference.errors import ConfigError, InputError, InputTypeError
from pytest_polgrad.kinds._returned import scalar_result
from pytest_polgrad.kinds.training_step._text import empty_hint

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from pytest_polgrad.strategies._splits import Split

__all__ = [
    "DEFAULT_TIMEOUT",
    "START_TIMEOUT",
    "WRAPS",
    "DistributedError",
    "DistributedStep",
    "LaunchError",
    "PoolState",
    "RankDied",
    "RankFailed",
    "RankTimeout",
    "TokenModel",
    "accumulate_distributed",
    "pools",
    "run_step",
    "shutdown",
]

WRAPS = ("ddp", "fsdp")
"""``ddp``: ``torch.nn.parallel.DistributedDataParallel``; ``fsdp``: FSDP2 ``fully_shard``."""
DEFAULT_TIMEOUT = 60.0
"""Seconds a call may run once every rank has loaded the function."""
START_TIMEOUT = 300.0
"""Seconds for the zygote to start and for a pool to start (torch's import, in every rank
without a zygote), and for every rank of a call to load the function's module (the test
module's imports) and wrap the model (FSDP's import on its first use, without a zygote)."""
MAX_POOLS = 2
"""Pools kept up at once (the least recently used one is stopped for a third)."""
_GRACE = 0.5
"""Seconds to wait, after a rank reported a failure, for the other ranks' reports."""
_INFO_FIELDS = (
    "rank", "world_size", "micro_batch", "gradient_accumulation_steps",
    "steps_per_generation", "rows", "micro_batch_tokens", "micro_batch_rows", "rank_tokens",
    "rank_rows", "global_tokens", "global_rows", "generation_tokens", "generation_rows",
)  # fmt: skip
_HERE = str(Path(__file__).resolve())
_TORCH_DIR = str(Path(torch.__file__).resolve().parent)


# ----------------------------------------------------------------------------- results


@dataclasses.dataclass(frozen=True)
class DistributedStep:
    """One optimizer step on a real process group, as the reducer left it.

    ``loss``: ``(1/W) sum_r sum_k loss_{r,k}`` (NaN when the function ran ``backward()``
    itself and returned None); ``grad``: ``theta.grad`` after the reduction, float64
    ``[B, T]`` (``d loss / d logprobs`` per token of the step); ``changed``:
    ``"rank r micro-batch k: name"`` for every input the function wrote in place (only
    with ``snapshot=True``). The fields of the simulated check's ``Accumulated``, plus how
    the step ran.
    """

    loss: float
    grad: torch.Tensor
    changed: tuple[str, ...] = ()
    wrap: str = "ddp"
    world_size: int = 1
    backend: str = "gloo"


class DistributedError(AssertionError):
    """The function under test failed on a rank: it raised, returned something that is not
    a loss, hung or ended its process. ``rank`` names the rank at fault (None when no rank
    can be singled out). An ``AssertionError``, like the kit's ``Verdict``: a finding about
    the function, not a fault of the kit."""

    def __init__(self, message: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


class RankFailed(DistributedError):
    """The function raised, or returned something no check can compare, on ``rank``."""


class RankTimeout(DistributedError):
    """A rank did not finish within the timeout; every rank was killed."""


class RankDied(DistributedError):
    """A rank's process ended during the call (``os._exit``, a signal, a crash)."""


class LaunchError(RuntimeError):
    """The process group could not be started (the environment, not the function)."""


@dataclasses.dataclass(frozen=True)
class PoolState:
    """A live pool of rank processes: its key, the ranks' process ids, its directory."""

    world_size: int
    backend: str
    device: str
    pids: tuple[int, ...]
    directory: str


# --------------------------------------------------------------------------- the model


class TokenModel(torch.nn.Module):
    """``logprobs[b, t] = given[b, t] + theta[rows[b], t]``: one float64 parameter per token
    of the whole step (zeros), so ``theta.grad`` is ``d loss / d logprobs`` per token."""

    def __init__(self, rows: int, width: int, device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.theta = torch.nn.Parameter(
            torch.zeros(rows, width, dtype=torch.float64, device=device)
        )

    def forward(self, rows: torch.Tensor, width: int, given: torch.Tensor) -> torch.Tensor:
        """The micro-batch's logprobs (``given``'s dtype; ``given + 0`` is ``given``)."""
        return given + self.theta[rows, :width].to(given.dtype)


# --------------------------------------------------------------------------- public API


def accumulate_distributed(
    ctx: Any,
    inputs: Mapping[str, Any],
    *,
    wrap: str,
    snapshot: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
) -> DistributedStep:
    """The distributed twin of the simulated check's ``accumulate(ctx, inputs)``.

    ``ctx`` supplies ``fn``, ``takes`` and ``options.loss`` / ``options.device``;
    ``inputs`` the step's tensors and its ``split``. The result has the fields the checks
    read (``loss``, ``grad``, ``changed``)."""
    split = inputs["split"]
    batch = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    options = ctx.options
    return run_step(
        ctx.fn,
        batch,
        split,
        wrap=wrap,
        takes=ctx.takes,
        loss=getattr(options, "loss", None),
        device=getattr(options, "device", "cpu"),
        timeout=timeout,
        snapshot=snapshot,
    )


def run_step(
    fn: Callable[..., Any],
    batch: Mapping[str, torch.Tensor],
    split: Split,
    *,
    wrap: str = "ddp",
    takes: frozenset[str] | set[str] | None = None,
    loss: str | int | None = None,
    device: str = "cpu",
    timeout: float = DEFAULT_TIMEOUT,
    snapshot: bool = False,
    through: str = "logprobs",
) -> DistributedStep:
    """Run ``fn`` on every micro-batch of ``split`` on ``split.world_size`` real ranks.

    ``batch``: the step's ``[B, T]`` / ``[B]`` tensors by name (``logprobs`` and a bool
    ``response_mask`` among them); each micro-batch gets its rows, trimmed to its longest
    response, of every tensor ``fn`` takes, plus the :class:`StepInfo` fields it names
    (``step``: the whole StepInfo). ``takes``: the names ``fn`` accepts (default: its
    parameters). ``loss``: the key or index of the loss when ``fn`` returns a dict or a
    tuple. ``device``: ``"cpu"`` (gloo) or ``"cuda"`` (NCCL, one GPU per rank).
    ``timeout``: seconds for the step once every rank has loaded ``fn``. ``through``: the
    input the model's parameter is added to, whose gradient comes back (``"values"`` for a
    critic's step).

    Raises :class:`RankFailed`, :class:`RankTimeout` or :class:`RankDied` (naming the rank)
    for a fault of the function, :class:`LaunchError` when the ranks cannot start.
    """
    if wrap not in WRAPS:
        raise ConfigError(f"wrap must be one of {list(WRAPS)}, got {wrap!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ConfigError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if not isinstance(snapshot, bool):
        raise ConfigError(f"snapshot must be a bool, got {snapshot!r}")
    # Not at the module top: the strategies import hypothesis (seconds), which the rank
    # processes, importing this module, do not need.
    from pytest_polgrad.strategies._splits import Split

    if not isinstance(split, Split):
        raise InputTypeError(f"split must be a pytest_polgrad.strategies.Split, got {split!r}")
    backend, dev = _backend(device, split.world_size)
    mask = _check_batch(batch, split)
    names = frozenset(_parameters(fn) if takes is None else takes)
    if not isinstance(through, str):
        raise ConfigError(f"through must be an input's name, got {through!r}")
    if through not in names:
        raise InputError(f"fn {_name(fn)} takes no {through!r}; the distributed step feeds it one")
    if through not in batch:
        raise InputError(f"batch has no {through!r} tensor")
    payload, files = _reference(fn)
    jobs = _jobs(batch, mask, split, names, wrap, loss, snapshot, payload, files, through)
    pool = _pool(split.world_size, backend, dev)
    replies = pool.call(jobs, float(timeout), what=f"the step of {_name(fn)}")
    world = split.world_size
    total = 0.0
    changed: list[str] = []
    for r in range(world):
        values, _grad, rank_changed = replies[r]
        for v in values:  # the simulated check's order: rank by rank, micro-batch by micro-batch
            total += (math.nan if v is None else v) / world
        changed += rank_changed
    grad = replies[0][1]
    assert isinstance(grad, torch.Tensor)
    return DistributedStep(total, grad, tuple(changed), wrap, world, backend)


def pools() -> list[PoolState]:
    """The pools of rank processes alive in this process."""
    with _LOCK:
        return [p.state() for p in _POOLS.values()]


def shutdown(*, zygote: bool = True) -> None:
    """Stop every pool this process started (not a forked child's inherited copies): ranks
    asked to leave, then killed; directories removed; then the zygote that forked them
    (``zygote=False``: kept, idle, so that the next pool starts in milliseconds; it still
    ends with this process)."""
    with _LOCK:
        live = list(_POOLS.values())
        _POOLS.clear()
    for pool in live:
        if pool.owner == os.getpid():
            pool.stop()
    global _ZYGOTE
    with _LOCK:
        forker, _ZYGOTE = (_ZYGOTE, None) if zygote else (None, _ZYGOTE)
    if forker is not None and forker.owner == os.getpid():
        forker.kill()


# --------------------------------------------------------------------- parent: checks


def _name(fn: Callable[..., Any]) -> str:
    inner = getattr(fn, "func", fn)
    return f"{getattr(inner, '__module__', '?')}.{getattr(inner, '__qualname__', repr(inner))}"


def _parameters(fn: Callable[..., Any]) -> set[str]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError) as exc:
        raise InputTypeError(f"fn {fn!r} has no readable signature; pass takes=") from exc
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def _backend(device: str, world: int) -> tuple[str, str]:
    if device == "cpu":
        if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
            raise LaunchError("this torch build has no gloo backend for a CPU process group")
        return "gloo", "cpu"
    if device == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count < world:
            raise ConfigError(
                f"device='cuda' runs one rank per GPU (NCCL); world_size={world} needs {world} "
                f"GPUs, this machine has {count}"
            )
        return "nccl", "cuda"
    raise ConfigError(f"device must be 'cpu' or 'cuda' for the distributed step, got {device!r}")


def _check_batch(batch: Mapping[str, torch.Tensor], split: Split) -> torch.Tensor:
    mask = batch.get("response_mask")
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 2:
        raise InputError("batch['response_mask'] must be a bool [B, T] tensor")
    b = mask.shape[0]
    if b != split.batch_size:
        raise InputError(f"split covers {split.batch_size} rows but batch['response_mask'] has {b}")
    for name, t in batch.items():
        if not isinstance(t, torch.Tensor) or t.dim() not in (1, 2) or t.shape[0] != b:
            raise InputError(f"batch[{name!r}] must be a [B] or [B, T] tensor with B = {b}")
    return mask


def _reference(fn: Callable[..., Any]) -> tuple[bytes, dict[str, str]]:
    """``fn`` pickled by reference, and the files of the modules it names (for a rank that
    cannot import them by name)."""
    try:
        payload = pickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise InputTypeError(
            f"fn {_name(fn)} cannot be sent to the rank processes: the distributed step needs "
            f"a module-level function importable by name (not a lambda, a local function or "
            f"a closure); {type(exc).__name__}: {exc}"
        ) from exc
    files: dict[str, str] = {}
    for obj in (fn, getattr(fn, "func", None)):
        module = sys.modules.get(getattr(obj, "__module__", None) or "")
        path = getattr(module, "__file__", None)
        if module is not None and path:
            files[module.__name__] = str(Path(path).resolve())
    return payload, files


@dataclasses.dataclass(frozen=True)
class _MicroBatch:
    rows: tuple[int, ...]
    width: int
    tensors: dict[str, torch.Tensor]
    info: dict[str, Any]
    step: Any
    counts: tuple[int, int] = (1, 1)
    """The micro-batch's and its rank's response tokens (for the empty micro-batch hint)."""


@dataclasses.dataclass(frozen=True)
class _Job:
    fn: bytes
    files: dict[str, str]
    wrap: str
    shape: tuple[int, int]
    micro_batches: tuple[_MicroBatch, ...]
    loss: str | int | None
    snapshot: bool
    through: str = "logprobs"
    """The input the model's parameter is added to (its gradient is the one returned)."""


def _jobs(
    batch: Mapping[str, torch.Tensor],
    mask: torch.Tensor,
    split: Split,
    names: frozenset[str],
    wrap: str,
    loss: str | int | None,
    snapshot: bool,
    payload: bytes,
    files: dict[str, str],
    through: str = "logprobs",
) -> list[bytes]:
    """One pickled job per rank: its micro-batches, sliced as the simulated check does."""
    cols = torch.arange(mask.shape[1])
    extent = torch.where(mask, cols + 1, 0)
    out = []
    for rank in split.infos(mask):
        mbs = []
        for info in rank:
            index = torch.tensor(info.rows, dtype=torch.long)
            width = int(extent[index].max()) if info.rows else 0  # an empty micro-batch: [0, 0]
            tensors = {
                n: (t[index][:, :width] if t.dim() == 2 else t[index]).detach().clone()
                for n, t in batch.items()
                if n in names
            }
            fields = {f: getattr(info, f) for f in _INFO_FIELDS if f in names}
            step = info if "step" in names else None
            mbs.append(_MicroBatch(tuple(info.rows), width, tensors, fields, step,
                                   (info.micro_batch_tokens, info.rank_tokens)))  # fmt: skip
        job = _Job(payload, files, wrap, (mask.shape[0], mask.shape[1]), tuple(mbs), loss,
                   snapshot, through)  # fmt: skip
        out.append(pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL))
    return out


# ---------------------------------------------------------------------- parent: pools

_LOCK = threading.RLock()
_POOLS: collections.OrderedDict[tuple[int, str, str], _Pool] = collections.OrderedDict()
_REGISTERED = False


def _pool(world: int, backend: str, device: str) -> _Pool:
    global _REGISTERED
    key = (world, backend, device)
    with _LOCK:
        pool = _POOLS.get(key)
        if pool is not None and pool.alive():
            _POOLS.move_to_end(key)
            return pool
        if pool is not None:
            _POOLS.pop(key).kill()
        while len(_POOLS) >= MAX_POOLS:
            _POOLS.popitem(last=False)[1].stop()
        if not _REGISTERED:
            atexit.register(shutdown)  # the pools, then the zygote
            _REGISTERED = True
        pool = _Pool(world, backend, device)
        pool.start(START_TIMEOUT)
        _POOLS[key] = pool
        return pool


def _forget(pool: _Pool) -> None:
    with _LOCK:
        for key, p in list(_POOLS.items()):
            if p is pool:
                del _POOLS[key]


# --------------------------------------------------------------------- parent: zygote

_ZYGOTE: _Zygote | None = None
_FORK = True
"""Whether ranks are forked by a zygote (False: a ``python -c`` per rank, as after a
zygote could not start or fork in this process)."""


def _zygote(limit: float) -> _Zygote | None:
    """This process's live zygote (started if needed), or None when none can fork."""
    global _ZYGOTE
    with _LOCK:
        if not _FORK:
            return None
        if _ZYGOTE is not None and (_ZYGOTE.owner != os.getpid() or not _ZYGOTE.alive()):
            if _ZYGOTE.owner == os.getpid():
                _ZYGOTE.kill()
            _ZYGOTE = None
        if _ZYGOTE is None:
            zygote = _Zygote()
            if not zygote.start(limit):
                _no_fork()
                return None
            _ZYGOTE = zygote
        return _ZYGOTE


def _no_fork() -> None:
    """Start ranks as interpreters of their own from now on (no zygote is tried again)."""
    global _FORK
    _FORK = False


class _Zygote:
    """One interpreter that imported torch and this module once, forking the ranks.

    A rank's start is then a ``fork`` (milliseconds) instead of an interpreter importing
    torch (seconds, in every rank of every pool, again after a pool is killed). The
    zygote is ``python -c`` running :func:`_zygote_entry` in a session of its own, with
    ``OMP_NUM_THREADS=1`` (torch's import then starts no thread: a fork copies only the
    forking thread, so the zygote forks only while it runs one), stdin a pipe from this
    process (it ends when the pipe closes) and a ``SOCK_SEQPACKET`` socket pair: this
    process sends ``("fork", args, sys.path, cwd, environ)`` with the rank's end of its
    job channel (``SCM_RIGHTS``); the zygote forks the rank and answers ``("pid", pid)``,
    or ``("nofork", threads)``; it reaps its ranks and sends ``("exit", pid, code)``
    (``code`` as ``Popen.returncode``). The ranks are its children, not this process's."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.sock: socket.socket | None = None
        self.exits: dict[int, int] = {}
        self.lock = threading.Lock()
        self.owner = os.getpid()

    def alive(self) -> bool:
        return self.sock is not None and self.proc is not None and self.proc.poll() is None

    def start(self, limit: float) -> bool:
        """Start the zygote; False (and nothing left running) when it cannot fork."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        code = (
            "import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
            f"from {__name__} import _zygote_entry; _zygote_entry(sys.argv[2:])"
        )
        args = [sys.executable, "-c", code, json.dumps(sys.path), str(theirs.fileno())]
        try:
            self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, pass_fds=(theirs.fileno(),),
                                         start_new_session=True, env=env)  # fmt: skip
        except OSError:
            mine.close()
            return False
        finally:
            theirs.close()
        self.sock = mine
        msg = self._next(limit)
        if msg is None or msg[0] != "ready" or msg[1] != 1:
            self.kill()
            return False
        return True

    def fork(
        self, args: list[str], fd: int, env: Mapping[str, str], limit: float
    ) -> _Forked | None:
        """A rank forked with ``args`` (``_rank_entry``'s, less the channel) and ``fd``
        (its job channel); None when the zygote cannot fork (it is then stopped)."""
        request = pickle.dumps(("fork", args, list(sys.path), os.getcwd(), dict(env)))
        with self.lock:
            try:
                assert self.sock is not None
                socket.send_fds(self.sock, [request], [fd])
            except OSError:
                reply = None
            else:
                reply = self._next(limit, want="pid")
        if reply is None or reply[0] != "pid":
            self.kill()
            _no_fork()
            return None
        return _Forked(int(reply[1]), self)

    def _next(self, limit: float, want: str = "") -> tuple[Any, ...] | None:
        """The next message other than an exit (exits are recorded) within ``limit`` s;
        None when the zygote is gone or silent. ``want="exit"``: return after any exit."""
        deadline = time.monotonic() + limit
        while self.sock is not None:
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select([self.sock], [], [], max(remaining, 0.0))
            if not ready:
                return None
            try:
                data = self.sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:  # the zygote ended
                self.sock.close()
                self.sock = None
                return None
            msg = pickle.loads(data)
            if msg[0] == "exit":
                self.exits[int(msg[1])] = int(msg[2])
                if want == "exit":
                    return msg  # type: ignore[no-any-return]
                continue
            return msg  # type: ignore[no-any-return]
        return None

    def exit_code(self, pid: int, timeout: float) -> int | None:
        """``pid``'s exit code once the zygote reaped it (within ``timeout`` s), else None.
        With the zygote gone, a rank that no longer runs counts as killed."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                if pid in self.exits:
                    return self.exits[pid]
                if self.sock is None:
                    return None if _running(pid) else -signal.SIGKILL
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._next(remaining, want="exit") is None:
                    if pid in self.exits:
                        return self.exits[pid]
                    if self.sock is None:
                        continue
                    return None

    def kill(self) -> None:
        """SIGKILL the zygote's session and reap it (its ranks are killed by their pools)."""
        if self.proc is not None:
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5.0)
            if self.proc.stdin is not None:
                with contextlib.suppress(OSError):
                    self.proc.stdin.close()
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def _running(pid: int) -> bool:
    """``pid`` exists and is not a zombie (``/proc``; without it, whether it exists)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[:1] != ["Z"]
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


class _Forked:
    """A rank the zygote forked, as a pool uses a ``Popen``: ``pid``, ``poll``, ``wait``."""

    stdin = None

    def __init__(self, pid: int, zygote: _Zygote) -> None:
        self.pid = pid
        self.zygote = zygote
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.exit_code(self.pid, 0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.zygote.exit_code(self.pid, 1e9 if timeout is None else timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(f"rank {self.pid}", timeout or 0.0)
        return self.returncode


class _Pool:
    """``world`` rank processes in one process group, fed one job at a time.

    Each rank runs :func:`_rank_entry` in a session of its own (so a kill reaches whatever
    it started too), with the parent's ``sys.path``, environment and working directory, one
    end of a socket pair (the job channel), and on stdin a pipe whose end tells it the
    parent is gone. On the CPU it is forked by the :class:`_Zygote` (torch already
    imported); with NCCL, or when no zygote can fork, it is a ``python -c`` of its own."""

    def __init__(self, world: int, backend: str, device: str) -> None:
        self.world, self.backend, self.device = world, backend, device
        self.procs: list[subprocess.Popen[bytes] | _Forked] = []
        self.conns: list[Connection] = []
        self.threads: list[int] = []
        self.directory = ""
        self.lock = threading.Lock()
        self.owner = os.getpid()

    def state(self) -> PoolState:
        pids = tuple(p.pid for p in self.procs)
        return PoolState(self.world, self.backend, self.device, pids, self.directory)

    def alive(self) -> bool:
        return bool(self.procs) and all(p.poll() is None for p in self.procs)

    def _stack_file(self, rank: int) -> str:
        return os.path.join(self.directory, f"stack-{rank}")

    def start(self, limit: float) -> None:
        self.directory = tempfile.mkdtemp(prefix="polgrad-dist-")
        store = os.path.join(self.directory, "store")
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")  # tiny tensors: no thread pool per rank
        code = (
            "import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
            f"from {__name__} import _rank_entry; _rank_entry(sys.argv[2:])"
        )
        try:
            # NCCL ranks are interpreters of their own: a forked process must not inherit
            # an initialised CUDA driver, which the zygote's imports do not rule out.
            zygote = _zygote(limit) if self.device == "cpu" else None
            for r in range(self.world):
                parent, child = mp_connection.Pipe()  # a socket pair
                fd = child.fileno()
                rank_args = [str(r), str(self.world), self.backend, self.device, store,
                             self._stack_file(r)]  # fmt: skip
                proc: subprocess.Popen[bytes] | _Forked | None = None
                try:
                    if zygote is not None:
                        proc = zygote.fork(rank_args, fd, env, limit)
                    if proc is None:
                        args = [sys.executable, "-c", code, json.dumps(sys.path), *rank_args,
                                str(fd)]  # fmt: skip
                        proc = subprocess.Popen(args, stdin=subprocess.PIPE, pass_fds=(fd,),
                                                start_new_session=True, env=env)  # fmt: skip
                finally:
                    child.close()
                self.procs.append(proc)
                self.conns.append(parent)
            self.threads = [0] * self.world
            deadline = time.monotonic() + limit
            waiting = set(range(self.world))
            while waiting:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise LaunchError(
                        f"ranks {sorted(waiting)} of a {self.world}-rank {self.backend} process "
                        f"group did not start within {limit:g} s"
                    )
                for r, msg in self._receive(waiting, remaining):
                    if msg[0] == "up":
                        self.threads[r] = int(msg[2])
                        waiting.discard(r)
                    elif msg[0] == "died":
                        raise LaunchError(f"rank {r} ended while starting (exit code {msg[1]})")
                    elif msg[0] == "fail":
                        raise LaunchError(
                            f"rank {r} could not join the {self.backend} process group: {msg[2]}"
                        )
        except BaseException:
            self.kill()
            raise

    def _receive(self, ranks: set[int], limit: float) -> list[tuple[int, tuple[Any, ...]]]:
        """Messages of ``ranks`` that arrive within ``limit`` s; ``("died", exit code)``
        when a rank's channel closed (its process ended)."""
        conns = {self.conns[r]: r for r in ranks}
        out: list[tuple[int, tuple[Any, ...]]] = []
        for conn in mp_connection.wait(list(conns), timeout=max(limit, 0.0)):
            assert isinstance(conn, mp_connection.Connection)
            r = conns[conn]
            try:
                while conn.poll():
                    out.append((r, pickle.loads(conn.recv_bytes())))
            except (EOFError, OSError):
                code: int | None = None
                with contextlib.suppress(subprocess.TimeoutExpired):
                    code = self.procs[r].wait(2.0)
                out.append((r, ("died", code)))
        return out

    def call(self, jobs: Sequence[bytes], timeout: float, what: str) -> dict[int, Any]:
        """Send each rank its job; its ``(values, grad, changed)`` by rank. On any failure,
        timeout or interrupt every rank is killed and the pool forgotten."""
        with self.lock:
            try:
                return self._call(jobs, timeout, what)
            except BaseException:
                self.kill()
                _forget(self)
                raise

    def _call(self, jobs: Sequence[bytes], timeout: float, what: str) -> dict[int, Any]:
        for r, job in enumerate(jobs):
            try:
                self.conns[r].send_bytes(job)
            except OSError as exc:
                raise LaunchError(f"rank {r}'s process ended between two calls: {exc}") from exc
        pending = set(range(self.world))
        loaded: set[int] = set()
        at: dict[int, tuple[int, str]] = {}
        results: dict[int, Any] = {}
        failures: dict[int, DistributedError] = {}
        deadline = time.monotonic() + START_TIMEOUT
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for r, msg in self._receive(pending, remaining):
                tag = msg[0]
                if tag == "loaded":
                    loaded.add(r)
                    if len(loaded) == self.world:
                        deadline = time.monotonic() + timeout
                elif tag == "at":
                    at[r] = (int(msg[1]), str(msg[2]))
                elif tag == "ok" and r in pending:
                    results[r] = msg[1:]
                    pending.discard(r)
                elif tag in ("fail", "died") and r in pending:
                    pending.discard(r)
                    failures[r] = self._failure(r, msg, at.get(r, (-1, ""))[0])
                    deadline = min(deadline, time.monotonic() + _GRACE)
        if failures:
            raise _first(failures)
        if pending:
            if len(loaded) < self.world:
                ranks = sorted(set(range(self.world)) - loaded)
                raise RankTimeout(
                    f"rank(s) {ranks} did not load {what} (import its module) and wrap the "
                    f"model within {START_TIMEOUT:g} s; every rank was killed",
                    rank=ranks[0],
                )
            raise self._timeout(pending, at, self.stacks(pending), timeout, what)
        return results

    def _failure(self, r: int, msg: tuple[Any, ...], mb: int) -> DistributedError:
        if msg[0] == "died":
            code = msg[1]
            if isinstance(code, int) and code < 0:
                how = f"was killed by {signal.Signals(-code).name}"
            else:
                how = f"ended (exit code {code})"
            where = f" during micro-batch {mb}" if mb >= 0 else ""
            return RankDied(
                f"the process of rank {r} {how}{where}: os._exit, a crash or a signal in the "
                "function under test; every rank was killed",
                rank=r,
            )
        return RankFailed(str(msg[2]), rank=r)

    def stacks(self, ranks: set[int]) -> dict[int, str]:
        """The Python stacks of ``ranks`` (faulthandler's dump on SIGUSR1), by rank."""
        for r in ranks:
            with contextlib.suppress(OSError):
                os.kill(self.procs[r].pid, signal.SIGUSR1)
        out: dict[int, str] = {}
        end = time.monotonic() + 2.0
        for r in sorted(ranks):
            path, size = self._stack_file(r), -1
            while time.monotonic() < end:  # until the dump is there and has stopped growing
                time.sleep(0.05)
                now = os.path.getsize(path) if os.path.exists(path) else 0
                if now and now == size:
                    break
                size = now
            with contextlib.suppress(OSError), open(path, encoding="utf-8", errors="replace") as f:
                out[r] = f.read()
        return out

    def _timeout(
        self,
        pending: set[int],
        at: dict[int, tuple[int, str]],
        stacks: dict[int, str],
        timeout: float,
        what: str,
    ) -> RankTimeout:
        own: list[int] = []
        lines: list[str] = []
        for r in sorted(pending):
            k, phase = at.get(r, (-1, "setup"))
            frames = _frames(stacks.get(r, ""), self.threads[r])
            inner = _frame_text(frames[0]) if frames else "an unknown place (no stack came back)"
            in_torch = bool(frames) and frames[0][0].startswith(_TORCH_DIR)
            on = f" on micro-batch {k}" if k >= 0 else ""
            if phase == "function" and not in_torch:
                own.append(r)
                mine = _caller_of_kit(frames)
                place = inner if mine is None else _frame_text(mine)
                if mine is not None and mine != frames[0]:
                    place += f" (innermost: {inner})"
                lines.append(f"rank {r} was in the function{on} at {place}")
            elif phase == "function":
                lines.append(f"rank {r} waited in a collective the function called{on} ({inner})")
            elif phase == "backward":
                lines.append(f"rank {r} waited in the backward pass's gradient reduction{on}")
            else:
                lines.append(f"rank {r} waited while the model was wrapped ({inner})")
        if own:
            who = f"rank {own[0]}" if len(own) == 1 else f"ranks {own}"
            head = f"{who} hung: {what} did not finish within {timeout:g} s"
        else:
            head = (
                f"{what} did not finish within {timeout:g} s and no rank was in the function's "
                "own code: the ranks wait on each other (a collective that only some ranks "
                "call, or calls in a different order)"
            )
        culprit = own[0] if own else min(pending)
        return RankTimeout(f"{head}; {'; '.join(lines)}; every rank was killed", rank=culprit)

    def kill(self) -> None:
        """SIGKILL every rank's session, reap the processes, remove the directory."""
        for proc in self.procs:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            if isinstance(proc, _Forked) and proc.poll() is None:
                with contextlib.suppress(OSError):  # forked, not yet in a session of its own
                    os.kill(proc.pid, signal.SIGKILL)
        self._close()

    def stop(self) -> None:
        """Ask every rank to leave (None), give them 5 s, then :meth:`kill`."""
        for conn in self.conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send_bytes(pickle.dumps(None))
        end = time.monotonic() + 5.0
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(end - time.monotonic(), 0.0))
        self.kill()

    def _close(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5.0)
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.close()
        self.procs, self.conns = [], []
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)


def _first(failures: dict[int, DistributedError]) -> DistributedError:
    """The first cause: a rank that died before one whose collective broke because of it,
    then the lowest rank; the other failing ranks named after it."""
    ranks = sorted(failures, key=lambda r: (not isinstance(failures[r], RankDied), r))
    first = failures[ranks[0]]
    if len(ranks) == 1:
        return first
    text = f"{first} (ranks {ranks[1:]} failed too)"
    return type(first)(text, rank=first.rank)


_Frame = tuple[str, int, str]
_FRAME = re.compile(r'File "(.*)", line (\d+) in (.*)')


def _frames(stack: str, thread: int) -> list[_Frame]:
    """The frames ``(path, line, name)`` of thread ``thread`` in faulthandler's dump,
    innermost first (the only thread's when idents are missing)."""
    blocks: list[list[str]] = []
    for line in stack.splitlines():
        if "(most recent call first)" in line:
            blocks.append([line])
        elif blocks:
            blocks[-1].append(line)
    chosen: list[str] = []
    for block in blocks:
        found = re.search(r"[Tt]hread (0x[0-9a-fA-F]+)", block[0])
        if found and int(found.group(1), 16) == thread:
            chosen = block[1:]
    if not chosen and len(blocks) == 1:
        chosen = blocks[0][1:]
    out = []
    for line in chosen:
        m = _FRAME.search(line)
        if m:
            out.append((m.group(1), int(m.group(2)), m.group(3).strip()))
    return out


def _caller_of_kit(frames: list[_Frame]) -> _Frame | None:
    """The function's own frame: the one the kit's micro-step called."""
    for i, (path, _line, name) in enumerate(frames):
        if path == _HERE and name == "_micro_step" and i > 0:
            return frames[i - 1]
    return None


def _frame_text(frame: _Frame) -> str:
    path, line, name = frame
    return f"{path}:{line} in {name}"


def _zygote_entry(argv: Sequence[str]) -> None:
    """The zygote (``python -c``, see :class:`_Zygote`): import what a rank's wraps import
    on first use, then fork a rank per request, reap them, and end when the parent's pipe
    on stdin closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    # DDP's constructor imports torch._dynamo (seconds: sympy and ~800 modules), as does
    # torch.distributed.fsdp: once here instead of in every rank of every pool.
    importlib.import_module("torch._dynamo")
    importlib.import_module("torch.distributed.fsdp")

    sock = socket.socket(fileno=int(argv[0]))
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    sock.send(pickle.dumps(("ready", _threads())))
    channel = sock.fileno()
    while True:
        ready, _, _ = select.select([channel, wake_r, 0], [], [])
        if 0 in ready and not os.read(0, 1 << 16):
            os._exit(0)  # the parent is gone (its ranks see the same pipe close)
        if wake_r in ready:
            with contextlib.suppress(OSError):
                while os.read(wake_r, 1 << 10):
                    pass
        _reap(sock)
        if channel not in ready:
            continue
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, 1 << 20, 1)
        except OSError:
            os._exit(0)
        if not data:
            os._exit(0)
        _kind, args, path, cwd, environ = pickle.loads(data)
        threads = _threads()
        if threads != 1 or len(fds) != 1:
            sock.send(pickle.dumps(("nofork", threads)))
            for fd in fds:
                os.close(fd)
            continue
        pid = os.fork()
        if pid == 0:  # the rank
            code = 1
            try:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.close(wake_r)
                os.close(wake_w)
                sock.close()
                os.setsid()
                sys.path[:] = path
                os.chdir(cwd)
                os.environ.clear()
                os.environ.update(environ)
                _rank_entry([*args, str(fds[0])])
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        os.close(fds[0])
        sock.send(pickle.dumps(("pid", pid)))


def _reap(sock: socket.socket) -> None:
    """Reap the zygote's ended ranks; send each one's exit code."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        with contextlib.suppress(OSError):
            sock.send(pickle.dumps(("exit", pid, os.waitstatus_to_exitcode(status))))


def _threads() -> int:
    """The threads this process runs (a fork copies only the calling one)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _rank_entry(argv: Sequence[str]) -> None:
    """A rank process (forked by the zygote or ``python -c``, see :class:`_Pool`): join
    the group, then run jobs until told to stop (None) or the parent goes away."""
    rank, world = int(argv[0]), int(argv[1])
    backend, device, store, stack, fd = argv[2], argv[3], argv[4], argv[5], int(argv[6])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    global _STACK_FILE
    _STACK_FILE = open(stack, "w")  # noqa: SIM115 - kept open for faulthandler
    faulthandler.register(signal.SIGUSR1, file=_STACK_FILE, all_threads=True)
    threading.Thread(target=_watch_parent, name="polgrad-parent-watch", daemon=True).start()
    conn = mp_connection.Connection(fd)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", _loopback())
    torch.set_num_threads(1)
    dist = torch.distributed
    dev = torch.device("cpu")
    try:
        if device == "cuda":
            dev = torch.device("cuda", rank)
            torch.cuda.set_device(dev)
        dist.init_process_group(
            backend,
            init_method=f"file://{store}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(days=1),  # the parent's timeout governs
        )
    except Exception as exc:
        _send(conn, ("fail", rank, f"{type(exc).__name__}: {exc}"))
        return
    _send(conn, ("up", rank, threading.main_thread().ident))
    mesh: list[Any] = []
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            break
        try:
            job = pickle.loads(data)
            if job is None:  # stopped: nothing to keep, no process-group teardown to wait on
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(0)
            reply = _run_job(job, rank, dev, conn, mesh)
        except _Fail as fail:
            reply = ("fail", rank, str(fail))
        except BaseException as exc:  # the kit's own fault: say where
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            reply = ("fail", rank, f"rank {rank}: internal error of the distributed step:\n{text}")
        _send(conn, reply)
    os._exit(0)  # the parent closed the channel


_STACK_FILE: Any = None
_MAINS: set[str] = set()


def _send(conn: Connection, msg: tuple[Any, ...]) -> None:
    conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))


def _watch_parent() -> None:
    """End this rank (os._exit) when its stdin closes: the parent is gone, even mid-step."""
    with contextlib.suppress(OSError):  # the raw fd: no lock that shutdown would wait on
        while os.read(0, 1 << 16):
            pass
    os._exit(3)


def _loopback() -> str:
    """The loopback interface's name (ranks all run on this host)."""
    with contextlib.suppress(OSError, AttributeError):
        for _index, name in socket.if_nameindex():
            if name.startswith("lo"):
                return str(name)
    return "lo"


class _Fail(Exception):
    """A fault of the function under test on this rank (its message is the verdict)."""


def _load(payload: bytes, files: Mapping[str, str]) -> Callable[..., Any]:
    """Unpickle the function. The parent's ``__main__`` script is run as ``__mp_main__``
    first (its ``if __name__ == "__main__":`` block does not run), as multiprocessing's
    spawn does; a module not importable by name is loaded from its file."""
    main = files.get("__main__")
    if main is not None and main not in _MAINS:
        module = _exec_file("__mp_main__", main)
        sys.modules["__main__"] = module
        _MAINS.add(main)
    try:
        return pickle.loads(payload)  # type: ignore[no-any-return]
    except ModuleNotFoundError as exc:
        name = exc.name or ""
        if name not in files:
            raise _Fail(
                f"the function's module {name!r} cannot be imported in the rank: {exc}"
            ) from exc
    _exec_file(name, files[name])
    return pickle.loads(payload)  # type: ignore[no-any-return]


def _exec_file(name: str, path: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise _Fail(f"the function's module {name!r} cannot be loaded from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _run_job(
    job: _Job, rank: int, device: torch.device, conn: Connection, mesh: list[Any]
) -> tuple[Any, ...]:
    try:
        fn = _load(job.fn, job.files)
    except _Fail:
        raise
    except Exception as exc:
        raise _Fail(f"rank {rank}: loading the function failed: {_exception_text(exc)}") from exc
    model = TokenModel(job.shape[0], job.shape[1], device)
    wrapped: torch.nn.Module
    if job.wrap == "ddp":
        ids = [device.index] if device.type == "cuda" else None
        wrapped = DistributedDataParallel(model, device_ids=ids)
    else:
        # Not at the module top: torch.distributed.fsdp's import takes seconds (it imports
        # torch._dynamo), and every process that uses the training-step kind imports this
        # module; only ranks wrap. The zygote imports it once for the ranks it forks.
        from torch.distributed.fsdp import fully_shard

        if not mesh:
            mesh.append(init_device_mesh(device.type, (torch.distributed.get_world_size(),)))
        fully_shard(model, mesh=mesh[0])
        wrapped = model
    _send(conn, ("loaded", rank))  # the step's timeout starts when every rank is here
    values: list[float | None] = []
    changed: list[str] = []
    last = len(job.micro_batches) - 1
    for k, mb in enumerate(job.micro_batches):

        def mark(phase: str, k: int = k) -> None:
            _send(conn, ("at", k, phase))

        if job.wrap == "ddp":
            sync = contextlib.nullcontext() if k == last else wrapped.no_sync()  # type: ignore[operator]
        else:
            wrapped.set_requires_gradient_sync(k == last)  # type: ignore[operator]
            sync = contextlib.nullcontext()
        where = f"rank {rank} micro-batch {k} (rows {list(mb.rows)})"
        with sync:
            values.append(_micro_step(fn, wrapped, mb, job, where, device, changed, mark))
    grad = model.theta.grad
    if grad is None:
        raise _Fail(f"rank {rank}: no gradient reached the model after the step")
    if job.wrap == "fsdp":
        grad = grad.full_tensor()  # type: ignore[attr-defined]
    full = grad.detach().to("cpu", torch.float64).clone() if rank == 0 else None
    return ("ok", values, full, changed)


def _micro_step(
    fn: Callable[..., Any],
    wrapped: torch.nn.Module,
    mb: _MicroBatch,
    job: _Job,
    where: str,
    device: torch.device,
    changed: list[str],
    mark: Callable[[str], None],
) -> float | None:
    """One micro-batch: forward through the wrapped model, the function, its backward."""
    tensors = {n: t.to(device) for n, t in mb.tensors.items()}
    rows = torch.tensor(mb.rows, dtype=torch.long, device=device)
    lp = wrapped(rows, mb.width, tensors[job.through])
    flowed: list[bool] = []
    lp.register_hook(lambda g: flowed.append(True))
    kwargs: dict[str, Any] = {**tensors, job.through: lp, **mb.info}
    if mb.step is not None:
        kwargs["step"] = mb.step
    before = {n: v.detach().clone() for n, v in kwargs.items() if isinstance(v, torch.Tensor)}
    if not job.snapshot:
        before = {}
    mark("function")
    try:
        result = fn(**kwargs)
    except Exception as exc:
        raise _Fail(f"the function raised on {where}: {_exception_text(exc)}") from exc
    except SystemExit as exc:
        raise _Fail(
            f"the function called sys.exit({exc.code!r}) on {where}; a loss must return "
            "(or raise), never end the process"
        ) from exc
    mark("backward")
    if result is None:
        if not flowed:
            raise _Fail(
                f"{where}: the function returned None and left no gradient in logprobs; "
                "return the loss, or call backward() on it"
            )
        value: float | None = None
    else:
        loss = scalar_result(_pick(result, job.loss, where), where, _Fail)
        if not loss.requires_grad:
            raise _Fail(f"{where}: the returned loss is not differentiable in logprobs")
        try:
            torch.autograd.backward(loss)
        except RuntimeError as exc:
            raise _Fail(f"{where}: backward through the returned loss failed: {exc}") from exc
        if not flowed:
            raise _Fail(f"{where}: the returned loss does not depend on logprobs")
        value = float(loss.detach())
        if not math.isfinite(value):
            raise _Fail(
                f"the function returned {value} for {where}, a valid input" + empty_hint(*mb.counts)
            )
    for name, old in before.items():
        new = kwargs[name].detach()
        if not _same_bits(new, old):
            changed.append(f"{where.split(' (rows')[0]}: {name}")
    return value


def _pick(result: object, key: str | int | None, where: str) -> object:
    if isinstance(result, Mapping):
        k = "loss" if key is None else key
        if k not in result:
            raise _Fail(
                f"{where}: the function returned a dict without key {k!r} (keys: "
                f"{sorted(map(str, result))})"
            )
        return result[k]
    if isinstance(result, (tuple, list)):
        i = 0 if key is None else key
        if not isinstance(i, int) or not -len(result) <= i < len(result):
            raise _Fail(f"{where}: loss={key!r} does not index the {len(result)} items returned")
        return result[i]
    return result


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() and a.element_size() in (2, 4, 8):
        view = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return bool((a.view(view) == b.view(view)).all())
    return bool(torch.equal(a, b))


def _exception_text(exc: BaseException) -> str:
    """``Type: message (raised at FILE:LINE: SOURCE)``: the innermost frame outside torch
    and this module (the function's own code), not the whole traceback."""
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not str(Path(f.filename).resolve()).startswith(_TORCH_DIR)
        and str(Path(f.filename).resolve()) != _HERE
    ]
    if frames:
        f = frames[-1]
        source = f" : {f.line}" if f.line else ""
        text += f" (raised at {f.filename}:{f.lineno}{source.replace(' : ', ': ')})"
    return text
