"""What the console's task list and summary band are made of: one row per task, the search, the
filters, the pages, and the counts an operator glances at.

``read_rows`` reads every task once (without a lease: it moves nothing; from the store's index of
task summaries where it keeps one, else by loading each task, but for those at rest that a
``RowCache`` kept since the last render) and keeps what the list, its filters and the summary band
need (``TaskRow``); ``indexed_page`` reads one page, its count and the band from a store's summary
index instead (O(page)) where the filters allow; ``complete`` loads the tasks of the page shown; ``Listing`` applies a search
(a task id or a function, case-insensitive, a part of it is enough), the filters (status; function
and task id as globs, as ``ls --function`` and ``--match`` take them; updated since) and cuts the
page (``PAGE_SIZE`` rows, most recently updated first); ``Summary`` counts tasks by
status, the pending approvals and questions with the oldest's request time, the tasks that
recorded a failure in the last hour, and, from the fleet's tables when the store has them, the
queue depth and the workers alive.

Not guaranteed: a consistent view across tasks (they are read one after another, as ``ls`` does),
or fleet figures for a store no worker has used (the JSON-file store's fleet file is not created
to answer: the band says there is no fleet).
"""

from __future__ import annotations

import fnmatch
import math
import os
import re
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ..envelope import recorded_before_queued
from ..errors import CorruptStateError, InvalidInputError, LongrunError
from ..ledger import EffectState
from ..outcome import Status
from ..progress import progress_of
from ..lease import Lease
from ..protocols import LoadManyStore, LoadResult, Store, SummaryStore
from ..summary import SUMMARY_STATUSES, UNREADABLE, TaskSummary
from ..stores.queue import QueueEntry, TaskQueue, WorkerRecord, open_queue
from ._common import name_store, short_digest
from ._inspect import LS_STATUSES, NO_STATE_ACTION, parse_since, reported_line

__all__ = [
    "FAILED_STATUSES", "FAILURE_WINDOW_S", "PAGE_SIZE", "Fleet", "IndexedPage", "Listing", "RowCache", "Summary", "TaskRow", "complete",
    "DUE_COUNT_CAP", "indexed_page", "read_fleet", "read_rows", "short_action", "summary_row",
]  # fmt: skip

PAGE_SIZE = 50
FAILURE_WINDOW_S = 3600.0
FUNCTION_STEP = "longrun.function"
"""The step id of a durable task's own record (``longrun.functions.FUNCTION_STEP``: the faces are above this layer)."""
FAILED_STATUSES = frozenset(
    {Status.UNSAFE_TO_CONTINUE.value, Status.STATE_UNRECOVERABLE.value, Status.PLAN_MISMATCH.value, Status.BLOCKED.value,
     Status.LIMITS_EXHAUSTED.value, Status.DEADLINE_EXCEEDED.value, "failed", "DAMAGED", "UNREADABLE"}
)  # fmt: skip
"""Statuses that count as a failure in the band (``failed`` where the code knows it)."""
_FAILING = (EffectState.FAILED, EffectState.PLANNED, EffectState.UNCERTAIN)
_DIGEST = re.compile(r"\b(sha256:)?([0-9a-f]{64})\b")
SHORT_ACTION = 140


@dataclass(frozen=True, slots=True)
class TaskRow:
    """One task as the list shows it."""

    task_id: str
    status: str
    updated_at: float | None
    revision: int
    next_action: str
    function: str | None = None
    progress: str | None = None
    verified: int = 0
    total: int | None = None
    pending: int = 0
    """Approval requests and questions waiting."""
    oldest_request: float | None = None
    """When the oldest of them was requested."""
    failed_at: float | None = None
    """The latest time the task recorded a failure: an attempt that failed, or a failed status."""
    last_error: str | None = None


