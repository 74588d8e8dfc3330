"""What a ``polgrad_conforms`` marker asks for, at collection: the functions to check (one
per marker and ``parametrize`` parameter set), their options, checks and item names.

Every marked object either gives items or a collection error that says what to do:

- a ``def`` function (module level, or a method of a ``Test*`` class, bound to a fresh
  instance as pytest does for tests);
- ``name = pytest.mark.polgrad_conforms("grpo")(obj)`` where ``obj`` is a lambda, a
  ``functools.partial`` or a callable instance: pytest does not decorate those (it stores
  them as a marker argument), so the plugin takes the callable from the marker;
- ``@pytest.mark.parametrize`` on a marked function: one set of items per parameter set,
  the parameters bound into the call (``loss[mode=token-mean-dapo-value]``);
- a marked class is a collection error (mark a function that calls it).

Names are the ones pytest collected (the module attribute), never ``__qualname__``, so
functions made by one factory stay apart. Imports torch only once a marker is found.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from pytest_polgrad.core.engine import build_context, kind_of, resolve_config
from pytest_polgrad.core.kinds import CallStore
from pytest_polgrad.core.options import (
    ConformanceOptions,
    MarkerError,
    did_you_mean,
    parse_marker,
    validate_check_names,
)

__all__ = ["Target", "checks_for_options", "param_sets", "reference_hint", "targets"]

MARKER = "polgrad_conforms"


@dataclasses.dataclass(frozen=True)
class Target:
    """One function to check against one reference: what becomes its items."""

    name: str
    """The attribute name pytest collected."""
    param_id: str
    """The parameter set's id (``""`` without ``parametrize``)."""
    fn: Callable[..., Any]
    """The callable checked: parameters bound, methods bound to an instance."""
    options: ConformanceOptions
    checks: tuple[str, ...]
    marks: tuple[pytest.Mark, ...] = ()
    calls: CallStore = dataclasses.field(default_factory=CallStore, compare=False, repr=False)
    """Calls of ``fn`` its items share while screening (one per batch: the value and
    gradient items compare the same call)."""
    verdicts: dict[str, str] = dataclasses.field(default_factory=dict, compare=False, repr=False)
    """Verdict message (numbers masked) -> the first check that reported it in this
    process (the others then show it in two lines)."""

    @property
    def label(self) -> str:
        """The row name in reports: ``loss`` or ``loss[mode=token-mean]``."""
        return f"{self.name}[{self.param_id}]" if self.param_id else self.name

    def item_name(self, check: str) -> str:
        parts = [self.param_id] if self.param_id else []
        return f"{self.name}[{'-'.join([*parts, self.options.reference_id, check])}]"


def _marks(obj: object) -> list[Any]:
    marks = getattr(obj, "pytestmark", [])
    return list(marks) if isinstance(marks, (list, tuple)) else [marks]


def _subject(collector: Any, name: str, obj: object) -> tuple[object, list[Any]] | None:
    """The marked callable and all its marks, or None when ``obj`` is not polgrad's."""
    if isinstance(obj, pytest.MarkDecorator):
        if obj.name != MARKER or len(obj.args) < 2:
            return None  # an alias such as conforms = pytest.mark.polgrad_conforms("grpo")
        if len(obj.args) != 2 or not callable(obj.args[1]):
            raise MarkerError(
                f"takes one positional argument, the reference, got {obj.args!r}; mark a "
                "function: @pytest.mark.polgrad_conforms('grpo') above a def"
            )
        mark = pytest.mark.polgrad_conforms(obj.args[0], **obj.kwargs).mark
        return obj.args[1], [mark, *_marks(obj.args[1])]
    wrapped = isinstance(obj, (staticmethod, classmethod))
    marks = (
        [*_marks(obj), *_marks(obj.__func__)]
        if isinstance(obj, (staticmethod, classmethod))
        else _marks(obj)
    )
    if not any(getattr(m, "name", None) == MARKER for m in marks) and not _param_marked(marks):
        _refuse_uncollected_class(collector, name, obj)
        return None
    if wrapped:  # the function as the class gives it: plain, or bound to the class
        return getattr(collector.obj, name), marks
    if inspect.isclass(obj):
        raise MarkerError(
            f"marks the class {name}; the kit checks functions: mark a def that calls it, "
            f"e.g. def {name.lower()}_loss(logprobs, old_logprobs, advantages, "
            f"response_mask): return {name}()(logprobs=logprobs, ...)"
        )
    if isinstance(collector, pytest.Class):
        try:
            obj = getattr(collector.obj(), name)  # a fresh instance, as for a test method
        except Exception as exc:
            raise MarkerError(
                f"is a method of {collector.name}, which cannot be instantiated without "
                f"arguments ({type(exc).__name__}: {exc}); mark a module-level function"
            ) from None
    if not callable(obj):
        raise MarkerError(f"marks {type(obj).__name__} {obj!r:.60}, which is not callable")
    return obj, marks


