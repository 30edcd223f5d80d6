"""The SQL stores' schema: its version, its migrations, and the converters of its column values.

What follows describes the shared engine of the SQL stores as a whole: ``SqlStore``
(``stores._sql``) over ``SqlConnection`` (``stores._sql_connection``), with this schema.

``SqlStore`` implements ``BaseStore``'s primitives over a DB-API 2.0 connection; ``SqliteStore``
and ``PostgresStore`` supply only how to connect, how to begin a transaction and lock a task, and
the column types. The fencing, lease and revision rules stay in ``BaseStore``; the engine adds
the database's own enforcement of them inside the same transaction as every write:

- A task's exclusive transaction locks the task first (SQLite: ``BEGIN IMMEDIATE`` takes the
  database's write lock; PostgreSQL: ``SELECT ... FOR UPDATE`` on the task's row), so the fence
  check that ``BaseStore`` makes and the write it guards commit or roll back together.
- The state write is ``UPDATE longrun_tasks ... WHERE revision_floor < new revision AND the
  lease's epoch = the writer's epoch``, and its row count is checked: even if the code above were
  wrong, the database refuses a stale epoch (``FencedError``) or a revision that does not grow.
- A lease write is an upsert ``WHERE stored epoch <= new epoch``, so no statement can move an
  epoch backwards.

Schema (version ``SCHEMA_VERSION``; ``longrun_schema`` records every migration applied; a
database whose version is newer than this code knows is refused with ``SchemaVersionError``)::

    longrun_tasks          task_id, created_at, revision_floor (highest revision ever committed),
                           epoch_floor (highest epoch ever issued, should the lease row be lost)
    longrun_leases         task_id, owner, epoch, acquired_at, expires_at,
                           monotonic_clock, monotonic_expires_at (version 2),
                           token, holder_lock (version 3: the holder's secret, its kernel lock)
    longrun_states         task_id, revision, epoch, plan_digest, status, next_action,
                           effect_count, header (a state envelope with no effects), checksum
    longrun_effects        task_id, step_id, position, revision, record, checksum
    longrun_plans          task_id, revision, body (a declared plan's outline), checksum (version 4)
    longrun_blobs          task_id, digest, data (version 5: a large payload or result, its canonical
                           bytes, by their SHA-256; see ``stores.blobs``)
    longrun_cancellations  task_id, body (raw JSON text), written_at
    longrun_approvals      task_id, approval_id, body (raw JSON text), written_at
    longrun_messages       task_id, seq, msg_key, topic, body (the stored message, with its checksum),
                           written_at (version 6: a task's mailbox; see ``longrun.messages``)
    longrun_quarantine     id, task_id, kind, name, reason, quarantined_at, data
    longrun_summaries      task_id, status, revision, function, parent, created_at, updated_at, wake_at,
                           error, next_action (version 7: ``longrun.summary``; indexed by update
                           time, by status, by function and by parent)
    longrun_status_counts  status, shard, tasks (version 9: how many tasks have each status, kept by
                           triggers on longrun_summaries; a status's count is the sum over its shards)

The commit routine (version 8; PostgreSQL only: SQLite runs in the process and needs none).
``longrun_commit(...)`` is a PL/pgSQL function that makes a whole commit in one call, so in one
round trip and one transaction: it locks the task's row, runs the epoch-conditional ``UPDATE``
(whose row count it checks: the lease row must hold the writer's epoch and token, and the
revision must grow) and only then writes the header, effect, blob, summary and outline rows.
It returns 0 when it wrote, or 1 (it wrote nothing) when the ``UPDATE`` matched no row; the store
then repeats the commit as statements in a transaction of its own, which raises the same typed
error as ever (``FencedError``, or a damaged lease record's ``CorruptStateError``), or writes.

The summary row. Every commit upserts the task's summary row in its own transaction (the fence
checked by the same transaction), so a summary is exactly the committed state's; a task's row is
created with the task (status ``new``). A database migrated to version 7 has its summaries built
from every stored state in the migration's transaction. Listings read only this table and its
indexes: a page costs O(page), not O(tasks). How many tasks have each status is kept apart
(version 9): triggers on the summary table add and take away in the status count rows whenever
a summary row is inserted, deleted or changes status, in the same transaction (a commit that
leaves the status as it was writes no count row); a database migrated to version 9 has the
counts built from its summary rows in the migration's transaction.

A commit writes the header row and only the effect rows the runner says changed (plus any row the
store has not written yet), so its cost grows with the change, not with the ledger. A declared
plan's outline (``RunState.plan_outline``: every step id, so as long as the plan) is kept out of
the header in its own row, written only when it changes (the first revision, a grown plan). It is
informational: a damaged outline row is reported in the load's observations and the state loads
without it (a repairing load moves the row to the quarantine); the runner records it again. A
payload or result of ``blobs.BLOB_MIN_BYTES`` (64 KiB) or more is kept once, as a row of
``longrun_blobs`` inserted (if absent) in the transaction of the first commit that references it;
the effect row holds its reference, so a later commit of that row does not copy it. A load checks
each blob's size and SHA-256 against its reference: a missing or damaged blob is damage to the
effect row that names it. Every row
carries a SHA-256 checksum and names its task; a load validates every row and the header's effect
count before it returns anything.

Damage. The database's transactions are the atomicity, so these stores keep no backup revision:
a damaged header or effect row (checksum, JSON, fields, a missing row) makes the load raise
``StateUnrecoverableError``; a repairing load (one that carries the lease) first moves the
damaged rows to ``longrun_quarantine`` (never deletes them), and from then on the task keeps
raising rather than start afresh. Rows that are well formed but name another task raise
``ForeignStateError`` and are left where they are. Control records are stored as the raw text an
operator wrote, so a damaged one is handed to the runner to judge (see ``longrun.control``).

Not guaranteed: protection from someone who can write to the database; progress while another
process is stopped inside a transaction (it holds the task's lock until the database's timeout
ends its session, or SQLite's busy timeout ends the wait with ``StorageError``).
"""

