"""The documentation site is checked for real: ``make docs``'s mkdocs command fails a broken
link and a page missing from the navigation (a ``--quiet`` that silenced the warnings
``--strict`` counts once let both exit 0), docs/index.md's page table links every page, and
docs/api.md lists every public name of each package's ``__all__``.

The build tests run the command of the Makefile's ``docs`` recipe on a throwaway two-page
site with the project's own mkdocs.yml settings (theme, validation, strictness), less the
mkdocstrings plugin and the project's pages, so that each build takes a second or two.
``make docs`` runs this module (mkdocs is installed there); elsewhere, without mkdocs, the
build tests are skipped.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tool(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"polgrad_{name}", ROOT / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    return module


def _make_docs_mkdocs_args() -> list[str]:
    """The arguments the Makefile's ``docs`` recipe passes to mkdocs."""
    recipe = (ROOT / "Makefile").read_text().split("\ndocs:", 1)[1].split("\n\n", 1)[0]
    (line,) = [ln for ln in recipe.splitlines() if "bin/mkdocs " in ln]
    words = shlex.split(line)
    return words[next(i for i, w in enumerate(words) if w.endswith("bin/mkdocs")) + 1 :]


def _site(tmp_path: Path, pages: dict[str, str], nav: list[str]) -> Path:
    yaml = pytest.importorskip("yaml")
    config: dict[str, Any] = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config["plugins"] = [p for p in config.get("plugins", []) if p == "search"]
    config["docs_dir"] = str(tmp_path / "docs")
    config["site_dir"] = str(tmp_path / "site")
    config["nav"] = nav
    (tmp_path / "docs").mkdir()
    for name, text in pages.items():
        (tmp_path / "docs" / name).write_text(text)
    path = tmp_path / "mkdocs.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def _build(config: Path) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("mkdocs")
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", *_make_docs_mkdocs_args(), "-f", str(config)],
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
        timeout=120,
        check=False,
    )


GOOD = {
    "index.md": "# Home\n\nSee [the other page](other.md#a-section).\n",
    "other.md": "# Other\n\n## A section\n\nBack [home](index.md).\n",
}


def test_the_make_docs_build_is_strict_without_quiet() -> None:
    args = _make_docs_mkdocs_args()
    assert args[0] == "build" and "--strict" in args
    assert not {"-q", "--quiet"} & set(args)


def test_a_sound_site_builds(tmp_path: Path) -> None:
    result = _build(_site(tmp_path, GOOD, ["index.md", "other.md"]))
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    pages = {**GOOD, "other.md": GOOD["other.md"] + "\nSee [missing](no-such-page.md).\n"}
    result = _build(_site(tmp_path, pages, ["index.md", "other.md"]))
    assert result.returncode != 0
    assert "no-such-page.md" in result.stderr


def test_a_page_missing_from_the_nav_fails_the_build(tmp_path: Path) -> None:
    result = _build(_site(tmp_path, GOOD, ["index.md"]))
    assert result.returncode != 0
    assert "other.md" in result.stderr


# ------------------------------------------------------------------------ the page table


def test_the_index_links_every_page() -> None:
    assert _tool("generate_docs").unindexed_pages() == []


def test_a_page_missing_from_the_index_is_reported(tmp_path: Path) -> None:
    (tmp_path / "derivations").mkdir()
    (tmp_path / "index.md").write_text(
        "| page |\n|---|\n| [a.md](a.md) |\n\n## Every claim is machine-checked\n[b.md](b.md)\n"
    )
    for page in ("a.md", "b.md", "derivations/c.md"):
        (tmp_path / page).write_text("# x\n")
    assert _tool("generate_docs").unindexed_pages(tmp_path) == [
        "docs/index.md's page table does not link b.md",
        "docs/index.md's page table does not link derivations/c.md",
    ]


# -------------------------------------------------------------------------- the API page


def _api_sections() -> dict[str, str]:
    text = (ROOT / "docs" / "api.md").read_text()
    parts = re.split(r"^## `([\w.]+)`$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_the_api_page_lists_every_public_name() -> None:
    api_page = _tool("api_page")
    sections = _api_sections()
    extra = (ROOT / "docs" / "api.md").read_text().split("## Exported by a submodule only", 1)
    missing = []
    for full in api_page.every_public_name():
        for package in sorted(sections, key=len, reverse=True):
            if full.startswith(package + ".") and "." not in full[len(package) + 1 :]:
                if f"| `{full[len(package) + 1 :]}` |" not in sections[package]:
                    missing.append(full)
                break
        else:
            module, name = full.rsplit(".", 1)
            if len(extra) < 2 or f"| `{name}` | `{module}` |" not in extra[1]:
                missing.append(full)
    assert missing == []


def test_the_names_the_issue_found_missing_are_listed() -> None:
    # issue 27: none of these was on any page of the docs.
    names = set(_tool("api_page").every_public_name())
    for name in (
        "pytest_polgrad.ConformanceError",
        "pytest_polgrad.CHECKS",
        "pytest_polgrad.CheckResult",
        "pytest_polgrad.canonical_corpus",
        *(
            f"polgrad_reference.{n}"
            for n in (
                "ClipBounds",
                "ISWeight",
                "KLRatioWeight",
                "MicroBatchScaling",
                "PolgradError",
                "SingletonGroup",
                "SurrogateParams",
                "Unstated",
                "WhitenEps",
            )
        ),
    ):
        assert name in names
        package, short = name.rsplit(".", 1)
        assert f"| `{short}` |" in _api_sections()[package]
