"""What a run tells the application while it runs: log records and an event hook.

Two channels, both fed by the engine, for every face (``Runner`` and ``@durable``):

- **Logging** on the ``longrun`` logger. INFO: a run's start and its stop with the status, and
  every move of an effect or call record (planned, started, acknowledged, verified, uncertain,
  retry scheduled, failed). DEBUG: each commit, lease and store detail. WARNING: anomalies, things
  that went wrong around the run rather than legal outcomes of it (an adapter that raised, damage
  found in the store, a hook that raised). Every stop is a legal outcome, logged at INFO with its
  status in ``state``: filter on it to alert on ``unsafe-to-continue`` and the like.
  Every record on that logger carries the same ``extra`` fields (``LOG_FIELDS``): ``task``,
  ``step``, ``key``, ``action``, ``state``, ``attempt``, ``epoch``, ``revision``, ``function`` and
  ``worker``. A filter on the logger fills in what a record lacks from the run under way in the
  logging thread or task (its task, its durable function once the state is loaded, its lease
  epoch), so a record logged by a store or an adapter's caller during a run names the run too;
  None only where a field does not apply. ``longrun.logging.JsonFormatter`` writes them as JSON
  fields. Library code never prints.
- **Events**: ``on_event(event: RunEvent)``, called on the thread that runs the engine, after the
  commit that made a transition durable, with one frozen ``RunEvent`` per effect record that the
  commit changed (in the order the run changed them) and one per change of the run's status (and
  at each invocation's first commit). Each invocation that commits anything is bracketed: a
  ``run-start`` event comes first, with its first commit (its ``epoch`` names the invocation: a
  resumed run has a higher one), and a ``run-end`` event last, when it returns its outcome, after
  its last commit (``state`` the status it stopped with). A tracer opens a run's span at the one and
  closes it at the other, and parents the step spans on it. An exception from the hook is logged at
  WARNING with its traceback and never breaks the run.

Not guaranteed: an event for every move a record makes in memory. Between two commits a record
may pass several states (``planned`` then ``started``; ``acknowledged`` then ``verified``): the
event reports the state that was committed, which is the one a crash would leave. Events are not
stored: one is lost if the process dies between the commit and the hook (the store keeps the
record; ``longrun status`` reads it there, from any process), nor a ``run-end`` for an invocation
that dies or raises (its ``run-start`` stays unmatched, as the process's spans would).
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import logging
from dataclasses import dataclass
from typing import Any, Callable, Generator

from .canonical import JSONValue
from .contract import INTERNAL_PREFIX, is_internal
from .envelope import RunState
from .errors import InvalidInputError
from .ledger import EffectRecord, EffectState
from .outcome import Status

__all__ = ["EVENT_KINDS", "EventHook", "LOG_FIELDS", "RunEvent", "Reporter", "kind_of", "record_fields"]

log = logging.getLogger("longrun")

LOG_FIELDS = ("task", "step", "key", "action", "state", "attempt", "epoch", "revision", "function", "worker")
"""The ``extra`` fields every log record on the ``longrun`` logger carries (None where they do not apply)."""

_RUN_FIELDS: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("longrun_run_fields", default=None)
"""The fields of the run under way in this thread or task (``Reporter.fields``), for ``_WithFields``."""
_FUNCTION_STEP = INTERNAL_PREFIX + "function"

_KINDS = {
    "call": "call", "sleep": "timer", "ask": "question", "child": "child", "function": "function",
    "send": "send", "recv": "receive", "event": "event",
}  # fmt: skip

EVENT_KINDS: tuple[str, ...] = (
    "run-start", "run", "run-end", "effect", "call", "timer", "question", "child", "send", "receive", "event", "function", "internal",
)  # fmt: skip
"""Every ``RunEvent.kind``: the three of the run itself, then what a ledger record is (``kind_of``)."""


def _utc(at: float) -> str:
    """A time as log messages write it: ISO 8601, UTC, to the second."""
    try:
        return datetime.datetime.fromtimestamp(at, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return f"{at:.0f} (seconds since the epoch)"


def kind_of(action: str) -> str:
    """What a ledger record is, for people: ``effect``, or a durable function's ``call``,
    ``timer``, ``question``, ``child``, ``send``, ``receive``, ``event`` or ``function`` (its own record)."""
    if not is_internal(action):
        return "effect"
    return _KINDS.get(action[len(INTERNAL_PREFIX) :], "internal")


@dataclass(frozen=True, slots=True)
class RunEvent:
    """One durable transition of a run, as ``on_event`` receives it.

    ``kind`` is ``"run"`` for a change of the run's status (``state`` is then the status, e.g.
    ``"running"``, ``"awaiting-approval"``, ``"done"``; ``step`` and ``key`` are None and ``detail``
    is the recorded next action); ``"run-start"`` for the start of an invocation (the first event
    of its first commit: ``state`` the status committed, ``detail`` who runs it, ``epoch`` its
    lease epoch); ``"run-end"`` for its end (the last event: ``state`` the status it stopped with,
    ``detail`` the next action, ``time`` when it stopped); else what the record is (``kind_of``:
    ``effect``, ``call``, ``timer``, ``question``, ``child``, ``function``): ``state`` is the
    record's ledger state and ``detail`` its last error, if any. ``EVENT_KINDS`` lists them all.
    """

    task: str
    step: str | None
    state: str
    attempt: int
    time: float
    """When the commit was made, by the run's clock (seconds since the epoch)."""
    revision: int
    """The revision whose commit made the transition durable."""
    kind: str = "effect"
    key: str | None = None
    epoch: int = 0
    detail: str | None = None

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "task": self.task,
            "step": self.step,
            "state": self.state,
            "attempt": self.attempt,
            "time": self.time,
            "revision": self.revision,
            "kind": self.kind,
            "key": self.key,
            "epoch": self.epoch,
            "detail": self.detail,
        }


