"""A snapshot file: one whole ``RunState`` as a meta line, a header line and lines of effect rows.

Holds ``encode_snapshot`` (the lines to write, refused before any I/O if too large),
``decode_snapshot`` (a whole file validated into a ``RawSnapshot``, not yet a ``RunState``) and
``snapshot_revision`` (the revision a meta line names, without reading the rest).
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
from typing import Any, Mapping

from ...envelope import MAX_STATE_BYTES, RunState
from ...errors import CorruptStateError, SizeLimitError
from ..blobs import BlobCodec, BlobRef
from ._lines import ROWS_PER_LINE, SCHEMA_VERSION, SNAPSHOT_FORMAT, frame, loads, meta_line, parse_meta, scan
from ._rows import BLOB_ROW_FIELDS, BLOBS_AT, EFFECT_FIELDS, FIRST_EFFECT_FIELDS, header_of, row_of

__all__ = ["RawSnapshot", "decode_snapshot", "encode_snapshot", "snapshot_revision"]

_LISTS = frozenset((list,))
_STRINGS = frozenset((str,))
_step_id_of = operator.itemgetter(1)  # EFFECT_FIELDS[1]


def encode_snapshot(state: RunState, blobs: BlobCodec | None = None, introduced: list[BlobRef] | None = None) -> list[bytes]:
    """The lines of a snapshot of ``state`` (at ``state.revision``); raises before any I/O if a
    value cannot be encoded (``InvalidInputError``) or if the snapshot would be over
    ``MAX_STATE_BYTES``, the most a load reads (``SizeLimitError``). With ``blobs``, large values
    are written as references (each one added to ``introduced``), never as their bytes."""
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
                "schema_version": SCHEMA_VERSION,
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
        lines.append(frame(rows[start : start + ROWS_PER_LINE]))
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
    rows: dict[str, list[Any]]
    meta: bytes
    line_checksums: list[bytes]


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
    meta = parse_meta(found.meta, expected_format=SNAPSHOT_FORMAT, task_id=task_id)
    if found.problem is not None:
        raise CorruptStateError(f"snapshot line at byte {found.problem_at} is {found.problem} (checksum or framing)")
    revision, count, chunks = _meta_int(meta, "revision", 1), _meta_int(meta, "effects", 0), _meta_int(meta, "row_lines", 0)
    fields = meta.get("fields")
    widths = {len(known): known for known in (EFFECT_FIELDS, FIRST_EFFECT_FIELDS, BLOB_ROW_FIELDS)}
    if type(fields) is not list or widths.get(len(fields)) != tuple(fields):
        raise CorruptStateError("snapshot meta: the effect record fields are not ones this code reads")
    width = len(fields)
    if len(found.bodies) != 1 + chunks:
        raise CorruptStateError(f"snapshot has {len(found.bodies)} lines after its meta, its meta says {1 + chunks}")
    header = loads(found.bodies[0], "snapshot header")
    if type(header) is not dict:
        raise CorruptStateError("snapshot header must be a JSON object")
    if header.get("task_id") != task_id:
        raise CorruptStateError(f"snapshot header names task {header.get('task_id')!r:.80}, its meta names {task_id!r}")
    rows: dict[str, list[Any]] = {}
    for body in found.bodies[1:]:
        chunk = loads(body, "snapshot row line")
        if type(chunk) is not list:
            raise CorruptStateError("snapshot row line must be a JSON list")
        # Each check a pass in C over the line's rows (a thousand of them): lists, as wide as the
        # meta says, each naming its step id, none named twice.
        if not _LISTS.issuperset(map(type, chunk)) or not {width}.issuperset(map(len, chunk)):
            raise CorruptStateError("snapshot effect row is malformed")
        step_ids = list(map(_step_id_of, chunk))
        if not _STRINGS.issuperset(map(type, step_ids)):
            raise CorruptStateError("snapshot effect row is malformed")
        if width == len(FIRST_EFFECT_FIELDS):
            for row in chunk:
                row.append(None)  # written before the row had a backoff
        before = len(rows)
        rows.update(zip(step_ids, chunk))
        if len(rows) != before + len(step_ids):  # a step id named twice: find it (the first ``before`` keys came earlier)
            seen = set(itertools.islice(rows, before))
            for step_id in step_ids:
                if step_id in seen:
                    raise CorruptStateError(f"snapshot has two effect records for step {step_id!r:.80}")
                seen.add(step_id)
    if len(rows) != count:
        raise CorruptStateError(f"snapshot holds {len(rows)} effect records, its meta says {count}")
    return RawSnapshot(revision, header, rows, found.meta, found.checksums)


def snapshot_revision(first_line: bytes, *, task_id: str) -> int:
    """The revision a snapshot's meta line names (validated), without reading the rest."""
    meta = parse_meta(first_line, expected_format=SNAPSHOT_FORMAT, task_id=task_id)
    revision = meta.get("revision")
    if type(revision) is not int or revision < 1:
        raise CorruptStateError("snapshot meta: revision must be an integer >= 1")
    return revision
