"""Calling the function under test: signature-driven keyword tensors (with the common
spellings of the frameworks accepted as aliases), layout and device conversion at the
edge, return-value extraction, and clear verdicts when the function misbehaves.

:func:`guarded_call` is the one place a user function is called: its exception, or a
``sys.exit()`` inside it, becomes a :class:`Verdict`; ``KeyboardInterrupt`` propagates.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import re
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

import polgrad_reference
from pytest_polgrad.core.clock import charged
from pytest_polgrad.core.options import ConformanceOptions, MarkerError
from pytest_polgrad.core.verdicts import Verdict
from pytest_polgrad.strategies import left_to_right, pack, right_to_left, row_extents, unpack

__all__ = [
    "ALIASES",
    "INPUT_NAMES",
    "DeviceUnavailable",
    "Evaluation",
    "FunctionUnderTest",
    "SignatureError",
    "guarded_call",
    "on_canonical_batch",
    "resolve_parameters",
]

INPUT_NAMES = (
    "logprobs",
    "old_logprobs",
    "advantages",
    "response_mask",
    "ref_logprobs",
    "rollout_logprobs",
    "cu_seqlens",
)


ALIASES: dict[str, tuple[str, ...]] = {
    "logprobs": (
        "log_probs",
        "log_prob",
        "logp",
        "new_logprobs",
        "new_log_probs",
        "per_token_logps",
    ),
    "old_logprobs": ("old_log_probs", "old_log_prob", "old_logp", "old_per_token_logps"),
    "advantages": ("advantage",),
    "response_mask": ("action_mask", "completion_mask", "loss_mask", "mask"),
    "ref_logprobs": ("ref_log_probs", "ref_log_prob", "ref_per_token_logps"),
    "rollout_logprobs": ("rollout_log_probs", "rollout_log_prob"),
    "cu_seqlens": ("cu_seq_lens",),
}
"""Accepted spellings of each input, after its canonical name: verl (``log_prob``,
``old_log_prob``, ``response_mask``), OpenRLHF (``log_probs``, ``action_mask``), TRL
(``per_token_logps``, ``completion_mask``). Each alias names exactly one input.
``attention_mask`` is refused: in the Hugging Face convention it covers the prompt too."""

_REFUSED = {
    "attention_mask": "in the Hugging Face convention it covers the prompt tokens too; "
    "name the parameter response_mask (True at response tokens only)",
}


@contextlib.contextmanager
def on_canonical_batch(name: str) -> Iterator[None]:
    """A :class:`Verdict` raised inside names the canonical batch ``name`` it came from."""
    try:
        yield
    except Verdict as exc:
        raise Verdict(f"on canonical batch {name!r}: {exc}") from exc


class SignatureError(Verdict, TypeError):
    """The function's parameters cannot be matched to the kit's inputs (raised once, when
    the function is wrapped, so the plugin can report it at collection)."""


class DeviceUnavailable(MarkerError):
    """``device=`` names a device this machine does not have, raised at the first call
    (not at collection, so a ``skipif`` mark on the function works): an error in pytest
    items and ``assert_conforms`` alike, never a silent skip (a CPU-only run must not look
    as if the CUDA path was checked)."""


def guarded_call(
    fn: Callable[..., Any], kwargs: Mapping[str, Any], what: str = "a valid batch"
) -> Any:
    """``fn(**kwargs)``; an exception from ``fn`` or ``sys.exit()`` inside it becomes a
    :class:`Verdict` naming it (``what`` says on which input). ``KeyboardInterrupt`` and
    pytest's own outcomes (skip, fail, exit: ``BaseException`` subclasses) propagate."""
    try:
        with charged():  # the function's own time (core/clock.py)
            return fn(**kwargs)
    except Exception as exc:  # the function's own error is the finding
        frames = traceback.format_exception_only(type(exc), exc)
        text = "".join(frames).strip()
        if isinstance(exc, AssertionError) or not str(exc):  # says nothing about where
            text += raised_at(exc)
        raise Verdict(f"the function raised on {what}: {text}{_shape_hint(exc, kwargs)}") from exc
    except SystemExit as exc:
        raise Verdict(
            f"the function called sys.exit({exc.code!r}) on {what}; a loss must return "
            "(or raise), never end the process"
        ) from exc