from __future__ import annotations

from typing import Sequence

from ..canonical import sha256_hex
from ..summary import fill_status_counts

__all__ = ["SCHEMA_VERSION", "column_text", "migrations", "postgres_status_counters", "quarantine_text", "row_checksum", "utf8_bytes"]

SCHEMA_VERSION = 9


def migrations(types: dict[str, str], routines: Sequence[str] = (), counters: Sequence[str] = ()) -> list[tuple[int, str, list[str]]]:
    """Every schema version, in order, as DDL in the dialect's column types; ``routines`` is the
    dialect's server-side code (version 8: PostgreSQL's commit function; SQLite has none);
    ``counters`` the dialect's status count table and the triggers that keep it (version 9:
    ``summary.sqlite_status_counters`` or ``postgres_status_counters``)."""
    t = types
    return [
        (
            1,
            "tasks, leases, state header, effect records, control records, quarantine",
            [
                f"""CREATE TABLE IF NOT EXISTS longrun_tasks (
                    task_id TEXT PRIMARY KEY,
                    created_at {t['float']} NOT NULL,
                    revision_floor {t['int']} NOT NULL DEFAULT 0,
                    epoch_floor {t['int']} NOT NULL DEFAULT 0)""",
                f"""CREATE TABLE IF NOT EXISTS longrun_leases (
                    task_id TEXT PRIMARY KEY REFERENCES longrun_tasks (task_id),
                    owner TEXT NOT NULL,
                    epoch {t['int']} NOT NULL,
                    acquired_at {t['float']} NOT NULL,
                    expires_at {t['float']} NOT NULL)""",
                f"""CREATE TABLE IF NOT EXISTS longrun_states (
                    task_id TEXT PRIMARY KEY REFERENCES longrun_tasks (task_id),
                    revision {t['int']} NOT NULL,
                    epoch {t['int']} NOT NULL,
                    plan_digest TEXT NOT NULL,
                    status TEXT NOT NULL,
                    next_action TEXT NOT NULL,
                    effect_count {t['int']} NOT NULL,
                    header TEXT NOT NULL,
                    checksum TEXT NOT NULL,
                    updated_at {t['float']} NOT NULL)""",
                f"""CREATE TABLE IF NOT EXISTS longrun_effects (
                    task_id TEXT NOT NULL REFERENCES longrun_tasks (task_id),
                    step_id TEXT NOT NULL,
                    position {t['int']} NOT NULL,
                    revision {t['int']} NOT NULL,
                    record TEXT NOT NULL,
                    checksum TEXT NOT NULL,
                    PRIMARY KEY (task_id, step_id))""",
                f"""CREATE TABLE IF NOT EXISTS longrun_cancellations (
                    task_id TEXT PRIMARY KEY REFERENCES longrun_tasks (task_id),
                    body TEXT NOT NULL,
                    written_at {t['float']} NOT NULL)""",
                f"""CREATE TABLE IF NOT EXISTS longrun_approvals (
                    task_id TEXT NOT NULL REFERENCES longrun_tasks (task_id),
                    approval_id TEXT NOT NULL,
                    body TEXT NOT NULL,
                    written_at {t['float']} NOT NULL,
                    PRIMARY KEY (task_id, approval_id))""",
                f"""CREATE TABLE IF NOT EXISTS longrun_quarantine (
                    id {t['serial']},
                    task_id TEXT NOT NULL,
                    kind TEXT NOT NULL,
                    name TEXT NOT NULL,
                    reason TEXT NOT NULL,
                    quarantined_at {t['float']} NOT NULL,
                    data TEXT)""",
                "CREATE INDEX IF NOT EXISTS longrun_quarantine_task ON longrun_quarantine (task_id)",
            ],
        ),
        (
            2,
            "lease expiry on the holder's monotonic timeline (this boot of this machine)",
            [
                "ALTER TABLE longrun_leases ADD COLUMN monotonic_clock TEXT",
                f"ALTER TABLE longrun_leases ADD COLUMN monotonic_expires_at {t['float']}",
            ],
        ),
        (
            3,
            "the lease holder's secret token, and the kernel lock that shows it alive on this machine",
            [
                "ALTER TABLE longrun_leases ADD COLUMN token TEXT",
                "ALTER TABLE longrun_leases ADD COLUMN holder_lock TEXT",
            ],
        ),
        (
            4,
            "a declared plan's outline (step ids and actions), apart from the state header",
            [
                f"""CREATE TABLE IF NOT EXISTS longrun_plans (
                    task_id TEXT PRIMARY KEY REFERENCES longrun_tasks (task_id),
                    revision {t['int']} NOT NULL,
                    body TEXT NOT NULL,
                    checksum TEXT NOT NULL)""",
            ],
        ),
        (
            5,
            "large payloads and results kept once, apart from the effect rows that reference them",
            [
                f"""CREATE TABLE IF NOT EXISTS longrun_blobs (
                    task_id TEXT NOT NULL REFERENCES longrun_tasks (task_id),
                    digest TEXT NOT NULL,
                    data {t['bytes']} NOT NULL,
                    PRIMARY KEY (task_id, digest))""",
            ],
        ),
        (
            6,
            "messages between tasks: each task's mailbox, numbered in the order the sends commit",
            [
                f"""CREATE TABLE IF NOT EXISTS longrun_messages (
                    task_id TEXT NOT NULL REFERENCES longrun_tasks (task_id),
                    seq {t['int']} NOT NULL,
                    msg_key TEXT NOT NULL,
                    topic TEXT NOT NULL,
                    body TEXT NOT NULL,
                    written_at {t['float']} NOT NULL,
                    PRIMARY KEY (task_id, seq),
                    UNIQUE (task_id, msg_key))""",
                "CREATE INDEX IF NOT EXISTS longrun_messages_topic ON longrun_messages (task_id, topic, seq)",
            ],
        ),
        (
            7,
            "a summary row per task (status, function, parent, times, wake time, last error), indexed for listings",
            [
                f"""CREATE TABLE IF NOT EXISTS longrun_summaries (
                    task_id TEXT PRIMARY KEY REFERENCES longrun_tasks (task_id),
                    status TEXT NOT NULL,
                    revision {t['int']} NOT NULL,
                    function TEXT,
                    parent TEXT,
                    created_at {t['float']},
                    updated_at {t['float']},
                    wake_at {t['float']},
                    error TEXT,
                    next_action TEXT NOT NULL)""",
                f"CREATE INDEX IF NOT EXISTS longrun_summaries_updated ON longrun_summaries (updated_at {t['desc']}, task_id DESC)",
                f"CREATE INDEX IF NOT EXISTS longrun_summaries_status ON longrun_summaries (status, updated_at {t['desc']}, task_id DESC)",
                f"CREATE INDEX IF NOT EXISTS longrun_summaries_function ON longrun_summaries (function, updated_at {t['desc']}, task_id DESC)",
                "CREATE INDEX IF NOT EXISTS longrun_summaries_parent ON longrun_summaries (parent)",
                # Filled from every stored state by the store itself (``SqlStore._migrated``),
                # in this migration's transaction.
            ],
        ),
        (
            8,
            "a commit in one call to the server: the database's own routine checks the fence and writes the rows",
            list(routines),
        ),
        (
            9,
            "how many tasks have each status, kept by triggers on the summary rows in each commit's transaction",
            [*counters, "DELETE FROM longrun_status_counts", fill_status_counts("longrun_summaries", "longrun_status_counts")],
        ),
    ]


