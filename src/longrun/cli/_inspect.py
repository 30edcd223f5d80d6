"""The read-only commands: ``status`` (one task) and ``ls`` (every task in a store).

``ls`` lists each task's status, progress (``4/6`` verified of a declared plan, else the verified
step count), revision, when it was last updated and its next action, most recently updated first;
``--status`` (repeatable), ``--since`` and ``--limit`` narrow it. ``status`` shows the pending
approval requests with their payloads in human form (``_payload``).

Guarantees: they never take a lease and never write state. They load without a lease, so the
store leaves damaged files where they are (it only quarantines under a lease), and they read the
lease record as it is. They work on any ``Store``. The CLI refuses a SQLite file that holds no
longrun schema (``_common.open_store``), so a SQL store never creates its tables for a read; it may
still migrate an older longrun schema on first contact.

Not guaranteed: a consistent view across tasks (``ls`` reads them one after another) or that the
state is still current when printed (a runner may commit right after).
"""

from __future__ import annotations

import fnmatch
import json
import math
import time
from typing import Sequence, TextIO

from ..contract import INTERNAL_PREFIX, is_internal
from ..envelope import RunState, recorded_before_queued
from ..failures import RunFailure
from ..intervention import forks_of, origin_of
from ..errors import CorruptStateError, LongrunError
from ..lease import Lease
from ..ledger import EffectState
from ..messages import consumed_messages
from ..outcome import Status
from ..outside_messages import pending_messages
from ..progress import Progress, progress_of
from ..telemetry import ProgressReport
from ..protocols import LoadManyStore, LoadResult, Store, SummaryStore
from ..task_events import events_of
from ._common import (
    STORE_PLACEHOLDER,
    checked_task,
    evidence_line,
    format_duration,
    format_time,
    lease_summary,
    name_store,
    relative,
    short_digest,
    write_json,
)
from ._control import payload_view
from ._deadline import deadline_view, deadline_words
from ._filters import parse_moment
from ._payload import payload_lines, safe_text
from ._what_ran import failure_lines, function_matches, last_run_failed, queue_position, what_ran, what_ran_lines

__all__ = [
    "LS_STATUSES", "NO_STATE_ACTION", "cmd_ls", "cmd_status", "ls_entry", "parse_since", "progress_line", "reported_line", "select",
    "status_json",
]  # fmt: skip

NO_STATE_ACTION = "run the task: no revision has been committed yet"


def _marked(entry: object) -> object:
    """An effect record as ``status --json`` shows it: with its ``kind`` (effect, call, ..., function)."""
    if isinstance(entry, dict) and isinstance(entry.get("action"), str):
        return {**entry, "kind": step_kind(entry["action"])}
    return entry


def status_json(task_id: str, loaded: LoadResult, lease: Lease | None, now: float) -> dict[str, object]:
    """``state.to_json()`` plus ``store_lease`` (the lease record now) and ``load`` (where it came from).

    The state's own ``lease`` key is the lease recorded with the last commit; ``store_lease`` is
    the store's current lease record with ``expired`` judged at ``checked_at``.
    """
    state = loaded.state
    if state is not None:
        body: dict[str, object] = dict(state.to_json())
    else:
        body = {"task_id": task_id, "status": None, "revision": 0, "next_action": NO_STATE_ACTION, "effects": [], "approval_requests": []}
    effects = body["effects"]
    if isinstance(effects, list):
        body["effects"] = [_marked(entry) for entry in effects]
    body["store_lease"] = None if lease is None else {**lease.to_json(), "expired": lease.expired(now)}
    body["load"] = {
        "source": loaded.source,
        "digest": loaded.digest,
        "observations": [item.to_json() for item in loaded.observations],
    }
    body["checked_at"] = now
    body["progress"] = progress_of(state).to_json() if state is not None else None
    body["what_ran"] = what_ran(state)
    body["last_run_failed"] = state is not None and last_run_failed(state)
    body["events"] = events_of(state)
    body["forked_from"] = origin_of(state)
    body["forks"] = forks_of(state)
    body["deadline_status"] = deadline_view(state, now)
    return body


