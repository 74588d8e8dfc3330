"""How many pooled training steps flag each scaling mutant, without the corpus (issue 32).

For every mutant of ``tests/kinds/training_step/test_kind.py::MUTANTS``, the pool of its
check (seed 0, the default budget less the corpus) is screened step by step with the
check of the mutant's split family (``kind.check_split``); the line gives, per mutant,
the steps that flag it over the steps whose rows allow the family. Run from a checkout
(``PYTHONPATH=<tree> python bench/step_power.py``) to compare two trees' pools.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch

# bench/ holds modules named as the project's packages: off the path; the repository root
# (for tests.*) last, so a PYTHONPATH tree comes first
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE] + [str(_HERE.parent)]

from pytest_polgrad.core.engine import _pool, build_context, check_of, kind_of  # noqa: E402
from pytest_polgrad.core.options import parse_marker  # noqa: E402
from pytest_polgrad.core.verdicts import CheckFailure, Verdict  # noqa: E402
from pytest_polgrad.kinds.training_step.kind import check_split  # noqa: E402
from tests.kinds.training_step.test_kind import MUTANTS  # noqa: E402


def main() -> None:
    torch.set_num_threads(1)
    out = []
    for fn, family, _named in MUTANTS:
        options = parse_marker(("dapo",), {"kind": "training_step"})
        step = cast("Callable[..., Any]", fn)
        ctx = build_context(step, options)
        kind = kind_of(options)
        drawn, extra = _pool(kind, ctx, check_of(kind, ctx, family), 0, 92)
        steps = [item for item in (*drawn, *extra) if family in item.splits]
        flagged = 0
        for item in steps:
            try:
                check_split(ctx, {**item.batch, "split": item.splits[family]})
            except (CheckFailure, Verdict):
                flagged += 1
        out.append(f"{fn.__name__} ({family}): {flagged}/{len(steps)}")
    print("; ".join(out))


if __name__ == "__main__":
    main()