def read_row(store: Store, task_id: str, loaded: LoadResult | LongrunError | None = None) -> TaskRow:
    """One task's row, read without a lease (or from ``loaded``, its load or the error that raised);
    a task that cannot be read is DAMAGED or UNREADABLE."""
    try:
        if loaded is None:
            loaded = store.load(task_id)
        elif isinstance(loaded, LongrunError):
            raise loaded
        state = loaded.state
    except CorruptStateError as exc:
        return TaskRow(task_id, "DAMAGED", None, 0, f"run `longrun verify` on the task ({exc})", last_error=str(exc))
    except LongrunError as exc:
        return TaskRow(task_id, "UNREADABLE", None, 0, str(exc), last_error=str(exc))
    if state is None:
        return TaskRow(task_id, "new", None, 0, NO_STATE_ACTION)
    progress = progress_of(state)
    function_record = state.effects.get(FUNCTION_STEP)
    name = function_record.payload.get("function") if function_record is not None else None
    failed_at, last_error = None, None
    for record in state.effects.values():
        if record.last_error and record.state in _FAILING:
            if failed_at is None or record.updated_at > failed_at:
                failed_at, last_error = record.updated_at, record.last_error
    failure = state.last_failure
    if failure is not None and (failed_at is None or failure.at >= failed_at):
        failed_at, last_error = failure.at, f"{failure.error_type}: {failure.message}"
    if state.status.value in FAILED_STATUSES:
        failed_at = max(failed_at or 0.0, state.updated_at)
        last_error = last_error or state.next_action
    requested = [request.requested_at for request in state.approval_requests.values()]
    status = Status.QUEUED.value if recorded_before_queued(state) else state.status.value  # as ``ls`` shows it
    return TaskRow(
        task_id, status, state.updated_at, state.revision, state.next_action,
        function=name if isinstance(name, str) else None,
        # A function's own report, where it made one, says more than a count of its steps.
        progress=reported_line(state.progress, note=False) if state.progress is not None else progress.label(), verified=progress.verified,
        total=progress.total, pending=len(requested), oldest_request=min(requested) if requested else None,
        failed_at=failed_at, last_error=last_error,
    )  # fmt: skip


def _indexed(store: Store) -> bool:
    """Whether the store answers ``list_summaries`` from an index of its own (the SQL stores), not
    by loading every state (the base class's way)."""
    from ..stores.base import BaseStore

    own = getattr(type(store), "list_summaries", None)
    return own is not None and own is not getattr(BaseStore, "list_summaries", None)


