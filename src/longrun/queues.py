"""Named queues: a fleet-wide bound on how many tasks of a queue run at once, and how often one starts.

``Queue("api", concurrency=4, per_worker=2, rate=(100, 60), priority=True)`` names a queue of the
fleet (``fn.enqueue(..., queue="api")`` puts a task in it) and its limits, each optional:

- ``concurrency``: at most this many of its tasks claimed (being run) at once across the fleet;
- ``per_worker``: at most this many at once in one worker;
- ``rate=(N, S)``: at most N of its tasks started (claimed) in any S seconds across the fleet;
- ``priority``: whether its tasks' priorities order them (else first due, first run; a priority
  other than 0 is then refused at enqueue).

A worker admits a task of a named queue inside the claim's transaction, holding the queue's row
(PostgreSQL ``FOR UPDATE``; SQLite's write lock), so two workers never both take the last place.
A start counts toward the rate when claimed, also if the run then stops at once. A claim of a worker
that died counts toward ``concurrency`` until it lapses (``claim_ttl_s``). ``--limit ACTION=K``
still bounds an action's applies, whatever queue the task is in.

A ``dedup_id`` given at enqueue is held by its task, per queue, while the task has not ended: a
second enqueue with it under another task id is refused with ``DuplicateTaskError`` naming the
holder; once the holder ended (done, failed, cancelled, ...) the id is free again.

Stored form: ``Queue.to_json`` in the fleet tables (``stores.queue``); a damaged one is
``CorruptStateError``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .canonical import JSONValue
from .errors import CorruptStateError, InvalidInputError, LongrunError
from .names import SAFE_NAME

__all__ = ["MAX_DEDUP_CHARS", "Queue", "check_dedup_id", "check_queue_name"]

MAX_DEDUP_CHARS = 256


def check_queue_name(name: object) -> str:
    if not isinstance(name, str) or not SAFE_NAME.fullmatch(name) or len(name) > 64:
        raise InvalidInputError(f"queue name {name!r} is not valid: use 1-64 of [A-Za-z0-9._-], starting with a letter or digit")
    return name


def check_dedup_id(dedup_id: object) -> str:
    if not isinstance(dedup_id, str) or not 1 <= len(dedup_id) <= MAX_DEDUP_CHARS or not dedup_id.isprintable():
        raise InvalidInputError(f"a dedup_id is 1-{MAX_DEDUP_CHARS} printable characters, got {dedup_id!r}")
    return dedup_id


def _positive(value: object, what: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise InvalidInputError(f"a queue's {what} is an integer >= 1 or None, got {value!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class Queue:
    """A named queue and its limits (see the module docstring); validated on construction."""

    name: str
    concurrency: int | None = None
    per_worker: int | None = None
    rate: tuple[int, float] | None = None
    """(N, S): at most N starts in any S seconds across the fleet."""
    priority: bool = True

    def __post_init__(self) -> None:
        check_queue_name(self.name)
        _positive(self.concurrency, "concurrency")
        _positive(self.per_worker, "per_worker")
        if self.rate is not None:
            if not isinstance(self.rate, tuple) or len(self.rate) != 2:
                raise InvalidInputError(f"a queue's rate is (N, SECONDS), got {self.rate!r}")
            count, period = self.rate
            _positive(count, "rate count")
            if isinstance(period, bool) or not isinstance(period, (int, float)) or not 0 < period <= 86400 * 366:
                raise InvalidInputError(f"a queue's rate period is a number of seconds in (0, one year], got {period!r}")
            object.__setattr__(self, "rate", (count, float(period)))
        if not isinstance(self.priority, bool):
            raise InvalidInputError(f"a queue's priority is True or False, got {self.priority!r}")

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "schema_version": 1, "name": self.name, "concurrency": self.concurrency, "per_worker": self.per_worker,
            "rate": list(self.rate) if self.rate is not None else None, "priority": self.priority,
        }  # fmt: skip

    @classmethod
    def from_json(cls, document: object) -> "Queue":
        if not isinstance(document, dict) or document.get("schema_version") != 1:
            raise CorruptStateError(f"a stored queue is a JSON object of schema_version 1, got {document!r:.200}")
        expected = {"schema_version", "name", "concurrency", "per_worker", "rate", "priority"}
        if set(document) != expected:
            raise CorruptStateError(f"stored queue {document.get('name')!r}: fields {sorted(document)}, expected {sorted(expected)}")
        stored = document["rate"]
        rate: Any = (stored[0], stored[1]) if isinstance(stored, list) and len(stored) == 2 else stored  # checked by __post_init__
        try:
            return cls(document["name"], document["concurrency"], document["per_worker"], rate, document["priority"])
        except LongrunError as exc:
            raise CorruptStateError(f"stored queue {document.get('name')!r} is not valid: {exc}") from None
