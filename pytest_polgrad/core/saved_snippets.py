"""Reproduction snippets too long to print, saved as files under pytest's temporary
directory instead (a realistic-size failure's batch is thousands of literal values, and
each failing check of a function prints its own snippet).

Under the plugin, a snippet longer than :data:`INLINE_LINES` lines is written to
``<basetemp>/polgrad/<function>-<check>-<digest>.py`` (each xdist worker has its own
basetemp) and the report prints its header comment and the path. Outside a pytest session
(``assert_conforms`` in a script, ``run_check``) every snippet is printed whole.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from collections.abc import Callable
from pathlib import Path

__all__ = ["INLINE_LINES", "current", "reproduce_lines", "save_under", "shell_word"]

INLINE_LINES = 200
"""The longest snippet a report prints whole."""

_directory: Callable[[], Path] | None = None


def shell_word(text: str) -> str:
    """``text`` as one shell word, always in single quotes (:func:`shlex.quote`, which
    leaves a word of safe characters bare): ``'checks/t.py::f[grpo-value]'``. Every
    command line the kit prints quotes what it did not write itself (node ids, paths)."""
    quoted = shlex.quote(text)
    return quoted if quoted.startswith("'") else f"'{text}'"


def save_under(directory: Callable[[], Path] | None) -> None:
    """Where long snippets go from now on: ``directory()`` (called at the first long
    snippet, so a session without one creates nothing), or nowhere (None: print whole)."""
    global _directory
    _directory = directory


def current() -> Callable[[], Path] | None:
    """The directory callable in use (a nested pytest session restores it when it ends)."""
    return _directory


def reproduce_lines(text: str, name: str, check: str) -> list[str]:
    """The report's ``reproduce (standalone):`` block for ``text``: the snippet itself, or,
    when it is long and a directory is set, its header comment and the file it is in."""
    lines = text.splitlines()
    if len(lines) <= INLINE_LINES or _directory is None:
        return ["  reproduce (standalone):", "", *lines]
    slug = re.sub(r"[^\w.-]+", "_", f"{name}-{check}")[:80]
    digest = hashlib.sha1(text.encode()).hexdigest()[:10]
    path = _directory() / f"{slug}-{digest}.py"
    if not path.exists():  # same content, same name: a rerun or another worker wrote it
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(text)
        partial.replace(path)  # whole or absent, never half written
    header = [
        ln.replace("save it as a file and run", "run") for ln in lines[:3] if ln.startswith("#")
    ]
    return [
        f"  reproduce (standalone): {len(lines)} lines, too long to print, saved as",
        f"    {shlex.quote(str(path))}",
        *(f"    {ln}" for ln in header),
    ]
