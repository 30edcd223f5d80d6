"""Acting on many tasks at once, and retention: bulk ``cancel``, ``approve`` and ``resume --reopen``, ``prune`` and ``delete``.

``cancel``, ``approve`` and ``resume --reopen`` given a filter instead of a task (``_filters.TaskFilter``: ``--status``,
``--function``, ``--since``, ``--until``, ``--match``) first list what they would do, one line per
task or per request, and write nothing; with ``--yes`` they do it and print what they did.
``approve`` lists every pending request it would approve with its full payload digest, plan
digest and action, so the approver sees exactly what each approval binds. Each kind of bulk act is
a ``BulkAction``: which tasks it concerns, what it would do to one, and doing it. A bulk reopen
writes each task's reopen record and makes the task due in the fleet's queue, so a live worker
runs it; without a worker, ``longrun resume STORE TASK`` runs each.

``prune STORE --before MOMENT`` deletes the tasks whose run ended (``outcome.TERMINAL``, or the
``--status`` given, each of which must be an ended status) and whose last update is before
``MOMENT``; ``delete STORE TASK`` deletes one task. Both go through ``Store.delete_task`` (every
store: the state, journal, blobs, control records and fleet row; refused for a task not ended or
whose lease is live) and print what each deletion removed. Neither deletes a child whose parent
has not ended (the parent may still read the child's result). ``prune --dry-run`` lists only.

Guarantees: a bulk act writes only the records its single-task form writes, through the same
functions (``_control.write_approval``, ``write_cancellation``, ``intervention.reopen``), and
nothing without ``--yes``; a
task that fails is reported and the others go on (exit 1 if any failed). Not guaranteed: a
consistent view across tasks (each is read, then acted on, one after another).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Protocol, Sequence, TextIO

from ..approval import refuse_second
from ..authority import FileControlSource, load_key, verify_approval
from ..canonical import JSONValue
from ..contract import ASK_ACTION
from ..errors import InvalidInputError, LeaseHeldError, LongrunError, TaskNotFinishedError, UnknownTaskError
from ..intervention import REOPENABLE, reopen
from ..outcome import TERMINAL
from ..protocols import Store, TaskDeletion
from ..stores.queue import open_queue
from ._common import CliError, ExitCode, checked_task, error_text, write_json
from ._control import open_control_root, write_approval, write_cancellation
from ._filters import Candidate, TaskFilter, candidates, function_of, parent_of, parse_moment
from ._intervene import signer

__all__ = ["APPROVE", "CANCEL", "REOPEN", "BulkAction", "Planned", "cmd_bulk", "cmd_delete", "cmd_prune"]

ENDED = tuple(sorted(status.value for status in TERMINAL))


@dataclasses.dataclass(frozen=True, slots=True)
class Planned:
    """One thing a bulk act would do: to ``task_id``, shown as ``line``, described by ``data``."""

    task_id: str
    line: str
    data: dict[str, JSONValue]
    step: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Writer:
    """Who acts and where the records go, as for the single-task commands."""

    store: Store
    who: str
    reason: str
    ttl_s: float | None
    key: bytes | None
    control: FileControlSource | None


class BulkAction(Protocol):
    """One kind of bulk act (see the module docstring)."""

    name: str
    """The command, as the operator typed it (``cancel``, ``approve``)."""
    done: str
    """What was done, for the report (``cancelled``, ``approved``)."""

    def plan(self, candidate: Candidate, writer: Writer, now: float) -> list[Planned] | str:
        """What it would do to this task, or why it leaves it alone."""
        ...

    def act(self, planned: Planned, candidate: Candidate, writer: Writer, now: float) -> dict[str, JSONValue]:
        """Do it; what was written, for the report."""
        ...


class _Cancel:
    name = "cancel"
    done = "cancelled"

    def plan(self, candidate: Candidate, writer: Writer, now: float) -> list[Planned] | str:
        state = candidate.state
        if state is not None and state.status in TERMINAL:
            return f"already ended {state.status.value}"
        status = state.status.value if state is not None else "new"
        function = function_of(state)
        line = f"cancel {candidate.task_id}  ({status}{', ' + function if function else ''})"
        return [Planned(candidate.task_id, line, {"task_id": candidate.task_id, "status": status, "function": function})]

    def act(self, planned: Planned, candidate: Candidate, writer: Writer, now: float) -> dict[str, JSONValue]:
        record, written, children = write_cancellation(
            writer.store, candidate.task_id, candidate.state, reason=writer.reason, requested_by=writer.who, now=now,
            key=writer.key, control=writer.control,
        )  # fmt: skip
        return {"cancellation": record.to_json(), "written_to": written, "children_cancelled": list(children)}


class _Approve:
    name = "approve"
    done = "approved"

    def __init__(self, step: str | None):
        self.step = step

    def plan(self, candidate: Candidate, writer: Writer, now: float) -> list[Planned] | str:
        state = candidate.state
        if state is None or state.status in TERMINAL:
            return "no run waiting" if state is None else f"already ended {state.status.value}"
        requests = [
            request for request in state.approval_requests.values()
            if request.action != ASK_ACTION and (self.step is None or request.step_id == self.step)
        ]  # fmt: skip
        if not requests:
            return "no pending approval request" + (f" for step {self.step!r}" if self.step is not None else "")
        planned = []
        for request in requests:
            line = (
                f"approve {candidate.task_id} step {request.step_id}  action {request.action}  "
                f"payload {request.payload_digest}  plan {request.plan_digest}"
            )
            planned.append(Planned(candidate.task_id, line, {"request": request.to_json()}, step=request.step_id))
        return planned

    def act(self, planned: Planned, candidate: Candidate, writer: Writer, now: float) -> dict[str, JSONValue]:
        assert candidate.state is not None and planned.step is not None
        request = candidate.state.approval_requests[planned.step]
        key = writer.key
        counts = None if key is None else (lambda approval: verify_approval(approval, key) is None)
        source = writer.control if writer.control is not None else writer.store
        refuse_second(request, source.read_approvals(candidate.task_id), candidate.state.consumed_approvals, now, counts=counts)
        approval, written = write_approval(
            writer.store, request, approver=writer.who, ttl_s=writer.ttl_s, now=now, key=key, control=writer.control
        )
        return {"approval": approval.to_json(), "written_to": written}


class _Reopen:
    name = "reopen"
    done = "reopened"

    def __init__(self, add_attempts: int, add_time_s: float):
        self.add_attempts = add_attempts
        self.add_time_s = add_time_s

    def plan(self, candidate: Candidate, writer: Writer, now: float) -> list[Planned] | str:
        state = candidate.state
        if state is None:
            return "no run recorded"
        if state.status not in REOPENABLE:
            return f"{state.status.value}: only a task that ended unfinished is reopened"
        function = function_of(state)
        more = (f", {self.add_attempts} more attempts" if self.add_attempts else "") + (
            f", {self.add_time_s:g} s more work" if self.add_time_s else ""
        )
        line = f"reopen {candidate.task_id}  ({state.status.value}{', ' + function if function else ''}{more})"
        data: dict[str, JSONValue] = {"task_id": candidate.task_id, "status": state.status.value, "function": function}
        return [Planned(candidate.task_id, line, data)]

    def act(self, planned: Planned, candidate: Candidate, writer: Writer, now: float) -> dict[str, JSONValue]:
        approval = reopen(
            writer.store, candidate.task_id, writer.reason, by=writer.who, add_attempts=self.add_attempts,
            add_time_s=self.add_time_s, write_to=writer.control, sign=signer(writer.key),
        )  # fmt: skip
        return {"record": approval.to_json(), "queued": _make_due(writer.store, candidate.task_id)}


def _make_due(store: Store, task_id: str) -> bool:
    """Make a reopened task due in the fleet's queue, where the store has one; whether it was."""
    try:
        queue = open_queue(store)
    except InvalidInputError:
        return False  # a store the fleet does not serve: `longrun resume STORE TASK` runs it
    try:
        return queue.wake(task_id)
    finally:
        queue.close()


