"""The rules the engine composes, tested directly: cancellation judgement, receipt checking, the
per-effect attempt limit and lease freshness (``verify`` reuses the first)."""

from __future__ import annotations

import math
import unittest

import helpers  # noqa: F401  (puts src on sys.path)
from longrun import Cancellation, Limits, Receipt
from longrun.cancellation import judge_cancellation
from longrun.canonical import MAX_VALUE_BYTES
from longrun.control import ControlRecord, RefusedRecord
from longrun.lease import Lease, LeaseKeeper
from longrun.ledger import OMITTED, check_receipt


class CancellationJudgementTests(unittest.TestCase):
    def record(self, task_id: str = "t") -> ControlRecord:
        body = Cancellation(task_id=task_id, requested_by="ops", reason="stop", requested_at=1.0).to_json()
        return ControlRecord(name="cancel.json", body=body, digest="sha256:x")

    def test_each_kind_of_record_gets_its_verdict(self) -> None:
        self.assertEqual(judge_cancellation(None, "t").verdict, "none")
        cancelled = judge_cancellation(self.record(), "t")
        self.assertEqual((cancelled.verdict, cancelled.record and cancelled.record.requested_by), ("cancelled", "ops"))
        refused = judge_cancellation(RefusedRecord(name="cancel.json", error="unsigned"), "t")
        self.assertEqual(refused.verdict, "refused")
        self.assertIn("unsigned", refused.problem or "")
        for raw, why in (
            (ControlRecord(name="cancel.json", error="not JSON"), "damaged"),
            (ControlRecord(name="cancel.json", body={"task_id": "t"}), "malformed"),
            (self.record("another"), "names task 'another'"),
        ):
            with self.subTest(why=why):
                judged = judge_cancellation(raw, "t")
                self.assertEqual(judged.verdict, "damaged")
                self.assertIn(why, judged.problem or "")


class ReceiptRuleTests(unittest.TestCase):
    def test_a_valid_receipt_is_charged_and_kept(self) -> None:
        checked = check_receipt(Receipt(result={"id": 1}, cost=2.5, evidence="sent"), key="t/a", step_id="a", already_spent=1.0)
        self.assertEqual((checked.cost, checked.result, checked.evidence, checked.problems), (2.5, {"id": 1}, "sent", ()))

    def test_what_is_not_a_receipt_or_would_make_the_total_infinite_is_recorded_not_charged(self) -> None:
        not_a_receipt = check_receipt("ok", key="t/a", step_id="a", already_spent=0.0)
        self.assertIn("not a Receipt", not_a_receipt.evidence)
        overflowing = check_receipt(Receipt(cost=1e308), key="t/a", step_id="a", already_spent=1e308)
        self.assertEqual(overflowing.cost, 0.0)
        self.assertTrue(math.isfinite(overflowing.cost))
        self.assertIn("invalid cost", overflowing.problems[0])

    def test_a_result_over_the_value_limit_is_kept_by_size_and_digest(self) -> None:
        big = {"blob": "x" * (MAX_VALUE_BYTES + 1)}
        checked = check_receipt(Receipt(result=big), key="t/a", step_id="a", already_spent=0.0)
        assert isinstance(checked.result, dict)
        self.assertIn(OMITTED, checked.result)
        self.assertEqual(len(checked.problems), 1)


class AttemptLimitTests(unittest.TestCase):
    def test_the_last_allowed_attempt_is_allowed_and_the_next_is_not(self) -> None:
        limits = Limits(max_attempts=2)
        self.assertIsNone(limits.attempts_exhausted("t/a", 1, None))
        reason = limits.attempts_exhausted("t/a", 2, "transient: 503")
        self.assertIsNotNone(reason)
        self.assertIn("503", reason or "")


class LeaseKeeperTests(unittest.TestCase):
    def test_a_lease_is_stale_after_half_its_ttl_on_the_monotonic_clock_and_fresh_once_replaced(self) -> None:
        now = [100.0]
        lease = Lease(task_id="t", owner="me", epoch=1, acquired_at=0.0, expires_at=30.0)
        keeper = LeaseKeeper(lease, lambda current: current, interval_s=10.0, monotonic=lambda: now[0])
        self.assertFalse(keeper.stale(30.0))
        now[0] = 115.5
        self.assertTrue(keeper.stale(30.0))
        keeper.replace(lease)
        self.assertFalse(keeper.stale(30.0))

    def test_a_failed_renewal_is_kept_and_stops_the_keeper(self) -> None:
        lease = Lease(task_id="t", owner="me", epoch=1, acquired_at=0.0, expires_at=30.0)

        def renew(current: Lease) -> Lease:
            raise OSError("disk gone")

        keeper = LeaseKeeper(lease, renew, interval_s=0.01)
        with self.assertLogs("longrun", level="WARNING") as logs, keeper:
            for _ in range(500):
                if keeper.failure is not None:
                    break
                threading_event_wait(0.01)
        self.assertIsInstance(keeper.failure, OSError)
        self.assertIn("disk gone", "\n".join(logs.output))
        self.assertEqual(keeper.lease, lease, "the last good lease is kept")


def threading_event_wait(seconds: float) -> None:
    import threading

    threading.Event().wait(seconds)


if __name__ == "__main__":
    unittest.main()


class BackoffPrecisionTests(unittest.TestCase):
    def test_a_backoff_waited_out_under_a_fake_clock_near_today_ends(self) -> None:
        """A remainder below what a float near 1.7e9 can add used to loop for ever (sleep moved nothing)."""
        import tempfile
        import threading

        from longrun import JsonFileStore, RunContract, Runner, Status, Step
        from longrun.testing import FakeClock, OutboxAdapter

        with tempfile.TemporaryDirectory() as root:
            outbox = OutboxAdapter(f"{root}/outbox.jsonl", fail_transient=1)
            runner = Runner(
                RunContract("t", "retry once"), [Step("a", "send", {})], store=JsonFileStore(f"{root}/store", create=True),
                adapters={"send": outbox}, clock=FakeClock(), limits=Limits(max_block_s=3600),
            )  # fmt: skip  (the default retry policy's jitter is what leaves a remainder of about 2e-8 s)
            outcomes: list[Status] = []
            worker = threading.Thread(target=lambda: outcomes.append(runner.run().status), daemon=True)
            worker.start()
            worker.join(30)
            self.assertFalse(worker.is_alive(), "the run must not spin on a backoff that cannot end")
            self.assertEqual(outcomes, [Status.DONE])
            self.assertEqual(outbox.counts(), {"t/a": 1})
