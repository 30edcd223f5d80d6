"""Events a task publishes: ``run.set_event(key, value)`` records, and how others read them.

Each set is one record in the publishing task's own state (action ``EVENT_ACTION``): its payload
holds the key and the value, its result the set's number among the task's sets (``{"seq": n}``),
so the latest value of a key is the one with the highest number, whatever order the records are
stored in. A set is committed before the function goes on, so a reader sees it at once; replay
finds the record and sets nothing again.

Readers (``fn.get_event``, ``longrun event``, ``status``) read the task's committed state without
its lease (``read_event``, which may wait for a key, reading the state again every
``EVENT_POLL_S``): they see a value once the set is committed, never one that may be rolled back.

Not guaranteed: that a reader sees every value of a key that changes fast (only the latest one
committed is kept as "the" value; the older sets stay in the state's records).
"""

from __future__ import annotations

import math

from .canonical import JSONValue
from .contract import INTERNAL_PREFIX, check_task_id
from .envelope import RunState
from .errors import InvalidInputError
from .ledger import EffectRecord, EffectState
from .messages import check_topic
from .protocols import Clock, Store

__all__ = ["EVENT_ACTION", "EVENT_POLL_S", "event_seq", "events_of", "read_event"]

EVENT_POLL_S = 0.1
"""How often ``read_event`` reads the task's state again while it waits for a key to be set."""

EVENT_ACTION = INTERNAL_PREFIX + "event"
"""The action (and step id prefix) of a ``run.set_event`` record."""


def event_seq(record: EffectRecord) -> int | None:
    """The number of a verified set's record among its task's sets; None for any other record."""
    if record.action != EVENT_ACTION or record.state is not EffectState.VERIFIED or not isinstance(record.result, dict):
        return None
    seq = record.result.get("seq")
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None


def events_of(state: RunState | None) -> dict[str, JSONValue]:
    """Every key the task has set and its latest value, by key."""
    if state is None:
        return {}
    latest: dict[str, tuple[int, JSONValue]] = {}
    for record in state.effects.values():
        seq = event_seq(record)
        payload = record.payload
        if seq is None or not isinstance(payload, dict) or not isinstance(payload.get("key"), str):
            continue
        key = str(payload["key"])
        if key not in latest or latest[key][0] < seq:
            latest[key] = (seq, payload.get("value"))
    return {key: value for key, (_, value) in sorted(latest.items())}


def read_event(store: Store, task_id: str, key: str, *, timeout_s: float | None, clock: Clock) -> tuple[bool, JSONValue]:
    """``(True, value)`` once ``task_id`` has set ``key`` (its latest committed value), reading the
    task's state every ``EVENT_POLL_S`` for at most ``timeout_s`` seconds on ``clock`` (None: read
    once); ``(False, None)`` if it was not set by then. ``UnknownTaskError`` for no such task."""
    check_task_id(task_id)
    check_topic(key, what="event key")
    if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not math.isfinite(timeout_s) or timeout_s < 0):
        raise InvalidInputError(f"timeout_s must be a finite number >= 0 or None, got {timeout_s!r}")
    deadline = clock.now() + timeout_s if timeout_s is not None else None
    while True:
        events = events_of(store.load(task_id).state)
        if key in events:
            return True, events[key]
        now = clock.now()
        if deadline is None or now >= deadline:
            return False, None
        clock.sleep(min(EVENT_POLL_S, deadline - now))
