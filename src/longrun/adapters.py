"""The records that cross the adapter seam: a request out, a receipt or observation back.

``EffectRequest`` carries everything a target needs to apply an effect idempotently and to fence
it: the stable semantic key, the payload and its digest, the attempt number, the fencing epoch and
a deadline. A ``Receipt`` is the adapter's acknowledgement, not proof: the runner still observes.
An ``Observation`` is what the target says independently: applied, absent, or unknown.

The ``EffectAdapter`` protocol itself lives in ``longrun.protocols`` with the other seams.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .canonical import JSONValue

__all__ = ["EffectRequest", "Observation", "ObservedState", "Receipt"]


@dataclass(frozen=True, slots=True)
class EffectRequest:
    task_id: str
    step_id: str
    action: str
    key: str
    payload: dict[str, JSONValue]
    payload_digest: str
    attempt: int
    epoch: int
    deadline: float
    """Wall-clock time (the runner's clock) by which the call should give up."""


@dataclass(frozen=True, slots=True)
class Receipt:
    """What ``apply`` returns: an acknowledgement, which the runner verifies by observation."""

    result: JSONValue = None
    cost: float = 0.0
    evidence: str = ""


class ObservedState(str, enum.Enum):
    APPLIED = "applied"
    ABSENT = "absent"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Observation:
    """What the target says about an effect, read independently of ``apply``.

    ``absent`` must mean the effect has not taken place and will not appear later (the adapter
    knows its target's consistency); only then may the runner apply it again.
    """

    state: ObservedState
    evidence: str
    result: JSONValue = None

    @classmethod
    def applied(cls, evidence: str, result: JSONValue = None) -> "Observation":
        return cls(ObservedState.APPLIED, evidence, result)

    @classmethod
    def absent(cls, evidence: str) -> "Observation":
        return cls(ObservedState.ABSENT, evidence)

    @classmethod
    def unknown(cls, reason: str) -> "Observation":
        return cls(ObservedState.UNKNOWN, reason)
