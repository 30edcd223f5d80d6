"""One schema per record, for both directions: field specs that ``from_json`` reads with and that
a record is checked against before it is written.

Records are read from files that a crash, a disk or a person may have damaged. ``read`` makes
"wrong type", "missing" and "unexpected value" one clear ``CorruptStateError`` naming the record
and field, so no ``KeyError`` or ``TypeError`` ever leaks from a loader. ``check`` applies the
very same rules to a record about to be built or written and raises ``InvalidInputError`` instead,
so that a value the loader would refuse (a dict where text belongs, ``123`` as evidence, a lone
surrogate, an integer over ``MAX_INT``, a NaN) is refused at the call that made it, before
anything is committed, rather than written and then found unreadable.

One rule is enforced in two places: that a ``JSON`` or ``OBJECT`` field holds plain JSON (finite
numbers, text without lone surrogates, integers of at most ``canonical.MAX_INT_DIGITS`` digits,
bounded nesting). Reading relies on ``canonical.parse_json``, which refuses all of these in the
bytes; ``check`` walks the value with ``canonical.ensure_json`` and stores the plain copy (tuples
become lists), so that the record equals what reading it back gives.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence, TypeVar, cast

from .canonical import REFUSED, ensure_json, plain_or_refused, shown, text_problem
from .names import SAFE_NAME, STEP_ID_PATTERN, are_step_ids, check_step_id, check_task_id
from .errors import CorruptStateError, InvalidInputError, SchemaVersionError

E = TypeVar("E")

MAX_INT = 2**63 - 1
"""The largest integer a record field may hold: what a database's BIGINT column stores."""
RECORD_SCHEMA_VERSION = 1
"""The schema version of control records (lease, approval, cancellation)."""

_MISSING = object()


def require_mapping(value: object, what: str) -> Mapping[str, Any]:
    if type(value) is dict:  # what a parser returns: no ABC check (a load makes one call per record)
        return value
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
    if not value.isascii():
        problem = text_problem(value)
        if problem is not None:
            raise CorruptStateError(f"{what}: field {name!r} {problem}")
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


# -- field specs: one set of rules, read and written ---------------------------------------------


class Kind(enum.Enum):
    TEXT = "text"
    """A string without lone surrogates."""
    NAME = "name"
    """A safe name (``contract.check_task_id``)."""
    STEP = "step"
    """A step id (``contract.check_step_id``): a safe name that may also hold ``: / @ + =``."""
    RECORD = "record"
    """A nested record of type ``Field.record`` (``to_json``/``from_json``), stored as a JSON object."""
    INT = "int"
    """An integer (not a bool) from ``Field.minimum`` to ``MAX_INT``."""
    NUMBER = "number"
    """A finite number (not a bool); read as a float."""
    BOOL = "bool"
    JSON = "json"
    """Any plain JSON value."""
    OBJECT = "object"
    """A JSON object."""
    TEXTS = "texts"
    """A list of strings without lone surrogates."""
    CHOICE = "choice"
    """A member of ``Field.choices`` (an enum), stored as its value."""
    TUPLE = "tuple"
    """A tuple of values of kind ``Field.item`` (one that needs no other setting: ``TEXT``, ``NAME``,
    ``STEP``, ...), stored as a JSON list."""


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    kind: Kind
    optional: bool = False
    """None is allowed, and a missing field reads as None."""
    minimum: int = 0
    choices: type[enum.Enum] | None = None
    record: Any = None
    """For ``Kind.RECORD``: the record class, with ``from_json`` (raising ``CorruptStateError``)."""
    item: Kind | None = None
    """For ``Kind.TUPLE``: the kind of each value."""


_PLAIN_ITEMS: dict[Kind, Callable[[Sequence[str]], object]] = {
    Kind.TEXT: lambda items: "".join(items).isascii(),
    Kind.NAME: lambda items: all(map(SAFE_NAME.fullmatch, items)),
    Kind.STEP: are_step_ids,
}  # fmt: skip
"""For a ``TUPLE`` of strings of these kinds: a test that passes if every item is plain (ASCII text,
a name, a step id), for a quick pass over all of them before ``_problem`` looks at each."""


