"""Run report snippets and user scripts in ONE fresh interpreter per test process (one
``import torch`` for all of them instead of one per snippet, per test or per module),
each as ``python FILE`` would run it:

- :func:`run_snippets`: each snippet is saved as a file (outside the directory it runs
  from) and run as ``__main__`` after ``os.chdir`` to the directory its report names,
  with ``sys.path`` the interpreter's own minus ``''`` and the working directory (as
  ``python FILE`` from elsewhere has it);
- :func:`run_scripts`: each script runs in place as ``__main__``, from the directory
  given, with ``sys.path`` starting with the script's directory and then the given
  ``PYTHONPATH`` entries (as ``PYTHONPATH=... python SCRIPT`` has it).

Before every snippet or script, ``sys.path`` is reset and every module imported since the
interpreter started that is not part of the standard library or an installed package
(``site-packages``: torch, pytest, Hypothesis; the kit's own packages, :data:`KIT`, which
a user has installed and this checkout installs editable) is dropped, and so are the
import system's path finders (a relative entry such as ``'tests'`` names another
directory now): the project's modules (``tests``, a pytester project's) and the user's
packages are imported afresh, so one snippet cannot help the next. ``fresh_kit=True``
(every script, as ``python SCRIPT`` starts with none of it) drops the kit's modules too:
the kit is imported afresh, with empty caches. A snippet that raises
(``SystemExit`` with a status other than 0 included) is reported as
``"FAILED\\n<traceback><its stderr>"`` for its case only (its stderr is shown only then).

The interpreter starts at the first call (without the outer run's xdist variables, with
the hash seed :data:`HASH_SEED`), serves every later call of the same test process
(under ``-n``, each worker has its own) and is closed at exit; if it dies, the call fails
with its stderr and the next call starts a new one.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO

__all__ = ["HASH_SEED", "KIT", "run_scripts", "run_snippets"]

KIT = tuple(
    os.path.realpath(Path(__file__).parents[2] / name) + os.sep
    for name in ("pytest_polgrad", "polgrad_reference", "strategies")
)
"""The directories of the kit's packages in this checkout (``pytest_polgrad/strategies``
is a link to ``strategies``)."""

HASH_SEED = "54321" if os.environ.get("PYTHONHASHSEED") == "12345" else "12345"
"""The interpreter's ``PYTHONHASHSEED``: another hash seed than a test process's (random
unless the user sets one; never the one set), for the tests that draw the same batches in
another process."""

SERVER = r"""
import contextlib, importlib, io, json, os, runpy, sys, sysconfig, traceback
base = [p for p in sys.path if p not in ("", ".", os.getcwd())]  # as `python file` has it
keep = set(sys.modules)
paths = sysconfig.get_paths()
libraries = tuple(
    os.path.realpath(paths[k]) + os.sep
    for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths
)
kit = tuple(json.loads(sys.argv[2]))  # the kit's packages: installed (editable here)
answers = os.fdopen(int(sys.argv[1]), "w")
requests = os.fdopen(os.dup(0), "r")  # not sys.stdin: the builtin exit() closes that


def where(module):
    file = getattr(module, "__file__", None)
    if file is None:  # a namespace package: its first directory
        file = next(iter(getattr(module, "__path__", None) or ()), None)
    return None if file is None else os.path.realpath(str(file))


def owned(module, fresh):  # imported from a project, not the standard library or an install
    file = where(module)
    kept = libraries if fresh else libraries + kit
    return file is not None and not file.startswith(kept)


