"""The notes of passing checks, for the summaries (imports nothing: the plugin's terminal
summary runs on the xdist controller, which never imports torch)."""

from __future__ import annotations


def passing_notes(notes: list[tuple[str, list[str]]], *, limit: int = 20) -> list[str]:
    """Lines for the notes of passing checks, ``(function, notes)``, sorted by function (xdist
    reports in completion order): each note once per function, a precision note once with
    the quantities it was seen on (``value, d loss / d logprobs: consistent with ...``), at
    most ``limit`` lines and then how many more. A note says how a passing function differs from the
    reference's arithmetic or inputs (float32 inside, a KL term it does not take), which a
    passing verdict alone does not show."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for function, texts in notes:
        for text in texts:
            what, sep, rest = text.partition(": consistent with ")
            body = f"consistent with {rest}" if sep else text
            quantities = grouped.setdefault((function, body), [])
            if sep and what not in quantities:
                quantities.append(what)
    lines = [
        f"{function}: {', '.join(quantities)}: {body}" if quantities else f"{function}: {body}"
        for (function, body), quantities in sorted(grouped.items())
    ]
    if len(lines) > limit:
        lines = [*lines[:limit], f"... and {len(lines) - limit} more (--polgrad-report)"]
    return lines