def _kit_directories() -> tuple[Path, ...]:
    """Where the kit's own code and torch live: frames there are not the user's code."""
    here = Path(__file__).resolve().parents[1]  # the package root, not core/
    return (here, Path(polgrad_reference.__file__).resolve().parent, Path(torch.__file__).parent)


def raised_at(exc: BaseException) -> str:
    """`` (raised at FILE:LINE: SOURCE)`` for the innermost frame of ``exc``'s traceback
    outside the kit and torch (a framework's own ``assert`` included), or the innermost
    frame when every frame is theirs; ``""`` without a traceback."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    kit = _kit_directories()

    def theirs(frame: traceback.FrameSummary) -> bool:
        path = Path(frame.filename).resolve()
        return any(path.is_relative_to(d) for d in kit)

    mine = [f for f in frames if not theirs(f)]
    frame = (mine or list(frames))[-1]
    name = frame.filename
    try:
        rel = os.path.relpath(name)
        name = rel if not rel.startswith("..") else name
    except ValueError:  # another drive (Windows)
        pass
    source = f": {frame.line.strip()}" if frame.line else ""
    return f" (raised at {name}:{frame.lineno}{source})"


_BROADCAST = re.compile(
    r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\) "
    r"at non-singleton dimension (\d+)"
)


def _shape_hint(exc: BaseException, kwargs: Mapping[str, Any]) -> str:
    """A hint for torch's broadcast error between the batch size B and the width T when
    the function got a ``[B]`` tensor beside ``[B, T]`` ones: a per-sequence tensor
    (``advantages``) used against per-token ones without ``[:, None]``."""
    found = _BROADCAST.search(str(exc))
    if not isinstance(exc, RuntimeError) or found is None:
        return ""
    sizes = {int(found.group(1)), int(found.group(2))}
    tensors = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    tokens = [v.shape for v in tensors.values() if v.dim() == 2]
    if not tokens:
        return ""
    b, t = tokens[0]
    rows = [k for k, v in tensors.items() if tuple(v.shape) == (b,)]
    if b == t or sizes != {b, t} or not rows:
        return ""
    names = " and ".join(repr(k) for k in rows)
    return (
        f"; likely cause: {names} {'has' if len(rows) == 1 else 'have'} shape [B] = [{b}] "
        f"and the token tensors [B, T] = [{b}, {t}]: broadcasting a [B] tensor against "
        f"[B, T] ones aligns it with T, not B (write {rows[0]}[:, None])"
    )


def resolve_parameters(
    fn: Callable[..., Any],
    names: Iterable[str] = INPUT_NAMES,
    *,
    aliases: Mapping[str, tuple[str, ...]] = ALIASES,
    strict: bool = True,
) -> dict[str, str]:
    """``{input name: parameter name}`` for the inputs among ``names`` that ``fn``
    takes, by canonical name or an unambiguous alias (``aliases``, default
    :data:`ALIASES`; a canonical name is never read as another input's alias); all of
    them, by canonical name, with ``**kwargs``. The one parameter resolver of every kind.

    ``strict``: raise :class:`SignatureError` once, naming the accepted spellings, for a
    required parameter the kit cannot fill, two parameters for one input, or
    positional-only tensor parameters (the policy loss); otherwise they are not raised
    (a positional-only one is kept: its call fails and the token kinds report it). An
    unreadable signature is always a :class:`SignatureError`."""
    names = tuple(names)
    label = getattr(fn, "__qualname__", repr(fn))
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as exc:
        raise SignatureError(f"cannot read the signature of {label}: {exc}") from exc
    spelled = {alias: n for n in names for alias in aliases.get(n, ())} | {n: n for n in names}
    accepted = "; ".join(
        f"{n} (or {', '.join(aliases[n])})" if aliases.get(n) else n for n in names
    )
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    found: dict[str, str] = {}
    problems = []
    for p in params:
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        required = p.default is inspect.Parameter.empty
        if p.name in _REFUSED and required:
            problems.append(f"parameter {p.name!r} is not accepted: {_REFUSED[p.name]}")
            continue
        canonical = spelled.get(p.name)
        if canonical is None:
            if required:
                problems.append(f"required parameter {p.name!r} is not an input the kit provides")
            continue
        if p.kind is inspect.Parameter.POSITIONAL_ONLY and strict:
            problems.append(f"parameter {p.name!r} is positional-only; the kit passes keywords")
            continue
        if canonical in found:
            problems.append(f"parameters {found[canonical]!r} and {p.name!r} both name {canonical}")
            continue
        found[canonical] = p.name
    if problems and strict:
        raise SignatureError(
            f"{label}: {'; '.join(problems)}. A marked function takes keyword tensors "
            f"among: {accepted}; give any other parameter a default, or wrap the function"
        )
    if var_kw:
        found = {n: found.get(n, n) for n in names}
    return {n: found[n] for n in names if n in found}


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One call of the function under test, brought back to the canonical layout."""

    loss: torch.Tensor
    """The scalar loss, detached (in the dtype the function returned)."""
    grad: torch.Tensor | None
    """d loss / d logprobs as ``[B, T]`` right-padded, or None when not asked for."""
    inputs: dict[str, torch.Tensor]
    """The tensors exactly as passed (after the call: the function may have written them)."""
    before: dict[str, torch.Tensor] | None
    """Copies of ``inputs`` taken before the call, when asked for."""


def _pick_loss(result: object, key: str | int | None) -> object:
    if isinstance(result, Mapping):
        k = "loss" if key is None else key
        if k not in result:
            raise Verdict(
                f"the function returned a dict without key {k!r} "
                f"(keys: {sorted(map(str, result))}); name the loss with "
                "polgrad_conforms(..., loss='key')"
            )
        return result[k]
    if isinstance(result, (tuple, list)):
        i = 0 if key is None else key
        if not isinstance(i, int) or not -len(result) <= i < len(result):
            raise Verdict(
                f"the function returned a {type(result).__name__} of {len(result)} items; "
                f"loss={key!r} does not index it"
            )
        return result[i]
    return result


def _as_loss(value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise Verdict(
            f"the function returned {type(value).__name__} {value!r:.60}, not a tensor; the loss "
            "must be a scalar tensor computed from logprobs"
        )
    if value.numel() != 1 or value.dim() > 1:
        raise Verdict(
            f"the function returned a tensor of shape {list(value.shape)}; the loss must be a "
            "scalar (did it skip the aggregation?)"
        )
    if not value.is_floating_point():
        raise Verdict(f"the function returned a {value.dtype} tensor; the loss must be floating")
    return value if value.dim() == 0 else value.reshape(())


def _on_cpu(t: torch.Tensor) -> torch.Tensor:
    """``t.cpu()``, without the call when ``t`` is there already (the common case)."""
    return t if t.device.type == "cpu" else t.cpu()


def _fresh(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` the function may modify, outside any autograd graph."""
    return t.detach().clone() if t.requires_grad else t.clone()


class FunctionUnderTest:
    """Wraps a loss function: which inputs it takes, and how to call it on a batch."""

    def __init__(self, fn: Callable[..., Any], options: ConformanceOptions) -> None:
        self.fn = fn
        self.options = options
        self.parameters = resolve_parameters(fn)
        """``{input name: parameter name}``: how each input is passed (aliases resolved)."""
        self.takes = tuple(self.parameters)
        signature = inspect.signature(fn).parameters
        self.required = frozenset(
            n
            for n, name in self.parameters.items()
            if name in signature and signature[name].default is inspect.Parameter.empty
        )
        """The inputs whose parameter has no default: the kit must feed each of them."""
        if "logprobs" not in self.takes:
            raise SignatureError(
                f"{getattr(fn, '__qualname__', fn)!r} has no 'logprobs' parameter; a marked loss "
                f"function takes keyword tensors among {', '.join(INPUT_NAMES)} "
                f"(logprobs may also be spelled {', '.join(ALIASES['logprobs'])})"
            )
        if getattr(options, "holes", False) and "response_mask" not in self.takes:
            raise SignatureError(
                f"holes=True draws response masks with holes inside a response, but "
                f"{getattr(fn, '__qualname__', fn)!r} takes no response_mask: it could not "
                "see them in any layout; add a response_mask parameter or drop holes=True"
            )
        self.device = _parse_device(str(getattr(options, "device", "cpu")))
        self._device_checked = self.device.type == "cpu"

    @property
    def name(self) -> str:
        return str(getattr(self.fn, "__qualname__", repr(self.fn)))

    @property
    def takes_ref(self) -> bool:
        return "ref_logprobs" in self.takes

    def _layout_inputs(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The inputs the function takes, cloned, in its layout (canonical names)."""
        layout = self.options.layout
        mask = batch["response_mask"]
        out = {n: _fresh(batch[n]) for n in self.takes if n in batch}
        if layout == "right":
            return out
        extents = row_extents(mask)
        for name, t in out.items():
            if t.dim() == 2:  # token tensors move; [B] advantages stay as they are
                out[name] = right_to_left(t, extents) if layout == "left" else pack(t, extents)[0]
        if layout == "packed" and "cu_seqlens" in self.takes:
            out["cu_seqlens"] = pack(mask, extents)[1]
        return out

    def _canonical_grad(
        self, grad: torch.Tensor, batch: Mapping[str, torch.Tensor]
    ) -> torch.Tensor:
        mask = batch["response_mask"]
        if self.options.layout == "left":
            return left_to_right(grad, row_extents(mask))
        if self.options.layout == "packed":
            cu = pack(mask, row_extents(mask))[1]
            return unpack(grad, cu, width=mask.shape[1], fill=0.0)
        return grad

    def keywords(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``inputs`` (canonical names) keyed by the function's parameter names."""
        return {self.parameters[n]: t for n, t in inputs.items()}

    def call(
        self,
        batch: Mapping[str, torch.Tensor],
        *,
        grad: bool = True,
        snapshot: bool = False,
    ) -> Evaluation:
        """Call the function on a canonical batch; raise :class:`Verdict` on misbehaviour.

        With ``device`` other than CPU the function receives tensors on that device; the
        loss and the gradient come back to the CPU (in the function's dtype)."""
        inputs = self._layout_inputs(batch)
        if not self._device_checked:  # at the first call, so collection and skipif marks work
            _require_available(self.device)
            self._device_checked = True
        if self.device.type != "cpu":
            inputs = {k: v.to(self.device) for k, v in inputs.items()}
        inputs["logprobs"].requires_grad_(grad)
        before = {k: v.detach().clone() for k, v in inputs.items()} if snapshot else None
        result = guarded_call(self.fn, self.keywords(inputs))
        loss = _as_loss(_pick_loss(result, self.options.loss))
        g = None
        if grad:
            if not loss.requires_grad:
                raise Verdict(
                    "the returned loss is not differentiable in logprobs (no grad_fn: it was "
                    "detached, computed with torch.no_grad(), or does not use logprobs)"
                )
            try:
                with charged():  # the backward through the function's graph is its own
                    (g,) = torch.autograd.grad(loss, inputs["logprobs"], allow_unused=True)
            except Exception as exc:  # incl. a custom autograd.Function's own error
                raise Verdict(f"backward through the returned loss failed: {exc}") from exc
            except SystemExit as exc:
                raise Verdict(f"backward called sys.exit({exc.code!r})") from exc
            if g is None:
                raise Verdict("the returned loss does not depend on logprobs (gradient is None)")
            g = self._canonical_grad(_on_cpu(g), batch)
        return Evaluation(_on_cpu(loss.detach()), g, inputs, before)


def _parse_device(name: str) -> torch.device:
    """``torch.device(name)`` for ``cpu``, ``cuda`` or ``cuda:N``; ``MarkerError`` otherwise."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as exc:
        raise MarkerError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {name!r}") from exc
    if device.type not in ("cpu", "cuda"):
        raise MarkerError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {name!r}")
    return device


def _require_available(device: torch.device) -> None:
    """:class:`DeviceUnavailable` unless this machine has ``device``."""
    if not torch.cuda.is_available():
        raise DeviceUnavailable(
            f"device={str(device)!r}: CUDA is not available in this torch build "
            f"({torch.__version__}) or on this machine; the checks need a CUDA device "
            "(mark the test skipif(not torch.cuda.is_available()) to run it only there), "
            "or drop device= to run on the CPU"
        )
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise DeviceUnavailable(
            f"device={str(device)!r}: this machine has {count} CUDA device(s) (cuda:0 .. "
            f"cuda:{count - 1})"
        )
