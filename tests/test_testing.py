"""The fixtures users test with: they must count every apply and fence like a real target."""

from __future__ import annotations

import unittest

from helpers import support
from longrun import EffectRequest, PermanentError, TransientError
from longrun.testing import FakeClock, OutboxAdapter


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


if __name__ == "__main__":
    unittest.main()
