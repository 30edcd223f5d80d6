"""Canonical JSON and digests: the one encoding that every digest in longrun is computed over,
and the one strict decoder that every loader reads stored JSON with.

Guarantees: the same JSON value always gives the same bytes (sorted keys, no whitespace, UTF-8,
no NaN or infinity), so a digest pins content across processes and restarts. Tuples are accepted
as lists. ``ensure_json`` refuses, with ``InvalidInputError`` naming the path to the value (for
example ``step 'scan' payload.files[3]: ...``), everything ``parse_json`` would refuse to read back:
what is not plain JSON (sets, bytes, objects, non-string keys), a non-finite number, a string
holding a lone surrogate (a file name from ``os.listdir`` that is not UTF-8, say), an integer of
more than ``MAX_INT_DIGITS`` digits, and nesting deeper than 64 levels. ``canonical_bytes`` and
``digest_of`` raise the same typed error, never a raw ``UnicodeEncodeError`` or ``ValueError``
from inside the encoder; ``digest_of`` also enforces a byte limit when asked (``SizeLimitError``).

``parse_json`` reads what ``canonical_bytes`` (or any careful writer) wrote, and refuses with
``CorruptStateError`` whatever it could not have written: more than the caller's byte limit, bytes
that are not strict UTF-8 (a byte order mark, UTF-16, an encoded surrogate), nesting deeper than
``MAX_JSON_DEPTH`` (checked on the bytes before parsing, so the parser never recurses that deep),
``NaN``, ``Infinity`` and numbers too large for a float (which Python's ``json`` would accept),
integers over Python's digit limit, an escaped lone surrogate (``"\\ud800"``, which no UTF-8
encoder can write back), and, with ``unique_keys``, an object that names a key twice (two readers
could disagree on which one counts). Nothing else escapes it: no ``JSONDecodeError``,
``RecursionError``, ``UnicodeError`` or ``OverflowError``.

A large value (``LARGE_VALUE_BYTES``) is encoded as pieces (``canonical_pieces``: a long string's
UTF-8 bytes apart), hashed piece by piece by ``digest_of`` and remembered for the store that writes
it as a blob (``remembered_encoding``), so its megabytes are encoded once and never joined.

Longer than most modules: it is one concept, the bytes every digest is over and the reader that
refuses whatever those bytes could not be; apart, each would restate the other's rules.
"""

from __future__ import annotations

import collections
import hashlib
import json
import math
import re
import secrets
import threading
from typing import Any, Callable, Final, Mapping, TypeAlias, overload

from .errors import CorruptStateError, InvalidInputError, SizeLimitError

__all__ = [
    "JSONValue",
    "LARGE_VALUE_BYTES",
    "MAX_INT_DIGITS",
    "MAX_JSON_DEPTH",
    "MAX_VALUE_BYTES",
    "REFUSED",
    "canonical_bytes",
    "canonical_pieces",
    "digest_of",
    "ensure_json",
    "json_too_deep",
    "parse_json",
    "plain_or_refused",
    "printable",
    "remembered_encoding",
    "sha256_hex",
    "shown",
    "text_problem",
]

JSONValue: TypeAlias = None | bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"]
"""A value made of dict (str keys), list, str, int, float (finite), bool and None."""

_MAX_DEPTH = 64
MAX_JSON_DEPTH = 100
"""The deepest nesting of arrays and objects a stored document may have. A value passed through
``ensure_json`` nests at most 65 levels; the records around it (envelope, state, effect record;
a snapshot's row line and row; the array a journal replay parses) add fewer than 35."""
MAX_INT_DIGITS = 4300
"""The most decimal digits an integer in stored JSON may have: Python's default limit for
converting between text and ``int``, which ``parse_json`` keeps. Fixed here, so that a writer
that raised its own limit (``sys.set_int_max_str_digits``) still writes only what every reader reads."""
MAX_VALUE_BYTES = 16 * 1024 * 1024
"""The largest canonical encoding of one payload or result that a run records (16 MiB). A payload
over it is refused when its step is planned, before anything is applied; a result over it is
recorded by its digest and size instead (see ``longrun.ledger.recordable_result``). Large data
belongs outside the state: pass a reference (a path, a URL, a digest) instead."""

