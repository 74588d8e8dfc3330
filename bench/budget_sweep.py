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
"""

from __future__ import annotations

import argparse
import importlib
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budgets", type=int, nargs="+", default=[5, 20, 100, 300])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--frameworks", action="store_true", help="the tier's adapters too")
    parser.add_argument("--no-registry", action="store_true")
    parser.add_argument("--only", nargs="*", default=None, help="rows whose label contains")
    args = parser.parse_args(argv)
    rows: list[Row] = []
    if not args.no_registry:
        rows += list(registry_rows())
    if args.frameworks:
        rows += list(framework_rows())
    if args.only:
        rows = [r for r in rows if any(s in r[0] for s in args.only)]
    cols = [f"{b} x {len(args.seeds)} seeds" for b in args.budgets]
    print(f"| function | reference | {' | '.join(cols)} |")
    print("|---|---|" + "---|" * len(cols))
    unstable: list[tuple[str, list[str]]] = []
    t0 = time.perf_counter()
    for label, fn, reference, options in rows:
        cells = []
        seen: set[str] = set()
        for budget in args.budgets:
            found = {
                verdict(fn, reference, options, max_examples=budget, seed=s) for s in args.seeds
            }
            seen |= found
            cells.append(next(iter(found)) if len(found) == 1 else " / ".join(sorted(found)))
        ref = reference if isinstance(reference, str) else type(reference).__name__
        print(f"| {label} | {ref} | {' | '.join(cells)} |", flush=True)
        if len(seen) > 1:
            unstable.append((label, sorted(seen)))
    print(f"\n{len(rows)} rows, {time.perf_counter() - t0:.0f} s")
    print(f"budget- or seed-dependent verdicts: {len(unstable)}")
    for label, verdicts in unstable:
        print(f"- {label}: {verdicts}")
    return 1 if unstable else 0


if __name__ == "__main__":
    raise SystemExit(main())
