"""The fleet's tables: a due-time index of durable-function tasks, the live workers, action slots.

A worker fleet (``longrun.worker``) decides *who tries* a task here; the task's lease, fenced by
its epoch, still decides *who holds* it. Nothing in these tables is needed for a task's safety:
a wrong, stale or lost row costs a wasted or late run, never a second holder or a second effect.

Where the tables live:

- ``PostgresStore``: in the store's database, beside ``longrun_tasks``. Due rows are claimed with
  ``SELECT ... FOR UPDATE SKIP LOCKED``, so workers never wait on each other's rows; due times are
  the database server's clock, so a worker's skewed clock does not change when a task is picked.
  Triggers keep the index current however a task is run: the row of a durable function's task is
  created with its first record (``fn.start``, ``fn.run``, a child started by its parent), due when
  the lease of the run that records it ends; a lease
  taken by a runner outside the fleet makes the row due when that lease ends (released or expired);
  an approval, an answer, a cancellation or a message sent to the task makes the row due at once. A row that becomes due at
  once sends ``NOTIFY longrun_fleet``, which wakes idle workers (polling is the fallback).
- ``SqliteStore``: in the store's file, with the same triggers; claims take SQLite's write lock.
- ``JsonFileStore``: in ``ROOT/.fleet.sqlite`` beside the task directories (not a task id, so
  ``list_tasks`` never shows it). No trigger can see a file, so ``rescan`` does their work by
  polling: it adopts tasks that have no row, and makes a parked row due when the task's lease
  epoch or release, its control records' digests, or its mailbox, changed since the row was written.

Tables (version ``SCHEMA_VERSION`` in ``longrun_fleet_schema``, apart from the store's own)::

    longrun_queue   task_id, function, parent, priority, wake_at (due when <= the clock; NULL: parked
                    until something wakes it), status (the last outcome a worker saw), claimed_by,
                    claim_token, nudge (bumped by every wake-up, so a run that was under way when it
                    came does not park the task over it), runs, failures, last_error, fingerprint
    longrun_workers name, host, pid, started_at, heartbeat_at, heartbeat_s, state, concurrency,
                    running, functions
    longrun_slots   action, slot, holder, token, expires_at: K rows per limited action
    longrun_schedules name, record (``schedules.Schedule.to_json``), next_slot (the next slot to
                    start), last_slot, last_task (the last slot a worker started, and its task)

A claim sets ``wake_at`` to the claim's expiry and is extended while the worker runs the task: a
worker that dies leaves a row that is due again when its claim expires, with no step in between
that could lose the task.

Not guaranteed: that a row is current when a task is run outside the fleet on the JSON-file store
between two rescans (it is found by the next rescan), or on a database whose tables were created
without these triggers (a worker creates them, and adopts every task already stored, on first use).

One concept, so one module, longer than most: the queue's records, its connection (``_Tables``:
one transaction at a time, the tables created on first use) and ``TaskQueue``, which holds that
connection and passes every statement through it (the index, the workers, the action slots, the
wake-up). What differs between PostgreSQL and SQLite is the dialect's (``_queue_sql``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import secrets
import threading
from typing import Any, Callable, Generator, Iterable, Sequence

from ..canonical import JSONValue, canonical_bytes, parse_json, sha256_hex
from ..contract import check_task_id
from ..errors import CorruptStateError, DuplicateTaskError, InvalidInputError, LongrunError, SchemaVersionError, StorageError, UnknownTaskError
from ..outcome import TERMINAL
from ..protocols import Store, SummaryStore
from ..queues import Queue
from ..schedules import Schedule, ScheduleError, ScheduleState
from ._fileio import FileIO, ensure_dirs
from ._queue_sql import FUNCTION_STEP, NOTIFY_CHANNEL, SIDE_FILE, Dialect, PostgresDialect, SqliteDialect, tables

__all__ = ["SCHEMA_VERSION", "Claim", "QueueEntry", "SlotHold", "TaskQueue", "WorkerRecord", "open_queue"]

log = logging.getLogger("longrun")

_WAITING_ON_CHILD = "waiting-on-child"


@dataclasses.dataclass(frozen=True, slots=True)
class Claim:
    """A worker's claim on one due task: the right to try it until ``TaskQueue.finish``."""

    task_id: str
    function: str
    token: str
    nudge: int
    """The row's wake-up count when claimed: one that changed during the run wakes it again."""
    parent: str | None = None
    priority: int = 0
    failures: int = 0
    """How many runs in a row raised before this claim (any worker's): the next backoff grows with it."""


@dataclasses.dataclass(frozen=True, slots=True)
class QueueEntry:
    """One row of the index, as ``TaskQueue.entries`` reads it (times relative to the database's clock)."""

    task_id: str
    function: str
    parent: str | None
    priority: int
    due_in_s: float | None
    """Seconds until it is due (negative: overdue); None: parked until something wakes it."""
    status: str
    claimed_by: str | None
    runs: int
    failures: int
    last_error: str | None

    def to_json(self) -> dict[str, JSONValue]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerRecord:
    """A worker's row: who it is, and when it last said it was alive (by the database's clock)."""

    name: str
    host: str
    pid: int
    state: str
    """running, draining or stopped (a worker that died keeps the state it had: see ``alive``)."""
    concurrency: int
    running: int
    """Tasks it held at its last heartbeat."""
    claimed: int
    """Rows it holds an unexpired claim on now."""
    heartbeat_age_s: float
    alive: bool
    """Its last heartbeat is younger than three heartbeat intervals and it has not stopped."""
    functions: tuple[str, ...]
    started_at: float

    def to_json(self) -> dict[str, JSONValue]:
        document = dataclasses.asdict(self)
        document["functions"] = list(self.functions)
        return document


@dataclasses.dataclass(frozen=True, slots=True)
class SlotHold:
    """One of an action's K slots, held until released or, if its holder stops renewing it, expired."""

    action: str
    slot: int
    token: str


SCHEMA_VERSION = 4
"""1: the index, the workers and the action slots; 2: a message sent to a task wakes it (a trigger on
``longrun_messages``); 3: schedules (``longrun_schedules``); 4: named queues (``longrun_named_queues``,
``longrun_queue_starts``, ``longrun_dedup``, and ``queue_name``, ``not_before`` on ``longrun_queue``).
Every statement of ``_create`` may run again, so an older database is brought up to date by running
them all (a column older code did not make is added)."""
_SCHEMA_DESCRIPTIONS = {
    1: "the due-time index, workers and action slots", 2: "a message sent to a task wakes it", 3: "schedules",
    4: "named queues",
}  # fmt: skip
_ADDED_COLUMNS = (("longrun_queue", "queue_name", "TEXT"), ("longrun_queue", "not_before", None))
"""Columns of version 4 on a table older code made (None: the dialect's float type)."""
_TERMINAL_VALUES = tuple(sorted(status.value for status in TERMINAL))
MAX_ROW_BYTES = 64 * 1024 * 1024


def _function_record(body: object) -> tuple[str, str | None] | None:
    """(function, parent) from a stored function-step effect row, or None if it holds neither."""
    text = body if isinstance(body, str) else bytes(body).decode("utf-8", "replace") if isinstance(body, (bytes, memoryview)) else None
    if text is None:
        return None
    try:
        document = parse_json(text.encode("utf-8", "surrogatepass"), what="an effect row", max_bytes=MAX_ROW_BYTES)
    except (CorruptStateError, UnicodeError):
        return None
    record = document.get("record") if isinstance(document, dict) else None
    payload = record.get("payload") if isinstance(record, dict) else None
    if not isinstance(payload, dict) or not isinstance(payload.get("function"), str):
        return None
    parent = payload.get("parent")
    return str(payload["function"]), parent if isinstance(parent, str) else None