for request in requests:
    out = {}
    for case, path, cwd, front, fresh in json.loads(request):
        sys.stdin = open(os.devnull)  # a snippet reads no request, and may close its stdin
        sys.path[:] = [*front, *base]  # what one snippet put on sys.path does not help
        for name in [n for n, m in list(sys.modules.items()) if n not in keep and owned(m, fresh)]:
            del sys.modules[name]  # nor what it imported from a project
        sys.path_importer_cache.clear()  # finders of relative entries ('tests', '.')
        importlib.invalidate_caches()  # belong to the previous directory
        os.chdir(cwd)
        buffer, errors = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(errors):
                runpy.run_path(path, run_name="__main__")
        except SystemExit as exit:  # sys.exit(0) ends `python FILE` with status 0
            ok = exit.code is None or exit.code == 0
            failed = "FAILED\n" + traceback.format_exc() + errors.getvalue()
            out[case] = buffer.getvalue() if ok else failed
        except BaseException:
            out[case] = "FAILED\n" + traceback.format_exc() + errors.getvalue()
        else:
            out[case] = buffer.getvalue()
    answers.write(json.dumps(out) + "\n")
    answers.flush()
"""


class _Interpreter:
    """The serving interpreter: a request is one JSON line on its stdin, its answer one
    JSON line on a pipe of its own (a snippet's stray output cannot corrupt it)."""

    def __init__(self) -> None:
        self.home = Path(tempfile.mkdtemp(prefix="polgrad-snippets-"))
        self.stderr: IO[bytes] = open(self.home / "stderr", "w+b")  # noqa: SIM115
        read, write = os.pipe()
        outer = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_ADDOPTS")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(write), json.dumps(KIT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=self.stderr,
            cwd=self.home,
            env={
                **{k: v for k, v in os.environ.items() if k not in outer},  # not the outer run's
                "PYTHONHASHSEED": HASH_SEED,
            },
            pass_fds=(write,),
            text=True,
        )
        os.close(write)
        self.answers = os.fdopen(read, "r")
        self.died = ""

    def request(self, jobs: list[tuple[str, str, str, list[str], bool]]) -> dict[str, str]:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(jobs) + "\n")
            self.proc.stdin.flush()
            line = self.answers.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            self.close()
            raise AssertionError(f"the snippet interpreter died: {self.died}")
        answer: dict[str, str] = json.loads(line)
        return answer

    def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.answers.close()
        self.stderr.seek(0)
        self.died = self.stderr.read().decode(errors="replace")  # its stderr, for the failure
        self.stderr.close()
        shutil.rmtree(self.home, ignore_errors=True)


_SERVING: list[_Interpreter] = []


def _close() -> None:
    while _SERVING:
        _SERVING.pop().close()


atexit.register(_close)


def _request(jobs: list[tuple[str, str, str, list[str], bool]]) -> dict[str, str]:
    if not _SERVING or _SERVING[0].proc.poll() is not None:
        _close()
        _SERVING.append(_Interpreter())
    try:
        return _SERVING[0].request(jobs)
    except AssertionError:
        _SERVING.clear()  # closed: the next call starts a new interpreter
        raise


def run_snippets(
    jobs: Iterable[tuple[str, str, str]], tmp: Path, *, fresh_kit: bool = False
) -> dict[str, str]:
    """``{case: stdout}`` of every ``(case, code, directory to run from)``; each code is
    saved as ``tmp/<case>.py`` (outside the directory it runs from). ``fresh_kit``: the
    kit's modules are imported afresh too."""
    files: list[tuple[str, str, str, list[str], bool]] = []
    for case, code, cwd in jobs:
        path = tmp / f"{case}.py"
        path.write_text(code)
        files.append((case, str(path), cwd, [], fresh_kit))
    return _request(files)


def run_scripts(jobs: Iterable[tuple[str, Path, Path, Sequence[Path]]]) -> dict[str, str]:
    """``{case: stdout}`` of every ``(case, script, directory to run from, PYTHONPATH
    entries)``, each run in place as ``PYTHONPATH=... python SCRIPT`` would run it (the
    kit imported afresh)."""
    return _request(
        [
            (case, str(script), str(cwd), [str(script.parent), *map(str, pythonpath)], True)
            for case, script, cwd, pythonpath in jobs
        ]
    )
