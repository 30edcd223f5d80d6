"""The SQLite store: many tasks in one database file, for the processes of one machine.

``SqliteStore(path)`` keeps every task's lease, state and control records in one SQLite file
through the standard library's ``sqlite3``: WAL journal, ``synchronous=FULL`` (a commit is on
disk when it returns), explicit ``BEGIN IMMEDIATE`` for every write so the fence check and the
write it guards hold the database's write lock together, deferred read transactions (a reader
sees one consistent snapshot and never blocks a writer), and a busy timeout so writers queue
rather than fail. The file (and SQLite's ``-wal`` and ``-shm`` files beside it) is created
owner-only. The schema, damage handling and the database's own fence are described in
``longrun.stores._sql``.

Lease expiry is judged by the caller's clock, as with the JSON-file store: every process on one
machine reads the same clock. As there too, a lease's holder keeps a kernel lock for the lease's
life (``stores._holders``), one file per task in ``<database>-leases/``, so a holder that died is
taken over at once rather than at its expiry.

The witness. A database file that is emptied, replaced by an older copy, or loses its ``-wal`` file
is a consistent, older database: nothing inside it can tell. So every lease write (acquisition,
renewal, release) also records the task's epoch and committed revision in a small file outside the
database, ``PATH-witness/<task id>.json`` (checksummed, written atomically, values only ever
raised, written only when they change), inside the same transaction. It names only what the
database had already committed (the task's ``revision_floor``) and an epoch, which serves only as a
floor for the next one, so a crash at any point leaves it at or below the database. A load whose
state is below it, or finds none where it names one, stops ``state-unrecoverable``
(``stores.base``, invariant 7). Deleting the database to start afresh means deleting that directory
too. Not caught: commits made since the task's last lease write, or the directory lost with the
database.

Not guaranteed: exclusion or durability on a network file system (SQLite's locks are not
trustworthy there; use ``PostgresStore`` for several machines), or progress while another process
is stopped inside a transaction (writers wait up to ``busy_timeout_s``, then get ``StorageError``).
"""

from __future__ import annotations

import os
import re
import sqlite3
import stat
import time
import urllib.parse
from typing import Any

from ..canonical import JSONValue, canonical_bytes, parse_json, sha256_hex
from ..errors import CorruptStateError, InvalidInputError, NotAStoreError, StorageError
from ..lease import Lease
from ._fileio import FileIO, ensure_dir, ensure_dirs, read_small, write_atomic
from ._holders import HolderLocks
from ._sql import SqlStore
from .base import Witness

