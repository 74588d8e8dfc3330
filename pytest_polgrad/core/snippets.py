"""The kind-independent half of reproduction snippets: standalone Python that rebuilds a
failing input, calls the function exactly as the check did and the float64 reference, and
prints what the check compared. Each kind writes its own ``run`` / ``reference`` and check
lines (the policy loss's in :mod:`pytest_polgrad.kinds.policy_loss.snippet`); this module
gives every kind how the snippet gets the function, the shared helpers and the assembly.

Where the function is importable the snippet imports it under the name pytest collected
(and puts the directory pytest imported its module from on ``sys.path``, relative to the
directory the report names); where it is not (defined in ``__main__``, a closure, a
lambda) the snippet says where to paste its definition, and puts on ``sys.path`` the
directories that definition's own imports resolve from (a script's directory, as
``python check_loss.py`` has it, and where the modules it uses were imported from), so
the snippet runs from the directory it names when saved outside the project.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import functools
import os
import shlex
import sys
import sysconfig
import types
from pathlib import Path
from typing import Any

__all__ = [
    "Importable",
    "check_lines",
    "config_import",
    "config_source",
    "how_to_run",
    "import_lines",
    "importable",
    "kind_snippet",
    "pick_line",
]


def config_source(value: Any) -> str:
    """Valid Python that rebuilds a (nested) config dataclass."""
    if isinstance(value, enum.Enum):
        return repr(value.value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        args = ", ".join(
            f"{f.name}={config_source(getattr(value, f.name))}" for f in dataclasses.fields(value)
        )
        return f"{type(value).__name__}({args})"
    return repr(value)


def _config_types(value: Any, out: set[str]) -> set[str]:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out.add(type(value).__name__)
        for f in dataclasses.fields(value):
            _config_types(getattr(value, f.name), out)
    return out


@dataclasses.dataclass(frozen=True)
class Importable:
    """How a snippet gets the function: ``from module import attribute`` with ``path``
    (relative to ``run_from``, or absolute) put first on ``sys.path``; ``module`` is None
    when the function cannot be imported (``reason`` says why)."""

    attribute: str
    module: str | None
    path: str | None
    run_from: str
    reason: str = ""
    bound: str = ""
    """``functools.partial`` keywords as source (``"mode='token-mean'"``) for a function
    collected with ``@pytest.mark.parametrize`` parameters bound in."""
    search: tuple[str, ...] = ()
    """For a function that cannot be imported: the ``sys.path`` entries its pasted
    definition's imports resolve from (relative to ``run_from``, or absolute), ``'.'``
    (the directory to run from) last (:func:`search_path`)."""

    @property
    def call(self) -> str:
        """The name the snippet calls the function by: ``attribute``, or
        ``<attribute>_under_test`` when the snippet uses that name itself (a loss named
        ``loss``, an estimator named ``advantages``)."""
        return f"{self.attribute}_under_test" if self.attribute in SNIPPET_NAMES else self.attribute


SNIPPET_NAMES = frozenset(
    {
        # modules and helpers the snippets import or define
        "torch", "sys", "functools", "run", "reference", "same", "show", "at_padding",
        "policy_loss", "config", "PARAMS", "inputs",
        # names assigned in their bodies
        "loss", "loss2", "part_loss", "grad", "grad2", "out", "out2", "kw", "batch",
        "expected", "expected_grad", "mask", "diff", "gdiff", "t", "before", "passed",
        "name", "param", "total", "scale", "width", "other", "noise", "fill", "extents",
        "ref_inputs", "lp", "value", "result", "split", "info", "mb", "rows", "pos", "where",
        # the input tensors, bound at module level
        "logprobs", "old_logprobs", "advantages", "response_mask", "ref_logprobs",
        "rollout_logprobs", "rewards", "group_ids", "values", "old_values", "returns",
        "logits", "token_rewards", "dones", "loss_mat", "loss_mask",
    }
)  # fmt: skip


def _import_root(module: Any) -> Path | None:
    """The ``sys.path`` entry ``module`` was imported from (its file minus its dotted name)."""
    file = getattr(module, "__file__", None)
    if not file:
        return None
    path = Path(file).resolve()
    parts = module.__name__.split(".")
    root = path.parent if path.name != "__init__.py" else path.parent.parent
    for _ in parts[:-1]:
        root = root.parent
    return root


def _outside_the_project(root: Path) -> bool:
    """Whether ``root`` is the standard library or an installed packages' directory
    (which a fresh interpreter has on ``sys.path`` anyway)."""
    if {"site-packages", "dist-packages"} & set(root.parts):
        return True
    paths = sysconfig.get_paths()
    stdlib = {Path(paths[k]).resolve() for k in ("stdlib", "platstdlib") if k in paths}
    return any(root == lib or lib in root.parents for lib in stdlib)


def _used_names(code: types.CodeType) -> set[str]:
    """The global names ``code`` and the functions and classes defined in it read."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _used_names(const)
    return names


