"""Control records as a store hands them over: raw, so the runner judges them, not the store.

An operator's cancellation or approval file may be missing, malformed or forged. The store only
reads bytes and parses JSON; it reports a parse failure in ``error`` rather than raising, because
a damaged control record is evidence for the runner to weigh (a damaged cancellation still means
"stop"), not a reason to crash the run.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ControlRecord", "RefusedRecord"]


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
