"""The seams users implement, in one place: effect adapters, clocks, stores, and control sources.

Each is a ``typing.Protocol``: implement the methods, no base class needed. The records that cross
these seams are frozen dataclasses defined beside the concept they belong to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Iterable, Protocol, Sequence, runtime_checkable

from .adapters import EffectRequest, Observation, Receipt
from .approval import Approval
from .cancellation import Cancellation
from .control import ControlRecord
from .envelope import RunState
from .errors import LongrunError
from .lease import Lease, LeaseRepair, MonotonicReading
from .messages import Delivery, Message
from .outcome import Evidence
from .summary import TaskSummary

__all__ = [
    "AnyEffectAdapter", "ApprovalSource", "AsyncEffectAdapter", "CancellationSource", "Clock", "ClosableStore",
    "EffectAdapter", "HistoryStore", "LoadManyStore", "LoadResult", "MonotonicClock", "PausingSource", "RecordingStore", "RepairableStore",
    "SigningSource", "Store", "SummaryStore", "TaskDeletion", "TimelineClock", "WatchedSource",
]  # fmt: skip


@runtime_checkable
class EffectAdapter(Protocol):
    """Applies one kind of side effect to a target, and observes the target independently.

    ``apply`` returns a ``Receipt`` (an acknowledgement), raises ``TransientError`` or
    ``PermanentError`` when the effect certainly did not happen, or raises anything else when the
    outcome is unknown. ``observe`` reports whether the effect with ``request.key`` has happened.
    ``deduplicates`` is True only if the target itself ignores a second apply of the same key and
    payload; only then may an effect whose outcome cannot be observed be sent again.
    """

    deduplicates: bool

    def apply(self, request: EffectRequest) -> Receipt: ...

    def observe(self, request: EffectRequest) -> Observation: ...


@runtime_checkable
class AsyncEffectAdapter(Protocol):
    """``EffectAdapter`` with coroutine methods, for the async face (an async durable function,
    ``Runner.arun``): ``apply`` and ``observe`` are awaited, and cancelled past their timeout or
    when the task is cancelled (an apply cancelled so is uncertain, and observed)."""

    deduplicates: bool

    async def apply(self, request: EffectRequest) -> Receipt: ...

    async def observe(self, request: EffectRequest) -> Observation: ...


AnyEffectAdapter = EffectAdapter | AsyncEffectAdapter
"""What ``adapters=`` maps action names to: synchronous adapters, and async ones where the face is async."""


class Clock(Protocol):
    """Wall-clock seconds since the epoch, and a way to wait. Tests inject ``testing.FakeClock``.

    A clock may offer more: see ``MonotonicClock`` and ``TimelineClock`` (``SystemClock`` and
    ``FakeClock`` are both).
    """

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


@runtime_checkable
class MonotonicClock(Clock, Protocol):
    """A clock with a monotonic reading: the engine then measures the lease's freshness, the work
    charged to time budgets and the waits of backoffs with it. Without it, ``now()`` is used."""

    def monotonic(self) -> float: ...


@runtime_checkable
class TimelineClock(MonotonicClock, Protocol):
    """A monotonic clock that names the timeline its readings compare on (``SystemClock``: this boot
    of this machine; None where it cannot tell). The engine then hands the store a
    ``lease.MonotonicReading`` with each lease call, and the store judges expiry on that timeline
    instead of by wall clock (see ``longrun.lease``)."""

    def monotonic_id(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class LoadResult:
    """What ``Store.load`` found."""

    state: RunState | None
    """None when the task has never committed a revision."""
    source: str = "none"
    """"primary", "backup" or "none"."""
    digest: str = ""
    """SHA-256 of the bytes the state was decoded from."""
    observations: tuple[Evidence, ...] = ()
    quarantined: tuple[str, ...] = ()
    revision_floor: int = 0
    """The next commit gets a revision above this; past any revision that may have been committed."""

    @property
    def recovered(self) -> bool:
        return self.source == "backup"


@dataclass(frozen=True, slots=True)
class TaskDeletion:
    """What ``Store.delete_task`` removed."""

    task_id: str
    status: str
    """The status the task had ended with."""
    revision: int
    """Its last committed revision."""
    removed: tuple[str, ...]
    """What went, as the store names it (files, rows), for the operator's record."""

    def to_json(self) -> dict[str, object]:
        return {"task_id": self.task_id, "status": self.status, "revision": self.revision, "removed": list(self.removed)}


