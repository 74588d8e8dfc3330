"""The notes of passing checks, for the summaries (imports nothing: the plugin's terminal
summary runs on the xdist controller, which never imports torch)."""

from __future__ import annotations


def passing_notes(notes: list[tuple[str, list[str]]], *, limit: int = 20) -> list[str]:
    """Lines for the notes of passing checks, ``(function, notes)`` in order: each note once
    per function (``value`` and ``gradient`` often say the same thing), at most ``limit``
    lines and then how many more. A note says how a passing function differs from the
    reference's arithmetic or inputs (float32 inside, a KL term it does not take), which a
    passing verdict alone does not show."""
    seen: dict[tuple[str, str], None] = {}
    for function, texts in notes:
        for text in texts:
            seen.setdefault((function, text), None)
    lines = [f"{function}: {text}" for function, text in seen]
    if len(lines) > limit:
        lines = [*lines[:limit], f"... and {len(lines) - limit} more (--polgrad-report)"]
    return lines
