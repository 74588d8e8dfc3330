"""Tensor literals that rebuild a tensor bit for bit, and standalone snippets of them.

Each float is written with the shortest decimal that rounds back to the same value *in the
tensor's dtype* (so a float32 ``0.1`` prints as ``0.1``, not ``0.10000000149011612``);
``torch.tensor(..., dtype=...)`` then reproduces it exactly. NaN and infinities use the
names ``nan`` and ``inf``, which a snippet defines when it needs them.
"""

from __future__ import annotations

import itertools
import math
import struct
import textwrap
from collections.abc import Callable, Iterable

import torch

__all__ = ["format_float", "snippet", "tensor_literal"]

_WIDTH = 100
_LONG = 400
_RUN = 8


def _round_f32(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def _round_f16(x: float) -> float:
    # torch converts a Python float to half through float32, so round the same way
    return float(struct.unpack("<e", struct.pack("<e", _round_f32(x)))[0])


def _round_bf16(x: float) -> float:
    # bfloat16 is the top half of a float32; round to nearest, ties to even.
    bits = struct.unpack("<I", struct.pack("<f", _round_f32(x)))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


_ROUND: dict[torch.dtype, Callable[[float], float]] = {
    torch.float32: _round_f32,
    torch.float16: _round_f16,
    torch.bfloat16: _round_bf16,
}


def format_float(value: float, dtype: torch.dtype = torch.float64) -> str:
    """Shortest decimal of ``value`` that rounds back to it in ``dtype``."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    rounder = _ROUND.get(dtype)
    if rounder is None:
        return repr(float(value))
    for digits in range(1, 18):
        text = f"{value:.{digits}g}"
        try:
            if rounder(float(text)) == value:
                break
        except OverflowError:  # rounds past the dtype's largest finite value
            continue
    # keep it a float literal in Python's own style: '1.0', '-0.5', '1e-06'
    return repr(float(text))


def _row(t: torch.Tensor, fmt: Callable[[object], str]) -> str:
    """A 1-D tensor as a list expression; a value repeated ``_RUN`` or more times in a row
    is written ``[v] * n`` (a response mask, constant padding), joined with ``+``."""
    parts: list[str] = []
    plain: list[str] = []
    for text, group in itertools.groupby(fmt(v) for v in t.tolist()):
        n = sum(1 for _ in group)
        if n < _RUN:
            plain += [text] * n
            continue
        if plain:
            parts.append("[" + ", ".join(plain) + "]")
            plain = []
        parts.append(f"[{text}] * {n}")
    if plain or not parts:
        parts.append("[" + ", ".join(plain) + "]")
    return " + ".join(parts)


def _nested(t: torch.Tensor, fmt: Callable[[object], str]) -> str:
    if t.dim() == 0:
        return fmt(t.item())
    if t.dim() == 1:
        return _row(t, fmt)
    return "[" + ", ".join(_nested(row, fmt) for row in t) + "]"


def _formatter(dtype: torch.dtype) -> Callable[[object], str]:
    if dtype == torch.bool:
        return lambda v: "True" if v else "False"
    if dtype.is_floating_point:
        return lambda v: format_float(float(v), dtype)  # type: ignore[arg-type]
    return lambda v: str(int(v))  # type: ignore[call-overload]


def _wrap(text: str, indent: str) -> list[str]:
    """``text`` in lines of at most ``_WIDTH`` characters, each starting with ``indent``,
    broken only at its spaces (between values, around ``+`` and ``*``): inside brackets,
    Python reads the lines as one expression."""
    return textwrap.wrap(
        text,
        _WIDTH,
        initial_indent=indent,
        subsequent_indent=indent + " ",
        break_long_words=False,
        break_on_hyphens=False,
    )


def tensor_literal(t: torch.Tensor, indent: str = "") -> str:
    """``torch.tensor(<nested list>, dtype=torch.<dtype>)`` reproducing ``t`` exactly.

    A 2-D tensor with several rows and a long literal puts each row on its own line; a
    row (or any other literal) longer than ``_LONG`` characters spans lines of at most
    ``_WIDTH`` (a realistic-size batch's rows hold thousands of values)."""
    t = t.detach().cpu()
    fmt = _formatter(t.dtype)
    dtype = str(t.dtype)
    if t.numel() == 0 and t.dim() > 1:  # a nested list of no rows loses the other sizes
        return f"torch.zeros({tuple(t.shape)}, dtype={dtype})"
    body = _nested(t, fmt)
    rows = t.dim() == 2 and t.shape[0] > 1
    if len(body) + len(indent) <= _WIDTH - 40 or (not rows and len(body) <= _LONG):
        return f"torch.tensor({body}, dtype={dtype})"
    inner = indent + "    "
    if rows:
        lines = []
        for row in t:
            text = _row(row, fmt) + ","
            lines += _wrap(text, inner) if len(text) > _LONG else [inner + text]
        return "torch.tensor([\n" + "\n".join(lines) + f"\n{indent}], dtype={dtype})"
    lines = _wrap(body + ",", inner)
    return "torch.tensor(\n" + "\n".join(lines) + f"\n{inner}dtype={dtype},\n{indent})"


def snippet(named: Iterable[tuple[str, torch.Tensor]], *, comment: str = "") -> str:
    """A standalone Python program (only ``import torch``) defining each tensor by name."""
    pairs = list(named)
    bodies = [(name, tensor_literal(t)) for name, t in pairs]
    floats = [t for _, t in pairs if t.is_floating_point()]
    needs_nan = any(bool(torch.isnan(t).any()) for t in floats)
    needs_inf = any(bool(torch.isinf(t).any()) for t in floats)
    lines = ["import torch", ""]
    if comment:
        lines += [f"# {line}" for line in comment.splitlines()]
    if needs_nan:
        lines.append('nan = float("nan")')
    if needs_inf:
        lines.append('inf = float("inf")')
    lines += [f"{name} = {body}" for name, body in bodies]
    lines.append("inputs = dict(" + ", ".join(f"{n}={n}" for n, _ in pairs) + ")")
    return "\n".join(lines) + "\n"
