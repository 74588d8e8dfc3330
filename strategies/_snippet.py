"""Tensor literals that rebuild a tensor bit for bit, and standalone snippets of them.

Each float is written with the shortest decimal that rounds back to the same value *in the
tensor's dtype* (so a float32 ``0.1`` prints as ``0.1``, not ``0.10000000149011612``);
``torch.tensor(..., dtype=...)`` then reproduces it exactly. NaN and infinities use the
names ``nan`` and ``inf``, which a snippet defines when it needs them.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterable

import torch

__all__ = ["format_float", "snippet", "tensor_literal"]

_WIDTH = 100


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


def _nested(t: torch.Tensor, fmt: Callable[[object], str]) -> str:
    if t.dim() == 0:
        return fmt(t.item())
    if t.dim() == 1:
        return "[" + ", ".join(fmt(v) for v in t.tolist()) + "]"
    return "[" + ", ".join(_nested(row, fmt) for row in t) + "]"


def _formatter(dtype: torch.dtype) -> Callable[[object], str]:
    if dtype == torch.bool:
        return lambda v: "True" if v else "False"
    if dtype.is_floating_point:
        return lambda v: format_float(float(v), dtype)  # type: ignore[arg-type]
    return lambda v: str(int(v))  # type: ignore[call-overload]


def _wrap_rows(body: str, indent: str) -> str:
    """Put each row of a 2-D literal on its own line."""
    rows = body[1:-1].split("], [")
    lines = [f"{indent}    [{row.strip('[]')}]," for row in rows]
    return "[\n" + "\n".join(lines) + f"\n{indent}]"


def tensor_literal(t: torch.Tensor, indent: str = "") -> str:
    """``torch.tensor(<nested list>, dtype=torch.<dtype>)`` reproducing ``t`` exactly."""
    body = _nested(t.detach().cpu(), _formatter(t.dtype))
    dtype = str(t.dtype)
    if t.dim() == 2 and t.shape[0] > 1 and len(body) + len(indent) > _WIDTH - 40:
        return f"torch.tensor({_wrap_rows(body, indent)}, dtype={dtype})"
    return f"torch.tensor({body}, dtype={dtype})"


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
