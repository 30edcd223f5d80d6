"""Stores: where a task's lease, state and control records live. See ``base`` for the rules they share.

- ``JsonFileStore``: a directory per task, for one machine.
- ``SqliteStore``: many tasks in one SQLite file, for the processes of one machine.
- ``PostgresStore``: a PostgreSQL database, for runners on many machines (lease expiry by the
  server's clock). It takes a connection factory and imports no driver itself.
- ``open_store(spec)``: one of them from a string (``sqlite:PATH``, ``postgresql://...``, a directory).
- ``FileIO``: the one I/O layer every file operation of the file stores goes through (``io=``), the
  seam ``longrun.testing.FaultyIO`` fails calls at; ``TEMP_MARK`` marks the temporary files it writes.
"""

from ._fileio import TEMP_MARK, FileIO
from ._spec import open_store
from .base import BaseStore
from .jsonfile import JsonFileStore
from .postgres import PostgresStore
from .sqlite import SqliteStore

__all__ = ["TEMP_MARK", "BaseStore", "FileIO", "JsonFileStore", "PostgresStore", "SqliteStore", "open_store"]
