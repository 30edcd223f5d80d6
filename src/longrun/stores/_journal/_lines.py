"""Lines and framing of the JSON-file store's files: constants, checksums, framed lines, meta lines.

Holds the format names and limits, ``no_gc`` (the collector paused while decoding), ``checksum``
and ``frame`` (one framed line), ``meta_line`` and ``parse_meta`` (a file's first line),
``line_body`` and ``loads`` (a framed line's JSON, checked and parsed), and ``scan``, which splits a
whole file into its meta and checksum-valid lines (``Scan``), telling torn from damaged. What the
lines hold is the business of ``_rows``, ``_snapshot`` and ``_records``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import json
import threading
from typing import Any, Generator

from ...canonical import MAX_JSON_DEPTH, canonical_bytes, ensure_json, json_too_deep, parse_json, printable, sha256_hex
from ...envelope import MAX_STATE_BYTES
from ...errors import CorruptStateError, ForeignStateError, InvalidInputError, SchemaVersionError

__all__ = [
    "CHECKSUM_HEX",
    "JOURNAL_FORMAT",
    "MAX_META_BYTES",
    "MIN_RECORD_BYTES",
    "ROWS_PER_LINE",
    "SCHEMA_VERSION",
    "SNAPSHOT_FORMAT",
    "Scan",
    "checksum",
    "encode_json",
    "frame",
    "line_body",
    "loads",
    "meta_line",
    "no_gc",
    "parse_meta",
    "scan",
]

SNAPSHOT_FORMAT = "longrun.snapshot"
JOURNAL_FORMAT = "longrun.journal"
SCHEMA_VERSION = 1
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


def parse_meta(line: bytes, *, expected_format: str, task_id: str) -> dict[str, Any]:
    """Validate a file's first line (without its newline) and return its fields.

    Order matters: a well-formed meta of a schema this code does not know raises
    ``SchemaVersionError`` even though its checksum (over the newer fields) cannot match here.
    """
    document = parse_json(line, what=f"{expected_format} meta line", max_bytes=MAX_META_BYTES, unique_keys=True)
    if not isinstance(document, dict) or document.get("format") != expected_format:
        raise CorruptStateError(f"not a {expected_format} file (its first line is not a {expected_format} meta)")
    version = document.get("schema_version")
    if type(version) is not int or version != SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{expected_format} schema version {version!r:.20} is not supported (this code reads version {SCHEMA_VERSION})"
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
