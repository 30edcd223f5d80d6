"""Canonical JSON and digests: the one encoding that every digest in longrun is computed over.

Guarantees: the same JSON value always gives the same bytes (sorted keys, no whitespace, UTF-8,
no NaN or infinity), so a digest pins content across processes and restarts. Tuples are accepted
as lists. Anything that is not plain JSON (sets, bytes, objects, non-string keys) is refused with
``InvalidInputError`` instead of being coerced.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Mapping

from .errors import InvalidInputError

__all__ = ["JSONValue", "canonical_bytes", "digest_of", "ensure_json", "sha256_hex"]

JSONValue = Any
"""A value made of dict (str keys), list, str, int, float (finite), bool and None."""

_MAX_DEPTH = 64


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
