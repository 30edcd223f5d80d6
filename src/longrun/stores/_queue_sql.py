"""The SQL of the fleet's tables (``stores.queue``): what differs between PostgreSQL and SQLite.

Each dialect gives how to connect, begin and end a transaction, the column types, the database's
clock as an SQL expression, and the triggers that keep the due-time index current from the
store's own tables (none for the JSON-file store's side file, which has no store tables in it).
The trigger that reads a record's JSON is guarded, so a record it cannot read never fails the
store's own commit (the task is then adopted when a worker starts); the others are updates of one
row by its key.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
from typing import Any, Callable

from ..contract import INTERNAL_PREFIX
from ..errors import InvalidInputError

__all__ = ["FUNCTION_STEP", "NOTIFY_CHANNEL", "SIDE_FILE", "Dialect", "PostgresDialect", "SqliteDialect", "delete_side_row", "tables"]

SIDE_FILE = ".fleet.sqlite"
"""The JSON-file store's fleet tables, in its root: a dot name is never a task id."""

NOTIFY_CHANNEL = "longrun_fleet"
FUNCTION_STEP = INTERNAL_PREFIX + "function"
"""The step id of a durable task's own record (``longrun.functions.FUNCTION_STEP``)."""
_SCHEMA_LOCK = 0x6C6F6E6772756E + 1
"""PostgreSQL advisory lock that serializes the fleet schema's creation (the store's key + 1)."""


class Dialect:
    """What differs between the databases the tables live in."""

    placeholder = "?"
    float_type = "DOUBLE PRECISION"
    int_type = "BIGINT"
    now_sql = ""
    in_store = True
    """The tables live in the store's database, beside its own, with triggers on them."""
    skip_locked = False
    notify = False

    def connect(self) -> Any:
        raise NotImplementedError

    def errors(self) -> tuple[type[BaseException], ...]:
        raise NotImplementedError

    def begin(self, run: Callable[[str], Any], *, write: bool, connection: Any) -> None:
        """Open a transaction on ``connection`` (statements through ``run``): a write, or a read."""
        raise NotImplementedError

    def end(self, connection: Any, *, commit: bool) -> None:
        raise NotImplementedError

    def schema_exists_sql(self) -> str:
        raise NotImplementedError

    def lock_schema(self, run: Callable[[str], Any]) -> None:
        """Serialize schema creation between processes (inside its transaction)."""

    def triggers(self) -> list[str]:
        return []

    def column_exists_sql(self, table: str, column: str) -> str:
        """A query whose one value is 1 if ``table`` has ``column`` (for a table made by older code)."""
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


_READ_COMMITTED = 2
"""psycopg's ``IsolationLevel.READ_COMMITTED`` (its value: the driver is not imported here)."""