class _Done:
    """What ``_Tables._single`` ran: its row count and the rows it returned, read before the cursor closed."""

    def __init__(self, rowcount: int, rows: list[Any]) -> None:
        self.rowcount = rowcount
        self._rows = rows

    def fetchall(self) -> list[Any]:
        return self._rows


class _Tables:
    """The connection to one store's fleet tables, one transaction at a time, and the tables'
    creation on first use (adopting every durable task already stored). ``TaskQueue`` holds one and
    passes its statements through it."""

    def __init__(self, dialect: Dialect, store: Store):
        self.dialect = dialect
        self.store = store
        self._lock = threading.Lock()
        self._connection: Any = None
        self._cursor: Any = None
        self._ready = False

    def __repr__(self) -> str:
        return f"TaskQueue({self.dialect.describe()})"

    def close(self) -> None:
        with self._lock:
            self._drop()

    @property
    def ready(self) -> bool:
        """Whether the tables were found or made on the connection held now."""
        with self._lock:
            return self._ready

    def _drop(self) -> None:
        connection, self._connection, self._cursor = self._connection, None, None
        self._ready = False
        if connection is not None:
            with contextlib.suppress(Exception):
                connection.close()

    def _sql(self, statement: str) -> str:
        statement = statement.replace("{now}", self.dialect.now_sql)
        return statement if self.dialect.placeholder == "?" else statement.replace("?", self.dialect.placeholder)

    def run(self, statement: str, params: Sequence[object] = ()) -> Any:
        if params:
            self._cursor.execute(self._sql(statement), tuple(params))
        else:  # no parameters: no placeholder parsing either (a trigger body may hold any text)
            self._cursor.execute(self._sql(statement))
        return self._cursor

    def one(self, statement: str, params: Sequence[object] = ()) -> Any:
        return self.run(statement, params).fetchone()

    def rows(self, statement: str, params: Sequence[object] = ()) -> list[Any]:
        return list(self.run(statement, params).fetchall())

    @contextlib.contextmanager
    def session(self, what: str, *, write: bool = True) -> Generator[None, None, None]:
        with self._lock:
            if not self._ready:
                self._prepare()
            errors = self.dialect.errors()
            try:
                self._cursor = self._connection.cursor()
                self.dialect.begin(self.run, write=write, connection=self._connection)
            except errors as exc:
                self._drop()
                raise StorageError(f"{self!r}: cannot open a transaction to {what}: {exc}") from exc
            try:
                yield
            except BaseException as exc:
                try:
                    self.dialect.end(self._connection, commit=False)
                except Exception:  # the connection is in an unknown state: never reuse it
                    self._drop()
                if isinstance(exc, errors) and not isinstance(exc, LongrunError):
                    self._drop()
                    raise StorageError(f"{self!r}: cannot {what}: {exc}") from exc
                raise
            else:
                try:
                    self.dialect.end(self._connection, commit=True)
                except errors as exc:
                    self._drop()
                    raise StorageError(f"{self!r}: the transaction to {what} did not commit: {exc}") from exc
            finally:
                self._cursor = None

    def single(self, what: str, statement: str, params: Sequence[object]) -> int:
        """Run one write statement as a transaction of its own and return its row count: in one round
        trip where the driver has an autocommit mode (PostgreSQL's: neither BEGIN nor COMMIT
        travels), else in a ``session``. A failure drops the connection and raises ``StorageError``
        (whether it was written is then unknown, as for a failed COMMIT)."""
        return int(self._single(what, statement, params).rowcount)

    def single_rows(self, what: str, statement: str, params: Sequence[object]) -> list[Any]:
        """``single`` for a statement that returns rows (``RETURNING``): its rows."""
        return list(self._single(what, statement, params).fetchall())

    def _single(self, what: str, statement: str, params: Sequence[object]) -> Any:
        if not self.dialect.notify:  # SQLite: its session is a local transaction
            with self.session(what):
                cursor = self.run(statement, params)
                return _Done(cursor.rowcount, list(cursor.fetchall()) if cursor.description else [])
        with self._lock:
            if not self._ready:
                self._prepare()
            errors = self.dialect.errors()
            connection = self._connection
            try:
                connection.autocommit = True
                try:
                    self._cursor = connection.cursor()
                    cursor = self.run(statement, params)
                    return _Done(cursor.rowcount, list(cursor.fetchall()) if cursor.description else [])
                finally:
                    connection.autocommit = False
            except errors as exc:
                self._drop()
                raise StorageError(f"{self!r}: cannot {what}: {exc}") from exc
            finally:
                self._cursor = None

    def _prepare(self) -> None:
        """Connect, and create or check the tables (once per connection)."""
        if self.dialect.in_store:  # the store's own tables first: the triggers are on them
            if isinstance(self.store, SummaryStore):
                self.store.list_summaries(limit=0)  # opens the store's schema without reading a task: O(1)
            else:
                self.store.list_tasks()
        errors = self.dialect.errors()
        try:
            self._connection = self.dialect.connect()
        except LongrunError:
            raise
        except Exception as exc:
            raise StorageError(f"{self!r}: cannot connect: {exc}") from exc
        errors = self.dialect.errors()
        try:
            self._cursor = self._connection.cursor()
            self.dialect.begin(self.run, write=False, connection=self._connection)
            exists = bool(self.one(self.dialect.schema_exists_sql())[0])
            version = int(self.one("SELECT MAX(version) FROM longrun_fleet_schema")[0] or 0) if exists else 0
            self.dialect.end(self._connection, commit=True)
            if version > SCHEMA_VERSION:
                raise SchemaVersionError(
                    f"{self!r}: the fleet tables have version {version}, newer than this code knows ({SCHEMA_VERSION})"
                )
            if version < SCHEMA_VERSION:
                self._cursor = self._connection.cursor()
                self.dialect.begin(self.run, write=True, connection=self._connection)
                self._create()
                self.dialect.end(self._connection, commit=True)
        except LongrunError:
            self._drop()
            raise
        except errors as exc:
            self._drop()
            raise StorageError(f"{self!r}: cannot create the fleet tables: {exc}") from exc
        finally:
            self._cursor = None
        self._ready = self._connection is not None

    def _create(self) -> None:
        """The tables, the triggers, and a row for every durable task already stored (in one transaction)."""
        dialect = self.dialect
        dialect.lock_schema(self.run)
        self.run(
            f"CREATE TABLE IF NOT EXISTS longrun_fleet_schema (version INTEGER PRIMARY KEY, "
            f"applied_at {dialect.float_type} NOT NULL, description TEXT NOT NULL)"
        )
        if int(self.one("SELECT COALESCE(MAX(version), 0) FROM longrun_fleet_schema")[0]) >= SCHEMA_VERSION:
            return  # another process got here first
        for statement in tables(dialect):
            self.run(statement)
        for table, column, kind in _ADDED_COLUMNS:
            if not int(self.one(dialect.column_exists_sql(table, column))[0]):
                self.run(f"ALTER TABLE {table} ADD COLUMN {column} {kind or dialect.float_type}")
        for statement in dialect.triggers():
            self.run(statement)
        adopted = 0
        if dialect.in_store:
            rows = self.rows(
                "SELECT e.task_id, e.record, s.status FROM longrun_effects e LEFT JOIN longrun_states s ON s.task_id = e.task_id "
                f"WHERE e.step_id = '{FUNCTION_STEP}'"
            )
            for task_id, body, status in rows:
                found = _function_record(body)
                if found is None:
                    continue
                adopted += self.adopt(str(task_id), found[0], found[1], str(status) if status is not None else "new")
        applied = int(self.one("SELECT COALESCE(MAX(version), 0) FROM longrun_fleet_schema")[0])
        for version in range(applied + 1, SCHEMA_VERSION + 1):
            self.run(
                "INSERT INTO longrun_fleet_schema (version, applied_at, description) VALUES (?, {now}, ?)",
                (version, _SCHEMA_DESCRIPTIONS[version]),
            )
        log.info("%r: fleet tables created (version %d); %d stored tasks adopted", self, SCHEMA_VERSION, adopted)

    def adopt(self, task_id: str, function: str, parent: str | None, status: str, fingerprint: str | None = None) -> int:
        due = "NULL" if status in _TERMINAL_VALUES else "{now}"
        cursor = self.run(
            "INSERT INTO longrun_queue (task_id, function, parent, wake_at, status, fingerprint, updated_at) "
            f"VALUES (?, ?, ?, {due}, ?, ?, {{now}}) ON CONFLICT (task_id) DO NOTHING",
            (task_id, function, parent, status, fingerprint),
        )
        return 1 if cursor.rowcount == 1 else 0

    def exists(self) -> bool:
        """Whether the tables were made (a read that creates nothing; a JSON-file store's side file
        that does not exist is not created)."""
        if not self.dialect.in_store and isinstance(self.dialect, SqliteDialect) and not os.path.exists(self.dialect.path):
            return False
        with self._lock:
            if self._ready:
                return True
            errors = self.dialect.errors()
            if self.dialect.in_store:
                self.store.list_tasks()  # the store's own check of its database first
            try:
                connection = self.dialect.connect()
            except LongrunError:
                raise
            except Exception as exc:
                raise StorageError(f"{self!r}: cannot connect: {exc}") from exc
            try:
                cursor = connection.cursor()
                cursor.execute(self.dialect.schema_exists_sql())
                return bool(cursor.fetchone()[0])
            except errors as exc:
                raise StorageError(f"{self!r}: cannot look for the fleet tables: {exc}") from exc
            finally:
                with contextlib.suppress(Exception):
                    connection.close()

    def notify(self) -> None:
        if self.dialect.notify:
            self.run(f"SELECT pg_notify('{NOTIFY_CHANNEL}', '')")