__all__ = ["SqliteStore"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
WITNESS_SUFFIX = "-witness"
WITNESS_FORMAT = "longrun.witness"
MAX_WITNESS_BYTES = 4096
_WITNESS_FIELDS = frozenset({"format", "task_id", "epoch", "revision", "checksum"})


def _decode_witness(data: bytes, task_id: str) -> tuple[int, int]:
    """A witness file's (epoch, revision); ``CorruptStateError`` unless it is whole and this task's."""
    document = parse_json(data, what="witness file", max_bytes=MAX_WITNESS_BYTES, unique_keys=True)
    if not isinstance(document, dict) or set(document) != _WITNESS_FIELDS or document["format"] != WITNESS_FORMAT:
        raise CorruptStateError(f"not a {WITNESS_FORMAT} record")
    body = {key: value for key, value in document.items() if key != "checksum"}
    if document["checksum"] != "sha256:" + sha256_hex(canonical_bytes(body)):
        raise CorruptStateError("witness checksum does not match its content")
    epoch, revision = document["epoch"], document["revision"]
    if not (_count(epoch) and _count(revision)):
        raise CorruptStateError("witness epoch and revision must be integers >= 0")
    assert isinstance(epoch, int) and isinstance(revision, int)
    if document["task_id"] != task_id:
        raise CorruptStateError(f"witness names task {document['task_id']!r:.80}, not {task_id!r}")
    return epoch, revision


def _regexp(pattern: str, text: object) -> bool:
    return isinstance(text, str) and re.search(pattern, text) is not None


def _count(value: object) -> bool:
    return type(value) is int and 0 <= value < 2**63


_SQLITE_NOTADB = 26
"""SQLITE_NOTADB: the file is not a database. (The header is not read apart: closing any other
descriptor of the database file would drop the POSIX locks this process's connections hold on it.)"""


class SqliteStore(SqlStore):
    """A store in one SQLite database file.

    The file must exist, unless ``create=True``: then it is made owner-only on first use, with any
    missing parent directories (owner-only). Without it the first call on a missing file raises
    ``InvalidInputError`` and nothing is created, so a path that names the wrong place (a typo, a
    volume that is not mounted) cannot start every task afresh in a new, empty database; a missing
    directory is refused already here. An empty file is a new store: the tables are created on
    first use. A database that holds tables but not longrun's (another application's) is refused
    the same way, unchanged, unless ``create=True``.

    One store object may be shared by threads: it holds one connection (``check_same_thread``
    off) and a lock lets one thread at a time use it, for one whole transaction.
    """

    placeholder = "?"
    types = {"int": "INTEGER", "float": "REAL", "serial": "INTEGER PRIMARY KEY AUTOINCREMENT", "bytes": "BLOB", "desc": "DESC"}
    _reads_take_a_snapshot = True

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_s: float = 30.0, create: bool = False):
        super().__init__()
        self.path = os.path.abspath(os.fspath(path))
        self.spec = "sqlite:" + self.path
        if isinstance(busy_timeout_s, bool) or not isinstance(busy_timeout_s, (int, float)) or not busy_timeout_s >= 0:
            raise InvalidInputError(f"busy_timeout_s must be a non-negative number, got {busy_timeout_s!r}")
        self.busy_timeout_s = float(busy_timeout_s)
        self.create = bool(create)
        self._check_path()
        self._io = FileIO()
        self._holders = HolderLocks(lambda task_id: os.path.join(self.path + "-leases", task_id + ".lock"), make_parent=True)

    def __repr__(self) -> str:
        return f"SqliteStore({self.path!r})"

    def _check_path(self, *, connecting: bool = False) -> None:
        """Refuse a path that is not a regular file; without ``create``, one whose directory is
        missing, and (``connecting``: the connection would create it) one that does not exist."""
        directory = os.path.dirname(self.path)
        if not self.create and not os.path.isdir(directory):
            raise InvalidInputError(f"SQLite store {self.path!r}: directory {directory!r} does not exist")
        try:
            info = os.lstat(self.path)
        except FileNotFoundError:
            if connecting and not self.create:
                raise InvalidInputError(
                    f"SQLite store {self.path!r} does not exist; create it, or open the store with create=True"
                ) from None
            return
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISREG(info.st_mode):
            raise InvalidInputError(f"SQLite store {self.path!r} is not a regular file (symlinks are refused)")


    def _connect(self) -> Any:
        self._check_path(connecting=True)
        if self.create:
            try:
                ensure_dirs(FileIO(), os.path.dirname(self.path))
                # Create the file owner-only before SQLite does (it would use the umask); SQLite
                # gives its -wal and -shm files the database file's permissions.
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600)
            except FileExistsError:
                pass
            else:
                os.close(fd)
            target = self.path
        else:
            # mode=rw: should the file vanish after the check, SQLite refuses instead of creating it.
            target = "file:" + urllib.parse.quote(self.path) + "?mode=rw"
        connection = sqlite3.connect(
            target, timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=False, uri=not self.create
        )
        try:
            try:
                connection.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
            except sqlite3.DatabaseError as exc:
                if getattr(exc, "sqlite_errorcode", None) == _SQLITE_NOTADB:
                    raise NotAStoreError(
                        f"SQLite store {self.path!r} is not a longrun store: it is not an SQLite database; nothing was changed",
                        path=self.path,
                    ) from None
                raise
            if not self.create:
                self._refuse_foreign(connection)
            mode = self._enter_wal(connection)
            if str(mode).lower() != "wal":
                raise StorageError(f"{self!r}: SQLite refused WAL mode (journal_mode is {mode!r})")
            connection.execute("PRAGMA synchronous=FULL")
            connection.execute("PRAGMA foreign_keys=ON")
            connection.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_s * 1000)}")
            # ``task_id REGEXP ?`` for a listing's glob (``summary.glob_regex``): Python's ``re``, as
            # the store without an index matches.
            connection.create_function("regexp", 2, _regexp, deterministic=True)
        except BaseException:
            connection.close()
            raise
        return connection

    def _refuse_foreign(self, connection: sqlite3.Connection) -> None:
        """Without ``create``, refuse a database whose tables are all another application's, before
        anything is written to it (even the switch to WAL): a path that names the wrong file must
        not turn that file into a longrun store. A database with no table yet is a new store."""
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if tables and "longrun_schema" not in tables:
            raise NotAStoreError(
                f"SQLite store {self.path!r} holds no longrun store (no longrun_schema table); nothing was changed. "
                "Open it with create=True to add longrun's tables to it",
                path=self.path,
            )

    def _enter_wal(self, connection: sqlite3.Connection) -> str:
        """Switch to WAL (a setting kept in the file), retrying while other connections hold locks.

        The switch reads and then writes the file header; SQLite answers a lock upgrade that could
        deadlock with SQLITE_BUSY at once, without its busy handler, so the wait is done here.
        """
        deadline = time.monotonic() + self.busy_timeout_s
        delay = 0.005
        while True:
            try:
                mode = connection.execute("PRAGMA journal_mode").fetchone()[0]
                if str(mode).lower() == "wal":
                    return str(mode)
                return str(connection.execute("PRAGMA journal_mode=WAL").fetchone()[0])
            except sqlite3.OperationalError as exc:
                busy = getattr(exc, "sqlite_errorcode", None) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
                if not busy or time.monotonic() >= deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    # -- the witness beside the database (see the module docstring) ------------------------------

    @property
    def witness_dir(self) -> str:
        return self.path + WITNESS_SUFFIX

    def _witness(self, task_id: str) -> Witness:
        path = os.path.join(self.witness_dir, task_id + ".json")
        data = read_small(self._io, path, MAX_WITNESS_BYTES)
        if data is None:
            return Witness(0, 0, "no witness file")
        try:
            epoch, revision = _decode_witness(data, task_id)
        except CorruptStateError as exc:
            raise CorruptStateError(f"the witness file {path} is damaged: {exc}") from exc
        return Witness(epoch, revision, f"the witness file {path}")

    def _put_lease(self, lease: Lease) -> None:
        super()._put_lease(lease)
        task_id = lease.task_id
        old = self._witness(task_id)
        row = self._db.one("SELECT revision_floor FROM longrun_tasks WHERE task_id = ?", (task_id,))
        committed = row[0] if row is not None and isinstance(row[0], int) else 0
        epoch, revision = max(old.epoch, lease.epoch), max(old.revision, committed, lease.committed_revision)
        if (epoch, revision) == (old.epoch, old.revision):
            return  # most renewals: nothing new to witness, no write
        body: dict[str, JSONValue] = {"format": WITNESS_FORMAT, "task_id": task_id, "epoch": epoch, "revision": revision}
        data = canonical_bytes({**body, "checksum": "sha256:" + sha256_hex(canonical_bytes(body))})
        ensure_dir(self._io, self.witness_dir)
        write_atomic(self._io, self.witness_dir, task_id + ".json", data)

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        return (sqlite3.Error, OSError)

    def _begin(self, *, write: bool) -> None:
        # IMMEDIATE takes the write lock now, so the fence read and the write cannot interleave
        # with another writer; a deferred read sees one snapshot and never blocks writers.
        self._db.run("BEGIN IMMEDIATE" if write else "BEGIN")

    def _finish(self, *, commit: bool) -> None:
        if self._db.connection.in_transaction:
            self._db.run("COMMIT" if commit else "ROLLBACK")

    def _schema_table_sql(self) -> str:
        return "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'longrun_schema'"

    def _now_sql(self) -> str:
        return "((julianday('now') - 2440587.5) * 86400.0)"

    def _match_sql(self) -> str:
        return "task_id REGEXP ?"

    def _queue_table_sql(self) -> str:
        return "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'longrun_queue'"

    def _delete_task(self, task_id: str) -> list[str]:
        """The rows (see ``SqlStore._delete_task``), and first the witness file: removed inside the
        transaction, before its COMMIT, so a crash between the two leaves the task whole without a
        witness (a floor it no longer needs), never a witness naming revisions of a task that is gone."""
        path = os.path.join(self.witness_dir, task_id + ".json")
        removed = []
        try:
            self._io.unlink(path)
            self._io.fsync_dir(self.witness_dir)
            removed.append(path)
        except FileNotFoundError:
            pass
        return removed + super()._delete_task(task_id)

