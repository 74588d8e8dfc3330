"""A verdict must not depend on the budget (issue 27): the same verdict at every
``max_examples`` and seed, for every registry entry of the reference as the function under
test and every framework adapter the tier marks.

A verdict is the report's ``ok`` and its sorted failing checks (declared ones included:
a declared deviation that shows at one budget and not another is budget-dependent too).
Rows whose verdict differs between budgets or seeds are listed at the end; a corner that
decides one belongs in the canonical corpus, which every budget runs first.

- registry: ``polgrad_reference.ALGORITHMS``, each entry's own loss
  (``tests.helpers.sample_losses.reference_loss``) marked with its name, sequence
  advantages and ``advantages="token"``;
- frameworks (``--frameworks``; run it with the tier's interpreter,
  ``.venv-frameworks/bin/python``): every function marked ``polgrad_conforms`` in
  ``tests/frameworks/test_*.py`` (the catalogue's cases, built by ``_marking.py``, and the
  other kinds' adapters), with its marker's options, ``golden`` left out (it runs under
  pytest only).

Run by hand (minutes to hours, CPU): ``python bench/budget_sweep.py`` (defaults: budgets
5 20 100 300, seeds 0-4); ``--budgets 5 20 --seeds 0 1 --only gspo dapo`` for a subset.
The work is done pass by pass (one budget and seed over every row, in ``--passes`` order:
``"5:0-4 300:0 20:0-4"``), so a run cut short by ``--stop-at HH:MM`` (UTC; no pass is
started on a row after it) still covers every row at the passes it reached. Split the
rows over processes with ``--shard K/N`` and ``--out FILE`` (one JSON line per verdict),
then ``--table FILE ...`` prints the merged table (a cell lists the seeds it holds).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from polgrad_reference import ALGORITHMS, get_algorithm  # noqa: E402
from pytest_polgrad import ConformanceError, assert_conforms  # noqa: E402
from tests.helpers.sample_losses import reference_loss  # noqa: E402

Row = tuple[str, Callable[..., Any], Any, dict[str, Any]]


def registry_rows() -> Iterator[Row]:
    for name in ALGORITHMS:
        fn = reference_loss(get_algorithm(name).loss, f"{name}_ref")
        yield (f"{name}", fn, name, {})
        yield (f"{name} advantages=token", fn, name, {"advantages": "token"})


def framework_rows() -> Iterator[Row]:
    """Every function marked ``polgrad_conforms`` in the tier's test modules."""
    tier = ROOT / "tests" / "frameworks"
    sys.path.insert(0, str(tier))  # the tier's modules import _marking as pytest's rootdir does
    for path in sorted(tier.glob("test_*.py")):
        module = importlib.import_module(f"tests.frameworks.{path.stem}")
        for attr, obj in vars(module).items():
            for mark in getattr(obj, "pytestmark", []):
                if getattr(mark, "name", "") != "polgrad_conforms":
                    continue
                options = {k: v for k, v in mark.kwargs.items() if k != "id"}
                label = f"{path.stem}::{attr}[{mark.kwargs.get('id', mark.args[0])}]"
                yield (label, obj, mark.args[0], options)


def verdict(fn: Callable[..., Any], reference: Any, options: dict[str, Any], **run: Any) -> str:
    try:
        report = assert_conforms(fn, reference, **options, **run)
    except ConformanceError as exc:
        report = exc.report
    except Exception as exc:  # a marker the API refuses is a verdict too
        return f"error: {type(exc).__name__}: {str(exc)[:80]}"
    failed = sorted(r.check for r in report.results if not r.passed)
    head = "ok" if report.ok else "FAIL"
    return head + (f" ({', '.join(failed)})" if failed else "")


def parse_passes(text: str) -> list[tuple[int, int]]:
    """``"5:0-4 300:0,2"`` -> ``[(5, 0), ..., (5, 4), (300, 0), (300, 2)]``."""
    out: list[tuple[int, int]] = []
    for item in text.split():
        budget, _, seeds = item.partition(":")
        for part in seeds.split(","):
            lo, _, hi = part.partition("-")
            out += [(int(budget), s) for s in range(int(lo), int(hi or lo) + 1)]
    return out


def stop_time(text: str | None) -> datetime.datetime | None:
    if text is None:
        return None
    now = datetime.datetime.now(datetime.timezone.utc)
    hour, minute = (int(x) for x in text.split(":"))
    return now.replace(hour=hour, minute=minute, second=0, microsecond=0)