CANCEL: BulkAction = _Cancel()


def REOPEN(add_attempts: int, add_time_s: float) -> BulkAction:
    """The bulk reopen of tasks that ended unfinished, each with these budgets added."""
    return _Reopen(add_attempts, add_time_s)


def APPROVE(step: str | None) -> BulkAction:
    """The bulk approval of every pending (non-question) request, or only those of ``step``."""
    return _Approve(step)


def cmd_bulk(
    store: Store,
    action: BulkAction,
    chosen: TaskFilter,
    *,
    assume_yes: bool,
    who: str,
    reason: str,
    out: TextIO,
    err: TextIO,
    ttl_s: float | None = None,
    sign_key: str | None = None,
    control_root: str | None = None,
    as_json: bool = False,
) -> int:
    """List what ``action`` would do to each task ``chosen`` selects; with ``assume_yes``, do it."""
    if chosen.empty:
        raise CliError(f"{action.name}: name a TASK, or choose tasks with --status, --function, --since, --until or --match", ExitCode.USAGE)
    key = load_key(sign_key) if sign_key is not None else None
    writer = Writer(store, who, reason, ttl_s, key, open_control_root(control_root))
    now = time.time()
    skipped: list[str] = []
    plans: list[tuple[Candidate, Planned]] = []
    for candidate in candidates(store, chosen, skipped=skipped):
        planned = action.plan(candidate, writer, now)
        if isinstance(planned, str):
            skipped.append(f"{candidate.task_id}: {planned}")
            continue
        plans += [(candidate, item) for item in planned]
    tasks = len({candidate.task_id for candidate, _ in plans})
    report: dict[str, JSONValue] = {
        "action": action.name, "filter": chosen.describe(), "dry_run": not assume_yes,
        "planned": [item.data for _, item in plans], "skipped": list(skipped), "done": [], "failed": [],
    }  # fmt: skip
    if not as_json:
        count = f"{tasks} task{'s' if tasks != 1 else ''}"
        if any(item.step is not None for _, item in plans):
            count = f"{len(plans)} request{'s' if len(plans) != 1 else ''} in {count}"
        out.write(f"{action.name}: {count} match ({chosen.describe()})\n")
        for _, item in plans:
            out.write(f"  {item.line}\n")
        for line in skipped:
            out.write(f"  left alone: {line}\n")
    if not assume_yes:
        if as_json:
            write_json(out, report)
        elif plans:
            out.write(f"nothing was written: run the same command with --yes to {action.name} {'them' if len(plans) != 1 else 'it'}\n")
        return ExitCode.OK
    done: list[JSONValue] = []
    failed: list[JSONValue] = []
    for candidate, item in plans:
        try:
            result = action.act(item, candidate, writer, now)
        except (LongrunError, OSError) as exc:
            failed.append({"task_id": item.task_id, "step": item.step, "error": error_text(exc)})
            if not as_json:
                err.write(f"longrun {action.name}: {item.task_id}{' step ' + item.step if item.step else ''}: {error_text(exc)}\n")
            continue
        done.append({"task_id": item.task_id, "step": item.step, **result})
        if not as_json:
            out.write(f"{action.done} {item.task_id}{' step ' + item.step if item.step else ''}\n")
    report["done"], report["failed"] = done, failed
    if as_json:
        write_json(out, report)
    else:
        out.write(
            f"{action.done} {len(done)} of {len(plans)}; a live worker acts on each within a second"
            + (f"; {len(failed)} failed (above)" if failed else "")
            + "\n"
        )
    return ExitCode.NOT_AS_ASKED if failed else ExitCode.OK


