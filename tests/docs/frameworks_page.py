"""The blocks of docs/frameworks.md "Marking your own framework code": each a complete test
module of a user's repository (``# tests/NAME.py in your repository`` on its first line).
Those that import a framework helper (``pytest_polgrad.frameworks.verl``/``trl``/
``openrlhf``) or a framework itself run in the frameworks tier
(``tests/frameworks/test_all_docs_marking.py``); the others in the default suite
(``tests/docs/test_frameworks_page.py``)."""

from __future__ import annotations

import re
from pathlib import Path

PAGE = Path(__file__).parents[2] / "docs" / "frameworks.md"
SECTION = PAGE.read_text().split("## Marking your own framework code", 1)[1].split("\n## ", 1)[0]
BLOCKS: list[tuple[str, str]] = re.findall(
    r"```python\n(# tests/(\w+)\.py in your repository\n.*?)```", SECTION, flags=re.S
)
"""``(code, module name)`` of every block of the section, in page order."""

_FRAMEWORK = re.compile(
    r"^from pytest_polgrad\.frameworks import .*\b(verl|trl|openrlhf)\b"
    r"|^(from|import) (verl|trl|openrlhf)\b",
    flags=re.M,
)


def needs_frameworks(code: str) -> bool:
    """Whether the block imports a framework or a framework helper."""
    return _FRAMEWORK.search(code) is not None


TIER = [(code, name) for code, name in BLOCKS if needs_frameworks(code)]
MAIN = [(code, name) for code, name in BLOCKS if not needs_frameworks(code)]