def _table(rows: Sequence[tuple[str, ...]], indent: str) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


def step_kind(action: str) -> str:
    """What a ledger record is, for people: an effect, or a durable function's call, timer,
    question, child task or own record, or a checkpointed session's checkpoint or contract."""
    if not is_internal(action):
        return "effect"
    return {
        "call": "call", "sleep": "timer", "ask": "question", "child": "child", "function": "function",
        "checkpoint": "checkpoint", "contract": "contract", "send": "send", "recv": "receive", "event": "event",
    }.get(  # fmt: skip
        action[len(INTERNAL_PREFIX) :], "internal"
    )


INTERNAL_KINDS = frozenset({"function", "contract"})
"""Records the task keeps about itself (a durable function's own record, a session's contract):
``status`` leaves them out of its effects table; ``--json`` keeps them, each marked with its kind."""


def _effect_lines(state: RunState) -> list[str]:
    shown = [record for record in state.effects.values() if step_kind(record.action) not in INTERNAL_KINDS]
    hidden = sorted({step_kind(record.action) for record in state.effects.values()} & INTERNAL_KINDS)
    note = f" (not shown: the task's own {' and '.join(hidden)} record; --json has it)" if hidden else ""
    if not shown:
        return ["  effects      none planned yet" + note]
    rows = [("STEP", "STATE", "ATTEMPTS", "PAYLOAD", "KEY", "KIND")]
    kinds: dict[str, int] = {}
    for record in shown:
        kind = step_kind(record.action)
        kinds[kind] = kinds.get(kind, 0) + 1
        rows.append((record.step_id, record.state.value, str(record.attempts), short_digest(record.payload_digest), record.key, kind))
    counts = ", ".join(f"{count} {kind}{'s' if count != 1 else ''}" for kind, count in kinds.items())
    lines = [f"  effects      {len(shown)} in the order first recorded ({counts}){note}"]
    lines += _table(rows, "    ")
    for record in shown:
        if record.last_error and record.state is not EffectState.VERIFIED:
            lines.append(f"    {record.step_id}: last error: {record.last_error}")
    return lines


def _request_lines(state: RunState, now: float) -> list[str]:
    if not state.approval_requests:
        return ["  approvals    none pending"]
    lines = [f"  approvals    {len(state.approval_requests)} pending"]
    for request in state.approval_requests.values():
        expiry = "expired" if request.expired(now) else "expires"
        payload, notes = payload_view(state, request)
        lines += [
            f"    step {safe_text(request.step_id)} (action {safe_text(request.action)})",
            "      payload",
            *("        " + line for line in (payload_lines(payload) if payload is not None else [])),
            f"      payload digest {request.payload_digest}",
            f"      plan digest    {request.plan_digest}",
            f"      requested {format_time(request.requested_at)}, {expiry} {format_time(request.expires_at)} ({relative(request.expires_at, now)})",
            *(f"      note: {note}" for note in notes),
        ]
    return lines


def reported_line(report: ProgressReport, *, note: bool = True) -> str:
    """``45/100 (45%), 1.5/s, about 37s left: importing rows``: what a durable function reported."""
    parts = [report.label() + (f" ({100 * report.fraction:.0f}%)" if report.fraction is not None else "")]
    rate = report.rate
    if rate is not None:
        parts.append(f"{rate:.2f}/s" if abs(rate) < 10 else f"{rate:.0f}/s")
    if report.eta_s is not None and report.total is not None and report.done < report.total:
        parts.append(f"about {format_duration(report.eta_s)} left")
    line = ", ".join(parts)
    return line + (f": {safe_text(report.note)}" if report.note and note else "")


