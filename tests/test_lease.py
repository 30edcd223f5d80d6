"""The lease record and the lease keeper, directly: when a lease is over, on which clock, and what a
keeper renews (the store's use of them is in ``test_store_contract`` and ``test_store_holders``)."""

from __future__ import annotations

import dataclasses
import threading
import unittest

import helpers  # noqa: F401  (puts src on sys.path)
from longrun import CorruptStateError, InvalidInputError
from longrun.lease import RELEASED, Lease, LeaseKeeper, LeaseRepair, MonotonicReading

BOOT = "boot:this"


def lease(**changes: object) -> Lease:
    base = Lease(task_id="t", owner="me", epoch=3, acquired_at=1000.0, expires_at=1030.0)
    return dataclasses.replace(base, **changes)


class ExpiryTests(unittest.TestCase):
    def test_without_a_shared_timeline_the_wall_clock_decides(self) -> None:
        live = lease(monotonic_clock=BOOT, monotonic_expires_at=50.0)
        for reading in (None, MonotonicReading("fake:other", 10.0)):
            with self.subTest(reading=reading):
                self.assertEqual(live.remaining(1010.0, reading), 20.0)
                self.assertFalse(live.expired(1029.9, reading))
                self.assertTrue(live.expired(1030.0, reading), "over at its expiry, not after")

    def test_on_the_holder_s_timeline_its_reading_decides_whatever_the_wall_clock_says(self) -> None:
        live = lease(monotonic_clock=BOOT, monotonic_expires_at=50.0)
        for wall in (0.0, 1010.0, 1030.0 + 3600):
            with self.subTest(wall=wall):
                self.assertEqual(live.remaining(wall, MonotonicReading(BOOT, 40.0)), 10.0)
                self.assertFalse(live.expired(wall, MonotonicReading(BOOT, 49.9)))
                self.assertTrue(live.expired(wall, MonotonicReading(BOOT, 50.0)))

    def test_a_lease_granted_during_another_boot_of_this_machine_is_over(self) -> None:
        live = lease(monotonic_clock=BOOT, monotonic_expires_at=1e9)
        self.assertEqual(live.remaining(1010.0, MonotonicReading("boot:next", 1.0)), 0.0)
        self.assertTrue(live.expired(1010.0, MonotonicReading("boot:next", 1.0)))

    def test_a_released_lease_is_over_on_every_clock_even_one_stepped_back(self) -> None:
        released = lease(expires_at=RELEASED, monotonic_clock=BOOT, monotonic_expires_at=1e9)
        self.assertTrue(released.released)
        for now, reading in ((-3600.0, None), (0.0, MonotonicReading(BOOT, 0.0)), (1010.0, MonotonicReading("boot:next", 1.0))):
            with self.subTest(now=now, reading=reading):
                self.assertEqual(released.remaining(now, reading), 0.0)
                self.assertTrue(released.expired(now, reading))
        self.assertFalse(lease().released)


class RecordTests(unittest.TestCase):
    def test_round_trip_keeps_every_field_and_the_token_only_for_its_holder(self) -> None:
        full = lease(monotonic_clock=BOOT, monotonic_expires_at=50.0, committed_revision=7, token="a" * 32, holder_lock="boot:x/1/2")
        loaded = Lease.from_json(full.to_json())
        self.assertEqual(loaded, full)
        self.assertEqual(loaded.token, "a" * 32, "the holder's own record keeps its token")
        shown = full.without_token()
        self.assertIsNone(shown.token)
        self.assertNotIn("token", shown.to_json())
        self.assertNotIn("a" * 32, repr(full))
        self.assertEqual(shown, full, "the token tells holders apart; it is not part of a lease's identity")
        self.assertIs(lease().without_token().token, None)

    def test_a_record_written_before_the_committed_revision_was_kept_reads_as_none_known(self) -> None:
        old = lease().to_json()
        old.pop("committed_revision", None)
        old.pop("schema_version")
        self.assertEqual(Lease.from_json(old).committed_revision, 0)

    def test_malformed_records_are_corrupt_state_and_malformed_leases_are_refused_when_built(self) -> None:
        good = lease(token="t" * 32).to_json()
        for change in ({"committed_revision": None}, {"epoch": "3"}, {"token": ""}, {"token": "x" * 129}, {"lessee": "me"},
                       {"schema_version": 99}, {"monotonic_expires_at": "soon"}):  # fmt: skip
            with self.subTest(change=change), self.assertRaises(CorruptStateError):
                Lease.from_json({**good, **change})
        for change in ({"epoch": "3"}, {"token": ""}, {"token": "x" * 129}, {"task_id": "../t"}):
            with self.subTest(built=change), self.assertRaises(InvalidInputError):
                lease(**change)

    def test_a_repair_names_the_epoch_the_next_acquisition_gets(self) -> None:
        repair = LeaseRepair(lease=lease(epoch=9, expires_at=RELEASED), quarantined="lease.json.damaged", damage="cut short")
        self.assertEqual(repair.next_epoch, 10)


