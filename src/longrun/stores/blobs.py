"""Large payloads and results, kept out of line: content-addressed, checksummed blobs.

An effect record's ``payload`` or ``result`` (the receipt's, the observation's, a durable call's
recorded value) whose canonical encoding is at least ``BLOB_MIN_BYTES`` (64 KiB) is stored once,
as a blob: exactly its canonical bytes (``canonical.canonical_bytes``), named by their SHA-256.
The record as stored holds ``null`` in that field and a reference map beside its fields::

    "blobs": {"payload": {"sha256": "<64 lowercase hex>", "bytes": <size>}, "result": {...}}

(only the fields that went out of line; a record with none has no map). The JSON-file store
keeps a blob as the file ``<task>/blobs/<hex>``; the SQL stores as a row of ``longrun_blobs``;
``MemoryStore`` in the task's records. A blob is written before, or in the same transaction as,
the first state that references it, and never rewritten: a compaction or a later commit writes
the reference, not the bytes. (The JSON-file store moves a blob file that fails its digest to the
task's quarantine, and then writes the same content afresh when a commit needs it.)

Reading: ``BlobRef.from_json`` / ``refs_from_json`` validate the reference shape, and
``decode_blob`` checks a blob's size and SHA-256 against its reference before parsing it with
``canonical.parse_json``; a missing or mismatching blob raises ``CorruptStateError`` (damage,
never a value quietly dropped). A value read back is the value written: the bytes are its
canonical encoding, and JSON parsing of canonical bytes gives back an equal value.

``BlobCodec`` is what a store object keeps per task: which values went out of line, remembered by
the identity of the value (a record's payload object is shared by every later copy of the record),
so that a value is encoded and hashed once, and the digest the engine computed at planning is
reused (``canonical.remembered_encoding``). Not guaranteed: a value changed in place after it was
recorded is not seen (the engine never changes one).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from ..canonical import LARGE_VALUE_BYTES, JSONValue, canonical_bytes, parse_json, remembered_encoding, sha256_hex
from ..errors import CorruptStateError
from ..envelope import MAX_STATE_BYTES

__all__ = [
    "BLOBS_KEY", "BLOB_FIELDS", "BLOB_MIN_BYTES", "Blob", "BlobCodec", "BlobFetcher", "BlobRef", "decode_blob", "large_values", "refs_from_json",
    "refs_to_json", "resolve_record_json", "stored_record_json",
]  # fmt: skip

BLOB_MIN_BYTES = LARGE_VALUE_BYTES
"""A payload or result whose canonical encoding is at least this long (64 KiB) is kept as a blob."""
BLOB_FIELDS = ("payload", "result")
"""The effect record fields whose value may be kept as a blob."""
BLOBS_KEY = "blobs"
"""The name of the reference map beside a stored record's fields."""
_HEX = re.compile(r"[0-9a-f]{64}")
_REF_FIELDS = frozenset(("sha256", "bytes"))
_SMALL_CACHE_BYTES = 1024
"""Values encoded shorter than this are measured again when needed (cheaper than remembering them)."""


@dataclasses.dataclass(frozen=True, slots=True)
class BlobRef:
    """A reference to a blob: the SHA-256 (hex) of its bytes and their number."""

    sha256: str
    size: int

    def to_json(self) -> dict[str, JSONValue]:
        return {"sha256": self.sha256, "bytes": self.size}

    @classmethod
    def from_json(cls, data: object, what: str = "blob reference") -> "BlobRef":
        if type(data) is not dict or data.keys() != _REF_FIELDS:
            raise CorruptStateError(f"{what} must be an object with sha256 and bytes, got {data!r:.80}")
        digest, size = data["sha256"], data["bytes"]
        if type(digest) is not str or _HEX.fullmatch(digest) is None:
            raise CorruptStateError(f"{what}: sha256 must be 64 lowercase hex digits, got {digest!r:.80}")
        if type(size) is not int or not BLOB_MIN_BYTES <= size <= MAX_STATE_BYTES:
            raise CorruptStateError(f"{what}: bytes must be an integer from {BLOB_MIN_BYTES} to {MAX_STATE_BYTES}, got {size!r:.40}")
        return cls(digest, size)


def refs_to_json(refs: Mapping[str, BlobRef]) -> dict[str, JSONValue] | None:
    """The reference map as stored (None when no field went out of line)."""
    if not refs:
        return None
    return {name: ref.to_json() for name, ref in refs.items()}


def refs_from_json(data: object, what: str) -> dict[str, BlobRef]:
    """A stored reference map, validated (``CorruptStateError``); None reads as no references."""
    if data is None:
        return {}
    if type(data) is not dict or not data or not set(BLOB_FIELDS).issuperset(data):
        raise CorruptStateError(f"{what}: the blob references must be a non-empty object naming {list(BLOB_FIELDS)}, got {data!r:.80}")
    return {name: BlobRef.from_json(value, f"{what}: the blob reference of {name}") for name, value in data.items()}


