"""Print one full pytest-polgrad failure report, from plain Python (``make demo`` runs it).

The mini trainer's 'GRPO' launched with the trainer's default aggregation is checked
against the GRPO paper's semantics with ``assert_conforms``; the report names the
property, the smallest failing batch as a runnable snippet, the numbers side by side
and the semantics the function does implement.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from test_minitrainer_conformance import grpo_by_default_settings

from pytest_polgrad import ConformanceError, assert_conforms


def main() -> None:
    try:
        assert_conforms(grpo_by_default_settings, "grpo", advantages="token", checks=["value"])
    except ConformanceError as err:
        print(err)
    else:
        raise SystemExit("expected a conformance failure: the demo's premise is broken")


if __name__ == "__main__":
    main()
