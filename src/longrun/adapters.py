"""The records that cross the adapter seam: a request out, a receipt or observation back.

``EffectRequest`` carries everything a target needs to apply an effect idempotently and to fence
it: the stable semantic key, the payload and its digest, the attempt number, the fencing epoch and
a deadline. A ``Receipt`` is the adapter's acknowledgement, not proof: the runner still observes.
An ``Observation`` is what the target says independently: applied, absent, or unknown.

A ``Receipt`` or ``Observation`` is checked when it is built, with the rules the state's loader
reads the ledger with (``longrun._fields``): ``result`` must be plain JSON (finite numbers, text
without lone surrogates, integers of at most 4300 digits; tuples become lists), ``evidence`` a
string (a lone surrogate in it is kept as its ``\\udcXX`` escape), ``cost`` a finite number >= 0.
Anything else raises ``InvalidInputError`` inside the adapter's own call, where the mistake is,
instead of being written into the state and found unreadable later. The runner treats such an
error like any other exception from ``apply`` (the outcome is unknown: the effect is observed) or
``observe`` (an unknown observation), and records it as evidence.

The ``EffectAdapter`` protocol itself lives in ``longrun.protocols`` with the other seams.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, field

from . import _fields as f
from .canonical import JSONValue, printable
from .errors import InvalidInputError

__all__ = ["EffectRequest", "Observation", "ObservedState", "Receipt"]


@dataclass(frozen=True, slots=True)
class EffectRequest:
    """What an adapter is asked to apply or observe: one effect, identified by its stable ``key``,
    with its payload and digest, the attempt number, the fencing ``epoch`` it is made under, and
    a deadline."""

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
    cancel_event: threading.Event | None = field(default=None, compare=False, repr=False)
    """Set when the task is cancelled while the call runs (see ``cancelled``)."""

    def cancelled(self) -> bool:
        """Whether an operator cancelled the task while this call runs: a long ``apply`` should
        check it and give up (raising, so that the outcome is observed) when it can stop safely.
        Async adapters are cancelled instead (``asyncio.CancelledError`` at an ``await``)."""
        return self.cancel_event is not None and self.cancel_event.is_set()


@dataclass(frozen=True, slots=True)
class Receipt:
    """What ``apply`` returns: an acknowledgement, which the runner verifies by observation."""

    result: JSONValue = None
    cost: float = 0.0
    evidence: str = ""

    def __post_init__(self) -> None:
        if not _FAST_RECEIPT(self):
            if isinstance(self.evidence, str):
                object.__setattr__(self, "evidence", printable(self.evidence))
            f.check(_RECEIPT_SPEC, self, "Receipt")
        if self.cost < 0:
            raise InvalidInputError(f"Receipt: field 'cost' must be >= 0, got {self.cost!r}")


_RECEIPT_SPEC = (f.Field("result", f.Kind.JSON), f.Field("cost", f.Kind.NUMBER), f.Field("evidence", f.Kind.TEXT))
_FAST_RECEIPT = f.fast_check(_RECEIPT_SPEC)


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

    def __post_init__(self) -> None:
        if _FAST_OBSERVATION(self):
            return
        if isinstance(self.evidence, str):
            object.__setattr__(self, "evidence", printable(self.evidence))
        f.check(_OBSERVATION_SPEC, self, "Observation")

    @classmethod
    def applied(cls, evidence: str, result: JSONValue = None) -> "Observation":
        return cls(ObservedState.APPLIED, evidence, result)

    @classmethod
    def absent(cls, evidence: str) -> "Observation":
        return cls(ObservedState.ABSENT, evidence)

    @classmethod
    def unknown(cls, reason: str) -> "Observation":
        return cls(ObservedState.UNKNOWN, reason)


_OBSERVATION_SPEC = (
    f.Field("state", f.Kind.CHOICE, choices=ObservedState),
    f.Field("evidence", f.Kind.TEXT),
    f.Field("result", f.Kind.JSON),
)
_FAST_OBSERVATION = f.fast_check(_OBSERVATION_SPEC)
