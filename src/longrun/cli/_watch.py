"""``longrun watch``: follow one task live, from any process that can read its store.

It polls: every ``interval`` seconds it loads the task read-only (no lease, nothing moved) and
shows what the state says. On a terminal the view is redrawn in place::

    task newsletter-48   running   revision 14   updated 0.4s ago
    [##################----------------------]  4/9 verified (44%)  0.8/s  about 6s left
      1 in flight, 0 waiting, 0 ready, 4 not yet planned
    reported [########------]  450/1000 (45%), 12/s, about 46s left: importing rows
    current  effect mail-4 (send), started, attempt 1, for 1.2s
    lease    held: owner host:123:ab, epoch 3, expires ...
    last events
      12:00:04.120  mail-3   verified  (attempt 1)
      ...

The ``reported`` line is what a durable function last said with ``run.progress`` (its own units,
with the rate between its two recorded points and the time left at that rate).

Elsewhere (a pipe, a file, ``--json``) it prints one line per event as it sees it (and one per new
progress report, kind ``progress``), which is what a log or a CI job wants. An event here is a record the poll found changed (its state or
attempt): between two polls a record may have moved more than once, and only its latest state is
seen. The command exits when the run stops (any status but ``running`` or ``queued``): 0 for
``done``, 4 for a run that ended without finishing (cancelled, limits-exhausted, deadline-exceeded, blocked, failed), 1
for any other stop (awaiting an approval, a retry later...). The task's last error (its code raised,
or its process died inside a step) is shown with the time it happened, and printed once as a
``failure`` event in line output. A task that says ``running`` but whose lease has expired
has no live runner (it died): the view says so and goes on waiting for one.

Not guaranteed: that every transition is seen (see above), or a cheap poll for a huge ledger (each
poll loads the whole state: use a longer ``--interval`` for a 100,000-step task).
"""

from __future__ import annotations

import heapq
import json
import os
import shutil
import time
from typing import Callable, TextIO

from ..envelope import RunState
from ..events import kind_of
from ..failures import RunFailure
from ..lease import Lease
from ..ledger import EffectRecord
from ..outcome import ENDED_UNFINISHED, Status
from ..progress import Progress, progress_of
from ..protocols import Store
from ._common import STORE_PLACEHOLDER, ExitCode, checked_task, format_duration, format_time, lease_summary, name_store, relative
from ._inspect import progress_line, reported_line
from ._payload import safe_text

__all__ = ["cmd_watch", "render_frame"]

LAST_EVENTS = 6
BAR_WIDTH = 40


def _bar(progress: Progress) -> str:
    fraction = progress.fraction
    if fraction is None:
        return ""
    filled = min(BAR_WIDTH, int(round(fraction * BAR_WIDTH)))
    return "[" + "#" * filled + "-" * (BAR_WIDTH - filled) + "]"


def _clock(at: float) -> str:
    return format_time(at, precise=True)[11:-1]  # HH:MM:SS.mmm, UTC


def _event_text(record: EffectRecord) -> str:
    text = f"{kind_of(record.action)} {safe_text(record.step_id)} {record.state.value} (attempt {record.attempts})"
    if record.last_error and record.state.value != "verified":
        text += f": {safe_text(record.last_error)}"
    return text


def render_frame(task_id: str, state: RunState | None, lease: Lease | None, now: float) -> list[str]:
    """The terminal view of one poll (see the module docstring)."""
    if state is None:
        return [f"task {task_id}   no revision committed yet: waiting for the run to start", f"lease    {lease_summary(lease, now)}"]
    progress = progress_of(state)
    head = f"task {task_id}   {state.status.value}   revision {state.revision}   updated {relative(state.updated_at, now)}"
    lines = [head]
    speed = ""
    if progress.rate is not None:
        speed = f"  {progress.rate:.2f}/s" if progress.rate < 10 else f"  {progress.rate:.0f}/s"
        if progress.eta_s is not None and progress.total is not None and progress.verified < progress.total:
            speed += f"  about {format_duration(progress.eta_s)} left"
    if progress.total is not None:
        lines.append(f"{_bar(progress)}  {progress.verified}/{progress.total} verified ({100 * (progress.fraction or 0):.0f}%){speed}")
    else:
        lines.append(f"{progress.verified} verified{speed}")
    lines.append("  " + progress_line(progress))
    if progress.reported is not None:
        report = progress.reported
        bar = f"[{'#' * int(round(report.fraction * BAR_WIDTH))}{'-' * (BAR_WIDTH - int(round(report.fraction * BAR_WIDTH)))}]  " if report.fraction is not None else ""
        lines.append(f"reported {bar}{reported_line(report)}")
    current = progress.current
    if current is not None:
        lines.append(
            f"current  {kind_of(current.action)} {safe_text(current.step_id)} ({safe_text(current.action)}), "
            f"{current.state.value}, attempt {current.attempts}, for {format_duration(max(0.0, now - current.updated_at))}"
        )
    lines.append(f"lease    {lease_summary(lease, now)}")
    if state.status is Status.RUNNING and (lease is None or lease.expired(now)):
        lines.append("         no live runner holds the lease: the run waits for someone to run it again")
    recent = heapq.nlargest(LAST_EVENTS, state.effects.values(), key=lambda record: record.updated_at)
    if recent:
        lines.append("last events")
        lines += [f"  {_clock(record.updated_at)}  {_event_text(record)}" for record in reversed(recent)]
    if state.last_failure is not None:
        lines.append(f"error    {safe_text(state.last_failure.summary())} at {_clock(state.last_failure.at)}")
    if state.status is Status.QUEUED:
        lines.append("         queued: recorded and not started yet; waiting for a worker or a resume to start it")
    elif state.status is not Status.RUNNING:
        lines.append(f"stopped  {state.status.value}: next, {safe_text(state.next_action)}")
    return lines


