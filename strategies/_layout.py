"""Exact converters between the three token layouts at the kit's edge.

* right-padded ``[B, T]``: row ``b`` occupies columns ``[0, E_b)``; the canonical layout.
* left-padded ``[B, T]``: row ``b`` occupies columns ``[T - E_b, T)``.
* packed: one 1-D stream of the rows' spans back to back, with ``cu_seqlens`` (``int32``,
  ``[B + 1]``, ``cu_seqlens[0] == 0``) marking where each row starts and ends.

``E_b`` is the row's *extent*: the span from its first to its last response token, holes
included. Right <-> left is a per-row rotation, so it round-trips bitwise, padding values
and all; packing drops the padding columns, so unpacking restores them as ``fill``.
Every converter is an index gather or scatter: values are moved, never recomputed.
"""

from __future__ import annotations

from typing import Literal

import torch

__all__ = [
    "Layout",
    "left_to_right",
    "pack",
    "right_to_left",
    "row_extents",
    "unpack",
]

Layout = Literal["right", "left", "packed"]


def _check_2d(name: str, x: torch.Tensor, extents: torch.Tensor) -> None:
    if x.dim() != 2:
        raise ValueError(f"{name} must be a [B, T] tensor, got shape {list(x.shape)}")
    if extents.shape != (x.shape[0],):
        raise ValueError(f"extents must have shape [B] = [{x.shape[0]}], got {list(extents.shape)}")
    if extents.numel() and (int(extents.min()) < 0 or int(extents.max()) > x.shape[1]):
        raise ValueError(f"extents must lie in [0, T] = [0, {x.shape[1]}], got {extents.tolist()}")


def row_extents(response_mask: torch.Tensor, layout: Layout = "right") -> torch.Tensor:
    """Per-row extent ``E_b`` (``int64``, ``[B]``) of a ``[B, T]`` bool mask.

    Right-padded: one past the last ``True``. Left-padded: ``T`` minus the first ``True``.
    A row without any ``True`` has extent 0.
    """
    if response_mask.dim() != 2 or response_mask.dtype != torch.bool:
        raise ValueError(
            f"response_mask must be a [B, T] torch.bool tensor, got {response_mask.dtype} "
            f"of shape {list(response_mask.shape)}"
        )
    rows, width = response_mask.shape
    if layout in ("right", "left"):
        if width == 0:
            return torch.zeros(rows, dtype=torch.int64)
        cols = torch.arange(1, width + 1, dtype=torch.int64)
        if layout == "left":
            cols = cols.flip(0)
        return (response_mask.to(torch.int64) * cols).amax(dim=1)
    raise ValueError(f"layout must be 'right' or 'left' for a [B, T] mask, got {layout!r}")


_SAME_WIDTH_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _as_bits(x: torch.Tensor) -> torch.Tensor:
    """An integer view of a floating tensor: moving bits, not values, keeps every NaN
    payload and signed zero (torch's CPU gather canonicalises bfloat16 NaNs)."""
    return x.view(_SAME_WIDTH_INT[x.element_size()]) if x.is_floating_point() else x


def _rotate(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """``out[b, t] = x[b, (t + shift[b]) mod T]``."""
    width = x.shape[1]
    if width == 0:
        return x.clone()
    cols = torch.arange(width, dtype=torch.int64)
    index = (cols[None, :] + shift.to(torch.int64)[:, None]) % width
    return torch.gather(_as_bits(x), 1, index).view(x.dtype)


def right_to_left(x: torch.Tensor, extents: torch.Tensor) -> torch.Tensor:
    """Move each row's span ``[0, E_b)`` to the end, ``[T - E_b, T)``; a rotation."""
    _check_2d("x", x, extents)
    return _rotate(x, extents)


def left_to_right(x: torch.Tensor, extents: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`right_to_left`: move ``[T - E_b, T)`` back to ``[0, E_b)``."""
    _check_2d("x", x, extents)
    return _rotate(x, x.shape[1] - extents)


def _span_mask(extents: torch.Tensor, width: int) -> torch.Tensor:
    return torch.arange(width, dtype=torch.int64)[None, :] < extents.to(torch.int64)[:, None]


def pack(x: torch.Tensor, extents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``[B, T]`` -> ``(stream [sum E_b], cu_seqlens int32 [B + 1])``."""
    _check_2d("x", x, extents)
    stream = _as_bits(x)[_span_mask(extents, x.shape[1])].view(x.dtype)
    cu = torch.zeros(extents.shape[0] + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(extents.to(torch.int64), 0).to(torch.int32)
    return stream, cu


def unpack(
    stream: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    width: int | None = None,
    fill: float | bool = 0.0,
) -> torch.Tensor:
    """Packed stream -> right-padded ``[B, width]`` with ``fill`` in the padding columns.

    ``width`` defaults to the longest row. Exact inverse of :func:`pack` on the rows' spans.
    """
    if stream.dim() != 1:
        raise ValueError(f"stream must be 1-D, got shape {list(stream.shape)}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1 or int(cu_seqlens[0]) != 0:
        raise ValueError(f"cu_seqlens must be 1-D and start at 0, got {cu_seqlens.tolist()}")
    extents = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.int64)
    if extents.numel() and int(extents.min()) < 0:
        raise ValueError(f"cu_seqlens must be non-decreasing, got {cu_seqlens.tolist()}")
    if int(cu_seqlens[-1]) != stream.shape[0]:
        raise ValueError(
            f"cu_seqlens[-1] = {int(cu_seqlens[-1])} must equal the stream length {stream.shape[0]}"
        )
    longest = int(extents.max()) if extents.numel() else 0
    width = longest if width is None else width
    if width < longest:
        raise ValueError(f"width={width} is shorter than the longest row ({longest})")
    out = torch.full((extents.shape[0], width), fill, dtype=stream.dtype)
    _as_bits(out)[_span_mask(extents, width)] = _as_bits(stream)
    return out
