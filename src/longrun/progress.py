"""How far a run has come, computed from its state alone: what ``watch``, ``ls`` and the console show.

``progress_of(state)`` counts the ledger's records: verified, in flight (started, acknowledged,
uncertain), waiting (planned, behind a backoff or a pending approval request), planned (ready),
failed; and for a declared plan, whose outline the state records (``RunState.plan_outline``), the
total and the steps not planned yet. The rate is verified records per second over the most recent
ones (by the time each was verified), and the time left is the rest of the plan at that rate.

A durable function's own report (``run.progress``, kept as ``RunState.progress``) is carried as
``reported``, with its rate and time left measured between its two recorded points.

``pending_of(state)`` lists the requests the run waits for a person to answer (approvals and
questions), as ``RunOutcome.pending`` carries them.

Works on any state read from any store, by any process: nothing here is kept between calls.
Not guaranteed: a meaningful rate for a run whose steps take very different times, or across a
long pause (the rate counts calendar time between the recent verifications, waits included).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Mapping

from .canonical import JSONValue
from .contract import ASK_ACTION
from .envelope import RunState
from .events import kind_of
from .ledger import IN_FLIGHT, EffectRecord, EffectState
from .outcome import PendingRequest
from .telemetry import ProgressReport

__all__ = ["Progress", "pending_of", "progress_of"]


def pending_of(state: RunState) -> tuple[PendingRequest, ...]:
    """The approval requests and questions of ``state`` still unanswered, in the order they were asked."""
    pending = []
    for request in sorted(state.approval_requests.values(), key=lambda request: (request.requested_at, request.step_id)):
        record = state.effects.get(request.step_id)
        if record is None or record.state is not EffectState.PLANNED:
            continue  # answered and started already, or a request the state holds no record for
        question: str | None = None
        choices: tuple[JSONValue, ...] | None = None
        if request.action == ASK_ACTION:
            asked, listed = record.payload.get("question"), record.payload.get("choices")
            question = asked if isinstance(asked, str) else None
            choices = tuple(listed) if isinstance(listed, list) else None
        pending.append(
            PendingRequest(
                kind="question" if request.action == ASK_ACTION else "approval",
                step_id=request.step_id,
                action=request.action,
                payload=record.payload,
                payload_digest=request.payload_digest,
                plan_digest=request.plan_digest,
                requested_at=request.requested_at,
                expires_at=request.expires_at,
                question=question,
                choices=choices,
            )
        )
    return tuple(pending)

RATE_WINDOW = 50
"""How many of the most recently verified records the rate is measured over."""


@dataclass(frozen=True, slots=True)
class Progress:
    verified: int
    in_flight: int
    waiting: int
    """Planned records that wait for a backoff to end or for an approval (or an answer)."""
    planned: int
    """Planned records ready to go."""
    failed: int
    total: int | None
    """The declared plan's step count; None when the state records no outline (a durable function)."""
    remaining: int | None
    """Declared steps without a record yet (not planned); None without an outline."""
    kinds: Mapping[str, int] = field(default_factory=dict)
    """Records by kind (``effect``, ``call``, ``timer``, ``question``, ``child``), the function's own record left out."""
    current: EffectRecord | None = None
    """The record of the run's current step, if it names one."""
    rate: float | None = None
    """Verified records per second, recently; None until two have been verified some time apart."""
    eta_s: float | None = None
    """Seconds until every declared step is verified at ``rate``; None without both."""
    reported: ProgressReport | None = None
    """What a durable function last reported with ``run.progress`` (its own units, rate and time left)."""

    @property
    def recorded(self) -> int:
        return self.verified + self.in_flight + self.waiting + self.planned + self.failed

    @property
    def fraction(self) -> float | None:
        """Verified over total, for a declared plan."""
        if self.total is None:
            return None
        return self.verified / self.total if self.total else 1.0

    def label(self) -> str:
        """``4/6`` for a declared plan, ``7 steps`` (verified) otherwise."""
        if self.total is not None:
            return f"{self.verified}/{self.total}"
        return f"{self.verified} step{'s' if self.verified != 1 else ''}"

    def to_json(self) -> dict[str, object]:
        return {
            "verified": self.verified,
            "in_flight": self.in_flight,
            "waiting": self.waiting,
            "planned": self.planned,
            "failed": self.failed,
            "total": self.total,
            "remaining": self.remaining,
            "kinds": dict(self.kinds),
            "current": self.current.step_id if self.current is not None else None,
            "rate": self.rate,
            "eta_s": self.eta_s,
            "reported": self.reported.summary_json() if self.reported is not None else None,
        }


def progress_of(state: RunState) -> Progress:
    counts = {"verified": 0, "in_flight": 0, "waiting": 0, "planned": 0, "failed": 0}
    kinds: dict[str, int] = {}
    verified_at: list[float] = []
    requests = state.approval_requests
    for record in state.effects.values():
        kind = kind_of(record.action)
        if kind == "function":
            continue
        kinds[kind] = kinds.get(kind, 0) + 1
        lifecycle = record.state
        if lifecycle is EffectState.VERIFIED:
            counts["verified"] += 1
            verified_at.append(record.updated_at)
        elif lifecycle in IN_FLIGHT:
            counts["in_flight"] += 1
        elif lifecycle is EffectState.FAILED:
            counts["failed"] += 1
        elif record.not_before is not None or record.step_id in requests:
            counts["waiting"] += 1
        else:
            counts["planned"] += 1
    outline = state.plan_outline
    total = remaining = None
    if outline is not None:
        total = len(outline)
        remaining = max(0, total - sum(kinds.values()))
    rate = eta = None
    recent = heapq.nlargest(RATE_WINDOW, verified_at)
    if len(recent) >= 2 and recent[0] > recent[-1]:
        rate = (len(recent) - 1) / (recent[0] - recent[-1])
        if total is not None:
            eta = max(0, total - counts["verified"]) / rate
    current = state.effects.get(state.current_step) if state.current_step is not None else None
    return Progress(
        verified=counts["verified"],
        in_flight=counts["in_flight"],
        waiting=counts["waiting"],
        planned=counts["planned"],
        failed=counts["failed"],
        total=total,
        remaining=remaining,
        kinds=kinds,
        current=current,
        rate=rate,
        eta_s=eta,
        reported=state.progress,
    )
