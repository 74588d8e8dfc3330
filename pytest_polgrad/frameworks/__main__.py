"""``python -m pytest_polgrad.frameworks {record,compare,drift}``.

- ``record [FRAMEWORK ...] [--out DIR]``: compute every case's outputs on the canonical
  corpus with the installed frameworks and write ``<DIR>/<framework>.json`` (default: the
  repository's ``snapshots/frameworks/``). Review the diff, then commit.
- ``compare [--against DIR]``: compare the installed frameworks' outputs with the recorded
  ones and print what changed (exit 1 when anything did).
- ``drift [--venv DIR] [--keep]``: build a scratch environment with the newest release of
  each framework (same torch, same support packages), re-run the adapters there, and report
  which recorded outputs and which deviations changed. Run by hand; needs the registry.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from pytest_polgrad.frameworks._pins import PINS
from pytest_polgrad.frameworks.deviations import DEVIATIONS

REPO = Path(__file__).resolve().parents[2]
REQUIREMENTS = Path(__file__).with_name("requirements.txt")
SUPPORT = Path(__file__).with_name("support.txt")


def _record(frameworks: Sequence[str], out: Path | None) -> int:
    from pytest_polgrad.frameworks.recorded import (  # torch: this command only
        record,
        write,
    )

    for fw in frameworks or list(PINS):
        path = write(record(fw), out)
        print(f"recorded {fw} -> {path}")
    return 0


def _changes(against: Path | None, live_dir: Path | None = None) -> list[str]:
    """Lines describing every recorded output and deviation claim that changed."""
    # torch (cases, recorded): this command only, so --help starts without it
    from pytest_polgrad.frameworks.cases import CASES  # torch: as the line above says
    from pytest_polgrad.frameworks.recorded import (  # torch: as above
        compare_outputs,
        load,
        reference_outputs,
    )

    lines: list[str] = []
    for fw in PINS:
        old = load(fw, against)
        new = load(fw, live_dir) if live_dir is not None else None
        if new is None:
            from pytest_polgrad.frameworks.recorded import record  # torch: as above

            new = record(fw)
        if new["version"] != old["version"]:
            lines.append(f"{fw}: recorded {old['version']}, now {new['version']}")
        for case in (c for c in CASES if c.framework == fw):
            before, after = old["cases"].get(case.id), new["cases"].get(case.id)
            if before is None or after is None:
                lines.append(f"{fw} {case.id}: not recorded on one side")
                continue
            diff = compare_outputs(before, after)
            if diff:
                lines.append(f"{fw} {case.id}: recorded outputs changed")
                lines += [f"    {d}" for d in diff]
            if not case.equals.batch_dependent and compare_outputs(
                reference_outputs(case, case.equals), after, rtol=case.rtol
            ):
                lines.append(f"{fw} {case.id}: no longer equals {case.equals.describe()}")
            if case.claims is not None and case.expect:
                still = compare_outputs(reference_outputs(case, case.claims), after, rtol=1e-6)
                if not still:
                    lines.append(
                        f"{fw} {case.id}: now equals {case.claims.describe()} on the corpus "
                        f"(deviation {sorted(case.expect)} may be gone)"
                    )
    return lines


def _compare(against: Path | None) -> int:
    lines = _changes(against)
    print("\n".join(lines) if lines else "no recorded output or deviation changed")
    return 1 if lines else 0


def _run(cmd: Sequence[str], **kw: object) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload]


def _newest(py: str, dist: str) -> str:
    out = subprocess.run(
        [py, "-m", "pip", "index", "versions", dist], capture_output=True, text=True, check=True
    ).stdout
    first = out.splitlines()[0] if out else ""
    return first[first.find("(") + 1 : first.find(")")] if "(" in first else "unknown"


def _deviation_status(py: str, workdir: Path) -> dict[str, str]:
    xml = workdir / "deviations.xml"
    ids = sorted({d.nodeid for d in DEVIATIONS})
    subprocess.run(
        [
            py,
            "-m",
            "pytest",
            "-p",
            "no:xdist",
            "-p",
            "no:cacheprovider",
            "-q",
            f"--junitxml={xml}",
            "--polgrad-max-examples=20",
            *ids,
        ],
        cwd=REPO,
        check=False,
    )
    status: dict[str, str] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        kinds = {child.tag: child.get("type", "") for child in case}
        if "failure" in kinds or "error" in kinds:
            status[name] = "failed"
        elif kinds.get("skipped") == "pytest.xfail":
            status[name] = "xfailed"  # an expected failure demonstrates its deviation
        elif "skipped" in kinds:
            status[name] = "skipped"
        else:
            status[name] = "passed"
    return {nid: status.get(nid, "not collected") for nid in ids}


def _drift(venv: Path | None, keep: bool) -> int:
    scratch = venv or Path(tempfile.mkdtemp(prefix="polgrad-drift-"))
    py = str(scratch / "bin" / "python")
    try:
        if not Path(py).exists():
            _run([sys.executable, "-m", "venv", str(scratch)])
        import torch  # its version pins the scratch venv; --help starts without it

        _run([py, "-m", "pip", "install", "-q", f"torch=={torch.__version__.split('+')[0]}"])
        _run([py, "-m", "pip", "install", "-q", "-e", str(REPO)])
        _run([py, "-m", "pip", "install", "-q", "-r", str(SUPPORT)])
        newest = {fw: _newest(py, pin.distribution) for fw, pin in PINS.items()}
        _run(
            [
                py,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--upgrade",
                *(f"{PINS[fw].distribution}=={v}" for fw, v in newest.items()),
            ]
        )
        print("newest releases: " + ", ".join(f"{fw} {v}" for fw, v in newest.items()))
        live = scratch / "recorded"
        _run([py, "-m", "pytest_polgrad.frameworks", "record", "--out", str(live)], cwd=REPO)
        lines = _changes(None, live)
        print("\n== recorded outputs and deviation claims ==")
        print("\n".join(lines) if lines else "unchanged")
        print("\n== demonstrating tests of DEVIATIONS on the newest releases ==")
        changed = 0
        for nid, st in _deviation_status(py, scratch).items():
            mark = "" if st in ("passed", "xfailed") else "   <- changed"
            changed += bool(mark)
            print(f"{st:>14}  {nid}{mark}")
        return 1 if lines or changed else 0
    finally:
        if not keep and venv is None:
            shutil.rmtree(scratch, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_polgrad.frameworks")
    sub = parser.add_subparsers(dest="command", required=True)
    p_rec = sub.add_parser("record", help="record the installed frameworks' outputs")
    p_rec.add_argument("frameworks", nargs="*", help=f"among {', '.join(PINS)} (default: all)")
    p_rec.add_argument("--out", type=Path, default=None)
    p_cmp = sub.add_parser("compare", help="compare installed outputs with the recorded")
    p_cmp.add_argument("--against", type=Path, default=None)
    p_drift = sub.add_parser("drift", help="newest releases in a scratch env vs the recorded")
    p_drift.add_argument("--venv", type=Path, default=None)
    p_drift.add_argument("--keep", action="store_true")
    args = parser.parse_args(argv)
    try:
        return _command(parser, args)
    except (ImportError, OSError, ValueError, KeyError, subprocess.SubprocessError) as exc:
        # one line, exit 2: a framework not installed, a directory that cannot be read or
        # written, a malformed recording, a failing pip (drift offline)
        text = " ".join(str(exc).split()) or type(exc).__name__
        parser.exit(2, f"{parser.prog} {args.command}: error: {text}\n")


def _command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.command == "record":
        unknown = sorted(set(args.frameworks) - set(PINS))
        if unknown:
            parser.error(f"unknown framework(s) {unknown}; known: {', '.join(PINS)}")
        if args.out is not None:
            try:
                args.out.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise NotADirectoryError(
                    f"--out {args.out}: cannot create the directory ({exc.strerror})"
                ) from None
        return _record(args.frameworks, args.out)
    if args.command == "compare":
        if args.against is not None and not args.against.is_dir():
            raise NotADirectoryError(f"--against {args.against}: not a directory of recordings")
        return _compare(args.against)
    if args.venv is not None and args.venv.exists() and not args.venv.is_dir():
        raise NotADirectoryError(f"--venv {args.venv}: not a directory")
    return _drift(args.venv, args.keep)


if __name__ == "__main__":
    raise SystemExit(main())
