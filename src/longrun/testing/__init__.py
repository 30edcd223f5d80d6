"""What users import to test their own code against longrun, without real delays, targets or disks.

- ``FakeClock``: time that moves only when told.
- ``OutboxAdapter``: a fictional local target that records every apply as a line, so duplicates show.
- ``read_outbox``: the outbox's lines, parsed.
- ``copy_keeping_links``: copy a task directory keeping hard links (the JSON store's backup is one).
- ``FaultyIO``: file I/O that fails the N-th call with a chosen errno (``JsonFileStore(..., io=...)``).
- ``MemoryStore``: a store in memory that keeps every store's rules, for fast unit tests.
- ``longrun.testing.store_contract.StoreContract``: the suite every ``Store`` must pass, for a
  store of your own (imported from its module, so that ``unittest`` is loaded only by tests).

The project's own fault-injection suite is ``longrun.testing.faults``; it is not an API.
"""

from ._faulty_io import FaultyIO
from ._fixtures import FakeClock, OutboxAdapter, copy_keeping_links, read_outbox
from ._memory import MemoryStore, TaskRecords

__all__ = ["FakeClock", "FaultyIO", "MemoryStore", "OutboxAdapter", "TaskRecords", "copy_keeping_links", "read_outbox"]
