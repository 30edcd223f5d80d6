"""The PostgreSQL store: one database shared by runners on many machines.

``PostgresStore(connect)`` takes a DB-API 2.0 connection factory, such as
``lambda: psycopg.connect(dsn)`` (psycopg 3) or ``lambda: pg8000.dbapi.connect(...)``, so longrun
itself imports no driver. ``longrun.stores.open_store("postgresql://...")`` builds one from a URL.

Guarantees, on top of ``longrun.stores._sql`` (schema, row checksums, quarantine):

- Every write to a task runs in one transaction that first locks the task's row
  (``SELECT ... FOR UPDATE``); the fence check, the state, ledger and lease writes, and the
  database's own epoch-conditional ``UPDATE`` (whose row count is checked) commit together or not
  at all. A stale epoch raises ``FencedError`` and changes nothing.
- Lease expiry is judged and stamped by the database server's clock (``clock_timestamp()``, read
  inside that transaction), never by the runners': the ``now`` a runner passes to
  ``acquire_lease``, ``renew_lease`` and ``release_lease`` is ignored, so clock skew between
  machines cannot let two owners in. The runner's own clock then only stamps evidence and budgets.
  The ``Lease`` returned carries server times.
- Reads run ``REPEATABLE READ, READ ONLY``: one consistent snapshot, never blocking a writer.
- Sessions set ``idle_in_transaction_session_timeout`` and ``lock_timeout``
  (``transaction_timeout_s``), so a runner frozen inside a transaction (SIGSTOP, a VM pause) loses
  its session and its row lock instead of blocking the task forever; others waiting for the lock
  get ``StorageError`` after the same time instead of hanging.
- A commit is one round trip: one call of the schema's ``longrun_commit`` function (see
  ``stores._sql_schema``), sent in the driver's autocommit mode, so the call is its own
  transaction. The function takes the task's row lock and runs the epoch-conditional ``UPDATE``
  (the lease row must hold the writer's epoch and token; its row count is checked) before it writes
  a row; if that ``UPDATE`` matches nothing it writes nothing, and the store repeats the commit as
  statements in a transaction of its own, which raises ``FencedError`` as before (or writes, if the
  lease row holds after all). The first commit after a lease is taken without a load, whose
  revision the store has not read yet, also runs as statements.
- Fewer round trips elsewhere, the fence unchanged: a load without a lease is one statement in
  autocommit (the task's row, header, outline and effect rows, one snapshot; a state that needs
  another read, a large value or the quarantine, loads in a read transaction instead); a load with
  a lease reads the rows in one statement; every lease operation reads the server's clock and the
  lease row in one statement once the row lock is held, and writes the lease and the epoch floor
  in one (the epoch-conditional upsert's row count checked as before); psycopg says how a read
  transaction runs in its own ``BEGIN``.
- A broken connection is closed and a new one made on the next call; a commit whose outcome is
  unknown (the connection died during the call or during COMMIT) poisons the task until it is
  loaded again.

One concept, the PostgreSQL dialect of ``SqlStore``; long because the statements that fold several
round trips into one (the commit function, the state query, the lease write) are written out here
beside the code that checks what they return.

Not guaranteed: anything if the database itself loses committed transactions (run it with
``fsync=on`` and ``synchronous_commit=on``, the defaults), or exclusion against someone who
writes to the tables directly.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, Collection, Generator, Iterable, Sequence

from ..contract import check_task_id
from ..control import ControlRecord
from ..envelope import RunState
from ..errors import FencedError, InvalidInputError, NotAStoreError, StateUnrecoverableError, UnknownTaskError
from ..lease import Lease
from ..protocols import LoadResult
from ._sql import SqlStore, StateWrite
from ._sql_schema import postgres_status_counters

__all__ = ["PostgresStore", "begin_as", "driver_errors"]

_SCHEMA_LOCK = 0x6C6F6E6772756E  # "longrun": serializes schema creation across processes


# One commit, in one call (schema version 8). Written without a question mark or a percent sign:
# statements pass through the driver's parameter syntax. In a volatile function each statement
# reads the database as committed when it starts (READ COMMITTED), so the UPDATE, run once the
# task's row lock is held, sees the lease as the last holder of that lock left it.
_COMMIT_FUNCTION = """CREATE OR REPLACE FUNCTION longrun_commit(
    p_task TEXT, p_revision BIGINT, p_epoch BIGINT, p_token TEXT,
    p_plan_digest TEXT, p_status TEXT, p_next_action TEXT, p_effect_count BIGINT,
    p_header TEXT, p_checksum TEXT, p_updated_at DOUBLE PRECISION,
    p_steps TEXT[], p_positions BIGINT[], p_records TEXT[], p_record_checksums TEXT[],
    p_deleted TEXT[], p_prune BOOLEAN, p_blob_digests TEXT[], p_blobs BYTEA[],
    p_summary_status TEXT, p_summary_revision BIGINT, p_function TEXT, p_parent TEXT,
    p_created_at DOUBLE PRECISION, p_summary_updated_at DOUBLE PRECISION, p_wake_at DOUBLE PRECISION,
    p_error TEXT, p_summary_next_action TEXT,
    p_plan INTEGER, p_plan_body TEXT, p_plan_checksum TEXT
) RETURNS INTEGER LANGUAGE plpgsql VOLATILE AS $longrun_commit$
DECLARE
    fenced_rows BIGINT;
