"""Entry checks shared by every public function.

Structural checks (type, dtype, device, shape) read only metadata and cost nothing.
Value checks (finiteness, empty rows) read data; the loss functions run them after the
computation, on a handful of scalars, and only re-inspect elementwise when one is bad.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .errors import InputError, InputTypeError

__all__ = [
    "format_positions",
    "require_bool_mask",
    "require_data",
    "require_finite_where",
    "require_float_tensor",
    "require_nonempty_rows",
    "require_nonpositive_where",
    "require_response_mask",
    "require_right_padded",
    "require_same_device",
    "require_same_dtype",
    "require_shape",
    "require_tensor",
    "require_token_inputs",
]

_MAX_LISTED = 6


def format_positions(bad: torch.Tensor) -> str:
    """List the indices where ``bad`` is true, e.g. ``(0, 3), (2, 1) and 4 more``."""
    idx = bad.nonzero().tolist()
    shown = ", ".join("(" + ", ".join(str(i) for i in row) + ")" for row in idx[:_MAX_LISTED])
    more = len(idx) - _MAX_LISTED
    return shown + (f" and {more} more" if more > 0 else "")


def require_tensor(name: str, value: object) -> torch.Tensor:
    """Return ``value`` if it is a dense tensor (strided layout, not quantized); otherwise
    raise naming ``name``: sparse and quantized layouts lack operations the reference
    uses. A ``meta`` tensor (no data) is refused by :func:`require_same_device` /
    :func:`require_data`, after a device mismatch, which names both devices."""
    if isinstance(value, torch.Tensor):
        if value.layout is not torch.strided:
            raise InputTypeError(
                f"{name} must be a dense (strided) tensor, got layout {value.layout}; convert "
                f"it with {name}.to_dense()"
            )
        if value.is_quantized:
            raise InputTypeError(
                f"{name} is a quantized tensor ({value.dtype}); pass {name}.dequantize()"
            )
        return value
    kind = type(value).__module__ + "." + type(value).__qualname__
    hint = ""
    if type(value).__module__.startswith("numpy"):
        hint = "; convert it with torch.from_numpy(...)"
    elif isinstance(value, (list, tuple, int, float)):
        hint = "; build it with torch.tensor(...)"
    raise InputTypeError(f"{name} must be a torch.Tensor, got {kind}{hint}")


def require_float_tensor(name: str, value: object) -> torch.Tensor:
    """A floating-point tensor (float16, bfloat16, float32 or float64)."""
    t = require_tensor(name, value)
    if not t.is_floating_point():
        raise InputTypeError(
            f"{name} must have a floating-point dtype, got {t.dtype}; "
            f"cast it with {name}.double() or .float()"
        )
    return t


def require_bool_mask(name: str, value: object) -> torch.Tensor:
    """A ``torch.bool`` tensor; integer and float 0/1 masks are rejected, not guessed."""
    t = require_tensor(name, value)
    if t.dtype != torch.bool:
        raise InputTypeError(
            f"{name} must be a torch.bool tensor, got {t.dtype}; "
            f"pass {name}.bool() if it holds 0/1 values"
        )
    return t


def require_shape(name: str, t: torch.Tensor, shape: Sequence[int], what: str) -> None:
    """Raise unless ``t.shape == shape``; ``what`` spells the expected layout, e.g. ``[B, T]``."""
    if tuple(t.shape) != tuple(shape):
        raise InputError(f"{name} must have shape {what} = {list(shape)}, got {list(t.shape)}")


def require_same_dtype(tensors: dict[str, torch.Tensor]) -> torch.dtype:
    """All float tensors share one dtype; mixed precision is an error, not an upcast."""
    dtypes = {name: t.dtype for name, t in tensors.items()}
    distinct = set(dtypes.values())
    if len(distinct) > 1:
        listing = ", ".join(f"{n}={d}" for n, d in dtypes.items())
        raise InputTypeError(f"float tensors must share one dtype, got {listing}")
    return next(iter(distinct))


def require_same_device(tensors: dict[str, torch.Tensor]) -> torch.device:
    """All tensors live on one device, and it holds data (not ``meta``)."""
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise InputTypeError(f"tensors must be on one device, got {listing}")
    for name, t in tensors.items():
        require_data(name, t)
    return next(iter(devices.values()))


def require_data(name: str, t: torch.Tensor) -> None:
    """``t`` has values to read: not a ``meta`` tensor (shape and dtype only)."""
    if t.is_meta:
        raise InputTypeError(
            f"{name} is a meta tensor (shape {list(t.shape)}, no data); the reference computes "
            "values: pass a tensor on the CPU or a CUDA device"
        )


def require_response_mask(
    value: object, *, sized: bool = True, nonempty: bool = True
) -> torch.Tensor:
    """A 2-D ``[B, T]`` bool ``response_mask``; with ``sized``, ``B, T >= 1``; with
    ``nonempty``, at least one response token per row (this check reads the data)."""
    mask = require_bool_mask("response_mask", value)
    if mask.dim() != 2:
        raise InputError(f"response_mask must be 2-D [B, T], got shape {list(mask.shape)}")
    if sized and (mask.shape[0] == 0 or mask.shape[1] == 0):
        raise InputError(f"response_mask must have B >= 1 and T >= 1, got shape {list(mask.shape)}")
    if nonempty:
        require_nonempty_rows("response_mask", mask)
    return mask


def require_nonempty_rows(name: str, mask: torch.Tensor) -> None:
    """Every row of a ``[B, T]`` mask holds at least one response token."""
    if mask.shape[0] == 0 or mask.shape[1] == 0:
        raise InputError(f"{name} must have B >= 1 and T >= 1, got shape {list(mask.shape)}")
    require_data(name, mask)
    empty = ~mask.any(dim=1)
    if bool(empty.any()):
        rows = empty.nonzero().flatten().tolist()
        raise InputError(
            f"{name} has rows with no response token: rows {rows}; "
            "every sequence needs at least one token"
        )


def require_finite_where(name: str, t: torch.Tensor, where: torch.Tensor | None) -> None:
    """No NaN or inf in ``t`` where ``where`` is true (everywhere when ``where`` is None)."""
    require_data(name, t)
    bad = ~torch.isfinite(t)
    if where is not None:
        bad = bad & where
    if bool(bad.any()):
        kind = "NaN" if bool(torch.isnan(t[bad]).any()) else "inf"
        place = "at response positions " if where is not None else "at positions "
        raise InputError(f"{name} holds {kind} {place}{format_positions(bad)}")


def require_nonpositive_where(name: str, t: torch.Tensor, where: torch.Tensor | None) -> None:
    """No value ``> 0`` in ``t`` where ``where`` is true: log-probabilities are ``<= 0``
    (``0`` itself, a token of probability 1, is valid)."""
    require_data(name, t)
    bad = t.detach() > 0
    if where is not None:
        bad = bad & where
    if bool(bad.any()):
        worst = float(t.detach()[bad].max())
        raise InputError(
            f"{name} must be <= 0, got positive values at {format_positions(bad)} (largest "
            f"{worst:.6g}); log-probabilities of the sampled tokens are <= 0: not logits or "
            "probabilities"
        )


def require_token_inputs(
    response_mask: object,
    *,
    tokens: dict[str, object | None],
    rows: dict[str, object | None] | None = None,
    optional: tuple[str, ...] = (),
    nonempty: bool = True,
    right_padded: bool = False,
    nonpositive: tuple[str, ...] = (),
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Validate a ``[B, T]`` bool mask with float ``[B, T]`` (``tokens``) and ``[B]``
    (``rows``) tensors; names in ``optional`` may be ``None`` and are then left out.
    Structural checks first, then values: finite at response positions (``[B, T]``) or
    everywhere (``[B]``), and ``<= 0`` there for the log-probabilities named in
    ``nonpositive``."""
    mask = require_response_mask(response_mask, sized=False, nonempty=False)
    shapes = {name: (tuple(mask.shape), "[B, T] like response_mask") for name in tokens}
    shapes |= {name: (tuple(mask.shape[:1]), "[B]") for name in rows or {}}
    given = {
        k: x for k, x in {**tokens, **(rows or {})}.items() if k not in optional or x is not None
    }
    out = {name: require_float_tensor(name, x) for name, x in given.items()}
    for name, t in out.items():
        require_shape(name, t, shapes[name][0], shapes[name][1])
    if out:
        require_same_dtype(out)
    require_same_device({**out, "response_mask": mask})
    if nonempty:
        require_nonempty_rows("response_mask", mask)
    if right_padded:
        require_right_padded(mask)
    for name, t in out.items():
        require_finite_where(name, t, mask if t.dim() == 2 else None)
        if name in nonpositive:
            require_nonpositive_where(name, t, mask if t.dim() == 2 else None)
    return mask, out


def require_right_padded(mask: torch.Tensor) -> None:
    """Each row's response tokens form a prefix: no token right after a padding position."""
    require_data("response_mask", mask)
    late = torch.nn.functional.pad(mask[:, 1:] & ~mask[:, :-1], (1, 0))
    if bool(late.any()):
        raise InputError(
            "response_mask must be right-padded (each row's tokens a prefix), but it has "
            f"response tokens after padding at positions {format_positions(late)}"
        )
