"""Command line: ``python -m pytest_polgrad which path/to/test_file.py::function``.

Prints which registered semantics a loss function implements, by evaluating it on the
canonical corpus and ranking every point of the loss algebra (see ``diagnose``). Every
problem (a bad spec, a module that does not import, a bad marker, a function the kit
cannot call) is one line on stderr and exit status 2; a function that raises on the corpus
exits 1.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import textwrap
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_polgrad.core.kinds import get_kind
from pytest_polgrad.core.options import did_you_mean, parse_marker
from pytest_polgrad.core.verdicts import Verdict
from pytest_polgrad.pytest.collect import reference_hint

__all__ = ["UsageProblem", "load_function", "main", "which"]

PROG = "python -m pytest_polgrad"


class UsageProblem(Exception):
    """A problem with what the user asked for; printed as one line, exit status 2."""


def _import_failure(where: str, exc: BaseException) -> UsageProblem:
    if isinstance(exc, SyntaxError):
        return UsageProblem(f"{where} has a syntax error: {exc.msg} (line {exc.lineno})")
    last = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return UsageProblem(f"importing {where} raised {last}")


def load_function(spec: str) -> Callable[..., Any]:
    """Import ``path/to/file.py::name`` (or ``package.module::name``) and return the
    callable (taken from the marker for ``name = pytest.mark.polgrad_conforms(...)(obj)``)."""
    where, sep, name = spec.partition("::")
    if not sep or not where.strip() or not name.strip():
        raise UsageProblem(f"expected path/to/file.py::function or module::function, got {spec!r}")
    path = Path(where)
    try:
        if path.suffix == ".py":
            if not path.is_file():
                raise UsageProblem(f"no such file: {where}")
            sys.path.insert(0, str(path.parent.resolve()))
            module_spec = importlib.util.spec_from_file_location(path.stem, path)
            if module_spec is None or module_spec.loader is None:
                raise UsageProblem(f"cannot import {where} as a Python module")
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[path.stem] = module
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except UsageProblem:
        raise
    except (Exception, SystemExit) as exc:
        raise _import_failure(where, exc) from None
    try:
        fn = getattr(module, name)
    except AttributeError:
        raise UsageProblem(
            f"{where} has no attribute {name!r}{did_you_mean(name, dir(module))}"
        ) from None

    if isinstance(fn, pytest.MarkDecorator) and len(fn.args) == 2 and callable(fn.args[1]):
        fn.args[1].pytestmark = [pytest.mark.polgrad_conforms(fn.args[0], **fn.kwargs).mark]
        fn = fn.args[1]
    if not callable(fn):
        raise UsageProblem(f"{spec} is {type(fn).__name__}, not a function")
    return fn  # type: ignore[no-any-return]


def which(fn: Callable[..., Any], options: Any, *, top: int, name: str | None = None) -> str:
    """A readable ranking of the semantics closest to ``fn``; raises ``Verdict`` when
    ``fn`` cannot be evaluated on the canonical corpus."""
    # torch only once a function is ranked: --help and usage errors answer without it
    from pytest_polgrad.core.engine import build_context
    from pytest_polgrad.kinds.policy_loss.diagnose.diagnosis import diagnose, explain

    ctx = build_context(fn, options, name=name)
    if options.kind != "policy_loss":
        return _which_kind(ctx, options)
    # the ranking may hold several points of the algebra that read the same (knobs the
    # description does not print): one row each, ranked by the first of them
    lines = [
        f"{ctx.name} on the canonical corpus ({options.dtype}, {options.advantages} "
        f"advantages, {options.layout} layout), around {options.reference_id!r}:"
    ]
    rows: list[str] = []
    ranked = diagnose(ctx.fut, ctx.config, ctx.tolerance, top=4 * top)
    for m in ranked:
        off = f"{m.error:.3g}" if m.error >= 1.01 else f"{m.error:.6g}"  # never "off by 1x"
        verdict = "MATCH" if m.matches else f"off by {off}x tol"
        row = f"  {verdict:<24} {m.describe()}"
        if row not in rows and len(rows) < top:
            rows.append(row)
    lines += rows
    if not any(m.matches for m in ranked):
        lines.append("  no registered semantics matches within tolerance")
    # the sentence a failure report carries: it weighs the matches (at half precision many
    # match, and the gradient's exact zeros may still place a clip bound elsewhere)
    said = explain(
        ctx.fut,
        ctx.config,
        ctx.tolerance,
        reference=options.reference,
        reference_id=options.reference_id,
    ).text
    lines += ["", "  diagnosis  " + textwrap.fill(said, 88, subsequent_indent=" " * 13)]
    return "\n".join(lines)


def _which_kind(ctx: Any, options: Any) -> str:
    """``which`` for a kind other than the policy loss: the kind's own diagnosis on its
    canonical corpus (what a failure report of that kind carries), one MATCH row."""
    found = get_kind(options.kind).diagnose(ctx, None)
    lines = [
        f"{ctx.name} on the canonical corpus of kind={options.kind!r} ({options.dtype}), "
        f"around {options.reference_id!r}:"
    ]
    if found.match:
        lines.append(f"  {'MATCH':<24} {found.match}")
    else:
        lines.append("  no registered semantics matches within tolerance")
    text = textwrap.fill(found.text, 88, subsequent_indent=" " * 13)
    lines += ["", "  diagnosis  " + text]
    return "\n".join(lines)


def _options(fn: Callable[..., Any], args: argparse.Namespace) -> Any:
    """The function's own marker options when it is marked, command-line flags override."""
    marks = [m for m in getattr(fn, "pytestmark", []) if m.name == "polgrad_conforms"]
    reference, kwargs = ("grpo", {}) if not marks else (marks[0].args[0], dict(marks[0].kwargs))
    for ignored in ("expect", "checks", "max_examples"):
        kwargs.pop(ignored, None)
    for flag in ("advantages", "dtype", "layout"):
        if getattr(args, flag) is not None:
            kwargs[flag] = getattr(args, flag)
    return parse_marker((args.around or reference,), kwargs)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG)
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("which", help="which registered semantics does a loss implement?")
    w.add_argument("function", help="path/to/test_file.py::function")
    w.add_argument("--advantages", choices=("sequence", "token"), default=None)
    w.add_argument("--dtype", choices=("float64", "float32"), default=None)
    w.add_argument("--layout", choices=("right", "left", "packed"), default=None)
    w.add_argument(
        "--around",
        default=None,
        help="registry entry whose settings seed the candidate space (default: the "
        "function's marker reference, else grpo)",
    )
    w.add_argument("--top", type=_positive, default=5, help="rows to print (default 5)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    def fail(message: str, code: int = 2) -> int:
        print(f"{PROG} which: {message}", file=sys.stderr)
        return code

    try:
        fn = load_function(args.function)
        options = _options(fn, args)
        name = args.function.partition("::")[2]
        from pytest_polgrad.core.engine import build_context  # torch: after the usage checks

        try:
            build_context(fn, options, name=name)
        except (AssertionError, ValueError, TypeError) as exc:
            return fail(f"cannot check {name}: {exc}{reference_hint(options, str(exc))}")
        try:
            print(which(fn, options, top=args.top, name=name))
        except Verdict as exc:
            return fail(f"{name} cannot be evaluated on the canonical corpus: {exc}", 1)
    except UsageProblem as exc:
        return fail(str(exc))
    except ValueError as exc:  # MarkerError: a bad marker option
        return fail(f"invalid marker or option: {exc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
