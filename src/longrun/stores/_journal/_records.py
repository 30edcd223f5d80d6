"""A journal file: its meta, and the records that continue a chain of revisions from a snapshot.

Holds ``encode_journal_meta`` and ``journal_base`` (the meta line), ``Shadow`` (the writer's side:
the record naming what a commit changed), ``Replay`` (the reader's side: records applied in order
to a snapshot's raw header and rows, each checked before it changes anything), ``describe_record``
(a record in words, for ``history``) and ``highest_epoch`` (the epoch floor any file's good lines
prove).
"""

from __future__ import annotations

from typing import Any, Callable, Collection

from ..._fields import MAX_INT
from ...envelope import RunState
from ...errors import CorruptStateError
from ...ledger import EffectRecord
from ...outcome import Status
from ..blobs import BLOBS_KEY, BlobCodec, BlobRef
from ._lines import JOURNAL_FORMAT, SCHEMA_VERSION, loads, meta_line, parse_meta, scan
from ._rows import (
    BLOB_ROW_FIELDS,
    BLOBS_AT,
    CHANGE_INDEX,
    EFFECT_FIELDS,
    FIRST_EFFECT_FIELDS,
    HEADER_KEYS,
    LIST_KEYS,
    ROW_WIDTHS,
    RECORD_KEYS,
    SCALAR_KEYS,
    BlobFetch,
    build_state,
    header_of,
    record_changes,
    row_of,
    scalar_values,
)
from ._snapshot import RawSnapshot

__all__ = ["Replay", "Shadow", "describe_record", "encode_journal_meta", "highest_epoch", "journal_base"]

_RECORD_KEYS = frozenset(("rev", "epoch", "set", "extend", "effects"))


def describe_record(body: bytes) -> dict[str, Any]:
    """One journal line as a timeline entry: revision, epoch, time, and what changed, in words.

    For reading only (``JsonFileStore.history``); it validates the framing's JSON and the shape it
    reads, not every field (``Replay`` does that when state is loaded)."""
    record = loads(body, "journal record")
    if not isinstance(record, dict) or not isinstance(record.get("rev"), int) or not isinstance(record.get("epoch"), int):
        raise CorruptStateError("journal record: not an object with an integer rev and epoch")
    assignments = record.get("set") or {}
    effects = record.get("effects") or {}
    if not isinstance(assignments, dict) or not isinstance(effects, dict):
        raise CorruptStateError("journal record: 'set' and 'effects' must be objects")
    changes: list[str] = []
    for step_id, change in effects.items():
        if change is None:
            changes.append(f"{step_id}: record removed")
        elif isinstance(change, list) and len(change) in ROW_WIDTHS:
            row = dict(zip(BLOB_ROW_FIELDS, change))
            changes.append(f"{step_id}: {row['state']} (attempt {row['attempts']}, payload {row['payload_digest']})")
        elif isinstance(change, dict):
            parts = [f"{name} -> {change[name]}" for name in ("state", "attempts", "approval_id") if name in change]
            parts += [f"{name} updated" for name in ("receipt", "evidence", "last_error", "result") if name in change]
            changes.append(f"{step_id}: " + (", ".join(parts) if parts else "fields updated"))
        else:
            raise CorruptStateError(f"journal record: effect change for {step_id!r} has an unknown shape")
    for key in ("status", "current_step", "lease_owner", "lease_epoch", "reconcile_all"):
        if key in assignments:
            changes.append(f"{key} -> {assignments[key]}")
    outline = assignments.get("plan_outline")
    if isinstance(outline, dict) and isinstance(outline.get("steps"), list):
        changes.append(f"plan outline recorded ({len(outline['steps'])} steps)")
    extensions = record.get("extend") or {}
    if isinstance(extensions, dict):
        for key, change in extensions.items():
            added = change.get("add") if isinstance(change, dict) else None
            if key == "consumed_approvals" and isinstance(added, list):
                changes.append("approval consumed: " + ", ".join(str(item) for item in added))
            elif key == "control_observations" and isinstance(added, list):
                changes += [f"control record read: {item.get('detail')}" for item in added if isinstance(item, dict)]
    at = assignments.get("updated_at")
    return {
        "revision": record["rev"],
        "epoch": record["epoch"],
        "at": at if isinstance(at, (int, float)) and not isinstance(at, bool) else None,
        "changes": changes,
        "description": "; ".join(changes) if changes else "header fields updated",
    }


