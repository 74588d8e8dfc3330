"""Rewrite (or ``--check``) every generated block of the docs from its one source.

Blocks sit between ``<!-- BEGIN generated: NAME -->`` and ``<!-- END generated: NAME -->``:

- ``claims`` (README.md, docs/index.md): the claim table of ``tools/claims.py``;
- ``registry`` (docs/registry.md): a card per ``polgrad_reference.ALGORITHMS`` entry;
- ``goldens`` (docs/derivations/goldens.md): ``polgrad_reference.verify.GOLDEN_CASES``;
- ``api`` (docs/api.md): every name of each public package's ``__all__`` (``api_page.py``).

``make docs`` runs ``--check`` before ``mkdocs build --strict``: a stale block fails the
build, and so do a claim naming a test that does not exist and a page of docs/ that
docs/index.md's page table does not link (mkdocs itself fails a page missing from the nav).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import api_page
import claims

ROOT = claims.ROOT


def _registry() -> str:
    from polgrad_reference import ALGORITHMS, describe_algorithm

    parts = [f"{len(ALGORITHMS)} entries.", ""]
    for name in sorted(ALGORITHMS):
        parts += [f"### `{name}`", "", "```text", describe_algorithm(name), "```", ""]
    return "\n".join(parts).rstrip() + "\n"


def _goldens() -> str:
    from polgrad_reference.verify import goldens_markdown

    return goldens_markdown()


BLOCKS: dict[str, tuple[Callable[[], str], tuple[Path, ...]]] = {
    "claims": (
        lambda: claims.render(claims.CLAIMS, "docs/"),
        (ROOT / "README.md",),
    ),
    "claims-docs": (
        lambda: claims.render(claims.CLAIMS, ""),
        (ROOT / "docs" / "index.md",),
    ),
    "registry": (_registry, (ROOT / "docs" / "registry.md",)),
    "goldens": (_goldens, (ROOT / "docs" / "derivations" / "goldens.md",)),
    "api": (api_page.render, (ROOT / "docs" / "api.md",)),
}

INDEX_TABLE_END = "## Every claim is machine-checked"
"""docs/index.md's page table ends at this heading."""


def unindexed_pages(docs: Path = ROOT / "docs") -> list[str]:
    """Pages of ``docs`` (recursively) that the page table of its index.md does not link."""
    table = (docs / "index.md").read_text().split(INDEX_TABLE_END, 1)[0]
    pages = sorted(p.relative_to(docs).as_posix() for p in docs.rglob("*.md"))
    return [
        f"docs/index.md's page table does not link {page}"
        for page in pages
        if page != "index.md" and f"]({page})" not in table
    ]


def _markers(name: str) -> tuple[str, str]:
    tag = "claims" if name.startswith("claims") else name
    return f"<!-- BEGIN generated: {tag} -->\n", f"<!-- END generated: {tag} -->"


def rewritten(path: Path, name: str, block: str) -> str:
    """``path``'s text with block ``name`` replaced by ``block``."""
    begin, end = _markers(name)
    text = path.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"{path.relative_to(ROOT)} has no generated block {name!r}")
    head, rest = text.split(begin, 1)
    return head + begin + block + end + rest.split(end, 1)[1]


def stale() -> list[str]:
    """The files (and blocks) that differ from their source."""
    out = []
    for name, (make, paths) in BLOCKS.items():
        block = make()
        for path in paths:
            if rewritten(path, name, block) != path.read_text():
                out.append(f"{path.relative_to(ROOT)} ({name})")
    return out


def main(argv: list[str]) -> int:
    if "--check" in argv:
        problems = [f"stale generated block: {s}" for s in stale()]
        problems += claims.missing_tests() + unindexed_pages()
        for p in problems:
            print(p, file=sys.stderr)
        if problems:
            print("run: python tools/generate_docs.py", file=sys.stderr)
        return 1 if problems else 0
    for name, (make, paths) in BLOCKS.items():
        block = make()
        for path in paths:
            path.write_text(rewritten(path, name, block))
    print("generated blocks rewritten")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