def _entry(root: Path, run_from: str) -> str:
    rel = os.path.relpath(root, run_from)
    return rel if not rel.startswith("..") else str(root)


def search_path(fn: Any, run_from: str) -> tuple[str, ...]:
    """The ``sys.path`` entries a pasted definition of ``fn`` needs for its own imports:
    the directory of the script it is defined in (``sys.path[0]`` of ``python
    script.py``) or the root its module was imported from, then the roots of the
    project's modules it reads (``from mypkg.losses import f`` in the script: where
    ``mypkg`` was imported from), relative to ``run_from`` where inside it; ``'.'`` last.
    Installed packages and the standard library are left out (a fresh interpreter finds
    them)."""
    fn = _unwrap(fn)
    roots: list[Path] = []
    module_name = getattr(fn, "__module__", None)
    module = sys.modules.get(module_name) if module_name else None
    scope: dict[str, Any] = getattr(fn, "__globals__", None) or {}
    file = scope.get("__file__")
    if module_name == "__main__" or module is None:
        if isinstance(file, str) and file:
            roots.append(Path(file).resolve().parent)
    else:
        root = _import_root(module)
        if root is not None:
            roots.append(root)
    code = getattr(fn, "__code__", None)
    for name in sorted(_used_names(code)) if code is not None else []:
        value = scope.get(name)
        if value is None:
            continue
        used = value if isinstance(value, types.ModuleType) else None
        if used is None:
            try:  # a lazy proxy's attribute access may raise anything
                used = sys.modules.get(str(getattr(value, "__module__", "") or ""))
            except Exception:
                continue
        if used is None or used.__name__ == "__main__":
            continue
        root = _import_root(used)
        if root is not None:
            roots.append(root)
    out: list[str] = []
    for root in roots:
        entry = _entry(root, run_from)
        if entry != "." and entry not in out and not _outside_the_project(root):
            out.append(entry)
    return (*out, ".")


def _unwrap(fn: Any) -> Any:
    """The plain function behind ``functools.partial`` layers."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def _bound_source(fn: Any) -> str | None:
    """The keywords of a ``functools.partial`` without positional arguments as source,
    if each value's ``repr`` reads back equal (None otherwise)."""
    if fn.args:
        return None
    parts = []
    for key, value in fn.keywords.items():
        try:
            same = bool(ast.literal_eval(repr(value)) == value)
        except (ValueError, SyntaxError, TypeError):
            same = False
        if not same:
            return None
        parts.append(f"{key}={value!r}")
    return ", ".join(parts)


def importable(fn: Any, name: str = "") -> Importable:
    """Where ``fn`` can be imported from: under ``name`` (the collected name, ``[...]``
    parameters stripped) or its ``__name__``, if the module's attribute is ``fn``; a
    ``functools.partial`` (parametrized function) through the function it binds."""
    if isinstance(fn, functools.partial):
        bound = _bound_source(fn)
        inner = importable(fn.func, name)
        if bound is not None and inner.module is not None:
            return dataclasses.replace(inner, bound=bound)
        reason = inner.reason or "its bound parameters are not Python literals"
        search = inner.search or search_path(fn, inner.run_from)
        return dataclasses.replace(inner, module=None, path=None, reason=reason, search=search)
    run_from = os.getcwd()
    candidates = [n for n in (name.split("[")[0], getattr(fn, "__name__", "")) if n.isidentifier()]
    module_name = getattr(fn, "__module__", None)
    module = sys.modules.get(module_name) if module_name else None
    attribute = candidates[0] if candidates else "fn"
    if module is None or module_name == "__main__":
        where = "in __main__ (a script or an interactive session)"
        return Importable(attribute, None, None, run_from, where, search=search_path(fn, run_from))
    found = [n for n in candidates if getattr(module, n, None) is fn]
    found = found or [k for k, v in vars(module).items() if v is fn and k.isidentifier()]
    if not found:  # made by a factory elsewhere (e.g. a framework adapter), bound to a name
        holder = _holder(fn, candidates)
        if holder is None:
            return Importable(
                attribute,
                None,
                None,
                run_from,
                f"not as a top-level name of {module_name}",
                search=search_path(fn, run_from),
            )
        module, module_name = holder
        found = [n for n in candidates if getattr(module, n, None) is fn]
    root = _import_root(module)
    path = None
    if root is not None and not {"site-packages", "dist-packages"} & set(root.parts):
        path = _entry(root, run_from)
    return Importable(found[0], str(module_name), path, run_from)


