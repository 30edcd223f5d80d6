"""Forking a durable task: a new task that starts with the origin's records before a step, as recorded.

``fork_task`` copies, from the origin's ledger, every record before ``from_step`` (in ledger order,
which is the order the function made them) that a replay reads instead of acting: verified effects
and calls, and calls whose exception is recorded. They keep their keys: the fork's function replays
them from the copies and never applies them again. From ``from_step`` on, nothing is copied, so the
fork makes those steps itself, under its own effect keys (``<new task>/<step id>``): a target sees
new keys from that step on. Without ``from_step`` the fork starts at the origin's first step that is
not verified.

The fork's function record names its origin (``forked_from``: the task and the step), beside the
function and its recorded arguments (not part of the plan digest, as a child's parent is not). The
fork holds the origin's lease from the check of its records to the end, so the origin cannot move
meanwhile. The origin records the fork as a verified record of its own (``FORK_PREFIX`` + the new
task id, action ``FORK_ACTION``), committed after the fork's first revision, so ``longrun status``
of the origin lists only forks that exist. A fork stopped between the two (a crash) is completed by
running the same fork again: a new task that is already a fork of this origin is recorded, not refused.

Refused before anything is written: an origin that is not a durable function's task or not this
function's (``ForkRefusedError``), a step the origin does not record (``UnknownStepError``), an
origin with an effect in flight anywhere (``ForkRefusedError``: resolve it first; after the step
the fork would make it again under a new key, a duplicate if it took place), a new task id the
store already holds (``TaskExistsError``), and an origin whose lease is held (``LeaseHeldError``).

Not guaranteed: what the fork's code makes of the copied results (they are what the origin recorded,
even if the fixed code would now compute them otherwise).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Generator
from typing import TYPE_CHECKING

from ..canonical import JSONValue, digest_of
from ..engine import Engine, Stop
from ..envelope import RunState
from ..errors import ForkRefusedError, TaskExistsError, UnknownStepError, UnknownTaskError
from ..intervention import FORK_ACTION, FORK_PREFIX
from ..lease import Lease
from ..ledger import EffectRecord, EffectState
from ..outcome import Status
from ..protocols import Store
from ._lineage import CALL_ACTION, FUNCTION_STEP

if TYPE_CHECKING:
    from ._plan import FunctionPlan

__all__ = ["Forking", "check_new_task", "holding_origin", "records_to_copy", "record_fork_in_origin"]

_LEASE_TTL_S = 30.0


def _copied(record: EffectRecord) -> bool:
    return record.state is EffectState.VERIFIED or (record.action == CALL_ACTION and record.state is EffectState.FAILED)


def records_to_copy(origin: RunState, from_step: str | None) -> tuple[str, list[EffectRecord]]:
    """The step the fork starts at (``""`` when every step is copied) and the records it copies."""
    ledger = [record for record in origin.effects.values() if record.step_id != FUNCTION_STEP and not record.step_id.startswith(FORK_PREFIX)]
    if from_step is not None:
        steps = [record.step_id for record in ledger]
        if from_step not in steps:
            known = ", ".join(steps[:20]) or "none"
            raise UnknownStepError(f"task {origin.task_id!r} records no step {from_step!r} (its steps: {known}); nothing was written")
        before = ledger[: steps.index(from_step)]
    else:
        before = []
        for record in ledger:
            if record.state is not EffectState.VERIFIED:
                break
            before.append(record)
        from_step = ledger[len(before)].step_id if len(before) < len(ledger) else ""
    in_flight = [record.step_id for record in ledger if record.in_flight]
    if in_flight:
        # Before the step it could not be copied; from the step on the fork would make it again under a
        # new key, which the target cannot tell from the first: a duplicate if the first took place.
        raise ForkRefusedError(
            f"step(s) {', '.join(in_flight)} of task {origin.task_id!r} are in flight: whether the target has them is "
            "not known, so they can be neither copied nor made again under new keys; resolve them first "
            "(`longrun resolve`). Nothing was written"
        )
    return from_step, [record for record in before if _copied(record)]


def check_new_task(store: Store, task_id: str, origin: str) -> dict[str, JSONValue] | None:
    """None when the store does not hold ``task_id``; its ``forked_from`` when it is already a fork of
    ``origin`` (made by a fork that stopped before the origin recorded it); else ``TaskExistsError``."""
    try:
        state = store.load(task_id).state
    except UnknownTaskError:
        return None
    if state is None:
        return None
    function = state.effects.get(FUNCTION_STEP)
    forked_from = function.payload.get("forked_from") if function is not None and isinstance(function.payload, dict) else None
    if isinstance(forked_from, dict) and forked_from.get("task") == origin and isinstance(forked_from.get("step"), str):
        return forked_from
    raise TaskExistsError(f"task {task_id!r} already exists in this store: a fork needs a new task id; nothing was written")


@contextlib.contextmanager
def holding_origin(store: Store, origin: str, now: float) -> Generator[tuple[Lease, RunState], None, None]:
    """The origin's lease and its state loaded under it, for the whole fork: the origin cannot move
    (start an effect the fork would make again) between the check and the fork's records
    (``LeaseHeldError`` while it runs)."""
    owner = f"longrun fork {socket.gethostname()}:{os.getpid()}"
    lease = store.acquire_lease(origin, owner, _LEASE_TTL_S, now)
    try:
        state = store.load(origin, lease=lease).state
        if state is None:
            raise UnknownTaskError(f"task {origin!r} has no committed state; nothing was written")
        yield lease, state
    finally:
        store.release_lease(lease, now)


def record_fork_in_origin(store: Store, lease: Lease, state: RunState, fork: str, from_step: str, now: float) -> None:
    """Commit the origin's record of ``fork``, under the lease ``holding_origin`` took, once the fork
    exists: a fork that failed before its first revision leaves the origin unchanged."""
    step_id = FORK_PREFIX + fork
    if step_id in state.effects:
        return
    payload: dict[str, JSONValue] = {"task": fork, "step": from_step}
    state.effects[step_id] = EffectRecord(
        key=f"{state.task_id}/{step_id}", step_id=step_id, action=FORK_ACTION, payload=payload, payload_digest=digest_of(payload),
        state=EffectState.VERIFIED, updated_at=now,
    )  # fmt: skip
    state.updated_at = now
    store.commit(lease, state, frozenset({step_id}))


class Forking:
    """The plan ``DurableFunction.fork`` runs for the new task: its first revision holds its function
    record (naming the origin) and the copied records; the function is not called."""

    def __init__(self, plan: "FunctionPlan", copied: list[EffectRecord], forked_from: dict[str, JSONValue]):
        self._plan = plan
        self._copied = copied
        self._forked_from = forked_from
        self.digest = plan.digest

    def initial(self, engine: Engine, state: RunState) -> None:
        self._plan.initial(engine, state)
        function = state.effects[FUNCTION_STEP]
        payload = {**function.payload, "forked_from": self._forked_from}
        engine.invocation.put(function.with_changes(payload=payload, payload_digest=digest_of(payload)))
        for record in self._copied:
            engine.invocation.put(record)

    def accept(self, engine: Engine, state: RunState) -> None:
        raise TaskExistsError(f"task {engine.config.task_id!r} was created meanwhile by another process; nothing was written")

    def drive(self, engine: Engine) -> None:
        raise Stop(
            Status.RUNNING,
            f"nothing yet: a worker runs it (`longrun worker {engine.config.store_spec} --import MODULE`), "
            f"or `longrun resume {engine.config.store_spec} {engine.config.task_id}`",
        )

    async def adrive(self, engine: Engine) -> None:
        self.drive(engine)

    def progress(self, state: RunState) -> str:
        return self._plan.progress(state)

    def result(self, state: RunState) -> JSONValue:
        return None
