"""Malformed-document generator for ``test_fuzz_loaders``: mutations of valid documents.

Deterministic for a given ``random.Random``. Two levels:

- ``mutate_value`` changes a parsed JSON value structurally: a field deleted, duplicated, renamed
  or added, a value replaced by one of another type or by an edge case (NaN, ``1e999``, an integer
  of 5000 digits, 2**63, a negative, a NUL, a path, a lone surrogate escape, a huge string, deep
  nesting). Values that plain JSON cannot express (duplicate keys, ``NaN``, raw number text) are
  ``Raw`` and ``Pairs`` nodes, written out by ``dumps``.
- ``mutate_bytes`` damages encoded bytes: truncation, bit flips, inserted, deleted or replaced
  bytes, invalid UTF-8, a byte order mark, UTF-16, random bytes, empty input.
"""

from __future__ import annotations

import json
import random
from typing import Any, Callable

__all__ = ["Pairs", "Raw", "dumps", "mutate_bytes", "mutate_value"]


class Raw:
    """JSON text written as is (``NaN``, ``1e999``, 5000 digits, ``"\\ud800"``)."""

    def __init__(self, text: str):
        self.text = text


class Pairs:
    """An object as a list of (key, value) pairs: keys may repeat."""

    def __init__(self, pairs: list[tuple[str, Any]]):
        self.pairs = pairs


def dumps(value: Any) -> str:
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, Pairs):
        return "{" + ",".join(json.dumps(key) + ":" + dumps(item) for key, item in value.pairs) + "}"
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(str(key)) + ":" + dumps(item) for key, item in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(dumps(item) for item in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def _deep(rng: random.Random) -> Any:
    depth = rng.choice([99, 100, 101, 150, 1200, 5000])
    opener, closer = rng.choice([("[", "]"), ('{"a":', "}")])
    return Raw(opener * depth + "1" + closer * depth)


def edge_values(rng: random.Random) -> list[Callable[[], Any]]:
    return [
        lambda: None, lambda: True, lambda: False, lambda: 0, lambda: -1, lambda: -(2**63), lambda: 2**63,
        lambda: 2**64 + 1, lambda: 10**400, lambda: 1.5, lambda: -0.0, lambda: 1e308, lambda: "", lambda: "x",
        lambda: "\x00", lambda: "a\x00b", lambda: "../../etc", lambda: "/abs", lambda: "*", lambda: "any",
        lambda: "x" * rng.choice([129, 4097, 70_000]), lambda: "ünï\u2028✓", lambda: [], lambda: {}, lambda: [1, "a"],
        lambda: {"nested": {"x": 1}}, lambda: Raw("NaN"), lambda: Raw("Infinity"), lambda: Raw("-Infinity"),
        lambda: Raw("1e999"), lambda: Raw("-1e999"), lambda: Raw("1" * rng.choice([4301, 5000])),
        lambda: Raw("9" * 400 + ".5"), lambda: Raw('"\\ud800"'), lambda: Raw('"\\udc00x"'), lambda: Raw('"\\u0000"'),
        lambda: _deep(rng), lambda: Raw("[" * 40 + "]" * 40), lambda: "sha256:" + "0" * 64, lambda: 1, lambda: 2,
        lambda: 3.0, lambda: "1",
    ]  # fmt: skip


def _containers(value: Any, path: tuple = ()) -> list[tuple]:
    """Paths to every dict and list inside ``value`` (``value`` itself included)."""
    found = []
    stack = [(value, path)]
    while stack:
        node, where = stack.pop()
        if isinstance(node, dict):
            found.append(where)
            stack.extend((item, where + (key,)) for key, item in node.items())
        elif isinstance(node, list):
            found.append(where)
            stack.extend((item, where + (index,)) for index, item in enumerate(node))
    return found


def _at(value: Any, path: tuple) -> Any:
    for part in path:
        value = value[part]
    return value


def mutate_value(value: Any, rng: random.Random, *, rounds: int = 1) -> Any:
    """A structurally mutated deep copy of the JSON value ``value``."""
    value = json.loads(json.dumps(value))
    for _ in range(rounds):
        value = _mutate_once(value, rng)
    return value


def _mutate_once(value: Any, rng: random.Random) -> Any:
    containers = _containers(value)
    edges = edge_values(rng)
    if not containers or rng.random() < 0.04:
        return edges[rng.randrange(len(edges))]()  # the whole document replaced
    path = rng.choice(containers)
    node = _at(value, path)
    choice = rng.randrange(8)
    if isinstance(node, dict):
        keys = list(node)
        if choice == 0 and keys:
            del node[rng.choice(keys)]
        elif choice == 1 and keys:
            key = rng.choice(keys)
            duplicate = Pairs([*node.items(), (key, edges[rng.randrange(len(edges))]())])
            return _replace(value, path, duplicate)
        elif choice == 2:
            node[rng.choice(["unknown", "extra_field", "schema_version", "format", "\x00", ""])] = edges[rng.randrange(len(edges))]()
        elif choice == 3 and keys:
            key = rng.choice(keys)
            node[key + rng.choice(["_", "X", " "])] = node.pop(key)
        elif keys:
            node[rng.choice(keys)] = edges[rng.randrange(len(edges))]()
        else:
            node["k"] = edges[rng.randrange(len(edges))]()
    else:
        if choice == 0 and node:
            del node[rng.randrange(len(node))]
        elif choice == 1 and node:
            node.append(node[rng.randrange(len(node))])
        elif choice == 2:
            node.insert(rng.randrange(len(node) + 1), edges[rng.randrange(len(edges))]())
        elif node:
            node[rng.randrange(len(node))] = edges[rng.randrange(len(edges))]()
        else:
            node.append(edges[rng.randrange(len(edges))]())
    return value


def _replace(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    _at(value, path[:-1])[path[-1]] = new
    return value


_BAD_UTF8 = [b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xe2\x82", b"\xf8\x88\x80\x80\x80", b"\x80"]


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """``data`` damaged at the byte level."""
    choice = rng.randrange(11)
    size = len(data)
    if choice == 0:
        return data[: rng.randrange(size + 1)]
    if choice == 1 and size:
        index = rng.randrange(size)
        return data[:index] + bytes([data[index] ^ (1 << rng.randrange(8))]) + data[index + 1 :]
    if choice == 2:
        index = rng.randrange(size + 1)
        return data[:index] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 8))) + data[index:]
    if choice == 3 and size:
        index = rng.randrange(size)
        return data[:index] + data[index + rng.randint(1, 16) :]
    if choice == 4:
        index = rng.randrange(size + 1)
        return data[:index] + rng.choice(_BAD_UTF8) + data[index:]
    if choice == 5:
        return b"\xef\xbb\xbf" + data
    if choice == 6:
        try:
            return data.decode("utf-8").encode(rng.choice(["utf-16", "utf-16-le", "utf-32"]))
        except UnicodeDecodeError:
            return data[::-1]
    if choice == 7:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
    if choice == 8:
        return b""
    if choice == 9:
        return data + rng.choice([b"\x00", b"\n", b"}", b" garbage", b"\n" + data])
    return data * 2