def decode_blob(ref: BlobRef, data: bytes | None, what: str) -> JSONValue:
    """The value a blob holds, checked against its reference; ``CorruptStateError`` if it is missing,
    of another size or digest, or not the canonical JSON it must be."""
    if data is None:
        raise CorruptStateError(f"{what}: blob {ref.sha256} is missing")
    if len(data) != ref.size:
        raise CorruptStateError(f"{what}: blob {ref.sha256} is {len(data)} bytes, its reference says {ref.size}")
    if sha256_hex(data) != ref.sha256:
        raise CorruptStateError(f"{what}: blob {ref.sha256} does not match its SHA-256 (damaged)")
    return parse_json(data, what=f"{what}: blob {ref.sha256}", max_bytes=MAX_STATE_BYTES)


_SMALL_BOUND_ITEMS = 64
"""The most items ``_surely_small`` looks at before it gives up (the caller then encodes)."""


def _surely_small(value: object) -> bool:
    """Whether the canonical encoding of ``value`` is certainly under ``BLOB_MIN_BYTES``, from an
    upper bound on its length (at most 6 bytes a character, every separator counted) over at most
    ``_SMALL_BOUND_ITEMS`` items; False when that does not tell. Most payloads and results are a
    few fields: this spares them an encoding on every commit that names them."""
    total = 0
    items = 0
    stack: list[Any] = [value]  # Any: checked by exact type below, which mypy does not narrow
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str:
            total += 6 * len(item) + 3  # quotes and a separator
        elif kind is dict:
            items += len(item)
            if items > _SMALL_BOUND_ITEMS:
                return False
            total += 2
            for key, inner in item.items():
                if type(key) is not str:
                    return False
                total += 6 * len(key) + 4  # quotes, colon, separator
                stack.append(inner)
        elif kind is list:
            items += len(item)
            if items > _SMALL_BOUND_ITEMS:
                return False
            total += 2
            stack.extend(item)
        elif item is None or kind is bool:
            total += 6
        elif kind is int:
            total += item.bit_length() // 3 + 3
        elif kind is float:
            total += 26
        else:
            return False
    return total < BLOB_MIN_BYTES


class Blob(NamedTuple):
    """A blob to write: its reference and its bytes, as the pieces its encoding was made of
    (``canonical.canonical_pieces``: a long string's bytes apart), written one after another."""

    ref: BlobRef
    pieces: tuple[bytes, ...]

    @property
    def data(self) -> bytes:
        """The bytes in one buffer, for a store that writes a value, not a file (a database row)."""
        return self.pieces[0] if len(self.pieces) == 1 else b"".join(self.pieces)


