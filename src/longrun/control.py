"""Control records as a store hands them over: raw, so the runner judges them, not the store.

An operator's cancellation or approval file may be missing, malformed or forged. The store only
reads bytes and parses JSON; it reports a parse failure in ``error`` rather than raising, because
a damaged control record is evidence for the runner to weigh (a damaged cancellation still means
"stop"), not a reason to crash the run.
"""

from __future__ import annotations

from dataclasses import dataclass

from .canonical import parse_json, sha256_hex
from .errors import CorruptStateError

__all__ = ["MAX_RECORD_BYTES", "ControlRecord", "RefusedRecord", "parse_control_record"]

MAX_RECORD_BYTES = 64 * 1024
"""The longest control record a store reads (an approval, a cancellation)."""


@dataclass(frozen=True, slots=True)
class ControlRecord:
    name: str
    """Where the record came from, for evidence (a file name or row id)."""
    body: object = None
    error: str | None = None
    digest: str = ""
    """SHA-256 of the bytes read, so an outcome can say exactly which record it acted on."""


@dataclass(frozen=True, slots=True)
class RefusedRecord(ControlRecord):
    """A control record a source refused to vouch for (wrong owner, bad signature); ``error`` says
    why. It never authorizes anything: the gate and the cancellation judgement treat it as such."""


def parse_control_record(name: str, data: bytes) -> ControlRecord:
    """The record a store hands over for the bytes it read: the parsed body, or why it would not parse
    in ``error`` (over ``MAX_RECORD_BYTES``, not UTF-8, not JSON, a key named twice); never raises."""
    digest = "sha256:" + sha256_hex(data)
    try:
        return ControlRecord(name=name, body=parse_json(data, what="the record", max_bytes=MAX_RECORD_BYTES, unique_keys=True), digest=digest)
    except CorruptStateError as exc:
        return ControlRecord(name=name, error=str(exc), digest=digest)
