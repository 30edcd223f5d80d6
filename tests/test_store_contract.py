"""The store contract (``longrun.testing.store_contract``), run by every store longrun ships.

JSON-file, SQLite and the in-memory store (``longrun.testing.MemoryStore``) always run; PostgreSQL
runs once per installed driver when ``LONGRUN_TEST_POSTGRES_DSN`` is set (and fails rather than
skips under ``LONGRUN_REQUIRE_POSTGRES=1``).
The hooks below are the only store-specific code: how to damage, plant or fail what a store keeps.
The JSON-file hooks avoid naming state files, so they survive a change of that store's layout.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sqlite3
import time
import unittest
from typing import Any, Iterator

from helpers import pg_support
from helpers import support
from longrun import JsonFileStore, PostgresStore, SqliteStore
from longrun.lease import Lease
from longrun.stores._fileio import FileIO
from longrun.testing import FaultyIO, MemoryStore
from longrun.testing.store_contract import StoreContract


def _injected(n: int) -> OSError:
    return OSError(errno.EIO, f"injected failure of I/O operation {n}")


# -- JSON-file store ------------------------------------------------------------------------------


class JsonFileStoreContract(StoreContract, support.TempDirTest):
    def make_store(self) -> JsonFileStore:
        return JsonFileStore(self.path("root"), create=True)

    def _task_dir(self, task_id: str) -> str:
        return os.path.join(self.path("root"), task_id)

    def _state_files(self, task_id: str) -> list[str]:
        """Regular files directly in the task directory that are not the lease or its lock."""
        directory = self._task_dir(task_id)
        names = []
        for name in sorted(os.listdir(directory)):
            if name.startswith(("lease", "lock")) or not os.path.isfile(os.path.join(directory, name)):
                continue
            names.append(name)
        if not names:
            self.skipTest(f"no state files found in {directory}: the layout changed")
        return names

    def damage_state(self, store: Any, task_id: str) -> None:
        for name in self._state_files(task_id):
            with open(os.path.join(self._task_dir(task_id), name), "wb") as handle:
                handle.write(b"garbage, not a state")

    def plant_foreign_state(self, store: Any, task_id: str, source_task_id: str) -> None:
        for name in self._state_files(source_task_id):
            with open(os.path.join(self._task_dir(source_task_id), name), "rb") as source:
                data = source.read()
            with open(os.path.join(self._task_dir(task_id), name), "wb") as target:
                target.write(data)

    def plant_future_schema(self, store: Any, task_id: str) -> None:
        changed = 0
        for name in self._state_files(task_id):
            path = os.path.join(self._task_dir(task_id), name)
            with open(path, "rb") as handle:
                lines = handle.read().splitlines()
            out = []
            for line in lines:
                try:
                    document = json.loads(line)
                except ValueError:
                    out.append(line)
                    continue
                if isinstance(document, dict) and "schema_version" in document:
                    document["schema_version"] = 999
                    changed += 1
                out.append(json.dumps(document, sort_keys=True, separators=(",", ":")).encode())
            with open(path, "wb") as handle:
                handle.write(b"\n".join(out) + b"\n")
        if not changed:
            self.skipTest("no schema_version found in the state files: the layout changed")

    def plant_control_text(self, store: Any, task_id: str, kind: str, text: bytes) -> None:
        control = os.path.join(self._task_dir(task_id), "control")
        target = os.path.join(control, "cancel.json") if kind == "cancellation" else os.path.join(control, "approvals", "planted.json")
        if not os.path.isdir(os.path.dirname(target)):
            self.skipTest("the control directory layout changed")
        with open(target, "wb") as handle:
            handle.write(text)

    def damage_lease(self, store: Any, task_id: str) -> None:
        path = os.path.join(self._task_dir(task_id), "lease.json")
        if not os.path.isfile(path):
            self.skipTest("the JSON-file store keeps its lease record elsewhere now")
        with open(path, "r+b") as handle:
            handle.truncate(os.path.getsize(path) // 2)

    def damage_messages(self, store: Any, task_id: str) -> None:
        directory = os.path.join(self._task_dir(task_id), "messages")
        if not os.path.isdir(directory):
            self.skipTest("the JSON-file store keeps its messages elsewhere now")
        for name in os.listdir(directory):
            with open(os.path.join(directory, name), "r+b") as handle:
                handle.seek(20)
                byte = handle.read(1)
                handle.seek(20)
                handle.write(bytes([byte[0] ^ 1]))

    def damage_blobs(self, store: Any, task_id: str) -> int:
        directory = os.path.join(self._task_dir(task_id), "blobs")
        if not os.path.isdir(directory):
            self.skipTest("the JSON-file store keeps its blobs elsewhere now")
        names = os.listdir(directory)
        for name in names:
            with open(os.path.join(directory, name), "r+b") as handle:
                handle.seek(100)
                byte = handle.read(1)
                handle.seek(100)
                handle.write(bytes([byte[0] ^ 1]))
        return len(names)

    def state_bytes(self, store: Any, task_id: str) -> int:
        """The snapshots' and journals' content (a journal's zero padding left out)."""
        total = 0
        for name in self._state_files(task_id):
            with open(os.path.join(self._task_dir(task_id), name), "rb") as handle:
                total += len(handle.read().rstrip(b"\0"))
        return total

    @contextlib.contextmanager
    def fail_nth_operation(self, store: Any, n: int) -> Iterator[None]:
        if not isinstance(getattr(store, "io", None), FileIO):
            self.skipTest("the JSON-file store no longer routes its I/O through store.io")
        inner = store.io
        store.io = FaultyIO(n)  # the n-th operation that reads or changes the disk fails with EIO
        try:
            yield
        finally:
            store.io = inner


# -- the in-memory store (longrun.testing.MemoryStore) ---------------------------------------------


class MemoryStoreContract(StoreContract, unittest.TestCase):
    """The hooks reach the task's raw records (``MemoryStore.records``) and the store's ``fault`` seam."""

    def setUp(self) -> None:
        super().setUp()
        self.failing: list[int] = []
        """While a test fails the n-th operation: [n, operations seen so far]."""
        self.first = MemoryStore(fault=self.count)

    def count(self, operation: str, task_id: str) -> None:
        if self.failing:
            self.failing[1] += 1
            if self.failing[1] == self.failing[0]:
                raise _injected(self.failing[0])

    def make_store(self) -> MemoryStore:
        return MemoryStore(self.first, fault=self.count)

    def damage_state(self, store: Any, task_id: str) -> None:
        store.records(task_id).state = b"garbage, not a state"

    def plant_foreign_state(self, store: Any, task_id: str, source_task_id: str) -> None:
        store.records(task_id).state = store.records(source_task_id).state

    def plant_future_schema(self, store: Any, task_id: str) -> None:
        records = store.records(task_id)
        document = json.loads(records.state)
        document["schema_version"] = 999
        records.state = json.dumps(document).encode()

    def plant_control_text(self, store: Any, task_id: str, kind: str, text: bytes) -> None:
        if kind == "cancellation":
            store.records(task_id).cancellation = text
        else:
            store.records(task_id).approvals["planted"] = text

    def damage_blobs(self, store: Any, task_id: str) -> int:
        blobs = store.records(task_id).blobs
        for digest, data in blobs.items():
            blobs[digest] = data[:100] + bytes([data[100] ^ 1]) + data[101:]
        return len(blobs)

    def state_bytes(self, store: Any, task_id: str) -> int:
        return len(store.records(task_id).state or b"")

    def damage_messages(self, store: Any, task_id: str) -> None:
        messages = store.records(task_id).messages
        messages[:] = [data[:20] + bytes([data[20] ^ 1]) + data[21:] for data in messages]

    def damage_lease(self, store: Any, task_id: str) -> None:
        records = store.records(task_id)
        records.lease = records.lease[: len(records.lease) // 2]

    @contextlib.contextmanager
    def fail_nth_operation(self, store: Any, n: int) -> Iterator[None]:
        self.failing[:] = [n, 0]
        try:
            yield
        finally:
            self.failing.clear()


# -- the SQL stores -------------------------------------------------------------------------------


class _SqlHooks:
    """The hooks for both SQL stores, over ``execute(statement, params)`` on a side connection."""

    placeholder = "?"

    def execute(self, statement: str, params: tuple = ()) -> list[tuple]:
        raise NotImplementedError

    def sql(self, statement: str, params: tuple = ()) -> list[tuple]:
        return self.execute(statement.replace("?", self.placeholder), params)

    def damage_state(self, store: Any, task_id: str) -> None:
        self.sql("UPDATE longrun_states SET header = ? WHERE task_id = ?", ("garbage, not a state", task_id))

    def plant_foreign_state(self, store: Any, task_id: str, source_task_id: str) -> None:
        self.sql("DELETE FROM longrun_effects WHERE task_id = ?", (task_id,))
        self.sql("DELETE FROM longrun_states WHERE task_id = ?", (task_id,))
        self.sql(
            "INSERT INTO longrun_states (task_id, revision, epoch, plan_digest, status, next_action, effect_count, header, "
            "checksum, updated_at) SELECT ?, revision, epoch, plan_digest, status, next_action, effect_count, header, "
            "checksum, updated_at FROM longrun_states WHERE task_id = ?",
            (task_id, source_task_id),
        )
        self.sql(
            "INSERT INTO longrun_effects (task_id, step_id, position, revision, record, checksum) "
            "SELECT ?, step_id, position, revision, record, checksum FROM longrun_effects WHERE task_id = ?",
            (task_id, source_task_id),
        )

    def damage_lease(self, store: Any, task_id: str) -> None:
        self.sql("UPDATE longrun_leases SET epoch = -1 WHERE task_id = ?", (task_id,))

    def damage_blobs(self, store: Any, task_id: str) -> int:
        rows = self.sql("SELECT digest, data FROM longrun_blobs WHERE task_id = ?", (task_id,))
        for digest, data in rows:
            data = bytes(data)
            damaged = data[:100] + bytes([data[100] ^ 1]) + data[101:]
            self.sql("UPDATE longrun_blobs SET data = ? WHERE task_id = ? AND digest = ?", (damaged, task_id, digest))
        return len(rows)

    def damage_messages(self, store: Any, task_id: str) -> None:
        self.sql("UPDATE longrun_messages SET body = REPLACE(body, 'sha256:', 'sha256:0') WHERE task_id = ?", (task_id,))

    def state_bytes(self, store: Any, task_id: str) -> int:
        rows = self.sql("SELECT header FROM longrun_states WHERE task_id = ?", (task_id,))
        rows += self.sql("SELECT record FROM longrun_effects WHERE task_id = ?", (task_id,))
        return sum(len(row[0]) for row in rows)

    def plant_future_schema(self, store: Any, task_id: str) -> None:
        self.sql("INSERT INTO longrun_schema (version, applied_at, description) VALUES (999, 0, 'from the future')")

    def plant_control_text(self, store: Any, task_id: str, kind: str, text: bytes) -> None:
        if kind == "cancellation":
            self.sql("INSERT INTO longrun_cancellations (task_id, body, written_at) VALUES (?, ?, 0)", (task_id, text.decode()))
        else:
            self.sql(
                "INSERT INTO longrun_approvals (task_id, approval_id, body, written_at) VALUES (?, 'planted', ?, 0)",
                (task_id, text.decode()),
            )

    @contextlib.contextmanager
    def fail_nth_operation(self, store: Any, n: int) -> Iterator[None]:
        """Fail the store's ``n``-th SQL statement or COMMIT (patched at the one place SQL runs)."""
        count = 0
        real_run, real_finish = store._db.run, store._finish

        def tick() -> None:
            nonlocal count
            count += 1
            if count == n:
                raise _injected(n)

        def run(statement: str, params: tuple = ()) -> Any:
            tick()
            return real_run(statement, params)

        def finish(*, commit: bool) -> None:
            if commit:
                tick()
            real_finish(commit=commit)

        store._db.run, store._finish = run, finish
        try:
            yield
        finally:
            del store._db.run, store._finish


class SqliteStoreContract(_SqlHooks, StoreContract, support.TempDirTest):
    def make_store(self) -> SqliteStore:
        return SqliteStore(self.path("longrun.db"), create=True)

    def execute(self, statement: str, params: tuple = ()) -> list[tuple]:
        connection = sqlite3.connect(self.path("longrun.db"), isolation_level=None, timeout=30)
        try:
            return list(connection.execute(statement, params).fetchall())
        finally:
            connection.close()


class _PostgresContract(pg_support.SchemaPerTest, _SqlHooks, StoreContract):
    driver = ""
    placeholder = "%s"

    def make_store(self) -> PostgresStore:
        return PostgresStore(self.schema.factory())

    def execute(self, statement: str, params: tuple = ()) -> list[tuple]:
        return self.schema.execute(statement, params)

    def expire(self, store: Any, lease: Lease) -> float:
        # Expiry is judged by the server's clock, so the lease is moved into the server's past.
        self.sql(
            "UPDATE longrun_leases SET expires_at = CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION) - 1 "
            "WHERE task_id = ?",
            (lease.task_id,),
        )
        return time.time()


class PostgresPsycopgContract(_PostgresContract, unittest.TestCase):
    driver = "psycopg"


class PostgresPg8000Contract(_PostgresContract, unittest.TestCase):
    driver = "pg8000"


if __name__ == "__main__":
    unittest.main()