class PostgresDialect(Dialect):
    placeholder = "%s"
    now_sql = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"
    skip_locked = True
    notify = True

    def __init__(self, store: Any):
        self._connect = store.connect
        self._timeout_ms = int(float(getattr(store, "transaction_timeout_s", 10.0)) * 1000)
        self._errors: tuple[type[BaseException], ...] = (OSError,)
        self._label = repr(store)

    def connect(self) -> Any:
        from .postgres import driver_errors

        connection = self._connect()
        try:
            self._errors = driver_errors(connection)
            if getattr(connection, "autocommit", False):
                connection.autocommit = False
            connection.commit()
            cursor = connection.cursor()
            cursor.execute(f"SET idle_in_transaction_session_timeout = {self._timeout_ms}")
            cursor.execute(f"SET lock_timeout = {self._timeout_ms}")
            connection.commit()
        except BaseException:
            with contextlib.suppress(Exception):
                connection.close()
            raise
        return connection

    def listen_connection(self) -> Any:
        """A connection in autocommit mode for ``LISTEN`` (the store's factory, its search path)."""
        connection = self._connect()
        connection.autocommit = True
        return connection

    def errors(self) -> tuple[type[BaseException], ...]:
        return self._errors

    def begin(self, run: Callable[[str], Any], *, write: bool, connection: Any) -> None:
        # READ COMMITTED; READ ONLY for a read. Said in the driver's BEGIN where it can (psycopg 3:
        # no statement of its own travels), else by a statement.
        from .postgres import begin_as

        if not begin_as(connection, write=write, isolation=_READ_COMMITTED):
            run("SET TRANSACTION ISOLATION LEVEL READ COMMITTED, " + ("READ WRITE" if write else "READ ONLY"))

    def end(self, connection: Any, *, commit: bool) -> None:
        if commit:
            connection.commit()
        else:
            connection.rollback()

    def schema_exists_sql(self) -> str:
        return "SELECT to_regclass('longrun_fleet_schema') IS NOT NULL"

    def lock_schema(self, run: Callable[[str], Any]) -> None:
        run(f"SELECT pg_advisory_xact_lock({_SCHEMA_LOCK})")

    def column_exists_sql(self, table: str, column: str) -> str:
        return (
            "SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = current_schema() "
            f"AND table_name = '{table}' AND column_name = '{column}'"
        )

    def triggers(self) -> list[str]:
        now = self.now_sql
        # Every trigger body is guarded: a fleet row that cannot be written must never fail the
        # store's own commit (the task is safe without its row; a worker adopts it on start).
        function_body = f"""
            DECLARE payload json;
            BEGIN
                BEGIN
                    payload := (NEW.record::json) -> 'record' -> 'payload';
                    INSERT INTO longrun_queue (task_id, function, parent, wake_at, status, updated_at)
                    VALUES (NEW.task_id, payload ->> 'function', payload ->> 'parent',
                            GREATEST({now}, (SELECT expires_at FROM longrun_leases WHERE task_id = NEW.task_id)), 'new', {now})
                    ON CONFLICT (task_id) DO NOTHING;
                    PERFORM pg_notify('{NOTIFY_CHANNEL}', NEW.task_id);
                EXCEPTION WHEN OTHERS THEN
                    RAISE WARNING USING MESSAGE = 'longrun fleet: task ' || NEW.task_id || ' was not queued: ' || SQLERRM;
                END;
                RETURN NULL;
            END"""
        lease_body = f"""
            DECLARE moment double precision := {now};
            BEGIN
                UPDATE longrun_queue SET wake_at = GREATEST(NEW.expires_at, moment), updated_at = moment
                WHERE task_id = NEW.task_id AND claim_token IS NULL;
                IF FOUND AND NEW.expires_at <= moment THEN
                    PERFORM pg_notify('{NOTIFY_CHANNEL}', NEW.task_id);
                END IF;
                RETURN NULL;
            END"""
        control_body = f"""
            DECLARE moment double precision := {now}; target text;
            BEGIN
                IF TG_OP = 'DELETE' THEN target := OLD.task_id; ELSE target := NEW.task_id; END IF;
                UPDATE longrun_queue SET nudge = nudge + 1,
                    wake_at = CASE WHEN claim_token IS NULL THEN moment ELSE wake_at END, updated_at = moment
                WHERE task_id = target;
                IF FOUND THEN PERFORM pg_notify('{NOTIFY_CHANNEL}', target); END IF;
                RETURN NULL;
            END"""
        statements = []
        for name, body in (("function", function_body), ("lease", lease_body), ("control", control_body)):
            statements.append(
                f"CREATE OR REPLACE FUNCTION longrun_fleet_on_{name}() RETURNS trigger LANGUAGE plpgsql "
                f"SET search_path FROM CURRENT AS $longrun${body}$longrun$"
            )
        for trigger, table, events, function, when in (
            ("longrun_fleet_function", "longrun_effects", "INSERT", "function", f"WHEN (NEW.step_id = '{FUNCTION_STEP}') "),
            ("longrun_fleet_lease", "longrun_leases", "INSERT OR UPDATE", "lease", ""),
            ("longrun_fleet_approval", "longrun_approvals", "INSERT OR UPDATE", "control", ""),
            ("longrun_fleet_cancellation", "longrun_cancellations", "INSERT OR UPDATE OR DELETE", "control", ""),
            ("longrun_fleet_message", "longrun_messages", "INSERT", "control", ""),
        ):
            statements.append(f"DROP TRIGGER IF EXISTS {trigger} ON {table}")
            statements.append(
                f"CREATE TRIGGER {trigger} AFTER {events} ON {table} FOR EACH ROW {when}"
                f"EXECUTE FUNCTION longrun_fleet_on_{function}()"
            )
        return statements

    def describe(self) -> str:
        return self._label


