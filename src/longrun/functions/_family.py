"""The cancellation a cancelled parent passes down to the children it started.

``cancel_children`` writes a cancellation for each child a task started and has not seen finish
(a child record of the parent neither verified nor failed, without ``detached: true``), and for
theirs in turn; each record names the parent whose cancellation caused it.
``longrun cancel`` calls it with the writer it used for the parent (the store, a control root,
signed), and a durable task that ends ``cancelled`` calls it through its store. Besides these
records, a child reads the cancellation of each task its record names in ``cancelled_with`` (its
parent, and theirs up to a detached link) through its own source before every new effect
(``Invocation.cancelled_with``), so a parent cancelled in a control area or by a signed record stops
its children there too, even where the records written to the store are not read.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Iterator

from .. import _crashpoints
from ..cancellation import Cancellation, judge_cancellation
from ..envelope import RunState
from ..errors import CorruptStateError, LongrunError, UnknownTaskError
from ..ledger import EffectState
from ..engine import Engine
from ..outcome import TERMINAL, Evidence, RunOutcome, Status
from ..protocols import CancellationSource, Store
from ._lineage import CHILD_ACTION

__all__ = ["cancel_children", "cancelled_down", "unfinished_children", "waiting_path"]

log = logging.getLogger("longrun")

_MAX_DEPTH = 64
"""The deepest family ``cancel_children`` walks (a guard: lineages are acyclic by construction)."""
_MAX_WALK = 10_000
"""The most tasks ``waiting_path`` loads looking for a cycle through tasks started on their own."""


def unfinished_children(state: RunState, *, detached: bool = False) -> Iterator[str]:
    """The task ids of the children ``state``'s task started, has not seen finish, and did not
    detach (with ``detached=True``, the detached ones too: the task waits on them all the same)."""
    for record in state.effects.values():
        if record.action != CHILD_ACTION or record.state in (EffectState.VERIFIED, EffectState.FAILED):
            continue
        payload = record.payload
        if isinstance(payload, dict) and isinstance(payload.get("task"), str) and (detached or payload.get("detached") is not True):
            yield str(payload["task"])


def waiting_path(store: Store, start: str, target: str) -> tuple[str, ...]:
    """The chain of unfinished children by which ``start`` waits on ``target`` (``start`` first,
    ``target`` last), or () if it does not: a child started independently of its parent records no
    lineage, so a cycle through it is found by following what each task waits on."""
    paths: dict[str, tuple[str, ...]] = {start: (start,)}
    pending = [start]
    while pending and len(paths) <= _MAX_WALK:
        task = pending.pop()
        try:
            state = store.load(task).state
        except UnknownTaskError:
            continue
        except CorruptStateError as exc:  # its own run stops on the damage; what it waits on is unknown
            log.warning("task %s: its state cannot be read (%s); a cycle through it is not looked for", task, exc)
            continue
        if state is None:
            continue
        for child in unfinished_children(state, detached=True):
            if child == target:
                return (*paths[task], child)
            if child not in paths:
                paths[child] = (*paths[task], child)
                pending.append(child)
    return ()


def cancel_children(
    store: Store,
    task_id: str,
    cause: Cancellation,
    *,
    write: Callable[[Cancellation], object] | None = None,
    source: CancellationSource | None = None,
    state: RunState | None = None,
) -> list[str]:
    """Cancel the unfinished, not detached children of ``task_id`` and theirs; return their ids.

    ``cause`` is the parent's cancellation: each child's record keeps its ``requested_by`` and
    names the parent in its ``reason``. ``write`` writes a record (by default
    ``store.write_cancellation``); ``source`` is where a child's existing record is read (by
    default the store): a child that already has a valid cancellation, or whose run already
    ended, is left as it is. ``state`` is the parent's, if the caller has it."""
    writer = write if write is not None else store.write_cancellation
    reader = source if source is not None else store
    cancelled: list[str] = []
    seen = {task_id}
    if state is None:
        state = store.load(task_id).state
    pending = [(task_id, state, 0)]
    while pending:
        parent, parent_state, depth = pending.pop()
        if parent_state is None or depth >= _MAX_DEPTH:
            continue
        for child in unfinished_children(parent_state):
            if child in seen:
                continue
            seen.add(child)
            try:
                child_state = store.load(child).state
            except UnknownTaskError:
                continue  # planned by the parent, never started: there is no run to stop
            except LongrunError as exc:  # its cancellation is still written; its own children cannot be read
                log.warning("task %s: its state cannot be read (%s); its own children are not cancelled", child, exc)
                child_state = None
            if child_state is not None and child_state.status in TERMINAL:
                continue
            if not _already_cancelled(reader, child):
                reason = f"its parent task {parent!r} was cancelled: {cause.reason}"
                writer(Cancellation(child, cause.requested_at, cause.requested_by, reason))
                cancelled.append(child)
            pending.append((child, child_state, depth + 1))
    return cancelled


def _already_cancelled(source: CancellationSource, task_id: str) -> bool:
    try:
        raw = source.read_cancellation(task_id)
    except LongrunError as exc:
        log.warning("task %s: its cancellation record cannot be read (%s); a new one is written", task_id, exc)
        return False
    return raw is not None and judge_cancellation(raw, task_id).verdict == "cancelled"


def cancelled_down(engine: Engine, outcome: RunOutcome) -> RunOutcome:
    """``outcome``; if the task ended ``cancelled``, after cancelling its unfinished children through
    the store (an inference of the outcome names them). A store error propagates: the task is
    cancelled and stays so, and running it again (it returns ``cancelled`` at once) tries again."""
    if outcome.status is Status.DEADLINE_EXCEEDED:
        return _deadline_down(engine, outcome)
    if outcome.status is not Status.CANCELLED:
        return outcome
    config = engine.config
    task_id = config.task_id
    cause = Cancellation(task_id, config.clock.now(), "longrun", "the run ended cancelled")
    for whose in (task_id, *engine.invocation.cancelled_with):  # the record that cancelled it: its own, or an ancestor's
        raw = config.cancellations.read_cancellation(whose)
        judged = judge_cancellation(raw, whose).record if raw is not None else None
        if judged is not None:
            cause = judged
            break
    cancelled = cancel_children(config.store, task_id, cause)
    if not cancelled:
        return outcome
    log.info("task %s ended cancelled: its children %s are cancelled too", task_id, cancelled, extra={"task": task_id})
    note = Evidence("children", f"the run ended cancelled, so its unfinished children are cancelled too: {cancelled}", config.clock.now())
    return dataclasses.replace(outcome, inferences=(*outcome.inferences, note))


def _deadline_down(engine: Engine, outcome: RunOutcome) -> RunOutcome:
    """``outcome`` of a task that ended ``deadline-exceeded``, after cancelling its unfinished, not
    detached children (they inherit the deadline, so they stop at it too; the cancellation makes
    sure one that is not running now never starts another step)."""
    config = engine.config
    task_id = config.task_id
    now = config.clock.now()
    if _crashpoints.ARMED:  # the stop is committed, the children not cancelled yet: running the task again cancels them
        _crashpoints.hit("deadline.children", task_id)
    cause = Cancellation(task_id, now, "longrun", "its deadline passed")
    cancelled = cancel_children(config.store, task_id, cause)
    if not cancelled:
        return outcome
    log.info("task %s ended deadline-exceeded: its children %s are cancelled", task_id, cancelled, extra={"task": task_id})
    note = Evidence("children", f"the task's deadline passed, so its unfinished children are cancelled: {cancelled}", now)
    return dataclasses.replace(outcome, inferences=(*outcome.inferences, note))