def highest_epoch(data: bytes) -> int:
    """The highest lease epoch named by any checksum-valid line of a snapshot or journal file (0 if none).

    For a floor when the lease record is lost or damaged: a damaged file still proves the epochs
    its good lines name, so each line is read on its own and one that does not parse is passed over
    (the file's damage is reported by ``load``, not here)."""
    highest = 0
    epoch_index = EFFECT_FIELDS.index("epoch")
    for body in scan(data, padded=True).bodies:
        try:
            value = loads(body, "line")
        except CorruptStateError:
            continue  # counted as no epoch: the floor only ever rises
        candidates: list[object] = []
        if isinstance(value, dict):
            changed = value.get("set")
            candidates += [value.get("epoch"), value.get("lease_epoch")]
            if isinstance(changed, dict):
                candidates.append(changed.get("lease_epoch"))
            effects = value.get("effects")
            if isinstance(effects, dict):
                for change in effects.values():
                    if isinstance(change, list) and len(change) in (len(EFFECT_FIELDS), len(BLOB_ROW_FIELDS)):
                        candidates.append(change[epoch_index])
                    elif isinstance(change, dict):
                        candidates.append(change.get("epoch"))
        elif isinstance(value, list):  # a snapshot's line of effect rows
            candidates += [
                row[epoch_index] for row in value if isinstance(row, list) and len(row) in (len(EFFECT_FIELDS), len(BLOB_ROW_FIELDS))
            ]
        for candidate in candidates:
            if type(candidate) is int and 0 <= candidate <= MAX_INT:
                highest = max(highest, candidate)
    return highest


def encode_journal_meta(task_id: str, base: int) -> bytes:
    return meta_line({"format": JOURNAL_FORMAT, "schema_version": SCHEMA_VERSION, "task_id": task_id, "base": base})


def journal_base(first_line: bytes, *, task_id: str) -> int:
    meta = parse_meta(first_line, expected_format=JOURNAL_FORMAT, task_id=task_id)
    base = meta.get("base")
    if type(base) is not int or base < 0:
        raise CorruptStateError("journal meta: base must be an integer >= 0")
    return base