def _problem(field: Field, value: object, *, reading: bool) -> str | None:
    """Why ``value`` does not fit ``field`` as the record holds it, or None. JSON values are only
    type-checked here: ``check`` walks them, and what is read was walked by ``parse_json``."""
    kind = field.kind
    if value is None and (field.optional or kind is Kind.JSON):
        return None
    if kind is Kind.TEXT:
        if not isinstance(value, str):
            return f"must be a string, got {type(value).__name__}"
        return None if value.isascii() else text_problem(value)
    if kind is Kind.NAME:
        if not isinstance(value, str) or not SAFE_NAME.fullmatch(value):
            return f"{shown(value)} is not a safe name: use 1-128 of [A-Za-z0-9._-], starting with a letter or digit"
        return None
    if kind is Kind.STEP:
        if not isinstance(value, str) or not STEP_ID_PATTERN.fullmatch(value):
            return f"{shown(value)} is not a step id: use 1-256 of [A-Za-z0-9._:/@+=-], starting with a letter or digit"
        return None
    if kind is Kind.RECORD:  # a record object where one is built or committed; read from a JSON object
        if isinstance(value, field.record):  # ``read`` turns a stored JSON object into one first
            return None
        return f"must be a {field.record.__name__} (a JSON object when stored), got {type(value).__name__}"
    if kind is Kind.INT:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be an integer, got {type(value).__name__}"
        if value < field.minimum:
            return f"must be >= {field.minimum}, got {shown(value, 40)}"
        if value > MAX_INT:
            return f"must be <= {MAX_INT}"
        return None
    if kind is Kind.NUMBER:
        if finite_float(value) is None:
            return f"must be a finite number, got {type(value).__name__} {shown(value, 40)}"
        return None
    if kind is Kind.BOOL:
        return None if isinstance(value, bool) else "must be true or false"
    if kind is Kind.CHOICE:
        assert field.choices is not None
        return None if isinstance(value, field.choices) else f"must be a {field.choices.__name__}, got {type(value).__name__}"
    if kind is Kind.TEXTS:
        if not isinstance(value, (list, tuple)):
            return f"must be a list, got {type(value).__name__}"
        for item in value:
            if not isinstance(item, str):
                return "must hold strings only"
            problem = None if item.isascii() else text_problem(item)
            if problem is not None:
                return f"holds a string that {problem}"
        return None
    if kind is Kind.TUPLE:
        if not isinstance(value, (list, tuple)):
            return f"must be a list, got {type(value).__name__}"
        assert field.item is not None
        plain = _PLAIN_ITEMS.get(field.item)
        if plain is not None and set(map(type, value)) <= {str} and plain(value):
            return None  # the common case, in C loops: an outline holds a plan's every step id
        item = Field(field.name, field.item)
        for index, element in enumerate(value):
            problem = _problem(item, element, reading=reading)
            if problem is not None:
                return f"item {index}: {problem}"
        return None
    if kind is Kind.OBJECT and not isinstance(value, dict if reading else Mapping):
        return "must be a JSON object"
    return None


def read(spec: Sequence[Field], data: Mapping[str, Any], what: str) -> dict[str, Any]:
    """The fields ``spec`` names, read from ``data`` (a parsed JSON object) and converted to what the
    record holds (numbers as floats, enum members); ``CorruptStateError`` for any that does not fit."""
    values: dict[str, Any] = {}
    for field in spec:
        name = field.name
        value = data.get(name, _MISSING)
        if value is _MISSING:
            if field.optional or field.kind is Kind.JSON:
                values[name] = None
                continue
            raise CorruptStateError(f"{what}: field {name!r} is missing")
        kind = field.kind
        if kind is Kind.RECORD and isinstance(value, dict):
            values[name] = field.record.from_json(value)
            continue
        if kind is Kind.CHOICE and isinstance(value, str):
            assert field.choices is not None
            try:
                values[name] = field.choices(value)
            except ValueError:
                raise CorruptStateError(f"{what}: field {name!r} has unknown value {value!r:.60}") from None
            continue
        problem = _problem(field, value, reading=True)
        if problem is not None:
            raise CorruptStateError(f"{what}: field {name!r} {problem}")
        if kind is Kind.NUMBER and value is not None:
            values[name] = float(value)
        elif kind is Kind.TEXTS:
            values[name] = list(cast("list[str]", value))
        elif kind is Kind.TUPLE:
            values[name] = tuple(cast("list[Any]", value))
        else:
            values[name] = value
    return values


