"""Inner ``-n`` sessions' xdist workers, forked from a process that has imported torch.

An xdist worker is a fresh interpreter (execnet's popen gateway: ``python -u -c
BOOTSTRAP``) that pays ``import torch`` (about 1.2 s of CPU here) before it collects a
single test; the suite starts about 30 of them. Inside :func:`forking`, execnet starts each
worker through a small launcher (``python -S -E`` running this file) instead:

1. the launcher hands its stdin, stdout and stderr, its environment, working directory
   and arguments to a *zygote*: an interpreter of the same venv that has imported torch
   and nothing pytest would rewrite (no plugin, not Hypothesis, not the kit);
2. the zygote forks a keeper, which forks the worker: it takes the launcher's streams,
   environment, directory and ``sys.path`` (``''``, ``PYTHONPATH``, the venv's), its
   bytecode settings (``PYTHONDONTWRITEBYTECODE``, ``PYTHONPYCACHEPREFIX``), and runs
   the same bootstrap a fresh interpreter would, as a fresh ``__main__``;
3. the keeper reports the worker's pid, then its exit status, which the launcher exits
   with (a signal ends the launcher the same way); SIGINT, SIGTERM and SIGHUP sent to
   the launcher reach the worker, and a launcher killed outright takes its worker along.

So a worker is still a separate process with its own streams, environment and exit
status (``os._exit`` crashes it alone). Two zygotes with different ``PYTHONHASHSEED``
serve alternate workers, so two workers of one session hash differently, as fresh ones
do. What a fork cannot honour falls back to the real interpreter (the launcher ``exec``s
it): a ``PYTHON*`` variable the zygote did not start with (``PYTHONHASHSEED``,
``PYTHONWARNINGS``, ...), other interpreter options, an explicit ``python=`` in a
``--tx`` spec, or a zygote that cannot be reached.

Shown equivalent by tests/helpers/test_forked_workers.py. This module imports only the standard
library: the launcher runs it without ``site``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Iterator
from typing import Any

__all__ = ["forking", "zygote_pids"]

_KEPT = ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX", "PYTHONUNBUFFERED")
"""``PYTHON*`` variables a fork honours (the rest must match the zygote's start)."""

_STARTUP = ("OMP_", "MKL_", "KMP_", "OPENBLAS_", "TORCH", "CUDA_", "LC_", "LANG", "TZ")
"""Prefixes of variables torch, its libraries or the C library read when torch is imported
(``OMP_NUM_THREADS``, ``CUDA_VISIBLE_DEVICES``, the locale): a request whose values differ
from the zygote's gets a fresh interpreter."""


def _startup(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_STARTUP)}


_ZYGOTES = 2


# ---- the test process: zygotes and execnet's arguments ---------------------------------


class _Zygote:
    """One zygote: its socket address, the pipe whose closing ends it, its process."""

    def __init__(self, directory: str, index: int) -> None:
        self.address = os.path.join(directory, f"zygote-{index}.sock")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env["PYTHONHASHSEED"] = str(secrets.randbelow(2**32 - 1) + 1)
        env["PYTHONUNBUFFERED"] = "1"
        read, self._lifeline = os.pipe()
        self.process = subprocess.Popen(
            [sys.executable, "-u", os.path.abspath(__file__), "serve", self.address, str(read)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=env,
            pass_fds=(read,),
            start_new_session=True,  # a terminal's Ctrl-C reaches workers through launchers
        )
        os.close(read)

    def wait_ready(self, timeout: float = 60.0) -> bool:
        """Whether it accepts connections (once torch is imported), waiting for that."""
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.address):
            if self.process.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._lifeline)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)


_started: list[_Zygote] = []
_lock = threading.Lock()


def _zygotes() -> list[_Zygote]:
    with _lock:
        if not _started:
            directory = tempfile.mkdtemp(prefix="polgrad-zygotes-")
            _started.extend(_Zygote(directory, i) for i in range(_ZYGOTES))
            atexit.register(_stop_all)
        return _started