class Replay:
    """A state being rebuilt: a snapshot's raw header and rows, with journal records applied in order."""

    def __init__(self, snapshot: RawSnapshot):
        self.revision = snapshot.revision
        self.header = snapshot.header
        self.rows = snapshot.rows
        epoch = self.header.get("lease_epoch")
        self.epoch = epoch if type(epoch) is int else 0

    def apply_all(self, bodies: list[bytes]) -> tuple[int, CorruptStateError | None]:
        """Apply records in order; return how many were applied and why the next one was not.

        The bodies (each already checksum-valid) are parsed in one call, as one JSON array: one
        C-level parse instead of one per record. If that fails or miscounts (a body that is not a
        single JSON value), they are parsed one by one, which finds the first bad one."""
        try:
            records = loads(b"[" + b",".join(bodies) + b"]", "journal records") if bodies else []
        except CorruptStateError:
            records = None
        if records is None or len(records) != len(bodies):
            records = []
            for body in bodies:
                try:
                    records.append(loads(body, "journal record"))
                except CorruptStateError as exc:
                    applied, error = self.apply_all_parsed(records)
                    return applied, error or exc
        return self.apply_all_parsed(records)

    def apply_all_parsed(self, records: list[Any]) -> tuple[int, CorruptStateError | None]:
        for index, record in enumerate(records):
            try:
                self.apply_record(record)
            except CorruptStateError as exc:
                return index, exc
        return len(records), None

    def apply(self, body: bytes) -> None:
        """Apply one journal record; raise ``CorruptStateError`` (changing nothing) if it is malformed."""
        self.apply_record(loads(body, "journal record"))

    def apply_record(self, record: Any) -> None:
        if type(record) is not dict or not _RECORD_KEYS.issuperset(record):
            raise CorruptStateError("journal record must be an object with rev, epoch, set, extend, effects")
        revision, epoch = record.get("rev"), record.get("epoch")
        if type(revision) is not int or revision != self.revision + 1:
            raise CorruptStateError(f"journal record has revision {revision!r:.20}, expected {self.revision + 1}")
        if type(epoch) is not int or epoch < self.epoch:
            raise CorruptStateError(f"journal record revision {revision} has epoch {epoch!r:.20}, below {self.epoch}")
        assignments = record.get("set", {})
        extensions = record.get("extend", {})
        changes = record.get("effects", {})
        if type(assignments) is not dict or type(extensions) is not dict or type(changes) is not dict:
            raise CorruptStateError(f"journal record revision {revision} is malformed")
        # Check everything first, so that a malformed record changes nothing.
        if not HEADER_KEYS.issuperset(assignments) or not LIST_KEYS.issuperset(extensions):
            raise CorruptStateError(f"journal record revision {revision} names an unknown header field")
        if "task_id" in assignments and assignments["task_id"] != self.header.get("task_id"):
            raise CorruptStateError(f"journal record revision {revision} changes the task id")
        header = self.header
        extended: dict[str, list[Any]] = {}
        for key, change in extensions.items():
            current = assignments.get(key, header.get(key))
            drop = change.get("drop") if type(change) is dict else None
            add = change.get("add") if type(change) is dict else None
            if type(current) is not list or type(drop) is not int or not 0 <= drop <= len(current) or type(add) is not list:
                raise CorruptStateError(f"journal record revision {revision}: bad extension of {key}")
            extended[key] = current[drop:] + add
        rows = self.rows
        for step_id, change in changes.items():
            if change is None or type(change) is dict:
                if step_id not in rows:
                    raise CorruptStateError(f"journal record revision {revision} changes unknown step {step_id!r:.80}")
                if change is not None and not CHANGE_INDEX.keys() >= change.keys():
                    raise CorruptStateError(f"journal record revision {revision} names an unknown effect field")
            elif type(change) is not list or len(change) not in ROW_WIDTHS:
                raise CorruptStateError(f"journal record revision {revision} has a malformed effect row")
        if assignments.get("lease_epoch", header.get("lease_epoch")) != epoch:
            raise CorruptStateError(f"journal record revision {revision}: epoch {epoch} is not the state's lease epoch")
        header.update(assignments)
        header.update(extended)
        for step_id, change in changes.items():
            if change is None:
                del rows[step_id]
            elif type(change) is list:
                rows[step_id] = change if len(change) != len(FIRST_EFFECT_FIELDS) else [*change, None]
            else:
                row = rows[step_id]
                if BLOBS_KEY in change and len(row) == BLOBS_AT:
                    row.append(None)
                for name, value in change.items():
                    row[CHANGE_INDEX[name]] = value
        self.revision, self.epoch = revision, epoch

    def build(self, fetch: BlobFetch | None = None) -> RunState:
        return build_state(self.header, self.revision, self.rows, fetch)


