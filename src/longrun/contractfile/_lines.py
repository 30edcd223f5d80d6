"""Where a key is written in a TOML document: the line numbers a contract file's errors name."""

from __future__ import annotations

import re
from typing import Mapping

from ._records import Path

__all__ = ["key_lines", "line_of"]


_HEADER = re.compile(r"\[\[\s*(?P<array>[^\[\]]+?)\s*\]\]|\[\s*(?P<table>[^\[\]]+?)\s*\]")
_BARE_OR_QUOTED = r'(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|\'[^\']*\')'
_KEY = re.compile(rf"(?P<key>{_BARE_OR_QUOTED}(?:\s*\.\s*{_BARE_OR_QUOTED})*)\s*=")
_KEY_PART = re.compile(_BARE_OR_QUOTED)


def _key_parts(text: str) -> tuple[str, ...]:
    return tuple(part.strip("\"'") for part in _KEY_PART.findall(text))


def key_lines(text: str) -> dict[Path, int]:
    """The line of every table header and key in a TOML document that ``tomllib`` accepted.

    A line scanner, not a parser: it follows ``[table]`` and ``[[array]]`` headers (numbering the
    entries of an array of tables) and ``key = `` at the start of a line, and skips the inside of
    multi-line strings. Enough to point at the line an error is about; a key it cannot place is
    reported at its table's line.
    """
    lines: dict[Path, int] = {}
    counts: dict[tuple[str, ...], int] = {}
    current: Path = ()
    open_string: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if open_string is not None:
            if line.count(open_string) % 2 == 1:
                open_string = None
            continue
        if not stripped or stripped.startswith("#"):
            continue
        header = _HEADER.match(stripped) if stripped.startswith("[") else None
        if header is not None:
            if header.group("array") is not None:
                name = _key_parts(header.group("array"))
                counts[name] = counts.get(name, -1) + 1
                current = (*name, counts[name])
            else:
                current = _key_parts(header.group("table"))
            lines.setdefault(current, number)
            continue
        key = _KEY.match(stripped)
        if key is None:
            continue
        lines.setdefault((*current, *_key_parts(key.group("key"))), number)
        rest = stripped[key.end() :]
        for quote in ('"""', "'''"):
            if rest.count(quote) % 2 == 1:
                open_string = quote
                break
    return lines


def line_of(lines: Mapping[Path, int], path: Path) -> int | None:
    while path:
        if path in lines:
            return lines[path]
        path = path[:-1]
    return None
