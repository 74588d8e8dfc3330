"""Run many report snippets in ONE fresh interpreter (one ``import torch`` instead of one
per snippet), each as ``python FILE`` would run it from its own directory: the snippet is
saved as a file, the interpreter's ``sys.path`` holds neither ``''`` nor the working
directory, and each runs as ``__main__`` after ``os.chdir`` to the directory its report
names, with ``sys.path`` reset and the modules it imported from that directory dropped
(outside site-packages), so one snippet cannot help the next. A snippet that raises is
reported as ``"FAILED\\n<traceback>"`` for its case only.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

DRIVER = """
import contextlib, io, json, os, runpy, sys, traceback
base = [p for p in sys.path if p not in ("", ".", os.getcwd())]  # as `python file` has it
out = {}
for case, path, cwd in json.loads(sys.argv[1]):
    sys.path[:] = base  # what one snippet put on sys.path does not help the next
    for name in [n for n, m in sys.modules.items()  # nor what it imported from the project
                 if (f := getattr(m, "__file__", None) or "").startswith(cwd)
                 and "site-packages" not in f]:
        del sys.modules[name]
    os.chdir(cwd)
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            runpy.run_path(path, run_name="__main__")
    except BaseException:
        out[case] = "FAILED\\n" + traceback.format_exc()
    else:
        out[case] = buffer.getvalue()
print(json.dumps(out))
"""


def run_snippets(jobs: Iterable[tuple[str, str, str]], tmp: Path) -> dict[str, str]:
    """``{case: stdout}`` of every ``(case, code, directory to run from)``; each code is
    saved as ``tmp/<case>.py`` (outside the directory it runs from)."""
    files = []
    for case, code, cwd in jobs:
        path = tmp / f"{case}.py"
        path.write_text(code)
        files.append((case, str(path), cwd))
    out = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(files)],
        capture_output=True,
        text=True,
        cwd=tmp,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    results: dict[str, str] = json.loads(out.stdout)
    return results
