"""Benchmark: where the project's own suite spends its time (issue 8 section 3).

Runs ``pytest -n WORKERS -q -p no:cacheprovider --durations=0`` in a subprocess (the
suite's own settings: one torch thread per process) and prints the wall time pytest
reports, the sum of the tests' durations, the files that take longest, and the share of
the tests that start inner ``-n 2`` sessions (each starts two worker processes, forked
from a process that has imported torch by tests/helpers/forked_workers.py: pytest, Hypothesis and
the kit are still imported afresh, about 0.6 s of CPU per worker here, 2 s unforked).

Run: ``python bench/suite.py [--workers 2] [--top 15] [-- extra pytest args]``.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_DURATION = re.compile(r"^([0-9.]+)s (call|setup|teardown)\s+(\S+?)::(\S+)")
_SUMMARY = re.compile(r"(\d+) passed.* in ([0-9.]+)s")
_INNER_XDIST = ("xdist]", "serial_and_xdist")
"""Test ids that start inner ``-n 2`` sessions (tests/test_snapshot_*.py's ``[...-xdist]``
cases and tests/pytest/test_plugin.py's serial-vs-xdist comparison)."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", default="2")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args()
    command = [sys.executable, "-m", "pytest", "-n", args.workers, "-q", "-p", "no:cacheprovider"]
    command += ["--durations=0", *args.pytest_args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    by_file: dict[str, float] = collections.defaultdict(float)
    count: collections.Counter[str] = collections.Counter()
    inner = 0.0
    for line in done.stdout.splitlines():
        m = _DURATION.match(line)
        if m is None:
            continue
        seconds, path, name = float(m.group(1)), m.group(3), m.group(4)
        by_file[path] += seconds
        count[path] += 1
        if any(mark in name for mark in _INNER_XDIST):
            inner += seconds
    summary = [m for line in done.stdout.splitlines() if (m := _SUMMARY.search(line))]
    if done.returncode != 0 or not summary:
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
        raise SystemExit(f"the suite failed (exit {done.returncode})")
    passed, wall = summary[-1].group(1), float(summary[-1].group(2))
    total = sum(by_file.values())
    print(f"pytest -n {args.workers}: {passed} passed in {wall:.1f} s (wall, as pytest reports)")
    print(f"sum of test durations {total:.1f} s; tests with inner -n 2 sessions {inner:.1f} s")
    print(f"{'seconds':>8} {'entries':>7}  file (the {args.top} longest)")
    for path, seconds in sorted(by_file.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"{seconds:8.1f} {count[path]:7d}  {path}")


if __name__ == "__main__":
    main()