def _stop_all() -> None:
    for zygote in _started:
        zygote.stop()
    if _started:
        shutil.rmtree(os.path.dirname(_started[0].address), ignore_errors=True)


def zygote_pids() -> list[int]:
    """The zygotes' pids (started on first use)."""
    return [z.process.pid for z in _zygotes()]


@contextlib.contextmanager
def forking() -> Iterator[None]:
    """Within: execnet's popen gateways (xdist's ``-n`` workers) start through a zygote."""
    from execnet import gateway_io

    original = gateway_io.popen_args
    count = [0]

    def popen_args(spec: Any) -> list[str]:
        args: list[str] = original(spec)
        if spec.python:  # an interpreter the command line chose
            return args
        zygote = _zygotes()[count[0] % _ZYGOTES]
        count[0] += 1
        if not zygote.wait_ready():
            return args
        launcher = [sys.executable, "-S", "-E", "-s", os.path.abspath(__file__)]
        return [*launcher, "launch", zygote.address, *args[1:]]

    gateway_io.popen_args = popen_args
    try:
        yield
    finally:
        gateway_io.popen_args = original


# ---- the launcher ---------------------------------------------------------------------


def _launch(address: str, args: list[str]) -> None:
    """Hand this process's streams to the zygote and exit as its worker does; ``exec`` the
    real interpreter when the zygote cannot serve (not reachable, or it says so)."""
    started = [False]
    pending: list[int] = []

    def forward(signum: int, frame: object) -> None:
        if not started[0]:
            pending.append(signum)  # before the worker exists
            return
        with contextlib.suppress(OSError):  # the keeper signals it (by pidfd: no stale pid)
            conn.sendall(f"{signum}\n".encode())

    forwarded = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    for signum in forwarded:
        signal.signal(signum, forward)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    reader = conn.makefile("r")
    try:
        conn.connect(address)
        request = {"args": args, "env": dict(os.environ), "cwd": os.getcwd()}
        socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
    except OSError:  # nothing was forked: the real interpreter serves
        first = {"fallback": "the zygote is not reachable"}
    else:
        try:
            first = json.loads(reader.readline())
        except (OSError, ValueError):  # the keeper is gone, maybe after its worker began
            sys.exit(1)  # as a worker that crashed (running the bootstrap again could not)
    if "fallback" in first:
        conn.close()
        for signum in forwarded:
            signal.signal(signum, signal.SIG_DFL)
        for early in pending:
            os.kill(os.getpid(), early)
        os.execv(sys.executable, [sys.executable, *args])
    started[0] = True
    for early in pending:
        forward(early, None)
    line = reader.readline()
    status = json.loads(line)["status"] if line else 1 << 8  # a keeper that died: exit 1
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    sys.exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


# ---- the zygote -----------------------------------------------------------------------


def _serve(address: str, lifeline: int) -> None:
    """Import torch, then fork a keeper per connection until the lifeline closes."""
    import gc

    import torch  # noqa: F401  (the point of the zygote)

    gc.freeze()  # torch's objects: out of every fork's garbage collections (and unshared)

    base_path = sys.path[1:]  # the venv's: stdlib, site-packages, editable installs
    start = _startup(dict(os.environ))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address + ".tmp")
    listener.listen(16)
    os.rename(address + ".tmp", address)  # connectable once it exists
    keepers: set[int] = set()
    while True:
        readable, _, _ = select.select([listener.fileno(), lifeline], [], [], 0.5)
        for pid in list(keepers):  # reaped, so their CPU time counts as this process's
            if os.waitpid(pid, os.WNOHANG)[0]:
                keepers.discard(pid)
        if lifeline in readable:  # the test process is gone (or stops it): leave no trace
            for pid in keepers:
                os.waitpid(pid, 0)
            with contextlib.suppress(OSError):
                os.unlink(address)
                os.rmdir(os.path.dirname(address))  # the last zygote to leave
            os._exit(0)
        if listener.fileno() in readable:
            conn, _ = listener.accept()
            pid = os.fork()
            if pid == 0:
                listener.close()
                os.close(lifeline)
                _keep(conn, base_path, start)
            keepers.add(pid)
            conn.close()


