"""The fleet tables' connection: one transaction at a time, and the tables, their triggers and
schema version created on first use (adopting every durable task already stored).

``QueueConnection`` is the base of ``TaskQueue`` (``_queue``): the operations on the tables are
there and in ``_queue_workers``; this module owns how they reach the database.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Generator, Sequence

from ..canonical import parse_json
from ..errors import CorruptStateError, LongrunError, SchemaVersionError, StorageError
from ..outcome import TERMINAL
from ..protocols import Store
from ._fleet_sql import FUNCTION_STEP, NOTIFY_CHANNEL, Dialect, tables

__all__ = ["MAX_ROW_BYTES", "SCHEMA_VERSION", "QueueConnection"]

log = logging.getLogger("longrun")

SCHEMA_VERSION = 1
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



class QueueConnection:
    """A connection to one store's fleet tables, and the tables' creation (see the module docstring)."""

    def __init__(self, dialect: Dialect, store: Store):
        self._dialect = dialect
        self.store = store
        self._lock = threading.Lock()
        self._connection: Any = None
        self._cursor: Any = None
        self._ready = False
        self._slot_rows: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"TaskQueue({self._dialect.describe()})"

    @property
    def in_store(self) -> bool:
        """Whether triggers keep the index current (else ``rescan`` must poll the store)."""
        return self._dialect.in_store

    @property
    def notifies(self) -> bool:
        return self._dialect.notify

    # -- connection and transactions ----------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        connection, self._connection, self._cursor = self._connection, None, None
        self._ready = False
        if connection is not None:
            with contextlib.suppress(Exception):
                connection.close()

    def _sql(self, statement: str) -> str:
        statement = statement.replace("{now}", self._dialect.now_sql)
        return statement if self._dialect.placeholder == "?" else statement.replace("?", self._dialect.placeholder)

    def _run(self, statement: str, params: Sequence[object] = ()) -> Any:
        if params:
            self._cursor.execute(self._sql(statement), tuple(params))
        else:  # no parameters: no placeholder parsing either (a trigger body may hold any text)
            self._cursor.execute(self._sql(statement))
        return self._cursor

    def _one(self, statement: str, params: Sequence[object] = ()) -> Any:
        return self._run(statement, params).fetchone()

    def _all(self, statement: str, params: Sequence[object] = ()) -> list[Any]:
        return list(self._run(statement, params).fetchall())

    @contextlib.contextmanager
    def _session(self, what: str, *, write: bool = True) -> Generator[None, None, None]:
        with self._lock:
            if not self._ready:
                self._prepare()
            errors = self._dialect.errors()
            try:
                self._cursor = self._connection.cursor()
                self._dialect.begin(self._run, write=write)
            except errors as exc:
                self._drop()
                raise StorageError(f"{self!r}: cannot open a transaction to {what}: {exc}") from exc
            try:
                yield
            except BaseException as exc:
                try:
                    self._dialect.end(self._connection, commit=False)
                except Exception:  # the connection is in an unknown state: never reuse it
                    self._drop()
                if isinstance(exc, errors) and not isinstance(exc, LongrunError):
                    self._drop()
                    raise StorageError(f"{self!r}: cannot {what}: {exc}") from exc
                raise
            else:
                try:
                    self._dialect.end(self._connection, commit=True)
                except errors as exc:
                    self._drop()
                    raise StorageError(f"{self!r}: the transaction to {what} did not commit: {exc}") from exc
            finally:
                self._cursor = None

    def _prepare(self) -> None:
        """Connect, and create or check the tables (once per connection)."""
        if self._dialect.in_store:
            self.store.list_tasks()  # the store's own tables first: the triggers are on them
        errors = self._dialect.errors()
        try:
            self._connection = self._dialect.connect()
        except LongrunError:
            raise
        except Exception as exc:
            raise StorageError(f"{self!r}: cannot connect: {exc}") from exc
        errors = self._dialect.errors()
        try:
            self._cursor = self._connection.cursor()
            self._dialect.begin(self._run, write=False)
            exists = bool(self._one(self._dialect.schema_exists_sql())[0])
            version = int(self._one("SELECT MAX(version) FROM longrun_fleet_schema")[0] or 0) if exists else 0
            self._dialect.end(self._connection, commit=True)
            if version > SCHEMA_VERSION:
                raise SchemaVersionError(
                    f"{self!r}: the fleet tables have version {version}, newer than this code knows ({SCHEMA_VERSION})"
                )
            if version < SCHEMA_VERSION:
                self._cursor = self._connection.cursor()
                self._dialect.begin(self._run, write=True)
                self._create()
                self._dialect.end(self._connection, commit=True)
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
        dialect = self._dialect
        dialect.lock_schema(self._run)
        self._run(
            f"CREATE TABLE IF NOT EXISTS longrun_fleet_schema (version INTEGER PRIMARY KEY, "
            f"applied_at {dialect.float_type} NOT NULL, description TEXT NOT NULL)"
        )
        if int(self._one("SELECT COALESCE(MAX(version), 0) FROM longrun_fleet_schema")[0]) >= SCHEMA_VERSION:
            return  # another process got here first
        for statement in tables(dialect) + dialect.triggers():
            self._run(statement)
        adopted = 0
        if dialect.in_store:
            rows = self._all(
                "SELECT e.task_id, e.record, s.status FROM longrun_effects e LEFT JOIN longrun_states s ON s.task_id = e.task_id "
                f"WHERE e.step_id = '{FUNCTION_STEP}'"
            )
            for task_id, body, status in rows:
                found = _function_record(body)
                if found is None:
                    continue
                adopted += self._adopt(str(task_id), found[0], found[1], str(status) if status is not None else "new")
        self._run(
            "INSERT INTO longrun_fleet_schema (version, applied_at, description) VALUES (?, {now}, ?)",
            (SCHEMA_VERSION, "the due-time index, workers and action slots"),
        )
        log.info("%r: fleet tables created (version %d); %d stored tasks adopted", self, SCHEMA_VERSION, adopted)

    def _adopt(self, task_id: str, function: str, parent: str | None, status: str, fingerprint: str | None = None) -> int:
        due = "NULL" if status in _TERMINAL_VALUES else "{now}"
        cursor = self._run(
            "INSERT INTO longrun_queue (task_id, function, parent, wake_at, status, fingerprint, updated_at) "
            f"VALUES (?, ?, ?, {due}, ?, ?, {{now}}) ON CONFLICT (task_id) DO NOTHING",
            (task_id, function, parent, status, fingerprint),
        )
        return 1 if cursor.rowcount == 1 else 0

    def _notify(self) -> None:
        if self._dialect.notify:
            self._run(f"SELECT pg_notify('{NOTIFY_CHANNEL}', '')")
