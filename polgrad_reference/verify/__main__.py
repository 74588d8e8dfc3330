"""``python -m polgrad_reference.verify``: rewrite the generated block of
``docs/derivations/goldens.md`` from :data:`GOLDEN_CASES` (run from the repository root)."""

from __future__ import annotations

import sys
from pathlib import Path

from .goldens import goldens_markdown

BEGIN, END = "<!-- BEGIN generated: goldens -->\n", "<!-- END generated: goldens -->"


def main() -> int:
    page = Path("docs/derivations/goldens.md")
    if not page.is_file():
        print(f"{page} not found: run from the repository root", file=sys.stderr)
        return 2
    text = page.read_text()
    if BEGIN not in text or END not in text:
        print(f"{page} has no generated-block markers", file=sys.stderr)
        return 2
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    page.write_text(head + BEGIN + goldens_markdown() + END + tail)
    print(f"rewrote the generated block of {page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