BEGIN
    PERFORM 1 FROM longrun_tasks WHERE task_id = p_task FOR UPDATE;
    UPDATE longrun_tasks SET revision_floor = p_revision
        WHERE task_id = p_task AND revision_floor < p_revision
        AND EXISTS (
            SELECT 1 FROM longrun_leases
            WHERE task_id = p_task AND epoch = p_epoch AND (token IS NULL OR token = p_token)
            AND abs(acquired_at) < 'Infinity' AND abs(expires_at) < 'Infinity'
            AND (monotonic_expires_at IS NULL OR abs(monotonic_expires_at) < 'Infinity'));
    GET DIAGNOSTICS fenced_rows = ROW_COUNT;
    IF fenced_rows <> 1 THEN
        RETURN 1;
    END IF;
    INSERT INTO longrun_states (task_id, revision, epoch, plan_digest, status, next_action, effect_count,
        header, checksum, updated_at)
    VALUES (p_task, p_revision, p_epoch, p_plan_digest, p_status, p_next_action, p_effect_count,
        p_header, p_checksum, p_updated_at)
    ON CONFLICT (task_id) DO UPDATE SET revision = excluded.revision, epoch = excluded.epoch,
        plan_digest = excluded.plan_digest, status = excluded.status, next_action = excluded.next_action,
        effect_count = excluded.effect_count, header = excluded.header, checksum = excluded.checksum,
        updated_at = excluded.updated_at;
    IF p_prune THEN
        DELETE FROM longrun_effects WHERE task_id = p_task AND step_id NOT IN (SELECT unnest(p_steps));
    ELSIF cardinality(p_deleted) > 0 THEN
        DELETE FROM longrun_effects WHERE task_id = p_task AND step_id = ANY (p_deleted);
    END IF;
    IF cardinality(p_blob_digests) > 0 THEN
        INSERT INTO longrun_blobs (task_id, digest, data)
        SELECT p_task, b.digest, b.data FROM unnest(p_blob_digests, p_blobs) AS b (digest, data)
        ON CONFLICT (task_id, digest) DO NOTHING;
    END IF;
    IF cardinality(p_steps) > 0 THEN
        INSERT INTO longrun_effects (task_id, step_id, position, revision, record, checksum)
        SELECT p_task, e.step_id, e.position, p_revision, e.record, e.checksum
        FROM unnest(p_steps, p_positions, p_records, p_record_checksums) AS e (step_id, position, record, checksum)
        ON CONFLICT (task_id, step_id) DO UPDATE SET position = excluded.position,
            revision = excluded.revision, record = excluded.record, checksum = excluded.checksum;
    END IF;
    INSERT INTO longrun_summaries (task_id, status, revision, function, parent, created_at, updated_at,
        wake_at, error, next_action)
    VALUES (p_task, p_summary_status, p_summary_revision, p_function, p_parent, p_created_at,
        p_summary_updated_at, p_wake_at, p_error, p_summary_next_action)
    ON CONFLICT (task_id) DO UPDATE SET status = excluded.status, revision = excluded.revision,
        function = excluded.function, parent = excluded.parent, created_at = excluded.created_at,
        updated_at = excluded.updated_at, wake_at = excluded.wake_at, error = excluded.error,
        next_action = excluded.next_action;
    IF p_plan = 1 THEN
        INSERT INTO longrun_plans (task_id, revision, body, checksum)
        VALUES (p_task, p_revision, p_plan_body, p_plan_checksum)
        ON CONFLICT (task_id) DO UPDATE SET revision = excluded.revision, body = excluded.body,
            checksum = excluded.checksum;
    ELSIF p_plan = 2 THEN
        DELETE FROM longrun_plans WHERE task_id = p_task;
    END IF;
    RETURN 0;