def postgres_status_counters() -> list[str]:
    """PostgreSQL's status count table and the triggers that keep it (schema version 9).

    Each change is counted in the row of its status and of the writing session's shard
    (``pg_backend_pid() & 15``), not of the task: a commit then locks at most two count rows, both
    of its own shard, so concurrent commits on other connections never wait for one another here,
    and a bulk insert of many tasks of one status locks one row. The two rows of a status change
    are taken in status order, so two sessions of one shard cannot deadlock on them. A row's
    count may go below zero (a task counted in on one shard, out on another); a status's sum is
    its count. Only an insert, a delete or a change of status writes here."""
    return [
        """CREATE TABLE IF NOT EXISTS longrun_status_counts (
            status TEXT NOT NULL,
            shard INTEGER NOT NULL,
            tasks BIGINT NOT NULL,
            PRIMARY KEY (status, shard))""",
        """CREATE OR REPLACE FUNCTION longrun_count_status() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.status < NEW.status THEN  -- the two rows in status order
        INSERT INTO longrun_status_counts AS counted (status, shard, tasks) VALUES (OLD.status, pg_backend_pid() & 15, -1)
            ON CONFLICT (status, shard) DO UPDATE SET tasks = counted.tasks - 1;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        INSERT INTO longrun_status_counts AS counted (status, shard, tasks) VALUES (NEW.status, pg_backend_pid() & 15, 1)
            ON CONFLICT (status, shard) DO UPDATE SET tasks = counted.tasks + 1;
    END IF;
    IF TG_OP = 'DELETE' OR (TG_OP = 'UPDATE' AND OLD.status > NEW.status) THEN
        INSERT INTO longrun_status_counts AS counted (status, shard, tasks) VALUES (OLD.status, pg_backend_pid() & 15, -1)
            ON CONFLICT (status, shard) DO UPDATE SET tasks = counted.tasks - 1;
    END IF;
    RETURN NULL;
END $$""",
        """CREATE TRIGGER longrun_status_counts_rows AFTER INSERT OR DELETE ON longrun_summaries
            FOR EACH ROW EXECUTE FUNCTION longrun_count_status()""",
        """CREATE TRIGGER longrun_status_counts_status AFTER UPDATE OF status ON longrun_summaries
            FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION longrun_count_status()""",
    ]


def quarantine_text(value: object) -> str | None:
    """A damaged column's content, kept for the quarantine: text as is, bytes as hex."""
    if value is None:
        return value
    if isinstance(value, str):
        # Text with a lone surrogate cannot be stored as text again: keep it escaped.
        return value if utf8_bytes(value) is not None else "escaped:" + value.encode("ascii", "backslashreplace").decode("ascii")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "hex:" + bytes(value).hex()
    return repr(value)


def column_text(value: object) -> str | None:
    """A TEXT column's value as str; None if it holds something else (SQLite types are loose)."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None


def utf8_bytes(text: str | None) -> bytes | None:
    """``text`` as UTF-8 bytes; None for None or for text with a lone surrogate (not UTF-8 at all)."""
    if text is None:
        return None
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return None


def row_checksum(data: bytes) -> str:
    return "sha256:" + sha256_hex(data)