EventHook = Callable[[RunEvent], None]
"""The type of ``on_event``."""


def _extra(
    task: str,
    *,
    step: str | None = None,
    key: str | None = None,
    action: str | None = None,
    state: str | None = None,
    attempt: int | None = None,
    epoch: int | None = None,
    revision: int | None = None,
) -> dict[str, object]:
    return {
        "task": task, "step": step, "key": key, "action": action, "state": state, "attempt": attempt, "epoch": epoch,
        "revision": revision,
    }  # fmt: skip


def record_fields(record: EffectRecord) -> dict[str, object]:
    """The ``extra`` fields of a log record about one effect record (its task is the run's)."""
    return {
        "step": record.step_id, "key": record.key, "action": record.action, "state": record.state.value,
        "attempt": record.attempts, "epoch": record.epoch or None,
    }  # fmt: skip


class _WithFields(logging.Filter):
    """Gives every record on the ``longrun`` logger the ``LOG_FIELDS``: as the caller set them, else
    from the run under way in the logging thread or task (``Reporter.logging``), else None; so a
    formatter may name them whichever module logged the record."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = record.__dict__
        run = _RUN_FIELDS.get()
        for name in LOG_FIELDS:
            if fields.get(name) is None:
                fields[name] = run.get(name) if run is not None else None
        return True


if not any(isinstance(item, _WithFields) for item in log.filters):
    log.addFilter(_WithFields())


class Reporter:
    """The engine's side of both channels, for one task: it logs moves as the run makes them and
    hands events to the hook after each commit. Not thread-safe (one per engine)."""

    def __init__(self, task_id: str, hook: EventHook | None):
        if hook is not None and not callable(hook):
            raise InvalidInputError(f"on_event must be callable (it receives a RunEvent), got {hook!r}")
        self.task_id = task_id
        self.hook = hook
        self.fields: dict[str, Any] = {"task": task_id}
        """What every log record made during this task's run names (``LOG_FIELDS``): the task, and
        once known the function and the lease epoch."""
        self._pending: dict[str, None] = {}
        """Step ids whose records changed since the last commit, in the order they changed."""
        self._status: Status | None = None
        self._owner = ""
        self._started = False
        """This invocation has committed, so its ``run-start`` was handed out (and a ``run-end`` is due)."""

    # -- the run ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def logging(self) -> Generator[None, None, None]:
        """While the run is under way: records logged in this thread or task name it (``_WithFields``)."""
        token = _RUN_FIELDS.set(self.fields)
        try:
            yield
        finally:
            _RUN_FIELDS.reset(token)

    def begin(self, owner: str) -> None:
        """A new invocation: nothing pending, its first commit reports the status."""
        self._pending.clear()
        self._status = None
        self._owner = owner
        self._started = False
        self.fields.pop("epoch", None)
        log.info("task %s: run started by %s", self.task_id, owner, extra=_extra(self.task_id))

    def loaded(self, state: RunState, epoch: int) -> None:
        """The run's state is loaded (or made) under the lease of ``epoch``: later records name the
        durable function it runs, if it is one, and the epoch."""
        self.fields["epoch"] = epoch
        record = state.effects.get(_FUNCTION_STEP)
        if record is not None:
            self._name_function(record)

    def _name_function(self, record: EffectRecord) -> None:
        name = record.payload.get("function")
        if isinstance(name, str):
            self.fields["function"] = name

    def stopped(self, status: Status, next_action: str, *, revision: int, epoch: int, time: float) -> None:
        """The invocation returns ``status``: log it, and hand the hook its ``run-end`` (if it committed)."""
        if log.isEnabledFor(logging.INFO):
            log.info(
                "task %s: run stopped %s at revision %d; next: %s",
                self.task_id, status.value, revision, next_action,
                extra=_extra(self.task_id, state=status.value, epoch=epoch or None, revision=revision or None),
            )  # fmt: skip
        if self._started:
            self._started = False
            end = RunEvent(self.task_id, None, status.value, 0, time, revision, kind="run-end", epoch=epoch, detail=next_action or None)
            self._deliver([end])

    # -- records ------------------------------------------------------------------------------

    def moved(self, previous: EffectRecord | None, record: EffectRecord) -> None:
        """A record replaced in the working state (durable with the next commit)."""
        self._pending[record.step_id] = None
        if previous is None and record.step_id == _FUNCTION_STEP:  # a new task's own record names its function
            self._name_function(record)
        if previous is not None and previous.state is record.state and previous.not_before == record.not_before:
            return
        if not log.isEnabledFor(logging.INFO):
            return
        kind = kind_of(record.action)
        what = f"{kind} {record.step_id}"
        state = record.state.value
        if record.state is EffectState.PLANNED and record.not_before is not None and record.attempts == 0:
            # Not a retry: a timer's wake time, or a first attempt held back (a recovered backoff).
            state = "sleeping" if kind == "timer" else "waiting"
            text = f"{'sleeps' if kind == 'timer' else 'waits'} until {_utc(record.not_before)}"
        elif record.state is EffectState.PLANNED and previous is not None:
            # No error is recorded when the attempt was observed not to have taken place (a process
            # that died mid-apply) or a deduplicating target could not say: name what is known.
            if record.last_error:
                why = f"attempt {record.attempts} failed: {record.last_error}"
            elif record.evidence:
                why = f"attempt {record.attempts} observed: {record.evidence}"
            else:
                why = f"attempt {record.attempts}, no error recorded"
            if record.not_before is not None:
                state = "retry-scheduled"
                text = f"retry scheduled ({why}; next attempt at {_utc(record.not_before)})"
            else:
                text = f"may be applied again ({why})"
        elif record.state is EffectState.PLANNED:
            text = f"planned (action {record.action})"
        elif record.state is EffectState.STARTED:
            text = f"attempt {record.attempts} started"
        elif record.state is EffectState.ACKNOWLEDGED:
            text = f"acknowledged: {record.receipt}"
        elif record.state is EffectState.UNCERTAIN:
            text = f"uncertain: {record.last_error or 'its outcome is not known'}"
        elif record.state is EffectState.FAILED:
            text = f"failed: {record.last_error or 'no error recorded'}"
        else:
            text = "verified" + (f" ({record.evidence})" if record.evidence else "")
        log.info(
            "task %s: %s %s",
            self.task_id, what, text,
            extra=_extra(self.task_id, step=record.step_id, key=record.key, action=record.action, state=state,
                         attempt=record.attempts, epoch=record.epoch or None),
        )  # fmt: skip

    def committed(self, state: RunState) -> None:
        """``state`` was just committed: log it, and hand the hook what became durable."""
        pending, self._pending = self._pending, {}
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "task %s: revision %d committed at epoch %d (%d record%s changed, status %s)",
                self.task_id, state.revision, state.lease_epoch, len(pending), "s" if len(pending) != 1 else "",
                state.status.value,
                extra=_extra(self.task_id, state=state.status.value, epoch=state.lease_epoch, revision=state.revision),
            )  # fmt: skip
        status_changed = state.status is not self._status
        self._status = state.status
        first, self._started = not self._started, True
        if self.hook is None:
            return
        events: list[RunEvent] = []
        if first:
            events.append(
                RunEvent(
                    self.task_id, None, state.status.value, 0, state.updated_at, state.revision,
                    kind="run-start", epoch=state.lease_epoch, detail=self._owner or None,
                )
            )  # fmt: skip
        for step_id in pending:
            record = state.effects.get(step_id)
            if record is not None:
                events.append(
                    RunEvent(
                        self.task_id, step_id, record.state.value, record.attempts, state.updated_at, state.revision,
                        kind=kind_of(record.action), key=record.key, epoch=record.epoch, detail=record.last_error,
                    )
                )  # fmt: skip
        if status_changed:
            events.append(
                RunEvent(
                    self.task_id, None, state.status.value, 0, state.updated_at, state.revision,
                    kind="run", epoch=state.lease_epoch, detail=state.next_action or None,
                )
            )  # fmt: skip
        self._deliver(events)

    def _deliver(self, events: list[RunEvent]) -> None:
        hook = self.hook
        if hook is None:
            return
        for event in events:
            try:
                hook(event)
            except Exception:  # the application's code: logged, and the run goes on
                log.warning(
                    "task %s: the on_event hook raised on %s %s %s; the run goes on",
                    self.task_id, event.kind, event.step or "", event.state, exc_info=True,
                    extra=_extra(self.task_id, step=event.step, key=event.key, state=event.state, attempt=event.attempt,
                                 epoch=event.epoch or None, revision=event.revision),
                )  # fmt: skip
