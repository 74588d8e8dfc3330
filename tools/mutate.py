"""Mutation testing of the reference and the checks with cosmic-ray 8.7.0 (``make mutate``).

    python tools/mutate.py [MODULE ...] [--timeout S] [--max-mutants N]

Each module of ``tools/mutate.toml`` (or those named) is mutated in a copy of the working
tree, ``build/mutate/tree-<module>`` (the files git tracks or would track), never in place: other
work in the tree is untouched and an interrupted run leaves nothing mutated behind. The
copy is first on ``PYTHONPATH``, so the tests and the pytest plugin import the mutated
code, not the editable install. Per module the output is the score (killed / all, a
timeout counting as killed) and every surviving mutant with its diff; the whole report is
also written to ``build/mutate/report.md``. Run by hand, never in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest depends on tomli before 3.11
    import tomli as tomllib  # type: ignore[import-not-found,no-redef,unused-ignore]

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "build" / "mutate"
BIN = Path(sys.executable).parent


def copy_tree(dest: Path) -> None:
    """Copy the files git tracks or would track (symlinks kept) to ``dest``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    if dest.exists():
        shutil.rmtree(dest)
    for rel in filter(None, listed.split("\0")):
        src = ROOT / rel
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the working tree
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            target.symlink_to(os.readlink(src))
        elif src.is_file():
            shutil.copy2(src, target)


def test_command(tests: list[str], tree: Path) -> str:
    """One module's targeted tests, serial, importing the copy (``PYTHONPATH``)."""
    return shlex.join(
        [
            "env",
            f"PYTHONPATH={tree}",
            sys.executable,
            "-m",
            "pytest",
            "-x",
            "-q",
            "-p",
            "no:xdist",
            "-p",
            "no:cacheprovider",
            *tests,
        ]
    )


def cosmic_config(
    module: str, tests: list[str], timeout: float, excluded: list[str], tree: Path
) -> str:
    return "\n".join(
        [
            "[cosmic-ray]",
            f"module-path = {json.dumps(module)}",
            f"timeout = {float(timeout)}",
            "excluded-modules = []",
            f"test-command = {json.dumps(test_command(tests, tree))}",
            "",
            "[cosmic-ray.distributor]",
            'name = "local"',
            "",
            "[cosmic-ray.filters.operators-filter]",
            f"exclude-operators = {json.dumps(excluded)}",
            "",
        ]
    )


def _run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], cwd=cwd, text=True, capture_output=True)


def results(session: Path, cwd: Path) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    dump = _run(BIN / "cosmic-ray", "dump", session, cwd=cwd)
    rows = []
    for line in dump.stdout.splitlines():
        item, result = json.loads(line)
        rows.append((item, result))
    return rows


def describe(item: dict[str, Any], result: dict[str, Any] | None) -> str:
    (mutation,) = item["mutations"]
    where = f"{mutation['module_path']}:{mutation['start_pos'][0]}"
    head = f"- `{where}` {mutation['operator_name']} #{mutation['occurrence']}"
    diff = (result or {}).get("diff") or ""
    body = [ln for ln in diff.splitlines() if ln.startswith(("+", "-")) and ln[1:2] != ln[0:1]]
    return head + ("\n" + "\n".join(f"    {ln}" for ln in body) if body else "")


def mutate(module: str, tests: list[str], timeout: float, excluded: list[str], limit: int) -> str:
    name = module.replace("/", "_").removesuffix(".py")
    tree = OUT / f"tree-{name}"  # one copy per module: runs of two modules may overlap
    copy_tree(tree)
    config, session = OUT / f"{name}.toml", OUT / f"{name}.sqlite"
    config.write_text(cosmic_config(module, tests, timeout, excluded, tree), encoding="utf-8")
    session.unlink(missing_ok=True)
    for step in (
        (BIN / "cosmic-ray", "init", config, session),
        (BIN / "cr-filter-operators", session, config),
    ):
        done = _run(*step, cwd=tree)
        if done.returncode != 0:
            raise SystemExit(f"{step[0]} failed for {module}:\n{done.stdout}{done.stderr}")
    baseline = _run(*shlex.split(test_command(tests, tree)), cwd=tree)
    if baseline.returncode != 0:
        raise SystemExit(f"the tests of {module} fail unmutated:\n{baseline.stdout[-3000:]}")
    if limit:
        _limit(session, limit, tree)
    _run(BIN / "cosmic-ray", "exec", config, session, cwd=tree)
    rows = [(i, r) for i, r in results(session, tree) if r is not None]
    skipped = [i for i, r in results(session, tree) if r is None]
    done_rows = [(i, r) for i, r in rows if r.get("worker_outcome") != "skipped"]
    survivors = [(i, r) for i, r in done_rows if r.get("test_outcome") == "survived"]
    killed = len(done_rows) - len(survivors)
    score = killed / len(done_rows) if done_rows else float("nan")
    lines = [
        f"## {module}",
        "",
        f"tests: {' '.join(tests)}",
        f"mutants run: {len(done_rows)}, killed: {killed}, survived: {len(survivors)}, "
        f"score: {score:.1%}" + (f" (not run: {len(skipped)})" if skipped else ""),
        "",
        *(describe(i, r) for i, r in survivors),
        "",
    ]
    return "\n".join(lines)


def _limit(session: Path, limit: int, cwd: Path) -> None:
    """Keep ``limit`` of the pending mutants, spread evenly over the module (a sample)."""
    import sqlite3

    with sqlite3.connect(session) as db:
        ids = [
            row[0]
            for row in db.execute(
                "SELECT job_id FROM work_items WHERE job_id NOT IN "
                "(SELECT job_id FROM work_results) ORDER BY rowid"
            )
        ]
        if len(ids) <= limit:
            return
        step = len(ids) / limit
        keep = {ids[int(k * step)] for k in range(limit)}
        drop = [(i,) for i in ids if i not in keep]
        db.executemany("DELETE FROM mutation_specs WHERE job_id = ?", drop)
        db.executemany("DELETE FROM work_items WHERE job_id = ?", drop)


def main(argv: list[str] | None = None) -> int:
    spec = tomllib.loads((ROOT / "tools" / "mutate.toml").read_text(encoding="utf-8"))
    modules: dict[str, dict[str, Any]] = spec["modules"]
    parser = argparse.ArgumentParser(prog="tools/mutate.py", description=__doc__.split("\n")[0])
    parser.add_argument("module", nargs="*", help=f"default: all of {', '.join(modules)}")
    parser.add_argument("--timeout", type=float, default=spec["settings"]["timeout"])
    parser.add_argument("--max-mutants", type=int, default=0, help="sample N per module")
    args = parser.parse_args(argv)
    unknown = [m for m in args.module if m not in modules]
    if unknown:
        parser.error(f"not in tools/mutate.toml: {unknown}; known: {list(modules)}")
    OUT.mkdir(parents=True, exist_ok=True)
    report = ["# Mutation report (tools/mutate.py)", ""]
    for module in args.module or list(modules):
        section = mutate(
            module,
            list(modules[module]["tests"]),
            args.timeout,
            list(spec["settings"]["exclude-operators"]),
            args.max_mutants,
        )
        print(section, flush=True)
        report.append(section)
    (OUT / "report.md").write_text("\n".join(report), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