END
$longrun_commit$"""

_COMMIT_TYPES = (
    "TEXT", "BIGINT", "BIGINT", "TEXT",
    "TEXT", "TEXT", "TEXT", "BIGINT", "TEXT", "TEXT", "DOUBLE PRECISION",
    "TEXT[]", "BIGINT[]", "TEXT[]", "TEXT[]", "TEXT[]", "BOOLEAN", "TEXT[]", "BYTEA[]",
    "TEXT", "BIGINT", "TEXT", "TEXT", "DOUBLE PRECISION", "DOUBLE PRECISION", "DOUBLE PRECISION", "TEXT", "TEXT",
    "INTEGER", "TEXT", "TEXT",
)  # fmt: skip
_COMMIT_CALL = f"SELECT longrun_commit({', '.join(f'CAST(? AS {kind})' for kind in _COMMIT_TYPES)})"
_WRITTEN = 0
"""What ``longrun_commit`` returns when it wrote the commit (1: its fenced ``UPDATE`` matched no row; nothing written)."""


# A task's rows in one statement (one snapshot, one round trip): its task row's floor, its header,
# its outline, and its effect rows as five parallel arrays (NULL when it has none). The driving row
# is the id asked for, so a missing task row reads as the four separate queries read it.
_STATE_QUERY = (
    "SELECT t.revision_floor, s.revision, s.effect_count, s.header, s.checksum, p.revision, p.body, p.checksum, "
    "e.steps, e.positions, e.revisions, e.records, e.checksums "
    "FROM (SELECT CAST(? AS TEXT) AS task_id) k "
    "LEFT JOIN longrun_tasks t ON t.task_id = k.task_id "
    "LEFT JOIN longrun_states s ON s.task_id = k.task_id "
    "LEFT JOIN longrun_plans p ON p.task_id = k.task_id "
    "LEFT JOIN LATERAL (SELECT array_agg(step_id) AS steps, array_agg(position) AS positions, "
    "array_agg(revision) AS revisions, array_agg(record) AS records, array_agg(checksum) AS checksums "
    "FROM longrun_effects WHERE task_id = k.task_id) e ON TRUE"
)

# The lease write (``SqlStore._put_lease``) as one statement: the epoch-conditional upsert of the
# lease row, and the task's epoch floor raised only if that upsert wrote; the row count of the
# upsert is returned, checked as the two statements' was.
_LEASE_WRITE = (
    "WITH written AS (INSERT INTO longrun_leases (task_id, owner, epoch, acquired_at, expires_at, monotonic_clock, "
    "monotonic_expires_at, token, holder_lock) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (task_id) DO UPDATE SET owner = excluded.owner, epoch = excluded.epoch, "
    "acquired_at = excluded.acquired_at, expires_at = excluded.expires_at, "
    "monotonic_clock = excluded.monotonic_clock, monotonic_expires_at = excluded.monotonic_expires_at, "
    "token = excluded.token, holder_lock = excluded.holder_lock "
    "WHERE longrun_leases.epoch <= excluded.epoch RETURNING task_id, epoch), "
    "floor AS (UPDATE longrun_tasks SET epoch_floor = written.epoch FROM written "
    "WHERE longrun_tasks.task_id = written.task_id AND longrun_tasks.epoch_floor < written.epoch RETURNING 1) "
    "SELECT (SELECT COUNT(*) FROM written), (SELECT COUNT(*) FROM floor)"
)


def _text_array(values: Iterable[str]) -> str:
    """A PostgreSQL array literal of ``values``, each quoted (a backslash and a double quote escaped),
    cast to ``TEXT[]`` by the call. Built with string methods: a driver's adaptation of a list
    escapes each element in Python, which cost a commit more CPU than all the rest of its call."""
    return "{" + ",".join(['"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"' for value in values]) + "}"


class _AnotherRead(Exception):
    """A one-statement load whose rows need another read (``PostgresStore.load``): loaded again in a transaction."""


class _OneCall:
    """The commit being gathered for one call: the lease it is fenced by, the rows ``_put_state`` encoded."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.write: StateWrite | None = None


