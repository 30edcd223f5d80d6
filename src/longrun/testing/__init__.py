"""Test support that users import in their own tests: fixtures, and (as they are added) suites.

- ``FakeClock``: time that moves only when told.
- ``OutboxAdapter``: a fictional local target that records every apply as a line, so duplicates show.
- ``read_outbox``: the outbox's lines, parsed.
"""

from ._fixtures import FakeClock, OutboxAdapter, read_outbox

__all__ = ["FakeClock", "OutboxAdapter", "read_outbox"]
