"""The fixtures users test with: they must count every apply and fence like a real target, and the
in-memory store must keep a real store's rules (its contract run is in ``test_store_contract``)."""

from __future__ import annotations

import unittest

from helpers import support
from longrun import EffectRequest, PermanentError, RunContract, Runner, Status, Step, StorageError, TransientError, UnknownTaskError
from longrun.testing import FakeClock, MemoryStore, OutboxAdapter
from longrun.testing.store_contract import sample_state


def request(epoch: int, step: str = "s", task: str = "t") -> EffectRequest:
    return EffectRequest(task, step, "write", f"{task}/{step}", {"n": 1}, "sha256:d", 1, epoch, 0.0)


class OutboxTests(support.TempDirTest):
    def test_every_apply_is_a_line_so_duplicates_show(self) -> None:
        outbox = OutboxAdapter(self.path("o.jsonl"))
        outbox.apply(request(1))
        outbox.apply(request(1))
        self.assertEqual(outbox.counts()["t/s"], 2)
        self.assertEqual(outbox.observe(request(1)).state.value, "applied")
        self.assertEqual(outbox.observe(request(1, "other")).state.value, "absent")

    def test_an_older_epoch_is_fenced_after_a_newer_one_observed_or_applied(self) -> None:
        outbox = OutboxAdapter(self.path("o.jsonl"))
        outbox.observe(request(3, "a"))
        with self.assertRaises(PermanentError):
            outbox.apply(request(2, "a"))
        self.assertEqual(outbox.counts(), {})
        outbox.apply(request(3, "a"))
        with self.assertRaises(PermanentError):
            outbox.apply(request(2, "b"))
        outbox.apply(request(1, "a", task="other-task"))  # fences are per task
        self.assertEqual(outbox.counts(), {"t/a": 1, "other-task/a": 1})

    def test_scripted_failures(self) -> None:
        outbox = OutboxAdapter(self.path("o.jsonl"), fail_transient=1, deduplicates=True, unknown_observations=1)
        with self.assertRaises(TransientError):
            outbox.apply(request(1))
        outbox.apply(request(1))
        outbox.apply(request(1))
        self.assertEqual(outbox.counts()["t/s"], 1, "a deduplicating target keeps one line")
        self.assertEqual(outbox.calls["t/s"], 3)
        self.assertEqual(outbox.observe(request(1)).state.value, "unknown")
        self.assertEqual(outbox.observe(request(1)).state.value, "applied")


class FakeClockTests(unittest.TestCase):
    def test_time_moves_only_when_told(self) -> None:
        clock = FakeClock(100.0)
        self.assertEqual(clock.now(), 100.0)
        clock.sleep(5)
        clock.advance(1.5)
        self.assertEqual((clock.now(), clock.monotonic(), clock.sleeps), (106.5, 106.5, [5]))

    def test_step_moves_the_wall_clock_alone(self) -> None:
        clock = FakeClock(100.0)
        clock.step(7200)
        self.assertEqual((clock.now(), clock.monotonic()), (7300.0, 100.0))
        clock.step(-10_800)
        clock.advance(2)
        self.assertEqual((clock.now(), clock.monotonic()), (-3498.0, 102.0))
        self.assertIsNone(clock.monotonic_id())
        self.assertEqual(FakeClock(timeline="boot:test").monotonic_id(), "boot:test")


class MemoryStoreTests(support.TempDirTest):
    def runner(self, store: MemoryStore, outbox: OutboxAdapter, clock: FakeClock) -> Runner:
        steps = [Step(f"s{i}", "write", {"n": i}) for i in range(3)]
        return Runner(RunContract("t", "three lines"), steps, store=store, adapters={"write": outbox}, clock=clock)

    def test_a_run_over_it_completes_and_a_second_store_object_sees_what_the_first_committed(self) -> None:
        clock, first = FakeClock(), MemoryStore()
        outbox = OutboxAdapter(self.path("outbox.jsonl"), raise_after_apply={"s1"})  # s1's outcome is unknown: observed
        with self.assertLogs("longrun", "WARNING") as logs:
            self.assertEqual(self.runner(first, outbox, clock).run().status, Status.DONE)
        self.assertIn("apply of t/s1 raised ConnectionError", "\n".join(logs.output))
        self.assertEqual(outbox.counts(), {"t/s0": 1, "t/s1": 1, "t/s2": 1})
        again = MemoryStore(first)
        self.assertEqual(self.runner(again, outbox, clock).run().status, Status.DONE)
        self.assertEqual(outbox.counts(), {"t/s0": 1, "t/s1": 1, "t/s2": 1}, "done is done: nothing repeated")
        self.assertEqual(MemoryStore().list_tasks(), [], "a new store object without ``shared_with`` shares nothing")

    def test_damaged_records_stop_a_run_state_unrecoverable_and_the_damage_is_kept(self) -> None:
        clock, store = FakeClock(), MemoryStore()
        outbox = OutboxAdapter(self.path("outbox.jsonl"))
        self.runner(store, outbox, clock).run()
        store.records("t").state = b'{"format": "longrun.state", "cut sho'
        clock.advance(3600)
        with self.assertLogs("longrun", "WARNING") as logs:
            outcome = self.runner(store, outbox, clock).run()
        self.assertEqual(outcome.status, Status.STATE_UNRECOVERABLE)
        self.assertIn("quarantine", "\n".join(logs.output))
        self.assertEqual([what for what, _, _ in store.records("t").quarantine], ["state"])
        with self.assertRaises(UnknownTaskError):
            store.records("ghost")

    def test_a_failing_operation_is_a_storage_error_caused_by_it_and_refuses_writes_until_a_reload(self) -> None:
        failures: list[str] = []

        def fault(operation: str, task_id: str) -> None:
            if operation in failures:
                raise OSError(28, f"injected: no space for {operation}")

        store = MemoryStore(fault=fault)
        lease = store.acquire_lease("t", "me", 30.0, 1000.0)
        store.load("t", lease=lease)
        state = store.load("t").state
        self.assertIsNone(state)
        failures.append("write-state")
        with self.assertRaises(StorageError) as caught:
            store.commit(lease, sample_state("t"), None)
        self.assertIsInstance(caught.exception.__cause__, OSError)
        failures.clear()
        with self.assertRaises(StorageError):
            store.commit(lease, sample_state("t"), None)  # the write failed: reload first
        store.load("t", lease=lease)
        self.assertEqual(store.commit(lease, sample_state("t"), None), 1)


if __name__ == "__main__":
    unittest.main()