class SqliteDialect(Dialect):
    float_type = "REAL"
    int_type = "INTEGER"
    now_sql = "((julianday('now') - 2440587.5) * 86400.0)"

    def __init__(self, path: str, *, busy_timeout_s: float, in_store: bool, label: str):
        self.path = path
        self.busy_timeout_s = busy_timeout_s
        self.in_store = in_store
        self._label = label

    def connect(self) -> Any:
        if not self.in_store and not os.path.exists(self.path):
            # Owner-only, before SQLite creates it with the umask's mode.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            os.close(fd)
        info = os.lstat(self.path)
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISREG(info.st_mode):
            raise InvalidInputError(f"{self._label}: {self.path!r} is not a regular file (symlinks are refused)")
        connection = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=False)
        try:
            connection.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_s * 1000)}")
            if not self.in_store:
                connection.execute("PRAGMA journal_mode=WAL")
            # The index is not the state of record: a commit lost with power is a late or a wasted
            # run, never a lost task (claims expire; the store's own commits stay FULL).
            connection.execute("PRAGMA synchronous=NORMAL")
        except BaseException:
            connection.close()
            raise
        return connection

    def errors(self) -> tuple[type[BaseException], ...]:
        return (sqlite3.Error, OSError)

    def begin(self, run: Callable[[str], Any], *, write: bool, connection: Any) -> None:
        run("BEGIN IMMEDIATE" if write else "BEGIN")

    def end(self, connection: Any, *, commit: bool) -> None:
        if connection.in_transaction:
            connection.execute("COMMIT" if commit else "ROLLBACK")

    def schema_exists_sql(self) -> str:
        return "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'longrun_fleet_schema'"

    def column_exists_sql(self, table: str, column: str) -> str:
        return f"SELECT COUNT(*) FROM pragma_table_info('{table}') WHERE name = '{column}'"

    def triggers(self) -> list[str]:
        if not self.in_store:
            return []
        now = self.now_sql
        payload = "'$.record.payload'"
        statements = [
            f"""CREATE TRIGGER IF NOT EXISTS longrun_fleet_function AFTER INSERT ON longrun_effects
                WHEN NEW.step_id = '{FUNCTION_STEP}' AND json_valid(NEW.record)
                    AND json_type(NEW.record, {payload[:-1]}.function') = 'text'
                BEGIN
                    INSERT OR IGNORE INTO longrun_queue (task_id, function, parent, wake_at, status, updated_at)
                    VALUES (NEW.task_id, json_extract(NEW.record, {payload[:-1]}.function'),
                            CASE WHEN json_type(NEW.record, {payload[:-1]}.parent') = 'text'
                                 THEN json_extract(NEW.record, {payload[:-1]}.parent') END,
                            MAX({now}, COALESCE((SELECT expires_at FROM longrun_leases WHERE task_id = NEW.task_id), 0)),
                            'new', {now});
                END"""
        ]
        for event in ("INSERT", "UPDATE"):
            statements.append(
                f"""CREATE TRIGGER IF NOT EXISTS longrun_fleet_lease_{event.lower()} AFTER {event} ON longrun_leases
                    BEGIN
                        UPDATE longrun_queue SET wake_at = MAX(NEW.expires_at, {now}), updated_at = {now}
                        WHERE task_id = NEW.task_id AND claim_token IS NULL;
                    END"""
            )
        for table, events in (("approvals", ("INSERT", "UPDATE")), ("cancellations", ("INSERT", "UPDATE", "DELETE")), ("messages", ("INSERT",))):
            for event in events:
                row = "OLD" if event == "DELETE" else "NEW"
                statements.append(
                    f"""CREATE TRIGGER IF NOT EXISTS longrun_fleet_{table}_{event.lower()} AFTER {event} ON longrun_{table}
                        BEGIN
                            UPDATE longrun_queue SET nudge = nudge + 1,
                                wake_at = CASE WHEN claim_token IS NULL THEN {now} ELSE wake_at END, updated_at = {now}
                            WHERE task_id = {row}.task_id;
                        END"""
                )
        return statements

    def describe(self) -> str:
        return self._label


