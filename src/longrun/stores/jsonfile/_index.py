"""The JSON-file store's summary index: a row per task in ``ROOT/.summaries.sqlite``, so that a
listing, a filter, a page or a count costs O(page), not a load of every task. How many tasks
have each status is kept in ``status_counts`` by triggers on the rows, in each row write's own
transaction, so the counts read a few rows.

The task files are the state of record; the index is derived from them and kept beside them (a
dot name, never a task id). A row holds the task's summary (``longrun.summary``) and a ``dirty``
mark: set when the row may trail the files because a process may write them.

The protocol (the store calls these, each inside the task's exclusive flock):

1. ``mark``: before a lease is written that lets a process write the task's files (an acquisition,
   a renewal not yet marked), and before a deletion renames the directory away, the row is set
   dirty (made if missing, status ``new``) in a transaction synced to disk (``synchronous=FULL``).
   It fails the lease write with ``StorageError`` if it cannot be made: no file write is ever
   made that a dirty mark does not precede.
2. ``put``: after a commit's journal line is durable, the row takes the committed state's
   summary (not synced: the dirty mark already is). If that fails, it is logged, and the row
   stays dirty. A commit that leaves the task running, as its row already says, is written at
   most once a second (``INDEX_ROW_INTERVAL_S``): the commits between are written by the next
   one due, the next lease renewal or the release, whichever comes first; so an effect costs no
   index write.
3. ``settle``: when the holder releases its lease, the row takes the last commit's summary and
   its mark is cleared if the holder wrote the row after each of its commits in that lease (nothing failed).
4. A reader first verifies each dirty row whose holder is gone (no process on this machine holds
   the task's holder lock, ``_holders``): under the task's shared flock it reads the files,
   writes the row from them and clears the mark (or deletes the row of a task whose directory is
   gone). A row whose holder lives is the one that holder wrote last (step 2).

What this guarantees: a commit that returned is in its task's row, or the row is dirty. A crash
(SIGKILL, power loss) between a commit's journal write and its row write leaves the row dirty and
behind by at most a second of running commits, or by that stop; the first listing after the crashed process is gone (its holder lock
is freed by the kernel when it dies) reads the task's files and shows the committed status. While
the writer lives, its row's status is its last commit's (a status change is written at once); a
running task's revision, time and next action may trail by up to a second, or until its next
lease renewal if it commits nothing more. An index that is missing, of
another version, or damaged (moved aside as ``.summaries.sqlite.damaged.<time>``) is rebuilt from
every task's files by the next listing, once: O(tasks).

Not guaranteed: that files changed by anything but a store that keeps this protocol (an older
longrun, a task directory copied in or edited by hand) show in the index; removing the file
rebuilds it. A task directory whose creation was cut short before its first lease record was
written holds nothing and is not listed. The file is reached with ``sqlite3``, not through the
store's ``FileIO`` (the fault tests' file calls are the task files').
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import stat
import threading
import time
from typing import Any, Callable, Sequence, TypeVar

from ...errors import CorruptStateError, StorageError
from .._fileio import FileIO
from ...summary import (
    FUNCTION_NAMES_SQL, NEW, STATUS_COUNTS_SQL, SUMMARY_COLUMNS, SummaryQuery, TaskSummary, fill_status_counts, sqlite_status_counters,
)  # fmt: skip

__all__ = ["INDEX_FILE", "SummaryIndex"]

log = logging.getLogger("longrun")

INDEX_FILE = ".summaries.sqlite"
VERSION = "2"
"""Version 2 adds the status counts (``status_counts``, kept by triggers on ``summaries``); a
version 1 index gets them built from its rows in place, any other version is rebuilt."""
_T = TypeVar("_T")

_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS summaries (
        task_id TEXT PRIMARY KEY,
        status TEXT NOT NULL,
        revision INTEGER NOT NULL,
        function TEXT,
        parent TEXT,
        created_at REAL,
        updated_at REAL,
        wake_at REAL,
        error TEXT,
        next_action TEXT NOT NULL,
        dirty INTEGER NOT NULL DEFAULT 1)""",
    "CREATE INDEX IF NOT EXISTS summaries_updated ON summaries (updated_at DESC, task_id DESC)",
    "CREATE INDEX IF NOT EXISTS summaries_status ON summaries (status, updated_at DESC, task_id DESC)",
    "CREATE INDEX IF NOT EXISTS summaries_function ON summaries (function, updated_at DESC, task_id DESC)",
    "CREATE INDEX IF NOT EXISTS summaries_parent ON summaries (parent)",
    "CREATE INDEX IF NOT EXISTS summaries_dirty ON summaries (task_id) WHERE dirty = 1",
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
]
_COUNTERS = [*sqlite_status_counters("summaries", "status_counts"), "DELETE FROM status_counts", fill_status_counts("summaries", "status_counts")]
"""How many rows have each status, kept by triggers as rows are written, in the same transaction."""
_UPSERT = (
    f"INSERT INTO summaries ({SUMMARY_COLUMNS}, dirty) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (task_id) DO UPDATE SET status = excluded.status, revision = excluded.revision, "
    "function = excluded.function, parent = excluded.parent, created_at = excluded.created_at, "
    "updated_at = excluded.updated_at, wake_at = excluded.wake_at, error = excluded.error, next_action = excluded.next_action"
)
_NAMES = SUMMARY_COLUMNS.split(", ")