def progress_line(progress: Progress) -> str:
    """``4/6 verified (67%), 1 in flight, 1 waiting, 0 planned, 0 not yet planned`` and the like."""
    parts = []
    if progress.total is not None:
        percent = f" ({100 * (progress.fraction or 0.0):.0f}%)"
        parts.append(f"{progress.verified}/{progress.total} verified{percent}")
    else:
        kinds = ", ".join(f"{count} {kind}{'s' if count != 1 else ''}" for kind, count in progress.kinds.items())
        parts.append(f"{progress.verified} verified of {progress.recorded} recorded ({kinds or 'none'})")
    parts += [f"{progress.in_flight} in flight", f"{progress.waiting} waiting", f"{progress.planned} ready"]
    if progress.failed:
        parts.append(f"{progress.failed} failed")
    if progress.remaining is not None:
        parts.append(f"{progress.remaining} not yet planned")
    return ", ".join(parts)


def _event_lines(state: RunState) -> list[str]:
    """The task's events (``run.set_event``): each key with its latest value, long values cut."""
    events = events_of(state)
    if not events:
        return []
    lines = [f"  events       {len(events)} key{'s' if len(events) != 1 else ''} set (the latest value of each)"]
    for key, value in events.items():
        text = json.dumps(value, ensure_ascii=False, sort_keys=True)
        lines.append(f"    {key} = {safe_text(text if len(text) <= 200 else text[:197] + '...')}")
    return lines


def mailbox_summary(store: Store, state: RunState | None, task_id: str) -> dict[str, object]:
    """The task's mailbox: how many messages it holds, how many of each topic it has not received
    (``waiting``), and how many of each topic wait from outside as control records in the store
    (``outside``: numbered in the mailbox when received) (``error`` instead, naming the damage, if a message cannot be read: the state is still shown)."""
    try:
        messages = store.read_messages(task_id)
    except CorruptStateError as exc:
        return {"messages": None, "received": None, "waiting": {}, "outside": {}, "error": str(exc)}
    consumed = consumed_messages(task_id, [(record.action, record.result) for record in state.effects.values()]) if state is not None else set()
    waiting: dict[str, int] = {}
    for message in messages:
        if message.seq not in consumed:
            waiting[message.topic] = waiting.get(message.topic, 0) + 1
    outside: dict[str, int] = {}
    if state is not None:  # messages from outside that wait as control records in the store (not a control root's)
        pending, _ = pending_messages(store.read_approvals(task_id), task_id, state.plan_digest, state.consumed_approvals)
        for _, message in pending:
            outside[message.topic] = outside.get(message.topic, 0) + 1
    return {"messages": len(messages), "received": len(messages) - sum(waiting.values()), "waiting": waiting, "outside": outside}


def _mailbox_line(mailbox: dict[str, object]) -> str:
    if mailbox.get("error"):
        return f"  messages     the mailbox cannot be read: {mailbox['error']}"
    waiting = mailbox["waiting"]
    assert isinstance(waiting, dict)
    outside = mailbox.get("outside") or {}
    assert isinstance(outside, dict)
    topics = ", ".join(f"{topic} {count}" for topic, count in sorted(waiting.items()))
    records = ", ".join(f"{topic} {count}" for topic, count in sorted(outside.items()))
    return (
        f"  messages     {mailbox['messages']} in the mailbox, {mailbox['received']} received" + (f"; waiting: {topics}" if topics else "")
        + (f"; from outside, not yet received: {records}" if records else "")
    )


