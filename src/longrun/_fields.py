"""Typed field readers for ``from_json``: every malformed field becomes a ``CorruptStateError``.

Records are read from files that a crash, a disk or a person may have damaged. These helpers make
"wrong type", "missing" and "unexpected value" one clear error naming the record and field, so
no ``KeyError`` or ``TypeError`` ever leaks from a loader.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, TypeVar

from .contract import check_step_id, check_task_id
from .errors import CorruptStateError, InvalidInputError, SchemaVersionError

E = TypeVar("E")

MAX_INT = 2**63 - 1
"""The largest integer a record field may hold: what a database's BIGINT column stores."""
RECORD_SCHEMA_VERSION = 1
"""The schema version of control records (lease, approval, cancellation)."""

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


def get_id(data: Mapping[str, Any], name: str, what: str, *, optional: bool = False) -> Any:
    """A string that must be a safe name (see ``contract.check_task_id``)."""
    value = get_str(data, name, what, optional=optional)
    if value is None:
        return None
    try:
        return check_task_id(value, what=f"{what}: field {name!r}")
    except InvalidInputError as exc:
        raise CorruptStateError(str(exc)) from None


def get_step_id(data: Mapping[str, Any], name: str, what: str) -> Any:
    """A string that must be a valid step id (see ``contract.check_step_id``)."""
    value = get_str(data, name, what)
    try:
        return check_step_id(value)
    except InvalidInputError as exc:
        raise CorruptStateError(f"{what}: field {name!r}: {exc}") from None


def get_int(data: Mapping[str, Any], name: str, what: str, *, optional: bool = False, minimum: int = 0) -> Any:
    value = _get(data, name, what, optional)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise CorruptStateError(f"{what}: field {name!r} must be an integer, got {type(value).__name__}")
    if value < minimum:
        raise CorruptStateError(f"{what}: field {name!r} must be >= {minimum}, got {value}")
    if value > MAX_INT:
        raise CorruptStateError(f"{what}: field {name!r} must be <= {MAX_INT}")
    return value


def finite_float(value: object) -> float | None:
    """``value`` as a finite float if it is a finite number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)  # an int too large for a float raises OverflowError
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def get_float(data: Mapping[str, Any], name: str, what: str, *, optional: bool = False) -> Any:
    value = _get(data, name, what, optional)
    if value is None and optional:
        return None
    number = finite_float(value)
    if number is None:
        raise CorruptStateError(f"{what}: field {name!r} must be a finite number, got {type(value).__name__}")
    return number


def check_fields(data: Mapping[str, Any], known: frozenset[str], what: str) -> None:
    """Refuse a field that ``known`` does not name (see the module docstring for why)."""
    if not known.issuperset(data):
        unknown = sorted(str(key) for key in data if key not in known)
        raise CorruptStateError(f"{what}: unknown field{'s' if len(unknown) > 1 else ''} {', '.join(repr(k[:40]) for k in unknown[:5])}")


def check_record_version(data: Mapping[str, Any], what: str) -> None:
    """A control record's optional ``schema_version``: absent (an older record) or the known one."""
    version = data.get("schema_version", RECORD_SCHEMA_VERSION)
    if type(version) is not int or version != RECORD_SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{what}: schema version {version!r:.20} is not supported (this code reads version {RECORD_SCHEMA_VERSION})"
        )


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
