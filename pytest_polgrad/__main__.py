"""Command line: ``python -m pytest_polgrad which path/to/test_file.py::function``.

Prints which registered semantics a loss function implements, by evaluating it on the
canonical corpus and ranking every point of the loss algebra (see ``diagnose``).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["main"]


def load_function(spec: str) -> Callable[..., Any]:
    """Import ``path/to/file.py::name`` (or ``package.module::name``) and return the object."""
    if "::" not in spec:
        raise SystemExit(f"expected path/to/file.py::function, got {spec!r}")
    where, name = spec.split("::", 1)
    path = Path(where)
    if path.suffix == ".py":
        if not path.is_file():
            raise SystemExit(f"no such file: {where}")
        sys.path.insert(0, str(path.parent.resolve()))
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[path.stem] = module
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    try:
        fn = getattr(module, name)
    except AttributeError:
        raise SystemExit(f"{where} has no attribute {name!r}") from None
    if not callable(fn):
        raise SystemExit(f"{spec} is not callable")
    return fn  # type: ignore[no-any-return]


def which(fn: Callable[..., Any], options: Any, *, top: int) -> str:
    """A readable ranking of the semantics closest to ``fn``."""
    from .diagnose import diagnose
    from .engine import build_context
    from .target import Verdict

    ctx = build_context(fn, options)
    try:
        matches = diagnose(ctx.fut, ctx.config, ctx.tolerance, top=top)
    except Verdict as exc:
        return f"{ctx.fut.name}: cannot be evaluated: {exc}"
    lines = [
        f"{ctx.fut.name} on the canonical corpus ({options.dtype}, {options.advantages} "
        f"advantages, {options.layout} layout), around {options.reference_id!r}:"
    ]
    for m in matches:
        verdict = "MATCH" if m.matches else f"off by {m.error:.3g}x tol"
        lines.append(f"  {verdict:<24} {m.describe()}")
    if not any(m.matches for m in matches):
        lines.append("  no registered semantics matches within tolerance")
    return "\n".join(lines)


def _options(fn: Callable[..., Any], args: argparse.Namespace) -> Any:
    """The function's own marker options when it is marked, command-line flags override."""
    from .options import parse_marker

    marks = [m for m in getattr(fn, "pytestmark", []) if m.name == "polgrad_conforms"]
    reference, kwargs = ("grpo", {}) if not marks else (marks[0].args[0], dict(marks[0].kwargs))
    kwargs.pop("expect", None)
    kwargs.pop("checks", None)
    for flag in ("advantages", "dtype", "layout"):
        if getattr(args, flag) is not None:
            kwargs[flag] = getattr(args, flag)
    return parse_marker((args.around or reference,), kwargs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_polgrad")
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
    w.add_argument("--top", type=int, default=5)
    args = parser.parse_args(argv)
    fn = load_function(args.function)
    print(which(fn, _options(fn, args), top=args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
