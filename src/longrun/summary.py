"""A task's summary row: what listings, filters, pages and metrics read instead of the whole state.

``TaskSummary`` is a few fields taken from a task's state (status, revision, function, parent,
times, wake time, last error, next action). ``summarize(state)`` computes it; the SQL stores keep
one row per task, written by every commit in the commit's own transaction (so a summary is never
ahead of or behind the state it was taken from) and indexed, so a page of a listing costs O(page),
not O(tasks). ``SummaryQuery`` is a listing's filters, checked once where they enter
(``SummaryQuery.of``: ``InvalidInputError`` for a bad one); ``SummaryQuery.admits`` applies them
in Python for a store that has no index (it loads every task, see ``stores.base``).

Not guaranteed: that a summary shows damage. It is taken at commit; a state damaged since then
shows its last committed summary until something loads it (``longrun ls`` loads the tasks of the
page it shows, ``longrun verify`` checks them all).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Iterable, Mapping

from .canonical import JSONValue
from .contract import INTERNAL_PREFIX
from .envelope import RunState
from .errors import CorruptStateError, InvalidInputError
from .ledger import EffectState
from .outcome import Status

__all__ = [
    "FUNCTION_NAMES_SQL", "FUNCTION_STEP", "STATUS_COUNTS_SQL", "MAX_ERROR_CHARS", "NEW", "SUMMARY_COLUMNS", "SUMMARY_STATUSES", "UNREADABLE", "SummaryQuery", "TaskSummary",
    "fill_status_counts", "glob_prefix", "sqlite_status_counters", "glob_regex", "summarize",
]  # fmt: skip

FUNCTION_STEP = INTERNAL_PREFIX + "function"
"""The step id of a durable function's own record (``longrun.functions.FUNCTION_STEP``)."""
NEW = "new"
"""The status of a task that has a row but no committed revision yet (a lease taken, nothing written)."""
UNREADABLE = "unreadable"
"""The status a store without a summary index lists a task with when its state cannot be read
(it loads every state to list them); a store with an index lists the last committed summary."""
SUMMARY_STATUSES = frozenset({*(status.value for status in Status), NEW, UNREADABLE})
MAX_ERROR_CHARS = 2000
"""A summary's error is cut to this many characters (the state keeps it whole)."""
_SETTLED = frozenset({EffectState.VERIFIED, EffectState.FAILED})
_FIELDS = ("task_id", "status", "revision", "function", "parent", "created_at", "updated_at", "wake_at", "error", "next_action")
SUMMARY_COLUMNS = ", ".join(_FIELDS)
"""The summary's fields as an SQL column list, in ``to_json``'s order (every summary table uses it)."""
FUNCTION_NAMES_SQL = """WITH RECURSIVE names (name) AS (
    SELECT MIN(function) FROM {table}
    UNION ALL SELECT (SELECT MIN(function) FROM {table} WHERE function > names.name) FROM names WHERE names.name IS NOT NULL
) SELECT name FROM names WHERE name IS NOT NULL"""
"""The distinct function names of a summary table (``{table}``), each found by one seek on the
function index from the last (a loose index scan): O(functions), not O(rows), in SQLite and PostgreSQL."""

STATUS_COUNTS_SQL = "SELECT status, SUM(tasks) FROM {counts} GROUP BY status HAVING SUM(tasks) <> 0"
"""How many tasks have each status, from a status count table (``{counts}``): its rows are
deltas (a shard's count may go below zero; a status's sum is its count), so a page's count of
tasks by status reads a few rows, not every summary row."""


