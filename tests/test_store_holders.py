"""Holder locks (``longrun.stores._holders``): on one machine a dead holder's lease is taken over at
once, a paused one is waited for, and a holder elsewhere is judged by expiry alone. Real processes,
SIGKILL and SIGSTOP; the JSON-file and SQLite stores."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import unittest

from helpers import support
from longrun import CorruptStateError, FencedError, JsonFileStore, LeaseHeldError, SqliteStore
from longrun.canonical import canonical_bytes, sha256_hex
from longrun.lease import boot_clock_id
from longrun.stores import _holders

HOLD = """
import sys, time
from longrun import JsonFileStore, SqliteStore
store = SqliteStore(sys.argv[2], create=True) if sys.argv[1] == "sqlite" else JsonFileStore(sys.argv[2], create=True)
lease = store.acquire_lease(sys.argv[3], "build-host", 3600.0, time.time())
print(lease.epoch, flush=True)
time.sleep(600)
"""

TTL = 3600.0


@unittest.skipIf(boot_clock_id() is None, "no boot id on this platform: holders are judged by expiry alone")
class HolderLockTests(support.TempDirTest):
    kind = "json"

    def setUp(self) -> None:
        super().setUp()
        self.location = self.path("store.db" if self.kind == "sqlite" else "store")

    def open(self):
        store = SqliteStore(self.location, create=True) if self.kind == "sqlite" else JsonFileStore(self.location, create=True)
        if self.kind == "sqlite":
            self.addCleanup(store.close)
        return store

    def holder(self, task: str = "t") -> subprocess.Popen[str]:
        """A process that holds the lease of ``task`` for an hour (killed at cleanup)."""
        child = subprocess.Popen(
            [sys.executable, "-c", HOLD, self.kind, self.location, task], env=support.child_env(), stdout=subprocess.PIPE, text=True
        )

        def reap() -> None:
            if child.poll() is None:
                os.kill(child.pid, signal.SIGCONT)
                child.kill()
                child.communicate()

        self.addCleanup(reap)
        self.assertTrue(child.stdout.readline().strip().isdigit())
        return child

    def rewrite_lease(self, task: str = "t", **changes: object) -> None:
        """Change fields of the stored lease record, as another machine or an older longrun wrote it."""
        if self.kind == "sqlite":
            import sqlite3

            connection = sqlite3.connect(self.location, isolation_level=None)
            try:
                for column, value in changes.items():
                    connection.execute(f"UPDATE longrun_leases SET {column} = ? WHERE task_id = ?", (value, task))
            finally:
                connection.close()
            return
        path = os.path.join(self.location, task, "lease.json")
        with open(path, "rb") as handle:
            document = json.loads(handle.read())
        document.pop("checksum")
        document.update(changes)
        document = {key: value for key, value in document.items() if value is not None}
        with open(path, "wb") as handle:
            handle.write(canonical_bytes({**document, "checksum": "sha256:" + sha256_hex(canonical_bytes(document))}))

    def test_a_killed_holder_is_taken_over_at_once_with_the_next_epoch(self) -> None:
        child = self.holder()
        with self.assertRaises(LeaseHeldError):
            self.open().acquire_lease("t", "build-host", TTL, time.time())  # alive: the same owner name opens nothing
        child.kill()
        child.communicate()
        with self.assertLogs("longrun", "WARNING") as logged:
            taken = self.open().acquire_lease("t", "build-host", TTL, time.time())
        self.assertEqual(taken.epoch, 2)
        self.assertIn("gone from this machine", "\n".join(logged.output))
        self.assertIsNotNone(taken.holder_lock, "the new holder holds the lock in turn")

    def test_a_paused_holder_is_waited_for(self) -> None:
        child = self.holder()
        os.kill(child.pid, signal.SIGSTOP)
        try:
            for _ in range(2):
                with self.assertRaises(LeaseHeldError):
                    self.open().acquire_lease("t", "contender", TTL, time.time())
        finally:
            os.kill(child.pid, signal.SIGCONT)
        self.assertEqual(self.open().read_lease("t").epoch, 1)
        taken = self.open().acquire_lease("t", "contender", TTL, time.time() + TTL + 1)  # at its expiry, as always
        self.assertEqual(taken.epoch, 2)
        self.assertIsNone(taken.holder_lock, "the paused holder still has the lock: the new one cannot prove it lives")

    def test_a_holder_on_another_boot_or_without_a_lock_is_judged_by_expiry_alone(self) -> None:
        for task, changes in (("elsewhere", {"holder_lock": "boot:another-machine/1/2"}), ("unlocked", {"holder_lock": None})):
            with self.subTest(changes=changes):
                child = self.holder(task)
                child.kill()
                child.communicate()
                self.rewrite_lease(task, **changes)  # the lock it names is not one this machine can judge
                with self.assertRaises(LeaseHeldError):
                    self.open().acquire_lease(task, "contender", TTL, time.time())
                self.assertEqual(self.open().acquire_lease(task, "contender", TTL, time.time() + TTL + 1).epoch, 2)

    def test_another_store_object_of_the_holding_process_sees_it_alive(self) -> None:
        holding = self.open()
        lease = holding.acquire_lease("t", "me", TTL, time.time())
        for _ in range(2):
            with self.assertRaises(LeaseHeldError):
                self.open().acquire_lease("t", "me", TTL, time.time())
        holding.release_lease(lease, time.time())
        self.assertEqual(self.open().acquire_lease("t", "me", TTL, time.time()).epoch, lease.epoch + 1)

    def test_the_lock_is_let_go_with_the_lease_and_only_for_its_own_grant(self) -> None:
        store = self.open()
        locks = store._holders
        first = store.acquire_lease("t", "me", TTL, time.time())
        self.assertTrue(locks.someone_holds("t"))
        second = store.acquire_lease("t", "me", TTL, time.time(), token=first.token)  # re-entered: the lock now backs it
        with self.assertRaises(FencedError):
            store.renew_lease(first, TTL, time.time())
        with self.assertRaises(FencedError):
            store.renew_lease(dataclasses.replace(second, token="f" * 32), TTL, time.time())
        self.assertTrue(locks.someone_holds("t"), "a stale or forged lease does not make the holder look dead")
        store.release_lease(second, time.time())
        self.assertFalse(locks.someone_holds("t"))
        third = store.acquire_lease("t", "me", TTL, time.time())
        self.rewrite_lease(epoch=-1)  # damaged under its holder
        with self.assertRaises(CorruptStateError):
            store.renew_lease(third, TTL, time.time())
        self.assertFalse(locks.someone_holds("t"), "a holder that cannot prove its lease lets go")

    def test_repair_is_refused_while_a_holder_lives_and_done_once_it_died(self) -> None:
        child = self.holder()
        self.rewrite_lease(epoch=-1)
        with self.assertRaises(LeaseHeldError):
            self.open().repair_lease("t", time.time())
        child.kill()
        child.communicate()
        with self.assertLogs("longrun", "WARNING"):  # the move is logged
            repaired = self.open().repair_lease("t", time.time())
        self.assertEqual(repaired.next_epoch, self.open().acquire_lease("t", "after", TTL, time.time()).epoch)

    def test_a_lock_on_a_deleted_task_is_let_go(self) -> None:
        other = self.path("elsewhere")
        os.mkdir(other)
        gone = JsonFileStore(other, create=True)
        gone.acquire_lease("t", "me", TTL, time.time())
        held = len(_holders._HELD)
        shutil.rmtree(other)
        self.open().acquire_lease("u", "me", TTL, time.time())
        self.assertEqual(len(_holders._HELD), held, "the deleted task's lock was closed, the new one opened")


class SqliteHolderLockTests(HolderLockTests):
    kind = "sqlite"


if __name__ == "__main__":
    unittest.main()