class RowCache:
    """The rows of tasks at rest, kept between two renders: a row is read again unless the task's
    lease record is the very one it was read under and that lease is released. A commit needs the
    current lease, and taking it writes a new record (a higher epoch), so a released lease that has
    not changed means no revision was committed since. A task with no lease record, or one held
    (or expired without a release, whose holder may still commit), is always read again."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[Lease, TaskRow]] = {}

    def row(self, store: Store, task_id: str) -> TaskRow:
        lease = store.read_lease(task_id)
        kept = self._rows.get(task_id)
        if lease is not None and lease.released and kept is not None and kept[0] == lease:
            return kept[1]
        row = read_row(store, task_id)
        if lease is not None and lease.released:
            self._rows[task_id] = (lease, row)
        else:
            self._rows.pop(task_id, None)
        return row

    def rows(self, store: Store) -> list[TaskRow]:
        task_ids = store.list_tasks()
        for gone in set(self._rows) - set(task_ids):
            del self._rows[gone]
        return [self.row(store, task_id) for task_id in task_ids]


_RECORDED_ACTION = "start the first step"
"""The next action of a task recorded for a worker and never run (``envelope.recorded_before_queued``)."""
_WAITING_ON_PEOPLE = frozenset({Status.AWAITING_APPROVAL.value, Status.AWAITING_INPUT.value})


def read_rows(store: Store, cache: RowCache | None = None) -> list[TaskRow]:
    """Every task's row. A store that keeps an index of task summaries (``list_summaries``: a row
    per task written by each commit, in the SQL stores) is read from it, and only the tasks that
    wait on a person are loaded (for their requests); otherwise every task is loaded, but for the
    tasks at rest ``cache`` kept. ``complete`` loads the rows a page shows, so they show what a
    load finds (damage, progress)."""
    if not _indexed(store):
        return (cache or RowCache()).rows(store)
    return [
        read_row(store, summary.task_id) if summary.status in _WAITING_ON_PEOPLE else summary_row(summary)
        for summary in store.list_summaries()  # type: ignore[attr-defined]
    ]


def complete(store: Store, rows: Sequence[TaskRow]) -> list[TaskRow]:
    """``rows`` as a load of each task finds them now (what a summary or a kept row may lack:
    progress, damage found since): loaded together where the store can (``LoadManyStore``)."""
    ids = [row.task_id for row in rows]
    if isinstance(store, LoadManyStore):
        return [read_row(store, task_id, loaded) for task_id, loaded in zip(ids, store.load_many(ids))]
    return [read_row(store, task_id) for task_id in ids]


def summary_row(summary: TaskSummary) -> TaskRow:
    """A task's row from its summary (what the index keeps; ``complete`` adds what a load finds)."""
    status = "UNREADABLE" if summary.status == "unreadable" else str(summary.status)
    if status == Status.RUNNING.value and summary.revision == 1 and summary.next_action == _RECORDED_ACTION:
        status = Status.QUEUED.value  # recorded for a worker and never run: as ``recorded_before_queued`` reads it
    failed = summary.updated_at if summary.error or status in FAILED_STATUSES else None
    return TaskRow(
        summary.task_id, status, summary.updated_at, summary.revision, summary.next_action, function=summary.function,
        failed_at=failed, last_error=summary.error,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class IndexedPage:
    """What the task list shows, read from the store's summary index in O(page): the page's rows
    (loaded), how many tasks match, the band and the functions the filter offers."""

    rows: list[TaskRow]
    matched: int
    summary: "Summary"
    functions: list[str]


_FAILING_SUMMARIES = tuple(sorted((FAILED_STATUSES | {Status.RETRY_SCHEDULED.value, UNREADABLE}) & SUMMARY_STATUSES))
"""The statuses the band counts as failures from the index: a failed end, or a wait to retry after an error."""


def indexed_page(store: Store, listing: "Listing", fleet: "Fleet", now: float) -> IndexedPage | None:
    """The page from the summary index, or None where the listing asks what only reading every row
    can tell (a free-text search, a function glob, ``DAMAGED``/``UNREADABLE``) or the store keeps no
    index: the caller then reads every row (``read_rows``). Costs the page's loads, counts on the
    index, and a load of each task waiting on a person (the band's pending requests). The band's
    failures in the last hour are then the tasks updated in that hour whose status is a failed end
    or a wait to retry (reading every row also counts a task that recorded an error and went on)."""
    if not _indexed(store) or not isinstance(store, SummaryStore) or listing.search:
        return None
    if any(mark in listing.function for mark in "*?[") or {"DAMAGED", "UNREADABLE"} & set(listing.statuses):
        return None
    filters: dict[str, object] = dict(
        statuses=listing.statuses, functions=[listing.function] if listing.function else [], match=listing.match or None, since=listing.since
    )
    summaries = store.list_summaries(**filters, limit=PAGE_SIZE, offset=(listing.page - 1) * PAGE_SIZE)  # type: ignore[arg-type]
    counts = store.status_counts()
    if listing.function or listing.match or listing.since is not None:
        matched = store.count_summaries(**filters)  # type: ignore[arg-type]
    else:  # by status alone: the counts say it
        matched = sum(count for status, count in counts.items() if not listing.statuses or status in listing.statuses)
    waiting = [read_row(store, summary.task_id) for summary in store.list_summaries(statuses=_WAITING_ON_PEOPLE)]
    failures = store.count_summaries(statuses=_FAILING_SUMMARIES, since=now - FAILURE_WINDOW_S)
    pending = Summary.of(waiting, fleet, now)
    by_status = {("UNREADABLE" if status == "unreadable" else status): count for status, count in counts.items()}
    band = Summary(dict(sorted(by_status.items(), key=lambda item: (-item[1], item[0]))), pending.pending, pending.oldest_request, failures, fleet)
    functions = store.function_names()
    return IndexedPage(complete(store, [summary_row(summary) for summary in summaries]), matched, band, functions)


def short_action(text: str, label: str, *, limit: int | None = SHORT_ACTION) -> str:
    """A next action as the console shows it: the real store in place of ``<store>``, every digest
    cut to ``sha256:`` and 12 hex digits, and (with ``limit``) at most ``limit`` characters."""
    text = _DIGEST.sub(lambda match: short_digest("sha256:" + match.group(2)), name_store(text, label))
    if limit is not None and len(text) > limit:
        return text[: limit - 1].rstrip() + "…"
    return text


def _first(query: Mapping[str, Sequence[str]], name: str) -> str:
    values = query.get(name) or [""]
    return values[0].strip()[:200]


@dataclass(frozen=True, slots=True)
class Listing:
    """The list's search, filters and page, read from the query string (bad input: a problem shown, not an error)."""

    search: str = ""
    statuses: tuple[str, ...] = ()
    function: str = ""
    since_text: str = ""
    since: float | None = None
    page: int = 1
    problems: tuple[str, ...] = ()
    match: str = ""
    """A glob on the task id (``invoice-*``), as ``ls --match``."""

    @classmethod
    def from_query(cls, query: Mapping[str, Sequence[str]], now: float) -> "Listing":
        problems: list[str] = []
        statuses = tuple(value for value in query.get("status", []) if value in LS_STATUSES)
        since_text = _first(query, "since")
        since = None
        if since_text:
            try:
                since = parse_since(since_text, now)
            except InvalidInputError as exc:
                problems.append(str(exc))
        page_text = _first(query, "page") or "1"
        page = 1
        if page_text.isdigit() and int(page_text) > 0:
            page = int(page_text)
        else:
            problems.append(f"page {page_text[:20]!r} is not a positive whole number")
        return cls(
            _first(query, "q"), statuses, _first(query, "function"), since_text, since, page, tuple(problems), _first(query, "match")
        )

    def matches(self, row: TaskRow) -> bool:
        if self.statuses and row.status not in self.statuses:
            return False
        if self.function and not fnmatch.fnmatchcase(row.function or "", self.function):
            return False
        if self.match and not fnmatch.fnmatchcase(row.task_id, self.match):
            return False
        if self.since is not None and row.status not in ("DAMAGED", "UNREADABLE"):
            if row.updated_at is None or row.updated_at < self.since:
                return False
        if self.search:
            wanted = self.search.casefold()
            return wanted in row.task_id.casefold() or wanted in (row.function or "").casefold()
        return True

    def select(self, rows: Sequence[TaskRow]) -> tuple[list[TaskRow], int]:
        """The rows of this page, most recently updated first (unreadable ones first: they need a
        look), and how many rows match in all."""
        chosen = [row for row in rows if self.matches(row)]
        chosen.sort(key=lambda row: (-row.updated_at if row.updated_at is not None else -math.inf, row.task_id))
        start = (self.page - 1) * PAGE_SIZE
        return chosen[start : start + PAGE_SIZE], len(chosen)

    def query(self, **changes: object) -> list[tuple[str, str]]:
        """The query string of this listing with ``changes`` (``page=2``), for links."""
        values: dict[str, object] = {"q": self.search, "status": self.statuses, "function": self.function, "match": self.match,
                                     "since": self.since_text, "page": self.page, **changes}  # fmt: skip
        pairs: list[tuple[str, str]] = []
        for name, value in values.items():
            if isinstance(value, tuple):
                pairs += [(name, str(item)) for item in value]
            elif value not in ("", None) and not (name == "page" and value == 1):
                pairs.append((name, str(value)))
        return pairs


DUE_COUNT_CAP = 10_000
"""The band counts the due rows up to this many and shows more as ``10,000+``: a page costs
O(page), not a count of every due row."""


@dataclass(frozen=True, slots=True)
class Fleet:
    """The fleet's tables as the console reads them (None: the store has none yet)."""

    workers: tuple[WorkerRecord, ...] = ()
    entries: tuple[QueueEntry, ...] = ()
    note: str | None = None
    """Why there are no figures, when there are none."""
    due_now: int | None = None
    """The queue's depth as the database counted it, for a read without the rows (the band's);
    ``DUE_COUNT_CAP + 1``: more than ``DUE_COUNT_CAP``."""

    @property
    def alive(self) -> int:
        return sum(1 for worker in self.workers if worker.alive)

    @property
    def due(self) -> int:
        """Rows due now and not claimed: the queue's depth."""
        if self.due_now is not None:
            return self.due_now
        return sum(1 for entry in self.entries if entry.due_in_s is not None and entry.due_in_s <= 0 and entry.claimed_by is None)

    def queues(self) -> dict[str, list[QueueEntry]]:
        """The rows by function: one queue per function."""
        grouped: dict[str, list[QueueEntry]] = {}
        for entry in self.entries:
            grouped.setdefault(entry.function, []).append(entry)
        return dict(sorted(grouped.items()))


def read_fleet(store: Store, *, rows: bool = True, kept: list[TaskQueue] | None = None) -> Fleet:
    """The workers and the queue's rows (without ``rows``: only their count due now, for the band),
    from the fleet's tables; for a JSON-file store whose fleet file does not exist, none (it is not
    created to answer). With ``kept``, the queue is kept open there between calls (its owner closes
    it): a page then costs no new connection to the fleet's tables (a PostgreSQL session's setup)."""
    root = getattr(store, "root", None)
    if isinstance(root, str) and not os.path.exists(os.path.join(root, ".fleet.sqlite")):
        return Fleet(note="no worker has used this store")
    if kept:
        queue = kept[0]
    else:
        try:
            queue = open_queue(store)
        except InvalidInputError as exc:
            return Fleet(note=str(exc))
        if kept is not None:
            kept.append(queue)
    try:
        if not rows:
            return Fleet(tuple(queue.workers()), due_now=queue.due_count(at_most=DUE_COUNT_CAP))
        return Fleet(tuple(queue.workers()), tuple(queue.entries()))
    except LongrunError as exc:
        return Fleet(note=f"the fleet's tables cannot be read: {exc}")
    finally:
        if kept is None:
            queue.close()


@dataclass(frozen=True, slots=True)
class Summary:
    """The band at the top of the list."""

    by_status: dict[str, int] = field(default_factory=dict)
    pending: int = 0
    oldest_request: float | None = None
    failures_last_hour: int = 0
    fleet: Fleet = field(default_factory=Fleet)

    @classmethod
    def of(cls, rows: Sequence[TaskRow], fleet: Fleet, now: float) -> "Summary":
        by_status: dict[str, int] = {}
        for row in rows:
            by_status[row.status] = by_status.get(row.status, 0) + 1
        requests = [row.oldest_request for row in rows if row.oldest_request is not None]
        failures = sum(1 for row in rows if row.failed_at is not None and row.failed_at >= now - FAILURE_WINDOW_S)
        return cls(
            dict(sorted(by_status.items(), key=lambda item: (-item[1], item[0]))), sum(row.pending for row in rows),
            min(requests) if requests else None, failures, fleet,
        )  # fmt: skip