class Shadow:
    """What the journal holds, as of the last record written: the writer's side of ``Replay``.

    ``record_for`` compares the state about to be committed with it and returns the journal record
    naming only what changed. Effect records are compared only for the step ids the caller says
    changed (the runner passes them) plus any new or removed ones, which the count reveals; so a
    commit costs work in proportion to what it changed, not to the size of the ledger. A caller
    that does not say (``changed`` is None, the protocol's default) gets every record compared,
    which is correct and costs O(n). An empty collection says that no record changed.
    """

    def __init__(self, state: RunState, blobs: BlobCodec | None = None):
        self.state = state
        self.blobs = blobs
        """With a codec, large payloads and results are written as blob references."""
        self.introduced: list[BlobRef] = []
        """The blob references the last record written holds in new or changed fields: each must be
        stored before the record is (the writer writes them first)."""
        self.effects = state.effects
        self.records: dict[str, EffectRecord] = dict(state.effects)
        self.header = header_of(state)
        self._objects: dict[str, Any] = {}
        self._remember_objects(state)

    def _remember_objects(self, state: RunState) -> None:
        self._objects = {
            "budget": state.budget,
            "approval_requests": tuple(state.approval_requests.items()),
            "consumed_approvals": list(state.consumed_approvals),
            "control_observations": list(state.control_observations),
            "unknowns": list(state.unknowns),
            **{key: getattr(state, key) for key in RECORD_KEYS},
        }

    def tracks(self, state: RunState) -> bool:
        """Whether ``state`` is the very object (and effect mapping) this shadow follows."""
        return state is self.state and state.effects is self.effects

    def record_for(self, state: RunState, changed: Collection[str] | None) -> dict[str, Any] | None:
        """The journal record that turns the shadow into ``state``, updating the shadow; or None if
        the change cannot be told from ``changed`` (the caller then writes a snapshot)."""
        record: dict[str, Any] = {"rev": state.revision, "epoch": state.lease_epoch}
        self.introduced = []
        effects = self._effect_changes(state, changed)
        if effects is None:
            return None
        assignments, extensions = self._header_changes(state)
        if assignments:
            record["set"] = assignments
        if extensions:
            record["extend"] = extensions
        if effects:
            record["effects"] = effects
        return record

    def _effect_changes(self, state: RunState, changed: Collection[str] | None) -> dict[str, Any] | None:
        current, known = state.effects, self.records
        if changed is None:
            # Not told what changed: compare every record (by identity first, so unchanged ones are cheap).
            changed = [step_id for step_id, record in current.items() if known.get(step_id) is not record]
            changed += [step_id for step_id in known if step_id not in current]
        changed = dict.fromkeys(changed)  # once each, in the caller's order
        added = [step_id for step_id in changed if step_id not in known and step_id in current]
        removed = [step_id for step_id in changed if step_id in known and step_id not in current]
        if len(known) + len(added) - len(removed) != len(current):
            return None  # a record was added or removed without being named in ``changed``
        if len(added) > 1:
            # New steps must be replayed in plan order; they are the newest keys of the mapping.
            position: dict[str, int] = {}
            for step_id in reversed(current):
                if step_id in added:
                    position[step_id] = len(position)
                    if len(position) == len(added):
                        break
            added.sort(key=position.__getitem__, reverse=True)
        out: dict[str, Any] = {}
        for step_id in changed:
            if step_id in known and step_id in current:
                new = current[step_id]
                old = known[step_id]
                if new is not old:
                    difference = record_changes(old, new, self.blobs, self.introduced)
                    if difference:
                        out[step_id] = difference
                    known[step_id] = new
        for step_id in removed:
            out[step_id] = None
            del known[step_id]
        for step_id in added:
            record = current[step_id]
            out[step_id] = row_of(record, self.blobs, self.introduced)
            known[step_id] = record
        return out

    def _header_changes(self, state: RunState) -> tuple[dict[str, Any], dict[str, Any]]:
        header, objects = self.header, self._objects
        assignments: dict[str, Any] = {}
        for key, value in zip(SCALAR_KEYS, scalar_values(state)):
            old = header[key]
            if value is old:
                continue
            if isinstance(value, Status):
                value = value.value
            if type(value) is not type(old) or value != old:
                assignments[key] = header[key] = value
        if state.budget is not objects["budget"]:
            for key, value in state.budget.to_json().items():
                flat = "budget." + key
                old = header[flat]
                if value is not old and (type(value) is not type(old) or value != old):
                    assignments[flat] = header[flat] = value
            objects["budget"] = state.budget
        for key in RECORD_KEYS:
            # Compared by identity: each is a frozen record, replaced when it changes (the outline
            # once, and when the plan grows), never compared element by element on a commit.
            record = getattr(state, key)
            if record is not objects[key]:
                assignments[key] = header[key] = record.to_json() if record is not None else None
                objects[key] = record
        requests = tuple(state.approval_requests.items())
        if requests != objects["approval_requests"]:
            assignments["approval_requests"] = header["approval_requests"] = [r.to_json() for _, r in requests]
            objects["approval_requests"] = requests
        extensions: dict[str, Any] = {}
        for key in LIST_KEYS:
            items = getattr(state, key)
            old_items = objects[key]
            if items == old_items:
                continue
            encode: Callable[[Any], Any] = (lambda item: item) if key == "consumed_approvals" else (lambda item: item.to_json())
            drop = _dropped_prefix(old_items, items)
            if drop is None:
                assignments[key] = header[key] = [encode(item) for item in items]
            else:
                added = [encode(item) for item in items[len(old_items) - drop :]]
                extensions[key] = {"drop": drop, "add": added}
                header[key] = header[key][drop:] + added
            objects[key] = list(items)
        return assignments, extensions


def _dropped_prefix(old: list[Any], new: list[Any]) -> int | None:
    """The ``n`` for which ``new == old[n:] + tail`` (the fewest dropped), or None if there is none."""
    for drop in range(len(old) + 1):
        kept = len(old) - drop
        if kept <= len(new) and new[:kept] == old[drop:]:
            return drop
    return None