def _marked(obj: object) -> bool:
    inner = obj.__func__ if isinstance(obj, (staticmethod, classmethod)) else obj
    return any(getattr(m, "name", None) == MARKER for m in (*_marks(obj), *_marks(inner)))


def _refuse_uncollected_class(collector: Any, name: str, obj: object) -> None:
    """A class pytest does not collect (its name does not match ``python_classes``)
    whose methods carry the marker would generate nothing, silently: an error naming it."""
    matches = getattr(collector, "classnamefilter", None)
    if not inspect.isclass(obj) or not callable(matches) or matches(name):
        return
    marked = sorted(n for n, v in vars(obj).items() if _marked(v))
    if marked:
        raise MarkerError(
            f"marks method(s) {', '.join(marked)} of class {name}, which pytest does not "
            "collect (its name does not match python_classes, e.g. Test*): rename the "
            "class or mark a module-level function"
        )


def _param_marked(marks: list[Any]) -> bool:
    """Whether a ``pytest.param`` of a ``parametrize`` mark carries a polgrad marker."""
    for mark in marks:
        values = (
            mark.args[1]
            if getattr(mark, "name", None) == "parametrize" and len(mark.args) > 1
            else None
        )
        if not isinstance(values, (list, tuple)):
            continue  # a generator is read once, by the items' own collection
        for value in values:
            if type(value).__name__ == "ParameterSet" and any(
                getattr(getattr(m, "mark", m), "name", None) == MARKER for m in value.marks
            ):
                return True
    return False


def _idval(value: object, argname: str, index: int) -> str:
    if isinstance(value, (str, int, float, bool)) or value is None:
        text = str(value)
        return text if text.isprintable() and text else f"{argname}{index}"
    enum_name = getattr(value, "name", None)
    if isinstance(enum_name, str) and type(value).__module__ != "builtins":
        return enum_name
    return f"{argname}{index}"


def _one_mark(mark: Any) -> list[tuple[str, dict[str, Any], tuple[Any, ...]]]:
    args = dict(zip(("argnames", "argvalues"), mark.args, strict=False))
    args.update(mark.kwargs)
    if args.get("indirect"):
        raise MarkerError(
            "parametrize(indirect=...) is not supported: marked functions take no fixtures"
        )
    names = args.get("argnames")
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    names = list(names or ())
    values = list(args.get("argvalues", ()))
    ids = args.get("ids")
    out = []
    for index, raw in enumerate(values):
        marks: tuple[Any, ...] = ()
        explicit = None
        if type(raw).__name__ == "ParameterSet":  # pytest.param(...)
            row, marks, explicit = tuple(raw.values), tuple(raw.marks), raw.id
        else:
            row = (raw,) if len(names) == 1 else tuple(raw)
        if len(row) != len(names):
            raise MarkerError(
                f"parametrize({','.join(names)!r}): parameter set {index} has {len(row)} "
                f"value(s) for {len(names)} name(s)"
            )
        if explicit is None and ids is not None:
            explicit = ids(raw) if callable(ids) else list(ids)[index]
        pid = (
            str(explicit)
            if explicit is not None
            else ",".join(f"{n}={_idval(v, n, index)}" for n, v in zip(names, row, strict=True))
        )
        out.append((pid, dict(zip(names, row, strict=True)), marks))
    return out


