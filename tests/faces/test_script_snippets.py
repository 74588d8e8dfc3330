"""``assert_conforms`` snippets from a plain script say where to run them (new-user trial):
for a function defined in ``check_loss.py`` at a project root, using ``from mypkg.losses
import f``, the snippet said "paste the definition ... then run it" and, saved outside the
project, failed with ``ModuleNotFoundError: mypkg``. Now it names the directory to run
from and puts on ``sys.path`` where the definition's own imports resolve (the script's
directory, where ``mypkg`` was imported from), as the marker's snippets do.

Each script runs as ``python SCRIPT`` (``PYTHONPATH=... python SCRIPT``) would run it
(:func:`tests.helpers.snippet_driver.run_scripts`: in place as ``__main__``, ``sys.path`` starting
with the script's directory and the ``PYTHONPATH`` entries, the project's modules imported
afresh); each snippet, its definition pasted where marked, is saved outside the project
and run from the directory it names (:func:`tests.helpers.snippet_driver.run_snippets`). Both run
in the suite's one snippet interpreter: a process started once, not one per script (what
the reports say depends on ``sys.path``, ``__main__`` and where ``mypkg`` was imported
from, which the driver sets up as ``python SCRIPT`` does, not on a new process).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.helpers.snippet_driver import run_scripts, run_snippets

LOSSES = """
import torch


def f(logprobs, old_logprobs, advantages, response_mask):
    '''DAPO with a symmetric clip 0.2 / 0.2 (DAPO's is 0.2 / 0.28).'''
    r = torch.exp(torch.where(response_mask, logprobs - old_logprobs, 0.0))
    a = advantages[:, None]
    per = torch.maximum(-a * r, -a * r.clamp(0.8, 1.2))
    return torch.where(response_mask, per, 0.0).sum() / response_mask.sum()
"""

WRAPPER = """
def {name}(logprobs, old_logprobs, advantages, response_mask):
    return f(logprobs, old_logprobs, advantages, response_mask)
"""

SCRIPT = """
from pytest_polgrad import ConformanceError, assert_conforms
from mypkg.losses import f
{wrapper}

for fn in {functions}:
    try:
        assert_conforms(fn, "dapo", max_examples=5, checks=("value",))
    except ConformanceError as exc:
        print("=== report ===")
        print(exc)
"""

FIRST = re.compile(r"# pytest-polgrad reproduction: (.*)")
RUN = "save it as a file and run it with python from "
PASTE = re.compile(r"paste the definition of (\w+) where marked, then " + RUN + r"(\S.*)")


def _reports(stdout: str) -> list[str]:
    """The reports a script printed, each after its ``=== report ===`` line."""
    assert not stdout.startswith("FAILED"), stdout
    return stdout.split("=== report ===\n")[1:]


def _snippet(report: str) -> tuple[str, str]:
    """``(instruction, code)`` of a report's reproduce section."""
    body = report.split("\n  reproduce (standalone):\n\n", 1)[1]
    code = body
    match = FIRST.fullmatch(code.splitlines()[0])
    assert match, code
    return match.group(1), code


def _pasted(code: str, name: str) -> str:
    """The snippet with the script's definition of ``name`` and its import pasted."""
    marker = f"# paste its definition (and what it uses) here, named {name}."
    assert marker in code, code
    definition = "from mypkg.losses import f\n\n" + WRAPPER.format(name=name)
    return code.replace(marker, definition)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str, str]]:
    """``{case: (instruction, code as run, directory it was run from)}`` and their stdout
    under ``"<case>/stdout"``: ``imported`` (``f`` itself) and ``script`` (``g`` defined
    in ``check_loss.py``, run as ``python check_loss.py`` from the root), ``elsewhere``
    (``h`` in ``scripts/check_h.py``, run from ``sub/`` with ``PYTHONPATH`` the root)."""
    root = tmp_path_factory.mktemp("project")
    (root / "mypkg").mkdir()
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "losses.py").write_text(LOSSES)
    (root / "check_loss.py").write_text(
        SCRIPT.format(wrapper=WRAPPER.format(name="g"), functions="(f, g)")
    )
    (root / "scripts").mkdir()
    (root / "scripts" / "check_h.py").write_text(
        SCRIPT.format(wrapper=WRAPPER.format(name="h"), functions="(h,)")
    )
    (root / "sub").mkdir()
    printed = run_scripts(
        [
            ("check_loss", root / "check_loss.py", root, ()),
            ("check_h", root / "scripts" / "check_h.py", root / "sub", (root,)),
        ]
    )
    imported, script = _reports(printed["check_loss"])
    (elsewhere,) = _reports(printed["check_h"])
    out: dict[str, tuple[str, str, str]] = {}
    jobs = []
    for case, report, name in (
        ("imported", imported, ""),
        ("script", script, "g"),
        ("elsewhere", elsewhere, "h"),
    ):
        instruction, code = _snippet(report)
        if name:
            match = PASTE.fullmatch(instruction)
            assert match and match.group(1) == name, instruction
            code, cwd = _pasted(code, name), match.group(2)
        else:
            assert instruction.startswith(RUN), instruction
            cwd = instruction[len(RUN) :]
        out[case] = (instruction, code, cwd)
        jobs.append((case, code, cwd))
    ran = run_snippets(jobs, tmp_path_factory.mktemp("saved-elsewhere"))
    for case, stdout in ran.items():
        out[f"{case}/stdout"] = (stdout, "", str(root))
    return out


@pytest.mark.parametrize("case", ["imported", "script", "elsewhere"])
def test_the_snippet_names_where_to_run_it_and_runs_there(
    project: dict[str, tuple[str, str, str]], case: str
) -> None:
    stdout, _, root = project[f"{case}/stdout"]
    assert not stdout.startswith("FAILED"), stdout  # e.g. ModuleNotFoundError: mypkg
    printed = stdout.split()
    assert printed[0] == "function:" and printed[2] == "reference:", stdout
    assert float(printed[1]) != pytest.approx(float(printed[3]), rel=1e-6), stdout
    _, _, cwd = project[case]
    expected = Path(root) / "sub" if case == "elsewhere" else Path(root)
    assert Path(cwd) == expected


def test_a_script_function_puts_the_scripts_directory_on_sys_path(
    project: dict[str, tuple[str, str, str]],
) -> None:
    _, code, _ = project["script"]
    assert "\nsys.path[:0] = ['.']  # where the imports of g's definition resolve" in code
    assert "from __main__" not in code


def test_a_script_elsewhere_names_the_script_and_the_package_directories(
    project: dict[str, tuple[str, str, str]],
) -> None:
    """Run from ``sub/``: the script's directory and the root ``mypkg`` was imported from
    (through ``PYTHONPATH``, which the snippet's interpreter need not have) are outside
    it, so they are absolute."""
    _, code, cwd = project["elsewhere"]
    root = Path(cwd).parent
    line = next(ln for ln in code.splitlines() if ln.startswith("sys.path[:0] = "))
    entries = ast.literal_eval(line.split("  #", 1)[0].split(" = ", 1)[1])
    assert entries == [str(root / "scripts"), str(root), "."], line


def test_an_imported_function_is_imported_from_the_directory_named(
    project: dict[str, tuple[str, str, str]],
) -> None:
    _, code, _ = project["imported"]
    assert "\nsys.path[:0] = ['.']  # the directory to run from" in code
    assert "\nfrom mypkg.losses import f\n" in code