class PostgresStore(SqlStore):
    """A store in a PostgreSQL database reached through ``connect()``, a DB-API 2.0 factory.

    The factory must return a new connection with no transaction open; its ``search_path``
    chooses the schema the ``longrun_*`` tables live in. With ``create=True`` (the default) they are
    created there on first use; with ``create=False`` (what ``open_store`` gives the command line) a
    schema without longrun's ``longrun_schema`` table (its marker) is refused with
    ``NotAStoreError`` on first use, and nothing is created.

    One store object may be shared by threads: it holds one connection and a lock lets one thread
    at a time use it, for one whole transaction (the driver's connection is never used by two
    threads at once). Threads that need transactions in parallel use a store object each.
    """

    placeholder = "%s"
    types = {"int": "BIGINT", "float": "DOUBLE PRECISION", "serial": "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY", "bytes": "BYTEA", "desc": "DESC NULLS LAST"}

    def __init__(self, connect: Callable[[], Any], *, transaction_timeout_s: float = 10.0, create: bool = True):
        super().__init__()
        self.create = bool(create)
        if not callable(connect):
            raise InvalidInputError("PostgresStore needs a connection factory: a callable returning a DB-API connection")
        if (
            isinstance(transaction_timeout_s, bool)
            or not isinstance(transaction_timeout_s, (int, float))
            or not transaction_timeout_s > 0
        ):
            raise InvalidInputError(f"transaction_timeout_s must be a positive number, got {transaction_timeout_s!r}")
        self.connect = connect
        self.transaction_timeout_s = float(transaction_timeout_s)
        self._errors: tuple[type[BaseException], ...] = (OSError,)
        self._one_call: _OneCall | None = None
        """Set while ``commit`` gathers a commit for one ``longrun_commit`` call (``_commit_transaction``)."""
        self._in_one_statement = False
        """A read-only load is checking the rows of its one statement (``load``): no other read may run."""
        self._task_in_transaction: str | None = None
        """The task whose transaction is open (``_transaction``)."""
        self._lease_read: tuple[str, Sequence[Any] | None] | None = None
        """The lease row ``_clock`` read with the clock, for the next ``_get_lease`` of that task in the transaction."""

    def __repr__(self) -> str:
        # Never the factory's arguments: a DSN may hold a password.
        return f"PostgresStore({getattr(self.connect, '__qualname__', type(self.connect).__name__)})"

    def _connect(self) -> Any:
        connection = self.connect()
        try:
            self._errors = driver_errors(connection)
            if getattr(connection, "autocommit", False):
                connection.autocommit = False  # transactions are begun by the driver, ended by us
            connection.commit()  # end anything the factory left open (a SET it ran, say)
            cursor = connection.cursor()
            milliseconds = int(self.transaction_timeout_s * 1000)
            cursor.execute(f"SET idle_in_transaction_session_timeout = {milliseconds}")
            cursor.execute(f"SET lock_timeout = {milliseconds}")
            # What every write transaction runs under, set once here rather than by a statement (a
            # round trip) at the start of each; a read transaction still sets its own.
            cursor.execute("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE")
            connection.commit()
        except BaseException:
            try:
                connection.close()
            except Exception:  # already broken: the original error is the one to report
                pass
            raise
        return connection

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        return self._errors

    def _begin(self, *, write: bool) -> None:
        # The driver opens the transaction on the first statement (DB-API). A write transaction
        # runs under the session's characteristics (READ COMMITTED, READ WRITE: set on connecting),
        # so its first statement is its first real one; a read is REPEATABLE READ, READ ONLY, said
        # in the driver's own BEGIN where it can (psycopg 3), else by a statement.
        if not begin_as(self._db.connection, write=write, isolation=None if write else _REPEATABLE_READ):
            if not write:
                self._db.run("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")

    def _finish(self, *, commit: bool) -> None:
        # Every transaction on the connection begins through ``_begin`` (the schema's check too),
        # which sets the driver's BEGIN for it; a statement in autocommit sends no BEGIN at all.
        if commit:
            self._db.connection.commit()
        else:
            self._db.connection.rollback()

    def _lock_schema(self) -> None:
        self._db.run(f"SELECT pg_advisory_xact_lock({_SCHEMA_LOCK})")

    def _lock_task_sql(self, *, write: bool) -> str:
        return "SELECT task_id FROM longrun_tasks WHERE task_id = ?" + (" FOR UPDATE" if write else "")

    def _refuse_without_schema(self) -> None:
        if not self.create:
            raise NotAStoreError(
                f"{self.spec or repr(self)} is not a longrun store: its schema (search_path) holds no longrun_schema "
                "table; nothing was created. Name the database and schema the store is in, or open it with create=True",
                path=self.spec or repr(self),
            )

    def _schema_table_sql(self) -> str:
        return "SELECT to_regclass('longrun_schema') IS NOT NULL"

    def _match_sql(self) -> str:
        return "task_id ~ ?"

    def _queue_table_sql(self) -> str:
        return "SELECT 1 WHERE to_regclass('longrun_queue') IS NOT NULL"

    def _now_sql(self) -> str:
        return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"

    def read_cancellation(self, task_id: str) -> ControlRecord | None:
        """``SqlStore.read_cancellation`` in one round trip: one statement (one snapshot), in autocommit."""
        check_task_id(task_id)
        row = self._db.single(
            "SELECT (SELECT 1 FROM longrun_tasks WHERE task_id = ?), (SELECT body FROM longrun_cancellations WHERE task_id = ?)",
            (task_id, task_id),
            what=f"read the cancellation record of task {task_id!r}",
        )
        if row[0] is None:
            raise UnknownTaskError(f"no task {task_id!r} in {self!r}")
        return None if row[1] is None else self._control(f"longrun_cancellations/{task_id}", row[1])

    def _routines(self) -> list[str]:
        return [_COMMIT_FUNCTION]

    def _status_counters(self) -> list[str]:
        return postgres_status_counters()

    @contextlib.contextmanager
    def _commit_transaction(self, lease: Lease) -> Generator[None, None, None]:
        """The whole commit in one ``longrun_commit`` call, fenced by the database in that call.

        ``BaseStore.commit`` reads the revision and calls ``_put_state`` inside, while this object's
        lock is held (as it is for a transaction); ``_put_state`` only encodes the rows, and the
        call is made once ``commit``'s part is done. Where the revision is not known yet (no load
        or commit by this object since the lease was taken), the statements of a transaction."""
        if lease.task_id not in self._revisions:
            with super()._commit_transaction(lease):
                yield
            return
        with self._db.exclusive():
            gathering = self._one_call = _OneCall(lease)
            try:
                yield
            finally:
                self._one_call = None
            write = gathering.write
            if write is None:
                raise AssertionError("BaseStore.commit wrote no state")  # pragma: no cover - a broken caller
            what = f"commit task {lease.task_id!r} (whether it committed is not known)"
            if self._db.single(_COMMIT_CALL, self._commit_params(write, lease), what=what)[0] != _WRITTEN:
                # Nothing was written. The same commit as statements raises what the fence raises
                # (FencedError; CorruptStateError for a damaged lease row), or writes.
                with super()._commit_transaction(lease):
                    self._write_state_rows(write)
            self._state_written(write)

    def _put_state(self, state: RunState, changed: Collection[str] | None) -> None:
        gathering = self._one_call
        if gathering is None:
            super()._put_state(state, changed)
            return
        if gathering.write is not None or gathering.lease.task_id != state.task_id:
            raise AssertionError("one commit gathers one state, of its lease's task")  # pragma: no cover - a broken caller
        gathering.write = self._state_write(state, changed)

    @staticmethod
    def _commit_params(write: StateWrite, lease: Lease) -> tuple[object, ...]:
        """The arguments of ``_COMMIT_CALL``, in the order of ``_COMMIT_TYPES``."""
        state, rows, summary = write.state, write.rows, write.summary
        plan = 1 if write.outline_body is not None else 2 if write.outline_changed else 0
        return (
            state.task_id, state.revision, lease.epoch, lease.token,
            state.plan_digest, state.status.value, state.next_action, len(state.effects), write.header,
            write.header_checksum, state.updated_at,
            _text_array(row[0] for row in rows), "{" + ",".join(str(row[1]) for row in rows) + "}",
            _text_array(row[2] for row in rows), _text_array(row[3] for row in rows),
            _text_array(write.deleted or ()), write.deleted is None,
            _text_array(blob.ref.sha256 for blob in write.blobs), [blob.data for blob in write.blobs],
            summary.status, summary.revision, summary.function, summary.parent, summary.created_at,
            summary.updated_at, summary.wake_at, summary.error, summary.next_action,
            plan, write.outline_body, write.outline_checksum,
        )  # fmt: skip

    def load(self, task_id: str, *, lease: Lease | None = None) -> LoadResult:
        """``BaseStore.load``; a read-only load in one round trip: ``_STATE_QUERY`` as one statement in
        autocommit (one snapshot), the rows checked exactly as ``_get_state``'s are. Where the rows
        need another read (a large value kept apart, the quarantine of a state with no header), the
        load runs as a read transaction, as it does for every store."""
        if lease is not None:
            return super().load(task_id, lease=lease)
        check_task_id(task_id)
        with self._db.exclusive():
            if self._in_one_statement:
                return super().load(task_id)
            row = self._db.single(_STATE_QUERY, (task_id,), what=f"load task {task_id!r}")
            if row[0] is None:
                raise UnknownTaskError(f"no task {task_id!r} in {self!r}")
            self._in_one_statement = True
            try:
                result: LoadResult | None = self._state_rows(task_id, row, repair=False)
            except _AnotherRead:
                result = None
            finally:
                self._in_one_statement = False
            if result is None:
                return super().load(task_id)
        try:
            self._check_witness(task_id, result, self._witness(task_id))
        except StateUnrecoverableError as exc:
            self._poisoned[task_id] = exc  # as ``BaseStore.load``: nothing may be written over it
            raise
        return result

    def _blob(self, task_id: str, digest: str) -> bytes | None:
        if self._in_one_statement:
            raise _AnotherRead()
        return super()._blob(task_id, digest)

    def _quarantined(self, task_id: str) -> list[str]:
        if self._in_one_statement:
            raise _AnotherRead()
        return super()._quarantined(task_id)

    def _get_state(self, task_id: str, *, repair: bool) -> LoadResult:
        """``SqlStore._get_state`` in one statement (``_STATE_QUERY``), checked as its four queries' rows are."""
        return self._state_rows(task_id, self._db.one(_STATE_QUERY, (task_id,)), repair=repair)

    def _state_rows(self, task_id: str, row: Sequence[Any], *, repair: bool) -> LoadResult:
        floor_row = None if row[0] is None else (row[0],)
        header_row = None if row[1] is None else tuple(row[1:5])
        outline_row = None if row[5] is None else tuple(row[5:8])
        effect_rows = [] if row[8] is None else list(zip(row[8], row[9], row[10], row[11], row[12]))
        return self._state_from_rows(task_id, floor_row, header_row, effect_rows, outline_row, repair=repair)

    def _put_lease(self, lease: Lease) -> None:
        """``SqlStore._put_lease`` in one statement (``_LEASE_WRITE``): the same conditional upsert, the
        same floor, the same refusal when a newer epoch is recorded."""
        self._lease_read = None
        row = self._db.one(
            _LEASE_WRITE,
            (
                lease.task_id, lease.owner, lease.epoch, lease.acquired_at, lease.expires_at,
                lease.monotonic_clock, lease.monotonic_expires_at, lease.token, lease.holder_lock,
            ),
        )  # fmt: skip
        if row is None or row[0] != 1:
            raise FencedError(
                f"lease write for {lease.task_id!r} at epoch {lease.epoch} refused by the database: "
                "a newer epoch is recorded",
                write_epoch=lease.epoch,
            )

    @contextlib.contextmanager
    def _transaction(self, task_id: str, *, create: bool, write: bool = True) -> Generator[None, None, None]:
        self._task_in_transaction = task_id
        try:
            with super()._transaction(task_id, create=create, write=write):
                yield
        finally:
            self._task_in_transaction = None
            self._lease_read = None

    def _clock(self, now: float) -> float:
        """The server's clock, read once the task's row lock is held; the task's lease row read by the
        same statement, for the ``_get_lease`` that follows (every lease operation reads the lease
        right after the clock: one round trip for both)."""
        task_id = self._task_in_transaction
        if task_id is None:
            row = self._db.one(f"SELECT {self._now_sql()}")
            return float(row[0])
        row = self._db.one(
            f"SELECT {self._now_sql()}, l.task_id, {', '.join('l.' + name for name in self._LEASE_COLUMNS.split(', '))} "
            "FROM (SELECT CAST(? AS TEXT) AS task_id) k LEFT JOIN longrun_leases l ON l.task_id = k.task_id",
            (task_id,),
        )
        self._lease_read = (task_id, None if row[1] is None else tuple(row[2:]))
        return float(row[0])

    def _lease_row(self, task_id: str) -> Sequence[Any] | None:
        read, self._lease_read = self._lease_read, None
        if read is not None and read[0] == task_id:
            return read[1]
        return super()._lease_row(task_id)