def param_sets(marks: Iterable[Any]) -> list[tuple[str, dict[str, Any], tuple[Any, ...]]]:
    """``(id, parameters, marks)`` for every combination of the ``parametrize`` marks."""
    sets: list[tuple[str, dict[str, Any], tuple[Any, ...]]] = [("", {}, ())]
    for mark in marks:
        if getattr(mark, "name", None) != "parametrize":
            continue
        sets = [
            ("-".join(filter(None, (pid, qid))), {**params, **more}, (*m1, *m2))
            for pid, params, m1 in sets
            for qid, more, m2 in _one_mark(mark)
        ]
    return sets


def _bind(fn: Callable[..., Any], params: Mapping[str, Any], label: str) -> Callable[..., Any]:
    accepted: Mapping[str, inspect.Parameter]
    try:
        accepted = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        accepted = {}
    unknown = [p for p in params if p not in accepted]
    if unknown and not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
        raise MarkerError(
            f"parametrize names {unknown}, which the function does not take "
            f"(its parameters: {list(accepted)})"
        )
    bound = functools.partial(fn, **params)
    bound.__name__ = getattr(fn, "__name__", label)  # type: ignore[attr-defined]
    bound.__qualname__ = label  # type: ignore[attr-defined]
    bound.__module__ = getattr(fn, "__module__", __name__)
    return bound


def reference_hint(options: ConformanceOptions, message: str) -> str:
    """``" (did you mean ...?)"`` for ``message``, the error of resolving ``options``: the
    closest choice to the value a "must be one of ..., got 'x'" message rejects, else the
    closest registered name to an unknown reference; nothing for a reference the registry
    knows (the error is about another argument)."""
    if "did you mean" in message:
        return ""
    if m := re.search(r"must be one of (.*), got '([^']*)'", message):
        return did_you_mean(m[2], re.findall(r"'([^']*)'", m[1]))
    ref = options.reference
    if not isinstance(ref, str):
        return ""
    known: list[str] = []
    if options.kind in ("policy_loss", "training_step"):
        from polgrad_reference import ALGORITHMS  # torch: not at the plugin's load

        known = list(ALGORITHMS)
    elif m := re.search(r"(?:known|one of)[:]? (.*)$", message):
        known = re.findall(r"[\w.-]+", m[1])
    return "" if ref in known else did_you_mean(ref, known)


def checks_for_options(options: ConformanceOptions, config: object) -> tuple[str, ...]:
    """The checks that generate items for ``options`` (``golden`` last), validated:
    unknown names get "did you mean", ``expect=`` entries must name running checks."""
    kind = kind_of(options)
    unrestricted = dataclasses.replace(options, checks=None) if options.checks else options
    applicable = [c.name for c in kind.checks(config, unrestricted)]
    applicable += [  # checks a kind runs only when checks= names them (opt-in)
        c.name for c in kind.checks(config, options) if c.name not in applicable
    ]
    if options.kind != "policy_loss":  # the policy loss is validated by its static list
        named = [*options.expect, *(options.checks or ())]
        unknown = [n for n in named if n != "golden" and n not in applicable and not kind.check(n)]
        if unknown:
            validate_check_names(options, (*applicable, "golden"))
    running = [n for n in applicable if options.checks is None or n in options.checks]
    if options.checks is None or "golden" in options.checks:
        running.append("golden")
    stray = sorted(set(options.expect) - set(running))
    if stray:
        raise MarkerError(
            f"expect= names {stray}, check(s) that do not run for this reference and options "
            f"(running: {running})"
        )
    if not running:
        raise MarkerError(
            f"no polgrad check applies (checks={options.checks!r}; this reference and "
            f"options run: {[*applicable, 'golden']})"
        )
    return tuple(running)