class Store(Protocol):
    """Durable state of record for tasks: lease, state, control records.

    Every mutating call that takes a ``Lease`` is fenced: the store raises ``FencedError`` and
    changes nothing unless the lease's epoch is the task's current epoch. ``acquire_lease`` issues
    a strictly greater epoch on every acquisition.
    """

    def acquire_lease(
        self, task_id: str, owner: str, ttl_s: float, now: float, *, monotonic: MonotonicReading | None = None
    ) -> Lease:
        """Take the lease with a strictly greater epoch and a new secret ``Lease.token``, unless the
        current lease is live. ``owner`` is a label: a live lease is re-entered only by a caller
        that passes its token as the keyword ``token=``; renewal, release, commits and a repairing
        load must carry the token of the current lease as well as its epoch.

        ``monotonic`` is the caller's reading on its clock's timeline (``TimelineClock``), or None
        when its clock names none; a store that records it judges expiry on that timeline.
        ``renew_lease`` and ``release_lease`` take the same keyword."""
        ...

    def renew_lease(self, lease: Lease, ttl_s: float, now: float, *, monotonic: MonotonicReading | None = None) -> Lease: ...

    def release_lease(self, lease: Lease, now: float, *, monotonic: MonotonicReading | None = None) -> None: ...

    def read_lease(self, task_id: str) -> Lease | None:
        """The lease record as anyone may see it: without its holder's token."""
        ...

    def load(self, task_id: str, *, lease: Lease | None = None) -> LoadResult: ...

    def commit(self, lease: Lease, state: RunState, changed: Collection[str] | None = None) -> int:
        """Durably write ``state`` as the next revision, fenced by ``lease``; return the revision.

        ``changed`` names the step ids whose effect records changed since the previous commit, so
        a store may write only those (an empty collection: no record changed). ``None`` means
        "not known": the store then compares or writes every record, O(ledger) but never lossy.
        """
        ...

    def read_cancellation(self, task_id: str) -> ControlRecord | None: ...


    def write_cancellation(self, record: Cancellation) -> None: ...

    def read_approvals(self, task_id: str) -> tuple[ControlRecord, ...]: ...

    def write_approval(self, approval: Approval) -> None: ...

    def list_tasks(self) -> list[str]: ...

    def delete_task(self, task_id: str, now: float) -> TaskDeletion:
        """Delete a task whose run has ended (``outcome.TERMINAL``) and whose lease is not live:
        its state, journal, blobs, control records, quarantine and fleet queue row. Refused with
        ``TaskNotFinishedError`` (nothing deleted) for any other task, ``LeaseHeldError`` while
        its lease is live, ``UnknownTaskError`` for a task the store does not hold. A crash in the
        middle leaves either the whole task or nothing that loads as a task (each store says how)."""
        ...

    def send_message(self, message: Message) -> Delivery:
        """Put ``message`` in its receiver's mailbox with the next sequence number, in the order the
        sends commit, unless a message with its key is there (then store nothing and answer with that
        one's number, ``duplicate=True``). ``UnknownTaskError`` for a receiver the store does not
        hold; ``SizeLimitError`` past ``messages.MAX_MESSAGES``. Not fenced: anyone may send."""
        ...

    def read_messages(self, task_id: str, topic: str | None = None) -> tuple[Message, ...]:
        """The task's messages (of ``topic``, or all), oldest first by sequence number; consumed
        ones too (the receiver's state says which are). ``CorruptStateError`` for a damaged one."""
        ...


# -- what a store may also offer: each declared, so callers ask for it by name ------------------


@runtime_checkable
class ClosableStore(Protocol):
    """A store that holds something to let go of (descriptors, a connection); every store longrun
    ships is one. After ``close`` the store stays usable: the next call opens what it needs."""

    def close(self) -> None: ...


