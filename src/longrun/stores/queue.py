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
  an approval, an answer or a cancellation makes the row due at once. A row that becomes due at
  once sends ``NOTIFY longrun_fleet``, which wakes idle workers (polling is the fallback).
- ``SqliteStore``: in the store's file, with the same triggers; claims take SQLite's write lock.
- ``JsonFileStore``: in ``ROOT/.fleet.sqlite`` beside the task directories (not a task id, so
  ``list_tasks`` never shows it). No trigger can see a file, so ``rescan`` does their work by
  polling: it adopts tasks that have no row, and makes a parked row due when the task's lease
  epoch or release, or its control records' digests, changed since the row was written.

Tables (version ``SCHEMA_VERSION`` in ``longrun_fleet_schema``, apart from the store's own)::

    longrun_queue   task_id, function, parent, priority, wake_at (due when <= the clock; NULL: parked
                    until something wakes it), status (the last outcome a worker saw), claimed_by,
                    claim_token, nudge (bumped by every wake-up, so a run that was under way when it
                    came does not park the task over it), runs, failures, last_error, fingerprint
    longrun_workers name, host, pid, started_at, heartbeat_at, heartbeat_s, state, concurrency,
                    running, functions
    longrun_slots   action, slot, holder, token, expires_at: K rows per limited action

A claim sets ``wake_at`` to the claim's expiry and is extended while the worker runs the task: a
worker that dies leaves a row that is due again when its claim expires, with no step in between
that could lose the task.

Not guaranteed: that a row is current when a task is run outside the fleet on the JSON-file store
between two rescans (it is found by the next rescan), or on a database whose tables were created
without these triggers (a worker creates them, and adopts every task already stored, on first use).
"""

from __future__ import annotations

import logging
import os
import secrets
from typing import Iterable, Sequence

from ..canonical import JSONValue, canonical_bytes, sha256_hex
from ..contract import check_task_id
from ..errors import CorruptStateError, InvalidInputError, StorageError, UnknownTaskError
from ..protocols import Store
from ._fileio import FileIO, ensure_dirs
from ._fleet_sql import FUNCTION_STEP, PostgresDialect, SqliteDialect
from ._queue_records import Claim, QueueEntry, SlotHold, WorkerRecord
from ._queue_tables import SCHEMA_VERSION
from ._queue_workers import WorkerTables

__all__ = ["SCHEMA_VERSION", "Claim", "QueueEntry", "SlotHold", "TaskQueue", "WorkerRecord", "open_queue"]

log = logging.getLogger("longrun")

SIDE_FILE = ".fleet.sqlite"
"""The JSON-file store's fleet tables, in its root: a dot name is never a task id."""
_WAITING_ON_CHILD = "waiting-on-child"


class TaskQueue(WorkerTables):
    """The fleet's tables for one store (see the module docstring). ``open_queue(store)`` makes one.

    Thread-safe: one connection, used by one thread at a time for one whole transaction. A broken
    connection is dropped and a new one made on the next call; driver errors are ``StorageError``.
    """

    # -- the index ----------------------------------------------------------------------------

    def ensure(self) -> None:
        """Create the tables (and triggers) if they are missing; a no-op once they exist."""
        with self._session("check the fleet tables", write=False):
            pass

    def enqueue(self, task_id: str, function: str, *, priority: int = 0, parent: str | None = None) -> bool:
        """Make the task's row (due now) unless it has one; set its priority either way. True if new."""
        check_task_id(task_id)
        if not isinstance(function, str) or not function:
            raise InvalidInputError("a queued task needs its function's name (module:qualname)")
        if isinstance(priority, bool) or not isinstance(priority, int) or not -(2**31) <= priority < 2**31:
            raise InvalidInputError(f"priority must be an integer in [-2**31, 2**31), got {priority!r}")
        with self._session(f"enqueue task {task_id!r}"):
            cursor = self._run(
                "INSERT INTO longrun_queue (task_id, function, parent, priority, wake_at, status, updated_at) "
                "VALUES (?, ?, ?, ?, {now}, 'new', {now}) ON CONFLICT (task_id) DO NOTHING",
                (task_id, function, parent, priority),
            )
            created = bool(cursor.rowcount == 1)
            if not created:
                self._run("UPDATE longrun_queue SET priority = ? WHERE task_id = ?", (priority, task_id))
            self._notify()
        return created

    def claim(self, worker: str, functions: Iterable[str], limit: int, ttl_s: float) -> list[Claim]:
        """Claim up to ``limit`` due tasks of ``functions``, highest priority first, then longest due.

        A claim lasts ``ttl_s`` by the database's clock unless ``extend`` renews it; when it lapses
        the row is due again (its worker died or stopped)."""
        names = sorted(set(functions))
        if limit <= 0 or not names:
            return []
        token = secrets.token_hex(12)
        marks = ", ".join("?" for _ in names)
        columns = "task_id, function, nudge, parent, priority, failures"
        with self._session("claim due tasks"):
            if self._dialect.skip_locked:
                rows = self._all(
                    f"UPDATE longrun_queue AS q SET claimed_by = ?, claim_token = ?, wake_at = {{now}} + ?, runs = q.runs + 1, "
                    f"updated_at = {{now}} FROM (SELECT task_id FROM longrun_queue WHERE wake_at <= {{now}} AND function IN ({marks}) "
                    "ORDER BY priority DESC, wake_at LIMIT ? FOR UPDATE SKIP LOCKED) AS due WHERE q.task_id = due.task_id "
                    "RETURNING q.task_id, q.function, q.nudge, q.parent, q.priority, q.failures",
                    (worker, token, ttl_s, *names, limit),
                )
            else:
                rows = self._all(
                    f"SELECT {columns} FROM longrun_queue WHERE wake_at <= {{now}} AND function IN ({marks}) "
                    "ORDER BY priority DESC, wake_at LIMIT ?",
                    (*names, limit),
                )
                for row in rows:
                    self._run(
                        "UPDATE longrun_queue SET claimed_by = ?, claim_token = ?, wake_at = {now} + ?, runs = runs + 1, "
                        "updated_at = {now} WHERE task_id = ?",
                        (worker, token, ttl_s, row[0]),
                    )
        return [
            Claim(str(r[0]), str(r[1]), token, int(r[2]), str(r[3]) if r[3] is not None else None, int(r[4]), int(r[5]))
            for r in rows
        ]

    def extend(self, claims: Sequence[Claim], ttl_s: float) -> list[Claim]:
        """Renew claims for another ``ttl_s``; return those no longer held (lapsed and claimed by another)."""
        lost: list[Claim] = []
        if not claims:
            return lost
        with self._session("renew claims"):
            for claim in claims:
                cursor = self._run(
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
        with self._session(f"finish task {claim.task_id!r}"):
            cursor = self._run(
                f"UPDATE longrun_queue SET claimed_by = NULL, claim_token = NULL, status = ?, "
                f"wake_at = CASE WHEN nudge <> ? THEN {{now}} ELSE {due} END, "
                f"failures = {'0' if error is None else 'failures + 1'}, last_error = ?, fingerprint = ?, updated_at = {{now}} "
                "WHERE task_id = ? AND claim_token = ?",
                (status, claim.nudge, *due_params, error, fingerprint, claim.task_id, claim.token),
            )
            held = bool(cursor.rowcount == 1)
            woken = wake_in_s is not None and wake_in_s <= 0
            if wake_parent and claim.parent is not None:
                self._wake_parent(claim.parent)
                woken = True
            if woken:
                self._notify()
        return held

    def _wake_parent(self, parent: str) -> None:
        # A parent being run now sees the nudge when it finishes; one parked waiting on a child wakes.
        self._run(
            f"UPDATE longrun_queue SET nudge = nudge + 1, wake_at = CASE WHEN claim_token IS NULL AND status = '{_WAITING_ON_CHILD}' "
            "THEN {now} ELSE wake_at END, updated_at = {now} WHERE task_id = ?",
            (parent,),
        )

    def wake(self, task_id: str) -> bool:
        """Make a task due now (or, while it is being run, as soon as that run ends). False if it has no row."""
        with self._session(f"wake task {task_id!r}"):
            cursor = self._run(
                "UPDATE longrun_queue SET nudge = nudge + 1, wake_at = CASE WHEN claim_token IS NULL THEN {now} ELSE wake_at END, "
                "updated_at = {now} WHERE task_id = ?",
                (task_id,),
            )
            self._notify()
        return bool(cursor.rowcount == 1)

    def next_due_in(self, functions: Iterable[str]) -> float | None:
        """Seconds until the earliest row of ``functions`` is due (<= 0: now), None if none is scheduled."""
        names = sorted(set(functions))
        if not names:
            return None
        marks = ", ".join("?" for _ in names)
        with self._session("read the next due time", write=False):
            row = self._one(f"SELECT MIN(wake_at) - {{now}} FROM longrun_queue WHERE wake_at IS NOT NULL AND function IN ({marks})", names)
        return None if row is None or row[0] is None else float(row[0])

    def entries(self, task_ids: Sequence[str] | None = None) -> list[QueueEntry]:
        """Rows of the index (all, or those of ``task_ids``), ordered by task id."""
        with self._session("read the queue", write=False):
            query = (
                "SELECT task_id, function, parent, priority, wake_at - {now}, status, claimed_by, runs, failures, last_error "
                "FROM longrun_queue"
            )
            if task_ids is None:
                rows = self._all(query + " ORDER BY task_id")
            else:
                rows = []
                for task_id in task_ids:
                    rows += self._all(query + " WHERE task_id = ?", (task_id,))
        return [
            QueueEntry(
                str(r[0]), str(r[1]), None if r[2] is None else str(r[2]), int(r[3]), None if r[4] is None else float(r[4]),
                str(r[5]), None if r[6] is None else str(r[6]), int(r[7]), int(r[8]), None if r[9] is None else str(r[9]),
            )  # fmt: skip
            for r in rows
        ]

    # -- polling for a store without triggers (the JSON-file store) -----------------------------

    def fingerprint(self, task_id: str) -> str | None:
        """What a trigger would watch, read through the store: the lease's epoch and whether it was
        released, and the digests of the task's control records. None for a store with triggers."""
        if self._dialect.in_store:
            return None
        lease = self.store.read_lease(task_id)
        cancellation = self.store.read_cancellation(task_id)
        parts: list[JSONValue] = [
            [lease.epoch, lease.released] if lease is not None else None,
            cancellation.digest if cancellation is not None else None,
            [str(digest) for digest in sorted(record.digest or record.name for record in self.store.read_approvals(task_id))],
        ]
        return "sha256:" + sha256_hex(canonical_bytes(parts))

    def rescan(self, every_s: float) -> int | None:
        """For a store without triggers: adopt tasks that have no row, and make a parked row due
        when its fingerprint changed. Done by one worker at a time, at most once per ``every_s``
        (None if it was not this caller's turn); returns how many rows it woke or added."""
        if self._dialect.in_store:
            return None
        with self._session("take the rescan turn"):
            row = self._one("SELECT value - {now} FROM longrun_fleet_meta WHERE name = 'rescan_at'")
            if row is not None and float(row[0]) > 0:
                return None
            self._run(
                "INSERT INTO longrun_fleet_meta (name, value) VALUES ('rescan_at', {now} + ?) "
                "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                (every_s,),
            )
            known = {str(r[0]): (r[1], r[2], r[3]) for r in self._all("SELECT task_id, wake_at - {now}, claim_token, fingerprint FROM longrun_queue")}
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
                    with self._session(f"wake task {task_id!r}"):
                        self._run(
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
        with self._session(f"adopt task {task_id!r}"):
            return self._adopt(task_id, function, parent if isinstance(parent, str) else None, state.status.value, fingerprint)


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
