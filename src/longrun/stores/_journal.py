"""The encodings of the JSON-file store's snapshot and journal: line framing, checksums, compact records.

Both kinds of file are UTF-8 text, one JSON document per line, so ``head``, ``tail`` and ``grep``
work on them::

    line 1    the meta: a JSON object with "format", "schema_version", "task_id", what the file
              holds, and "checksum": SHA-256 over the canonical JSON of the other fields
    line 2..  framed lines: "<16 hex> <JSON>", the hex being the first 8 bytes of SHA-256 over
              the JSON bytes exactly as written; JSON escapes every control character, so a
              body never contains a newline and every line is one frame

A snapshot (format ``longrun.snapshot``) holds one whole ``RunState``. Its meta names the revision
and how many effect records and row lines follow; line 2 is the header (every field but the effect
records, as a flat object: ``budget.attempts_total`` and so on); each further line holds up to
``ROWS_PER_LINE`` effect records, in plan order, as columns (schema version 2)::

    {"n": count, "columns": [column per field the meta names, in EFFECT_FIELDS order]}
    column: [value, ...] (count values)  or  {"all": value} (every record that one scalar)

so a load parses a state, an action, an epoch or a null once a line, not once a record, and checks
each column in a pass (``EffectColumns``). A version 1 snapshot holds each line as a list of rows
(a row: the values in ``EFFECT_FIELDS`` order) and still loads. Files written before rows had a
``backoff`` (their meta's ``fields`` say so, a journal row is one value shorter) and before the
header had the budget's worked time still load, those values absent.
The header holds ``plan_outline`` only when the state has one (a declared plan's, see
``envelope.PlanOutline``); a journal record sets it only when it changed, compared by identity.

A journal (format ``longrun.journal``) continues a chain of revisions from its meta's ``base``.
Each framed line is one commit and names only what changed since the previous one::

    {"rev": base + k, "epoch": E,
     "set": {header key: value},                          header fields that changed
     "extend": {list key: {"drop": n, "add": [...]}},      list = list[n:] + add (bounded lists)
     "effects": {step id: row | {field: value} | null}}   new record, changed fields, removed

So a commit costs bytes in proportion to what it changed, not to the size of the ledger. After its
last line a journal holds zero bytes written ahead of use; its content ends at the first zero byte.

Invariants (the tests in ``tests/test_journal.py`` are built to break them):

1. A line is accepted only if its checksum matches; a snapshot is accepted only if every line is,
   and its meta's counts match what follows, so a snapshot cut at a line boundary is refused too.
2. Within a journal the revisions are contiguous (``base + 1``, ``base + 2``, ...) and the epochs
   never decrease; a checksum-valid record that breaks this is damage, not data.
3. ``scan`` calls the last line *torn* only if it is incomplete (no newline yet) and not a whole,
   valid frame that lost only its newline to damage. Anything else that fails is *damaged*.
4. Decoding validates every field through the records' own rules (``RunState.from_json``, typed
   field checks for rows and columns) after parsing with ``canonical.parse_json`` (no NaN, no nesting deeper
   than ``MAX_JSON_DEPTH``, strict UTF-8; a meta line is at most ``MAX_META_BYTES`` and has no
   duplicate keys); no ``JSONDecodeError``, ``KeyError``, ``TypeError``, ``RecursionError`` or
   ``OverflowError`` escapes, only ``CorruptStateError`` and its subclasses. A header or row field
   the format does not know is refused.

Not guaranteed here: anything about files, order of writes or recovery. ``jsonfile`` does that.

The module, in order: the lines (format names and limits, ``no_gc``, ``checksum`` and ``frame``,
meta lines, ``scan``, which tells a torn last line from damage), the rows (``EFFECT_FIELDS`` and the
older and blob-carrying widths, ``row_of`` and ``record_from_row``, ``record_changes``, the header
and ``build_state``), the snapshot file (its columns, ``EffectColumns``, ``encode_snapshot``,
``decode_snapshot`` into a ``RawSnapshot``, ``snapshot_revision``), and the journal file (its meta, ``Shadow``, the writer's
side that names what a commit changed, ``Replay``, the reader's side that applies records to a
snapshot's raw header and rows, ``describe_record`` and ``highest_epoch``).

Longer than most modules: it is one concept, the encoding of a task's state on disk, whose parts
call one another at every commit and every load (a journal record names rows, a snapshot holds
them, both are framed lines); apart, each file reached into the others' private layouts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import itertools
import json
import math
import operator
import threading
from typing import Any, Callable, Collection, Generator, Mapping, Sequence

from .._fields import MAX_INT, finite_float
from ..budget import Backoff, BudgetCounters
from ..canonical import MAX_JSON_DEPTH, canonical_bytes, ensure_json, json_too_deep, parse_json, printable, sha256_hex
from ..envelope import MAX_STATE_BYTES, RunState
from ..errors import CorruptStateError, ForeignStateError, InvalidInputError, SchemaVersionError, SizeLimitError
from ..ledger import EffectRecord, EffectState
from ..names import are_step_ids, check_step_id
from ..outcome import Status
from .blobs import BLOBS_KEY, BlobCodec, BlobRef, refs_from_json, refs_to_json

__all__ = [
    "BLOB_ROW_FIELDS",
    "CHECKSUM_HEX",
    "EFFECT_FIELDS",
    "JOURNAL_FORMAT",
    "MIN_RECORD_BYTES",
    "SNAPSHOT_FORMAT",
    "SNAPSHOT_SCHEMA_VERSION",
    "BlobFetch",
    "EffectColumns",
    "RawSnapshot",
    "Replay",
    "Scan",
    "Shadow",
    "build_state",
    "checksum",
    "decode_snapshot",
    "describe_record",
    "encode_journal_meta",
    "encode_snapshot",
    "frame",
    "highest_epoch",
    "journal_base",
    "no_gc",
    "parse_meta",
    "record_from_row",
    "row_of",
    "scan",
    "snapshot_revision",
]


# -- lines and framing ------------------------------------------------------------


SNAPSHOT_FORMAT = "longrun.snapshot"
JOURNAL_FORMAT = "longrun.journal"
SCHEMA_VERSION = 1
"""The journal's schema version, and the snapshot's first (effect records as rows)."""
SNAPSHOT_SCHEMA_VERSION = 2
"""The snapshot's schema version as written: effect records as columns (see ``encode_snapshot``).
Version 1 snapshots (rows) still load; code that reads only version 1 refuses a version 2
snapshot with ``SchemaVersionError`` rather than calling it damaged."""
SNAPSHOT_VERSIONS = (SCHEMA_VERSION, SNAPSHOT_SCHEMA_VERSION)
ROWS_PER_LINE = 1000
CHECKSUM_HEX = 16
MIN_RECORD_BYTES = 32
"""No journal line is shorter than this; bounds how many revisions a damaged journal may hold."""
MAX_META_BYTES = 64 * 1024
"""A meta line is a few hundred bytes; one longer than this is damage."""

_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"), check_circular=False)
encode_json = _ENCODER.encode
_sha256 = hashlib.sha256


_gc_pause_lock = threading.Lock()
_gc_pauses = 0
_gc_was_enabled = False


@contextlib.contextmanager
def no_gc() -> Generator[None, None, None]:
    """Pause the cyclic garbage collector while decoding.

    Decoding a large state allocates hundreds of thousands of small containers, none of them in a
    cycle; without the pause every few thousand allocations start a collection that walks all of
    them, which makes loading super-linear. Reference counting still frees everything.

    The collector's switch is global to the process, so pauses are counted under a lock: the first
    to start turns it off (if it was on), the last to end turns it back on. Each thread remembering
    the switch for itself would let one thread read "off" while another's pause held it, and then
    leave it off for good.
    """
    global _gc_pauses, _gc_was_enabled
    with _gc_pause_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_pause_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()


# -- lines ------------------------------------------------------------------------------------


def checksum(body: bytes) -> bytes:
    return _sha256(body).hexdigest()[:CHECKSUM_HEX].encode("ascii")


def frame(value: object) -> bytes:
    """One framed line for a JSON value: ``<checksum> <json>\\n``; ``InvalidInputError`` (naming
    the path to the part) if the value is not plain JSON, raised before any byte is written."""
    try:
        body = encode_json(value).encode("utf-8")
    except (ValueError, TypeError, RecursionError) as exc:  # records are checked when built: a backstop
        ensure_json(value, what="journal record")  # raises InvalidInputError naming the part
        raise InvalidInputError(f"journal record cannot be encoded: {printable(str(exc)):.200}") from None
    if json_too_deep(body):  # what a load would refuse; values checked when built never nest this deep
        raise InvalidInputError(f"a journal line would nest deeper than {MAX_JSON_DEPTH} levels, which no load reads")
    return checksum(body) + b" " + body + b"\n"


def meta_line(fields: dict[str, Any]) -> bytes:
    document = dict(fields)
    document["checksum"] = "sha256:" + sha256_hex(canonical_bytes(fields))
    return canonical_bytes(document) + b"\n"


def parse_meta(
    line: bytes, *, expected_format: str, task_id: str, versions: tuple[int, ...] = (SCHEMA_VERSION,)
) -> dict[str, Any]:
    """Validate a file's first line (without its newline) and return its fields; its
    ``schema_version`` must be one of ``versions``.

    Order matters: a well-formed meta of a schema this code does not know raises
    ``SchemaVersionError`` even though its checksum (over the newer fields) cannot match here.
    """
    document = parse_json(line, what=f"{expected_format} meta line", max_bytes=MAX_META_BYTES, unique_keys=True)
    if not isinstance(document, dict) or document.get("format") != expected_format:
        raise CorruptStateError(f"not a {expected_format} file (its first line is not a {expected_format} meta)")
    version = document.get("schema_version")
    if type(version) is not int or version not in versions:
        known = " and ".join(map(str, versions))
        raise SchemaVersionError(
            f"{expected_format} schema version {version!r:.20} is not supported (this code reads version {known})"
        )
    fields = {key: value for key, value in document.items() if key != "checksum"}
    try:
        actual = "sha256:" + sha256_hex(canonical_bytes(fields))
    except (TypeError, ValueError) as exc:
        raise CorruptStateError(f"{expected_format} meta cannot be re-encoded: {exc}") from exc
    if document.get("checksum") != actual:
        raise CorruptStateError(f"{expected_format} meta checksum does not match its content")
    if document.get("task_id") != task_id:
        raise ForeignStateError(f"{expected_format} belongs to task {document.get('task_id')!r:.80}, not {task_id!r}")
    return fields


def line_body(line: bytes) -> bytes | None:
    """The JSON bytes of a framed line (without its newline) if its checksum matches, else None."""
    if len(line) <= CHECKSUM_HEX + 1 or line[CHECKSUM_HEX] != 0x20:
        return None
    body = line[CHECKSUM_HEX + 1 :]
    if checksum(body) != line[:CHECKSUM_HEX]:
        return None
    return body


def loads(body: bytes, what: str) -> Any:
    return parse_json(body, what=what, max_bytes=MAX_STATE_BYTES)


@dataclasses.dataclass
class Scan:
    """What ``scan`` found in a file: its meta, the checksum-valid bodies after it, and where it ends."""

    meta: bytes | None
    """The first line without its newline, if the file has a complete first line (not validated)."""
    bodies: list[bytes]
    """Checksum-valid framed lines after the meta, in order, up to the first problem."""
    checksums: list[bytes]
    """The checksum of each accepted framed line (what a digest of the file's content is built on)."""
    offsets: list[int]
    """The byte offset just past each accepted line (the meta's first)."""
    problem: str | None = None
    """None, "torn" (the last line is incomplete: a write a crash interrupted) or "damaged"."""
    problem_at: int = 0
    """Byte offset of the first line that failed."""
    size: int = 0
    content_end: int = 0
    """Where the content ends: the file's size, or in a padded journal the first zero byte."""


def scan(data: bytes, *, padded: bool = False) -> Scan:
    """Split a file into its meta line and checksum-valid framed lines, stopping at the first bad one.

    See invariant 3 for what "torn" means; everything else that fails is "damaged". A ``padded``
    file (a journal) may end in zero bytes written ahead of use: the content ends at the first zero
    byte (JSON text never holds one), and anything but zeros after it is damage.
    """
    size = len(data)
    content_end = size
    stray_bytes = False
    if padded:
        zero = data.find(b"\0")
        if zero >= 0:
            content_end = zero
            stray_bytes = data.count(b"\0", zero) != size - zero
            data = data[:zero]
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the content ends with a newline
    result = Scan(meta=None, bodies=[], checksums=[], offsets=[], size=size, content_end=content_end)
    offset = 0
    if lines:
        result.meta = lines[0]
        offset = len(lines[0]) + 1
        result.offsets.append(offset)
    bodies, checksums, offsets = result.bodies, result.checksums, result.offsets
    for index in range(1, len(lines)):
        line = lines[index]
        body = line_body(line)
        if body is None:
            result.problem, result.problem_at = "damaged", offset
            return result
        offset += len(line) + 1
        bodies.append(body)
        checksums.append(line[:CHECKSUM_HEX])
        offsets.append(offset)
    if tail:
        result.problem_at = offset
        # A whole valid frame whose last byte should have been its newline was damaged, not torn:
        # a torn write leaves a prefix of what was written, never a wrong byte after a whole frame.
        if result.meta is not None and line_body(tail[:-1]) is not None:
            result.problem = "damaged"
        else:
            result.problem = "torn"
    if stray_bytes:
        # Bytes after the padding began: a write that landed out of order, or damage. Either way
        # not a clean prefix, so not merely torn.
        result.problem, result.problem_at = "damaged", offset if tail else content_end
    return result


# -- effect records as rows, and the header ------------------------------------------------------------


_step_id_of = operator.attrgetter("step_id")

EFFECT_FIELDS: tuple[str, ...] = (
    "key", "step_id", "action", "payload", "payload_digest", "state", "attempts", "epoch", "result",
    "cost", "receipt", "evidence", "last_error", "not_before", "approval_id", "updated_at", "backoff",
)  # fmt: skip
FIRST_EFFECT_FIELDS = EFFECT_FIELDS[:-1]
"""The row as first written, before ``backoff``: still read, the missing value being null. A
snapshot's meta names the fields its rows hold; a journal row's length tells."""
BLOB_ROW_FIELDS = (*EFFECT_FIELDS, BLOBS_KEY)
"""A row whose payload or result is kept as a blob: the fields, the out-of-line ones null, then the
reference map (``stores.blobs``). A snapshot that holds one writes every row this wide (the map
null where there is none) and names these fields in its meta."""
ROW_WIDTHS = (len(EFFECT_FIELDS), len(FIRST_EFFECT_FIELDS), len(BLOB_ROW_FIELDS))
_FIELD_INDEX = {name: index for index, name in enumerate(EFFECT_FIELDS)}
CHANGE_INDEX = {name: index for index, name in enumerate(BLOB_ROW_FIELDS)}
BLOBS_AT = len(EFFECT_FIELDS)
BlobFetch = Callable[[BlobRef, str], Any]
"""How a reader resolves a blob reference: the value the blob holds, checked (``blobs.decode_blob``)."""
_STATES = {state.value: state for state in EffectState}

SCALAR_KEYS = (
    "task_id", "plan_digest", "created_at", "updated_at", "status", "current_step", "next_action",
    "lease_owner", "lease_epoch", "lease_expires_at", "reconcile_all",
)  # fmt: skip
scalar_values = operator.attrgetter(*SCALAR_KEYS)
_EVIDENCE_LISTS = ("control_observations", "unknowns")
LIST_KEYS = frozenset(("consumed_approvals", *_EVIDENCE_LISTS))
_BUDGET_KEYS = tuple("budget." + field.name for field in dataclasses.fields(BudgetCounters))
RECORD_KEYS = ("plan_outline", "progress", "effect_latency", "last_failure", "deadline")
"""The header's optional records (each written only when the state has one, as its ``to_json``)."""
HEADER_KEYS = frozenset((*SCALAR_KEYS, *_BUDGET_KEYS, "approval_requests", *LIST_KEYS, *RECORD_KEYS))
_LATER_HEADER_KEYS = frozenset(("budget.worked_s", "budget.worked_at_progress_s", *RECORD_KEYS))
"""Header fields that states written before them lack (``BudgetCounters.from_json`` fills them in;
the ``RECORD_KEYS`` are written only when the state has one)."""
_FIRST_HEADER_KEYS = HEADER_KEYS - _LATER_HEADER_KEYS

# The codecs below name every field of RunState and EffectRecord; fail at import, not on a
# customer's disk, if one of them gains a field that would silently not be stored.
if {field.name for field in dataclasses.fields(EffectRecord)} != set(EFFECT_FIELDS):
    raise ImportError("EffectRecord's fields changed: update EFFECT_FIELDS and row_of in stores/_journal.py")
if {field.name for field in dataclasses.fields(RunState)} != {
    *SCALAR_KEYS, "budget", "approval_requests", *LIST_KEYS, "effects", "revision", *RECORD_KEYS
}:
    raise ImportError("RunState's fields changed: update the header codec in stores/_journal.py")


def row_of(record: EffectRecord, blobs: BlobCodec | None = None, introduced: list[BlobRef] | None = None) -> list[Any]:
    """An effect record as a row of values in ``EFFECT_FIELDS`` order; with ``blobs``, a large
    payload or result as a blob reference (``BLOB_ROW_FIELDS``), its reference added to ``introduced``."""
    payload: Any = record.payload
    result: Any = record.result
    refs = None
    if blobs is not None:
        (payload, result), found = blobs.split((("payload", payload), ("result", result)))
        if found:
            refs = found
            if introduced is not None:
                introduced.extend(found.values())
    row = [
        record.key, record.step_id, record.action, payload, record.payload_digest, record.state.value,
        record.attempts, record.epoch, result, record.cost, record.receipt, record.evidence,
        record.last_error, record.not_before, record.approval_id, record.updated_at,
        record.backoff.to_json() if record.backoff is not None else None,
    ]  # fmt: skip
    if refs is not None:
        row.append(refs_to_json(refs))
    return row


def _bad(field: str, value: object) -> CorruptStateError:
    return CorruptStateError(f"effect record: field {field!r} has a bad value {value!r:.60}")


def _number(field: str, value: object) -> float:
    """A finite number as a float (ints accepted, bools not), as ``_fields.get_float`` reads it."""
    number = finite_float(value)
    if number is None:
        raise _bad(field, value)
    return number


_isfinite = math.isfinite


_WIDTH = len(EFFECT_FIELDS)
_from_checked = EffectRecord.from_checked
_from_checked_columns = EffectRecord.from_checked_columns


def record_from_row(row: object, fetch: BlobFetch | None = None) -> EffectRecord:
    """Validate a row with the rules of ``EffectRecord.from_json`` and build the record; a blob
    reference is resolved with ``fetch`` (which checks the blob).

    A load builds one record per row, so the row as writers write it (every value of the type it is
    written as, no blob, no backoff) is checked in one expression; any other row, valid or not, takes
    the checks field by field (``_record_from_any_row``), which name the field a bad value is in."""
    if type(row) is list and len(row) == _WIDTH:
        (key, step_id, action, payload, payload_digest, state, attempts, epoch, result, cost, receipt, evidence,
         last_error, not_before, approval_id, updated_at, backoff) = row  # fmt: skip
        if (
            type(key) is str and type(step_id) is str and type(action) is str and type(payload) is dict
            and type(payload_digest) is str and type(state) is str and (lifecycle := _STATES.get(state)) is not None
            and type(attempts) is int and 0 <= attempts <= MAX_INT and type(epoch) is int and 0 <= epoch <= MAX_INT
            and type(cost) is float and _isfinite(cost) and type(updated_at) is float and _isfinite(updated_at)
            and (not_before is None or (type(not_before) is float and _isfinite(not_before)))
            and (receipt is None or type(receipt) is str) and (evidence is None or type(evidence) is str)
            and (last_error is None or type(last_error) is str) and (approval_id is None or type(approval_id) is str)
            and backoff is None
        ):  # fmt: skip
            return _from_checked((
                key, step_id, action, payload, payload_digest, lifecycle, attempts, epoch, result,
                cost, receipt, evidence, last_error, not_before, approval_id, updated_at, None,
            ))  # fmt: skip
    return _record_from_any_row(row, fetch)


def _record_from_any_row(row: object, fetch: BlobFetch | None) -> EffectRecord:
    """``record_from_row`` for any row: each field checked on its own, a bad one named."""
    if type(row) is not list or len(row) not in ROW_WIDTHS:
        raise CorruptStateError(f"effect record row must be a list of {len(EFFECT_FIELDS)} values")
    values: list[Any] = row if len(row) == len(EFFECT_FIELDS) else [*row, None] if len(row) < len(EFFECT_FIELDS) else row[:BLOBS_AT]
    (key, step_id, action, payload, payload_digest, state, attempts, epoch, result, cost, receipt, evidence,
     last_error, not_before, approval_id, updated_at, backoff) = values  # fmt: skip
    if len(row) > BLOBS_AT and row[BLOBS_AT] is not None:
        what = f"effect record {step_id!r:.80}"
        refs = refs_from_json(row[BLOBS_AT], what)
        if fetch is None:
            raise CorruptStateError(f"{what} references a blob, and no blob store was given to read it")
        if "payload" in refs:
            if payload is not None:
                raise CorruptStateError(f"{what}: its payload is both inline and a blob")
            payload = fetch(refs["payload"], f"{what} payload")
        if "result" in refs:
            if result is not None:
                raise CorruptStateError(f"{what}: its result is both inline and a blob")
            result = fetch(refs["result"], f"{what} result")
    for name, value in (("key", key), ("step_id", step_id), ("action", action), ("payload_digest", payload_digest)):
        if type(value) is not str:
            raise _bad(name, value)
    for name, value in (("receipt", receipt), ("evidence", evidence), ("last_error", last_error), ("approval_id", approval_id)):
        if value is not None and type(value) is not str:
            raise _bad(name, value)
    if type(payload) is not dict:
        raise _bad("payload", payload)
    lifecycle = _STATES.get(state) if type(state) is str else None
    if lifecycle is None:
        raise _bad("state", state)
    if type(attempts) is not int or not 0 <= attempts <= MAX_INT:
        raise _bad("attempts", attempts)
    if type(epoch) is not int or not 0 <= epoch <= MAX_INT:
        raise _bad("epoch", epoch)
    # The common case inline (floats as written); anything else goes through _number's full rules.
    if type(cost) is not float or not _isfinite(cost):
        cost = _number("cost", cost)
    if not_before is not None and (type(not_before) is not float or not _isfinite(not_before)):
        not_before = _number("not_before", not_before)
    if type(updated_at) is not float or not _isfinite(updated_at):
        updated_at = _number("updated_at", updated_at)
    if backoff is not None:
        if type(backoff) is not dict:
            raise _bad("backoff", backoff)
        backoff = Backoff.from_json(backoff)
    # Checked above with the rules of the record's spec (JSON values by ``parse_json``): built as is.
    return _from_checked((
        key, step_id, action, payload, payload_digest, lifecycle, attempts, epoch, result,
        cost, receipt, evidence, last_error, not_before, approval_id, updated_at, backoff,
    ))  # fmt: skip


def _same_json(a: object, b: object) -> bool:
    """Whether two JSON values encode alike (``1 == 1.0`` and ``True == 1`` are not alike here)."""
    if a is b:
        return True
    if type(a) is not type(b) or a != b:
        return False
    if isinstance(a, (dict, list)):
        return encode_json(a) == encode_json(b)  # equal, but a nested 1 and 1.0 would still differ
    return True


_record_values = operator.attrgetter(*EFFECT_FIELDS)


def record_changes(
    old: EffectRecord, new: EffectRecord, blobs: BlobCodec | None = None, introduced: list[BlobRef] | None = None
) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    for name, a, b in zip(EFFECT_FIELDS, _record_values(old), _record_values(new)):
        # Most fields are the very same object (or two equal scalars of one type): no call for them.
        if a is b or (type(a) is type(b) and type(a) is not dict and type(a) is not list and a == b):
            continue
        if not _same_json(a, b):
            changes[name] = b
    if "state" in changes:
        changes["state"] = changes["state"].value
    if changes.get("backoff") is not None:
        changes["backoff"] = changes["backoff"].to_json()
    if blobs is not None and ("payload" in changes or "result" in changes):
        # The stored form: a large value as a reference; the map is written whole when it changes.
        _, before = blobs.split((("payload", old.payload), ("result", old.result)))
        (payload, result), after = blobs.split((("payload", new.payload), ("result", new.result)))
        if "payload" in changes:
            changes["payload"] = payload
        if "result" in changes:
            changes["result"] = result
        if before != after:
            changes[BLOBS_KEY] = refs_to_json(after)
        if introduced is not None:
            introduced.extend(ref for name, ref in after.items() if name in changes)
    return changes


# -- the header -------------------------------------------------------------------------------


def header_of(state: RunState) -> dict[str, Any]:
    """The flat header of a state: every field but the effect records and the revision."""
    header: dict[str, Any] = {}
    for key in SCALAR_KEYS:
        value = getattr(state, key)
        header[key] = value.value if isinstance(value, Status) else value
    for key, value in state.budget.to_json().items():
        header["budget." + key] = value
    header["approval_requests"] = [request.to_json() for request in state.approval_requests.values()]
    header["consumed_approvals"] = list(state.consumed_approvals)
    for key in _EVIDENCE_LISTS:
        header[key] = [item.to_json() for item in getattr(state, key)]
    for key in RECORD_KEYS:
        record = getattr(state, key)
        if record is not None:  # absent otherwise: such a header is what older code wrote
            header[key] = record.to_json()
    return header


def build_state(
    header: Mapping[str, Any],
    revision: int,
    rows: Mapping[str, Any],
    fetch: BlobFetch | None = None,
    *,
    columns: EffectColumns | None = None,
) -> RunState:
    """Validate a flat header and effect rows and build the ``RunState`` they describe (blob
    references resolved with ``fetch``). ``rows`` maps each step id, in order, to its row, or to
    its position in ``columns`` (a snapshot's row a journal record left as it was)."""
    keys = header.keys()
    if keys != HEADER_KEYS and not _FIRST_HEADER_KEYS <= keys <= HEADER_KEYS:
        missing = sorted(_FIRST_HEADER_KEYS - keys)
        extra = sorted(keys - HEADER_KEYS)
        raise CorruptStateError(f"state header: missing fields {missing}, unknown fields {extra[:5]}")
    document = {key: header[key] for key in SCALAR_KEYS if not key.startswith("lease_")}
    document.update(
        revision=revision,
        budget={key[len("budget.") :]: header[key] for key in _BUDGET_KEYS if key in header},
        lease={"owner": header["lease_owner"], "epoch": header["lease_epoch"], "expires_at": header["lease_expires_at"]},
        approval_requests=header["approval_requests"],
        consumed_approvals=header["consumed_approvals"],
        control_observations=header["control_observations"],
        unknowns=header["unknowns"],
        effects=[],
        completed_steps=[],
    )
    for key in RECORD_KEYS:
        if header.get(key) is not None:
            document[key] = header[key]
    state = RunState.from_json(document)
    if columns is None:
        effects = {step_id: record_from_row(row, fetch) for step_id, row in rows.items()}
        from_columns = False
    else:
        effects = columns.records(rows, fetch)
        # Every record a snapshot's position names was built from its step id column, the very
        # value its key is: only a row a journal record wrote can name another step.
        from_columns = {int}.issuperset(map(type, rows.values()))
    if not are_step_ids(list(effects)):  # check_step_id's rule, in one match for all of them
        for step_id in effects:
            try:
                check_step_id(step_id)
            except InvalidInputError as exc:
                raise CorruptStateError(str(exc)) from None
    if not from_columns and list(map(_step_id_of, effects.values())) != list(effects):
        step_id, record = next(item for item in effects.items() if item[1].step_id != item[0])
        raise CorruptStateError(f"effect record filed under {step_id!r} names step {record.step_id!r}")
    state.effects = effects
    return state


# -- the snapshot file ------------------------------------------------------------


_LISTS = frozenset((list,))
_STRINGS = frozenset((str,))
_row_step_id = operator.itemgetter(1)  # EFFECT_FIELDS[1]
_STEP_AT = EFFECT_FIELDS.index("step_id")
_STATE_AT = EFFECT_FIELDS.index("state")
_SCALARS = frozenset((str, int, float, bool, type(None)))
_LINE_KEYS = frozenset(("n", "columns"))
_copysign = math.copysign


def _column_of(values: tuple[Any, ...]) -> Any:
    """A column of a snapshot's row line as written: ``{"all": v}`` when every value encodes as
    the same scalar ``v`` (a state, an action, attempts, a null, most often), else the values."""
    first = values[0]
    kind = type(first)
    if (
        len(values) < 2 or kind not in _SCALARS or values.count(first) != len(values)
        or set(map(type, values)) != {kind}  # count() calls 1 == 1.0 == True equal; JSON does not
    ):  # fmt: skip
        return values
    if kind is float and first == 0.0 and len(set(map(_copysign, itertools.repeat(1.0), values))) != 1:
        return values  # 0.0 and -0.0 are equal, and encode apart
    return {"all": first}


# The checks of one column of one row line, with the rules of ``EffectRecord``'s spec (as
# ``record_from_row`` applies them to a row), each a pass in C over the column: True if every
# value passes. A line with a column that fails is checked again row by row when its rows are
# built (``EffectColumns.records``), which names the bad field, and only for the rows still in use.
def _texts(values: list[Any]) -> bool:
    return _STRINGS.issuperset(map(type, values))


def _objects(values: list[Any]) -> bool:
    return {dict}.issuperset(map(type, values))


def _counts(values: list[Any]) -> bool:
    return {int}.issuperset(map(type, values)) and (not values or (min(values) >= 0 and max(values) <= MAX_INT))


def _numbers(values: list[Any]) -> bool:
    return {float}.issuperset(map(type, values)) and _isfinite(sum(values))  # a NaN or infinity makes the sum one


def _optional_texts(values: list[Any]) -> bool:
    return {str, type(None)}.issuperset(map(type, values))


def _optional_numbers(values: list[Any]) -> bool:
    return {float, type(None)}.issuperset(map(type, values)) and _isfinite(sum(filter(None, values)))


def _nulls(values: list[Any]) -> bool:
    return {type(None)}.issuperset(map(type, values))


def _any(values: list[Any]) -> bool:
    return True


_COLUMN_CHECKS: tuple[Callable[[list[Any]], bool], ...] = (
    _texts, _texts, _texts, _objects, _texts, _texts, _counts, _counts, _any, _numbers,
    _optional_texts, _optional_texts, _optional_texts, _optional_numbers, _optional_texts, _numbers,
    _nulls,  # backoff: a record with one is built row by row (``Backoff.from_json``)
    _nulls,  # blob references: resolved row by row
)  # fmt: skip
"""One per ``BLOB_ROW_FIELDS`` field (the state's column is also checked against its choices)."""
if len(_COLUMN_CHECKS) != len(BLOB_ROW_FIELDS):
    raise ImportError("_COLUMN_CHECKS must name one check per BLOB_ROW_FIELDS field")


class EffectColumns:
    """A snapshot's effect records as read: one list per ``BLOB_ROW_FIELDS`` field, values as
    parsed (a field the snapshot's rows lack holds nulls), in the snapshot's order.

    Each row line's columns are checked as they are added (``add_line``): the shape (every column
    as long as the line's count, step ids text) raises at once; the values are checked with the
    record's rules in passes over each column, and a line whose values all pass has its records
    built together, without a check or a call per row. A line that does not pass is checked row
    by row, as ``record_from_row`` checks any row, only when its rows are built (a row a journal
    record replaced is never read)."""

    def __init__(self, width: int):
        self.width = max(width, len(EFFECT_FIELDS))
        """The width of a row as ``row`` returns it: with a backoff, and blob references if the
        snapshot's rows have them."""
        self.columns: list[list[Any]] = [[] for _ in BLOB_ROW_FIELDS]
        self.states: list[EffectState | None] = []
        """The state column as ``EffectState`` members (None in a line that did not pass)."""
        self.unchecked: list[range] = []
        """The positions of the lines whose values did not all pass."""

    def __len__(self) -> int:
        return len(self.states)

    @property
    def step_ids(self) -> list[str]:
        return self.columns[_STEP_AT]

    def add_line(self, count: int, line: list[Any]) -> list[str]:
        """Add one row line's columns (``width`` of them, each a list of ``count`` values or
        ``{"all": value}``); return its step ids. ``CorruptStateError`` if the line is malformed."""
        start = len(self.states)
        columns, passed = self.columns, True
        for index, column in enumerate(line):
            if type(column) is list:
                if len(column) != count:
                    raise CorruptStateError(f"snapshot row line: column {BLOB_ROW_FIELDS[index]} holds {len(column)} values, the line {count}")
                values = column
            elif type(column) is dict and column.keys() == {"all"}:
                values = [column["all"]] * count
            else:
                raise CorruptStateError(f"snapshot row line: column {BLOB_ROW_FIELDS[index]} is malformed")
            if passed and not _COLUMN_CHECKS[index](values if type(column) is list else values[:1]):
                passed = False
            columns[index].extend(values)
        for index in range(len(line), len(BLOB_ROW_FIELDS)):  # a field the snapshot's rows lack
            columns[index].extend([None] * count)
        step_ids = columns[_STEP_AT][start:]
        if not _texts(step_ids):
            raise CorruptStateError("snapshot effect row is malformed: a step id is not text")
        states: Sequence[EffectState | None] | None = None
        if passed:
            raw = line[_STATE_AT]
            if type(raw) is dict:
                state = _STATES.get(raw["all"]) if type(raw["all"]) is str else None
                states = [state] * count if state is not None else None
            elif _texts(raw) and None not in (converted := list(map(_STATES.get, raw))):
                states = converted
        if states is None:
            self.unchecked.append(range(start, start + count))
            states = [None] * count
        self.states.extend(states)
        return step_ids

    def add_rows(self, rows: list[list[Any]]) -> list[str]:
        """Add a line of rows as a version 1 snapshot holds them (each already ``width`` long)."""
        if not rows:
            return []
        return self.add_line(len(rows), [list(column) for column in zip(*rows)])

    def row(self, position: int) -> list[Any]:
        """The row at ``position``, as a snapshot of this width holds it (a journal record changes it)."""
        return [column[position] for column in self.columns[: self.width]]

    def records(self, rows: Mapping[str, Any], fetch: BlobFetch | None) -> dict[str, EffectRecord]:
        """The records ``rows`` names, in its order: a position is this table's record, built with
        the lines that passed their checks; a row (a journal record's) is built by ``record_from_row``."""
        columns = self.columns
        records = list(_from_checked_columns((*columns[:_STATE_AT], self.states, *columns[_STATE_AT + 1 : len(EFFECT_FIELDS)])))
        step_ids = self.step_ids
        for lines in self.unchecked:
            for position in lines:
                if rows.get(step_ids[position]) == position:  # still in use (a row is a list, never equal)
                    records[position] = record_from_row(self.row(position), fetch)
        index = dict(rows)
        if not {int}.issuperset(map(type, index.values())):
            for step_id, row in index.items():
                if type(row) is not int:
                    records.append(record_from_row(row, fetch))
                    index[step_id] = len(records) - 1  # the key stays where it is
        return dict(zip(index, map(records.__getitem__, index.values())))


def encode_snapshot(state: RunState, blobs: BlobCodec | None = None, introduced: list[BlobRef] | None = None) -> list[bytes]:
    """The lines of a snapshot of ``state`` (at ``state.revision``); raises before any I/O if a
    value cannot be encoded (``InvalidInputError``) or if the snapshot would be over
    ``MAX_STATE_BYTES``, the most a load reads (``SizeLimitError``). With ``blobs``, large values
    are written as references (each one added to ``introduced``), never as their bytes.

    Each row line holds up to ``ROWS_PER_LINE`` records as columns, ``{"n": count, "columns":
    [...]}``, one column per field the meta names: the values in order, or ``{"all": value}``
    when they are all one scalar. A load parses a column of a few distinct values as one value,
    and checks a column in a pass, not a value at a time."""
    records = list(state.effects.values())
    chunks = (len(records) + ROWS_PER_LINE - 1) // ROWS_PER_LINE
    rows = [row_of(record, blobs, introduced) for record in records]
    fields = EFFECT_FIELDS
    if any(len(row) > BLOBS_AT for row in rows):
        fields = BLOB_ROW_FIELDS
        for row in rows:
            if len(row) == BLOBS_AT:
                row.append(None)
    lines = [
        meta_line(
            {
                "format": SNAPSHOT_FORMAT,
                "schema_version": SNAPSHOT_SCHEMA_VERSION,
                "task_id": state.task_id,
                "revision": state.revision,
                "effects": len(records),
                "row_lines": chunks,
                "fields": list(fields),
            }
        ),
        frame(header_of(state)),
    ]
    size = sum(map(len, lines))
    for start in range(0, len(rows), ROWS_PER_LINE):
        chunk = rows[start : start + ROWS_PER_LINE]
        lines.append(frame({"n": len(chunk), "columns": [_column_of(column) for column in zip(*chunk)]}))
        size += len(lines[-1])
        if size > MAX_STATE_BYTES:
            raise SizeLimitError(
                f"task {state.task_id!r}: the state would be over {MAX_STATE_BYTES} bytes encoded, the most a "
                "load reads (MAX_STATE_BYTES); nothing was written. Keep large payloads and results outside "
                "the state and pass references to them",
                size=size,
                limit=MAX_STATE_BYTES,
                limit_name="MAX_STATE_BYTES",
            )
    return lines


@dataclasses.dataclass
class RawSnapshot:
    """A snapshot whose every line validated, not yet built into a ``RunState`` (see ``Replay``)."""

    revision: int
    header: dict[str, Any]
    rows: dict[str, Any]
    """Each step id, in order, to its position in ``columns`` (a ``Replay`` puts a row in its place
    when a journal record writes or changes it)."""
    meta: bytes
    line_checksums: list[bytes]
    columns: EffectColumns


def _meta_int(meta: Mapping[str, Any], name: str, minimum: int) -> int:
    value = meta.get(name)
    if type(value) is not int or value < minimum:
        raise CorruptStateError(f"snapshot meta: {name} must be an integer >= {minimum}")
    return value


def decode_snapshot(data: bytes, *, task_id: str) -> RawSnapshot:
    """Validate a whole snapshot file; raise ``CorruptStateError`` (or a subclass) on any defect."""
    found = scan(data)
    if found.meta is None:
        raise CorruptStateError("snapshot is empty or has no complete first line")
    meta = parse_meta(found.meta, expected_format=SNAPSHOT_FORMAT, task_id=task_id, versions=SNAPSHOT_VERSIONS)
    if found.problem is not None:
        raise CorruptStateError(f"snapshot line at byte {found.problem_at} is {found.problem} (checksum or framing)")
    revision, count, chunks = _meta_int(meta, "revision", 1), _meta_int(meta, "effects", 0), _meta_int(meta, "row_lines", 0)
    fields = meta.get("fields")
    widths = {len(known): known for known in (EFFECT_FIELDS, FIRST_EFFECT_FIELDS, BLOB_ROW_FIELDS)}
    if type(fields) is not list or widths.get(len(fields)) != tuple(fields):
        raise CorruptStateError("snapshot meta: the effect record fields are not ones this code reads")
    width = len(fields)
    as_columns = meta["schema_version"] >= SNAPSHOT_SCHEMA_VERSION
    if len(found.bodies) != 1 + chunks:
        raise CorruptStateError(f"snapshot has {len(found.bodies)} lines after its meta, its meta says {1 + chunks}")
    header = loads(found.bodies[0], "snapshot header")
    if type(header) is not dict:
        raise CorruptStateError("snapshot header must be a JSON object")
    if header.get("task_id") != task_id:
        raise CorruptStateError(f"snapshot header names task {header.get('task_id')!r:.80}, its meta names {task_id!r}")
    table = EffectColumns(width)
    rows: dict[str, int] = {}
    for body in found.bodies[1:]:
        chunk = loads(body, "snapshot row line")
        if as_columns:
            if type(chunk) is not dict or chunk.keys() != _LINE_KEYS:
                raise CorruptStateError('snapshot row line must be a JSON object of "n" and "columns"')
            lines, columns = chunk["n"], chunk["columns"]
            if type(lines) is not int or lines < 0 or type(columns) is not list or len(columns) != width:
                raise CorruptStateError(f"snapshot effect row line is malformed: {width} columns of n values each")
            step_ids = table.add_line(lines, columns)
        else:
            if type(chunk) is not list:
                raise CorruptStateError("snapshot row line must be a JSON list")
            # Each check a pass in C over the line's rows: lists, as wide as the meta says, each
            # naming its step id as text.
            if not _LISTS.issuperset(map(type, chunk)) or not {width}.issuperset(map(len, chunk)):
                raise CorruptStateError("snapshot effect row is malformed")
            if not _texts(list(map(_row_step_id, chunk))):
                raise CorruptStateError("snapshot effect row is malformed")
            step_ids = table.add_rows(chunk)
        before = len(rows)
        rows.update(zip(step_ids, range(before, before + len(step_ids))))
        if len(rows) != before + len(step_ids):  # a step id named twice: find it (the first ``before`` keys came earlier)
            seen = set(itertools.islice(rows, before))
            for step_id in step_ids:
                if step_id in seen:
                    raise CorruptStateError(f"snapshot has two effect records for step {step_id!r:.80}")
                seen.add(step_id)
    if len(rows) != count:
        raise CorruptStateError(f"snapshot holds {len(rows)} effect records, its meta says {count}")
    return RawSnapshot(revision, header, rows, found.meta, found.checksums, table)


def snapshot_revision(first_line: bytes, *, task_id: str) -> int:
    """The revision a snapshot's meta line names (validated), without reading the rest."""
    meta = parse_meta(first_line, expected_format=SNAPSHOT_FORMAT, task_id=task_id, versions=SNAPSHOT_VERSIONS)
    revision = meta.get("revision")
    if type(revision) is not int or revision < 1:
        raise CorruptStateError("snapshot meta: revision must be an integer >= 1")
    return revision


# -- the journal file: its meta and its records ------------------------------------------------------------


_RECORD_KEYS = frozenset(("rev", "epoch", "set", "extend", "effects"))


def describe_record(body: bytes) -> dict[str, Any]:
    """One journal line as a timeline entry: revision, epoch, time, and what changed, in words.

    For reading only (``JsonFileStore.history``); it validates the framing's JSON and the shape it
    reads, not every field (``Replay`` does that when state is loaded)."""
    record = loads(body, "journal record")
    if not isinstance(record, dict) or not isinstance(record.get("rev"), int) or not isinstance(record.get("epoch"), int):
        raise CorruptStateError("journal record: not an object with an integer rev and epoch")
    assignments = record.get("set") or {}
    effects = record.get("effects") or {}
    if not isinstance(assignments, dict) or not isinstance(effects, dict):
        raise CorruptStateError("journal record: 'set' and 'effects' must be objects")
    changes: list[str] = []
    for step_id, change in effects.items():
        if change is None:
            changes.append(f"{step_id}: record removed")
        elif isinstance(change, list) and len(change) in ROW_WIDTHS:
            row = dict(zip(BLOB_ROW_FIELDS, change))
            changes.append(f"{step_id}: {row['state']} (attempt {row['attempts']}, payload {row['payload_digest']})")
        elif isinstance(change, dict):
            parts = [f"{name} -> {change[name]}" for name in ("state", "attempts", "approval_id") if name in change]
            parts += [f"{name} updated" for name in ("receipt", "evidence", "last_error", "result") if name in change]
            changes.append(f"{step_id}: " + (", ".join(parts) if parts else "fields updated"))
        else:
            raise CorruptStateError(f"journal record: effect change for {step_id!r} has an unknown shape")
    for key in ("status", "current_step", "lease_owner", "lease_epoch", "reconcile_all"):
        if key in assignments:
            changes.append(f"{key} -> {assignments[key]}")
    outline = assignments.get("plan_outline")
    if isinstance(outline, dict) and isinstance(outline.get("steps"), list):
        changes.append(f"plan outline recorded ({len(outline['steps'])} steps)")
    failure = assignments.get("last_failure")
    if isinstance(failure, dict):
        changes.append(f"failure recorded: {failure.get('error_type')}: {failure.get('message')} (failure {failure.get('attempt')} of {failure.get('max_failures')})")
    extensions = record.get("extend") or {}
    if isinstance(extensions, dict):
        for key, change in extensions.items():
            added = change.get("add") if isinstance(change, dict) else None
            if key == "consumed_approvals" and isinstance(added, list):
                changes.append("approval consumed: " + ", ".join(str(item) for item in added))
            elif key == "control_observations" and isinstance(added, list):
                changes += [f"control record read: {item.get('detail')}" for item in added if isinstance(item, dict)]
    at = assignments.get("updated_at")
    return {
        "revision": record["rev"],
        "epoch": record["epoch"],
        "at": at if isinstance(at, (int, float)) and not isinstance(at, bool) else None,
        "changes": changes,
        "description": "; ".join(changes) if changes else "header fields updated",
    }


def highest_epoch(data: bytes) -> int:
    """The highest lease epoch named by any checksum-valid line of a snapshot or journal file (0 if none).

    For a floor when the lease record is lost or damaged: a damaged file still proves the epochs
    its good lines name, so each line is read on its own and one that does not parse is passed over
    (the file's damage is reported by ``load``, not here)."""
    highest = 0
    epoch_index = EFFECT_FIELDS.index("epoch")
    for body in scan(data, padded=True).bodies:
        try:
            value = loads(body, "line")
        except CorruptStateError:
            continue  # counted as no epoch: the floor only ever rises
        candidates: list[object] = []
        if isinstance(value, dict):
            changed = value.get("set")
            candidates += [value.get("epoch"), value.get("lease_epoch")]
            if isinstance(changed, dict):
                candidates.append(changed.get("lease_epoch"))
            effects = value.get("effects")
            if isinstance(effects, dict):
                for change in effects.values():
                    if isinstance(change, list) and len(change) in (len(EFFECT_FIELDS), len(BLOB_ROW_FIELDS)):
                        candidates.append(change[epoch_index])
                    elif isinstance(change, dict):
                        candidates.append(change.get("epoch"))
        if isinstance(value, dict) and isinstance(value.get("columns"), list):  # a snapshot's line of effect records
            columns = value["columns"]
            epochs = columns[epoch_index] if len(columns) > epoch_index else None
            if isinstance(epochs, list):
                candidates += epochs
            elif isinstance(epochs, dict):
                candidates.append(epochs.get("all"))
        elif isinstance(value, list):  # a version 1 snapshot's line of effect rows
            candidates += [
                row[epoch_index] for row in value if isinstance(row, list) and len(row) in (len(EFFECT_FIELDS), len(BLOB_ROW_FIELDS))
            ]
        for candidate in candidates:
            if type(candidate) is int and 0 <= candidate <= MAX_INT:
                highest = max(highest, candidate)
    return highest


def encode_journal_meta(task_id: str, base: int) -> bytes:
    return meta_line({"format": JOURNAL_FORMAT, "schema_version": SCHEMA_VERSION, "task_id": task_id, "base": base})


def journal_base(first_line: bytes, *, task_id: str) -> int:
    meta = parse_meta(first_line, expected_format=JOURNAL_FORMAT, task_id=task_id)
    base = meta.get("base")
    if type(base) is not int or base < 0:
        raise CorruptStateError("journal meta: base must be an integer >= 0")
    return base


class Replay:
    """A state being rebuilt: a snapshot's raw header and rows, with journal records applied in order."""

    def __init__(self, snapshot: RawSnapshot):
        self.revision = snapshot.revision
        self.header = snapshot.header
        self.rows = snapshot.rows
        self.columns = snapshot.columns
        epoch = self.header.get("lease_epoch")
        self.epoch = epoch if type(epoch) is int else 0

    def apply_all(self, bodies: list[bytes]) -> tuple[int, CorruptStateError | None]:
        """Apply records in order; return how many were applied and why the next one was not.

        The bodies (each already checksum-valid) are parsed in one call, as one JSON array: one
        C-level parse instead of one per record. If that fails or miscounts (a body that is not a
        single JSON value), they are parsed one by one, which finds the first bad one."""
        try:
            records = loads(b"[" + b",".join(bodies) + b"]", "journal records") if bodies else []
        except CorruptStateError:
            records = None
        if records is None or len(records) != len(bodies):
            records = []
            for body in bodies:
                try:
                    records.append(loads(body, "journal record"))
                except CorruptStateError as exc:
                    applied, error = self.apply_all_parsed(records)
                    return applied, error or exc
        return self.apply_all_parsed(records)

    def apply_all_parsed(self, records: list[Any]) -> tuple[int, CorruptStateError | None]:
        for index, record in enumerate(records):
            try:
                self.apply_record(record)
            except CorruptStateError as exc:
                return index, exc
        return len(records), None

    def apply(self, body: bytes) -> None:
        """Apply one journal record; raise ``CorruptStateError`` (changing nothing) if it is malformed."""
        self.apply_record(loads(body, "journal record"))

    def apply_record(self, record: Any) -> None:
        if type(record) is not dict or not _RECORD_KEYS.issuperset(record):
            raise CorruptStateError("journal record must be an object with rev, epoch, set, extend, effects")
        revision, epoch = record.get("rev"), record.get("epoch")
        if type(revision) is not int or revision != self.revision + 1:
            raise CorruptStateError(f"journal record has revision {revision!r:.20}, expected {self.revision + 1}")
        if type(epoch) is not int or epoch < self.epoch:
            raise CorruptStateError(f"journal record revision {revision} has epoch {epoch!r:.20}, below {self.epoch}")
        assignments = record.get("set", {})
        extensions = record.get("extend", {})
        changes = record.get("effects", {})
        if type(assignments) is not dict or type(extensions) is not dict or type(changes) is not dict:
            raise CorruptStateError(f"journal record revision {revision} is malformed")
        # Check everything first, so that a malformed record changes nothing.
        if not HEADER_KEYS.issuperset(assignments) or not LIST_KEYS.issuperset(extensions):
            raise CorruptStateError(f"journal record revision {revision} names an unknown header field")
        if "task_id" in assignments and assignments["task_id"] != self.header.get("task_id"):
            raise CorruptStateError(f"journal record revision {revision} changes the task id")
        header = self.header
        extended: dict[str, list[Any]] = {}
        for key, change in extensions.items():
            current = assignments.get(key, header.get(key))
            drop = change.get("drop") if type(change) is dict else None
            add = change.get("add") if type(change) is dict else None
            if type(current) is not list or type(drop) is not int or not 0 <= drop <= len(current) or type(add) is not list:
                raise CorruptStateError(f"journal record revision {revision}: bad extension of {key}")
            extended[key] = current[drop:] + add
        rows = self.rows
        for step_id, change in changes.items():
            if change is None or type(change) is dict:
                if step_id not in rows:
                    raise CorruptStateError(f"journal record revision {revision} changes unknown step {step_id!r:.80}")
                if change is not None and not CHANGE_INDEX.keys() >= change.keys():
                    raise CorruptStateError(f"journal record revision {revision} names an unknown effect field")
            elif type(change) is not list or len(change) not in ROW_WIDTHS:
                raise CorruptStateError(f"journal record revision {revision} has a malformed effect row")
        if assignments.get("lease_epoch", header.get("lease_epoch")) != epoch:
            raise CorruptStateError(f"journal record revision {revision}: epoch {epoch} is not the state's lease epoch")
        header.update(assignments)
        header.update(extended)
        for step_id, change in changes.items():
            if change is None:
                del rows[step_id]
            elif type(change) is list:
                rows[step_id] = change if len(change) != len(FIRST_EFFECT_FIELDS) else [*change, None]
            else:
                row = rows[step_id]
                if type(row) is int:  # the snapshot's row, changed for the first time
                    row = rows[step_id] = self.columns.row(row)
                if BLOBS_KEY in change and len(row) == BLOBS_AT:
                    row.append(None)
                for name, value in change.items():
                    row[CHANGE_INDEX[name]] = value
        self.revision, self.epoch = revision, epoch

    def build(self, fetch: BlobFetch | None = None) -> RunState:
        return build_state(self.header, self.revision, self.rows, fetch, columns=self.columns)


class Shadow:
    """What the journal holds, as of the last record written: the writer's side of ``Replay``.

    ``record_for`` compares the state about to be committed with it and returns the journal record
    naming only what changed. Effect records are compared only for the step ids the caller says
    changed (the runner passes them) plus any new or removed ones, which the count reveals; so a
    commit costs work in proportion to what it changed, not to the size of the ledger. A caller
    that does not say (``changed`` is None, the protocol's default) gets every record compared,
    which is correct and costs O(n). An empty collection says that no record changed.
    """

    def __init__(self, state: RunState, blobs: BlobCodec | None = None):
        self.state = state
        self.blobs = blobs
        """With a codec, large payloads and results are written as blob references."""
        self.introduced: list[BlobRef] = []
        """The blob references the last record written holds in new or changed fields: each must be
        stored before the record is (the writer writes them first)."""
        self.effects = state.effects
        self.records: dict[str, EffectRecord] = dict(state.effects)
        self.header = header_of(state)
        self._objects: dict[str, Any] = {}
        self._remember_objects(state)

    def _remember_objects(self, state: RunState) -> None:
        self._objects = {
            "budget": state.budget,
            "approval_requests": tuple(state.approval_requests.items()),
            "consumed_approvals": list(state.consumed_approvals),
            "control_observations": list(state.control_observations),
            "unknowns": list(state.unknowns),
            **{key: getattr(state, key) for key in RECORD_KEYS},
        }

    def tracks(self, state: RunState) -> bool:
        """Whether ``state`` is the very object (and effect mapping) this shadow follows."""
        return state is self.state and state.effects is self.effects

    def record_for(self, state: RunState, changed: Collection[str] | None) -> dict[str, Any] | None:
        """The journal record that turns the shadow into ``state``, updating the shadow; or None if
        the change cannot be told from ``changed`` (the caller then writes a snapshot)."""
        record: dict[str, Any] = {"rev": state.revision, "epoch": state.lease_epoch}
        self.introduced = []
        effects = self._effect_changes(state, changed)
        if effects is None:
            return None
        assignments, extensions = self._header_changes(state)
        if assignments:
            record["set"] = assignments
        if extensions:
            record["extend"] = extensions
        if effects:
            record["effects"] = effects
        return record

    def _effect_changes(self, state: RunState, changed: Collection[str] | None) -> dict[str, Any] | None:
        current, known = state.effects, self.records
        if changed is None:
            # Not told what changed: compare every record (by identity first, so unchanged ones are cheap).
            changed = [step_id for step_id, record in current.items() if known.get(step_id) is not record]
            changed += [step_id for step_id in known if step_id not in current]
        changed = dict.fromkeys(changed)  # once each, in the caller's order
        added: list[str] = []
        removed: list[str] = []
        for step_id in changed:  # a loop, not two comprehensions: this runs on every commit
            if step_id in known:
                if step_id not in current:
                    removed.append(step_id)
            elif step_id in current:
                added.append(step_id)
        if len(known) + len(added) - len(removed) != len(current):
            return None  # a record was added or removed without being named in ``changed``
        if len(added) > 1:
            # New steps must be replayed in plan order; they are the newest keys of the mapping.
            position: dict[str, int] = {}
            for step_id in reversed(current):
                if step_id in added:
                    position[step_id] = len(position)
                    if len(position) == len(added):
                        break
            added.sort(key=position.__getitem__, reverse=True)
        out: dict[str, Any] = {}
        for step_id in changed:
            if step_id in known and step_id in current:
                new = current[step_id]
                old = known[step_id]
                if new is not old:
                    difference = record_changes(old, new, self.blobs, self.introduced)
                    if difference:
                        out[step_id] = difference
                    known[step_id] = new
        for step_id in removed:
            out[step_id] = None
            del known[step_id]
        for step_id in added:
            record = current[step_id]
            out[step_id] = row_of(record, self.blobs, self.introduced)
            known[step_id] = record
        return out

    def _header_changes(self, state: RunState) -> tuple[dict[str, Any], dict[str, Any]]:
        header, objects = self.header, self._objects
        assignments: dict[str, Any] = {}
        for key, value in zip(SCALAR_KEYS, scalar_values(state)):
            old = header[key]
            if value is old:
                continue
            if isinstance(value, Status):
                value = value.value
            if type(value) is not type(old) or value != old:
                assignments[key] = header[key] = value
        if state.budget is not objects["budget"]:
            for key, value in state.budget.to_json().items():
                flat = "budget." + key
                old = header[flat]
                if value is not old and (type(value) is not type(old) or value != old):
                    assignments[flat] = header[flat] = value
            objects["budget"] = state.budget
        for key in RECORD_KEYS:
            # Compared by identity: each is a frozen record, replaced when it changes (the outline
            # once, and when the plan grows), never compared element by element on a commit.
            record = getattr(state, key)
            if record is not objects[key]:
                assignments[key] = header[key] = record.to_json() if record is not None else None
                objects[key] = record
        requests = tuple(state.approval_requests.items())
        if requests != objects["approval_requests"]:
            assignments["approval_requests"] = header["approval_requests"] = [r.to_json() for _, r in requests]
            objects["approval_requests"] = requests
        extensions: dict[str, Any] = {}
        for key in LIST_KEYS:
            items = getattr(state, key)
            old_items = objects[key]
            if items == old_items:
                continue
            encode: Callable[[Any], Any] = (lambda item: item) if key == "consumed_approvals" else (lambda item: item.to_json())
            drop = _dropped_prefix(old_items, items)
            if drop is None:
                assignments[key] = header[key] = [encode(item) for item in items]
            else:
                added = [encode(item) for item in items[len(old_items) - drop :]]
                extensions[key] = {"drop": drop, "add": added}
                header[key] = header[key][drop:] + added
            objects[key] = list(items)
        return assignments, extensions


def _dropped_prefix(old: list[Any], new: list[Any]) -> int | None:
    """The ``n`` for which ``new == old[n:] + tail`` (the fewest dropped), or None if there is none."""
    for drop in range(len(old) + 1):
        kept = len(old) - drop
        if kept <= len(new) and new[:kept] == old[drop:]:
            return drop
    return None