def _regexp(pattern: str, text: object) -> bool:
    return isinstance(text, str) and re.search(pattern, text) is not None


class SummaryIndex:
    """The index file of one store root, one connection per store object (threads take turns)."""

    def __init__(self, root: str, label: str, tasks: Callable[[], list[str]], io: FileIO):
        self.path = os.path.join(root, INDEX_FILE)
        self._io = io
        """The store's file calls (made, checked, moved aside); SQLite's own reads and writes are its."""
        self._label = label
        self._tasks = tasks
        """The store's task ids (its directories): an index made where there are none but the
        one being marked is complete at once, with nothing to build."""
        self._lock = threading.RLock()
        self._connection: sqlite3.Connection | None = None
        self._pid = 0

    # -- the connection --------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            connection, self._connection = self._connection, None
            if connection is not None and self._pid == os.getpid():
                connection.close()

    def _connect(self, newcomer: str | None = None) -> sqlite3.Connection:
        if self._connection is not None and self._pid == os.getpid():
            return self._connection
        self._connection = None  # one made before a fork is the parent's: never used (nor closed) here
        try:
            connection = self._open(newcomer)
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError):
                raise
            # Not a database (damaged, or another file under the name): it is derived data, so it is
            # set aside for whoever wants to look, and made again from the task files.
            aside = f"{self.path}.damaged.{time.time_ns()}"
            log.warning("%s: the summary index %s is damaged (%s); moved to %s and rebuilt from the task files", self._label, self.path, exc, aside)
            self._io.replace(self.path, aside)
            for suffix in ("-wal", "-shm"):
                if self._lstat(self.path + suffix) is not None:
                    self._io.replace(self.path + suffix, aside + suffix)
            connection = self._open(newcomer)
        self._connection, self._pid = connection, os.getpid()
        return connection

    def _open(self, newcomer: str | None) -> sqlite3.Connection:
        info = self._lstat(self.path)
        if info is None:
            # Owner-only, before SQLite creates it with the umask's mode.
            try:
                self._io.close(self._io.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600))
            except FileExistsError:
                pass
            info = self._io.lstat(self.path)
        if not stat.S_ISREG(info.st_mode):
            raise StorageError(f"{self._label}: the summary index {self.path!r} is not a regular file (symlinks are refused)")
        connection = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
        try:
            connection.execute("PRAGMA busy_timeout=30000")
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")
            connection.create_function("regexp", 2, _regexp, deterministic=True)
            row = connection.execute("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone()
            version = connection.execute("SELECT value FROM meta WHERE name = 'version'").fetchone() if row[0] else None
            if version is None or version[0] != VERSION:
                connection.execute("BEGIN IMMEDIATE")
                try:
                    if version is not None and version[0] != "1":  # another version's layout: made again from the files
                        connection.execute("DROP TABLE IF EXISTS summaries")
                        connection.execute("DROP TABLE IF EXISTS status_counts")
                        connection.execute("DELETE FROM meta")
                    for statement in (*_SCHEMA, *_COUNTERS):  # version 1's rows are kept and counted
                        connection.execute(statement)
                    connection.execute("INSERT INTO meta (name, value) VALUES ('version', ?) ON CONFLICT (name) DO UPDATE SET value = excluded.value", (VERSION,))
                    if not set(self._tasks()) - {newcomer}:
                        connection.execute("INSERT INTO meta (name, value) VALUES ('built', '1') ON CONFLICT (name) DO NOTHING")
                    connection.execute("COMMIT")
                except BaseException:
                    connection.execute("ROLLBACK")
                    raise
        except BaseException:
            connection.close()
            raise
        return connection

    def _lstat(self, path: str) -> os.stat_result | None:
        try:
            return self._io.lstat(path)
        except FileNotFoundError:
            return None

    def _run(self, what: str, work: Callable[[sqlite3.Connection], _T], newcomer: str | None = None) -> _T:
        """``work`` on the connection, in this object's turn; a database error becomes ``StorageError``."""
        with self._lock:
            try:
                return work(self._connect(newcomer))
            except StorageError:
                raise
            except (sqlite3.Error, OSError) as exc:
                connection = self._connection
                self._connection = None  # the next call opens it again: whatever state this one is in is dropped
                if connection is not None:
                    connection.close()  # rolls back an open transaction
                raise StorageError(f"{self._label}: cannot {what} in the summary index {self.path}: {exc}") from exc

    # -- the writer's side ---------------------------------------------------------------------

    def mark(self, task_id: str) -> None:
        """Set the task's row dirty (made, status ``new``, if missing), synced to disk before this returns."""

        def work(connection: sqlite3.Connection) -> None:
            connection.execute("PRAGMA synchronous=FULL")
            try:
                connection.execute(
                    f"INSERT INTO summaries ({SUMMARY_COLUMNS}, dirty) VALUES (?, ?, 0, NULL, NULL, NULL, NULL, NULL, NULL, '', 1) "
                    "ON CONFLICT (task_id) DO UPDATE SET dirty = 1",
                    (task_id, NEW),
                )
            finally:
                connection.execute("PRAGMA synchronous=NORMAL")

        self._run(f"mark task {task_id!r}", work, task_id)

    def put(self, summary: TaskSummary) -> None:
        """Write the task's row from ``summary`` (a new row is dirty; an existing one keeps its mark)."""
        self._run(f"write the summary of {summary.task_id!r}", lambda connection: connection.execute(_UPSERT, (*summary.to_json().values(), 1)))

    def settle(self, task_id: str) -> None:
        """Clear the task's dirty mark: its row is the summary of its files."""
        self._run(f"settle task {task_id!r}", lambda connection: connection.execute("UPDATE summaries SET dirty = 0 WHERE task_id = ?", (task_id,)))

    def verified(self, summary: TaskSummary | None, task_id: str, *, settle: bool) -> None:
        """A reader's verdict from the files: the row written (its mark cleared with ``settle``), or
        deleted where ``summary`` is None (the task is gone)."""

        def work(connection: sqlite3.Connection) -> None:
            if summary is None:
                connection.execute("DELETE FROM summaries WHERE task_id = ?", (task_id,))
            else:
                connection.execute(_UPSERT, (*summary.to_json().values(), 0 if settle else 1))
                if settle:
                    connection.execute("UPDATE summaries SET dirty = 0 WHERE task_id = ?", (task_id,))

        self._run(f"write the summary of {task_id!r}", work)

    def remove(self, task_id: str) -> None:
        self._run(f"remove task {task_id!r}", lambda connection: connection.execute("DELETE FROM summaries WHERE task_id = ?", (task_id,)))

    # -- the reader's side ---------------------------------------------------------------------

    def built(self) -> bool:
        """Whether every task's row was made once (by ``set_built``, after a rebuild)."""
        row = self._run("read", lambda connection: connection.execute("SELECT value FROM meta WHERE name = 'built'").fetchone())
        return row is not None

    def set_built(self) -> None:
        self._run("record the rebuild", lambda connection: connection.execute("INSERT INTO meta (name, value) VALUES ('built', '1') ON CONFLICT (name) DO NOTHING"))

    def dirty(self) -> list[str]:
        rows = self._run("read", lambda connection: connection.execute("SELECT task_id FROM summaries WHERE dirty = 1").fetchall())
        return [str(row[0]) for row in rows]

    def query(self, query: SummaryQuery) -> list[TaskSummary]:
        tail, params = query.sql("task_id REGEXP ?")
        rows = self._run("list", lambda connection: connection.execute(f"SELECT {SUMMARY_COLUMNS} FROM summaries{tail}", params).fetchall())
        return [self._summary(row) for row in rows]

    def counts(self) -> dict[str, int]:
        rows = self._run("count", lambda connection: connection.execute(STATUS_COUNTS_SQL.format(counts="status_counts")).fetchall())
        return {str(value): int(count) for value, count in rows}

    def function_names(self) -> list[str]:
        rows = self._run("list the functions", lambda connection: connection.execute(FUNCTION_NAMES_SQL.format(table="summaries")).fetchall())
        return sorted(str(row[0]) for row in rows)

    def count(self, query: SummaryQuery) -> int:
        where, params = query.sql("task_id REGEXP ?", count=True)
        row = self._run("count", lambda connection: connection.execute(f"SELECT COUNT(*) FROM summaries{where}", params).fetchone())
        return int(row[0])

    def _summary(self, row: Sequence[Any]) -> TaskSummary:
        try:
            return TaskSummary.from_json(dict(zip(_NAMES, row)))
        except CorruptStateError as exc:
            raise CorruptStateError(f"{self._label}: the summary row of task {str(row[0])!r:.80} in {self.path} is damaged: {exc}") from exc
