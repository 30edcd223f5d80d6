"""Typed field readers for ``from_json``: every malformed field becomes a ``CorruptStateError``.

Records are read from files that a crash, a disk or a person may have damaged. These helpers make
"wrong type", "missing" and "unexpected value" one clear error naming the record and field, so
no ``KeyError`` or ``TypeError`` ever leaks from a loader.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, TypeVar

from .errors import CorruptStateError

E = TypeVar("E")

_MISSING = object()


def require_mapping(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise CorruptStateError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _get(data: Mapping[str, Any], name: str, what: str, optional: bool) -> Any:
    value = data.get(name, _MISSING)
    if value is _MISSING:
        if optional:
            return None
        raise CorruptStateError(f"{what}: field {name!r} is missing")
    return value


def get_str(data: Mapping[str, Any], name: str, what: str, *, optional: bool = False) -> Any:
    value = _get(data, name, what, optional)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise CorruptStateError(f"{what}: field {name!r} must be a string, got {type(value).__name__}")
    return value


def get_int(data: Mapping[str, Any], name: str, what: str, *, optional: bool = False, minimum: int = 0) -> Any:
    value = _get(data, name, what, optional)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise CorruptStateError(f"{what}: field {name!r} must be an integer, got {type(value).__name__}")
    if value < minimum:
        raise CorruptStateError(f"{what}: field {name!r} must be >= {minimum}, got {value}")
    return value


def get_float(data: Mapping[str, Any], name: str, what: str, *, optional: bool = False) -> Any:
    value = _get(data, name, what, optional)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise CorruptStateError(f"{what}: field {name!r} must be a finite number, got {value!r:.40}")
    return float(value)


def get_bool(data: Mapping[str, Any], name: str, what: str) -> bool:
    value = _get(data, name, what, False)
    if not isinstance(value, bool):
        raise CorruptStateError(f"{what}: field {name!r} must be true or false")
    return value


def get_list(data: Mapping[str, Any], name: str, what: str) -> list[Any]:
    value = _get(data, name, what, False)
    if not isinstance(value, list):
        raise CorruptStateError(f"{what}: field {name!r} must be a list, got {type(value).__name__}")
    return value


def get_str_list(data: Mapping[str, Any], name: str, what: str) -> tuple[str, ...]:
    items = get_list(data, name, what)
    for item in items:
        if not isinstance(item, str):
            raise CorruptStateError(f"{what}: field {name!r} must hold strings only")
    return tuple(items)


def get_enum(data: Mapping[str, Any], name: str, what: str, enum: type[E]) -> E:
    raw = get_str(data, name, what)
    try:
        return enum(raw)  # type: ignore[call-arg]
    except ValueError:
        raise CorruptStateError(f"{what}: field {name!r} has unknown value {raw!r:.60}") from None