def check(spec: Sequence[Field], record: object, what: str, *, shallow: bool = False) -> None:
    """Refuse, with ``InvalidInputError``, a record whose fields ``read`` would refuse once written.

    The record is also made to hold what reading it back gives: JSON fields are walked
    (``canonical.ensure_json``, which names the path to a bad part) and replaced by their plain
    copy (tuples become lists), numbers become floats, lists of strings lists. For ``__post_init__``
    of frozen records, and for the mutable ``RunState``.

    ``shallow`` checks types only and changes nothing, JSON values only as far as their own type:
    for a store about to encode a record, whose encoder refuses what the walk would."""
    for field in spec:
        name = field.name
        value = getattr(record, name)
        problem = _problem(field, value, reading=shallow)
        if problem is not None:
            raise InvalidInputError(f"{what}: field {name!r} {problem}")
        if shallow or value is None:
            continue
        kind = field.kind
        if kind is Kind.JSON or kind is Kind.OBJECT:
            object.__setattr__(record, name, ensure_json(value, what=f"{what}: {name}"))
        elif kind is Kind.NUMBER and type(value) is not float:
            object.__setattr__(record, name, float(value))
        elif kind is Kind.TEXTS and type(value) is not list:
            object.__setattr__(record, name, list(cast("tuple[str, ...]", value)))
        elif kind is Kind.TUPLE and type(value) is not tuple:
            object.__setattr__(record, name, tuple(cast("list[Any]", value)))


_FAST_ITEM_TESTS = {
    Kind.TEXT: "type(x) is str and (x.isascii() or _text(x))",
    Kind.NAME: "type(x) is str and _safe_name(x) is not None",
    Kind.STEP: "type(x) is str and _step_id(x) is not None",
}
"""``fast_check``'s test of one value ``x`` of a ``TUPLE``, by the kind of its items."""


def fast_check(spec: Sequence[Field], *, shallow: bool = False) -> Callable[[object], bool]:
    """A function that checks a record against ``spec`` as ``check`` does, and makes the same
    changes, in the common case only: it returns False, instead of raising, as soon as a field is
    anything but the plain case (an error, or an int where a float belongs, non-ASCII text), and
    the caller then runs ``check``, which decides and names the problem.

    Records are checked where they are built, some on every effect's path (budget counters, a new
    effect record, the state's header at each commit); a loop over the spec costs several times
    more. So the loop is unrolled once, here, from the spec itself: the rules stay in one place.
    """
    lines = ["def fast(record):"]
    names: dict[str, Any] = {
        "_text": lambda value: text_problem(value) is None,
        "_safe_name": SAFE_NAME.fullmatch,
        "_step_id": STEP_ID_PATTERN.fullmatch,
        "_plain": plain_or_refused,
        "_REFUSED": REFUSED,
        "_set": object.__setattr__,
        "MAX_INT": MAX_INT,
    }
    for index, field in enumerate(spec):
        kind, name = field.kind, field.name
        lines.append(f"    v = record.{name}")
        none_ok = "v is None or " if field.optional else ""
        if kind is Kind.TEXT:
            test = f"{none_ok}(type(v) is str and (v.isascii() or _text(v)))"
        elif kind is Kind.NAME:
            test = f"{none_ok}(type(v) is str and _safe_name(v) is not None)"
        elif kind is Kind.STEP:
            test = f"{none_ok}(type(v) is str and _step_id(v) is not None)"
        elif kind is Kind.RECORD:
            names[f"_record{index}"] = field.record
            test = f"{none_ok}type(v) is _record{index}"
        elif kind is Kind.INT:
            test = f"{none_ok}(type(v) is int and {field.minimum} <= v <= MAX_INT)"
        elif kind is Kind.NUMBER:
            test = f"{none_ok}(type(v) is float and v - v == 0.0)"  # finite: inf - inf and nan - nan are nan
        elif kind is Kind.BOOL:
            test = f"{none_ok}(v is True or v is False)"
        elif kind is Kind.CHOICE:
            names[f"_choices{index}"] = field.choices
            test = f"{none_ok}type(v) is _choices{index}"
        elif kind is Kind.TEXTS:
            test = f"{none_ok}(type(v) is list and all(type(x) is str and (x.isascii() or _text(x)) for x in v))"
        elif kind is Kind.OBJECT:
            test = f"{none_ok}type(v) is dict"
        elif kind is Kind.TUPLE:
            item = _FAST_ITEM_TESTS.get(field.item) if field.item is not None else None  # else ``check`` decides
            test = f"{none_ok}(type(v) is tuple and all({item} for x in v))" if item else "False"
        else:
            test = ""
        if test:
            lines.append(f"    if not ({test}): return False")
        if not shallow and kind in (Kind.OBJECT, Kind.JSON):
            lines += [
                "    if v is not None:",
                "        v = _plain(v)",
                "        if v is _REFUSED: return False",
                f"        _set(record, {name!r}, v)",
            ]
    lines.append("    return True")
    exec("\n".join(lines), names)  # the source is built from the spec above, never from data
    function: Callable[[object], bool] = names["fast"]
    return function


