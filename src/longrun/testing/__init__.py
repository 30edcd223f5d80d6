"""Test support that users import in their own tests: fixtures, and (as they are added) suites.

- ``FakeClock``: time that moves only when told.
- ``OutboxAdapter``: a fictional local target that records every apply as a line, so duplicates show.
- ``read_outbox``: the outbox's lines, parsed.
- ``copy_keeping_links``: copy a task directory keeping hard links (the JSON store's backup is one).
"""

from ._fixtures import FakeClock, OutboxAdapter, copy_keeping_links, read_outbox

__all__ = ["FakeClock", "OutboxAdapter", "copy_keeping_links", "read_outbox"]
