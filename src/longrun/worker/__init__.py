"""A worker fleet: processes that run every runnable task of the durable functions they know.

::

    longrun worker postgresql://... --import myapp.agents --concurrency 8      # on every machine
    myapp.agents.triage.start("triage-2026-11-30", "2026-11-30")               # enqueue from anywhere

``Worker`` claims due tasks from the store's fleet queue (``longrun.stores.queue``: a due-time
index kept current by the database itself) and runs them; the task's lease, fenced by its epoch,
remains what keeps one runner per task. ``LimitedAdapter`` bounds the concurrent applies of an
action across the fleet. See ``_worker`` for what draining does and what is not guaranteed.
"""

from ..stores.queue import Claim, QueueEntry, SlotHold, TaskQueue, WorkerRecord, open_queue
from ._limits import LimitedAdapter, SlotKeeper
from ._worker import Worker, WorkerReport

__all__ = [
    "Claim",
    "LimitedAdapter",
    "QueueEntry",
    "SlotHold",
    "SlotKeeper",
    "TaskQueue",
    "Worker",
    "WorkerRecord",
    "WorkerReport",
    "open_queue",
]
