"""The connection under the SQL stores: one DB-API connection, its transactions, the schema's
creation and migration.

``SqlStore`` (``stores._sql``) holds one ``SqlConnection`` and passes every statement through it;
what differs between databases is the ``SqlDialect`` the connection is made with, which
``SqliteStore`` and ``PostgresStore`` implement. The schema itself is in ``stores._sql_schema``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Generator, Mapping, Protocol, Sequence

from ..contract import check_task_id
from ..errors import LongrunError, SchemaVersionError, StorageError, UnknownTaskError, describe_exception
from ._sql_schema import SCHEMA_VERSION, migrations

__all__ = ["SqlConnection", "SqlDialect"]

log = logging.getLogger("longrun")


class SqlDialect(Protocol):
    """What one database supplies to its ``SqlConnection``: how to connect, begin and end a
    transaction, the parameter mark, the column types and the database's clock. Statements are
    written with ``?``; ``placeholder`` is what the driver wants instead."""

    placeholder: str
    types: Mapping[str, str]
    """The column types for the schema's integers ("int"), floats ("float"), the quarantine's row id ("serial") and bytes
    ("bytes"), and "desc": descending order with NULL last (SQLite's DESC; PostgreSQL's DESC NULLS LAST)."""

    def _connect(self) -> Any:
        """A new DB-API connection with no transaction open."""
        ...

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        """The exception classes the driver raises, translated to ``StorageError``."""
        ...

    def _begin(self, *, write: bool) -> None: ...

    def _finish(self, *, commit: bool) -> None: ...

    def _lock_schema(self) -> None:
        """Serialize schema creation between processes (inside the schema transaction)."""
        ...

    def _lock_task_sql(self, *, write: bool) -> str:
        """The statement that reads (and in a write transaction locks) a task's row."""
        ...

    def _schema_table_sql(self) -> str:
        """A query whose one row's first value is true if ``longrun_schema`` exists."""
        ...

    def _refuse_without_schema(self) -> None:
        """Called where no schema is, before one is created: raise ``NotAStoreError`` if this store
        may not create it (the ``longrun_schema`` table is the store's marker)."""
        ...

    def _now_sql(self) -> str:
        """An SQL expression for the database's clock, in seconds since the epoch."""
        ...

    def _routines(self) -> list[str]:
        """The DDL of the database's server-side routines (schema version 8), or none."""
        ...

    def _status_counters(self) -> list[str]:
        """The DDL of the status count table and the triggers that keep it (schema version 9)."""
        ...

    def _migrated(self, version: int) -> None:
        """Called in the migration's transaction after the DDL of ``version``: fill what DDL cannot
        (version 6: a summary row from every stored state)."""
        ...


