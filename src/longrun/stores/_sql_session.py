"""The connection under the SQL stores: one DB-API connection, its transactions, the schema's
creation and migration.

``SqlConnection`` is the base of ``SqlStore`` (``stores._sql``); the dialect methods marked so below
are supplied by ``SqliteStore`` and ``PostgresStore``. The schema itself is in ``stores._sql_schema``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Generator, Self, Sequence

from ..contract import check_task_id
from ..errors import LongrunError, SchemaVersionError, StorageError, UnknownTaskError
from ._sql_schema import SCHEMA_VERSION, migrations
from .base import BaseStore

__all__ = ["SqlConnection"]

log = logging.getLogger("longrun")


class SqlConnection(BaseStore):
    """``BaseStore``'s connection to an SQL database. Subclasses supply the dialect (methods marked so below).

    One connection per store instance, opened on first use and reopened after it breaks; a lock
    lets one thread at a time use it, for one whole transaction. So an instance may be shared by
    threads (a runner's lease-renewal thread and its main loop, a pool running many tasks): their
    transactions take turns, and the per-task state the instance keeps (the rows it knows are
    stored, the revision it last committed) is read and changed only inside them. For transactions
    in parallel, give each thread its own instance.
    """

    placeholder = "?"
    """How the driver marks a parameter; statements here are written with ``?``."""
    types = {"int": "BIGINT", "float": "DOUBLE PRECISION", "serial": "INTEGER PRIMARY KEY", "bytes": "BLOB"}
    """The dialect's column types for the schema's integers, floats, the quarantine's row id and bytes."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._connection: Any = None
        self._cursor: Any = None
        self._schema_checked = False
        self._keep_writes = False

    # -- dialect: a subclass provides these ---------------------------------------------------

    def _connect(self) -> Any:
        """A new DB-API connection with no transaction open."""
        raise NotImplementedError

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        """The exception classes the driver raises, translated to ``StorageError``."""
        raise NotImplementedError

    def _begin(self, *, write: bool) -> None:
        raise NotImplementedError

    def _finish(self, *, commit: bool) -> None:
        raise NotImplementedError

    def _lock_schema(self) -> None:
        """Serialize schema creation between processes (inside the schema transaction)."""

    def _lock_task_sql(self, *, write: bool) -> str:
        """The statement that reads (and in a write transaction locks) a task's row."""
        return "SELECT task_id FROM longrun_tasks WHERE task_id = ?"

    def _now_sql(self) -> str:
        """An SQL expression for the database's clock, in seconds since the epoch."""
        raise NotImplementedError

    # -- connection and transactions ----------------------------------------------------------

    def close(self) -> None:
        """Close the connection (a later call opens a new one)."""
        with self._lock:
            self._drop_connection()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _drop_connection(self) -> None:
        connection, self._connection, self._cursor = self._connection, None, None
        self._schema_checked = False
        if connection is not None:
            with contextlib.suppress(Exception):  # it may already be broken; nothing to save
                connection.close()

    def _sql(self, statement: str) -> str:
        return statement if self.placeholder == "?" else statement.replace("?", self.placeholder)

    def _run(self, statement: str, params: Sequence[object] = ()) -> Any:
        """Execute one statement in the open transaction; the one place SQL reaches the driver."""
        self._cursor.execute(self._sql(statement), tuple(params))
        return self._cursor

    def _run_many(self, statement: str, rows: Sequence[Sequence[object]]) -> None:
        for row in rows:
            self._run(statement, row)

    def _one(self, statement: str, params: Sequence[object] = ()) -> Any:
        return self._run(statement, params).fetchone()

    def _all(self, statement: str, params: Sequence[object] = ()) -> list[Any]:
        return list(self._run(statement, params).fetchall())

    @contextlib.contextmanager
    def _session(self, *, write: bool, what: str) -> Generator[None, None, None]:
        """One database transaction, with the driver's errors translated to ``StorageError``."""
        with self._lock:
            if self._connection is None:
                try:
                    self._connection = self._connect()
                except LongrunError:
                    raise
                except Exception as exc:  # whatever the driver or the caller's factory raises
                    raise StorageError(f"{self!r}: cannot connect: {exc}") from exc
            errors = self._driver_errors()
            try:
                if not self._schema_checked:
                    self._ensure_schema()
                self._cursor = self._connection.cursor()
                self._begin(write=write)
            except LongrunError:
                self._drop_connection()
                raise
            except errors as exc:
                self._drop_connection()
                raise StorageError(f"{self!r}: cannot open a transaction to {what}: {exc}") from exc
            self._keep_writes = False
            try:
                yield
            except BaseException as exc:
                keep = self._keep_writes and isinstance(exc, LongrunError)
                self._end_after_error(commit=keep)
                if isinstance(exc, errors) and not isinstance(exc, LongrunError):
                    raise StorageError(f"{self!r}: cannot {what}: {exc}") from exc
                raise
            else:
                try:
                    self._finish(commit=True)
                except errors as exc:
                    self._end_after_error(commit=False)
                    raise StorageError(f"{self!r}: the transaction to {what} did not commit: {exc}") from exc
            finally:
                cursor, self._cursor = self._cursor, None
                self._keep_writes = False
                if cursor is not None:
                    with contextlib.suppress(Exception):  # a cursor of a broken connection
                        cursor.close()

    def _end_after_error(self, *, commit: bool) -> None:
        try:
            self._finish(commit=commit)
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
            self._refuse_without_schema()
        if current < SCHEMA_VERSION:
            self._schema_step(write=True)
        self._schema_checked = True

    def _schema_step(self, *, write: bool) -> int:
        """In one transaction, read the schema version and (``write``) create or migrate to ours."""
        self._cursor = self._connection.cursor()
        self._begin(write=write)
        try:
            if write:
                self._lock_schema()
                self._run(
                    f"""CREATE TABLE IF NOT EXISTS longrun_schema (
                        version INTEGER PRIMARY KEY,
                        applied_at {self.types['float']} NOT NULL,
                        description TEXT NOT NULL)"""
                )
                current = self._schema_version()  # again: another process may have migrated
                if current < SCHEMA_VERSION:
                    self._migrate(current)
                    current = SCHEMA_VERSION
            else:
                current = self._schema_version() if self._one(self._schema_table_sql())[0] else 0
            self._finish(commit=True)
            return current
        except BaseException:
            self._end_after_error(commit=False)
            raise
        finally:
            cursor, self._cursor = self._cursor, None
            if cursor is not None:
                with contextlib.suppress(Exception):
                    cursor.close()

    def _refuse_without_schema(self) -> None:
        """Called before the schema is created where none is: raise ``NotAStoreError`` if this
        store may not create it (the ``longrun_schema`` table is the store's marker)."""

    def _schema_table_sql(self) -> str:
        """A query whose one row's first value is true if ``longrun_schema`` exists (dialect)."""
        raise NotImplementedError

    def _schema_version(self) -> int:
        row = self._one("SELECT MAX(version) FROM longrun_schema")
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
        for version, description, statements in migrations(self.types):
            if version <= current:
                continue
            for statement in statements:
                self._run(statement)
            self._run(
                f"INSERT INTO longrun_schema (version, applied_at, description) VALUES (?, {self._now_sql()}, ?)",
                (version, description),
            )
            log.info("%r: schema migrated to version %d (%s)", self, version, description)

    @contextlib.contextmanager
    def _transaction(self, task_id: str, *, create: bool, write: bool = True) -> Generator[None, None, None]:
        check_task_id(task_id)
        with self._session(write=write, what=f"access task {task_id!r}"):
            if create:
                self._run(
                    f"INSERT INTO longrun_tasks (task_id, created_at, revision_floor) VALUES (?, {self._now_sql()}, 0) "
                    "ON CONFLICT (task_id) DO NOTHING",
                    (task_id,),
                )
            if self._one(self._lock_task_sql(write=write), (task_id,)) is None:
                raise UnknownTaskError(f"no task {task_id!r} in {self!r}")
            yield