class Renewals:
    """A renew function that counts, hands back the lease one second longer, and moves a fake
    monotonic clock, so a test can tell which renewal the keeper's state comes from."""

    def __init__(self, stop_after: int):
        self.seen: list[Lease] = []
        self.returned: list[Lease] = []
        self.monotonic_now = 100.0
        self.stop_after = stop_after
        self.enough = threading.Event()
        self.lock = threading.Lock()

    def monotonic(self) -> float:
        return self.monotonic_now

    def renew(self, current: Lease) -> Lease:
        with self.lock:
            self.seen.append(current)
            renewed = dataclasses.replace(current, expires_at=current.expires_at + 1.0)
            self.returned.append(renewed)
            self.monotonic_now = 100.0 + len(self.returned)
            if len(self.returned) >= self.stop_after:
                self.enough.set()
            return renewed


class LeaseKeeperTests(unittest.TestCase):
    def test_each_renewal_is_handed_the_lease_the_previous_one_returned(self) -> None:
        renewals = Renewals(stop_after=3)
        first = lease()
        keeper = LeaseKeeper(first, renewals.renew, interval_s=0.01, monotonic=renewals.monotonic)
        with keeper:
            self.assertTrue(renewals.enough.wait(60), "the keeper never renewed three times")
        count = len(renewals.returned)
        self.assertGreaterEqual(count, 3)
        self.assertEqual(renewals.seen[0], first)
        for before, after in zip(renewals.returned, renewals.seen[1:]):
            self.assertEqual(after, before, "a renewal was handed a lease other than the last one granted")
        self.assertEqual(keeper.lease, renewals.returned[-1])
        self.assertEqual(keeper.lease.expires_at, first.expires_at + count)
        self.assertEqual(keeper.renewed_at, 100.0 + count, "freshness is read on the monotonic clock right after the grant")
        self.assertIsNone(keeper.failure)

    def test_nothing_is_renewed_once_the_keeper_is_stopped(self) -> None:
        renewals = Renewals(stop_after=1)
        keeper = LeaseKeeper(lease(), renewals.renew, interval_s=0.01, monotonic=renewals.monotonic)
        with keeper:
            self.assertTrue(renewals.enough.wait(60))
        count = len(renewals.returned)
        threading.Event().wait(0.2)  # twenty intervals: a keeper still running would have renewed
        self.assertEqual(len(renewals.returned), count)

    def test_freshness_is_half_the_ttl_from_the_last_grant_on_the_monotonic_clock(self) -> None:
        now = [0.0]
        keeper = LeaseKeeper(lease(), lambda current: current, interval_s=60.0, monotonic=lambda: now[0])
        now[0] = 15.0
        self.assertFalse(keeper.stale(30.0), "exactly half the TTL is still fresh")
        now[0] = 15.001
        self.assertTrue(keeper.stale(30.0))
        replaced = lease(expires_at=2000.0)
        keeper.replace(replaced)
        self.assertEqual((keeper.lease, keeper.renewed_at), (replaced, 15.001))
        self.assertFalse(keeper.stale(30.0))


if __name__ == "__main__":
    unittest.main()
