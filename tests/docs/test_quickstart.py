"""docs/quickstart.md runs as written: every block, in order, in a throwaway project.

Python and TOML blocks are written to the file their ``title="..."`` names (a later block
with the same title replaces the file, as the reader edits it); the TOML dependency block
is parsed and must pin this package. ``console`` blocks hold ``$ command`` lines, each
followed by the lines its output must contain, in order (other lines may come between),
``*`` matching anything and every other character itself. ``pytest`` runs with
``-p no:cacheprovider --polgrad-max-examples=5`` added, in this process
(``pytester.runpytest_inprocess`` through tests/helpers/inline_run.py, Hypothesis's default
profile and the page's environment for the run: the same pytest, arguments, project and
exit status, without another ``import torch``); an ``-n`` run's controller runs here and
its workers are real processes started with the page's environment, as ``pytest -n auto``
starts them. ``python SCRIPT`` runs as ``python SCRIPT`` would from the project
(``tests/helpers/snippet_driver.py``'s ``run_scripts``: in place as ``__main__``, the script's
directory first on ``sys.path``, the project's modules imported afresh), in the suite's
snippet interpreter; any other command as a subprocess. The one ``bash`` block, the
install step, needs the network and is not run: it is checked against the ``Makefile``
(the same torch pin, installed before anything that requires torch).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import inline_run
from tests.helpers.snippet_driver import run_scripts

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest depends on tomli before 3.11
    import tomli as tomllib  # type: ignore[import-not-found,no-redef,unused-ignore]

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "quickstart.md"
FENCE = re.compile(r"^```(\w*)(.*)$")
TITLE = re.compile(r'title="([^"]+)"')
PYTEST_FLAGS = ["-p", "no:cacheprovider", "--polgrad-max-examples=5"]


@dataclasses.dataclass(frozen=True)
class Block:
    lang: str
    title: str | None
    body: str
    line: int


def blocks(text: str) -> list[Block]:
    """The fenced blocks of a markdown page, with their language and ``title``."""
    out: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        start, body = i + 1, []
        i += 1
        while not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        title = TITLE.search(m.group(2))
        out.append(Block(m.group(1), title.group(1) if title else None, "\n".join(body), start))
        i += 1
    return out


def commands(block: Block) -> list[tuple[str, list[str]]]:
    """``[(command, expected output patterns)]`` of a console block."""
    out: list[tuple[str, list[str]]] = []
    for raw in block.body.splitlines():
        if raw.startswith("$ "):
            out.append((raw[2:], []))
        elif raw.strip():
            assert out, f"quickstart.md:{block.line}: output line before any '$ ' command"
            out[-1][1].append(raw)
    return out


def argv(command: str) -> list[str]:
    words = shlex.split(command)
    if words[0] == "pytest":
        return [sys.executable, "-m", "pytest", *words[1:], *PYTEST_FLAGS]
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    return words


def script(command: str) -> str | None:
    """The script of a ``python SCRIPT`` command (no options, no arguments), else None."""
    words = shlex.split(command)
    return words[1] if len(words) == 2 and words[0] == "python" else None


def pattern(line: str) -> re.Pattern[str]:
    """A documented output line: ``*`` matches anything, the rest literally."""
    return re.compile(".*".join(re.escape(part) for part in line.rstrip().split("*")))


def missing(expected: list[str], output: str) -> str | None:
    """The first expected line not found, in order, in ``output`` (None: all found)."""
    lines = iter(line.rstrip() for line in output.splitlines())
    for want in expected:
        regex = pattern(want)
        if not any(regex.fullmatch(line) for line in lines):
            return want
    return None


def test_the_matcher_is_ordered_and_literal() -> None:
    out = "a [x] b\nsecond 12 line\nthird"
    assert missing(["a [x] b", "second * line", "third"], out) is None
    assert missing(["third", "a [x] b"], out) == "a [x] b"  # order matters
    assert missing(["a x b"], out) == "a x b"  # brackets are literal, not a class
    assert missing(["second"], out) == "second"  # a whole line, not a substring


def _env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "HYPOTHESIS_")) and k != "PYTHONPATH"
    }
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def test_page_has_every_step() -> None:
    """The page covers what a framework maintainer needs, with a block for each step."""
    text = PAGE.read_text(encoding="utf-8")
    found = blocks(text)
    titles = {b.title for b in found}
    assert "pyproject.toml" in titles and "check_loss.py" in titles
    run = " ".join(c for b in found if b.lang == "console" for c, _ in commands(b))
    for needed in ("pytest -n auto", "--snapshot-update", "python check_loss.py"):
        assert needed in run, needed
    for needed in ('kind="training_step"', 'kind="kl"', "expect=", "@given(batches())"):
        assert needed in text, needed
    for b in found:
        assert b.lang in {"toml", "python", "console", "bash"}, f"line {b.line}: {b.lang!r}"
        assert b.lang in {"console", "bash"} or b.title, f"line {b.line}: a file block needs title="
    assert [b.lang for b in found].count("bash") == 1, "one install block"


def test_install_block_pins_cpu_torch_before_anything_that_requires_it() -> None:
    """The install step: a fresh venv, then the Makefile's torch pin from PyTorch's CPU
    index, then the kit (from a path), then the project; nothing installed before torch."""
    (install,) = [b for b in blocks(PAGE.read_text(encoding="utf-8")) if b.lang == "bash"]
    lines = [x for x in install.body.splitlines() if x.strip() and not x.startswith("#")]
    assert lines[0].startswith("python3 -m venv ")
    pins = re.findall(r"pip install .*?(torch==[\w.]+)", (ROOT / "Makefile").read_text())
    assert pins and set(pins) == {pins[0]}, pins
    installs = [x for x in lines if " pip install " in f" {x}"]
    assert installs[0].split() == [
        "python", "-m", "pip", "install", pins[0],
        "--index-url", "https://download.pytorch.org/whl/cpu",
    ]  # fmt: skip
    assert installs[1] == "python -m pip install /path/to/pytest-polgrad"
    assert installs[2] == "python -m pip install -e '.[test]'" and len(installs) == 3
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (short,) = [b for b in blocks(readme) if b.lang == "bash" and "pip install" in b.body]
    assert [x.split("#")[0].strip() for x in short.body.splitlines()[1:]] == installs[:2]


def test_dependency_block_pins_this_package() -> None:
    ours = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    (toml,) = [b for b in blocks(PAGE.read_text(encoding="utf-8")) if b.lang == "toml"]
    theirs = tomllib.loads(toml.body)
    deps = [d for group in theirs["project"]["optional-dependencies"].values() for d in group]
    assert f"{ours['name']}=={ours['version']}" in deps


def _run_in_process(pytester: pytest.Pytester, command: str, env: dict[str, str]) -> Any:
    """``(exit status, output)`` of a ``pytest`` command run in this process, with the
    page's environment and Hypothesis's default profile (not this suite's)."""
    from hypothesis import settings

    profile = settings.get_current_profile_name()
    with pytest.MonkeyPatch.context() as mp:
        for name in set(os.environ) - set(env):
            mp.delenv(name)
        for name, value in env.items():
            mp.setenv(name, value)
        mp.setattr(sys, "dont_write_bytecode", True)  # PYTHONDONTWRITEBYTECODE
        settings.load_profile("default")
        try:
            result = inline_run.run(pytester, *argv(command)[3:])
        finally:
            settings.load_profile(profile)
    return int(result.ret), result.stdout.str() + result.stderr.str()


def test_every_block_runs_as_written(pytester: pytest.Pytester) -> None:
    project = pytester.path
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    env = _env()
    for block in blocks(PAGE.read_text(encoding="utf-8")):
        if block.lang == "bash":
            continue  # the install step (test_install_block_pins_cpu_torch_before_...)
        if block.lang != "console":
            assert block.title is not None
            path = project / block.title
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.body + "\n", encoding="utf-8")
            continue
        for command, expected in commands(block):
            if command.startswith("pytest"):
                returncode, output = _run_in_process(pytester, command, env)
            elif (name := script(command)) is not None:
                printed = run_scripts([(name, project / name, project, ())])[name]
                returncode, output = int(printed.startswith("FAILED")), printed
            else:
                proc = subprocess.run(
                    argv(command),
                    cwd=project,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=300,
                    check=False,
                )
                returncode, output = proc.returncode, proc.stdout + proc.stderr
            where = f"quickstart.md:{block.line}: $ {command}\n{output}"
            assert "Traceback (most recent call last)" not in output, where
            if not expected:
                assert returncode == 0, where
            absent = missing(expected, output)
            assert absent is None, f"{where}\nnot found (in order): {absent!r}"
