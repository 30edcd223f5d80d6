"""The shared engine of the SQL stores: one schema, one set of statements, two dialects.

``SqlStore`` implements ``BaseStore``'s primitives over the ``SqlConnection`` it holds
(``stores._sql_connection``: the connection, transactions, schema migration), made with the store's
own dialect: each backend's store (``SqliteStore``, ``PostgresStore``) is a subclass that supplies
the ``SqlDialect`` methods, the only thing that differs between them.

One concept, the SQL store, so one module, and a long one: the lease, the state as a header row
and effect rows, the repairing load that quarantines damaged rows, and the control records are
the primitives ``BaseStore`` asks for, each a few statements over the same tables. The schema, how the database enforces the fence
and how damage is handled are described in ``stores._sql_schema``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import operator
import secrets
import time
from typing import Any, Collection, Generator, Iterable, Mapping, Self, Sequence

from ..approval import Approval
from ..cancellation import Cancellation
from ..canonical import canonical_bytes, parse_json
from ..contract import check_task_id
from ..control import ControlRecord, parse_control_record
from ..envelope import MAX_STATE_BYTES, PlanOutline, RunState, check_loadable, decode, encode
from ..errors import (
    CorruptStateError, FencedError, ForeignStateError, LongrunError, SchemaVersionError, StateUnrecoverableError, StorageError,
    UnknownTaskError,
)  # fmt: skip
from ..lease import RELEASED, Lease
from ..ledger import EffectRecord
from ..messages import Message, decode_message, encode_message
from ..outcome import Evidence
from ..protocols import LoadResult
from ..summary import (
    FUNCTION_NAMES_SQL, MAX_ERROR_CHARS, NEW, STATUS_COUNTS_SQL, SUMMARY_COLUMNS, SUMMARY_STATUSES, UNREADABLE, SummaryQuery, TaskSummary,
    sqlite_status_counters, summarize,
)  # fmt: skip
from .blobs import Blob, BlobCodec, BlobFetcher, BlobRef, large_values, resolve_record_json, stored_record_json
from ._sql_schema import SCHEMA_VERSION, column_text, quarantine_text, row_checksum, utf8_bytes
from ._sql_connection import SqlConnection
from .base import BaseStore, Witness

__all__ = ["SCHEMA_VERSION", "SqlStore"]

log = logging.getLogger("longrun")

MAX_APPROVALS = 1000


@dataclasses.dataclass
class _Damage:
    kind: str
    """"state" (the header row), "effect" (one effect row) or "count" (rows missing: nothing to move)."""
    name: str
    reason: str
    key: tuple[str, ...]
    data: str | None


@dataclasses.dataclass
class StateWrite:
    """A commit's rows, encoded and checked (``SqlStore._state_write``), not yet written."""

    state: RunState
    header: str
    header_checksum: str
    rows: list[tuple[str, int, str, str]]
    """The effect rows to write: step id, position, record (JSON text), checksum."""
    deleted: list[str] | None
    """The step ids whose rows go; None: every row not in ``state.effects`` (the stored ones are not known)."""
    blobs: list[Blob]
    summary: TaskSummary
    outline_changed: bool
    outline_body: str | None
    """The outline row to write (None: keep it, or delete it if ``outline_changed``)."""
    outline_checksum: str | None
    now_stored: dict[str, int]
    full: bool
    """Every record is written (what changed was not known)."""


_position = operator.itemgetter(1)
"""An effect row's position (``SELECT step_id, position, revision, record, checksum``)."""


def _rows_digest(header_row: Sequence[Any], effect_rows: list[Any]) -> str:
    """What a task's rows hold, named by the checksums a load just verified (the header's, then
    each effect row's in position order), not by encoding the state again."""
    checksums = [str(header_row[3]), *(str(row[4]) for row in sorted(effect_rows, key=_position))]
    return row_checksum("\n".join(checksums).encode())