def _step_parameters(fn: Callable[..., Any]) -> None:
    """A training step's required parameter the kit cannot fill is one collection error
    (as the policy loss's), not a ``TypeError`` on every run."""
    from pytest_polgrad.core.calls import ALIASES, resolve_parameters  # torch: not at load
    from pytest_polgrad.kinds.training_step.kind import INFO_FIELDS, TENSORS  # torch: as above

    resolve_parameters(fn, (*TENSORS, *INFO_FIELDS, "step"), aliases=ALIASES, strict=True)


_UNMARKABLE = re.compile(
    r"in <module>\n\s+(?P<line>.+)\n(?s:.*)in store_mark\n(?s:.*)"
    r"AttributeError: '(?P<type>[^']+)' object has no attribute 'pytestmark'"
)


def unmarkable(path: object, error: str) -> str | None:
    """One line for a module that failed to import because a polgrad marker was applied
    to an object that cannot carry a mark (a builtin such as ``len``): pytest's mark
    machinery raises a raw ``AttributeError`` there. ``None`` for any other error, or a
    file that does not use the marker."""
    found = _UNMARKABLE.search(error)
    try:
        uses = found is not None and MARKER in Path(str(path)).read_text(errors="replace")
    except OSError:
        uses = False
    if found is None or not uses:
        return None
    return (
        f"invalid @pytest.mark.{MARKER}: `{found['line'].strip()}` marks a "
        f"{found['type']}, which cannot carry a mark; mark a def that calls it"
    )


def targets(collector: Any, name: str, obj: object) -> list[Target] | None:
    """The targets ``obj`` (collected as ``name``) asks for; None when it is not marked.
    Raises :class:`MarkerError` with what to do when the marker cannot work."""
    subject = _subject(collector, name, obj)
    if subject is None:
        return None
    fn, marks = subject
    assert callable(fn)
    function_marks = [m for m in marks if getattr(m, "name", None) == MARKER]
    others = tuple(m for m in marks if getattr(m, "name", None) not in (MARKER, "parametrize"))
    found: list[Target] = []
    for pid, params, param_marks in param_sets(marks):
        own = [getattr(m, "mark", m) for m in param_marks]
        # pytest.param(..., marks=pytest.mark.polgrad_conforms(...)) replaces the
        # function's markers for that parameter set (e.g. one reference per mode).
        polgrad = [m for m in own if m.name == MARKER] or function_marks
        rest = tuple(m for m in own if m.name != MARKER)
        label = f"{name}[{pid}]" if pid else name
        if not polgrad:
            raise MarkerError(
                f"parameter set {pid!r} has no {MARKER} marker (mark the function, or give "
                "every pytest.param its own)"
            )
        bound = _bind(fn, params, label) if params else fn
        seen: set[str] = set()
        for mark in polgrad:
            options = parse_marker(tuple(mark.args), dict(mark.kwargs))
            try:
                config = resolve_config(options)
            except (ValueError, TypeError) as exc:
                raise MarkerError(f"{exc}{reference_hint(options, str(exc))}") from exc
            if options.reference_id in seen:
                raise MarkerError(
                    f"two {MARKER} markers share the id {options.reference_id!r}; give one "
                    "of them id='...'"
                )
            seen.add(options.reference_id)
            checks = checks_for_options(options, config)
            try:
                build_context(bound, options, name=label)  # signature problems surface here
                if options.kind == "training_step":
                    _step_parameters(bound)
            except (AssertionError, ValueError, TypeError) as exc:
                raise MarkerError(f"cannot check {label}: {exc}") from exc
            found.append(Target(name, pid, bound, options, checks, (*others, *rest)))
    return found
