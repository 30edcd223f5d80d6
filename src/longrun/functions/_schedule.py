"""``@scheduled``: a durable function started at each slot of a cron expression; starting slots.

``start_slots`` is the one place a slot's task is recorded (a worker's pass, ``longrun schedule
trigger`` and ``backfill`` all call it): ``fn.enqueue`` under the slot's task id
(``schedules.slot_task_id``), so a slot recorded twice, by two workers at once or by one killed
half-way, is one task. Moving the schedule past its slots comes after, compare-and-set
(``TaskQueue.advance_schedule``): a worker killed in between leaves the slots to the next pass,
which records nothing new.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Mapping, TypeVar

from ..cron import zone
from ..errors import InvalidInputError
from ..protocols import Store
from ..schedules import Schedule, ScheduleState, arguments_for, slot_task_id, takes_slot
from ._durable import DurableFunction

__all__ = ["SchedulePass", "scheduled", "start_due_slots", "start_slot"]

log = logging.getLogger("longrun")

R = TypeVar("R")


def scheduled(
    cron: str,
    *,
    store: Store | None = None,
    timezone: str = "UTC",
    catchup: str = "skip",
    name: str | None = None,
) -> Callable[[DurableFunction[R]], DurableFunction[R]]:
    """Start the durable function below at each slot of ``cron`` (read in ``timezone``), once
    across the fleet of workers that serve it; see ``longrun.schedules`` and ``longrun.cron``.

    ``catchup``: what a worker does with slots that passed while none ran: ``"skip"`` starts the
    latest only, ``"backfill"`` every one. ``name`` (default: the function's ``module.qualname``)
    names the schedule and prefixes its tasks' ids. The schedule is stored in ``store`` (default:
    the function's) now, at decoration, and again by each worker that serves the function; a
    schedule of that name stored with another cron, zone or catch-up is updated, and a paused one
    stays paused. The function takes no argument after the run, or one: the slot's time."""

    def decorate(function: DurableFunction[R]) -> DurableFunction[R]:
        from ..stores.queue import open_queue  # only a fleet needs the queue's tables

        if not isinstance(function, DurableFunction):
            raise InvalidInputError(f"@longrun.scheduled goes above @longrun.durable, got {function!r}")
        takes_slot(function.fn)  # refuses a function that can take neither
        schedule = Schedule(name or function.name.replace(":", "."), function.name, cron, timezone, catchup)
        target = store if store is not None else function.engine_options["store"]
        queue = open_queue(target)
        try:
            queue.add_schedule(schedule, replace=True)
        finally:
            queue.close()
        function.schedule = schedule
        return function

    return decorate


def start_slot(function: DurableFunction[Any], store: Store, name: str, slot: float, *, task_id: str | None = None) -> tuple[str, bool]:
    """Record the task of schedule ``name``'s ``slot`` (function ``function``) in ``store`` and queue
    it; (task id, whether this call recorded it)."""
    task_id = task_id or slot_task_id(name, slot)
    created = function.with_options(store=store).enqueue(task_id, arguments_for(function.fn, slot))
    return task_id, created


class SchedulePass:
    """What one pass over the schedules did: the tasks it recorded, the slots it skipped, and when
    the next slot of a schedule it serves is due (seconds from now by the database's clock)."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.skipped: int = 0
        self.next_in_s: float | None = None


def start_due_slots(queue: Any, store: Store, functions: Mapping[str, DurableFunction[Any]], states: Iterable[ScheduleState] | None = None) -> SchedulePass:
    """Start every due slot of the stored schedules whose function is in ``functions`` (a
    ``stores.queue.TaskQueue`` for ``store``), then move each schedule past them."""
    done = SchedulePass()
    now = queue.clock()
    for state in queue.schedules() if states is None else states:
        schedule = state.schedule
        function = functions.get(schedule.function)
        if schedule.paused or function is None:
            continue
        next_slot = state.next_slot
        if next_slot <= now:
            slots, following = schedule.due_slots(next_slot, now)
            task_id = ""
            for slot in slots:
                task_id, created = start_slot(function, store, schedule.name, slot)
                if created:
                    done.started.append(task_id)
            if schedule.catchup == "skip":
                skipped = len(schedule.parsed.slots(next_slot - 1e-6, slots[-1] - 1e-6, zone(schedule.timezone)))
                if skipped:
                    done.skipped += skipped
                    log.info("schedule %s: %d missed slots skipped (catchup=skip); started %s", schedule.name, skipped, task_id)
            if queue.advance_schedule(schedule.name, next_slot, following, slots[-1], task_id):
                next_slot = following
            else:  # another worker moved it first: its next slot is what that worker wrote
                next_slot = queue.schedule(schedule.name).next_slot
        wait = next_slot - now
        done.next_in_s = wait if done.next_in_s is None else min(done.next_in_s, wait)
    return done