class TaskQueue:
    """The fleet's tables for one store (see the module docstring). ``open_queue(store)`` makes one.

    Thread-safe: one connection, used by one thread at a time for one whole transaction. A broken
    connection is dropped and a new one made on the next call; driver errors are ``StorageError``.
    """

    def __init__(self, dialect: Dialect, store: Store):
        self.store = store
        self._tables = _Tables(dialect, store)
        self.limited = False
        """Whether the last ``claim`` left due tasks of a named queue at its limit unclaimed."""
        self._slot_rows: dict[str, int] = {}
        """The slot count each limited action's rows were made for (so they are made once)."""

    def __repr__(self) -> str:
        return repr(self._tables)

    @property
    def in_store(self) -> bool:
        """Whether triggers keep the index current (else ``rescan`` must poll the store)."""
        return self._tables.dialect.in_store

    @property
    def notifies(self) -> bool:
        return self._tables.dialect.notify

    def close(self) -> None:
        self._tables.close()

    # -- the index ----------------------------------------------------------------------------

    def ensure(self) -> None:
        """Create the tables (and triggers) if they are missing; a no-op once they exist (checked
        once per connection: a queue kept open, as ``fn.start`` keeps one, checks them once)."""
        if self._tables.ready:
            return
        with self._tables.session("check the fleet tables", write=False):
            pass

    def enqueue(self, task_id: str, function: str, *, priority: int = 0, parent: str | None = None) -> bool:
        """Make the task's row (due now) unless it has one; set its priority either way. True if new."""
        return self.enqueue_many([task_id], function, priority=priority, parent=parent)[0]

    def enqueue_many(self, task_ids: Sequence[str], function: str, *, priority: int = 0, parent: str | None = None) -> list[bool]:
        """``enqueue`` for each of ``task_ids``, in one transaction; True for each row made."""
        for task_id in task_ids:
            check_task_id(task_id)
        if not isinstance(function, str) or not function:
            raise InvalidInputError("a queued task needs its function's name (module:qualname)")
        if isinstance(priority, bool) or not isinstance(priority, int) or not -(2**31) <= priority < 2**31:
            raise InvalidInputError(f"priority must be an integer in [-2**31, 2**31), got {priority!r}")
        if self.in_store:
            # A task recorded in the store's database has its row already, made by the trigger in
            # the recording's own transaction: a read finds it, and the write (its own sync) is
            # needed only for the rows missing or of another priority.
            with self._tables.session("read queued tasks", write=False):
                found: dict[str, int] = {}
                for start in range(0, len(task_ids), 500):
                    chunk = list(task_ids[start : start + 500])
                    for task_id, stored_priority in self._tables.rows(
                        f"SELECT task_id, priority FROM longrun_queue WHERE task_id IN ({', '.join('?' * len(chunk))})", chunk
                    ):
                        found[str(task_id)] = int(stored_priority)
            if all(found.get(task_id) == priority for task_id in task_ids):
                return [False] * len(task_ids)
        created = []
        what = f"enqueue task {task_ids[0]!r}" if len(task_ids) == 1 else f"enqueue {len(task_ids)} tasks"
        with self._tables.session(what):
            for task_id in task_ids:
                cursor = self._tables.run(
                    "INSERT INTO longrun_queue (task_id, function, parent, priority, wake_at, status, updated_at) "
                    "VALUES (?, ?, ?, ?, {now}, 'new', {now}) ON CONFLICT (task_id) DO NOTHING",
                    (task_id, function, parent, priority),
                )
                created.append(bool(cursor.rowcount == 1))
                if not created[-1]:
                    self._tables.run("UPDATE longrun_queue SET priority = ? WHERE task_id = ?", (priority, task_id))
            if task_ids:
                self._tables.notify()
        return created

    def claim(self, worker: str, functions: Iterable[str], limit: int, ttl_s: float) -> list[Claim]:
        """Claim up to ``limit`` due tasks of ``functions``, highest priority first, then longest due.

        A claim lasts ``ttl_s`` by the database's clock unless ``extend`` renews it; when it lapses
        the row is due again (its worker died or stopped). A task of a named queue is claimed only
        within the queue's limits (``longrun.queues``), judged while holding the queue's row;
        ``limited`` says afterwards whether a queue at its limit held tasks back."""
        names = sorted(set(functions))
        self.limited = False
        if limit <= 0 or not names:
            return []
        token = secrets.token_hex(12)
        marks = ", ".join("?" for _ in names)
        due = f"wake_at <= {{now}} AND (not_before IS NULL OR not_before <= {{now}}) AND function IN ({marks})"
        columns = "task_id, function, nudge, parent, priority, failures, queue_name, wake_at"
        lock = " FOR UPDATE SKIP LOCKED" if self._tables.dialect.skip_locked else ""
        if lock:
            # PostgreSQL: one statement in autocommit while no named queue is defined (the common
            # case): the due rows locked (SKIP LOCKED, as below) and claimed, their values before the
            # claim returned. With named queues it claims nothing and the transaction below runs.
            picked = ", ".join(f"p.{column}" for column in columns.split(", "))
            found = self._tables.single_rows(
                "claim due tasks",
                f"WITH named AS (SELECT COUNT(*) AS n FROM longrun_named_queues), "
                f"p AS (SELECT {columns} FROM longrun_queue WHERE {due} AND queue_name IS NULL "
                f"ORDER BY priority DESC, wake_at LIMIT ?{lock}), "
                "claimed AS (UPDATE longrun_queue SET claimed_by = ?, claim_token = ?, wake_at = {now} + ?, runs = runs + 1, "
                f"updated_at = {{now}} FROM p WHERE longrun_queue.task_id = p.task_id AND (SELECT n FROM named) = 0 RETURNING {picked}) "
                f"SELECT (SELECT n FROM named), {', '.join('c.' + column for column in columns.split(', '))} "
                "FROM (SELECT 1) one LEFT JOIN claimed c ON TRUE",
                (*names, limit, worker, token, ttl_s),
            )
            if found and found[0][0] == 0:
                ordered = sorted((row[1:] for row in found if row[1] is not None), key=lambda r: (-int(r[4]), float(r[7])))
                return [
                    Claim(str(r[0]), str(r[1]), token, int(r[2]), str(r[3]) if r[3] is not None else None, int(r[4]), int(r[5]))
                    for r in ordered
                ]
        with self._tables.session("claim due tasks"):
            defined = self._named_queues(lock=bool(lock))
            rows = self._tables.rows(
                f"SELECT {columns} FROM longrun_queue WHERE {due} AND queue_name IS NULL ORDER BY priority DESC, wake_at LIMIT ?{lock}",
                (*names, limit),
            )
            capacity: dict[str, int] = {}
            for name, queue in defined.items():
                capacity[name] = self._capacity(queue, worker, limit)
                if capacity[name] > 0:
                    rows += self._tables.rows(
                        f"SELECT {columns} FROM longrun_queue WHERE {due} AND queue_name = ? ORDER BY priority DESC, wake_at LIMIT ?{lock}",
                        (*names, name, capacity[name]),
                    )
                else:
                    self.limited = True
            rows.sort(key=lambda r: (-int(r[4]), float(r[7])))
            taken: list[Any] = []
            for row in rows:
                if len(taken) == limit:
                    break
                queue_name = row[6]
                if queue_name is not None:
                    if capacity.get(str(queue_name), 0) <= 0:
                        continue
                    capacity[str(queue_name)] -= 1
                    self._tables.run("INSERT INTO longrun_queue_starts (queue_name, started_at) VALUES (?, {now})", (queue_name,))
                self._tables.run(
                    "UPDATE longrun_queue SET claimed_by = ?, claim_token = ?, wake_at = {now} + ?, runs = runs + 1, "
                    "updated_at = {now} WHERE task_id = ?",
                    (worker, token, ttl_s, row[0]),
                )
                taken.append(row)
        return [
            Claim(str(r[0]), str(r[1]), token, int(r[2]), str(r[3]) if r[3] is not None else None, int(r[4]), int(r[5]))
            for r in taken
        ]

    def _capacity(self, queue: Queue, worker: str, limit: int) -> int:
        """How many more of ``queue``'s tasks ``worker`` may start now (inside the claim's transaction)."""
        room = limit
        name = queue.name
        live = "queue_name = ? AND claim_token IS NOT NULL AND wake_at > {now}"
        if queue.concurrency is not None:
            room = min(room, queue.concurrency - int(self._tables.one(f"SELECT COUNT(*) FROM longrun_queue WHERE {live}", (name,))[0]))
        if queue.per_worker is not None:
            mine = int(self._tables.one(f"SELECT COUNT(*) FROM longrun_queue WHERE {live} AND claimed_by = ?", (name, worker))[0])
            room = min(room, queue.per_worker - mine)
        period = queue.rate[1] if queue.rate is not None else 0.0
        self._tables.run("DELETE FROM longrun_queue_starts WHERE queue_name = ? AND started_at <= {now} - ?", (name, period))
        if queue.rate is not None:
            started = int(self._tables.one("SELECT COUNT(*) FROM longrun_queue_starts WHERE queue_name = ?", (name,))[0])
            room = min(room, queue.rate[0] - started)
        return max(room, 0)

    # -- named queues (``longrun.queues``) -------------------------------------------------------

    def _named_queues(self, *, lock: bool = False) -> dict[str, Queue]:
        rows = self._tables.rows("SELECT name, record FROM longrun_named_queues ORDER BY name" + (" FOR UPDATE" if lock else ""))
        found = {}
        for name, record in rows:
            text = record if isinstance(record, str) else bytes(record).decode("utf-8", "replace")
            found[str(name)] = Queue.from_json(parse_json(text.encode("utf-8"), what=f"stored queue {name!r}", max_bytes=MAX_ROW_BYTES))
        return found

    def define_queue(self, queue: Queue) -> None:
        """Store ``queue`` (its limits replace those stored under its name)."""
        if not isinstance(queue, Queue):
            raise InvalidInputError(f"define_queue needs a longrun.Queue, got {type(queue).__name__}")
        record = canonical_bytes(queue.to_json()).decode("utf-8")
        with self._tables.session(f"define queue {queue.name!r}"):
            self._tables.run(
                "INSERT INTO longrun_named_queues (name, record, updated_at) VALUES (?, ?, {now}) "
                "ON CONFLICT (name) DO UPDATE SET record = excluded.record, updated_at = excluded.updated_at",
                (queue.name, record),
            )

    def named_queues(self) -> dict[str, Queue]:
        """The queues defined in this store, by name. ``CorruptStateError`` for a damaged one."""
        with self._tables.session("read the queues", write=False):
            return self._named_queues()

    def place(self, task_id: str, function: str, queue_name: str, *, not_before_s: float = 0.0, priority: int = 0) -> None:
        """Make the row of a task about to be recorded, in ``queue_name``, parked: the record's
        lease release makes it due (or ``enqueue`` does), and not before ``not_before_s`` from now.
        ``InvalidInputError`` for a queue not defined, or a priority its queue does not keep."""
        with self._tables.session(f"place task {task_id!r} in queue {queue_name!r}"):
            queue = self._named_queues().get(queue_name)
            if queue is None:
                raise InvalidInputError(
                    f"no queue named {queue_name!r} is defined in {self!r}: pass the longrun.Queue itself to fn.enqueue(queue=...) "
                    "or to a worker (a module-level Queue in a worker's --import module), which defines it"
                )
            if not queue.priority and priority != 0:
                raise InvalidInputError(f"queue {queue_name!r} keeps no priorities (priority=False); give priority 0")
            self._tables.run(
                "INSERT INTO longrun_queue (task_id, function, priority, wake_at, status, updated_at, queue_name, not_before) "
                "VALUES (?, ?, ?, NULL, 'new', {now}, ?, {now} + ?) ON CONFLICT (task_id) DO NOTHING",
                (task_id, function, priority, queue_name, max(0.0, float(not_before_s))),
            )

    def delay(self, task_id: str, function: str, not_before_s: float, *, priority: int = 0) -> None:
        """Make the row of a task about to be recorded (in no named queue), parked, and not due
        before ``not_before_s`` from now (``fn.enqueue(delay_s=...)``)."""
        with self._tables.session(f"delay task {task_id!r}"):
            self._tables.run(
                "INSERT INTO longrun_queue (task_id, function, priority, wake_at, status, updated_at, not_before) "
                "VALUES (?, ?, ?, NULL, 'new', {now}, {now} + ?) ON CONFLICT (task_id) DO NOTHING",
                (task_id, function, priority, max(0.0, float(not_before_s))),
            )

    def make_due(self, task_id: str) -> None:
        """Make a row placed parked before its task was recorded (``place``, ``delay``) due now, unless
        something made it due or claimed it since (its ``not_before`` still holds it back)."""
        with self._tables.session(f"make task {task_id!r} due"):
            cursor = self._tables.run(
                "UPDATE longrun_queue SET wake_at = {now}, updated_at = {now} WHERE task_id = ? AND wake_at IS NULL "
                "AND claim_token IS NULL AND status = 'new'",
                (task_id,),
            )
            if cursor.rowcount == 1:
                self._tables.notify()

    def reserve_dedup(self, queue_name: str, dedup_id: str, task_id: str, ended: Callable[[str], bool]) -> None:
        """Hold ``dedup_id`` in ``queue_name`` for ``task_id``; ``DuplicateTaskError`` naming the
        holder if another task holds it and has not ended (``ended(holder)``)."""
        with self._tables.session(f"reserve dedup id {dedup_id!r}"):
            row = self._tables.one("SELECT task_id FROM longrun_dedup WHERE queue_name = ? AND dedup_id = ?", (queue_name, dedup_id))
            if row is not None and str(row[0]) != task_id:
                holder = str(row[0])
                if not ended(holder):
                    raise DuplicateTaskError(
                        f"dedup_id {dedup_id!r} of queue {queue_name!r} is held by task {holder!r}, which has not ended; nothing was enqueued",
                        holder=holder,
                    )
                self._tables.run("DELETE FROM longrun_dedup WHERE queue_name = ? AND dedup_id = ?", (queue_name, dedup_id))
                row = None
            if row is None:
                self._tables.run("INSERT INTO longrun_dedup (queue_name, dedup_id, task_id) VALUES (?, ?, ?)", (queue_name, dedup_id, task_id))

    def release_dedup(self, queue_name: str, dedup_id: str, task_id: str) -> None:
        """Let ``dedup_id`` go if ``task_id`` holds it (an enqueue that failed after reserving it)."""
        with self._tables.session(f"release dedup id {dedup_id!r}"):
            self._tables.run("DELETE FROM longrun_dedup WHERE queue_name = ? AND dedup_id = ? AND task_id = ?", (queue_name, dedup_id, task_id))

    def queue_stats(self) -> list[dict[str, JSONValue]]:
        """Each queue (the unnamed default one as ``""``): depth (tasks due or waiting to be, not
        claimed), running (claimed), the oldest wait in seconds, and its limits."""
        with self._tables.session("read the queues", write=False):
            defined = self._named_queues()
            rows = self._tables.rows(
                "SELECT COALESCE(queue_name, ''), "
                "SUM(CASE WHEN claim_token IS NULL AND wake_at IS NOT NULL THEN 1 ELSE 0 END), "
                "SUM(CASE WHEN claim_token IS NOT NULL AND wake_at > {now} THEN 1 ELSE 0 END), "
                "MAX(CASE WHEN claim_token IS NULL AND wake_at IS NOT NULL AND wake_at <= {now} "
                "AND (not_before IS NULL OR not_before <= {now}) THEN {now} - wake_at END) "
                "FROM longrun_queue GROUP BY COALESCE(queue_name, '')"
            )
        found = {str(r[0]): (int(r[1] or 0), int(r[2] or 0), float(r[3]) if r[3] is not None else None) for r in rows}
        stats: list[dict[str, JSONValue]] = []
        for name in sorted(set(found) | set(defined)):
            depth, running, oldest = found.get(name, (0, 0, None))
            queue = defined.get(name)
            limits: dict[str, JSONValue] = {} if queue is None else {
                "concurrency": queue.concurrency, "per_worker": queue.per_worker,
                "rate": list(queue.rate) if queue.rate is not None else None, "priority": queue.priority,
            }  # fmt: skip
            stats.append({"queue": name, "depth": depth, "running": running, "oldest_wait_s": oldest, "limits": limits})
        return stats

    def extend(self, claims: Sequence[Claim], ttl_s: float) -> list[Claim]:
        """Renew claims for another ``ttl_s``; return those no longer held (lapsed and claimed by another)."""
        lost: list[Claim] = []
        if not claims:
            return lost
        with self._tables.session("renew claims"):
            for claim in claims:
                cursor = self._tables.run(
                    "UPDATE longrun_queue SET wake_at = {now} + ? WHERE task_id = ? AND claim_token = ?",
                    (ttl_s, claim.task_id, claim.token),
                )
                if cursor.rowcount != 1:
                    lost.append(claim)
        return lost

    def finish(
        self,
        claim: Claim,
        status: str,
        *,
        wake_in_s: float | None = None,
        wake_at: float | None = None,
        error: str | None = None,
        fingerprint: str | None = None,
        wake_parent: bool = False,
    ) -> bool:
        """End a claim: record the run's ``status`` and when the task is due next.

        ``wake_in_s`` is relative to the database's clock (a worker's clock may be skewed);
        ``wake_at`` is an absolute time on the store's lease clock (a lease's expiry); neither: parked
        until a trigger, a rescan or a child wakes it. If the row was woken while the run was under
        way (``nudge`` moved), it is due now whatever the run said. ``wake_parent`` wakes the
        task's parent if it waits on a child. False if the claim had lapsed (the row is left alone)."""
        if wake_in_s is not None:
            due, due_params = "{now} + ?", [max(0.0, float(wake_in_s))]
        elif wake_at is not None:
            due, due_params = "CASE WHEN ? > {now} THEN ? ELSE {now} END", [float(wake_at), float(wake_at)]
        else:
            due, due_params = "NULL", []
        statement = (
            f"UPDATE longrun_queue SET claimed_by = NULL, claim_token = NULL, status = ?, "
            f"wake_at = CASE WHEN nudge <> ? THEN {{now}} ELSE {due} END, "
            f"failures = {'0' if error is None else 'failures + 1'}, last_error = ?, fingerprint = ?, updated_at = {{now}} "
            "WHERE task_id = ? AND claim_token = ?"
        )
        params = (status, claim.nudge, *due_params, error, fingerprint, claim.task_id, claim.token)
        woken = wake_in_s is not None and wake_in_s <= 0
        parent = claim.parent if wake_parent else None
        what = f"finish task {claim.task_id!r}"
        if not woken and parent is None:  # one statement: one round trip where the driver allows
            return self._tables.single(what, statement, params) == 1
        with self._tables.session(what):
            held = bool(self._tables.run(statement, params).rowcount == 1)
            if parent is not None:
                self._wake_parent(parent)
            self._tables.notify()
        return held

    def _wake_parent(self, parent: str) -> None:
        # A parent being run now sees the nudge when it finishes; one parked waiting on a child wakes.
        self._tables.run(
            f"UPDATE longrun_queue SET nudge = nudge + 1, wake_at = CASE WHEN claim_token IS NULL AND status = '{_WAITING_ON_CHILD}' "
            "THEN {now} ELSE wake_at END, updated_at = {now} WHERE task_id = ?",
            (parent,),
        )

    def wake(self, task_id: str) -> bool:
        """Make a task due now (or, while it is being run, as soon as that run ends). False if it has no row."""
        with self._tables.session(f"wake task {task_id!r}"):
            cursor = self._tables.run(
                "UPDATE longrun_queue SET nudge = nudge + 1, wake_at = CASE WHEN claim_token IS NULL THEN {now} ELSE wake_at END, "
                "updated_at = {now} WHERE task_id = ?",
                (task_id,),
            )
            self._tables.notify()
        return bool(cursor.rowcount == 1)

    def next_due_in(self, functions: Iterable[str]) -> float | None:
        """Seconds until the earliest row of ``functions`` is due (<= 0: now), None if none is scheduled."""
        names = sorted(set(functions))
        if not names:
            return None
        marks = ", ".join("?" for _ in names)
        with self._tables.session("read the next due time", write=False):
            row = self._tables.one(
                "SELECT MIN(CASE WHEN not_before > wake_at THEN not_before ELSE wake_at END) - {now} FROM longrun_queue "
                f"WHERE wake_at IS NOT NULL AND function IN ({marks})",
                names,
            )
        return None if row is None or row[0] is None else float(row[0])

    def entries(self, task_ids: Sequence[str] | None = None) -> list[QueueEntry]:
        """Rows of the index (all, or those of ``task_ids``), ordered by task id."""
        with self._tables.session("read the queue", write=False):
            query = (
                "SELECT task_id, function, parent, priority, CASE WHEN not_before > wake_at THEN not_before ELSE wake_at END - {now}, "
                "status, claimed_by, runs, failures, last_error "
                "FROM longrun_queue"
            )
            if task_ids is None:
                rows = self._tables.rows(query + " ORDER BY task_id")
            else:
                rows = []
                for task_id in task_ids:
                    rows += self._tables.rows(query + " WHERE task_id = ?", (task_id,))
        return [
            QueueEntry(
                str(r[0]), str(r[1]), None if r[2] is None else str(r[2]), int(r[3]), None if r[4] is None else float(r[4]),
                str(r[5]), None if r[6] is None else str(r[6]), int(r[7]), int(r[8]), None if r[9] is None else str(r[9]),
            )  # fmt: skip
            for r in rows
        ]

    def due_count(self, *, at_most: int | None = None) -> int:
        """How many rows are due now and not claimed (what ``entries`` would show so), counted in
        the database rather than read row by row. With ``at_most``, the count stops past it
        (``at_most + 1`` means more than ``at_most``): O(at_most), not O(due rows)."""
        due = (
            "SELECT 1 FROM longrun_queue WHERE claimed_by IS NULL AND wake_at IS NOT NULL "
            "AND CASE WHEN not_before > wake_at THEN not_before ELSE wake_at END <= {now}"
        )
        with self._tables.session("count the due rows", write=False):
            if at_most is None:
                row = self._tables.one(f"SELECT COUNT(*) FROM ({due}) AS due")
            else:
                row = self._tables.one(f"SELECT COUNT(*) FROM ({due} LIMIT ?) AS due", (max(0, at_most) + 1,))
        return int(row[0])

    def change_count(self) -> int | None:
        """A number that changes whenever another connection commits to the tables' database (SQLite's
        ``PRAGMA data_version``: one read of the file's header, no table read), for a watcher that
        polls; None where notifications do that job (PostgreSQL)."""
        if self._tables.dialect.notify:
            return None
        with self._tables.session("read the change counter", write=False):
            row = self._tables.one("PRAGMA data_version")
        return int(row[0])

    def watched(self, functions: Iterable[str]) -> list[tuple[str, bool]]:
        """(task id, parked) for every row of ``functions`` whose last outcome was not terminal:
        the tasks a control record may wake. Parked: no due time (it waits for something)."""
        names = sorted(set(functions))
        if not names:
            return []
        marks = ", ".join("?" for _ in names)
        ended = ", ".join("?" for _ in _TERMINAL_VALUES)
        with self._tables.session("list the watched tasks", write=False):
            rows = self._tables.rows(
                f"SELECT task_id, wake_at IS NULL FROM longrun_queue WHERE function IN ({marks}) AND status NOT IN ({ended})",
                (*names, *_TERMINAL_VALUES),
            )
        return [(str(row[0]), bool(row[1])) for row in rows]
    def position(self, task_id: str) -> int | None:
        """Where a task waiting to be claimed stands in the queue: 1 is claimed next (by a worker
        that runs its function), counting the rows due before it (higher priority first, then longer
        due). None if it has no row, is claimed now, or is parked until something wakes it."""
        with self._tables.session(f"read the queue position of task {task_id!r}", write=False):
            mine = self._tables.one(
                "SELECT priority, wake_at FROM longrun_queue WHERE task_id = ? AND claim_token IS NULL AND wake_at IS NOT NULL",
                (task_id,),
            )
            if mine is None:
                return None
            ahead = self._tables.one(
                "SELECT COUNT(*) FROM longrun_queue WHERE claim_token IS NULL AND wake_at IS NOT NULL "
                "AND (priority > ? OR (priority = ? AND wake_at < ?))",
                (mine[0], mine[0], mine[1]),
            )
        return int(ahead[0]) + 1

    # -- polling for a store without triggers (the JSON-file store) -----------------------------

    def fingerprint(self, task_id: str) -> str | None:
        """What a trigger would watch, read through the store: the lease's epoch and whether it was
        released, and the digests of the task's control records. None for a store with triggers."""
        if self._tables.dialect.in_store:
            return None
        lease = self.store.read_lease(task_id)
        cancellation = self.store.read_cancellation(task_id)
        parts: list[JSONValue] = [
            [lease.epoch, lease.released] if lease is not None else None,
            cancellation.digest if cancellation is not None else None,
            [str(digest) for digest in sorted(record.digest or record.name for record in self.store.read_approvals(task_id))],
        ]
        messages = len(self.store.read_messages(task_id))
        if messages:  # only then: the fingerprint of a task without messages is what it was before they existed
            parts.append(messages)
        return "sha256:" + sha256_hex(canonical_bytes(parts))

    def rescan(self, every_s: float) -> int | None:
        """For a store without triggers: adopt tasks that have no row, and make a parked row due
        when its fingerprint changed. Done by one worker at a time, at most once per ``every_s``
        (None if it was not this caller's turn); returns how many rows it woke or added."""
        if self._tables.dialect.in_store:
            return None
        with self._tables.session("take the rescan turn"):
            row = self._tables.one("SELECT value - {now} FROM longrun_fleet_meta WHERE name = 'rescan_at'")
            if row is not None and float(row[0]) > 0:
                return None
            self._tables.run(
                "INSERT INTO longrun_fleet_meta (name, value) VALUES ('rescan_at', {now} + ?) "
                "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                (every_s,),
            )
            known = {str(r[0]): (r[1], r[2], r[3]) for r in self._tables.rows("SELECT task_id, wake_at - {now}, claim_token, fingerprint FROM longrun_queue")}
        changed = 0
        for task_id in self.store.list_tasks():
            try:
                entry = known.get(task_id)
                if entry is None:
                    changed += self._adopt_from_store(task_id)
                    continue
                due_in, token, fingerprint = entry
                if token is not None or (due_in is not None and float(due_in) <= 0):
                    continue  # being run, or due anyway
                if self.fingerprint(task_id) != fingerprint:
                    with self._tables.session(f"wake task {task_id!r}"):
                        self._tables.run(
                            "UPDATE longrun_queue SET nudge = nudge + 1, wake_at = {now}, updated_at = {now} "
                            "WHERE task_id = ? AND claim_token IS NULL",
                            (task_id,),
                        )
                    changed += 1
            except UnknownTaskError:
                continue  # gone since the listing
            except (CorruptStateError, StorageError) as exc:
                log.warning("fleet rescan: task %s could not be read: %s", task_id, exc)
        return changed

    def _adopt_from_store(self, task_id: str) -> int:
        from ..errors import StateUnrecoverableError

        try:
            state = self.store.load(task_id).state
        except StateUnrecoverableError:
            return 0  # a person must look at it first; a run would only stop again
        record = state.effects.get(FUNCTION_STEP) if state is not None else None
        if state is None or record is None or not isinstance(record.payload, dict):
            return 0
        function, parent = record.payload.get("function"), record.payload.get("parent")
        if not isinstance(function, str):
            return 0
        fingerprint = self.fingerprint(task_id)
        with self._tables.session(f"adopt task {task_id!r}"):
            return self._tables.adopt(task_id, function, parent if isinstance(parent, str) else None, state.status.value, fingerprint)

    # -- workers ------------------------------------------------------------------------------

    def heartbeat(
        self, name: str, *, host: str, pid: int, state: str, concurrency: int, running: int, functions: Sequence[str], heartbeat_s: float
    ) -> None:
        """Record that worker ``name`` is alive (by the database's clock), with what it runs."""
        names: list[JSONValue] = [str(name) for name in sorted(functions)]
        listed = canonical_bytes(names).decode("utf-8")
        with self._tables.session("record a worker's heartbeat"):
            self._tables.run(
                "INSERT INTO longrun_workers (name, host, pid, started_at, heartbeat_at, heartbeat_s, state, concurrency, running, functions) "
                "VALUES (?, ?, ?, {now}, {now}, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET host = excluded.host, "
                "pid = excluded.pid, heartbeat_at = excluded.heartbeat_at, heartbeat_s = excluded.heartbeat_s, "
                "state = excluded.state, concurrency = excluded.concurrency, running = excluded.running, functions = excluded.functions, "
                "started_at = CASE WHEN longrun_workers.pid = excluded.pid AND longrun_workers.host = excluded.host "
                "THEN longrun_workers.started_at ELSE excluded.started_at END",
                (name, host, pid, heartbeat_s, state, concurrency, running, listed),
            )

    def live_workers(self, function: str) -> list[WorkerRecord]:
        """The workers alive now that run ``function``; none where the fleet's tables were never made
        (made by nothing here: a read-only look)."""
        if not self._tables.exists():
            return []
        return [record for record in self.workers() if record.alive and function in record.functions]

    def workers(self) -> list[WorkerRecord]:
        """Every worker that has recorded a heartbeat, alive or not, ordered by name."""
        with self._tables.session("list workers", write=False):
            rows = self._tables.rows(
                "SELECT name, host, pid, state, concurrency, running, {now} - heartbeat_at, heartbeat_s, functions, started_at "
                "FROM longrun_workers ORDER BY name"
            )
            claims = dict(
                (str(r[0]), int(r[1]))
                for r in self._tables.rows(
                    "SELECT claimed_by, COUNT(*) FROM longrun_queue WHERE claim_token IS NOT NULL AND wake_at > {now} GROUP BY claimed_by"
                )
            )
        records = []
        for name, host, pid, state, concurrency, running, age, interval, functions, started_at in rows:
            try:
                listed = parse_json(str(functions).encode("utf-8"), what="a worker's functions", max_bytes=MAX_ROW_BYTES)
            except CorruptStateError:
                listed = []
            names = tuple(str(item) for item in listed) if isinstance(listed, list) else ()
            alive = state != "stopped" and float(age) < 3 * float(interval)
            records.append(
                WorkerRecord(
                    str(name), str(host), int(pid), str(state), int(concurrency), int(running), claims.get(str(name), 0),
                    float(age), alive, names, float(started_at),
                )  # fmt: skip
            )
        return records

    def forget_workers(self, older_than_s: float) -> int:
        """Delete the rows of workers silent for longer than ``older_than_s``."""
        with self._tables.session("forget old workers"):
            cursor = self._tables.run("DELETE FROM longrun_workers WHERE {now} - heartbeat_at > ?", (older_than_s,))
        return int(cursor.rowcount)

    # -- action slots ---------------------------------------------------------------------------

    def acquire_slot(self, action: str, limit: int, holder: str, ttl_s: float) -> SlotHold | None:
        """One of ``action``'s slots 0..limit-1 that is free or whose holder let it expire, or None."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidInputError(f"a slot limit is an integer >= 1, got {limit!r}")
        token = secrets.token_hex(12)
        with self._tables.session(f"take a slot of {action!r}"):
            if self._slot_rows.get(action, 0) < limit:
                for slot in range(limit):
                    self._tables.run("INSERT INTO longrun_slots (action, slot) VALUES (?, ?) ON CONFLICT (action, slot) DO NOTHING", (action, slot))
                self._slot_rows[action] = limit
            free = "(token IS NULL OR expires_at <= {now})"
            if self._tables.dialect.skip_locked:
                row = self._tables.one(
                    f"SELECT slot FROM longrun_slots WHERE action = ? AND slot < ? AND {free} ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED",
                    (action, limit),
                )
            else:
                row = self._tables.one(f"SELECT slot FROM longrun_slots WHERE action = ? AND slot < ? AND {free} ORDER BY slot LIMIT 1", (action, limit))
            if row is None:
                return None
            self._tables.run(
                "UPDATE longrun_slots SET holder = ?, token = ?, expires_at = {now} + ? WHERE action = ? AND slot = ?",
                (holder, token, ttl_s, action, int(row[0])),
            )
        return SlotHold(action, int(row[0]), token)

    def renew_slot(self, hold: SlotHold, ttl_s: float) -> bool:
        with self._tables.session(f"renew a slot of {hold.action!r}"):
            cursor = self._tables.run(
                "UPDATE longrun_slots SET expires_at = {now} + ? WHERE action = ? AND slot = ? AND token = ?",
                (ttl_s, hold.action, hold.slot, hold.token),
            )
        return bool(cursor.rowcount == 1)

    def release_slot(self, hold: SlotHold) -> None:
        with self._tables.session(f"release a slot of {hold.action!r}"):
            self._tables.run(
                "UPDATE longrun_slots SET holder = NULL, token = NULL, expires_at = NULL WHERE action = ? AND slot = ? AND token = ?",
                (hold.action, hold.slot, hold.token),
            )

    def slots_held(self, action: str) -> int:
        """How many of ``action``'s slots are held and unexpired now."""
        with self._tables.session(f"count the slots of {action!r}", write=False):
            row = self._tables.one("SELECT COUNT(*) FROM longrun_slots WHERE action = ? AND token IS NOT NULL AND expires_at > {now}", (action,))
        return int(row[0])

    # -- schedules (``longrun.schedules``) ------------------------------------------------------

    def clock(self) -> float:
        """The database's clock, in seconds since the epoch: what a schedule's slots are due by."""
        with self._tables.session("read the database's clock", write=False):
            return float(self._tables.one("SELECT {now}")[0])

    def add_schedule(self, schedule: Schedule, *, replace: bool = False, since: float | None = None) -> ScheduleState:
        """Store ``schedule``, its first slot the first after now (the database's clock), or the
        first at or after ``since`` (a past time: the slots since then are missed ones, which its
        catch-up starts or skips).

        A schedule of that name already stored is kept as it is when its definition is the same (a
        worker, or a decorator imported again, adds it again); replaced when ``replace`` (its next
        slot recomputed from now if its cron or time zone changed); else ``ScheduleError``. Either
        way a stored schedule stays paused or not as it was."""
        if not isinstance(schedule, Schedule):
            raise InvalidInputError(f"add_schedule needs a Schedule, got {type(schedule).__name__}")
        record = canonical_bytes(schedule.to_json()).decode("utf-8")
        with self._tables.session(f"add schedule {schedule.name!r}"):
            now = float(self._tables.one("SELECT {now}")[0])
            existing = self._schedule_row(schedule.name)
            if existing is None:
                next_slot = schedule.next_after(now if since is None else since - 1.0)
                self._tables.run(
                    "INSERT INTO longrun_schedules (name, record, next_slot, updated_at) VALUES (?, ?, ?, {now})",
                    (schedule.name, record, next_slot),
                )
                return ScheduleState(schedule, next_slot, None, None)
            schedule = dataclasses.replace(schedule, paused=existing.schedule.paused)  # a pause is the operator's to undo
            if existing.schedule == schedule:
                return existing
            if not replace:
                raise ScheduleError(
                    f"schedule {schedule.name!r} exists with another definition ({existing.schedule.cron!r} in "
                    f"{existing.schedule.timezone}, {existing.schedule.function}); nothing was changed"
                )
            moved = (existing.schedule.cron, existing.schedule.timezone) != (schedule.cron, schedule.timezone)
            next_slot = schedule.next_after(now if since is None else since - 1.0) if moved or since is not None else existing.next_slot
            self._tables.run(
                "UPDATE longrun_schedules SET record = ?, next_slot = ?, updated_at = {now} WHERE name = ?",
                (record, next_slot, schedule.name),
            )
            return ScheduleState(schedule, next_slot, existing.last_slot, existing.last_task)

    def _schedule_row(self, name: str) -> ScheduleState | None:
        row = self._tables.one("SELECT record, next_slot, last_slot, last_task FROM longrun_schedules WHERE name = ?", (name,))
        return None if row is None else self._schedule_state(row)

    @staticmethod
    def _schedule_state(row: Sequence[Any]) -> ScheduleState:
        record, next_slot, last_slot, last_task = row
        text = record if isinstance(record, str) else bytes(record).decode("utf-8", "replace")
        schedule = Schedule.from_json(parse_json(text.encode("utf-8"), what="a stored schedule", max_bytes=MAX_ROW_BYTES))
        return ScheduleState(
            schedule, float(next_slot), float(last_slot) if last_slot is not None else None, str(last_task) if last_task is not None else None
        )

    def schedules(self) -> list[ScheduleState]:
        """Every stored schedule, by name. ``CorruptStateError`` for a damaged row."""
        with self._tables.session("read the schedules", write=False):
            rows = self._tables.rows("SELECT record, next_slot, last_slot, last_task FROM longrun_schedules ORDER BY name")
        return [self._schedule_state(row) for row in rows]

    def schedule(self, name: str) -> ScheduleState:
        """The stored schedule ``name``; ``ScheduleError`` if there is none."""
        with self._tables.session(f"read schedule {name!r}", write=False):
            found = self._schedule_row(name)
        if found is None:
            raise ScheduleError(f"no schedule named {name!r} in {self!r}")
        return found

    def pause_schedule(self, name: str, paused: bool) -> ScheduleState:
        """Pause or resume schedule ``name``. A resumed schedule starts at the first slot after now:
        the slots that passed while it was paused are not started (``backfill`` starts them)."""
        with self._tables.session(f"{'pause' if paused else 'resume'} schedule {name!r}"):
            found = self._schedule_row(name)
            if found is None:
                raise ScheduleError(f"no schedule named {name!r} in {self!r}; nothing was changed")
            if found.schedule.paused == paused:
                return found
            schedule = dataclasses.replace(found.schedule, paused=paused)
            next_slot = found.next_slot if paused else schedule.next_after(float(self._tables.one("SELECT {now}")[0]))
            self._tables.run(
                "UPDATE longrun_schedules SET record = ?, next_slot = ?, updated_at = {now} WHERE name = ?",
                (canonical_bytes(schedule.to_json()).decode("utf-8"), next_slot, name),
            )
        return ScheduleState(schedule, next_slot, found.last_slot, found.last_task)

    def remove_schedule(self, name: str) -> None:
        """Delete schedule ``name`` (tasks it started stay); ``ScheduleError`` if there is none."""
        with self._tables.session(f"remove schedule {name!r}"):
            cursor = self._tables.run("DELETE FROM longrun_schedules WHERE name = ?", (name,))
            if cursor.rowcount != 1:
                raise ScheduleError(f"no schedule named {name!r} in {self!r}; nothing was changed")

    def advance_schedule(self, name: str, expected: float, next_slot: float, last_slot: float, last_task: str) -> bool:
        """Move schedule ``name`` from slot ``expected`` to ``next_slot``, recording the last slot
        started, only if it still stands at ``expected`` (another worker may have moved it first)."""
        with self._tables.session(f"advance schedule {name!r}"):
            cursor = self._tables.run(
                "UPDATE longrun_schedules SET next_slot = ?, last_slot = ?, last_task = ?, updated_at = {now} "
                "WHERE name = ? AND next_slot = ?",
                (next_slot, last_slot, last_task, name, expected),
            )
            return bool(cursor.rowcount == 1)

    # -- LISTEN / NOTIFY ----------------------------------------------------------------------

    def listen(self, woken: Callable[[], None], stop: threading.Event, *, timeout_s: float = 1.0) -> None:
        """Call ``woken()`` whenever a row becomes due at once (PostgreSQL ``NOTIFY``), until ``stop``
        is set. Blocks: run it in a thread of its own. Returns at once where there is no
        ``NOTIFY`` (SQLite): polling is then the only wake-up. A lost connection is made again."""
        if not self._tables.dialect.notify or not isinstance(self._tables.dialect, PostgresDialect):
            return
        while not stop.is_set():
            connection = None
            try:
                connection = self._tables.dialect.listen_connection()
                cursor = connection.cursor()
                cursor.execute(f"LISTEN {NOTIFY_CHANNEL}")
                woken()  # anything sent before LISTEN took effect was missed: look once
                if callable(getattr(connection, "notifies", None)):  # psycopg 3
                    while not stop.is_set():
                        for _ in connection.notifies(timeout=timeout_s, stop_after=1):
                            woken()
                else:  # pg8000 and others: notifications arrive with a statement's reply
                    pending = getattr(connection, "notifications", None)
                    while not stop.is_set():
                        cursor.execute("SELECT 1")
                        cursor.fetchall()
                        if pending:
                            pending.clear()
                            woken()
                        stop.wait(min(timeout_s, 0.1))
            except Exception as exc:  # a dropped connection, a restart: listen again after a pause
                if not stop.is_set():
                    log.warning("%r: LISTEN failed (%s); listening again in 1 s, polling meanwhile", self, exc)
                    stop.wait(1.0)
            finally:
                if connection is not None:
                    with contextlib.suppress(Exception):
                        connection.close()


def open_queue(store: Store) -> TaskQueue:
    """The fleet's tables for ``store``: in its database (PostgreSQL, SQLite) or beside its task
    directories (JSON-file store). The tables are made on first use. Raises ``InvalidInputError``
    for a store the fleet does not know."""
    from .jsonfile import JsonFileStore
    from .postgres import PostgresStore
    from .sqlite import SqliteStore

    if isinstance(store, PostgresStore):
        return TaskQueue(PostgresDialect(store), store)
    if isinstance(store, SqliteStore):
        return TaskQueue(SqliteDialect(store.path, busy_timeout_s=store.busy_timeout_s, in_store=True, label=repr(store)), store)
    if isinstance(store, JsonFileStore):
        root = store.root
        if not os.path.isdir(root):
            if not getattr(store, "create", False):
                raise InvalidInputError(f"store root {root} does not exist; create it, or open the store with create=True")
            ensure_dirs(FileIO(), root)
        return TaskQueue(SqliteDialect(os.path.join(root, SIDE_FILE), busy_timeout_s=30.0, in_store=False, label=repr(store)), store)
    raise InvalidInputError(f"{store!r}: a worker fleet needs a JsonFileStore, SqliteStore or PostgresStore")