# -- retention ----------------------------------------------------------------------------------


def _live_parent(store: Store, candidate: Candidate, seen: dict[str, str | None]) -> str | None:
    """The task's parent and its status if the parent has not ended; None if it has none, or it ended or is gone."""
    parent = parent_of(candidate.state)
    if parent is None:
        return None
    if parent not in seen:
        try:
            state = store.load(parent).state
            seen[parent] = None if state is not None and state.status in TERMINAL else (state.status.value if state is not None else "new")
        except UnknownTaskError:
            seen[parent] = None
        except LongrunError as exc:
            seen[parent] = f"unreadable: {error_text(exc)}"
    status = seen[parent]
    return None if status is None else f"{parent} ({status})"


def _deletion_lines(deletion: TaskDeletion) -> list[str]:
    lines = [f"deleted {deletion.task_id} ({deletion.status} at revision {deletion.revision})"]
    return lines + [f"  removed {item}" for item in deletion.removed]


def cmd_delete(store: Store, task_id: str, *, out: TextIO, as_json: bool = False) -> int:
    """Delete one ended task. A task not ended, live, or the child of a live parent is refused (exit 1)."""
    task_id = checked_task(task_id)
    state = store.load(task_id).state
    candidate = Candidate(task_id, state)
    parent = _live_parent(store, candidate, {})
    if parent is not None and state is not None and state.status in TERMINAL:
        raise CliError(f"task {task_id!r} is a child of {parent}, which has not ended and may still read it; nothing was deleted", ExitCode.NOT_AS_ASKED)
    try:
        deletion = store.delete_task(task_id, time.time())
    except (TaskNotFinishedError, LeaseHeldError) as exc:
        raise CliError(str(exc), ExitCode.NOT_AS_ASKED) from exc
    if as_json:
        write_json(out, deletion.to_json())
    else:
        out.write("".join(line + "\n" for line in _deletion_lines(deletion)))
    return ExitCode.OK