def table(records: list[dict[str, Any]], budgets: list[int]) -> tuple[list[str], int]:
    """The markdown table of ``records`` (label, reference, budget, seed, verdict) and the
    number of rows whose verdict differs between budgets or seeds."""
    rows: dict[str, dict[str, Any]] = {}
    for r in records:
        row = rows.setdefault(r["label"], {"reference": r["reference"], "cells": {}})
        row["cells"].setdefault(r["budget"], {}).setdefault(r["verdict"], []).append(r["seed"])
    budgets = sorted(set(budgets) | {b for r in rows.values() for b in r["cells"]})
    lines = [
        f"| function | reference | {' | '.join(f'{b} examples' for b in budgets)} |",
        "|---|---|" + "---|" * len(budgets),
    ]
    unstable: list[str] = []
    for label, row in rows.items():
        cells, seen = [], set()
        for b in budgets:
            found = row["cells"].get(b, {})
            seen |= set(found)
            cells.append(
                " / ".join(f"{v} (seeds {_seeds(s)})" for v, s in sorted(found.items())) or "-"
            )
        lines.append(f"| {label} | {row['reference']} | {' | '.join(cells)} |")
        if len(seen) > 1:
            unstable.append(f"- {label}: {sorted(seen)}")
    lines += ["", f"{len(rows)} rows; budget- or seed-dependent verdicts: {len(unstable)}"]
    return lines + unstable, len(unstable)


def _seeds(seeds: list[int]) -> str:
    return ",".join(str(s) for s in sorted(set(seeds)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budgets", type=int, nargs="+", default=[5, 20, 100, 300])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--passes", default=None, help='"BUDGET:SEEDS ...", e.g. "5:0-4 300:0"')
    parser.add_argument("--frameworks", action="store_true", help="the tier's adapters too")
    parser.add_argument("--no-registry", action="store_true")
    parser.add_argument("--only", nargs="*", default=None, help="rows whose label contains")
    parser.add_argument("--shard", default="1/1", help="K/N: every N-th row from the K-th")
    parser.add_argument("--stop-at", default=None, help="HH:MM UTC: start no cell after it")
    parser.add_argument("--out", default=None, help="append one JSON line per verdict")
    parser.add_argument("--table", nargs="+", default=None, help="print the table of --out files")
    args = parser.parse_args(argv)
    if args.table:
        merged = [json.loads(line) for f in args.table for line in Path(f).read_text().splitlines()]
        lines, unstable = table(merged, [])
        print("\n".join(lines))
        return 1 if unstable else 0
    passes = (
        parse_passes(args.passes)
        if args.passes
        else [(b, s) for b in args.budgets for s in args.seeds]
    )
    rows: list[Row] = []
    if not args.no_registry:
        rows += list(registry_rows())
    if args.frameworks:
        rows += list(framework_rows())
    if args.only:
        rows = [r for r in rows if any(s in r[0] for s in args.only)]
    # every kind now, not at its first row: a tree edited during an hours-long run must not
    # give a late row another version of the kit than the early ones
    from pytest_polgrad.core.kinds import KINDS, get_kind

    for kind in KINDS:
        get_kind(kind)
    k, n = (int(x) for x in args.shard.split("/"))
    rows = rows[k - 1 :: n]
    deadline = stop_time(args.stop_at)
    out = open(args.out, "a") if args.out else None  # noqa: SIM115
    records: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for budget, seed in passes:
        if deadline is not None and datetime.datetime.now(datetime.timezone.utc) > deadline:
            print(f"stopped at --stop-at {args.stop_at} before pass {budget} x seed {seed}")
            break
        for label, fn, reference, options in rows:
            if deadline is not None and datetime.datetime.now(datetime.timezone.utc) > deadline:
                print(f"stopped at --stop-at {args.stop_at} inside pass {budget} x seed {seed}")
                break
            v = verdict(fn, reference, options, max_examples=budget, seed=seed)
            ref = reference if isinstance(reference, str) else type(reference).__name__
            record = {"label": label, "reference": ref, "budget": budget, "seed": seed}
            records.append({**record, "verdict": v})
            if out is not None:
                out.write(json.dumps(records[-1]) + "\n")
                out.flush()
        print(f"pass {budget} x seed {seed}: done at {time.perf_counter() - t0:.0f} s", flush=True)
    if out is not None:
        out.close()
    lines, unstable = table(records, [b for b, _ in passes])
    print("\n".join(lines))
    print(f"{time.perf_counter() - t0:.0f} s")
    return 1 if unstable else 0


if __name__ == "__main__":
    raise SystemExit(main())
