"""Canonical JSON and digests: the one encoding that every digest in longrun is computed over,
and the one strict decoder that every loader reads stored JSON with.

Guarantees: the same JSON value always gives the same bytes (sorted keys, no whitespace, UTF-8,
no NaN or infinity), so a digest pins content across processes and restarts. Tuples are accepted
as lists. Anything that is not plain JSON (sets, bytes, objects, non-string keys) is refused with
``InvalidInputError`` instead of being coerced.

``parse_json`` reads what ``canonical_bytes`` (or any careful writer) wrote, and refuses with
``CorruptStateError`` whatever it could not have written: more than the caller's byte limit, bytes
that are not strict UTF-8 (a byte order mark, UTF-16, an encoded surrogate), nesting deeper than
``MAX_JSON_DEPTH`` (checked on the bytes before parsing, so the parser never recurses that deep),
``NaN``, ``Infinity`` and numbers too large for a float (which Python's ``json`` would accept),
integers over Python's digit limit, an escaped lone surrogate (``"\\ud800"``, which no UTF-8
encoder can write back), and, with ``unique_keys``, an object that names a key twice (two readers
could disagree on which one counts). Nothing else escapes it: no ``JSONDecodeError``,
``RecursionError``, ``UnicodeError`` or ``OverflowError``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any, Callable, Mapping, TypeAlias, overload

from .errors import CorruptStateError, InvalidInputError

__all__ = [
    "JSONValue",
    "MAX_JSON_DEPTH",
    "canonical_bytes",
    "digest_of",
    "ensure_json",
    "json_too_deep",
    "parse_json",
    "sha256_hex",
]

JSONValue: TypeAlias = None | bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"]
"""A value made of dict (str keys), list, str, int, float (finite), bool and None."""

_MAX_DEPTH = 64
MAX_JSON_DEPTH = 100
"""The deepest nesting of arrays and objects a stored document may have. A value passed through
``ensure_json`` nests at most 65 levels; the records around it (envelope, state, effect record;
a snapshot's row line and row; the array a journal replay parses) add fewer than 35."""


@overload
def ensure_json(value: Mapping[str, object], *, what: str = "value", _depth: int = 0) -> dict[str, JSONValue]: ...


@overload
def ensure_json(value: object, *, what: str = "value", _depth: int = 0) -> JSONValue: ...


def ensure_json(value: object, *, what: str = "value", _depth: int = 0) -> JSONValue:
    """Return ``value`` as plain JSON (tuples become lists) or raise ``InvalidInputError``."""
    if _depth > _MAX_DEPTH:
        raise InvalidInputError(f"{what} is nested deeper than {_MAX_DEPTH} levels")
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInputError(f"{what} contains a non-finite number {value!r}")
        return value
    if isinstance(value, Mapping):
        out: dict[str, JSONValue] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidInputError(f"{what} has a non-string key {key!r}")
            out[key] = ensure_json(item, what=what, _depth=_depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [ensure_json(item, what=what, _depth=_depth + 1) for item in value]
    raise InvalidInputError(f"{what} is not JSON-able: {type(value).__name__} {value!r:.80}")


def canonical_bytes(value: JSONValue) -> bytes:
    """The canonical encoding of an already plain JSON value."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode(
        "utf-8"
    )


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest_of(value: object, *, what: str = "value") -> str:
    """SHA-256 over the canonical JSON of ``value`` (validated first)."""
    return "sha256:" + sha256_hex(canonical_bytes(ensure_json(value, what=what)))


# -- the strict decoder -----------------------------------------------------------------------

_DEPTH_DELETE = bytes(sorted(set(range(256)) - set(b'"[]{}')))
_DEPTH_BRACKETS = bytes.maketrans(b"{}", b"[]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def json_too_deep(data: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON text ``data`` nests arrays and objects deeper than ``limit``, judged on the
    bytes alone (so that no parser has to recurse to find out).

    Every step is a C-level bytes operation: escaped backslashes and quotes are dropped, then
    everything but quotes and brackets, then the strings (after the escapes are gone, quotes
    alternate open and close), and each pass of removing innermost ``[]`` pairs lowers the depth
    by one. For text that is not valid JSON the answer may be wrong either way; the parser refuses
    such text anyway, and an unbalanced remainder counts as too deep.
    """
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    compact = data.translate(_DEPTH_BRACKETS, _DEPTH_DELETE).replace(b'""', b"")
    if b'"' in compact:
        compact = b"".join(compact.split(b'"')[::2])
    depth = 0
    while compact:
        if depth >= limit:
            return True
        shorter = compact.replace(b"[]", b"")
        if len(shorter) == len(compact):
            return True  # unbalanced: not JSON, and no parser should be asked
        compact, depth = shorter, depth + 1
    return False


def _finite_float(
    text: str, _float: Callable[[str], float] = float, _infinite: tuple[float, float] = (math.inf, -math.inf)
) -> float:
    value = _float(text)  # JSON number syntax never gives NaN, only an overflow to +-inf
    if value in _infinite:
        raise ValueError(f"number {text:.40} is out of range for a float")
    return value


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document = dict(pairs)
    if len(document) != len(pairs):
        seen: set[str] = set()
        duplicate = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise ValueError(f"key {duplicate!r:.60} appears twice in one object")
    return document


_DECODER = json.JSONDecoder(parse_float=_finite_float, parse_constant=_no_constant)
_UNIQUE_DECODER = json.JSONDecoder(
    parse_float=_finite_float, parse_constant=_no_constant, object_pairs_hook=_unique_object
)


def parse_json(data: bytes | str, *, what: str, max_bytes: int, unique_keys: bool = False) -> JSONValue:
    """Parse stored JSON strictly (see the module docstring) or raise ``CorruptStateError``.

    ``data`` is the bytes read, or text a database column held (judged by its UTF-8 encoding)."""
    if isinstance(data, str):
        if len(data) > max_bytes:  # a character is at least one byte: refuse before encoding
            raise CorruptStateError(f"{what} is over the {max_bytes}-byte limit")
        try:
            data = data.encode("utf-8")
        except UnicodeEncodeError:
            raise CorruptStateError(f"{what} holds a lone surrogate, which is not text") from None
    if len(data) > max_bytes:
        raise CorruptStateError(f"{what} is {len(data)} bytes, over the {max_bytes}-byte limit")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptStateError(f"{what} is not UTF-8: {exc}") from None
    if json_too_deep(data):
        raise CorruptStateError(f"{what} nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        value: JSONValue = (_UNIQUE_DECODER if unique_keys else _DECODER).decode(text)
    except (ValueError, RecursionError, OverflowError) as exc:  # RecursionError: belt and braces
        raise CorruptStateError(f"{what} is not valid JSON: {exc}") from None
    if "\\u" in text and _SURROGATE_ESCAPE.search(text):
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise CorruptStateError(f"{what} holds an escaped lone surrogate, which is not text") from None
    return value
