"""Packed (THD / varlen) calls for the token kinds: one conversion at the kit's edge.

With ``layout="packed"`` a kind still draws, checks and reports right-padded ``[B, T]``
batches; only the call of the function under test changes. :func:`call_in_layout`
hands it every token tensor (first two dims ``[B, T]``, e.g. logits ``[B, T, V]``) as one
stream ``[N, ...]`` of each row's first ``E_b`` entries back to back (``E_b``: one past the
row's last response token, :func:`~pytest_polgrad.strategies.row_extents`), plus
``cu_seqlens`` (int32 ``[B + 1]``) and ``position_ids`` (``[N]``, restarting at 0 in every
row) when it takes them, as FlashAttention's varlen kernels and the frameworks'
remove-padding paths do. Per-token results ``[N, ...]`` come back as ``[B, T, ...]`` (0
beyond each row's extent); ``[B]`` and scalar results as they are.

Both directions are differentiable index gathers and scatters of the kind's own padded
tensors (:func:`~pytest_polgrad.strategies._logits.pack_rows` and
:func:`~pytest_polgrad.strategies._logits.unpack_rows`' masks), so every gradient the kind
takes w.r.t. its padded leaf is the packed function's, scattered back, and exactly 0
beyond the extents; an in-place write to a packed input is written back to the padded
tensor, so ``inputs-unchanged`` sees it. A function that reads across a sequence
boundary (a ``torch.roll`` over the stream, GAE run through the next sequence) changes
the values the ``value`` checks compare.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

from pytest_polgrad.core.calls import guarded_call
from pytest_polgrad.core.kinds import KindCheck
from pytest_polgrad.core.options import ConformanceOptions
from pytest_polgrad.kinds._tokens import check_overrides, unknown_overrides
from pytest_polgrad.strategies import row_extents

__all__ = [
    "BOUNDARY_NAMES",
    "Packing",
    "call_in_layout",
    "check_layout",
    "for_layout",
    "snippet_call",
    "snippet_helper",
]

BOUNDARY_NAMES = ("cu_seqlens", "position_ids")
"""The keywords a packed function may take to find its sequences."""

_INT_OF_WIDTH = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(x: torch.Tensor) -> torch.Tensor:
    """An integer view of a floating tensor (moves NaN payloads and signed zeros exactly)."""
    return x.view(_INT_OF_WIDTH[x.element_size()]) if x.is_floating_point() else x


@dataclasses.dataclass(frozen=True, eq=False)
class Packing:
    """Where each row of a right-padded ``[B, T]`` batch sits in its packed stream."""

    lengths: torch.Tensor
    """``E_b`` (int64 ``[B]``)."""
    width: int
    """``T``."""

    @classmethod
    def of(cls, response_mask: torch.Tensor) -> Packing:
        return cls(row_extents(response_mask), int(response_mask.shape[1]))

    @property
    def keep(self) -> torch.Tensor:
        """Bool ``[B, T]``: the positions the stream holds, row by row."""
        return torch.arange(self.width)[None, :] < self.lengths[:, None]

    @property
    def rows(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def tokens(self) -> int:
        """``N = sum E_b``."""
        return int(self.lengths.sum())

    def is_tokens(self, t: object) -> bool:
        """Whether ``t`` is a token tensor of the batch (first dims ``[B, T]``)."""
        return isinstance(t, torch.Tensor) and tuple(t.shape[:2]) == (self.rows, self.width)

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        """``[B, T, ...]`` -> ``[N, ...]``: differentiable when ``t`` carries a gradient,
        else a bit-exact copy."""
        if t.requires_grad:
            return t[self.keep]
        return _bits(t)[self.keep].view(t.dtype).clone()

    def unpack(self, stream: torch.Tensor) -> torch.Tensor:
        """``[N, ...]`` -> ``[B, T, ...]`` with 0 beyond each extent (differentiable)."""
        out = stream.new_zeros((self.rows, self.width, *stream.shape[1:]))
        out[self.keep] = stream
        return out

    def bounds(self) -> dict[str, torch.Tensor]:
        """``cu_seqlens`` (int32 ``[B + 1]``) and ``position_ids`` (int64 ``[N]``)."""
        cu = torch.zeros(self.rows + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(self.lengths, 0).to(torch.int32)
        pos = torch.arange(self.width, dtype=torch.int64).expand(self.rows, self.width)
        return {"cu_seqlens": cu, "position_ids": pos[self.keep].clone()}

    def write_back(self, padded: torch.Tensor, stream: torch.Tensor) -> None:
        """Copy the entries of ``stream`` the function changed into ``padded``, in place."""
        if stream.shape[0] != self.tokens or stream.dtype != padded.dtype:
            return
        keep = self.keep
        old = _bits(padded.detach())[keep]
        new = _bits(stream.detach())
        if bool((old == new).all()):
            return
        with torch.no_grad():
            _bits(padded.data)[keep] = new

    def output(self, result: object) -> object:
        """The function's result with every ``[N, ...]`` tensor unpacked (tuples, lists and
        dicts entry by entry); ``[B]`` and scalar tensors as they are."""
        if isinstance(result, torch.Tensor):
            n = self.tokens
            if result.dim() >= 1 and result.shape[0] == n > 0:
                return self.unpack(result)
            return result
        if isinstance(result, Mapping):
            return {k: self.output(v) for k, v in result.items()}
        if isinstance(result, tuple):
            return tuple(self.output(v) for v in result)
        if isinstance(result, list):
            return [self.output(v) for v in result]
        return result


def _takes_bounds(fn: Callable[..., Any]) -> tuple[str, ...]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return ()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return BOUNDARY_NAMES
    names = {p.name for p in params}
    return tuple(n for n in BOUNDARY_NAMES if n in names)


def call_in_layout(
    options: ConformanceOptions,
    fn: Callable[..., Any],
    kwargs: Mapping[str, Any],
    response_mask: torch.Tensor,
    what: str = "a valid batch",
) -> Any:
    """``fn(**kwargs)`` as :func:`~pytest_polgrad.core.calls.guarded_call` does; with
    ``options.layout == "packed"`` the call takes the packed stream of every token tensor
    of ``kwargs`` (``response_mask`` ``[B, T]`` sets the extents), ``cu_seqlens`` and
    ``position_ids`` by name when ``fn`` takes them, and returns per-token results padded
    again (see the module docstring)."""
    if options.layout != "packed":
        return guarded_call(fn, kwargs, what)
    packing = Packing.of(response_mask)
    passed = {k: packing.pack(v) if packing.is_tokens(v) else v for k, v in kwargs.items()}
    bounds = packing.bounds()
    for name in _takes_bounds(fn):
        passed.setdefault(name, bounds[name])
    result = guarded_call(fn, passed, what)
    for k, v in kwargs.items():
        if packing.is_tokens(v):
            packing.write_back(v, passed[k])
    return packing.output(result)


def check_layout(kind: str, options: ConformanceOptions, allowed: frozenset[str]) -> None:
    """:func:`~pytest_polgrad.kinds._tokens.check_overrides` for a kind that also takes
    ``layout="packed"`` (through :func:`call_in_layout`)."""
    if options.layout == "packed":
        unknown_overrides(kind, options, allowed)
    else:
        check_overrides(kind, options, allowed)


def for_layout(checks: list[KindCheck], options: ConformanceOptions) -> list[KindCheck]:
    """``checks`` without ``padding-columns`` when packed (a stream has no padding columns
    to append: the check could not fail)."""
    if options.layout != "packed":
        return checks
    return [c for c in checks if c.name != "padding-columns"]


def snippet_call(options: ConformanceOptions, call: str, kw: str = "kw", mask: str = "mask") -> str:
    """The expression a snippet calls the function with: ``call(**kw)``, or packed
    ``packed_call(call, kw, mask)`` (defined by :func:`snippet_helper`)."""
    if options.layout != "packed":
        return f"{call}(**{kw})"
    return f"packed_call({call}, {kw}, {mask})"


def snippet_helper(options: ConformanceOptions) -> list[str]:
    """The snippet's ``packed_call``: the same conversion as :func:`call_in_layout`
    (nothing when the layout is not packed)."""
    if options.layout != "packed":
        return []
    return [
        "",
        "",
        "def packed_call(fn, kw, mask):",
        '    """Call fn as the kit did with layout="packed": each [B, T, ...] tensor as one',
        "    stream of each row's first E_b entries (E_b: one past its last response token),",
        "    cu_seqlens / position_ids if fn takes them; [N, ...] results padded again (0",
        '    beyond E_b), in-place writes copied back."""',
        "    import inspect",
        "    cols = torch.arange(1, mask.shape[1] + 1)",
        "    lengths = (mask.long() * cols).amax(dim=1)",
        "    keep = torch.arange(mask.shape[1])[None, :] < lengths[:, None]",
        "    tok = lambda t: torch.is_tensor(t) and tuple(t.shape[:2]) == tuple(mask.shape)",
        "    passed = {k: (v[keep] if v.requires_grad else v[keep].clone()) if tok(v) else v",
        "              for k, v in kw.items()}",
        "    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)",
        "    cu[1:] = torch.cumsum(lengths, 0)",
        "    bounds = {'cu_seqlens': cu, 'position_ids': torch.arange(mask.shape[1]).expand(",
        "        mask.shape)[keep]}",
        "    params = inspect.signature(fn).parameters",
        "    for name, value in bounds.items():",
        "        if name in params or any(p.kind == p.VAR_KEYWORD for p in params.values()):",
        "            passed.setdefault(name, value)",
        "    out = fn(**passed)",
        "    for k, v in kw.items():",
        "        if tok(v) and not torch.equal(v[keep], passed[k]):",
        "            with torch.no_grad():",
        "                v.data[keep] = passed[k].detach()",
        "    def unpad(t):",
        "        if not torch.is_tensor(t) or t.dim() == 0 or t.shape[0] != int(lengths.sum()):",
        "            return t",
        "        full = t.new_zeros((*mask.shape, *t.shape[1:]))",
        "        full[keep] = t",
        "        return full",
        "    if isinstance(out, dict):",
        "        return {k: unpad(v) for k, v in out.items()}",
        "    if isinstance(out, (tuple, list)):",
        "        return type(out)(unpad(v) for v in out)",
        "    return unpad(out)",
    ]