def _holder(fn: Any, names: list[str]) -> tuple[Any, str] | None:
    """The loaded module (outside site-packages; the first by name) that holds ``fn`` as a
    top-level attribute under one of ``names``: where a function made by a factory in
    another module was bound, e.g. ``loss = mark(...)(adapter(...))`` in a test module."""
    for module_name, module in sorted(sys.modules.items()):
        file = getattr(module, "__file__", None) or ""
        if not file or "site-packages" in file or "dist-packages" in file:
            continue
        try:
            if any(getattr(module, n, None) is fn for n in names):
                return module, module_name
        except Exception:  # a module whose attribute access raises
            continue
    return None


def how_to_run(where: Importable) -> str:
    """What to do with the snippet: run it from ``where.run_from`` (the ``sys.path`` entries
    it adds are relative to it; shell-quoted, :func:`shlex.quote`), first pasting the
    definition of a function it cannot import."""
    run = f"save it as a file and run it with python from {shlex.quote(where.run_from)}"
    if where.module is not None:
        return run
    return f"paste the definition of {where.attribute} where marked, then {run}"


def import_lines(where: Importable) -> list[str]:
    """``import torch`` and the lines that give the snippet the function under the name
    ``where.attribute``: ``sys.path`` (the directory pytest imported the module from and
    the directory to run from), the import, the ``functools.partial`` rebinding of a
    parametrized function, or where to paste a function that cannot be imported."""
    alias = "" if where.call == where.attribute else f" as {where.call}"
    if where.module is None:
        lines = ["import sys", "", "import torch", ""] if where.search else ["import torch", ""]
        if where.search:
            lines.append(
                f"sys.path[:0] = {list(where.search)!r}  # where the imports of "
                f"{where.attribute}'s definition resolve (the directory of the script "
                "or module it is defined in, the project's modules it uses), and the "
                "directory to run from"
            )
        lines += [
            f"# {where.attribute} cannot be imported ({where.reason}):",
            f"# paste its definition (and what it uses) here, named {where.attribute}.",
            "",
        ]
        if alias:
            lines += [f"{where.call} = {where.attribute}  # the name the snippet calls", ""]
    elif where.path is not None:
        lines = [
            "import sys",
            "",
            "import torch",
            "",
            f"sys.path[:0] = {[where.path, '.']!r}  # where {where.module} was imported "
            "from, and the directory to run from (the project's own packages)"
            if where.path != "."
            else f"sys.path[:0] = ['.']  # the directory to run from: where {where.module} "
            "was imported from (the project's own packages)",
            f"from {where.module} import {where.attribute}{alias}",
        ]
    else:
        lines = ["import torch", "", f"from {where.module} import {where.attribute}{alias}"]
    if where.bound:
        lines.insert(0, "import functools")
        lines.append(
            f"{where.call} = functools.partial({where.call}, {where.bound})"
            "  # the parametrize parameters of the item"
        )
    return lines


def config_import(cfg: Any) -> str:
    """``from polgrad_reference import ...``: the config classes :func:`config_source`
    writes for ``cfg``, and ``policy_loss``."""
    names = sorted(_config_types(cfg, set()))
    return f"from polgrad_reference import {', '.join([*names, 'policy_loss'])}"


# ---------------------------------------------------------------- the other kinds' snippets
#
# Every kind's snippet has one shape: the function imported as above, the inputs as
# literals (``inputs``: canonical tensors by name), ``run(inputs)`` calling the function
# exactly as the check did and returning ``(out, grad, passed, before)`` (the result in the
# canonical layout, the gradient the check took or None, the tensors as passed, copies
# taken before the call), ``reference(inputs, out)`` returning the float64 reference
# ``(expected, expected_grad)``, then the check's own lines (:func:`check_lines`).