def render_status(
    task_id: str, loaded: LoadResult, lease: Lease | None, now: float, label: str = STORE_PLACEHOLDER, position: int | None = None
) -> list[str]:
    state = loaded.state
    lines = [f"task {task_id}"]
    if state is None:
        lines += [
            "  status       new (the task directory exists but holds no committed state)",
            f"  lease        {lease_summary(lease, now)}",
            f"  next action  {NO_STATE_ACTION}",
        ]
        return lines
    source = "the primary copy" if loaded.source == "primary" else "the backup copy: the primary is damaged or rolled back"
    queued = ""
    if state.status is Status.QUEUED or recorded_before_queued(state):
        queued = " (recorded, not started yet" + (f"; position {position} in the queue)" if position is not None else ")")
    lines += [
        f"  status       {state.status.value}{queued}",
        f"  revision     {state.revision} (read from {source}, {short_digest(loaded.digest)})",
        f"  plan digest  {state.plan_digest}",
        f"  updated      {format_time(state.updated_at)} ({relative(state.updated_at, now)})",
        f"  lease        {lease_summary(lease, now)}",
        f"  progress     {progress_line(progress_of(state))}",
    ]
    words = deadline_words(state, now)
    if words is not None:
        lines.append(f"  deadline     {words}")
    lines += what_ran_lines(what_ran(state))
    if state.last_failure is not None:
        lines += failure_lines(state.last_failure, now, traceback=True)
    origin, forks = origin_of(state), forks_of(state)
    if origin is not None:
        lines.append(f"  forked from  task {origin.get('task')}, from step {origin.get('step') or '(after its last step)'}")
    if forks:
        listed = ", ".join(f"{fork.get('task')} (from step {fork.get('step') or '-'})" for fork in forks)
        lines.append(f"  forks        {listed}")
    if state.progress is not None:
        lines.append(f"  reported     {reported_line(state.progress)} (at {format_time(state.progress.at)})")
    lines += _effect_lines(state)
    lines += _event_lines(state)
    lines += _request_lines(state, now)
    if state.unknowns:
        lines.append(f"  unknowns     {len(state.unknowns)} recorded at the last stop")
        lines += [f"    - {evidence_line(item)}" for item in state.unknowns]
    if loaded.source != "primary" or len(loaded.observations) > 1:
        lines.append("  store notes")
        lines += [f"    - {evidence_line(item)}" for item in loaded.observations]
    lines.append(f"  next action  {name_store(state.next_action, label) if state.next_action else '(none recorded)'}")
    if state.status is Status.RUNNING and lease is not None and lease.expired(now):
        lines.append("               (no live runner holds the lease: running the task again does this)")
    return lines


def code_version(state: RunState | None) -> str | None:
    """The code version a durable function's task recorded when it started (None: not a durable
    function's task, or recorded before versions were)."""
    record = state.effects.get(INTERNAL_PREFIX + "function") if state is not None else None
    payload = record.payload if record is not None else None
    version = payload.get("version") if isinstance(payload, dict) else None
    return version if isinstance(version, str) else None


def cmd_status(store: Store, label: str, task_id: str, as_json: bool, out: TextIO) -> int:
    task_id = checked_task(task_id)
    loaded = store.load(task_id)  # no lease: read-only, never quarantines
    lease = store.read_lease(task_id)
    now = time.time()
    state = loaded.state
    position = queue_position(store, task_id) if state is not None and state.status is Status.QUEUED else None
    mailbox = mailbox_summary(store, state, task_id)
    version = code_version(state)
    if as_json:
        body = status_json(task_id, loaded, lease, now)
        body["next_action"] = name_store(str(body["next_action"]), label)
        body["queue_position"] = position
        body["mailbox"] = mailbox
        if version is not None:
            body["code_version"] = version
        write_json(out, body)
    else:
        lines = render_status(task_id, loaded, lease, now, label, position)
        if version is not None:
            lines.insert(1, f"  code version {version}")
        if mailbox["messages"] or mailbox.get("outside") or mailbox.get("error"):
            at = next((index for index, line in enumerate(lines) if line.startswith("  next action")), len(lines))
            lines.insert(at, _mailbox_line(mailbox))
        out.write("\n".join(lines) + "\n")
    return 0