def delete_side_row(root: str, task_id: str) -> bool:
    """Delete a task's row from the fleet tables beside a JSON-file store's tasks (``SIDE_FILE`` in
    ``root``), if that file and its queue table exist; True if a row went. For ``delete_task``:
    the store cannot hold a ``TaskQueue`` (the queue module knows the stores, not the reverse)."""
    from ..errors import StorageError

    path = os.path.join(root, SIDE_FILE)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise StorageError(f"cannot look at the fleet tables {path}: {exc}") from exc
    if not stat.S_ISREG(info.st_mode):
        raise InvalidInputError(f"{path!r} is not a regular file (symlinks are refused)")
    try:
        connection = sqlite3.connect(path, timeout=30.0, isolation_level=None)
        try:
            connection.execute("PRAGMA busy_timeout=30000")
            if connection.execute("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'longrun_queue'").fetchone()[0] == 0:
                return False
            return bool(connection.execute("DELETE FROM longrun_queue WHERE task_id = ?", (task_id,)).rowcount == 1)
        finally:
            connection.close()
    except (sqlite3.Error, OSError) as exc:
        raise StorageError(f"cannot delete the fleet row of task {task_id!r} in {path}: {exc}") from exc


def tables(dialect: Dialect) -> list[str]:
    f, i = dialect.float_type, dialect.int_type
    return [
        f"""CREATE TABLE IF NOT EXISTS longrun_queue (
            task_id TEXT PRIMARY KEY,
            function TEXT NOT NULL,
            parent TEXT,
            priority {i} NOT NULL DEFAULT 0,
            wake_at {f},
            status TEXT NOT NULL DEFAULT 'new',
            claimed_by TEXT,
            claim_token TEXT,
            nudge {i} NOT NULL DEFAULT 0,
            runs {i} NOT NULL DEFAULT 0,
            failures {i} NOT NULL DEFAULT 0,
            last_error TEXT,
            fingerprint TEXT,
            updated_at {f} NOT NULL,
            queue_name TEXT,
            not_before {f})""",
        "CREATE INDEX IF NOT EXISTS longrun_queue_due ON longrun_queue (wake_at) WHERE wake_at IS NOT NULL",
        "CREATE INDEX IF NOT EXISTS longrun_queue_parent ON longrun_queue (parent) WHERE parent IS NOT NULL",
        f"""CREATE TABLE IF NOT EXISTS longrun_workers (
            name TEXT PRIMARY KEY,
            host TEXT NOT NULL,
            pid {i} NOT NULL,
            started_at {f} NOT NULL,
            heartbeat_at {f} NOT NULL,
            heartbeat_s {f} NOT NULL,
            state TEXT NOT NULL,
            concurrency {i} NOT NULL,
            running {i} NOT NULL,
            functions TEXT NOT NULL)""",
        f"""CREATE TABLE IF NOT EXISTS longrun_slots (
            action TEXT NOT NULL,
            slot {i} NOT NULL,
            holder TEXT,
            token TEXT,
            expires_at {f},
            PRIMARY KEY (action, slot))""",
        f"CREATE TABLE IF NOT EXISTS longrun_fleet_meta (name TEXT PRIMARY KEY, value {f} NOT NULL)",
        f"CREATE TABLE IF NOT EXISTS longrun_named_queues (name TEXT PRIMARY KEY, record TEXT NOT NULL, updated_at {f} NOT NULL)",
        f"CREATE TABLE IF NOT EXISTS longrun_queue_starts (queue_name TEXT NOT NULL, started_at {f} NOT NULL)",
        "CREATE INDEX IF NOT EXISTS longrun_queue_starts_at ON longrun_queue_starts (queue_name, started_at)",
        """CREATE TABLE IF NOT EXISTS longrun_dedup (
            queue_name TEXT NOT NULL,
            dedup_id TEXT NOT NULL,
            task_id TEXT NOT NULL,
            PRIMARY KEY (queue_name, dedup_id))""",
        f"""CREATE TABLE IF NOT EXISTS longrun_schedules (
            name TEXT PRIMARY KEY,
            record TEXT NOT NULL,
            next_slot {f} NOT NULL,
            last_slot {f},
            last_task TEXT,
            updated_at {f} NOT NULL)""",
    ]