@runtime_checkable
class HistoryStore(Protocol):
    """A store that still holds a task's recent commits and lists them, oldest first (the JSON-file
    store, from its journals). Each entry is a mapping with at least ``revision``, ``epoch`` and
    ``at``, and a ``description``; ``longrun history`` shows them beside what the state records."""

    def history(self, task_id: str) -> list[dict[str, object]]: ...


@runtime_checkable
class SummaryStore(Protocol):
    """A store that lists its tasks' summaries (``longrun.summary``) with filters, newest first, and
    counts them by status: every store longrun ships (``BaseStore``). The SQL stores keep a summary
    row per task in each commit's own transaction, indexed, and the JSON-file store one in its
    SQLite side file, so a page costs O(page); the default loads every state. ``longrun ls``, the
    console and the metrics read these."""

    def list_summaries(
        self,
        *,
        statuses: Iterable[str] = (),
        functions: Iterable[str] = (),
        parent: str | None = None,
        match: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[TaskSummary]: ...

    def status_counts(self) -> dict[str, int]: ...

    def count_summaries(
        self,
        *,
        statuses: Iterable[str] = (),
        functions: Iterable[str] = (),
        parent: str | None = None,
        match: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> int: ...

    def function_names(self) -> list[str]: ...


@runtime_checkable
class LoadManyStore(Protocol):
    """A store that reads many tasks' states together, read-only (``longrun ls`` loads its page so):
    every store longrun ships (``BaseStore.load_many``; the SQL stores in one transaction). Each item
    is the task's ``LoadResult`` (whose ``digest`` may be left empty), or the ``LongrunError`` its
    ``load`` would have raised."""

    def load_many(self, task_ids: Sequence[str]) -> list[LoadResult | LongrunError]: ...


@runtime_checkable
class RecordingStore(Protocol):
    """A store that writes the first revisions of new tasks together (``fn.start``,
    ``fn.start_many``): every store longrun ships (``BaseStore.record_new``; the SQL stores in one
    transaction for all of them). True for each state written; False for a task that exists."""

    def record_new(self, states: Sequence[RunState], now: float) -> list[bool]: ...


@runtime_checkable
class RepairableStore(Protocol):
    """A store that can repair a damaged lease record: set it aside and write a released lease at
    the highest epoch recorded elsewhere (``stores.base``, invariant 8; ``longrun repair``)."""

    def repair_lease(self, task_id: str, now: float, *, repaired_by: str = "longrun repair") -> LeaseRepair: ...


@runtime_checkable
class ApprovalSource(Protocol):
    """Where the runner reads a task's approval records, fresh before each gated effect.

    Every ``Store`` is one (the default). ``longrun.authority`` has a strict file source and a
    signature-checking wrapper. A source hands over every record it found, raw; one it refuses
    (wrong owner, bad signature) it hands over as a ``longrun.control.RefusedRecord`` with the
    reason in ``error``, so the refusal becomes evidence rather than disappearing.
    """

    def read_approvals(self, task_id: str) -> tuple[ControlRecord, ...]: ...


@runtime_checkable
class CancellationSource(Protocol):
    """Where the runner reads a task's cancellation record, fresh before each new effect.

    Every ``Store`` is one (the default). None means no record; a refused record comes back as a
    ``longrun.control.RefusedRecord`` (see ``ApprovalSource``).
    """

    def read_cancellation(self, task_id: str) -> ControlRecord | None: ...


@runtime_checkable
class PausingSource(CancellationSource, Protocol):
    """A cancellation source that may also ask a run to pause: the engine then stops the run
    ``retry-scheduled`` between two steps, with everything settled committed (a worker that drains)."""

    def pause_requested(self, task_id: str) -> bool: ...


@runtime_checkable
class SigningSource(Protocol):
    """An approval or cancellation source that accepts only signed records: the engine's next
    actions then say to write them with a key (``longrun approve --sign-key``)."""

    requires_signature: bool


@runtime_checkable
class WatchedSource(Protocol):
    """A control source whose records are files under directories a worker can watch: a worker of
    the fleet polls these roots' directory times (``longrun.worker``), at most every 250 ms, and
    wakes the task whose control directory changed, so that an approval, an answer or a
    cancellation written there is acted on at once. ``FileControlSource``, the JSON-file store and
    the signature-checking wrappers around them are each one."""

    def watch_roots(self) -> tuple[str, ...]: ...