def ls_entry(store: Store, task_id: str, loaded: LoadResult | LongrunError | None = None) -> dict[str, object]:
    """One task's row: status (or DAMAGED / UNREADABLE), revision, next action, where it was read
    from, when it was last updated and its progress (``Progress.to_json()``, with ``label``).
    ``loaded``: the task's load (or the error it raised) when the caller loaded it already."""
    entry: dict[str, object] = {
        "task_id": task_id, "status": None, "revision": 0, "next_action": "", "source": None, "error": None,
        "updated_at": None, "progress": None, "function": None, "last_error": None, "last_run_failed": False,
        "what_ran": what_ran(None),
    }  # fmt: skip
    try:
        if loaded is None:
            loaded = store.load(task_id)
        elif isinstance(loaded, LongrunError):
            raise loaded
    except CorruptStateError as exc:
        return {**entry, "status": "DAMAGED", "next_action": f"run `longrun verify` on the task ({exc})", "error": str(exc)}
    except LongrunError as exc:
        return {**entry, "status": "UNREADABLE", "next_action": str(exc), "error": str(exc)}
    state = loaded.state
    if state is None:
        return {**entry, "status": "new", "next_action": NO_STATE_ACTION, "source": loaded.source}
    progress = progress_of(state)
    ran = what_ran(state)
    failure = state.last_failure
    return {
        **entry,
        "status": Status.QUEUED.value if recorded_before_queued(state) else state.status.value,
        "revision": state.revision,
        "next_action": state.next_action,
        "source": loaded.source,
        "updated_at": state.updated_at,
        # A function's own report, where it made one, says more than a count of its steps.
        "progress": {**progress.to_json(), "label": reported_line(state.progress, note=False) if state.progress is not None else progress.label()},
        "function": ran["function"],
        "last_error": failure.summary() if failure is not None else None,
        "last_run_failed": last_run_failed(state),
        "what_ran": ran,
    }


LS_SHOWN_CHARS = 300
"""The most of a task's arguments (or result) ``ls --long`` prints; ``status`` prints more, ``--json`` all."""
LS_STATUSES = (*(status.value for status in Status), "new", "DAMAGED", "UNREADABLE")
"""What ``ls --status`` accepts: a run status, ``new`` (no revision yet), ``DAMAGED`` or ``UNREADABLE``."""


def parse_since(text: str, now: float) -> float:
    """``--since``: see ``_filters.parse_moment``. Returns seconds since the epoch; ``InvalidInputError`` otherwise."""
    return parse_moment(text, now, option="--since")


def select(
    entries: list[dict[str, object]],
    *,
    statuses: Sequence[str] = (),
    since: float | None = None,
    limit: int | None = None,
    functions: Sequence[str] = (),
    match: Sequence[str] = (),
) -> list[dict[str, object]]:
    """``ls``'s filters, in order: by status, by function (``function_matches``), by task id (a glob
    of ``match``), by last update (a task whose state cannot be read has no time and is kept: it
    needs a look), most recently updated first, then at most ``limit``."""
    chosen = [entry for entry in entries if not statuses or entry["status"] in statuses]
    if functions:
        chosen = [entry for entry in chosen if function_matches(entry["function"], functions)]
    if match:
        chosen = [entry for entry in chosen if any(fnmatch.fnmatchcase(str(entry["task_id"]), pattern) for pattern in match)]
    if since is not None:
        chosen = [
            entry for entry in chosen
            if entry["status"] in ("DAMAGED", "UNREADABLE") or (isinstance(entry["updated_at"], float) and entry["updated_at"] >= since)
        ]  # fmt: skip
    chosen.sort(key=lambda entry: -entry["updated_at"] if isinstance(entry["updated_at"], float) else math.inf)
    return chosen[:limit] if limit is not None else chosen


