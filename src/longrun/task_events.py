"""Events a task publishes: ``run.set_event(key, value)`` records, and how others read them.

Each set is one record in the publishing task's own state (action ``EVENT_ACTION``): its payload
holds the key and the value, its result the set's number among the task's sets (``{"seq": n}``),
so the latest value of a key is the one with the highest number, whatever order the records are
stored in. A set is committed before the function goes on, so a reader sees it at once; replay
finds the record and sets nothing again.

Readers (``fn.get_event``, ``longrun event``, ``status``) read the task's committed state without
its lease: they see a value once the set is committed, never one that may be rolled back.

Not guaranteed: that a reader sees every value of a key that changes fast (only the latest one
committed is kept as "the" value; the older sets stay in the state's records).
"""

from __future__ import annotations

from typing import Mapping

from .canonical import JSONValue
from .contract import INTERNAL_PREFIX
from .envelope import RunState
from .ledger import EffectRecord, EffectState

__all__ = ["EVENT_ACTION", "event_seq", "events_of"]

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
    for record in _event_records(state.effects):
        seq = event_seq(record)
        payload = record.payload
        if seq is None or not isinstance(payload, dict) or not isinstance(payload.get("key"), str):
            continue
        key = str(payload["key"])
        if key not in latest or latest[key][0] < seq:
            latest[key] = (seq, payload.get("value"))
    return {key: value for key, (_, value) in sorted(latest.items())}


def _event_records(effects: Mapping[str, EffectRecord]) -> list[EffectRecord]:
    return [record for step_id, record in effects.items() if step_id.startswith(EVENT_ACTION)]
