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
- A broken connection is closed and a new one made on the next call; a commit whose outcome is
  unknown (the connection died during COMMIT) poisons the task until it is loaded again.

Not guaranteed: anything if the database itself loses committed transactions (run it with
``fsync=on`` and ``synchronous_commit=on``, the defaults), or exclusion against someone who
writes to the tables directly.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from ..errors import InvalidInputError, NotAStoreError
from ._sql import SqlStore

__all__ = ["PostgresStore", "driver_errors"]

_SCHEMA_LOCK = 0x6C6F6E6772756E  # "longrun": serializes schema creation across processes


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
        # so its first statement is its first real one; a read sets REPEATABLE READ, READ ONLY.
        if not write:
            self._db.run("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")

    def _finish(self, *, commit: bool) -> None:
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

    def _clock(self, now: float) -> float:
        row = self._db.one(f"SELECT {self._now_sql()}")
        return float(row[0])


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