class SqlConnection:
    """One connection to an SQL database for one store object, made with its ``dialect``.

    Opened on first use and reopened after it breaks; a lock lets one thread at a time use it, for
    one whole transaction. So a store object may be shared by threads (a runner's lease-renewal
    thread and its main loop, a pool running many tasks): their transactions take turns, and the
    per-task state the store keeps (the rows it knows are stored, the revision it last committed)
    is read and changed only inside them. For transactions in parallel, give each thread its own
    store object.
    """

    def __init__(self, dialect: SqlDialect) -> None:
        self._dialect = dialect
        self._lock = threading.RLock()
        self.connection: Any = None
        """The DB-API connection, or None until the first transaction (and after it broke)."""
        self._cursor: Any = None
        self._schema_checked = False
        self.keep_writes = False
        """Set inside a transaction: a ``LongrunError`` that ends it commits what it wrote (a
        quarantine of damaged rows) instead of rolling it back."""

    def __repr__(self) -> str:
        return repr(self._dialect)

    def close(self) -> None:
        """Close the connection (a later call opens a new one)."""
        with self._lock:
            self._drop_connection()

    def _drop_connection(self) -> None:
        connection, self.connection, self._cursor = self.connection, None, None
        self._schema_checked = False
        if connection is not None:
            with contextlib.suppress(Exception):  # it may already be broken; nothing to save
                connection.close()

    def _sql(self, statement: str) -> str:
        return statement if self._dialect.placeholder == "?" else statement.replace("?", self._dialect.placeholder)

    def run(self, statement: str, params: Sequence[object] = ()) -> Any:
        """Execute one statement in the open transaction; the one place SQL reaches the driver."""
        self._cursor.execute(self._sql(statement), tuple(params))
        return self._cursor

    def run_many(self, statement: str, rows: Sequence[Sequence[object]]) -> None:
        for row in rows:
            self.run(statement, row)

    def one(self, statement: str, params: Sequence[object] = ()) -> Any:
        return self.run(statement, params).fetchone()

    def rows(self, statement: str, params: Sequence[object] = ()) -> list[Any]:
        return list(self.run(statement, params).fetchall())

    def exclusive(self) -> contextlib.AbstractContextManager[bool]:
        """This object's lock, held by one thread at a time (re-entrant: the sessions and single
        calls made while it is held take it again), for work that spans more than one of them."""
        return self._lock

    def _connected(self) -> None:
        if self.connection is None:
            try:
                self.connection = self._dialect._connect()
            except LongrunError:
                raise
            except Exception as exc:  # whatever the driver or the caller's factory raises
                raise StorageError(f"{self!r}: cannot connect: {describe_exception(exc)}") from exc

    def single(self, statement: str, params: Sequence[object], *, what: str) -> Any:
        """Run one statement as a transaction of its own, in one round trip, and return its first
        row: the driver's autocommit mode, so neither a BEGIN nor a COMMIT travels, and one
        statement reads one snapshot. If it fails, the connection is dropped and ``StorageError``
        raised; the outcome of a write is then unknown, as a failed COMMIT's is."""
        with self._lock:
            self._connected()
            errors = self._dialect._driver_errors()
            connection = self.connection
            try:
                if not self._schema_checked:
                    self._ensure_schema()
                if not hasattr(connection, "autocommit"):  # a DB-API driver without the switch: BEGIN and COMMIT travel
                    self._cursor = connection.cursor()
                    row = self.one(statement, params)
                    connection.commit()
                    return row
                connection.autocommit = True
                try:
                    self._cursor = connection.cursor()
                    return self.one(statement, params)
                finally:
                    connection.autocommit = False  # a client-side switch: no round trip
            except LongrunError:
                self._drop_connection()
                raise
            except errors as exc:
                self._drop_connection()
                raise StorageError(f"{self!r}: cannot {what}: {exc}") from exc
            finally:
                cursor, self._cursor = self._cursor, None
                if cursor is not None:
                    with contextlib.suppress(Exception):  # a cursor of a broken connection
                        cursor.close()

    @contextlib.contextmanager
    def session(self, *, write: bool, what: str) -> Generator[None, None, None]:
        """One database transaction, with the driver's errors translated to ``StorageError``."""
        with self._lock:
            self._connected()
            errors = self._dialect._driver_errors()
            try:
                if not self._schema_checked:
                    self._ensure_schema()
                self._cursor = self.connection.cursor()
                self._dialect._begin(write=write)
            except LongrunError:
                self._drop_connection()
                raise
            except errors as exc:
                self._drop_connection()
                raise StorageError(f"{self!r}: cannot open a transaction to {what}: {exc}") from exc
            self.keep_writes = False
            try:
                yield
            except BaseException as exc:
                keep = self.keep_writes and isinstance(exc, LongrunError)
                self._end_after_error(commit=keep)
                if isinstance(exc, errors) and not isinstance(exc, LongrunError):
                    raise StorageError(f"{self!r}: cannot {what}: {exc}") from exc
                raise
            else:
                try:
                    self._dialect._finish(commit=True)
                except errors as exc:
                    self._end_after_error(commit=False)
                    raise StorageError(f"{self!r}: the transaction to {what} did not commit: {exc}") from exc
            finally:
                cursor, self._cursor = self._cursor, None
                self.keep_writes = False
                if cursor is not None:
                    with contextlib.suppress(Exception):  # a cursor of a broken connection
                        cursor.close()

    def _end_after_error(self, *, commit: bool) -> None:
        try:
            self._dialect._finish(commit=commit)
        except Exception as exc:  # the connection is in an unknown state: never reuse it
            log.warning("%r: ending a failed transaction failed (%s); reconnecting on next use", self, exc)
            self._drop_connection()

    def _ensure_schema(self) -> None:
        """Create or migrate the schema, or refuse a newer one. Once per connection.

        A current schema is only read (no DDL, no lock), so a database user without the right to
        create tables can use tables an administrator created.
        """
        current = self._schema_step(write=False)
        if current == 0:
            self._dialect._refuse_without_schema()
        if current < SCHEMA_VERSION:
            self._schema_step(write=True)
        self._schema_checked = True

    def _schema_step(self, *, write: bool) -> int:
        """In one transaction, read the schema version and (``write``) create or migrate to ours."""
        self._cursor = self.connection.cursor()
        self._dialect._begin(write=write)
        try:
            if write:
                self._dialect._lock_schema()
                self.run(
                    f"""CREATE TABLE IF NOT EXISTS longrun_schema (
                        version INTEGER PRIMARY KEY,
                        applied_at {self._dialect.types['float']} NOT NULL,
                        description TEXT NOT NULL)"""
                )
                current = self._schema_version()  # again: another process may have migrated
                if current < SCHEMA_VERSION:
                    self._migrate(current)
                    current = SCHEMA_VERSION
            else:
                current = self._schema_version() if self.one(self._dialect._schema_table_sql())[0] else 0
            self._dialect._finish(commit=True)
            return current
        except BaseException:
            self._end_after_error(commit=False)
            raise
        finally:
            cursor, self._cursor = self._cursor, None
            if cursor is not None:
                with contextlib.suppress(Exception):
                    cursor.close()

    def _schema_version(self) -> int:
        row = self.one("SELECT MAX(version) FROM longrun_schema")
        current = row[0] if row is not None and row[0] is not None else 0
        if not isinstance(current, int):
            raise SchemaVersionError(f"{self!r}: the schema version table holds {current!r}, not a version number")
        if current > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{self!r}: the database has longrun schema version {current}, newer than this code knows "
                f"({SCHEMA_VERSION}); upgrade longrun to use this database"
            )
        return current

    def _migrate(self, current: int) -> None:
        dialect = self._dialect
        for version, description, statements in migrations(dict(dialect.types), dialect._routines(), dialect._status_counters()):
            if version <= current:
                continue
            for statement in statements:
                self.run(statement)
            self._dialect._migrated(version)
            self.run(
                f"INSERT INTO longrun_schema (version, applied_at, description) VALUES (?, {self._dialect._now_sql()}, ?)",
                (version, description),
            )
            log.info("%r: schema migrated to version %d (%s)", self, version, description)

    @contextlib.contextmanager
    def transaction(self, task_id: str, *, create: bool, write: bool = True) -> Generator[None, None, None]:
        check_task_id(task_id)
        with self.session(write=write, what=f"access task {task_id!r}"):
            if create:
                cursor = self.run(
                    f"INSERT INTO longrun_tasks (task_id, created_at, revision_floor) VALUES (?, {self._dialect._now_sql()}, 0) "
                    "ON CONFLICT (task_id) DO NOTHING",
                    (task_id,),
                )
                if cursor.rowcount == 1:  # a new task: its summary row, in the same transaction
                    self.run(
                        "INSERT INTO longrun_summaries (task_id, status, revision, created_at, next_action) "
                        "SELECT task_id, 'new', 0, created_at, '' FROM longrun_tasks WHERE task_id = ?",
                        (task_id,),
                    )
            if self.one(self._dialect._lock_task_sql(write=write), (task_id,)) is None:
                raise UnknownTaskError(f"no task {task_id!r} in {self!r}")
            yield
