"""The drawn object: a frozen batch of loss inputs, its layout, and the plan behind it;
``build(plan) -> Batch`` and ``build_many``, which wrap the plan's tensors
(:func:`._build.build_fields`) in batches."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from ._build import build_fields
from ._layout import Layout, left_to_right, pack, right_to_left, row_extents, unpack
from ._plan import BatchPlan
from ._snippet import snippet, tensor_literal
from ._validate import check_choice, check_dtype

__all__ = ["FIELDS", "Batch", "build", "build_many"]

FIELDS = (
    "logprobs",
    "old_logprobs",
    "advantages",
    "response_mask",
    "ref_logprobs",
    "rollout_logprobs",
    "rewards",
    "group_ids",
    "cu_seqlens",
)
_TOKEN_FIELDS = ("logprobs", "old_logprobs", "response_mask", "ref_logprobs", "rollout_logprobs")
_LAYOUTS = ("right", "left", "packed")
_REPR_LIMIT = 512  # elements; larger batches print a summary instead of literals


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Batch:
    """Inputs of a policy-gradient loss, in one layout.

    Right- and left-padded batches hold ``[B, T]`` token tensors; packed batches hold 1-D
    token streams with ``cu_seqlens`` (``int32``, ``[B + 1]``). ``advantages`` is ``[B]``
    or per-token. ``rewards`` and ``group_ids`` (``[B]``) are present for grouped batches,
    ``ref_logprobs`` / ``rollout_logprobs`` when drawn. ``plan`` (when the batch was drawn)
    rebuilds it exactly; see :meth:`rebuild`.
    """

    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    response_mask: torch.Tensor
    ref_logprobs: torch.Tensor | None = None
    rollout_logprobs: torch.Tensor | None = None
    rewards: torch.Tensor | None = None
    group_ids: torch.Tensor | None = None
    cu_seqlens: torch.Tensor | None = None
    layout: Layout = "right"
    per_token_advantages: bool | None = None
    plan: BatchPlan | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        for name in FIELDS:
            value = getattr(self, name)
            required = name in FIELDS[:4] or (name == "cu_seqlens" and self.layout == "packed")
            if value is None and not required:
                continue
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"Batch.{name} must be a torch.Tensor, got {type(value).__name__}")
        if self.layout not in _LAYOUTS:
            raise ValueError(f"Batch.layout must be one of {_LAYOUTS}, got {self.layout!r}")
        if self.response_mask.dtype != torch.bool:
            raise TypeError(
                f"Batch.response_mask must be torch.bool, got {self.response_mask.dtype}"
            )
        if self.layout == "packed":
            self._check_packed()
        else:
            self._check_padded()

    def _check_padded(self) -> None:
        if self.cu_seqlens is not None:
            raise ValueError("Batch.cu_seqlens belongs to layout='packed' only")
        shape = tuple(self.response_mask.shape)
        if len(shape) != 2:
            raise ValueError(f"Batch.response_mask must be [B, T], got {list(shape)}")
        self._check_token_shapes(shape)
        adv = tuple(self.advantages.shape)
        if adv not in ((shape[0],), shape):
            raise ValueError(
                f"Batch.advantages must be [B] or [B, T] = {list(shape)}, got {list(adv)}"
            )
        self._resolve_token_advantages(len(adv) == 2)
        self._check_row_shapes(shape[0])

    def _check_packed(self) -> None:
        cu = self.cu_seqlens
        assert cu is not None
        if cu.dtype != torch.int32 or cu.dim() != 1 or cu.numel() < 1:
            raise ValueError(f"Batch.cu_seqlens must be 1-D int32, got {cu.dtype} {list(cu.shape)}")
        total, rows = int(cu[-1]), cu.numel() - 1
        self._check_token_shapes((total,))
        adv = tuple(self.advantages.shape)
        if adv not in ((rows,), (total,)):
            raise ValueError(
                f"Batch.advantages must be [B] = [{rows}] or [N] = [{total}], got {list(adv)}"
            )
        flag = self.per_token_advantages
        self._resolve_token_advantages(adv == (total,) and (rows != total or bool(flag)))
        self._check_row_shapes(rows)

    def _check_token_shapes(self, shape: tuple[int, ...]) -> None:
        for name in _TOKEN_FIELDS:
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != shape:
                raise ValueError(
                    f"Batch.{name} must have shape {list(shape)}, got {list(value.shape)}"
                )

    def _check_row_shapes(self, rows: int) -> None:
        for name in ("rewards", "group_ids"):
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != (rows,):
                raise ValueError(
                    f"Batch.{name} must have shape [B] = [{rows}], got {list(value.shape)}"
                )

    def _resolve_token_advantages(self, per_token: bool) -> None:
        object.__setattr__(self, "per_token_advantages", per_token)

    # ---- structure -------------------------------------------------------------------

    @property
    def batch_size(self) -> int:
        """``B``, the number of rows."""
        if self.layout == "packed":
            assert self.cu_seqlens is not None
            return self.cu_seqlens.numel() - 1
        return int(self.response_mask.shape[0])

    @property
    def width(self) -> int:
        """``T``: the padded width, or (packed) the longest row."""
        if self.layout == "packed":
            return max(self.extents, default=0)
        return int(self.response_mask.shape[1])

    @property
    def dtype(self) -> torch.dtype:
        return self.logprobs.dtype

    @property
    def extents(self) -> tuple[int, ...]:
        """Per row, the span from its first to its last response token (holes included)."""
        if self.layout == "packed":
            assert self.cu_seqlens is not None
            return tuple((self.cu_seqlens[1:] - self.cu_seqlens[:-1]).tolist())
        return tuple(row_extents(self.response_mask, self.layout).tolist())

    @property
    def lengths(self) -> tuple[int, ...]:
        """Response tokens per row (``response_mask`` summed over the row)."""
        if self.layout == "packed":
            assert self.cu_seqlens is not None
            counts = torch.cumsum(self.response_mask.to(torch.int64), 0)
            ends = torch.cat([torch.zeros(1, dtype=torch.int64), counts])
            cu = self.cu_seqlens.to(torch.int64)
            return tuple((ends[cu[1:]] - ends[cu[:-1]]).tolist())
        return tuple(self.response_mask.sum(dim=1).tolist())

    @property
    def seed(self) -> int | None:
        """The plan's generator seed (None for a hand-built batch)."""
        return None if self.plan is None else self.plan.seed

    def as_kwargs(self) -> dict[str, torch.Tensor]:
        """The tensors present, by name, in the order of :data:`FIELDS`."""
        out: dict[str, torch.Tensor] = {}
        for name in FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    # ---- conversions ---------------------------------------------------------------

    def _token_names(self) -> list[str]:
        names = [n for n in _TOKEN_FIELDS if getattr(self, n) is not None]
        return [*names, "advantages"] if self.per_token_advantages else names

    def _to_right(self, fill: float) -> tuple[dict[str, Any], torch.Tensor]:
        values: dict[str, Any] = {}
        if self.layout == "packed":
            assert self.cu_seqlens is not None
            width = self.plan.width if self.plan is not None else None
            ext = (self.cu_seqlens[1:] - self.cu_seqlens[:-1]).to(torch.int64)
            for name in self._token_names():
                x = getattr(self, name)
                pad: float | bool = False if x.dtype == torch.bool else fill
                values[name] = unpack(x, self.cu_seqlens, width=width, fill=pad)
            return values, ext
        ext = row_extents(self.response_mask, self.layout)
        for name in self._token_names():
            x = getattr(self, name)
            values[name] = x if self.layout == "right" else left_to_right(x, ext)
        return values, ext

    def to_layout(self, layout: Layout, *, fill: float = 0.0) -> Batch:
        """The same batch in ``layout``. Right <-> left is exact, padding included;
        leaving ``packed`` restores padding columns as ``fill`` (``False`` in the mask)."""
        if layout not in _LAYOUTS:
            raise ValueError(f"layout must be one of {_LAYOUTS}, got {layout!r}")
        if layout == self.layout:
            return self
        values, ext = self._to_right(fill)
        cu: torch.Tensor | None = None
        for name in list(values):
            if layout == "left":
                values[name] = right_to_left(values[name], ext)
            elif layout == "packed":
                values[name], cu = pack(values[name], ext)
        plan = None if self.plan is None else dataclasses.replace(self.plan, layout=layout)
        return dataclasses.replace(
            self,
            **values,
            cu_seqlens=cu,
            layout=layout,
            per_token_advantages=self.per_token_advantages,
            plan=plan,
        )

    def rebuild(
        self,
        *,
        dtype: torch.dtype | None = None,
        layout: Layout | None = None,
        padding: str | None = None,
    ) -> Batch:
        """Build this batch's plan again, optionally in another dtype, layout or padding.

        Rebuilding in another dtype re-aims boundary-targeted values at that dtype (a cast
        would round them off their targets). Each argument is validated as
        :func:`~pytest_polgrad.strategies.batches` validates it (``InvalidArgument``).
        """
        if self.plan is None:
            raise ValueError("this Batch has no plan (it was not drawn); nothing to rebuild")
        changes: dict[str, Any] = {}
        if dtype is not None:
            changes["dtype"] = str(check_dtype(dtype)).removeprefix("torch.")
        if layout is not None:
            check_choice("layout", layout, ("right", "left", "packed"))
            changes["layout"] = layout
        if padding is not None:
            check_choice("padding", padding, ("garbage", "nan"))
            changes["padding"] = padding
        return build(dataclasses.replace(self.plan, **changes))

    # ---- printing ------------------------------------------------------------------

    def _summary(self) -> str:
        parts = [
            f"B={self.batch_size}",
            f"T={self.width}",
            f"layout={self.layout!r}",
            f"dtype={self.dtype}",
            f"lengths={list(self.lengths)}",
        ]
        if self.plan is not None:
            parts += [f"domain={self.plan.domain!r}", f"seed={self.plan.seed}"]
        return ", ".join(parts)

    def describe(self) -> str:
        """One line for reports: ``B=3, T=5, response lengths [1, 5, 2]``."""
        return f"B={self.batch_size}, T={self.width}, response lengths {list(self.lengths)}"

    def to_snippet(self) -> str:
        """Standalone Python (only ``import torch``) building these exact tensors."""
        return snippet(self.as_kwargs().items(), comment="pytest-polgrad batch: " + self._summary())

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """Hypothesis' (and IPython's) pretty printer: the same text as ``repr``."""
        for i, line in enumerate(repr(self).splitlines()):
            if i:
                printer.break_()
            printer.text(line)

    def __repr__(self) -> str:
        tensors = self.as_kwargs()
        if sum(t.numel() for t in tensors.values()) > _REPR_LIMIT:
            return f"Batch(<{self._summary()}>)"
        args = [f"{name}={tensor_literal(t, '    ')}" for name, t in tensors.items()]
        args.append(f"layout={self.layout!r}")
        if self.layout == "packed":
            args.append(f"per_token_advantages={self.per_token_advantages!r}")
        return "Batch(\n" + "".join(f"    {a},\n" for a in args) + ")"


def build(plan: BatchPlan) -> Batch:
    """The batch of ``plan``: bitwise identical on every call and in every process."""
    return build_many([plan])[0]


def build_many(plans: Sequence[BatchPlan]) -> list[Batch]:
    """``[build(plan) for plan in plans]``, bitwise: the tensors of all plans built together
    (:func:`._build.build_fields`), each batch then put in its plan's layout."""
    out: list[Batch] = []
    for plan, fields in zip(plans, build_fields(plans), strict=True):
        batch = Batch(**fields, layout="right", plan=plan)
        out.append(batch if plan.layout == "right" else batch.to_layout(plan.layout))  # type: ignore[arg-type]
    return out