def sqlite_status_counters(summaries: str, counts: str) -> list[str]:
    """SQLite's DDL for a status count table ``counts`` kept by triggers on the summary table
    ``summaries``, so every statement that inserts, deletes or changes the status of a summary row
    counts it in its own transaction (SQLite has one writer at a time: one shard, 0). A row whose
    status does not change writes nothing here. Then fill it once with ``fill_status_counts``."""
    bump = (
        f"INSERT INTO {counts} (status, shard, tasks) VALUES (new.status, 0, 1) "
        f"ON CONFLICT (status, shard) DO UPDATE SET tasks = tasks + 1;"
    )
    drop = f"UPDATE {counts} SET tasks = tasks - 1 WHERE status = old.status AND shard = 0;"
    return [
        f"CREATE TABLE IF NOT EXISTS {counts} (status TEXT NOT NULL, shard INTEGER NOT NULL, tasks INTEGER NOT NULL, PRIMARY KEY (status, shard))",
        f"CREATE TRIGGER IF NOT EXISTS {counts}_insert AFTER INSERT ON {summaries} BEGIN {bump} END",
        f"CREATE TRIGGER IF NOT EXISTS {counts}_delete AFTER DELETE ON {summaries} BEGIN {drop} END",
        f"CREATE TRIGGER IF NOT EXISTS {counts}_update AFTER UPDATE OF status ON {summaries} "
        f"WHEN old.status IS NOT new.status BEGIN {drop} {bump} END",
    ]


def fill_status_counts(summaries: str, counts: str) -> str:
    """The statement that counts every summary row once into an empty status count table."""
    return f"INSERT INTO {counts} (status, shard, tasks) SELECT status, 0, COUNT(*) FROM {summaries} GROUP BY status"


@dataclasses.dataclass(frozen=True, slots=True)
class TaskSummary:
    """One task as a listing shows it, taken from its latest committed state."""

    task_id: str
    status: str
    """A ``Status`` value, or ``"new"``: the task has no committed revision."""
    revision: int = 0
    function: str | None = None
    """The durable function's qualified name (``module:name``); None for a declared plan or a session."""
    parent: str | None = None
    """The parent task of a child task; None for a root task."""
    created_at: float | None = None
    updated_at: float | None = None
    """When the state was last committed; None for a new task."""
    wake_at: float | None = None
    """For a waiting task: the earliest time a step of it may be tried again (its backoff or timer)."""
    error: str | None = None
    """For a task that is not running or done: the most recent error a step of it recorded."""
    next_action: str = ""

    def to_json(self) -> dict[str, JSONValue]:
        return {name: getattr(self, name) for name in _FIELDS}

    @classmethod
    def from_json(cls, data: object) -> "TaskSummary":
        """A summary from its JSON (or a row's values by name); ``CorruptStateError`` if a field is wrong."""
        if not isinstance(data, Mapping) or set(data) != set(_FIELDS):
            raise CorruptStateError(f"a task summary holds exactly {list(_FIELDS)}")
        task_id, status, revision = data["task_id"], data["status"], data["revision"]
        if not isinstance(task_id, str) or not task_id:
            raise CorruptStateError("a task summary's task_id must be a non-empty string")
        if status not in SUMMARY_STATUSES:
            raise CorruptStateError(f"task summary of {task_id!r}: unknown status {status!r:.40}")
        if type(revision) is not int or revision < 0:
            raise CorruptStateError(f"task summary of {task_id!r}: revision must be an integer >= 0")
        for name in ("function", "parent", "error", "next_action"):
            value = data[name]
            if not (isinstance(value, str) or (value is None and name != "next_action")):
                raise CorruptStateError(f"task summary of {task_id!r}: {name} must be a string")
        for name in ("created_at", "updated_at", "wake_at"):
            value = data[name]
            if value is not None and (type(value) not in (int, float) or not math.isfinite(value)):
                raise CorruptStateError(f"task summary of {task_id!r}: {name} must be a finite number or null")
        def moment(name: str) -> float | None:
            value = data[name]
            return float(value) if value is not None else None

        return cls(
            task_id, status, revision, data["function"], data["parent"], moment("created_at"), moment("updated_at"),
            moment("wake_at"), data["error"], data["next_action"],
        )  # fmt: skip