def fast_read(spec: Sequence[Field]) -> Callable[[Mapping[str, Any]], "list[Any] | None"]:
    """A function that reads ``spec``'s fields from a parsed object as ``read`` does, in the
    common case only, returning their values in spec order; or None as soon as a field is anything
    else (missing, an int where a float belongs, non-ASCII text, an error), and the caller then
    runs ``read``, which decides and names the problem. For records a load reads by the thousand
    (effect records); built from the spec, like ``fast_check``."""
    lines = ["def fast(data):", "    get = data.get"]
    names: dict[str, Any] = {
        "_safe_name": SAFE_NAME.fullmatch, "_step_id": STEP_ID_PATTERN.fullmatch, "_MISSING": _MISSING, "MAX_INT": MAX_INT
    }  # fmt: skip
    results = []
    for index, field in enumerate(spec):
        kind, value = field.kind, f"v{index}"
        results.append(value)
        if field.optional or kind is Kind.JSON:
            lines.append(f"    {value} = get({field.name!r})")
            none_ok = f"{value} is None or "
        else:
            lines.append(f"    {value} = get({field.name!r}, _MISSING)")
            none_ok = ""
        if kind is Kind.TEXT:
            test = f"{none_ok}(type({value}) is str and {value}.isascii())"
        elif kind is Kind.NAME:
            test = f"{none_ok}(type({value}) is str and _safe_name({value}) is not None)"
        elif kind is Kind.STEP:
            test = f"{none_ok}(type({value}) is str and _step_id({value}) is not None)"
        elif kind is Kind.RECORD:
            test = f"{value} is None"  # a nested record is read by the general reader
        elif kind is Kind.INT:
            test = f"{none_ok}(type({value}) is int and {field.minimum} <= {value} <= MAX_INT)"
        elif kind is Kind.NUMBER:
            test = f"{none_ok}(type({value}) is float and {value} - {value} == 0.0)"
        elif kind is Kind.BOOL:
            test = f"{none_ok}({value} is True or {value} is False)"
        elif kind is Kind.OBJECT:
            test = f"{none_ok}type({value}) is dict"
        elif kind is Kind.CHOICE:
            assert field.choices is not None
            names[f"_members{index}"] = {member.value: member for member in field.choices}
            lines.append(f"    {value} = _members{index}.get({value}) if type({value}) is str else None")
            test = f"{value} is not None"
        elif kind is Kind.TEXTS:
            test = f"{none_ok}(type({value}) is list and all(type(x) is str and x.isascii() for x in {value}))"
        elif kind is Kind.TUPLE:
            test = "False"  # read turns the list into a tuple
        else:
            test = ""  # JSON: parse_json has checked it
        if test:
            lines.append(f"    if not ({test}): return None")
    lines.append(f"    return [{', '.join(results)}]")
    exec("\n".join(lines), names)  # the source is built from the spec above, never from data
    function: Callable[[Mapping[str, Any]], list[Any] | None] = names["fast"]
    return function
