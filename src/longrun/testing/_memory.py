"""An in-memory store for users' unit tests: the rules of every store, without a disk or a database.

``MemoryStore`` is a ``BaseStore`` (see ``longrun.stores.base``), so it keeps the same invariants as
the stores longrun ships: epochs that only grow, the secret lease token, fencing of every write
that carries a lease, revisions that only grow, a task refused after a failed write until it is
loaded again, expiry judged on the caller's monotonic timeline when it has one, the witness check.
It keeps each task's records as the bytes a file store would write (the state envelope, the
lease record, the control records), and reads them back through the same loaders, so a state
that a real store would refuse to write, or could not read back, fails here in the same way.
It passes the store contract suite (``longrun.testing.store_contract``).

Two store objects see each other's writes only if they share their tasks: ``MemoryStore(other)``
is a new store object over ``other``'s tasks, as another process would see a file store's.
``records(task_id)`` hands over a task's raw records, for a test that damages them on purpose;
``fault``, if given, is called before every read or write of a task's records with the
operation's name and the task id, and what it raises fails that operation the way an I/O error
would (an ``OSError`` becomes a ``StorageError``).

Not guaranteed: anything across processes (the tasks live in this process's memory and end with
it), or durability of any kind. Holders are judged by expiry alone (no kernel lock shows a holder
dead), as on a store shared by several machines.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from typing import Callable, Collection, Generator

from ..approval import Approval
from ..cancellation import Cancellation
from ..canonical import canonical_bytes, parse_json, sha256_hex
from ..contract import check_task_id
from ..control import MAX_RECORD_BYTES, ControlRecord, parse_control_record
from ..envelope import RunState, check_loadable, decode, encode
from ..errors import (
    CorruptStateError,
    ForeignStateError,
    LongrunError,
    SchemaVersionError,
    StateUnrecoverableError,
    StorageError,
    UnknownTaskError,
)
from ..lease import Lease
from ..messages import Message, decode_message, encode_message
from ..protocols import LoadResult
from ..stores.blobs import BlobCodec, BlobFetcher, BlobRef, large_values, resolve_record_json, stored_record_json
from ..stores.base import BaseStore

__all__ = ["MemoryStore", "TaskRecords"]

log = logging.getLogger("longrun")

OPERATIONS = ("read-lease", "write-lease", "read-state", "write-state", "read-control", "write-control", "read-messages", "write-messages")
"""The operation names ``fault`` is called with."""


@dataclasses.dataclass
class TaskRecords:
    """One task's records as a ``MemoryStore`` keeps them: bytes, as a file store writes them.

    Change them only to damage a task on purpose; the store validates them whenever it reads them."""

    lease: bytes | None = None
    """The lease record (``Lease.to_json``, canonical JSON), token included."""
    state: bytes | None = None
    """The state envelope (``longrun.envelope.encode``) of the last committed revision, large payloads and
    results in it as references to ``blobs``."""
    cancellation: bytes | None = None
    approvals: dict[str, bytes] = dataclasses.field(default_factory=dict)
    """Approval records by approval id."""
    revision_floor: int = 0
    """The highest revision ever committed: the next commit gets one above it, whatever happened to ``state``."""
    epoch_floor: int = 0
    """The highest epoch ever issued: a lease record repaired after damage starts above it."""
    quarantine: list[tuple[str, str, bytes]] = dataclasses.field(default_factory=list)
    """Damaged records set aside, never deleted: (what, why, the bytes)."""
    blobs: dict[str, bytes] = dataclasses.field(default_factory=dict)
    """Large payloads and results, by the SHA-256 (hex) of their canonical bytes (``stores.blobs``):
    the state references them, written in the same commit, never rewritten."""
    messages: list[bytes] = dataclasses.field(default_factory=list)
    """The task's mailbox (``messages.encode_message``), in the order the sends committed: message
    ``seq`` is item ``seq - 1``."""


class _Tasks:
    """The tasks that store objects share, and the one lock that makes each access a transaction."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.records: dict[str, TaskRecords] = {}