def summarize(state: RunState, *, created_at: float | None = None, revision: int | None = None) -> TaskSummary:
    """The summary of ``state`` (at ``revision``, if given: the one a write is about to give it). O(1) for a running or finished task; a task that stops to wait or
    on an error is scanned once for its wake time and last error (at that stop, not per effect)."""
    record = state.effects.get(FUNCTION_STEP)
    payload = record.payload if record is not None else None
    function = payload.get("function") if isinstance(payload, dict) else None
    parent = payload.get("parent") if isinstance(payload, dict) else None
    wake_at = None
    error = None
    error_at = -math.inf
    if state.status not in (Status.RUNNING, Status.DONE):
        for effect in state.effects.values():
            if effect.not_before is not None and effect.state not in _SETTLED and (wake_at is None or effect.not_before < wake_at):
                wake_at = effect.not_before
            if effect.last_error is not None and effect.updated_at >= error_at:
                error, error_at = effect.last_error, effect.updated_at
    failure = state.last_failure  # the function's own failure, where one is recorded, says the most
    if failure is not None and failure.at >= error_at:
        error = failure.summary()
    return TaskSummary(
        task_id=state.task_id,
        status=state.status.value,
        revision=state.revision if revision is None else revision,
        function=function if isinstance(function, str) else None,
        parent=parent if isinstance(parent, str) else None,
        created_at=state.created_at if created_at is None else created_at,
        updated_at=state.updated_at,
        wake_at=wake_at,
        error=error[:MAX_ERROR_CHARS] if error is not None else None,
        next_action=state.next_action,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class SummaryQuery:
    """A listing's filters. Every given filter must hold (statuses and functions: any of those
    given); the result is newest first (by ``updated_at``, tasks with no revision last, then by
    task id, descending), ``offset`` rows skipped, at most ``limit`` returned."""

    statuses: tuple[str, ...] = ()
    functions: tuple[str, ...] = ()
    parent: str | None = None
    match: str | None = None
    """A glob on the task id (``*``, ``?``, ``[abc]``, ``[!abc]``), case-sensitive."""
    since: float | None = None
    """Only tasks updated at or after this time (a new task, never updated, is left out)."""
    until: float | None = None
    """Only tasks updated before this time."""
    limit: int | None = None
    offset: int = 0

    @classmethod
    def of(
        cls,
        *,
        statuses: Iterable[str] = (),
        functions: Iterable[str] = (),
        parent: str | None = None,
        match: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> "SummaryQuery":
        """The query, each filter checked (``InvalidInputError`` naming the bad one)."""
        if isinstance(statuses, str) or isinstance(functions, str):
            raise InvalidInputError("statuses and functions are collections of strings, not one string")
        status_list = tuple(statuses)
        unknown = [status for status in status_list if status not in SUMMARY_STATUSES]
        if unknown:
            raise InvalidInputError(f"unknown task status {unknown[0]!r:.40}; known: {sorted(SUMMARY_STATUSES)}")
        function_list = tuple(functions)
        if not all(isinstance(name, str) and name for name in function_list):
            raise InvalidInputError("a function filter must be a non-empty string (module:name)")
        for name, value in (("parent", parent), ("match", match)):
            if value is not None and (not isinstance(value, str) or not value or "\x00" in value):
                raise InvalidInputError(f"the {name} filter must be a non-empty string")
        for name, moment in (("since", since), ("until", until)):
            if moment is not None and (type(moment) not in (int, float) or not math.isfinite(moment)):
                raise InvalidInputError(f"{name} must be a time in seconds since the epoch")
        if limit is not None and (type(limit) is not int or limit < 0):
            raise InvalidInputError("limit must be an integer >= 0")
        if type(offset) is not int or offset < 0:
            raise InvalidInputError("offset must be an integer >= 0")
        return cls(
            status_list, function_list, parent, match,
            float(since) if since is not None else None, float(until) if until is not None else None, limit, offset,
        )  # fmt: skip

    def admits(self, summary: TaskSummary) -> bool:
        """Whether ``summary`` passes the filters (not the order, offset or limit)."""
        if self.statuses and summary.status not in self.statuses:
            return False
        if self.functions and summary.function not in self.functions:
            return False
        if self.parent is not None and summary.parent != self.parent:
            return False
        if self.match is not None and re.search(glob_regex(self.match), summary.task_id) is None:
            return False
        if self.since is not None and (summary.updated_at is None or summary.updated_at < self.since):
            return False
        return self.until is None or (summary.updated_at is not None and summary.updated_at < self.until)

    def sql(self, match_sql: str, *, desc: str = "DESC", sqlite: bool = True, count: bool = False) -> tuple[str, list[object]]:
        """The filters, the order, the offset and the limit as the tail of a ``SELECT`` from a summary
        table (``WHERE ... ORDER BY ... LIMIT``), with ``?`` parameters. ``match_sql`` is the
        condition that tries the task id against the regular expression given as its parameter;
        ``desc`` how the dialect orders update times newest first with NULL last. A glob's literal
        prefix also seeks the task id's own index. With ``count``, the ``WHERE`` alone (for a count)."""
        conditions: list[str] = []
        params: list[object] = []
        for column, values in (("status", self.statuses), ("function", self.functions)):
            if values:
                conditions.append(f"{column} IN ({', '.join('?' * len(values))})")
                params += values
        if self.parent is not None:
            conditions.append("parent = ?")
            params.append(self.parent)
        if self.match is not None:
            prefix = glob_prefix(self.match)
            if prefix:  # the task id's own index narrows the rows the pattern is tried on
                conditions.append("task_id >= ? AND task_id < ?")
                params += [prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)]
            if self.match != prefix + "*":  # "PREFIX*": the range is the whole pattern
                conditions.append(match_sql)
                params.append(glob_regex(self.match))
        if self.since is not None:
            conditions.append("updated_at >= ?")
            params.append(self.since)
        if self.until is not None:
            conditions.append("updated_at < ?")
            params.append(self.until)
        where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
        if count:
            return where, params
        page = ""
        if self.limit is not None:
            page = " LIMIT ? OFFSET ?"
            params += [self.limit, self.offset]
        elif self.offset:
            page = " LIMIT -1 OFFSET ?" if sqlite else " OFFSET ?"
            params.append(self.offset)
        return f"{where} ORDER BY updated_at {desc}, task_id DESC{page}", params

    def select(self, summaries: Iterable[TaskSummary]) -> list[TaskSummary]:
        """The filters, the order, the offset and the limit, in Python (for a store with no index)."""
        chosen = sorted((summary for summary in summaries if self.admits(summary)), key=lambda summary: summary.task_id, reverse=True)
        chosen.sort(key=lambda summary: -summary.updated_at if summary.updated_at is not None else math.inf)
        end = None if self.limit is None else self.offset + self.limit
        return chosen[self.offset : end]


def glob_regex(pattern: str) -> str:
    """``pattern`` (a glob: ``*``, ``?``, ``[abc]``, ``[!abc]``; anything else literal, as is an
    unclosed ``[``) as an anchored regular expression that Python's ``re`` and PostgreSQL's ``~``
    read alike, so every store matches a task id the same way."""
    out = ["^"]
    index, length = 0, len(pattern)
    while index < length:
        char = pattern[index]
        index += 1
        if char == "*":
            out.append(".*")
        elif char == "?":
            out.append(".")
        elif char == "[":
            end = index + (index < length and pattern[index] == "!")
            end += end < length and pattern[end] == "]"  # a "]" first in the class is one of its characters
            end = pattern.find("]", end)
            if end < 0:
                out.append("\\[")
                continue
            body = pattern[index:end]
            negate = body.startswith("!")
            members = "".join("\\" + c if c in "\\^[" else c for c in (body[1:] if negate else body))
            out.append("[" + ("^" if negate else "") + members + "]")
            index = end + 1
        else:
            out.append(char if char.isalnum() or char == "_" else "\\" + char)
    out.append("$")
    return "".join(out)


def glob_prefix(pattern: str) -> str:
    """The literal start of ``pattern``, before its first ``*``, ``?`` or ``[``: every task id it
    matches begins so, which an index on the task id can seek to."""
    for index, char in enumerate(pattern):
        if char in "*?[":
            return pattern[:index]
    return pattern