def _refusal(request: dict[str, Any], start: dict[str, str]) -> str:
    """Why a fork cannot stand in for ``python ARGS`` with this request ('' if it can):
    the zygote started with no ``PYTHON*`` variable but its own hash seed, and with the
    :data:`_STARTUP` variables ``start``."""
    args = [a for a in request["args"] if a not in ("-u", "-B")]
    if len(args) != 2 or args[0] != "-c":
        return f"interpreter options {request['args'][:-1]}"
    fixed = sorted(k for k in request["env"] if k.startswith("PYTHON") and k not in _KEPT)
    differ = set(_startup(request["env"]).items()) ^ set(start.items())
    fixed += sorted({name for name, _ in differ})
    return f"startup variables {fixed}" if fixed else ""


def _keep(conn: socket.socket, base_path: list[str], start: dict[str, str]) -> None:
    """The keeper: fork the worker, report its pid and then its status; kill it when the
    launcher goes away first (or anything else goes wrong here)."""
    pid = 0
    try:
        message, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
        while not message.endswith(b"\n"):
            more = conn.recv(1 << 16)
            if not more:
                os._exit(1)
            message += more
        request = json.loads(message)
        why = _refusal(request, start)
        if why:
            conn.sendall(json.dumps({"fallback": why}).encode() + b"\n")
            os._exit(0)
        keeper = os.getpid()
        pid = os.fork()
        if pid == 0:
            conn.close()
            _become_worker(request, fds, base_path, keeper)
        for fd in fds:
            os.close(fd)
        exited = os.pidfd_open(pid)
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        while True:
            readable, _, _ = select.select([conn.fileno(), exited], [], [])
            if exited in readable:
                status = os.waitpid(pid, 0)[1]
                pid = 0
                conn.sendall(json.dumps({"status": status}).encode() + b"\n")
                os._exit(0)
            forwarded = conn.recv(64)  # signal numbers, one per line, from the launcher
            if not forwarded:  # end of file: the launcher is gone
                break
            for signum in forwarded.split():
                signal.pidfd_send_signal(exited, int(signum))
    except BaseException:  # incl. a reset connection; a keeper never returns to the zygote
        pass
    if pid:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    os._exit(1)


def _become_worker(
    request: dict[str, Any], fds: list[int], base_path: list[str], keeper: int
) -> None:
    """Take the launcher's streams, environment, directory and path; run its ``-c`` and
    end as ``python -c`` does."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: the keeper
    if os.getppid() != keeper:  # the keeper died before prctl
        os._exit(1)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = ["", *extra, *base_path]
    sys.dont_write_bytecode = "-B" in request["args"] or bool(
        os.environ.get("PYTHONDONTWRITEBYTECODE")
    )
    sys.pycache_prefix = os.environ.get("PYTHONPYCACHEPREFIX") or None
    sys.argv = ["-c"]
    if "multiprocessing" in sys.modules:  # its own key, as a fresh process draws one
        sys.modules["multiprocessing"].current_process().authkey = os.urandom(32)
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    os._exit(_run(compile(request["args"][-1], "<string>", "exec"), main.__dict__))


def _run(code: types.CodeType, namespace: dict[str, Any]) -> int:
    """Run ``code`` and shut down as the interpreter does: the exit status of
    ``SystemExit`` (a message printed to stderr), ``sys.excepthook`` for an uncaught
    exception (status 1; KeyboardInterrupt ends the process by SIGINT), then non-daemon
    threads joined, atexit handlers, flushed streams."""
    status, interrupted = 0, False
    try:
        exec(code, namespace)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            status = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            status = 1
    except BaseException:
        sys.excepthook(*sys.exc_info())
        interrupted = isinstance(sys.exc_info()[1], KeyboardInterrupt)
        status = 1
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return status


if __name__ == "__main__":
    if sys.argv[1] == "launch":
        _launch(sys.argv[2], sys.argv[3:])
    elif sys.argv[1] == "serve":
        _serve(sys.argv[2], int(sys.argv[3]))