def cmd_prune(
    store: Store,
    before: str,
    *,
    statuses: Sequence[str],
    functions: Sequence[str] = (),
    match: str | None = None,
    since: float | None = None,
    until: float | None = None,
    dry_run: bool,
    out: TextIO,
    err: TextIO,
    as_json: bool = False,
) -> int:
    """Delete the ended tasks last updated before ``before`` (see the module docstring)."""
    now = time.time()
    cutoff = parse_moment(before, now, option="--before")
    unended = [status for status in statuses if status not in ENDED]
    if unended:
        raise CliError(f"prune deletes only tasks whose run ended ({', '.join(ENDED)}), not {', '.join(unended)}", ExitCode.USAGE)
    chosen = TaskFilter(statuses=tuple(statuses) or ENDED, functions=tuple(functions), match=match, since=since, until=until)
    skipped: list[str] = []
    parents: dict[str, str | None] = {}
    deleted: list[TaskDeletion] = []
    planned: list[str] = []
    for candidate in candidates(store, chosen, skipped=skipped):
        state = candidate.state
        assert state is not None  # chosen by an ended status
        if state.updated_at >= cutoff:
            continue
        parent = _live_parent(store, candidate, parents)
        if parent is not None:
            skipped.append(f"{candidate.task_id}: a child of {parent}, which has not ended")
            continue
        if dry_run:
            planned.append(candidate.task_id)
            if not as_json:
                out.write(f"would delete {candidate.task_id} ({state.status.value} at revision {state.revision})\n")
            continue
        try:
            deletion = store.delete_task(candidate.task_id, now)
        except (TaskNotFinishedError, LeaseHeldError, UnknownTaskError) as exc:  # changed since it was read
            skipped.append(f"{candidate.task_id}: {error_text(exc)}")
            continue
        deleted.append(deletion)
        if not as_json:
            out.write("".join(line + "\n" for line in _deletion_lines(deletion)))
    if as_json:
        write_json(
            out,
            {
                "before": cutoff, "filter": chosen.describe(), "dry_run": dry_run, "would_delete": list(planned),
                "deleted": [deletion.to_json() for deletion in deleted], "skipped": list(skipped),
            },
        )  # fmt: skip
        return ExitCode.OK
    for line in skipped:
        out.write(f"left alone: {line}\n")
    count = len(planned) if dry_run else len(deleted)
    out.write(
        f"{'would delete' if dry_run else 'deleted'} {count} task{'s' if count != 1 else ''} "
        f"({chosen.describe()}, updated before {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(cutoff))})\n"
    )
    return ExitCode.OK