_KIND_HELPERS = [
    "",
    "",
    "def same(a, b):",
    '    """Same shape and values (NaN equal to NaN)."""',
    "    if a is None or b is None:",
    "        return a is b",
    "    a, b = torch.as_tensor(a).detach(), torch.as_tensor(b).detach()",
    "    return a.shape == b.shape and bool(((a == b) | ((a != a) & (b != b))).all())",
    "",
    "",
    "def show(label, actual, against, expected, mask):",
    '    """Print both and their largest absolute difference (token tensors: at response',
    '    positions); the report lists positions by their error in tolerances instead."""',
    "    a, e = actual.detach().double(), expected.detach().double()",
    "    for name, t in ((label, a), (against, e)):",
    "        print(f'{name}:', t.item() if t.dim() == 0 else t.tolist() if t.numel() <= 256",
    "              else f'tensor of shape {list(t.shape)}')",
    "    if e.dim() < a.dim():  # a row value against the row broadcast over its tokens",
    "        e = e.reshape(e.shape + (1,) * (a.dim() - e.dim())).expand_as(a)",
    "    where = torch.ones(a.shape, dtype=torch.bool)",
    "    if a.dim() >= 2 and a.shape[:2] == mask.shape:",
    "        where = mask.reshape(mask.shape + (1,) * (a.dim() - 2)).expand_as(a)",
    "    diff = torch.where(where, (a - e).abs().nan_to_num(nan=float('inf')), 0.0)",
    "    pos = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))",
    "    print('largest absolute difference:', diff.max().item(), 'at', pos,",
    "          f'({label}', a[pos].item(), f'{against}', e[pos].item(), ')')",
    "",
    "",
    "def at_padding(grad, mask):",
    '    """The largest |gradient| at padding positions (the check needs exactly 0)."""',
    "    m = mask.reshape(mask.shape + (1,) * (grad.dim() - 2)).expand_as(grad)",
    "    return grad.double().masked_fill(m, 0.0).abs().max().item()",
]


def pick_line(key: str | int | None, default: str, indent: str = "    ") -> str:
    """The snippet line taking the result out of a tuple/list/dict as the kind does
    (``loss=`` on the marker, else the first item or the ``default`` key)."""
    if key is not None:
        return f"{indent}out = out[{key!r}]"
    return (
        f"{indent}out = out[0] if isinstance(out, (tuple, list)) else "
        f"out[{default!r}] if isinstance(out, dict) else out"
    )


def check_lines(
    mode: str, *, other: list[str] | None = None, grads: bool = True, what: str = ""
) -> list[str]:
    """The lines after the definitions: what a check of ``mode`` did and compared.

    ``value`` / ``gradient``: the function's result / gradient against the reference's;
    ``masked``: the gradient at padding; ``same``: the function's own result (and, with
    ``grads``, gradient) on ``other`` (lines building ``other`` from ``inputs``; ``what``
    says what changed) against the original inputs'; ``inputs-unchanged``; ``deterministic``.
    """
    mask = "inputs['response_mask']"
    padding = f"print('largest |gradient| at padding (must be 0):', at_padding(grad, {mask}))"
    tails = {
        "value": [
            "expected, expected_grad = reference(inputs, out)",
            f"show('function', out, 'reference', expected, {mask})",
        ],
        "gradient": [
            "expected, expected_grad = reference(inputs, out)",
            f"show('function gradient', grad, 'reference gradient', expected_grad, {mask})",
            padding,
        ],
        "masked": [padding],
        "inputs-unchanged": [
            "print('inputs modified in place:',",
            "      [k for k, v in before.items() if not same(v, passed[k])])",
        ],
        "deterministic": [
            "out2, grad2, _, _ = run(inputs)",
            "print('same result twice:', same(out, out2))",
            "if grad is not None:",
            "    print('same gradient twice:', same(grad, grad2))",
        ],
    }
    if mode == "same":
        assert other is not None
        tail = [f"# the check: {what}", *other, "out2, grad2, _, _ = run(other)"]
        tail += [
            f"width = {mask}.shape[1]",
            "out2 = out2[:, :width] if out2.dim() >= 2 else out2  # the original columns",
            f"show('function', out2, 'function on the original inputs', out, {mask})",
        ]
        if grads:
            tail += [
                "show('gradient', grad2[:, :width], 'gradient on the original inputs', grad,",
                f"     {mask})",
            ]
        tails["same"] = tail
    if mode not in tails:
        raise ValueError(f"check_lines: unknown mode {mode!r}")
    return ["", "out, grad, passed, before = run(inputs)", *tails[mode]]


def kind_snippet(
    where: Importable,
    *,
    imports: list[str],
    inputs: str,
    definitions: list[str],
    check: list[str],
) -> str:
    """Assemble a kind's snippet: how to run it (a comment), the function's import
    (:func:`import_lines`), the kind's own ``imports``, the ``inputs`` literals (ending in
    ``inputs = {...}``), the helpers, ``definitions`` (``run``, ``reference``) and the
    ``check``'s lines."""
    built = [ln for ln in inputs.rstrip().splitlines() if ln != "import torch"]
    lines = [
        f"# pytest-polgrad reproduction: {how_to_run(where)}",
        *import_lines(where),
        *imports,
        "",
        *built,
        *_KIND_HELPERS,
        *definitions,
        *check,
    ]
    return "\n".join(lines) + "\n"
