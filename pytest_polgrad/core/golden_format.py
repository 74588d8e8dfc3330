"""Golden snapshots of tensors and loss results: a syrupy extension, its text format and a
tolerance-aware comparator.

One snapshot is one text file, one value per line, every line naming its entry and
position, so a review diff reads ``ragged/grad[2,0] = -0.0416666666667``::

    # pytest-polgrad snapshot: values compare within the dtype's tolerance (docs/snapshots.md)
    format = 1
    corpus = 1
    ragged/loss: float64 []
    ragged/loss = 0.368888888889
    ragged/grad: float64 [4, 10]
    ragged/grad[0,0] = -0.0916666666667
    ...

Floats are written with a fixed number of significant digits per dtype (:data:`DIGITS`)
and compared with the engine's tolerance model (:mod:`pytest_polgrad.core.tolerance`) plus the
rounding of the written digits, so float noise passes and never rewrites a line, while a
semantic change fails with the entries and positions that moved. Reading uses plain string
handling and ``float``/``int``/``json.loads`` of single tokens: nothing that runs code.
Torch is imported only when a tensor is compared.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import os
import re
import stat
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from syrupy.extensions.base import AbstractSyrupyExtension
from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode

if TYPE_CHECKING:
    import torch
    from syrupy.data import SnapshotCollection
    from syrupy.location import PyTestLocation
    from syrupy.types import (
        PropertyFilter,
        PropertyMatcher,
        SerializableData,
        SerializedData,
        SnapshotIndex,
    )

    from pytest_polgrad.core.tolerance import Tolerance

__all__ = [
    "DIGITS",
    "FORMAT",
    "Difference",
    "Document",
    "Entry",
    "EntryScale",
    "Outcome",
    "PolgradSnapshotExtension",
    "SnapshotFormatError",
    "SnapshotPathError",
    "SnapshotText",
    "SnapshotWriteError",
    "Tolerant",
    "compare",
    "explain",
    "flatten",
    "forget_write_errors",
    "golden_stem",
    "merged_text",
    "parse",
    "refuse_unusual",
    "render",
    "snapshot_base",
    "write_error",
]

FORMAT = 1
"""Version of the text layout; bump it when a file written before would read differently."""

DIGITS = {"float64": 12, "float32": 8, "float16": 4, "bfloat16": 3, "float": 12}
"""Significant digits written per float kind (``float`` is a Python float). float32, float16
and bfloat16 keep about one unit of their own rounding; float64 keeps 12 digits, which is
readable and still resolves any change larger than about 5e-12 of a value."""

_INTS = frozenset({"uint8", "int8", "int16", "int32", "int64", "int"})
_KINDS = frozenset({*DIGITS, *_INTS, "bool", "str", "none"})
_HEADER = (
    "# pytest-polgrad snapshot: values compare within the dtype's tolerance (docs/snapshots.md)"
)
_PART = r"[^\s\[\]=:#/]+"
_KEY = re.compile(rf"{_PART}(?:/{_PART})*")
_DECL = re.compile(rf"(?P<key>{_KEY.pattern}): (?P<kind>\w+) \[(?P<shape>[0-9, ]*)\]")
_VALUE = re.compile(rf"(?P<key>{_KEY.pattern})(?:\[(?P<pos>[0-9,]*)\])? = (?P<tok>.*)")
_FLOAT = re.compile(r"[+-]?(?:nan|inf|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)")
_INT = re.compile(r"-?\d+")
_SHOWN = 20  # differences listed in a failure, and diff lines shown (times three)
_MAX_FILE = 256 * 1024 * 1024  # bytes: a larger file is refused before it is read


class SnapshotFormatError(ValueError):
    """A snapshot file is not valid pytest-polgrad text; the message names file, line and
    entry."""

    def __init__(self, source: str, line: int, message: str, entry: str | None = None) -> None:
        where = f"{source}, line {line}" + (f", entry {entry!r}" if entry else "")
        super().__init__(f"{where}: {message}")
        self.source, self.line, self.entry = source, line, entry


# ------------------------------------------------------------------------------ model


@dataclasses.dataclass(frozen=True)
class Entry:
    """One named value: a tensor (``kind`` is its dtype) or a Python scalar, with its
    values as written text tokens in row-major order."""

    key: str
    kind: str
    shape: tuple[int, ...]
    values: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Document:
    """A parsed or flattened snapshot: header fields and entries in order."""

    entries: Mapping[str, Entry]
    corpus: int | None = None
    format: int = FORMAT


@dataclasses.dataclass(frozen=True)
class EntryScale:
    """How the float noise of one entry is measured (see :mod:`pytest_polgrad.core.tolerance`).

    ``scale`` is the magnitude rounding errors are proportional to (a float or a tensor of
    the entry's shape); ``count`` marks a scalar that sums ``count`` tokens (the engine's
    loss-value rule); ``skip`` marks positions where only finiteness must agree (clip kinks,
    where rounding may legitimately pick either branch).
    """

    scale: float | torch.Tensor
    count: int | None = None
    skip: torch.Tensor | None = None


@dataclasses.dataclass(frozen=True)
class Tolerant:
    """Data to snapshot plus how to compare it: ``tolerance`` is the engine's model for the
    function (default: each entry's own dtype, strict), ``scales`` maps entry keys to their
    :class:`EntryScale` (default: ``|value| + max |value|`` of the entry), ``corpus`` is the
    corpus version the data was computed on (recorded; a mismatch is reported as such)."""

    data: object
    tolerance: Tolerance | None = None
    scales: Mapping[str, EntryScale] = dataclasses.field(default_factory=dict)
    corpus: int | None = None


class SnapshotText(str):
    """Snapshot text that remembers how to compare it (received side) or where it was read
    from (stored side)."""

    policy: Tolerant | None = None
    location: str | None = None
    retain: bool = False
    unreadable: str | None = None
    """Why the stored file could not be read as text (e.g. not UTF-8); it is then
    reported as corrupted and ``--snapshot-update`` replaces it."""


class SnapshotWriteError(OSError):
    """A snapshot file could not be written (read-only directory, full disk, ...)."""


_WRITE_ERRORS: dict[str, str] = {}


def write_error(location: str) -> str | None:
    """The error of the last failed write of the snapshot at ``location`` in this
    process, if any (syrupy turns a failed write into a plain mismatch)."""
    return _WRITE_ERRORS.get(str(location))


def forget_write_errors() -> None:
    """Forget the write errors of earlier sessions in this process (at session start)."""
    _WRITE_ERRORS.clear()


# ------------------------------------------------------------------------ serialising


def _float_token(x: float, digits: int) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "-0" if math.copysign(1.0, x) < 0 else "0"
    return format(x, f".{digits}g")


def _scalar(key: str, value: object) -> Entry | None:
    if value is None:
        return Entry(key, "none", (), ())
    if isinstance(value, bool):
        return Entry(key, "bool", (), ("true" if value else "false",))
    if isinstance(value, int):
        return Entry(key, "int", (), (str(value),))
    if isinstance(value, float):
        return Entry(key, "float", (), (_float_token(value, DIGITS["float"]),))
    if isinstance(value, str):
        return Entry(key, "str", (), (json.dumps(value),))
    return None


def _tensor(key: str, value: Any) -> Entry:
    t = value.detach().to("cpu")
    kind = str(t.dtype).removeprefix("torch.")
    if kind not in _KINDS or t.layout is not sys.modules["torch"].strided:
        raise TypeError(f"cannot snapshot {key!r}: {t.layout} {kind} tensors are not supported")
    flat = t.reshape(-1).tolist()
    if kind == "bool":
        tokens = tuple("true" if v else "false" for v in flat)
    elif kind in _INTS:
        tokens = tuple(str(v) for v in flat)
    else:
        tokens = tuple(_float_token(float(v), DIGITS[kind]) for v in flat)
    return Entry(key, kind, tuple(t.shape), tokens)


def _walk(value: object, key: str, out: dict[str, Entry]) -> None:
    torch_mod = sys.modules.get("torch")
    if torch_mod is not None and isinstance(value, torch_mod.Tensor):
        entry = _tensor(key or "value", value)
    elif (scalar := _scalar(key or "value", value)) is not None:
        entry = scalar
    else:
        if isinstance(value, Mapping):
            items = list(value.items())
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            items = [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
        elif isinstance(value, (list, tuple)):
            items = list(enumerate(value))
        else:
            raise TypeError(
                f"cannot snapshot {key or 'the value'!r} of type {type(value).__name__}: use "
                "tensors, Python scalars, str, None, and dicts/lists/dataclasses of them"
            )
        for name, item in items:
            part = str(name)
            if not isinstance(name, (str, int)) or not re.fullmatch(_PART, part):
                raise TypeError(
                    f"cannot snapshot key {name!r} under {key or 'the root'!r}: keys are "
                    "str/int without whitespace or any of / [ ] = : #"
                )
            _walk(item, f"{key}/{part}" if key else part, out)
        return
    if entry.key in out:
        raise ValueError(f"two values flatten to the same snapshot key {entry.key!r}")
    out[entry.key] = entry


def flatten(data: object, *, corpus: int | None = None) -> Document:
    """Flatten tensors, scalars and dicts/lists/dataclasses of them into entries keyed by
    their path (``batch/grad``); a bare value is keyed ``value``."""
    entries: dict[str, Entry] = {}
    _walk(data, "", entries)
    return Document(entries, corpus)


def _indices(shape: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    """Row-major positions of ``shape``, one at a time: memory is ``O(len(shape))``, never
    the size of a dimension (``itertools.product`` would store each ``range``)."""
    if any(n == 0 for n in shape):
        return
    index = [0] * len(shape)
    while True:
        yield tuple(index)
        d = len(shape) - 1
        while d >= 0:
            index[d] += 1
            if index[d] < shape[d]:
                break
            index[d] = 0
            d -= 1
        if d < 0:
            return


def _value_line(key: str, index: tuple[int, ...], token: str, shaped: bool) -> str:
    return f"{key}[{','.join(map(str, index))}] = {token}" if shaped else f"{key} = {token}"


def render(doc: Document) -> str:
    """The text of a document: header, then per entry a declaration and its value lines."""
    lines = [_HEADER, f"format = {doc.format}"]
    if doc.corpus is not None:
        lines.append(f"corpus = {doc.corpus}")
    for e in doc.entries.values():
        lines.append(f"{e.key}: {e.kind} [{', '.join(map(str, e.shape))}]")
        lines += [
            _value_line(e.key, i, tok, bool(e.shape))
            for i, tok in zip(_indices(e.shape), e.values, strict=False)
        ]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- parsing


def _check_token(kind: str, token: str) -> bool:
    if kind in DIGITS:
        return bool(_FLOAT.fullmatch(token))
    if kind in _INTS:  # int() of more than 4300 digits raises (CPython's limit)
        return len(token) <= 4000 and bool(_INT.fullmatch(token))
    if kind == "bool":
        return token in ("true", "false")
    if not token.startswith('"'):  # a JSON string literal: nothing nests, nothing recurses
        return False
    try:
        return isinstance(json.loads(token), str)
    except ValueError:
        return False


_BREAK = re.compile("\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


def _lines(text: str) -> Iterator[str]:
    """``text.splitlines()`` one line at a time: no list of every line at once (a file of
    empty lines would cost some 50 times its size)."""
    start = 0
    for m in _BREAK.finditer(text):
        yield text[start : m.start()]
        start = m.end()
    if start < len(text):
        yield text[start:]


def parse(text: str, *, source: str = "<snapshot>") -> Document:
    """Read snapshot text; raise :class:`SnapshotFormatError` naming ``source``, the line
    and the entry on anything malformed."""
    if not text:
        raise SnapshotFormatError(
            source, 1, "the file is empty (0 bytes), not a recorded snapshot: it was truncated"
        )
    if text.startswith("\ufeff"):
        raise SnapshotFormatError(
            source,
            1,
            "the file starts with a UTF-8 byte-order mark (U+FEFF), which pytest-polgrad "
            "never writes (an editor added it): remove it",
        )
    header: dict[str, int] = {}
    entries: dict[str, Entry] = {}
    pending: tuple[Entry, list[str], Iterator[tuple[int, ...]], int] | None = None
    no = 0
    # Bounded by the file, never by what it declares: one value per line, positions made
    # one at a time (a shape of 3e8 x 3e8 over one line is "file ends after 1 of ...").
    for no, raw in enumerate(_lines(text), 1):
        line = raw.rstrip()
        if not line or line.startswith("#"):
            continue
        if pending is not None:
            entry, tokens, positions, expected = pending
            index = next(positions)
            want = _value_line(entry.key, index, "", bool(entry.shape))
            if not line.startswith(want):
                raise SnapshotFormatError(
                    source, no, f"expected the line {want.rstrip()!r}, found {line!r}", entry.key
                )
            token = line[len(want) :]
            if not _check_token(entry.kind, token):
                raise SnapshotFormatError(
                    source, no, f"{token!r} is not a {entry.kind} value", entry.key
                )
            tokens.append(token)
            if len(tokens) == expected:
                entries[entry.key] = dataclasses.replace(entry, values=tuple(tokens))
                pending = None
            continue
        if not entries and (m := re.fullmatch(r"(format|corpus) = (\d+)", line)):
            header[m[1]] = int(m[2])
            if m[1] == "format" and header["format"] > FORMAT:
                raise SnapshotFormatError(
                    source,
                    no,
                    f"written in snapshot format {header['format']} by a newer pytest-polgrad; "
                    f"this version reads format {FORMAT}: upgrade pytest-polgrad",
                )
            continue
        if "format" not in header:
            raise SnapshotFormatError(
                source, no, "not a pytest-polgrad snapshot (no 'format = N' header line first)"
            )
        m = _DECL.fullmatch(line)
        if m is None:
            raise SnapshotFormatError(
                source, no, f"expected an entry declaration 'key: dtype [shape]', found {line!r}"
            )
        key, kind = m["key"], m["kind"]
        if key in entries:
            raise SnapshotFormatError(source, no, "declared twice", key)
        if kind not in _KINDS:
            raise SnapshotFormatError(source, no, f"unknown dtype {kind!r}", key)
        try:
            shape = tuple(int(s) for s in m["shape"].split(",") if s.strip())
        except ValueError:
            raise SnapshotFormatError(source, no, f"bad shape [{m['shape']}]", key) from None
        entry = Entry(key, kind, shape, ())
        count = 0 if kind == "none" else math.prod(shape)
        if count == 0:
            entries[key] = entry
        else:
            pending = (entry, [], _indices(shape), count)
    if pending is not None:
        entry, tokens, _, expected = pending
        raise SnapshotFormatError(
            source, no + 1, f"file ends after {len(tokens)} of {expected} values", entry.key
        )
    if "format" not in header:
        raise SnapshotFormatError(source, 1, "not a pytest-polgrad snapshot (empty or no header)")
    return Document(entries, header.get("corpus"), header["format"])


# ------------------------------------------------------------------------- comparing


@dataclasses.dataclass(frozen=True)
class Difference:
    """One entry or value beyond tolerance; ``position`` is None for a whole entry
    (absent, or another dtype or shape)."""

    key: str
    position: tuple[int, ...] | None
    stored: str
    received: str
    ratio: float
    """``|received - stored| / tolerance`` after the written rounding (inf: not a number
    change, e.g. NaN against a number)."""

    def describe(self) -> str:
        where = self.key
        if self.position:
            where += f"[{','.join(map(str, self.position))}]"
        size = f" ({self.ratio:.3g} x tolerance)" if math.isfinite(self.ratio) else ""
        return f"{where}: stored {self.stored}, received {self.received}{size}"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """Result of :func:`compare`: a header problem, value differences, and the received
    document with every value within tolerance written as stored (what an update writes)."""

    problem: str | None
    differences: tuple[Difference, ...]
    merged: Document

    @property
    def ok(self) -> bool:
        return self.problem is None and not self.differences


def _describe(e: Entry) -> str:
    return f"{e.kind} [{', '.join(map(str, e.shape))}]"


def _exact_ratios(s: Entry, r: Entry) -> list[float]:
    if s.kind in _INTS:
        return [
            0.0 if int(a) == int(b) else math.inf for a, b in zip(s.values, r.values, strict=True)
        ]
    return [0.0 if a == b else math.inf for a, b in zip(s.values, r.values, strict=True)]


def _float_ratios(
    s: Entry, r: Entry, scale: EntryScale | None, tolerance: Tolerance | None
) -> list[float]:
    # torch (and tolerance, which imports it) only when floats are compared: the plugin
    # loads this module at start-up, and a session without goldens must not import torch
    import torch

    from pytest_polgrad.core.tolerance import UNIT_ROUNDOFF, Tolerance

    stored = [float(t) for t in s.values]
    received = [float(t) for t in r.values]
    digits = DIGITS[r.kind]
    ratios = [0.0] * len(stored)
    finite = []
    for i, (e, a) in enumerate(zip(stored, received, strict=True)):
        if math.isnan(e) or math.isnan(a) or math.isinf(e) or math.isinf(a):
            same = (math.isnan(e) and math.isnan(a)) or e == a
            ratios[i] = 0.0 if same else math.inf
        else:
            finite.append(i)
    skip = scale.skip.reshape(-1).tolist() if scale is not None and scale.skip is not None else []
    finite = [i for i in finite if not (skip and skip[i])]
    if not finite:
        return ratios
    e_t = torch.tensor([stored[i] for i in finite], dtype=torch.float64)
    a_t = torch.tensor([received[i] for i in finite], dtype=torch.float64)
    # Both sides were rounded to `digits` significant digits when written.
    rounding = (e_t.abs() + a_t.abs()) * (0.5 * 10.0 ** (1 - digits))
    shrunk = e_t + torch.sign(a_t - e_t) * ((a_t - e_t).abs() - rounding).clamp(min=0.0)
    own = torch.float64 if r.kind == "float" else getattr(torch, r.kind)
    precisions = [own, *(tolerance.precisions if tolerance is not None else ())]
    loosest = max(precisions, key=lambda p: UNIT_ROUNDOFF[p])
    tol = Tolerance(loosest, strict=True, factor=tolerance.factor if tolerance else 1.0)
    if scale is None:
        full = torch.tensor([abs(stored[i]) for i in finite], dtype=torch.float64)
        weights = full + full.max()
    elif isinstance(scale.scale, torch.Tensor):
        weights = scale.scale.detach().to(torch.float64).reshape(-1)[finite]
    else:
        weights = torch.full_like(e_t, float(scale.scale))
    if not s.shape and scale is not None and scale.count is not None:
        cmp = tol.value(float(shrunk[0]), float(e_t[0]), float(weights[0]), scale.count)
        found = [cmp.error]
    else:
        _, per = tol.tensor(shrunk, e_t, weights, torch.ones_like(e_t, dtype=torch.bool))
        found = per.tolist()
    for i, q in zip(finite, found, strict=True):
        ratios[i] = q
    return ratios


def compare(stored: Document, received: Document, policy: Tolerant | None = None) -> Outcome:
    """Compare a stored snapshot with a received one, value by value, within tolerance."""
    if stored.corpus != received.corpus:
        problem = (
            f"the snapshot was recorded on canonical corpus version {stored.corpus}, this "
            f"pytest-polgrad uses version {received.corpus}: the batches changed, so the values "
            "cannot be compared; re-record with --snapshot-update and review the new values"
        )
        return Outcome(problem, (), received)
    diffs: list[Difference] = []
    merged: dict[str, Entry] = {}
    for key, r in received.entries.items():
        s = stored.entries.get(key)
        if s is None or (s.kind, s.shape) != (r.kind, r.shape):
            old = "(absent)" if s is None else _describe(s)
            diffs.append(Difference(key, None, old, _describe(r), math.inf))
            merged[key] = r
            continue
        if r.kind in DIGITS:
            scale = policy.scales.get(key) if policy is not None else None
            ratios = _float_ratios(s, r, scale, policy.tolerance if policy else None)
        else:
            ratios = _exact_ratios(s, r)
        keep = [q <= 1.0 for q in ratios]
        rows = zip(_indices(r.shape), s.values, r.values, ratios, keep, strict=False)  # none: ()
        for index, old, new, q, k in rows:
            if not k:
                diffs.append(Difference(key, index if r.shape else (), old, new, q))
        values = tuple(
            old if k else new for old, new, k in zip(s.values, r.values, keep, strict=True)
        )
        merged[key] = dataclasses.replace(r, values=values)
    for key, s in stored.entries.items():
        if key not in received.entries:
            diffs.append(Difference(key, None, _describe(s), "(absent)", math.inf))
    return Outcome(None, tuple(diffs), Document(merged, received.corpus, received.format))


def _source(data: object) -> str:
    return getattr(data, "location", None) or "<stored snapshot>"


def _policy(data: object) -> Tolerant | None:
    return getattr(data, "policy", None)


def merged_text(stored: str, received: SerializedData) -> str:
    """The received text with each value within tolerance of the stored one kept as
    stored, so an update rewrites only the lines that really changed (no float-noise
    churn). Falls back to the received text when the stored one cannot be read."""
    try:
        old = parse(stored, source="<stored>")
        new = parse(str(received), source="<received>")
    except SnapshotFormatError:
        return str(received)
    return render(compare(old, new, _policy(received)).merged)


# ------------------------------------------------------------------------- file names

_SAFE = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 !#$&'()+,-.;=@[]^_`{}"
)
"""Printable ASCII kept as itself in a file name; everything else (``/ \\ : * ? " < > |``,
``%``, ``~``, control characters, non-ASCII) is written ``%XX`` per UTF-8 byte."""
_STEM_BYTES = 255 - len(".polgrad")
"""The longest stem a file system takes (255 bytes per name, POSIX and NTFS)."""
_DIGEST = 32  # hex digits of sha256 in a hashed name: 128 bits


def _escape(name: str) -> str:
    out = []
    for c in name:
        if c in _SAFE:
            out.append(c)
        else:
            out.append("".join(f"%{b:02X}" for b in c.encode("utf-8", "surrogatepass")))
    text = "".join(out)
    return "%2E" + text[1:] if text.startswith(".") else text  # never a hidden file


def golden_stem(name: str) -> str:
    """The file name (without ``.polgrad``) of the snapshot named ``name``: injective.

    Characters a file system drops, reserves or folds are percent-escaped (``%`` and ``~``
    themselves included), so two names never share a stem; a stem past 247 bytes keeps
    its head and ends in ``~`` and the sha256 of the whole name (128 bits), and ``~``
    occurs in no other stem. ``tests/core/test_golden_names.py`` checks both over random
    names."""
    text = _escape(name)
    if len(text) <= _STEM_BYTES:
        return text
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST]
    head = text[: _STEM_BYTES - 1 - _DIGEST]
    cut = head.rfind("%", len(head) - 2)  # never half an escape: the head stays readable
    return f"{head[:cut] if cut >= 0 else head}~{digest}"


class SnapshotPathError(ValueError):
    """A golden path pytest-polgrad will not read or write: a symbolic link, something
    that is not a regular file, or a snapshot directory outside the rootdir."""


def refuse_unusual(path: Path) -> None:
    """Raise :class:`SnapshotPathError` if ``path`` exists and is not a regular file (a
    symbolic link is never followed: its target is neither read nor shown)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise SnapshotPathError(
            f"{path} is a symbolic link; pytest-polgrad neither follows nor replaces one: "
            "delete it and re-record the golden with pytest --snapshot-update"
        )
    if not stat.S_ISREG(mode):
        what = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise SnapshotPathError(
            f"{path} is {what}, where this test's golden snapshot file belongs: move it away"
        )


# ------------------------------------------------------------------------- extension


class PolgradSnapshotExtension(SingleFileSnapshotExtension):
    """syrupy extension: one ``.polgrad`` text file per snapshot, compared within tolerance.

    Files follow syrupy's single-file layout (``__snapshots__/<test module>/<test>.polgrad``
    beside the test module, ``--snapshot-dirname`` respected); the ini option
    ``polgrad_snapshot_dir`` (relative to the rootdir) moves them to
    ``<dir>/<test module's directory>/<test module>/``. One file is written only by the
    test that owns it, atomically, so xdist workers never share a file.
    """

    file_extension = "polgrad"
    _write_mode = WriteMode.TEXT

    def serialize(
        self,
        data: SerializableData,
        *,
        exclude: PropertyFilter | None = None,
        include: PropertyFilter | None = None,
        matcher: PropertyMatcher | None = None,
    ) -> SerializedData:
        if exclude is not None or include is not None:
            raise TypeError("the polgrad snapshot extension does not support include/exclude")
        if isinstance(data, _Retain):
            text = SnapshotText("")
            text.retain = True
            return text
        policy = data if isinstance(data, Tolerant) else None
        doc = flatten(policy.data if policy else data, corpus=policy.corpus if policy else None)
        text = SnapshotText(render(doc))
        text.policy = policy
        return text

    def matches(
        self, *, serialized_data: SerializableData, snapshot_data: SerializableData
    ) -> bool:
        if getattr(serialized_data, "retain", False):
            return True
        if getattr(snapshot_data, "unreadable", None):
            return False
        try:
            stored = parse(str(snapshot_data), source=_source(snapshot_data))
        except SnapshotFormatError:
            return False
        received = parse(str(serialized_data), source="<received>")
        return compare(stored, received, _policy(serialized_data)).ok

    def diff_lines(
        self, serialized_data: SerializedData, snapshot_data: SerializedData
    ) -> Iterator[str]:
        yield from explain(serialized_data, snapshot_data)

    @classmethod
    def get_snapshot_name(cls, *, test_location: PyTestLocation, index: SnapshotIndex = 0) -> str:
        """The test's snapshot name as an injective file stem (:func:`golden_stem`), where
        syrupy drops ``/`` and other characters and cuts a long name (two tests, one file)."""
        return golden_stem(
            AbstractSyrupyExtension.get_snapshot_name(test_location=test_location, index=index)
        )

    @classmethod
    def matches_test_location(
        cls, *, test_location: PyTestLocation, snapshot_location: str
    ) -> bool:
        """A file is this test's when it is at the test's own location (its escaped or
        hashed name included, which syrupy's prefix matching does not know)."""
        if test_location.matches_snapshot_location(snapshot_location):
            return True
        loc = Path(snapshot_location)
        if loc.parent.name != test_location.basename:
            return False
        if not test_location.matches_snapshot_site(snapshot_location):
            return False
        own = cls.get_snapshot_name(test_location=test_location)
        return loc.name.startswith(own) and loc.name[len(own) :] in (
            f".{cls.file_extension}",
            *(f".{i}.{cls.file_extension}" for i in range(1, 100)),
        )

    def read_snapshot_data_from_location(
        self, *, snapshot_location: str, snapshot_name: str, session_id: str
    ) -> SerializableData | None:
        path = Path(snapshot_location)
        try:
            refuse_unusual(path)
            if path.stat().st_size > _MAX_FILE:
                raise SnapshotPathError(
                    f"{path} holds {path.stat().st_size} bytes, more than any golden "
                    f"pytest-polgrad writes ({_MAX_FILE})"
                )
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(fd, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return None
        except (SnapshotPathError, OSError) as exc:  # never the content of a link's target
            text = SnapshotText("")
            text.unreadable = str(exc)
            text.location = snapshot_location
            return text
        try:
            text = SnapshotText(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            text = SnapshotText(raw.decode("utf-8", errors="replace"))
            text.unreadable = (
                f"{snapshot_location} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at "
                f"offset {exc.start}): it is not a file pytest-polgrad wrote"
            )
        text.location = snapshot_location
        return text

    @classmethod
    def write_snapshot_collection(
        cls, *, snapshot_collection: SnapshotCollection, name_order: dict[str, int] | None = None
    ) -> None:
        data = next(iter(snapshot_collection)).data
        if getattr(data, "retain", False):
            return
        if not isinstance(data, str):
            raise TypeError(f"polgrad snapshots are text, got {type(data).__name__}")
        path = Path(snapshot_collection.location)
        _WRITE_ERRORS.pop(str(path), None)
        try:
            refuse_unusual(path)
            try:
                text = merged_text(path.read_text(encoding="utf-8"), data)
            except (FileNotFoundError, UnicodeDecodeError):  # new, or not ours: replaced
                text = str(data)
            _write_atomic(path, text)
        except (OSError, SnapshotPathError) as exc:
            message = f"could not write snapshot {path}: {type(exc).__name__}: {exc}"
            _WRITE_ERRORS[str(path)] = message
            if isinstance(data, SnapshotText):
                data.unreadable = None
                data.location = str(path)
            raise SnapshotWriteError(message) from exc

    def delete_snapshots(self, *, snapshot_location: str, snapshot_names: set[str]) -> None:
        Path(snapshot_location).unlink(missing_ok=True)

    @classmethod
    def dirname(cls, *, test_location: PyTestLocation) -> str:
        config = getattr(test_location.item, "config", None)
        try:
            configured = str(config.getini("polgrad_snapshot_dir") or "") if config else ""
        except ValueError:  # the ini option is not registered
            configured = ""
        test_dir = Path(test_location.filepath).parent
        if configured and config is not None and test_dir.is_relative_to(config.rootpath):
            base = snapshot_base(config.rootpath, configured)
            return str(base / test_dir.relative_to(config.rootpath) / test_location.basename)
        return super().dirname(test_location=test_location)


def snapshot_base(rootdir: Path, configured: str) -> Path:
    """``rootdir / configured``, the ``polgrad_snapshot_dir`` ini option; raise
    :class:`SnapshotPathError` for one outside the rootdir (absolute, ``..``, or through
    a symbolic link): goldens are written only inside the project."""
    base = rootdir / configured
    root = rootdir.resolve()
    if Path(configured).is_absolute() or not base.resolve().is_relative_to(root):
        raise SnapshotPathError(
            f"ini option polgrad_snapshot_dir = {configured} is outside the rootdir {rootdir}: "
            "give a directory relative to the rootdir, inside it"
        )
    return base


def _write_atomic(path: Path, text: str) -> None:
    """Write via a hidden temporary file and ``os.replace``: a reader (or a killed run)
    never sees a half-written snapshot; syrupy's discovery skips dot-files."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # A short name whatever the golden's length (255 bytes is the limit of one name).
    tag = hashlib.sha256(path.name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    tmp = path.with_name(f".polgrad-{tag}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class _Retain:
    """Asserted by a golden item that failed before it had data: keeps (marks used) the
    stored snapshot, so ``--snapshot-update`` never deletes it for a transient failure."""


RETAIN = _Retain()


def explain(received: SerializedData, stored: SerializedData) -> Iterator[str]:
    """Failure text: what differs (entry, position, stored vs received, size in units of
    tolerance), then the lines ``--snapshot-update`` would change."""
    location = getattr(received, "location", None)
    failed_write = write_error(location) if location else None
    if failed_write:
        yield failed_write
        yield "fix the permissions of the snapshot directory (or free space), then rerun"
        return
    unreadable = getattr(stored, "unreadable", None)
    if unreadable:
        yield f"corrupted snapshot: {unreadable}"
        yield "delete it and re-record it with pytest --snapshot-update"
        return
    if not str(stored) and getattr(stored, "location", None) is None:
        yield "no snapshot stored yet: record it with pytest --snapshot-update"
        return
    try:
        old = parse(str(stored), source=_source(stored))
    except SnapshotFormatError as exc:
        yield f"corrupted or hand-edited snapshot: {exc}"
        yield "fix the file, or delete it and re-record it with pytest --snapshot-update"
        return
    new = parse(str(received), source="<received>")
    outcome = compare(old, new, _policy(received))
    if outcome.problem:
        yield outcome.problem
        return
    diffs = outcome.differences
    entries = len({d.key for d in diffs})
    yield f"{len(diffs)} value(s) in {entries} entry(ies) differ beyond tolerance:"
    for d in diffs[:_SHOWN]:
        yield "  " + d.describe()
    if len(diffs) > _SHOWN:
        yield f"  ... and {len(diffs) - _SHOWN} more"
    yield f"lines --snapshot-update would change in {_source(stored)} (- stored, + received):"
    lines = list(
        difflib.unified_diff(
            str(stored).splitlines(), render(outcome.merged).splitlines(), n=0, lineterm=""
        )
    )[2:]
    yield from lines[: 3 * _SHOWN]
    if len(lines) > 3 * _SHOWN:
        yield f"... and {len(lines) - 3 * _SHOWN} more diff lines"
    yield "an intended change: accept it with pytest --snapshot-update and commit the file"