def list_entries(
    store: Store,
    *,
    statuses: Sequence[str] = (),
    since: float | None = None,
    limit: int | None = None,
    functions: Sequence[str] = (),
    match: Sequence[str] = (),
) -> list[dict[str, object]]:
    """``ls``'s rows, newest first. A store that lists summaries (``SummaryStore``) picks the page
    from its index and only the page's tasks are loaded (each row shows what its load finds, so a
    damaged task still shows ``DAMAGED``): O(page). Asked for ``DAMAGED`` or ``UNREADABLE``, which
    only a load can tell (the page is loaded together where the store can: ``LoadManyStore``), for
    a function by its qualname or a glob, or for more than one id glob,
    or on a store that lists no summaries, every task (whose id matches) is loaded: O(tasks)."""
    whole_names = all(":" in name and not any(mark in name for mark in "*?[") for name in functions)
    if isinstance(store, SummaryStore) and not {"DAMAGED", "UNREADABLE"} & set(statuses) and whole_names and len(match) <= 1:
        page = store.list_summaries(
            statuses=statuses, functions=functions, match=match[0] if match else None, since=since, limit=limit
        )
        ids = [summary.task_id for summary in page]
        if isinstance(store, LoadManyStore):  # the page's states in one go (one transaction on the SQL stores)
            return [ls_entry(store, task_id, loaded) for task_id, loaded in zip(ids, store.load_many(ids))]
        return [ls_entry(store, task_id) for task_id in ids]
    tasks = store.list_tasks()
    if match:  # read only the tasks whose ids match
        tasks = [task_id for task_id in tasks if any(fnmatch.fnmatchcase(task_id, pattern) for pattern in match)]
    entries = [ls_entry(store, task_id) for task_id in tasks]
    return select(entries, statuses=statuses, since=since, limit=limit, functions=functions, match=match)


def cmd_ls(
    store: Store,
    label: str,
    as_json: bool,
    out: TextIO,
    *,
    statuses: Sequence[str] = (),
    since: str | None = None,
    limit: int | None = None,
    functions: Sequence[str] = (),
    match: Sequence[str] = (),
    long: bool = False,
) -> int:
    now = time.time()
    threshold = parse_since(since, now) if since is not None else None
    entries = list_entries(store, statuses=statuses, since=threshold, limit=limit, functions=functions, match=match)
    for entry in entries:
        entry["next_action"] = name_store(str(entry["next_action"]), label)
    if as_json:
        write_json(out, entries)
        return 0
    if not entries:
        filtered = " matching the filters" if statuses or since is not None or functions or match else ""
        out.write(f"no tasks{filtered} in {label}\n")
        return 0
    rows = [("TASK", "STATUS", "PROGRESS", "REV", "UPDATED", "NEXT ACTION")]
    for entry in entries:
        status = str(entry["status"]) + (" (from backup)" if entry["source"] == "backup" else "")
        ran = entry["what_ran"]
        failure = ran.get("last_failure") if isinstance(ran, dict) else None
        if entry["last_run_failed"] and isinstance(failure, dict):
            status += f" (failure {failure.get('attempt')} of {failure.get('max_failures')})"
        revision = str(entry["revision"]) if entry["status"] not in ("DAMAGED", "UNREADABLE") else "-"
        progress = entry["progress"]
        shown = str(progress["label"]) if isinstance(progress, dict) else "-"
        updated = entry["updated_at"]
        when = relative(updated, now) if isinstance(updated, float) else "-"
        rows.append((str(entry["task_id"]), status, shown, revision, when, safe_text(str(entry["next_action"]))))
    lines = _table(rows, "")
    if long:
        lines = [lines[0]]
        for entry, line in zip(entries, _table(rows, "")[1:]):
            lines.append(line)
            ran = entry["what_ran"]
            if isinstance(ran, dict):
                lines += what_ran_lines(ran, indent="    ", limit=LS_SHOWN_CHARS)
                failure = ran.get("last_failure")
                if isinstance(failure, dict):
                    lines += failure_lines(RunFailure.from_json(failure), now, indent="    ")
    out.write("\n".join(lines) + "\n")
    return 0