_UNDER_WAY = frozenset({Status.RUNNING, Status.QUEUED})
"""What ``watch`` waits through: a run under way, or a task recorded and not started yet."""


def _exit_code(status: Status) -> int:
    if status is Status.DONE:
        return ExitCode.OK
    if status in ENDED_UNFINISHED:
        return ExitCode.ENDED
    return ExitCode.NOT_AS_ASKED


class _Plain:
    """Line output: one line per record seen changed, and the stop."""

    def __init__(self, out: TextIO, task_id: str, as_json: bool):
        self.out = out
        self.task_id = task_id
        self.as_json = as_json
        self.seen: dict[str, tuple[str, int]] = {}
        self.failure: RunFailure | None = None
        self.started = False
        self.reported_at: float | None = None

    def write(self, kind: str, at: float | None, text: str, body: dict[str, object]) -> None:
        if self.as_json:
            self.out.write(json.dumps({"kind": kind, "task": self.task_id, "at": at, **body}, sort_keys=True) + "\n")
        else:
            self.out.write(f"{format_time(at, precise=True) if at is not None else '-':24}  {self.task_id}  {text}\n")
        self.out.flush()

    def show(self, state: RunState | None, now: float) -> None:
        if state is None:
            if not self.started:
                self.write("waiting", now, "no revision committed yet: waiting for the run to start", {})
                self.started = True
            return
        progress = progress_of(state)
        changed = []
        for record in state.effects.values():
            mark = (record.state.value, record.attempts)
            if self.seen.get(record.step_id) != mark:
                self.seen[record.step_id] = mark
                changed.append(record)
        if not self.started:
            self.started = True
            self.write(
                "watching", now, f"{state.status.value} at revision {state.revision}, {progress.label()} verified",
                {"status": state.status.value, "revision": state.revision, "progress": progress.to_json()},
            )  # fmt: skip
            changed = heapq.nlargest(LAST_EVENTS, changed, key=lambda record: record.updated_at)
            backlog = True
        else:
            backlog = False
        report = progress.reported
        if report is not None and report.at != self.reported_at:
            self.reported_at = report.at
            self.write("progress", report.at, f"reported {reported_line(report)}", {"progress": report.summary_json()})
        failure = state.last_failure
        if failure is not None and failure != self.failure:
            self.failure = failure
            self.write("failure", failure.at, f"run failed: {safe_text(failure.summary())}", {"last_failure": failure.to_json()})
        changed.sort(key=lambda record: record.updated_at)
        for record in changed:
            tag = "" if backlog else f"  [{progress.label()}]"  # the progress now, not when it happened
            self.write(
                "effect", record.updated_at, f"{_event_text(record)}{tag}",
                {"step": record.step_id, "state": record.state.value, "attempt": record.attempts, "kind": kind_of(record.action),
                 "revision": state.revision, "error": record.last_error},
            )  # fmt: skip

    def stopped(self, state: RunState) -> None:
        progress = progress_of(state)
        self.write(
            "stopped", state.updated_at, f"stopped {state.status.value} at revision {state.revision} [{progress.label()}]; next: {safe_text(state.next_action)}",
            {"status": state.status.value, "revision": state.revision, "next_action": state.next_action, "progress": progress.to_json(),
             "last_failure": state.last_failure.to_json() if state.last_failure is not None else None},
        )  # fmt: skip


class _Screen:
    """Terminal output: the frame redrawn in place."""

    def __init__(self, out: TextIO):
        self.out = out
        self.height = 0

    def show(self, lines: list[str]) -> None:
        width = max(20, shutil.get_terminal_size((100, 24)).columns - 1)
        lines = [line if len(line) <= width else line[: width - 1] + "…" for line in lines]
        prefix = f"\x1b[{self.height}F\x1b[J" if self.height else ""  # up to the frame's first line, clear below
        self.out.write(prefix + "\n".join(lines) + "\n")
        self.out.flush()
        self.height = len(lines)


def _is_terminal(out: TextIO) -> bool:
    try:
        return out.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False


def cmd_watch(
    store: Store,
    task_id: str,
    *,
    interval: float,
    out: TextIO,
    as_json: bool = False,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
    label: str = STORE_PLACEHOLDER,
) -> int:
    """Poll until the run stops; the exit code says how it stopped (see the module docstring).
    ``label`` names the store in the next actions shown."""
    task_id = checked_task(task_id)
    terminal = not as_json and _is_terminal(out)
    screen = _Screen(out) if terminal else None
    plain = None if terminal else _Plain(out, task_id, as_json)
    while True:
        state = store.load(task_id).state  # read-only: no lease, moves nothing (an unknown task: exit 2)
        if state is not None:  # this copy is only shown
            state.next_action = name_store(state.next_action, label)
        lease = store.read_lease(task_id)
        now = clock()
        if screen is not None:
            screen.show(render_frame(task_id, state, lease, now))
        elif plain is not None:
            plain.show(state, now)
        if state is not None and state.status not in _UNDER_WAY:
            if plain is not None:
                plain.stopped(state)
            return _exit_code(state.status)
        sleep(interval)