class MemoryStore(BaseStore):
    """A ``Store`` in this process's memory (see the module docstring)."""

    def __init__(self, shared_with: "MemoryStore | None" = None, *, fault: Callable[[str, str], None] | None = None):
        super().__init__()
        self._tasks: _Tasks = shared_with._tasks if shared_with is not None else _Tasks()
        self._fault = fault
        self._codecs: dict[str, BlobCodec] = {}

    def __repr__(self) -> str:
        return f"MemoryStore(<{len(self._tasks.records)} tasks at {id(self._tasks):#x}>)"

    def records(self, task_id: str) -> TaskRecords:
        """The task's raw records (``UnknownTaskError`` if there is no such task), for a test that damages them."""
        check_task_id(task_id)
        with self._tasks.lock:
            found = self._tasks.records.get(task_id)
        if found is None:
            raise UnknownTaskError(f"no task {task_id!r} in {self!r}")
        return found

    # -- the primitives BaseStore asks for ------------------------------------------------------

    def _touch(self, operation: str, task_id: str) -> TaskRecords:
        """The task's records, once ``fault`` (if any) has had its say about ``operation``."""
        if self._fault is not None:
            self._fault(operation, task_id)
        return self._tasks.records[task_id]

    @contextlib.contextmanager
    def _transaction(self, task_id: str, *, create: bool, write: bool = True) -> Generator[None, None, None]:
        check_task_id(task_id)
        with self._tasks.lock:
            if task_id not in self._tasks.records:
                if not create:
                    raise UnknownTaskError(f"no task {task_id!r} in {self!r}")
                self._tasks.records[task_id] = TaskRecords()
            try:
                yield
            except OSError as exc:
                if isinstance(exc, LongrunError):
                    raise
                raise StorageError(f"{self!r}: task {task_id!r}: {exc}") from exc

    def _get_lease(self, task_id: str) -> Lease | None:
        data = self._touch("read-lease", task_id).lease
        if data is None:
            return None
        try:
            return Lease.from_json(parse_json(data, what="the lease record", max_bytes=MAX_RECORD_BYTES, unique_keys=True))
        except CorruptStateError as exc:
            raise CorruptStateError(f"lease record of {task_id!r} is damaged: {exc}") from exc

    def _put_lease(self, lease: Lease) -> None:
        data = canonical_bytes(lease.to_json())
        records = self._touch("write-lease", lease.task_id)
        records.lease = data
        records.epoch_floor = max(records.epoch_floor, lease.epoch)

    def _epoch_floor(self, task_id: str) -> int:
        return self._tasks.records[task_id].epoch_floor

    def _set_lease_aside(self, task_id: str, reason: str) -> str:
        records = self._touch("write-lease", task_id)
        records.quarantine.append(("lease", reason, records.lease or b""))
        records.lease = None
        return f"quarantine/{len(records.quarantine) - 1} (the lease record of {task_id})"

    def _get_state(self, task_id: str, *, repair: bool) -> LoadResult:
        records = self._touch("read-state", task_id)
        data = records.state
        if data is None:
            if any(what == "state" for what, _, _ in records.quarantine):
                # Damaged state was set aside: starting afresh would repeat every effect it recorded.
                raise StateUnrecoverableError(
                    f"task {task_id!r}: its damaged state was set aside and nothing replaced it; restore it or retire the task id"
                )
            return LoadResult(state=None, revision_floor=records.revision_floor)
        blobs = records.blobs
        fetch = BlobFetcher(blobs.get)
        try:
            state = decode(data, expected_task=task_id, resolve=lambda raw: resolve_record_json(raw, fetch, "an effect record"))
        except (ForeignStateError, SchemaVersionError):
            raise  # well formed but not ours to repair: refuse, move nothing
        except CorruptStateError as exc:
            if repair:
                records.quarantine.append(("state", str(exc), data))
                records.state = None
                log.warning("task %s: damaged state moved to the quarantine of %r (%s)", task_id, self, exc)
            raise StateUnrecoverableError(
                f"task {task_id!r}: the stored state does not validate ({exc}); "
                + ("it was moved to the quarantine" if repair else "it was left in place (read-only load)")
                + ". An in-memory store keeps no backup revision"
            ) from exc
        if repair:
            codec = self._codecs.setdefault(task_id, BlobCodec())
            for value, ref in fetch.seen:
                codec.read(value, ref)
        return LoadResult(
            state=state, source="primary", digest="sha256:" + sha256_hex(data), revision_floor=max(records.revision_floor, state.revision)
        )

    def _put_state(self, state: RunState, changed: Collection[str] | None) -> None:
        # The whole state, every time: ``changed`` saves a file or a database work, not memory.
        # Large values are written as references; their blobs in the same commit, once.
        codec = self._codecs.setdefault(state.task_id, BlobCodec())
        referenced: list[BlobRef] = []
        data = encode(state, record_json=lambda record: stored_record_json(record, codec, referenced))
        check_loadable(data, f"task {state.task_id!r}: the state")
        records = self._touch("write-state", state.task_id)
        missing = [ref for ref in referenced if ref.sha256 not in records.blobs]
        codec.stored.difference_update(ref.sha256 for ref in missing)
        new_blobs = codec.to_write(missing)
        for blob in new_blobs:
            records.blobs[blob.ref.sha256] = blob.data
        codec.written(new_blobs)
        records.state = data
        records.revision_floor = max(records.revision_floor, state.revision)
        codec.keep_only(large_values(state.effects.values()))

    # -- control records ----------------------------------------------------------------------

    def read_cancellation(self, task_id: str) -> ControlRecord | None:
        with self._transaction(task_id, create=False, write=False):
            data = self._touch("read-control", task_id).cancellation
        return None if data is None else parse_control_record(f"cancellation of {task_id}", data)

    def write_cancellation(self, record: Cancellation) -> None:
        data = canonical_bytes(record.to_json())
        with self._transaction(record.task_id, create=False):
            self._touch("write-control", record.task_id).cancellation = data

    def read_approvals(self, task_id: str) -> tuple[ControlRecord, ...]:
        with self._transaction(task_id, create=False, write=False):
            approvals = dict(self._touch("read-control", task_id).approvals)
        return tuple(parse_control_record(f"approval {approval_id} of {task_id}", approvals[approval_id]) for approval_id in sorted(approvals))

    def write_approval(self, approval: Approval) -> None:
        check_task_id(approval.approval_id, what="approval id")
        data = canonical_bytes(approval.to_json())
        with self._transaction(approval.task_id, create=False):
            self._touch("write-control", approval.task_id).approvals[approval.approval_id] = data

    def _delete_task(self, task_id: str) -> list[str]:
        """The task's records go with one dictionary deletion, under the lock every access takes."""
        self._touch("delete", task_id)
        with self._tasks.lock:
            del self._tasks.records[task_id]
        self._codecs.pop(task_id, None)
        return [f"the records of task {task_id}"]
    # -- messages (``BaseStore`` holds the task's transaction) ---------------------------------------

    def _stored_messages(self, task_id: str) -> list[Message]:
        data = list(self._touch("read-messages", task_id).messages)
        return [decode_message(item, f"{seq} of {task_id}") for seq, item in enumerate(data, start=1)]

    def _message_with_key(self, task_id: str, key: str) -> Message | None:
        return next((message for message in self._stored_messages(task_id) if message.key == key), None)

    def _last_message_seq(self, task_id: str) -> int:
        return len(self._touch("read-messages", task_id).messages)

    def _put_message(self, message: Message) -> None:
        messages = self._touch("write-messages", message.task_id).messages
        assert message.seq == len(messages) + 1, "numbers follow the order the sends commit"
        messages.append(encode_message(message))

    def _get_messages(self, task_id: str, topic: str | None) -> list[Message]:
        messages = self._stored_messages(task_id)
        return messages if topic is None else [message for message in messages if message.topic == topic]

    def list_tasks(self) -> list[str]:
        with self._tasks.lock:
            return sorted(self._tasks.records)
