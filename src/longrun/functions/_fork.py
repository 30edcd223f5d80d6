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
origin records the fork as a verified record of its own (``FORK_PREFIX`` + the new task id, action
``FORK_ACTION``), committed under its lease before the fork's first revision, so ``longrun status``
of the origin lists it.

Refused before anything is written: an origin that is not a durable function's task or not this
function's (``ForkRefusedError``), a step the origin does not record (``UnknownStepError``), an
origin with an effect in flight anywhere (``ForkRefusedError``: resolve it first; after the step
the fork would make it again under a new key, a duplicate if it took place), a new task id the
store already holds (``TaskExistsError``), and an origin whose lease is held (``LeaseHeldError``).

Not guaranteed: what the fork's code makes of the copied results (they are what the origin recorded,
even if the fixed code would now compute them otherwise).
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING

from ..canonical import JSONValue, digest_of
from ..engine import Engine, Stop
from ..envelope import RunState
from ..errors import ForkRefusedError, TaskExistsError, UnknownStepError, UnknownTaskError
from ..intervention import FORK_ACTION, FORK_PREFIX
from ..ledger import EffectRecord, EffectState
from ..outcome import Status
from ..protocols import Store
from ._lineage import CALL_ACTION, FUNCTION_STEP

if TYPE_CHECKING:
    from ._plan import FunctionPlan

__all__ = ["Forking", "check_new_task", "records_to_copy", "record_fork_in_origin"]

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


def check_new_task(store: Store, task_id: str) -> None:
    try:
        state = store.load(task_id).state
    except UnknownTaskError:
        return
    if state is not None:
        raise TaskExistsError(f"task {task_id!r} already exists in this store: a fork needs a new task id; nothing was written")


def record_fork_in_origin(store: Store, origin: str, fork: str, from_step: str, now: float) -> None:
    """Commit, under the origin's lease, its record of the fork (``LeaseHeldError`` while it runs)."""
    owner = f"longrun fork {socket.gethostname()}:{os.getpid()}"
    lease = store.acquire_lease(origin, owner, _LEASE_TTL_S, now)
    try:
        state = store.load(origin, lease=lease).state
        if state is None:
            raise UnknownTaskError(f"task {origin!r} has no committed state; nothing was written")
        step_id = FORK_PREFIX + fork
        if step_id not in state.effects:
            payload: dict[str, JSONValue] = {"task": fork, "step": from_step}
            state.effects[step_id] = EffectRecord(
                key=f"{origin}/{step_id}", step_id=step_id, action=FORK_ACTION, payload=payload, payload_digest=digest_of(payload),
                state=EffectState.VERIFIED, updated_at=now,
            )  # fmt: skip
            state.updated_at = now
            store.commit(lease, state, frozenset({step_id}))
    finally:
        store.release_lease(lease, now)


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
