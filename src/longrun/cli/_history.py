"""``longrun history``: a task's timeline, built from what the store keeps, oldest first.

Every store keeps the current state, which records when the task was created and last committed,
each effect's latest lifecycle state (with its attempts, fencing epoch, receipt, evidence, last
error, approval id and time), the approval requests still open, the ids of approvals consumed,
the control records the runner read (with the SHA-256 of their bytes), the unknowns recorded at
the last stop, the last failure of a durable function's run (its error, or a crash, and how many in
a row), and the budget's timestamps; the lease record adds when the current owner took the
task and when its lease ends. If the store also keeps a history of revisions (a duck-typed
``store.history(task_id)`` method returning mappings with at least ``revision``, ``at``, ``epoch``
and a description; ``JsonFileStore`` has one, reading the journals it still holds), those
entries are the timeline of commits and replace the state's "last commit" entry; "created"
(revision 1, which lives in a snapshot) always comes from the state.

Entry fields (``--json`` prints a list of them): ``at`` (seconds since the epoch, or null when
the state does not say), ``kind``, ``detail``, ``revision``, ``epoch``, ``step`` and ``digest``
(null when they do not apply), and ``source`` (``journal``, ``state`` or ``lease``).

Not guaranteed: a complete history without a store that keeps one. From the state alone an effect
shows only its latest move, not every move it made, and the control records are the last
``MAX_CONTROL_OBSERVATIONS`` read. Read-only: no lease, no write.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from typing import Any, TextIO

from ..envelope import RunState
from ..lease import Lease
from ..ledger import EffectRecord
from ..protocols import HistoryStore, Store
from ._common import STORE_PLACEHOLDER, CliError, ExitCode, checked_task, format_time, name_store, short_digest, write_json

__all__ = ["cmd_history", "timeline"]

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_RANK = {
    "created": 0,
    "lease-acquired": 1,
    "first-start": 2,
    "control-read": 3,
    "approval-requested": 3,
    "approval-consumed": 4,
    "effect": 5,
    "progress": 6,
    "unknown": 7,
    "failure": 7,
    "commit": 8,
    "lease-end": 9,
}
"""The order of entries stamped with the same time (a fake clock, or a coarse one): causes first."""
_DESCRIPTION_KEYS = ("description", "detail", "summary", "change", "changes", "what")


def _entry(
    at: float | None,
    kind: str,
    detail: str,
    *,
    source: str = "state",
    revision: int | None = None,
    epoch: int | None = None,
    step: str | None = None,
    digest: str | None = None,
) -> dict[str, Any]:
    return {
        "at": at,
        "kind": kind,
        "detail": detail,
        "source": source,
        "revision": revision,
        "epoch": epoch,
        "step": step,
        "digest": digest,
    }


def _effect_detail(record: EffectRecord) -> str:
    parts = [f"{record.key} is {record.state.value} after {record.attempts} attempt{'s' if record.attempts != 1 else ''}"]
    parts.append(f"payload {short_digest(record.payload_digest)}")
    if record.approval_id:
        parts.append(f"approval {record.approval_id}")
    if record.receipt:
        parts.append(f"receipt: {record.receipt}")
    if record.evidence:
        parts.append(f"observed: {record.evidence}")
    if record.last_error:
        parts.append(f"last error: {record.last_error}")
    if record.not_before is not None:
        parts.append(f"next attempt not before {format_time(record.not_before)}")
    return "; ".join(parts)


def _state_entries(state: RunState, *, with_commits: bool) -> list[dict[str, Any]]:
    # Revision 1 lives in a snapshot, not in any journal: the "created" entry is always the state's.
    entries = [_entry(state.created_at, "created", "first revision committed: the plan is pinned", revision=1,
                      digest=state.plan_digest)]
    if with_commits:
        entries.append(
            _entry(
                state.updated_at,
                "commit",
                f"latest revision: status {state.status.value}; next action: {state.next_action or '(none)'}",
                revision=state.revision,
                epoch=state.lease_epoch,
            )
        )
    budget = state.budget
    if budget.first_started_at is not None:
        entries.append(_entry(budget.first_started_at, "first-start", f"the run's first effect attempt started (worked on for {budget.worked_s:.1f}s in all, waits excluded)"))
    if budget.last_progress_at > budget.created_at:
        idle = budget.worked_s - budget.worked_at_progress_s
        entries.append(_entry(budget.last_progress_at, "progress", f"latest verified effect ({idle:.1f}s of work since: what the no-progress budget counts)"))
    failure = state.last_failure
    if failure is not None:
        where = "found by the run at" if failure.kind == "crash" else "in the run at"
        retry = f"; next attempt at or after {format_time(failure.retry_at)}" if failure.retry_at is not None else ""
        entries.append(
            _entry(failure.at, "failure", f"last failure, {where} lease epoch {failure.epoch}: {failure.summary()}{retry}",
                   revision=failure.revision, epoch=failure.epoch, step=failure.step)
        )  # fmt: skip
    read_at: dict[str, float] = {}
    for item in state.control_observations:
        match = _DIGEST.search(item.detail)
        entries.append(_entry(item.at, "control-read", item.detail, digest=match.group(0) if match else None))
    for item in state.control_observations:  # an approval is consumed at the first gate that reads it
        for approval_id in state.consumed_approvals:
            if approval_id in item.detail:
                read_at.setdefault(approval_id, item.at)
    for record in state.effects.values():
        entries.append(_entry(record.updated_at, f"effect-{record.state.value}", _effect_detail(record), epoch=record.epoch or None,
                              step=record.step_id, digest=record.payload_digest))
    by_approval = {record.approval_id: record.step_id for record in state.effects.values() if record.approval_id}
    for approval_id in state.consumed_approvals:
        step = by_approval.get(approval_id)
        entries.append(
            _entry(read_at.get(approval_id), "approval-consumed",
                   f"approval {approval_id} consumed" + (f" by step {step}" if step else " (its effect record no longer names it)"),
                   step=step)
        )
    for request in state.approval_requests.values():
        entries.append(
            _entry(request.requested_at, "approval-requested",
                   f"approval requested for step {request.step_id} (action {request.action}, payload {request.payload_digest}); "
                   f"the request expires {format_time(request.expires_at)}",
                   step=request.step_id, digest=request.payload_digest)
        )
    for item in state.unknowns:
        entries.append(_entry(item.at, "unknown", f"recorded at the last stop: [{item.source}] {item.detail}"))
    return entries


def _lease_entries(lease: Lease | None, now: float) -> list[dict[str, Any]]:
    if lease is None:
        return []
    entries = [_entry(lease.acquired_at, "lease-acquired", f"lease taken by {lease.owner}", source="lease", epoch=lease.epoch)]
    if lease.released:  # the record keeps no time of the release: it was at or after the acquisition
        entries.append(_entry(None, "lease-end", f"lease of {lease.owner} released by its holder", source="lease", epoch=lease.epoch))
        return entries
    ended = "ended (released or expired)" if lease.expired(now) else "held until"
    entries.append(_entry(lease.expires_at, "lease-end", f"lease of {lease.owner} {ended} {format_time(lease.expires_at)}",
                          source="lease", epoch=lease.epoch))
    return entries


def _number(value: object, kind: type) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if kind is int:
        return int(value) if float(value).is_integer() else None
    return float(value) if math.isfinite(value) else None


def _journal_entries(raw: object) -> list[dict[str, Any]]:
    """Entries from ``store.history(task_id)``, whatever their extra fields; a malformed one is refused."""
    try:
        items = list(raw)  # type: ignore[call-overload]
    except TypeError:
        raise CliError(f"the store's history is a {type(raw).__name__}, not a list of entries", ExitCode.STORAGE) from None
    entries = []
    for item in items:
        if not isinstance(item, Mapping):
            raise CliError(f"the store's history holds {type(item).__name__}, not a mapping", ExitCode.STORAGE)
        description = next((item[key] for key in _DESCRIPTION_KEYS if item.get(key) not in (None, "")), None)
        if description is None:
            description = ", ".join(f"{key}={value}" for key, value in item.items() if key not in ("revision", "at", "epoch"))
        detail = description if isinstance(description, str) else str(description)
        digest = item.get("digest") if isinstance(item.get("digest"), str) else None
        entries.append(
            _entry(_number(item.get("at"), float), str(item.get("kind") or "revision"), detail, source="journal",
                   revision=_number(item.get("revision"), int), epoch=_number(item.get("epoch"), int), digest=digest)
        )
    return entries


def timeline(store: Store, task_id: str, now: float) -> tuple[RunState | None, list[dict[str, Any]]]:
    """The task's state (None before its first commit) and its timeline, oldest first."""
    state = store.load(task_id).state  # no lease: read-only; a damaged state raises (exit 3)
    lease = store.read_lease(task_id)
    journal = _journal_entries(store.history(task_id)) if isinstance(store, HistoryStore) else []
    entries = journal + (_state_entries(state, with_commits=not journal) if state is not None else [])
    entries += _lease_entries(lease, now)
    order = {id(entry): index for index, entry in enumerate(entries)}
    entries.sort(
        key=lambda entry: (
            entry["at"] is None,
            entry["at"] or 0.0,
            entry["revision"] if entry["source"] == "journal" and entry["revision"] is not None else -1,
            _RANK.get(entry["kind"].split("-")[0] if entry["kind"].startswith("effect-") else entry["kind"], 5),
            order[id(entry)],
        )
    )
    return state, entries


def cmd_history(store: Store, task_id: str, as_json: bool, out: TextIO, label: str = STORE_PLACEHOLDER) -> int:
    task_id = checked_task(task_id)
    now = time.time()
    state, entries = timeline(store, task_id, now)
    for entry in entries:
        if entry["kind"] == "commit":  # the latest revision's next action
            entry["detail"] = name_store(entry["detail"], label)
    if as_json:
        write_json(out, entries)
        return 0
    if state is None:
        out.write(f"history of task {task_id}: no revision committed yet\n")
    else:
        out.write(f"history of task {task_id} (revision {state.revision}, status {state.status.value}), {len(entries)} entries, oldest first\n")
    rows = [("TIME (UTC)", "REV", "EPOCH", "WHAT", "DETAIL")]
    for entry in entries:
        rows.append(
            (
                format_time(entry["at"], precise=True) if entry["at"] is not None else "(time unknown)",
                "-" if entry["revision"] is None else str(entry["revision"]),
                "-" if entry["epoch"] is None else str(entry["epoch"]),
                entry["kind"] + (f" {entry['step']}" if entry["step"] else ""),
                entry["detail"],
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        out.write("  " + "  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths)) + "  " + row[4] + "\n")
    return 0