class SqlStore(BaseStore):
    """``BaseStore`` over SQL, through the ``SqlConnection`` it holds. A subclass per database
    supplies the dialect (``SqlDialect``: the methods marked so below).

    The per-task state an instance keeps (the rows it knows are stored, the revision it last
    committed) is read and changed only inside its transactions, which take turns (see
    ``SqlConnection``).
    """

    placeholder = "?"
    """How the driver marks a parameter; statements here are written with ``?``."""
    types: Mapping[str, str] = {"int": "BIGINT", "float": "DOUBLE PRECISION", "serial": "INTEGER PRIMARY KEY", "bytes": "BLOB", "desc": "DESC"}
    """The dialect's column types for the schema's integers, floats, the quarantine's row id and bytes, and
    "desc": how an index and a listing order by update time, newest first with NULL (never updated) last."""

    def __init__(self) -> None:
        super().__init__()
        self._db = SqlConnection(self)
        self._stored_steps: dict[str, dict[str, int]] = {}
        """Per task, the effect rows this instance knows exist, step id -> position (after a repairing load)."""
        self._stored_outlines: dict[str, PlanOutline | None] = {}
        """Per task, the outline object this instance knows is stored (absent: not known)."""
        self._blobs: dict[str, BlobCodec] = {}
        """Per task, its large values as this instance knows them (``stores.blobs``)."""

    # -- dialect: a subclass provides these (see ``SqlDialect``) ---------------------------------

    def _connect(self) -> Any:
        raise NotImplementedError

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        raise NotImplementedError

    def _begin(self, *, write: bool) -> None:
        raise NotImplementedError

    def _finish(self, *, commit: bool) -> None:
        raise NotImplementedError

    def _lock_schema(self) -> None:
        """Serialize schema creation between processes (inside the schema transaction)."""

    def _lock_task_sql(self, *, write: bool) -> str:
        return "SELECT task_id FROM longrun_tasks WHERE task_id = ?"

    def _schema_table_sql(self) -> str:
        raise NotImplementedError

    def _refuse_without_schema(self) -> None:
        """A store that may create its schema where none is (the default) refuses nothing."""

    def _now_sql(self) -> str:
        raise NotImplementedError

    def _match_sql(self) -> str:
        """A condition true when ``task_id`` matches the regular expression given as its parameter."""
        raise NotImplementedError

    def _routines(self) -> list[str]:
        """The DDL of the database's server-side routines (schema version 8); none by default."""
        return []

    def _status_counters(self) -> list[str]:
        """The DDL of the status count table and its triggers (schema version 9); SQLite's by default."""
        return sqlite_status_counters("longrun_summaries", "longrun_status_counts")

    # -- the connection -----------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (a later call opens a new one)."""
        self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _transaction(self, task_id: str, *, create: bool, write: bool = True) -> Generator[None, None, None]:
        with self._db.transaction(task_id, create=create, write=write):
            yield

    # -- lease --------------------------------------------------------------------------------

    _LEASE_COLUMNS = "owner, epoch, acquired_at, expires_at, monotonic_clock, monotonic_expires_at, token, holder_lock"

    def _lease_row(self, task_id: str) -> Sequence[Any] | None:
        """The task's lease row (``_LEASE_COLUMNS``), None if it has none."""
        row: Sequence[Any] | None = self._db.one(f"SELECT {self._LEASE_COLUMNS} FROM longrun_leases WHERE task_id = ?", (task_id,))
        return row

    def _get_lease(self, task_id: str) -> Lease | None:
        row = self._lease_row(task_id)
        if row is None:
            return None
        owner, epoch, acquired_at, expires_at, monotonic_clock, monotonic_expires_at, token, holder_lock = row
        fields = {"task_id": task_id, "owner": owner, "epoch": epoch, "acquired_at": acquired_at, "expires_at": expires_at}
        if monotonic_clock is not None or monotonic_expires_at is not None:
            fields.update(monotonic_clock=monotonic_clock, monotonic_expires_at=monotonic_expires_at)
        # Absent in a row written before schema version 3: such a lease is fenced by its epoch alone.
        fields.update({name: value for name, value in (("token", token), ("holder_lock", holder_lock)) if value is not None})
        try:
            return Lease.from_json(fields)
        except CorruptStateError as exc:
            raise CorruptStateError(f"lease row of {task_id!r} is damaged: {exc}") from exc

    def _put_lease(self, lease: Lease) -> None:
        cursor = self._db.run(
            "INSERT INTO longrun_leases (task_id, owner, epoch, acquired_at, expires_at, monotonic_clock, "
            "monotonic_expires_at, token, holder_lock) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (task_id) DO UPDATE SET owner = excluded.owner, epoch = excluded.epoch, "
            "acquired_at = excluded.acquired_at, expires_at = excluded.expires_at, "
            "monotonic_clock = excluded.monotonic_clock, monotonic_expires_at = excluded.monotonic_expires_at, "
            "token = excluded.token, holder_lock = excluded.holder_lock "
            "WHERE longrun_leases.epoch <= excluded.epoch",
            (
                lease.task_id, lease.owner, lease.epoch, lease.acquired_at, lease.expires_at,
                lease.monotonic_clock, lease.monotonic_expires_at, lease.token, lease.holder_lock,
            ),
        )
        if cursor.rowcount != 1:
            raise FencedError(
                f"lease write for {lease.task_id!r} at epoch {lease.epoch} refused by the database: "
                "a newer epoch is recorded",
                write_epoch=lease.epoch,
            )
        self._db.run(
            "UPDATE longrun_tasks SET epoch_floor = ? WHERE task_id = ? AND epoch_floor < ?",
            (lease.epoch, lease.task_id, lease.epoch),
        )

    def _witness(self, task_id: str) -> Witness:
        """None here: the lease row lives in the database with the state, so whatever loses the one
        loses the other. ``SqliteStore`` keeps one beside its file."""
        return Witness(0, 0, "no witness")

    def _epoch_floor(self, task_id: str) -> int:
        """Used only if the lease row is gone: never reissue an epoch that was ever issued."""
        floors = [
            self._db.one("SELECT epoch_floor FROM longrun_tasks WHERE task_id = ?", (task_id,)),
            self._db.one("SELECT epoch FROM longrun_states WHERE task_id = ?", (task_id,)),
        ]
        return max((row[0] for row in floors if row is not None and isinstance(row[0], int)), default=0)

    def _set_lease_aside(self, task_id: str, reason: str) -> str:
        """Copy the damaged lease row into the quarantine (as text), then delete it, in this transaction."""
        row = self._db.one(f"SELECT {self._LEASE_COLUMNS} FROM longrun_leases WHERE task_id = ?", (task_id,))
        names = self._LEASE_COLUMNS.split(", ")
        data = "; ".join(f"{name}={quarantine_text(value)}" for name, value in zip(names, row or ()))
        self._db.run(
            "INSERT INTO longrun_quarantine (task_id, kind, name, reason, quarantined_at, data) "
            f"VALUES (?, 'lease', ?, ?, {self._now_sql()}, ?)",
            (task_id, f"longrun_leases/{task_id}", reason, data),
        )
        self._db.run("DELETE FROM longrun_leases WHERE task_id = ?", (task_id,))
        found = self._db.one("SELECT MAX(id) FROM longrun_quarantine WHERE task_id = ? AND kind = 'lease'", (task_id,))
        return f"longrun_quarantine/{found[0] if found is not None else '?'} (longrun_leases/{task_id})"

    # -- state --------------------------------------------------------------------------------

    def _get_state(self, task_id: str, *, repair: bool) -> LoadResult:
        floor_row = self._db.one("SELECT revision_floor FROM longrun_tasks WHERE task_id = ?", (task_id,))
        header_row = self._db.one(
            "SELECT revision, effect_count, header, checksum FROM longrun_states WHERE task_id = ?", (task_id,)
        )
        effect_rows = self._db.rows(
            "SELECT step_id, position, revision, record, checksum FROM longrun_effects WHERE task_id = ?", (task_id,)
        )
        outline_row = self._db.one("SELECT revision, body, checksum FROM longrun_plans WHERE task_id = ?", (task_id,))
        return self._state_from_rows(task_id, floor_row, header_row, effect_rows, outline_row, repair=repair)

    def load_many(self, task_ids: Sequence[str]) -> list[LoadResult | LongrunError]:
        """``BaseStore.load_many`` in one read transaction of a few queries for all the tasks (each
        kind of row fetched for all of them at once), each state checked as ``load`` checks it; the
        results' ``digest`` is left empty (see ``_state_from_rows``)."""
        ids = [check_task_id(task_id) for task_id in task_ids]
        early = {}
        if self._reads_take_a_snapshot:  # as ``load``: the witnesses before the snapshot the states are read in
            early = {task_id: self._witness(task_id) for task_id in ids}
        results: list[LoadResult | LongrunError] = []
        with self._db.session(write=False, what=f"load {len(ids)} tasks"):
            rows: dict[str, dict[str, Any]] = {task_id: {"effects": []} for task_id in ids}
            for first in range(0, len(ids), self._BATCH_ROWS):
                chunk = ids[first : first + self._BATCH_ROWS]
                where = f"WHERE task_id IN ({', '.join('?' * len(chunk))})"
                for row in self._db.rows(f"SELECT task_id, revision_floor FROM longrun_tasks {where}", chunk):
                    rows[row[0]]["floor"] = row[1:]
                for row in self._db.rows(f"SELECT task_id, revision, effect_count, header, checksum FROM longrun_states {where}", chunk):
                    rows[row[0]]["header"] = row[1:]
                for row in self._db.rows(f"SELECT task_id, step_id, position, revision, record, checksum FROM longrun_effects {where}", chunk):
                    rows[row[0]]["effects"].append(row[1:])
                for row in self._db.rows(f"SELECT task_id, revision, body, checksum FROM longrun_plans {where}", chunk):
                    rows[row[0]]["outline"] = row[1:]
            for task_id in ids:
                found = rows[task_id]
                try:
                    if "floor" not in found:
                        raise UnknownTaskError(f"no task {task_id!r} in {self!r}")
                    result = self._state_from_rows(
                        task_id, found["floor"], found.get("header"), found["effects"], found.get("outline"), repair=False, digest=False
                    )
                    self._check_witness(task_id, result, early[task_id] if task_id in early else self._witness(task_id))
                except StateUnrecoverableError as exc:
                    self._poisoned[task_id] = exc  # as ``load``: nothing may be written over it
                    results.append(exc)
                except LongrunError as exc:
                    results.append(exc)
                else:
                    results.append(result)
        return results

    def _state_from_rows(
        self,
        task_id: str,
        floor_row: Sequence[Any] | None,
        header_row: Sequence[Any] | None,
        effect_rows: list[Any],
        outline_row: Sequence[Any] | None,
        *,
        repair: bool,
        digest: bool = True,
    ) -> LoadResult:
        """The task's state from its rows (its task row's floor, header, effects, outline), each
        checked; damage refused with ``StateUnrecoverableError`` (and, repairing, set aside).
        Without ``digest``, the result's digest is left empty (a read for a listing does not
        compare digests)."""
        now = time.time()
        floor = floor_row[0] if floor_row is not None and isinstance(floor_row[0], int) else 0
        if header_row is None:
            quarantined = self._quarantined(task_id)
            if effect_rows or quarantined:
                # Damaged state was set aside earlier (or its header is gone): starting afresh here
                # would repeat every effect the lost state recorded.
                raise StateUnrecoverableError(
                    f"task {task_id!r} has no valid state header but "
                    + (f"{len(effect_rows)} effect rows remain" if effect_rows else f"its quarantine holds {quarantined}")
                    + "; restore the state rows or retire the task id"
                )
            return LoadResult(state=None, revision_floor=floor)

        damage: list[_Damage] = []
        state = self._decode_header(task_id, header_row, damage)
        records: list[tuple[int, EffectRecord]] = []
        fetch = BlobFetcher(lambda digest: self._blob(task_id, digest))
        for row in effect_rows:
            record = self._decode_effect(task_id, row, state.revision if state else None, damage, fetch)
            if record is not None:
                records.append(record)
        if state is not None and not damage:
            records.sort(key=lambda item: item[0])
            positions = [position for position, _ in records]
            count = header_row[1]
            if positions != list(range(len(records))) or count != len(records):
                damage.append(
                    _Damage("count", "longrun_effects", f"the header counts {count!r} effect records; rows hold positions {positions}", (), None)
                )
        if damage:
            moved = self._set_aside(task_id, damage, now) if repair else []
            raise StateUnrecoverableError(
                f"task {task_id!r}: the stored state does not validate ({'; '.join(d.name + ': ' + d.reason for d in damage)}); "
                + (f"damaged rows were moved to the quarantine ({', '.join(moved)})" if moved else
                   "damaged rows were left in place (read-only load)" if not repair else "no row could be set aside")
                + ". A database store keeps no backup revision: inspect the target before anything else"
            )
        assert state is not None
        state.effects = {record.step_id: record for _, record in records}
        notes = [Evidence("store", f"state revision {state.revision} validated: header and {len(records)} effect rows in {self!r}", now)]
        state.plan_outline = self._load_outline(task_id, outline_row, state.revision, repair=repair, notes=notes, now=now)
        if repair:
            self._stored_steps[task_id] = {record.step_id: position for position, record in records}
            self._stored_outlines[task_id] = state.plan_outline
            codec = self._blobs[task_id] = BlobCodec()
            for value, ref in fetch.seen:
                codec.read(value, ref)
        return LoadResult(
            state=state,
            source="primary",
            digest=_rows_digest(header_row, effect_rows) if digest else "",
            observations=tuple(notes),
            revision_floor=max(floor, state.revision),
        )

    def _load_outline(
        self, task_id: str, row: Sequence[Any] | None, revision: int, *, repair: bool, notes: list[Evidence], now: float
    ) -> PlanOutline | None:
        """The task's plan outline row, validated; a damaged one is noted (and, repairing, set aside)."""
        if row is None:
            return None
        written_at, body, checksum = row
        text = column_text(body)
        data = utf8_bytes(text)
        problem = None
        outline = None
        if data is None or checksum != row_checksum(data):
            problem = "its checksum does not match"
        elif not isinstance(written_at, int) or written_at > revision:
            problem = f"it names revision {written_at!r}, newer than the state's {revision}"
        else:
            try:
                document = parse_json(data, what="the plan outline row", max_bytes=MAX_STATE_BYTES)
                if not isinstance(document, dict) or set(document) != {"task_id", "plan_outline"}:
                    raise CorruptStateError("a plan outline row holds {task_id, plan_outline}")
                if document["task_id"] != task_id:
                    raise CorruptStateError(f"it names task {document['task_id']!r:.80}")
                outline = PlanOutline.from_json(document["plan_outline"])
            except CorruptStateError as exc:
                problem = str(exc)
        if problem is None:
            return outline
        detail = f"the plan outline row of {task_id!r} is damaged ({problem}); the state loads without it"
        if repair:
            self._db.run(
                "INSERT INTO longrun_quarantine (task_id, kind, name, reason, quarantined_at, data) VALUES (?, ?, ?, ?, ?, ?)",
                (task_id, "plan", "longrun_plans", problem[:2000], now, quarantine_text(body)),
            )
            self._db.run("DELETE FROM longrun_plans WHERE task_id = ?", (task_id,))
            detail += " (the row was moved to the quarantine; the runner records the outline again)"
        log.warning("%s", detail, extra={"task": task_id})
        notes.append(Evidence("store", detail, now))
        return None

    def _decode_header(self, task_id: str, row: Sequence[Any], damage: list[_Damage]) -> RunState | None:
        revision, _, header, checksum = row
        text = column_text(header)
        data = utf8_bytes(text)
        if data is None:
            damage.append(_Damage("state", "longrun_states", "the header is not UTF-8 text", (), quarantine_text(header)))
            return None
        if checksum != row_checksum(data):
            damage.append(_Damage("state", "longrun_states", "the header's row checksum does not match", (), text))
            return None
        try:
            state = decode(data, expected_task=task_id)
        except (ForeignStateError, SchemaVersionError):
            raise  # well formed but not ours to repair: refuse, move nothing
        except CorruptStateError as exc:
            damage.append(_Damage("state", "longrun_states", str(exc), (), text))
            return None
        if state.effects or revision != state.revision:
            damage.append(
                _Damage("state", "longrun_states", f"the header disagrees with its row (revision {revision!r})", (), text)
            )
            return None
        return state

    def _blob(self, task_id: str, digest: str) -> bytes | None:
        row = self._db.one("SELECT data FROM longrun_blobs WHERE task_id = ? AND digest = ?", (task_id, digest))
        if row is None:
            return None
        data = row[0]
        return bytes(data) if isinstance(data, (bytes, bytearray, memoryview)) else None  # anything else fails the check

    def _decode_effect(
        self, task_id: str, row: Sequence[Any], header_revision: int | None, damage: list[_Damage], fetch: BlobFetcher
    ) -> tuple[int, EffectRecord] | None:
        step_id, position, revision, body, checksum = row
        name = f"longrun_effects/{step_id}"
        text = column_text(body)
        data = utf8_bytes(text)
        if data is None or checksum != row_checksum(data):
            damage.append(_Damage("effect", name, "the effect row's checksum does not match", (str(step_id),), quarantine_text(body)))
            return None
        try:
            document = parse_json(data, what="the effect row", max_bytes=MAX_STATE_BYTES)
            if not isinstance(document, dict) or set(document) != {"task_id", "record"}:
                raise CorruptStateError("an effect row holds {task_id, record}")
            if document["task_id"] != task_id:
                raise ForeignStateError(f"effect row {step_id!r} of task {task_id!r} belongs to task {document['task_id']!r}")
            record = EffectRecord.from_json(resolve_record_json(document["record"], fetch, f"effect record {step_id!r:.80}"))
        except ForeignStateError:
            raise
        except CorruptStateError as exc:
            damage.append(_Damage("effect", name, f"the effect row does not validate: {exc}", (str(step_id),), text))
            return None
        if record.step_id != step_id or not isinstance(position, int) or not isinstance(revision, int):
            damage.append(_Damage("effect", name, "the effect row disagrees with its record", (str(step_id),), text))
            return None
        if header_revision is not None and revision > header_revision:
            damage.append(
                _Damage("effect", name, f"revision {revision} is newer than the header's {header_revision}", (str(step_id),), text)
            )
            return None
        return position, record

    def _quarantined(self, task_id: str) -> list[str]:
        rows = self._db.rows("SELECT id, name FROM longrun_quarantine WHERE task_id = ? AND kind IN ('state', 'effect')", (task_id,))
        return sorted(f"longrun_quarantine/{row[0]} ({row[1]})" for row in rows)

    def _set_aside(self, task_id: str, damage: list[_Damage], now: float) -> list[str]:
        moved = []
        for item in damage:
            if item.kind == "count":
                continue  # rows are missing: nothing to move, the refusal itself is the record
            self._db.run(
                "INSERT INTO longrun_quarantine (task_id, kind, name, reason, quarantined_at, data) VALUES (?, ?, ?, ?, ?, ?)",
                (task_id, item.kind, item.name, item.reason[:2000], now, item.data),
            )
            if item.kind == "state":
                self._db.run("DELETE FROM longrun_states WHERE task_id = ?", (task_id,))
            else:
                self._db.run("DELETE FROM longrun_effects WHERE task_id = ? AND step_id = ?", (task_id, item.key[0]))
            moved.append(item.name)
        if moved:
            # The moves are evidence: keep them even though the load raises.
            self._db.keep_writes = True
            self._stored_steps.pop(task_id, None)
            self._stored_outlines.pop(task_id, None)
            self._blobs.pop(task_id, None)
            log.warning("task %s: moved damaged rows to the quarantine: %s", task_id, moved)
        return moved

    def _put_state(self, state: RunState, changed: Collection[str] | None) -> None:
        write = self._state_write(state, changed)
        self._write_state_rows(write)
        self._state_written(write)

    def _state_write(self, state: RunState, changed: Collection[str] | None) -> StateWrite:
        """Everything a commit writes, encoded and checked before the first statement (a refusal
        writes nothing): the header, the effect rows that changed, the rows to delete, the new
        blobs, the summary and the outline row. Reads nothing from the database."""
        task_id = state.task_id
        header = encode(dataclasses.replace(state, effects={}, plan_outline=None))
        check_loadable(header, f"task {task_id!r}: the state header")
        stored = self._stored_steps.get(task_id)
        delta = None if stored is None or changed is None else self._effect_delta(stored, state.effects, changed)
        deleted: list[str] | None
        if delta is None:
            # Not known what changed (or a record was removed, or added out of plan order): write
            # every record, in plan order, and delete the rows of records that are gone. O(n).
            deleted = sorted(set(stored) - state.effects.keys()) if stored is not None else None
            to_write = [(step_id, position) for position, step_id in enumerate(state.effects)]
            now_stored: dict[str, int] = {}
        else:
            assert stored is not None
            deleted, to_write, now_stored = [], delta, stored
        codec = self._blobs.setdefault(task_id, BlobCodec())
        referenced: list[BlobRef] = []
        rows: list[tuple[str, int, str, str]] = []
        for step_id, position in to_write:
            record_json = stored_record_json(state.effects[step_id], codec, referenced)  # a large value as a reference
            body = canonical_bytes({"task_id": task_id, "record": record_json}, what=f"effect record {step_id!r}")
            check_loadable(body, f"task {task_id!r}: the effect record of step {step_id!r}")
            rows.append((step_id, position, body.decode("utf-8"), row_checksum(body)))
        outline = state.plan_outline
        outline_body = None  # the outline row is written only when the outline is not the one stored
        outline_changed = task_id not in self._stored_outlines or self._stored_outlines[task_id] is not outline
        if outline_changed and outline is not None:
            outline_body = canonical_bytes({"task_id": task_id, "plan_outline": outline.to_json()})
            check_loadable(outline_body, f"task {task_id!r}: the plan outline")
        return StateWrite(
            state=state, header=header.decode("utf-8"), header_checksum=row_checksum(header), rows=rows, deleted=deleted,
            blobs=codec.to_write(referenced), summary=summarize(state), outline_changed=outline_changed,
            outline_body=None if outline_body is None else outline_body.decode("utf-8"),
            outline_checksum=None if outline_body is None else row_checksum(outline_body),
            now_stored=now_stored, full=delta is None,
        )  # fmt: skip

    def _write_state_rows(self, write: StateWrite) -> None:
        """The statements of a commit, in the open transaction (whose task row is locked)."""
        state = write.state
        task_id = state.task_id
        # The database checks the fence and the revision itself, in this transaction.
        cursor = self._db.run(
            "UPDATE longrun_tasks SET revision_floor = ? WHERE task_id = ? AND revision_floor < ? "
            "AND EXISTS (SELECT 1 FROM longrun_leases WHERE task_id = ? AND epoch = ?)",
            (state.revision, task_id, state.revision, task_id, state.lease_epoch),
        )
        if cursor.rowcount != 1:
            lease = self._get_lease(task_id)
            if lease is None or lease.epoch != state.lease_epoch:
                raise FencedError(
                    f"state write for {task_id!r} at epoch {state.lease_epoch} refused by the database",
                    current_epoch=lease.epoch if lease else None,
                    write_epoch=state.lease_epoch,
                )
            raise StorageError(f"state write for {task_id!r}: revision {state.revision} is not above the stored revision")
        self._db.run(
            "INSERT INTO longrun_states (task_id, revision, epoch, plan_digest, status, next_action, effect_count, "
            "header, checksum, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (task_id) DO UPDATE SET revision = excluded.revision, epoch = excluded.epoch, "
            "plan_digest = excluded.plan_digest, status = excluded.status, next_action = excluded.next_action, "
            "effect_count = excluded.effect_count, header = excluded.header, checksum = excluded.checksum, "
            "updated_at = excluded.updated_at",
            (
                task_id, state.revision, state.lease_epoch, state.plan_digest, state.status.value, state.next_action,
                len(state.effects), write.header, write.header_checksum, state.updated_at,
            ),
        )
        deleted = write.deleted
        if deleted is None:
            known = {row[0] for row in self._db.rows("SELECT step_id FROM longrun_effects WHERE task_id = ?", (task_id,))}
            deleted = sorted(known - state.effects.keys())
        for step_id in deleted:
            self._db.run("DELETE FROM longrun_effects WHERE task_id = ? AND step_id = ?", (task_id, step_id))
        if write.blobs:  # in this transaction, before the rows that reference them; a stored one is kept as it is
            self._db.run_many(
                "INSERT INTO longrun_blobs (task_id, digest, data) VALUES (?, ?, ?) ON CONFLICT (task_id, digest) DO NOTHING",
                [(task_id, blob.ref.sha256, blob.data) for blob in write.blobs],
            )
        if write.rows:
            self._db.run_many(
                "INSERT INTO longrun_effects (task_id, step_id, position, revision, record, checksum) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (task_id, step_id) DO UPDATE SET position = excluded.position, "
                "revision = excluded.revision, record = excluded.record, checksum = excluded.checksum",
                [(task_id, step_id, position, state.revision, body, checksum) for step_id, position, body, checksum in write.rows],
            )
        self._put_summary(write.summary)
        if write.outline_body is not None:
            self._db.run(
                "INSERT INTO longrun_plans (task_id, revision, body, checksum) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (task_id) DO UPDATE SET revision = excluded.revision, body = excluded.body, "
                "checksum = excluded.checksum",
                (task_id, state.revision, write.outline_body, write.outline_checksum),
            )
        elif write.outline_changed:
            self._db.run("DELETE FROM longrun_plans WHERE task_id = ?", (task_id,))

    def _state_written(self, write: StateWrite) -> None:
        """What this object knows is stored once ``write`` is in the database. Known only once its
        transaction commits; if the commit fails, ``BaseStore`` poisons the task and the repairing
        load it then requires resets this."""
        state = write.state
        task_id = state.task_id
        now_stored = write.now_stored
        now_stored.update((step_id, position) for step_id, position, _, _ in write.rows)
        self._stored_steps[task_id] = now_stored
        self._stored_outlines[task_id] = state.plan_outline
        codec = self._blobs.setdefault(task_id, BlobCodec())
        codec.written(write.blobs)
        if write.full or codec.remembered > 2 * len(state.effects) + 16:
            codec.keep_only(large_values(state.effects.values()))

    @staticmethod
    def _effect_delta(
        stored: dict[str, int], effects: dict[str, EffectRecord], changed: Collection[str]
    ) -> list[tuple[str, int]] | None:
        """The rows to write, ``(step id, position)``, when only ``changed`` and records not stored
        yet differ from the stored rows; None if that cannot be told without looking at every record.

        Work in proportion to ``changed``, not to the ledger: a record named in ``changed`` keeps
        its stored position; new records are the newest keys of the mapping (the runner adds steps
        in plan order), which their count reveals, as in the JSON-file store's journal. A record
        removed, or added without being named, or added anywhere but at the end, returns None."""
        names = dict.fromkeys(changed)  # once each, in the caller's order
        added = [step_id for step_id in names if step_id in effects and step_id not in stored]
        if len(stored) + len(added) != len(effects) or any(step_id in stored and step_id not in effects for step_id in names):
            return None
        rows = [(step_id, stored[step_id]) for step_id in names if step_id in stored]
        if added:
            newest = list(itertools.islice(reversed(effects), len(added)))
            if set(newest) != set(added):
                return None
            rows += [(step_id, len(effects) - 1 - offset) for offset, step_id in enumerate(newest)][::-1]
        return rows

    def record_new(self, states: Sequence[RunState], now: float) -> list[bool]:
        """``BaseStore.record_new`` in one transaction, whatever the count, a few statements per
        table for all the states together (multi-row inserts of ``_BATCH_ROWS``): for each state
        whose task row does not exist, the task row (its revision floor at 1), a released lease row
        at epoch 0 (so the first acquisition issues epoch 1 and the database's fence has a row to
        check), the state's header, effect, blob and outline rows as a commit writes them, and its
        summary row. A task whose row exists is left as it is. Every state is encoded and checked
        before the first statement (``InvalidInputError``, ``SizeLimitError``: nothing written);
        all or nothing: a failure writes none of them."""
        self._check_new(states)
        if not states:
            return []
        encoded = [self._first_rows(state) for state in states]
        ids = [state.task_id for state in states]
        with self._db.session(write=True, what=f"record {len(states)} new tasks"):
            new = self._insert_task_rows(ids, now)
            chosen = [rows for state, rows in zip(states, encoded) if state.task_id in new]
            tokens = {task_id: secrets.token_hex(16) for task_id in new}
            self._insert_rows("longrun_leases", "task_id, owner, epoch, acquired_at, expires_at, token",
                              [(task_id, self.RECORDER, 0, now, RELEASED, tokens[task_id]) for task_id in ids if task_id in new])  # fmt: skip
            self._insert_rows("longrun_blobs", "task_id, digest, data", [blob for rows in chosen for blob in rows[2]], " ON CONFLICT (task_id, digest) DO NOTHING")
            self._insert_rows(
                "longrun_states", "task_id, revision, epoch, plan_digest, status, next_action, effect_count, header, checksum, updated_at",
                [rows[0] for rows in chosen],
            )
            self._insert_rows("longrun_effects", "task_id, step_id, position, revision, record, checksum", [row for rows in chosen for row in rows[1]])
            self._insert_rows("longrun_plans", "task_id, revision, body, checksum", [rows[3] for rows in chosen if rows[3] is not None])
            self._insert_rows("longrun_summaries", self._SUMMARY_COLUMNS, [rows[4] for rows in chosen])
        for state in states:
            if state.task_id in new:  # as a commit changes the state it writes
                state.revision, state.lease_epoch, state.lease_owner, state.lease_expires_at = 1, 0, self.RECORDER, RELEASED
        return [task_id in new for task_id in ids]

    _BATCH_ROWS = 100
    """Rows a multi-row insert carries (at most 10 columns: within every SQLite's 999 parameters)."""

    def _insert_task_rows(self, task_ids: list[str], now: float) -> set[str]:
        """Insert the task rows of ``task_ids`` that do not exist; the ids inserted."""
        new: set[str] = set()
        for first in range(0, len(task_ids), self._BATCH_ROWS):
            chunk = task_ids[first : first + self._BATCH_ROWS]
            values = ", ".join("(?, ?, 1)" for _ in chunk)
            params = [value for task_id in chunk for value in (task_id, now)]
            statement = f"INSERT INTO longrun_tasks (task_id, created_at, revision_floor) VALUES {values} ON CONFLICT (task_id) DO NOTHING"
            if self.placeholder == "?":
                # SQLite: the write transaction (BEGIN IMMEDIATE) holds out every other writer, so the
                # rows not there before the insert are the ones it made (no RETURNING before 3.35).
                marks = ", ".join("?" * len(chunk))
                existing = {str(row[0]) for row in self._db.rows(f"SELECT task_id FROM longrun_tasks WHERE task_id IN ({marks})", chunk)}
                self._db.run(statement, params)
                new.update(task_id for task_id in chunk if task_id not in existing)
            else:  # a concurrent transaction may insert one meanwhile: the rows this statement made say which
                new.update(str(row[0]) for row in self._db.rows(statement + " RETURNING task_id", params))
        return new

    def _insert_rows(self, table: str, columns: str, rows: Sequence[Sequence[object]], suffix: str = "") -> None:
        """Insert ``rows`` into ``table``, ``_BATCH_ROWS`` rows a statement."""
        width = columns.count(",") + 1
        mark = "(" + ", ".join("?" * width) + ")"
        for first in range(0, len(rows), self._BATCH_ROWS):
            chunk = rows[first : first + self._BATCH_ROWS]
            self._db.run(f"INSERT INTO {table} ({columns}) VALUES {', '.join([mark] * len(chunk))}{suffix}", [value for row in chunk for value in row])

    def _first_rows(
        self, state: RunState
    ) -> tuple[tuple[object, ...], list[tuple[object, ...]], list[tuple[object, ...]], tuple[object, ...] | None, tuple[object, ...]]:
        """The rows of ``state`` as its first revision (1, the recorder's epoch 0): its header row,
        its effect rows, its blob rows, its outline row (None without an outline) and its summary
        row, each encoded and checked as ``_put_state`` does, before anything is written."""
        task_id = state.task_id
        bare = object.__new__(RunState)  # a shallow copy: the state was checked (``_check_new``), nothing to check again
        bare.__dict__.update(state.__dict__)
        bare.revision, bare.lease_epoch, bare.lease_owner, bare.lease_expires_at = 1, 0, self.RECORDER, RELEASED
        bare.effects, bare.plan_outline = {}, None
        header = encode(bare)
        check_loadable(header, f"task {task_id!r}: the state header")
        codec = BlobCodec()
        referenced: list[BlobRef] = []
        effects: list[tuple[object, ...]] = []
        for position, (step_id, record) in enumerate(state.effects.items()):
            body = canonical_bytes({"task_id": task_id, "record": stored_record_json(record, codec, referenced)}, what=f"effect record {step_id!r}")
            check_loadable(body, f"task {task_id!r}: the effect record of step {step_id!r}")
            effects.append((task_id, step_id, position, 1, body.decode("utf-8"), row_checksum(body)))
        outline: tuple[object, ...] | None = None
        if state.plan_outline is not None:
            body = canonical_bytes({"task_id": task_id, "plan_outline": state.plan_outline.to_json()})
            check_loadable(body, f"task {task_id!r}: the plan outline")
            outline = (task_id, 1, body.decode("utf-8"), row_checksum(body))
        row: tuple[object, ...] = (
            task_id, 1, 0, state.plan_digest, state.status.value, state.next_action, len(state.effects),
            header.decode("utf-8"), row_checksum(header), state.updated_at,
        )  # fmt: skip
        blobs: list[tuple[object, ...]] = [(task_id, blob.ref.sha256, blob.data) for blob in codec.to_write(referenced)]
        return row, effects, blobs, outline, tuple(summarize(state, revision=1).to_json().values())

    # -- control records ----------------------------------------------------------------------

    @staticmethod
    def _control(name: str, body: object) -> ControlRecord:
        data = utf8_bytes(column_text(body))
        if data is None:
            raw = bytes(body) if isinstance(body, (bytes, bytearray, memoryview)) else repr(body).encode("utf-8", "replace")
            return ControlRecord(name=name, error="not UTF-8 text", digest=row_checksum(raw))
        return parse_control_record(name, data)

    def read_cancellation(self, task_id: str) -> ControlRecord | None:
        with self._transaction(task_id, create=False, write=False):
            row = self._db.one("SELECT body FROM longrun_cancellations WHERE task_id = ?", (task_id,))
        return None if row is None else self._control(f"longrun_cancellations/{task_id}", row[0])

    def write_cancellation(self, record: Cancellation) -> None:
        body = canonical_bytes(record.to_json()).decode("utf-8")
        with self._transaction(record.task_id, create=False):
            self._db.run(
                f"INSERT INTO longrun_cancellations (task_id, body, written_at) VALUES (?, ?, {self._now_sql()}) "
                "ON CONFLICT (task_id) DO UPDATE SET body = excluded.body, written_at = excluded.written_at",
                (record.task_id, body),
            )

    def read_approvals(self, task_id: str) -> tuple[ControlRecord, ...]:
        with self._transaction(task_id, create=False, write=False):
            rows = self._db.rows(
                "SELECT approval_id, body FROM longrun_approvals WHERE task_id = ? LIMIT ?", (task_id, MAX_APPROVALS + 1)
            )
        if len(rows) > MAX_APPROVALS:
            raise StorageError(f"task {task_id!r} has over {MAX_APPROVALS} approval records")
        rows.sort(key=lambda row: str(row[0]))
        return tuple(self._control(f"longrun_approvals/{row[0]}", row[1]) for row in rows)

    def write_approval(self, approval: Approval) -> None:
        check_task_id(approval.approval_id, what="approval id")
        body = canonical_bytes(approval.to_json()).decode("utf-8")
        with self._transaction(approval.task_id, create=False):
            self._db.run(
                f"INSERT INTO longrun_approvals (task_id, approval_id, body, written_at) VALUES (?, ?, ?, {self._now_sql()}) "
                "ON CONFLICT (task_id, approval_id) DO UPDATE SET body = excluded.body, written_at = excluded.written_at",
                (approval.task_id, approval.approval_id, body),
            )

    # -- deletion -----------------------------------------------------------------------------

    _TASK_TABLES = (
        "longrun_effects", "longrun_blobs", "longrun_plans", "longrun_states", "longrun_approvals",
        "longrun_cancellations", "longrun_messages", "longrun_quarantine", "longrun_leases", "longrun_summaries",
    )  # fmt: skip

    def _delete_task(self, task_id: str) -> list[str]:
        """Every row of the task, and its fleet queue row where the fleet's tables are in this
        database, deleted in the task's one transaction: it commits whole or not at all. A blob
        row belongs to one task (its key holds the task id), so no other task loses one."""
        removed = []
        for table in self._TASK_TABLES:
            count = int(self._db.run(f"DELETE FROM {table} WHERE task_id = ?", (task_id,)).rowcount)
            if count > 0:
                removed.append(f"{table}: {count} row{'s' if count != 1 else ''}")
        if self._db.one(self._queue_table_sql()) is not None:
            if int(self._db.run("DELETE FROM longrun_queue WHERE task_id = ?", (task_id,)).rowcount) > 0:
                removed.append("longrun_queue: its row")
        self._db.run("DELETE FROM longrun_tasks WHERE task_id = ?", (task_id,))
        removed.append("longrun_tasks: its row")
        self._stored_steps.pop(task_id, None)
        self._stored_outlines.pop(task_id, None)
        self._blobs.pop(task_id, None)
        return removed

    def _queue_table_sql(self) -> str:
        """A row if the fleet's queue table exists in this database (``stores.queue``)."""
        raise NotImplementedError
    # -- messages -----------------------------------------------------------------------------

    def _message_with_key(self, task_id: str, key: str) -> Message | None:
        row = self._db.one("SELECT seq, body FROM longrun_messages WHERE task_id = ? AND msg_key = ?", (task_id, key))
        return None if row is None else self._message(task_id, row[0], row[1])

    def _last_message_seq(self, task_id: str) -> int:
        row = self._db.one("SELECT MAX(seq) FROM longrun_messages WHERE task_id = ?", (task_id,))
        return 0 if row is None or row[0] is None else int(row[0])

    def _put_message(self, message: Message) -> None:
        self._db.run(
            f"INSERT INTO longrun_messages (task_id, seq, msg_key, topic, body, written_at) VALUES (?, ?, ?, ?, ?, {self._now_sql()})",
            (message.task_id, message.seq, message.key, message.topic, encode_message(message).decode("utf-8")),
        )

    def _get_messages(self, task_id: str, topic: str | None) -> list[Message]:
        if topic is None:
            rows = self._db.rows("SELECT seq, body FROM longrun_messages WHERE task_id = ? ORDER BY seq", (task_id,))
        else:
            rows = self._db.rows("SELECT seq, body FROM longrun_messages WHERE task_id = ? AND topic = ? ORDER BY seq", (task_id, topic))
        return [self._message(task_id, row[0], row[1]) for row in rows]

    @staticmethod
    def _message(task_id: str, seq: object, body: object) -> Message:
        name = f"longrun_messages/{task_id}/{seq}"
        data = utf8_bytes(column_text(body))
        if data is None:
            raise CorruptStateError(f"message {name} is damaged: not UTF-8 text")
        message = decode_message(data, name)
        if message.seq != seq:
            raise CorruptStateError(f"message {name} is damaged: it holds number {message.seq}")
        return message

    # -- listing ------------------------------------------------------------------------------

    def list_tasks(self) -> list[str]:
        with self._db.session(write=False, what="list tasks"):
            rows = self._db.rows("SELECT task_id FROM longrun_tasks")
        return sorted(str(row[0]) for row in rows)

    _SUMMARY_COLUMNS = SUMMARY_COLUMNS

    def _put_summary(self, summary: TaskSummary) -> None:
        """Upsert the task's summary row, in the open transaction (a commit's: see ``_put_state``)."""
        self._db.run(
            f"INSERT INTO longrun_summaries ({self._SUMMARY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (task_id) DO UPDATE SET status = excluded.status, revision = excluded.revision, "
            "function = excluded.function, parent = excluded.parent, created_at = excluded.created_at, "
            "updated_at = excluded.updated_at, wake_at = excluded.wake_at, error = excluded.error, "
            "next_action = excluded.next_action",
            tuple(summary.to_json().values()),
        )

    def _migrated(self, version: int) -> None:
        """Version 7: build every task's summary row from its stored state, in the migration's transaction."""
        if version != 7:
            return
        tasks = self._db.rows("SELECT task_id, created_at FROM longrun_tasks")
        for task_id, created_at in tasks:
            created_at = float(created_at) if isinstance(created_at, (int, float)) else None
            try:
                state = self._get_state(str(task_id), repair=False).state
            except LongrunError as exc:
                # Damaged or foreign: listed as its header row last said, with why it cannot be read.
                row = self._db.one("SELECT status, revision, updated_at, next_action FROM longrun_states WHERE task_id = ?", (task_id,))
                status, revision, updated_at, next_action = row if row is not None else (NEW, 0, None, "")
                summary = TaskSummary(
                    str(task_id), status if status in SUMMARY_STATUSES else UNREADABLE,
                    revision if type(revision) is int else 0, created_at=created_at,
                    updated_at=updated_at if isinstance(updated_at, float) else None,
                    error=str(exc)[:MAX_ERROR_CHARS], next_action=next_action if isinstance(next_action, str) else "",
                )  # fmt: skip
            else:
                summary = summarize(state) if state is not None else TaskSummary(str(task_id), NEW, created_at=created_at)
            self._put_summary(summary)
        log.info("%r: summary rows built for %d tasks", self, len(tasks))

    def list_summaries(
        self,
        *,
        statuses: Iterable[str] = (),
        functions: Iterable[str] = (),
        parent: str | None = None,
        match: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[TaskSummary]:
        """``BaseStore.list_summaries`` from the summary rows and their indexes: O(page) for a page
        of the whole store or of one status or function. Every row is exactly the summary of the
        task's latest committed state: each commit writes it in its own transaction."""
        query = SummaryQuery.of(
            statuses=statuses, functions=functions, parent=parent, match=match, since=since, until=until, limit=limit, offset=offset
        )
        tail, params = query.sql(self._match_sql(), desc=self.types["desc"], sqlite=self.placeholder == "?")
        with self._db.session(write=False, what="list task summaries"):
            rows = self._db.rows(
f"SELECT {self._SUMMARY_COLUMNS} FROM longrun_summaries{tail}", params
            )
        names = self._SUMMARY_COLUMNS.split(", ")
        summaries = []
        for row in rows:
            try:
                summaries.append(TaskSummary.from_json(dict(zip(names, row))))
            except CorruptStateError as exc:
                raise CorruptStateError(f"{self!r}: the summary row of task {str(row[0])!r:.80} is damaged: {exc}") from exc
        return summaries

    def status_counts(self) -> dict[str, int]:
        """How many tasks have each status, from the status count rows (schema version 9) that
        triggers on the summary rows keep in each commit's transaction: a few rows, not one a task."""
        with self._db.session(write=False, what="count tasks by status"):
            rows = self._db.rows(STATUS_COUNTS_SQL.format(counts="longrun_status_counts"))
        return {str(status): int(count) for status, count in rows}

    def count_summaries(
        self,
        *,
        statuses: Iterable[str] = (),
        functions: Iterable[str] = (),
        parent: str | None = None,
        match: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> int:
        """``BaseStore.count_summaries``, counted on the summary rows and their indexes."""
        query = SummaryQuery.of(statuses=statuses, functions=functions, parent=parent, match=match, since=since, until=until)
        where, params = query.sql(self._match_sql(), count=True)
        with self._db.session(write=False, what="count task summaries"):
            row = self._db.one(f"SELECT COUNT(*) FROM longrun_summaries{where}", params)
        return int(row[0])

    def function_names(self) -> list[str]:
        """``BaseStore.function_names`` from the summary rows' function index: one seek a name
        (``FUNCTION_NAMES_SQL``), not a scan of every row."""
        with self._db.session(write=False, what="list the functions"):
            rows = self._db.rows(FUNCTION_NAMES_SQL.format(table="longrun_summaries"))
        return sorted(str(row[0]) for row in rows)