_REPEATABLE_READ = 3
"""psycopg's ``IsolationLevel.REPEATABLE_READ`` (its value: the driver is not imported here)."""


def begin_as(connection: Any, *, write: bool, isolation: int | None) -> bool:
    """Have the driver's next ``BEGIN`` say how the transaction runs (``READ ONLY`` unless ``write``;
    the isolation level ``isolation``, None for the session's), so no statement of its own travels
    for it; False where the driver cannot (pg8000): the caller then sets it by a statement.

    psycopg 3 keeps both as client-side settings of the connection, read when it sends ``BEGIN``;
    they are only assigned when they change (assigning rebuilds the driver's BEGIN text)."""
    if not (hasattr(connection, "read_only") and hasattr(connection, "isolation_level")):
        return False
    read_only = None if write else True
    if connection.read_only != read_only:
        connection.read_only = read_only
    if connection.isolation_level != isolation:
        connection.isolation_level = isolation
    return True


def driver_errors(connection: Any) -> tuple[type[BaseException], ...]:
    """The driver's DB-API ``Error`` base (found on the connection or its package), plus OSError.

    If none can be found, every ``Exception`` is translated: a driver that hides its error classes
    must not make a storage failure look like a bug in the caller.
    """
    found: list[type[BaseException]] = [OSError]
    candidates = [getattr(type(connection), "Error", None)]
    package = sys.modules.get(type(connection).__module__.split(".")[0])
    candidates.append(getattr(package, "Error", None))
    for candidate in candidates:
        if isinstance(candidate, type) and issubclass(candidate, BaseException) and candidate not in found:
            found.append(candidate)
    if len(found) == 1:
        return (Exception,)
    return tuple(found)