LARGE_VALUE_BYTES = 64 * 1024
"""A payload or result whose canonical encoding is at least this long (64 KiB) is large: the stores
keep it out of line, once, as a content-addressed blob (``longrun.stores.blobs``), and
``digest_of`` remembers its encoding for them (``remembered_encoding``), so that it is encoded and
hashed once."""

_INT_LIMIT = 10**MAX_INT_DIGITS
_surrogate = re.compile("[\ud800-\udfff]").search


class _Refusal(Exception):
    """Internal: why a value is not plain JSON, and the path to it (innermost part first)."""

    def __init__(self, problem: str):
        super().__init__(problem)
        self.problem = problem
        self.path: list[str | int] = []


def _path(parts: list[str | int]) -> str:
    out = []
    for part in reversed(parts):
        if isinstance(part, int):
            out.append(f"[{part}]")
        elif part.isidentifier() and part.isascii():
            out.append("." + part)
        else:
            out.append(f"[{shown(part, 60)}]")
    return "".join(out)


def shown(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for an error message about a value that may be
    anything: an integer too long to print, an object whose ``repr`` raises."""
    try:
        text = repr(value)
    except Exception:  # int -> str refuses over 4300 digits; a user's __repr__ may raise anything
        size = f" of {value.bit_length()} bits" if isinstance(value, int) else ""
        text = f"<{type(value).__name__}{size}>"
    return printable(text[:limit])


def text_problem(value: str) -> str | None:
    """Why the string ``value`` cannot be stored as JSON text (it holds a lone surrogate), or None."""
    if value.isascii():
        return None
    found = _surrogate(value)
    if found is None:
        return None
    return f"holds a lone surrogate {found.group()!r} at index {found.start()}, which is not text (decode file names before passing them)"


REFUSED: Final = object()
"""What ``plain_or_refused`` returns for a value that is not plain JSON."""


def plain_or_refused(value: object) -> object:
    """``value`` as plain JSON (the copy ``ensure_json`` makes), or ``REFUSED`` if it is not JSON,
    without saying why: for a check that only needs yes or no (``_fields``' fast paths), which
    then falls back to the full check that names the problem."""
    try:
        return _plain(value, 0)
    except _Refusal:
        return REFUSED


def _plain(value: object, depth: int) -> JSONValue:
    if type(value) is str and value.isascii():  # the common cases first
        return value
    if type(value) is int and -_INT_LIMIT < value < _INT_LIMIT:
        return value
    if type(value) is dict and depth < _MAX_DEPTH:  # a plain dict with ASCII keys: no ABC checks on the way
        out: dict[str, JSONValue] = {}
        for key, item in value.items():
            if type(key) is not str or not key.isascii():
                break  # the general path below names the problem, if there is one
            try:
                out[key] = _plain(item, depth + 1)
            except _Refusal as refusal:
                refusal.path.append(key)
                raise
        else:
            return out
    if value is None or value is True or value is False:
        return value
    if isinstance(value, str):
        if not value.isascii():
            problem = text_problem(value)
            if problem is not None:
                raise _Refusal(problem)
        return value
    if isinstance(value, int):
        if -_INT_LIMIT < value < _INT_LIMIT:
            return value
        raise _Refusal(f"is an integer of more than {MAX_INT_DIGITS} digits, which no reader accepts")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Refusal(f"is a non-finite number {shown(value)}")
        return value
    if isinstance(value, Mapping):
        if depth >= _MAX_DEPTH and value:  # as deep as it may go: only an empty one fits
            raise _Refusal(f"is nested deeper than {_MAX_DEPTH} levels")
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise _Refusal(f"has a non-string key {shown(key)}")
            problem = text_problem(key)
            if problem is not None:
                raise _Refusal(f"has a key that {problem}")
            try:
                out[key] = _plain(item, depth + 1)
            except _Refusal as refusal:
                refusal.path.append(key)
                raise
        return out
    if isinstance(value, (list, tuple)):
        if depth >= _MAX_DEPTH and value:
            raise _Refusal(f"is nested deeper than {_MAX_DEPTH} levels")
        items: list[JSONValue] = []
        for index, item in enumerate(value):
            try:
                items.append(_plain(item, depth + 1))
            except _Refusal as refusal:
                refusal.path.append(index)
                raise
        return items
    raise _Refusal(f"is not JSON-able: {type(value).__name__} {shown(value)}")


@overload
def ensure_json(value: Mapping[str, object], *, what: str = "value") -> dict[str, JSONValue]: ...


@overload
def ensure_json(value: object, *, what: str = "value") -> JSONValue: ...


def ensure_json(value: object, *, what: str = "value") -> JSONValue:
    """Return ``value`` as plain JSON (tuples become lists) or raise ``InvalidInputError`` naming
    ``what`` and the path to the offending part (``what.files[3]: holds a lone surrogate ...``)."""
    try:
        return _plain(value, 0)
    except _Refusal as refusal:
        raise InvalidInputError(f"{what}{_path(refusal.path)} {refusal.problem}") from None


def printable(text: str) -> str:
    """``text`` with each lone surrogate replaced by its ``\\udcXX`` escape: for diagnostic text
    (error messages, evidence) composed from strings that may hold one, such as file names."""
    if text.isascii() or _surrogate(text) is None:
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def canonical_bytes(value: JSONValue, *, what: str = "value") -> bytes:
    """The canonical encoding of an already plain JSON value; ``InvalidInputError`` (naming the
    path) if it is not one."""
    try:
        if type(value) is dict or type(value) is list:
            spliced = _spliced_pieces(value)
            if spliced is not None:
                return b"".join(spliced)
        return _dumps(value)
    except (ValueError, TypeError, RecursionError) as exc:  # UnicodeEncodeError is a ValueError
        ensure_json(value, what=what)  # names the offending part, if the rules above catch it
        raise InvalidInputError(f"{what} cannot be encoded as JSON: {type(exc).__name__}: {printable(str(exc)):.200}") from None


def canonical_pieces(value: JSONValue, *, what: str = "value") -> tuple[bytes, ...]:
    """``canonical_bytes`` as the pieces that, joined, make it: a long string's UTF-8 bytes are a
    piece of their own, never copied into one buffer with the rest, so that a large value is
    hashed and written piece by piece (``digest_of``, the stores' blobs)."""
    try:
        if type(value) is dict or type(value) is list:
            spliced = _spliced_pieces(value)
            if spliced is not None:
                return tuple(spliced)
        return (_dumps(value),)
    except (ValueError, TypeError, RecursionError) as exc:  # UnicodeEncodeError is a ValueError
        ensure_json(value, what=what)  # names the offending part, if the rules above catch it
        raise InvalidInputError(f"{what} cannot be encoded as JSON: {type(exc).__name__}: {printable(str(exc)):.200}") from None


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
"""Made once: ``json.dumps`` with options builds an encoder per call (half a small value's cost)."""


def _dumps(value: object) -> bytes:
    return _CANONICAL.encode(value).encode("utf-8")


_LONG_STRING = 16 * 1024
"""A string at least this long, near the top of a value, is spliced into its encoding as bytes."""
_SPLICE_DEPTH = 2
_SPLICE_WIDTH = 32
_ESCAPED = bytes(range(0x20)) + b'"\\'
_NOT_ESCAPED = bytes(sorted(set(range(256)) - set(_ESCAPED)))


def _has_long_string(container: dict[str, Any] | list[Any], depth: int) -> bool:
    """Whether ``container`` (at ``depth``) holds a long string within ``_SPLICE_DEPTH`` levels, in
    containers of at most ``_SPLICE_WIDTH`` items. On every encoding's path: a plain loop, no generator."""
    if len(container) > _SPLICE_WIDTH:
        return False
    deeper = depth + 1 < _SPLICE_DEPTH
    for item in container.values() if type(container) is dict else container:
        if type(item) is str:
            if len(item) >= _LONG_STRING:
                return True
        elif deeper and (type(item) is dict or type(item) is list) and _has_long_string(item, depth + 1):
            return True
    return False


def _spliced_pieces(value: dict[str, Any] | list[Any]) -> list[bytes] | None:
    """The canonical encoding of ``value`` as pieces, built without passing its long strings through the
    JSON encoder (whose escaping scans a string character by character: about 3 ms a megabyte);
    None if ``value`` has none near its top (the caller encodes it the ordinary way).

    A long string that needs no escape (no control character, quote or backslash: what
    ``ensure_ascii=False`` would leave as it is) is replaced by a placeholder that holds a random
    nonce, the rest is encoded as usual, and the string's UTF-8 bytes are spliced in where the
    placeholder's encoding stands. Each placeholder must then occur exactly once, in order;
    otherwise (the value happened to hold the nonce) the ordinary encoding is returned, so the
    bytes are always those of ``json.dumps``."""
    if not _has_long_string(value, 0):
        return None
    nonce = "\x00" + secrets.token_hex(8) + ":"
    pieces: list[bytes] = []

    def substitute(item: Any, depth: int) -> Any:
        if type(item) is str:
            if len(item) < _LONG_STRING:
                return item
            data = item.encode("utf-8")  # a lone surrogate raises: the caller names it
            if data.translate(None, _NOT_ESCAPED):
                return item  # something to escape: left to the encoder
            pieces.append(data)
            return f"{nonce}{len(pieces) - 1}\x00"
        if depth >= _SPLICE_DEPTH:
            return item
        if type(item) is dict and len(item) <= _SPLICE_WIDTH:
            return {key: substitute(inner, depth + 1) for key, inner in item.items()}
        if type(item) is list and len(item) <= _SPLICE_WIDTH:
            return [substitute(inner, depth + 1) for inner in item]
        return item

    skeleton = substitute(value, 0)
    if not pieces:
        return None
    encoded = _dumps(skeleton)
    marker = _dumps(nonce)[1:-1]
    parts = encoded.split(marker)
    if len(parts) != len(pieces) + 1:
        return None
    out = [parts[0]]
    for index, part in enumerate(parts[1:]):
        number, _, rest = part.partition(b"\\u0000")
        if number != str(index).encode("ascii"):
            return None
        out.append(pieces[index])
        out.append(rest)
    return out


_remembered: collections.OrderedDict[int, tuple[object, tuple[bytes, ...], str, int]] = collections.OrderedDict()
_remembered_lock = threading.Lock()
_REMEMBER_COUNT = 8
_REMEMBER_BYTES = 32 * 1024 * 1024


def _remember(value: object, pieces: tuple[bytes, ...], hex_digest: str, size: int) -> None:
    """Keep the encoding (its pieces, ``size`` bytes in all) and digest of a large value for
    ``remembered_encoding`` (the most recent few, at most ``_REMEMBER_BYTES`` in all). The entry
    holds the value itself, so its ``id`` is not reused while the entry lives."""
    with _remembered_lock:
        _remembered[id(value)] = (value, pieces, hex_digest, size)
        _remembered.move_to_end(id(value))
        total = sum(entry[3] for entry in _remembered.values())
        while _remembered and (len(_remembered) > _REMEMBER_COUNT or total > _REMEMBER_BYTES):
            _, (_, _, _, dropped) = _remembered.popitem(last=False)
            total -= dropped


def remembered_encoding(value: object) -> tuple[tuple[bytes, ...], str] | None:
    """The canonical encoding (as ``canonical_pieces``) and SHA-256 (hex) that ``digest_of`` computed for this very object,
    if it was large (``LARGE_VALUE_BYTES``) and is among the last few; the entry is handed over
    (removed). A store uses it to write a large payload without encoding or hashing it again; the
    value must not have been changed since it was digested (the engine never changes a payload)."""
    with _remembered_lock:
        entry = _remembered.get(id(value))
        if entry is None or entry[0] is not value:
            # A record keeps the plain copy ``ensure_json`` made of what was digested: the same
            # containers, copied, around the very same leaves (strings, numbers).
            entry = next((item for item in reversed(_remembered.values()) if _same_leaves(item[0], value)), None)
            if entry is None:
                return None
        del _remembered[id(entry[0])]
    return entry[1], entry[2]


_SAME_LEAVES_BUDGET = 4096
"""The most containers ``_same_leaves`` walks before it gives up (the caller then encodes)."""


def _same_leaves(a: object, b: object) -> bool:
    """Whether ``a`` and ``b`` are containers of the same types and keys, in the same order, around
    identical leaf objects: then they encode alike (a leaf of another type, ``1`` for ``1.0``,
    is another object). False when that cannot be told within ``_SAME_LEAVES_BUDGET`` containers."""
    budget = [_SAME_LEAVES_BUDGET]

    def same(x: Any, y: Any) -> bool:
        if x is y:
            return True
        kind = type(x)
        if kind is not type(y) or (kind is not dict and kind is not list):
            return False
        budget[0] -= 1
        if budget[0] < 0 or len(x) != len(y):
            return False
        if kind is dict:
            return list(x) == list(y) and all(same(item, y[key]) for key, item in x.items())
        return all(same(item, other) for item, other in zip(x, y))

    return (type(a) is dict or type(a) is list) and same(a, b)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest_of(
    value: object,
    *,
    what: str = "value",
    max_bytes: int | None = None,
    limit_name: str = "MAX_VALUE_BYTES",
    checked: bool = False,
    pieces: tuple[bytes, ...] | None = None,
) -> str:
    """SHA-256 over the canonical JSON of ``value`` (validated first, unless ``checked`` says it is
    the plain JSON ``ensure_json`` returned; ``pieces``, its ``canonical_pieces`` if the caller
    made them already). With ``max_bytes``, an encoding longer than that raises ``SizeLimitError``
    naming ``limit_name``. The pieces are hashed one after another, never joined."""
    if pieces is None:
        pieces = canonical_pieces(value if checked else ensure_json(value, what=what), what=what)  # type: ignore[arg-type]
    size = len(pieces[0]) if len(pieces) == 1 else sum(map(len, pieces))
    if max_bytes is not None and size > max_bytes:
        raise SizeLimitError(
            f"{what} is {size} bytes encoded, over the {max_bytes}-byte limit ({limit_name}); "
            "keep large data outside the run's state and pass a reference to it",
            size=size,
            limit=max_bytes,
            limit_name=limit_name,
        )
    hasher = hashlib.sha256(pieces[0])
    for piece in pieces[1:]:
        hasher.update(piece)
    hex_digest = hasher.hexdigest()
    if checked and size >= LARGE_VALUE_BYTES:  # ``value`` itself was encoded: a store may write it as is
        _remember(value, pieces, hex_digest, size)
    return "sha256:" + hex_digest


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
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    compact = data.translate(_DEPTH_BRACKETS, _DEPTH_DELETE)  # its quotes and brackets, {} read as []
    if compact.count(b"[") <= limit:  # fewer openers than the limit: counted on the short bytes, not twice on all
        return False
    if b'"' in (compact := compact.replace(b'""', b"")):
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