class BlobCodec:
    """One task's large values as one store object knows them (see the module docstring).

    Keeps, by identity, the reference of every value measured large (and of those measured small
    but not tiny, as ``None``), the bytes of blobs not yet known to be stored, and which blobs are
    known stored. Touched only inside the task's transaction."""

    def __init__(self) -> None:
        self._known: dict[int, tuple[object, BlobRef | None]] = {}
        self._unwritten: dict[str, tuple[bytes, ...]] = {}
        self.stored: set[str] = set()
        """The blobs (hex) known to be durable in the store (written, or read and verified)."""

    @property
    def remembered(self) -> int:
        """How many values it remembers (``keep_only`` bounds it)."""
        return len(self._known)

    def ref_of(self, value: object) -> BlobRef | None:
        """The reference ``value`` is stored under, or None if it is stored inline."""
        kind = type(value)
        if value is None or kind is bool or kind is int or kind is float:
            return None
        if kind is str and 6 * len(value) + 2 < BLOB_MIN_BYTES:  # type: ignore[arg-type]
            return None  # even escaped, it could not reach the threshold
        if (kind is dict or kind is list) and (not value or _surely_small(value)):
            return None
        known = self._known.get(id(value))
        if known is not None and known[0] is value:
            return known[1]
        found = remembered_encoding(value)
        if found is not None:
            pieces, digest = found  # as digest_of made them: neither encoded nor hashed again
            size = sum(map(len, pieces))
        else:
            data = canonical_bytes(value)  # type: ignore[arg-type]
            if len(data) < BLOB_MIN_BYTES:
                if len(data) >= _SMALL_CACHE_BYTES:
                    self._known[id(value)] = (value, None)
                return None
            pieces, digest, size = (data,), sha256_hex(data), len(data)
        ref = BlobRef(digest, size)
        self._known[id(value)] = (value, ref)
        if digest not in self.stored:
            self._unwritten[digest] = pieces
        return ref

    def split(self, values: Iterable[tuple[str, object]]) -> tuple[list[object], dict[str, BlobRef]]:
        """``values`` (field name, value) as stored: a large one replaced by None, and the references."""
        out: list[object] = []
        refs: dict[str, BlobRef] = {}
        for name, value in values:
            ref = self.ref_of(value)
            if ref is None:
                out.append(value)
            else:
                out.append(None)
                refs[name] = ref
        return out, refs

    def to_write(self, refs: Iterable[BlobRef]) -> list[Blob]:
        """The blobs among ``refs`` not known to be stored, with their bytes."""
        blobs: dict[str, Blob] = {}
        for ref in refs:
            if ref.sha256 in self.stored or ref.sha256 in blobs:
                continue
            pieces = self._unwritten.get(ref.sha256)
            if pieces is None:
                pieces = (self._encode_again(ref),)
            blobs[ref.sha256] = Blob(ref, pieces)
        return list(blobs.values())

    def _encode_again(self, ref: BlobRef) -> bytes:
        for value, known in self._known.values():
            if known is not None and known.sha256 == ref.sha256:
                data = canonical_bytes(value)  # type: ignore[arg-type]
                if sha256_hex(data) == ref.sha256:
                    return data
        raise CorruptStateError(f"blob {ref.sha256} is neither stored nor held by this store object")

    def written(self, blobs: Iterable[Blob]) -> None:
        """The blobs are durable (their commit, or their directory's fsync, returned)."""
        for blob in blobs:
            self.stored.add(blob.ref.sha256)
            self._unwritten.pop(blob.ref.sha256, None)

    def read(self, value: object, ref: BlobRef) -> None:
        """``value`` was read from the stored blob ``ref`` (verified): nothing to write for it."""
        self._known[id(value)] = (value, ref)
        self.stored.add(ref.sha256)

    def forget_stored(self) -> None:
        """What is stored may have changed (a failed write, another writer): check again."""
        self.stored.clear()

    def keep_only(self, live: Iterable[object]) -> None:
        """Forget every value but ``live`` (the state's payloads and results), so memory follows the state."""
        ids = {id(value) for value in live}
        self._known = {key: entry for key, entry in self._known.items() if key in ids}
        keep = {entry[1].sha256 for entry in self._known.values() if entry[1] is not None}
        self._unwritten = {digest: pieces for digest, pieces in self._unwritten.items() if digest in keep}


def large_values(records: Iterable[Any]) -> list[object]:
    """Every payload and result of ``records`` (effect records): what ``BlobCodec.keep_only`` keeps."""
    out: list[object] = []
    for record in records:
        out.append(record.payload)
        out.append(record.result)
    return out


def stored_record_json(record: Any, blobs: BlobCodec, introduced: list[BlobRef]) -> dict[str, JSONValue]:
    """An effect record's JSON (``EffectRecord.to_json``) as stored: a large payload or result null,
    and the reference map under ``BLOBS_KEY`` (each reference also added to ``introduced``)."""
    body: dict[str, JSONValue] = record.to_json()
    (payload, result), refs = blobs.split((("payload", record.payload), ("result", record.result)))
    if refs:
        body["payload"] = payload  # type: ignore[assignment]
        body["result"] = result  # type: ignore[assignment]
        body[BLOBS_KEY] = refs_to_json(refs)
        introduced.extend(refs.values())
    return body


def resolve_record_json(data: object, fetch: Callable[[BlobRef, str], object], what: str) -> object:
    """A stored record's JSON with its blob references resolved by ``fetch`` (which checks each
    blob): what ``EffectRecord.from_json`` reads. Anything else is returned as it is, for the
    record's own rules to judge."""
    if type(data) is not dict or BLOBS_KEY not in data:
        return data
    refs = refs_from_json(data[BLOBS_KEY], what)
    out = {key: value for key, value in data.items() if key != BLOBS_KEY}
    for name, ref in refs.items():
        if out.get(name) is not None:
            raise CorruptStateError(f"{what}: its {name} is both inline and a blob")
        out[name] = fetch(ref, f"{what} {name}")
    return out


class BlobFetcher:
    """Resolves references against ``blobs`` (hex -> bytes, or a callable that reads one), each
    blob read and checked once; ``seen`` lists what it read, for a ``BlobCodec``."""

    def __init__(self, read: Callable[[str], bytes | None]):
        self.read = read
        self.values: dict[str, object] = {}
        self.seen: list[tuple[object, BlobRef]] = []

    def __call__(self, ref: BlobRef, what: str) -> object:
        value = self.values.get(ref.sha256)
        if value is None:
            value = decode_blob(ref, self.read(ref.sha256), what)
            self.values[ref.sha256] = value
            self.seen.append((value, ref))
        return value
