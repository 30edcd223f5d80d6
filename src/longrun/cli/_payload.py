"""A payload for people: pretty-printed JSON, long values elided with their size, nothing hidden.

A payload is written by whoever planned the effect (an agent, a model): attacker-controlled text.
So every string is shown JSON-escaped, and beyond JSON's own escapes every control, format,
separator and private-use character (terminal escape sequences, bidirectional overrides that
reorder what an approver reads, zero-width characters) is shown as ``\\uXXXX``: what the
operator reads is what the bytes say. The console HTML-escapes these lines on top of that.

Elision keeps a payload readable, never misleading: a string longer than ``max_chars`` shows its
start and how many characters it has; a list or object longer than ``max_items`` shows its first
items and how many more there are; nesting deeper than ``max_depth`` shows the size of what is
not shown. The digest always covers the whole payload; ``status --json`` prints it whole.
"""

from __future__ import annotations

import json
import unicodedata

from ..canonical import JSONValue, canonical_bytes

__all__ = ["payload_lines", "safe_text"]

_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Co", "Cs", "Zl", "Zp"})


def safe_text(text: str) -> str:
    """``text`` with every character that could hide or rearrange what is shown escaped as ``\\uXXXX``."""
    if text.isprintable():  # the common case: nothing to escape (isprintable is False for Cc, Cf, Z*...)
        return text
    out = []
    for char in text:
        if char == " " or unicodedata.category(char) not in _UNSAFE_CATEGORIES:
            out.append(char)
        else:
            code = ord(char)
            out.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
    return "".join(out)


def _string(text: str) -> str:
    return safe_text(json.dumps(text, ensure_ascii=False))


def _size(value: JSONValue) -> str:
    try:
        size = len(canonical_bytes(value))
    except (TypeError, ValueError):
        return "?"
    return f"{size:,} bytes"


def payload_lines(value: JSONValue, *, max_chars: int = 200, max_items: int = 20, max_depth: int = 8, width: int = 100) -> list[str]:
    """``value`` as indented JSON lines for display (see the module docstring)."""
    lines: list[str] = []

    def scalar(item: JSONValue) -> str:
        if isinstance(item, str):
            if len(item) > max_chars:
                return f"{_string(item[:max_chars])}… ({len(item):,} characters in all)"
            return _string(item)
        return json.dumps(item)

    def inline(item: JSONValue) -> str | None:
        """A short container of scalars on one line, if it fits in ``width``."""
        if isinstance(item, dict) and len(item) <= max_items and all(not isinstance(v, (dict, list)) for v in item.values()):
            text = "{" + ", ".join(f"{_string(k)}: {scalar(v)}" for k, v in item.items()) + "}"
        elif isinstance(item, list) and all(not isinstance(v, (dict, list)) for v in item):
            more = f", … {len(item) - max_items:,} more items ({_size(item[max_items:])})" if len(item) > max_items else ""
            text = "[" + ", ".join(scalar(v) for v in item[:max_items]) + more + "]"
        else:
            return None
        return text if len(text) <= width else None

    def emit(item: JSONValue, indent: str, prefix: str, depth: int, comma: str) -> None:
        short = inline(item) if depth > 0 else None
        if short is not None:
            lines.append(f"{indent}{prefix}{short}{comma}")
            return
        if isinstance(item, dict):
            if not item:
                lines.append(f"{indent}{prefix}{{}}{comma}")
                return
            if depth >= max_depth:
                lines.append(f"{indent}{prefix}{{…}}{comma}  ({len(item)} keys, {_size(item)} not shown)")
                return
            lines.append(f"{indent}{prefix}{{")
            keys = list(item)
            shown = keys[:max_items]
            for index, key in enumerate(shown):
                last = index == len(shown) - 1 and len(keys) <= max_items
                emit(item[key], indent + "  ", f"{_string(key)}: ", depth + 1, "" if last else ",")
            if len(keys) > max_items:
                lines.append(f"{indent}  … {len(keys) - max_items:,} more keys ({_size({k: item[k] for k in keys[max_items:]})})")
            lines.append(f"{indent}}}{comma}")
        elif isinstance(item, list):
            if not item:
                lines.append(f"{indent}{prefix}[]{comma}")
                return
            if depth >= max_depth:
                lines.append(f"{indent}{prefix}[…]{comma}  ({len(item)} items, {_size(item)} not shown)")
                return
            lines.append(f"{indent}{prefix}[")
            shown_items = item[:max_items]
            for index, element in enumerate(shown_items):
                last = index == len(shown_items) - 1 and len(item) <= max_items
                emit(element, indent + "  ", "", depth + 1, "" if last else ",")
            if len(item) > max_items:
                lines.append(f"{indent}  … {len(item) - max_items:,} more items ({_size(item[max_items:])})")
            lines.append(f"{indent}]{comma}")
        else:
            lines.append(f"{indent}{prefix}{scalar(item)}{comma}")

    emit(value, "", "", 0, "")
    return lines
