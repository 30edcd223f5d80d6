"""Cancellation: an operator's request that a run start no new effect.

The runner reads the cancellation record fresh from the store before every new effect and right
after recovery; it never caches it. An effect already in flight is still reconciled by observation,
but nothing new starts, and the run ends ``cancelled`` (terminal, recorded in the state).

A record that cannot be parsed is treated as a request to cancel: stopping is the safe reading of
damaged intent. Not guaranteed: that an adapter call already running is interrupted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from . import _fields as f
from .canonical import JSONValue

__all__ = ["Cancellation"]


@dataclass(frozen=True, slots=True)
class Cancellation:
    task_id: str
    requested_at: float
    requested_by: str
    reason: str

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "task_id": self.task_id,
            "requested_at": self.requested_at,
            "requested_by": self.requested_by,
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, data: object) -> "Cancellation":
        what = "cancellation record"
        d: Mapping[str, Any] = f.require_mapping(data, what)
        return cls(
            task_id=f.get_str(d, "task_id", what),
            requested_at=f.get_float(d, "requested_at", what),
            requested_by=f.get_str(d, "requested_by", what),
            reason=f.get_str(d, "reason", what),
        )
