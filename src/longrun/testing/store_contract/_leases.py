"""The store contract, leases and fencing: exclusion, epochs that only grow, the secret token, and
every mutating call under a stale or forged lease refused without a change."""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable

from ...cancellation import Cancellation
from ...errors import CorruptStateError, FencedError, InvalidInputError, LeaseHeldError, StorageError, UnknownTaskError
from ...lease import Lease
from ._base import TTL, ContractBase, sample_state

__all__ = ["LeaseContract"]


class LeaseContract(ContractBase):
    # -- leases -------------------------------------------------------------------------------

    def test_contract_acquire_creates_the_task_and_a_live_lease_excludes_others(self) -> None:
        case, store = self._case, self.store()
        case.assertEqual(store.list_tasks(), [])
        first = store.acquire_lease("t", "owner-a", TTL, self.now())
        case.assertEqual((first.task_id, first.owner), ("t", "owner-a"))
        case.assertGreaterEqual(first.epoch, 1)
        case.assertGreater(first.expires_at, first.acquired_at)
        case.assertEqual(store.list_tasks(), ["t"])
        case.assertEqual(self.store().read_lease("t"), first)
        for other in (store, self.store()):
            with case.assertRaises(LeaseHeldError) as caught:
                other.acquire_lease("t", "owner-b", TTL, self.now())
            case.assertIsInstance(caught.exception, StorageError)
            case.assertIsInstance(caught.exception, OSError)  # generic handlers still catch it
            case.assertEqual(caught.exception.holder, first)
        case.assertEqual(store.read_lease("t"), first, "a refused acquisition changes nothing")

    def test_contract_every_acquisition_issues_a_strictly_greater_epoch(self) -> None:
        case, store = self._case, self.store()
        epochs = []
        lease = store.acquire_lease("t", "owner-a", TTL, self.now())
        epochs.append(lease.epoch)
        lease = store.acquire_lease("t", "owner-a", TTL, self.now(), token=lease.token)  # its holder re-enters
        epochs.append(lease.epoch)
        store.release_lease(lease, self.now())
        lease = self.store().acquire_lease("t", "owner-b", TTL, self.now())  # after a release
        epochs.append(lease.epoch)
        now = self.expire(store, lease)
        lease = store.acquire_lease("t", "owner-c", TTL, now)  # a takeover after expiry
        epochs.append(lease.epoch)
        case.assertEqual(epochs, sorted(set(epochs)), f"epochs must strictly increase: {epochs}")
        case.assertEqual(self.store().read_lease("t").owner, "owner-c")

    def test_contract_renewal_extends_the_lease_and_keeps_its_epoch(self) -> None:
        case, store = self._case, self.store()
        lease = store.acquire_lease("t", "owner-a", TTL, self.now())
        renewed = store.renew_lease(lease, TTL * 2, self.now() + 1.0)
        case.assertEqual((renewed.epoch, renewed.owner, renewed.acquired_at), (lease.epoch, lease.owner, lease.acquired_at))
        case.assertGreater(renewed.expires_at, lease.expires_at)
        case.assertEqual(self.store().read_lease("t"), renewed)
        with case.assertRaises(LeaseHeldError):
            store.acquire_lease("t", "owner-b", TTL, self.now())

    def test_contract_release_lets_another_owner_in_at_once(self) -> None:
        case, store = self._case, self.store()
        lease = store.acquire_lease("t", "owner-a", TTL, self.now())
        store.release_lease(lease, self.now())
        taken = self.store().acquire_lease("t", "owner-b", TTL, self.now())
        case.assertGreater(taken.epoch, lease.epoch)

    def test_contract_the_owner_is_a_label_only_the_token_re_enters_a_live_lease(self) -> None:
        case, store = self._case, self.store()
        first = store.acquire_lease("t", "host-1", TTL, self.now())
        case.assertIsInstance(first.token, str)
        case.assertGreaterEqual(len(first.token), 32, "the token is a secret: long and random")
        for other in (store, self.store()):
            for token in (None, "0" * 32, first.token.upper() if first.token.upper() != first.token else "f" * 32):
                with case.subTest(token=token), case.assertRaises(LeaseHeldError):
                    other.acquire_lease("t", "host-1", TTL, self.now(), token=token)  # the same owner string
        case.assertEqual(self.store().read_lease("t").epoch, first.epoch, "a refused acquisition changes nothing")
        again = self.store().acquire_lease("t", "host-1", TTL, self.now(), token=first.token)  # its holder re-enters
        case.assertEqual(again.epoch, first.epoch + 1)
        case.assertNotEqual(again.token, first.token, "every grant has its own token")
        with case.assertRaises(FencedError):
            store.renew_lease(first, TTL, self.now())  # the earlier grant is fenced, as after any acquisition
        with case.assertRaises(LeaseHeldError):
            self.store().acquire_lease("t", "host-1", TTL, self.now(), token=first.token)  # an old token opens nothing
        with case.assertRaises(InvalidInputError):
            self.store().acquire_lease("t", "host-1", TTL, self.now(), token=5)

    def test_contract_renew_release_commit_and_repairing_load_need_the_lease_token(self) -> None:
        case, store = self._case, self.store()
        real, state = self.committed(store)
        before = self.snapshot()
        for forged in (dataclasses.replace(real, token=None), dataclasses.replace(real, token="f" * 32)):
            calls: dict[str, Callable[[], object]] = {
                "commit": lambda: store.commit(forged, state, set(state.effects)),
                "commit from a fresh instance": lambda: self.store().commit(forged, sample_state("t"), ()),
                "renew": lambda: store.renew_lease(forged, TTL, self.now()),
                "release": lambda: store.release_lease(forged, self.now()),
                "repairing load": lambda: store.load("t", lease=forged),
            }
            for name, call in calls.items():
                revision = state.revision
                with case.subTest(call=name, token=forged.token):
                    with case.assertRaises(FencedError):
                        call()
                    case.assertEqual(self.snapshot(), before, f"{name} changed the store")
                    case.assertEqual(state.revision, revision)
        renewed = store.renew_lease(real, TTL, self.now())  # the holder itself is unaffected
        case.assertEqual(renewed.token, real.token, "a renewal keeps the grant's token")
        case.assertEqual(store.commit(renewed, state), before[1]["revision"] + 1)  # type: ignore[index]
        store.release_lease(renewed, self.now())

    def test_contract_the_token_is_never_shown(self) -> None:
        case, store = self._case, self.store()
        lease = store.acquire_lease("t", "owner-a", TTL, self.now())
        assert lease.token is not None
        case.assertNotIn(lease.token, repr(lease))
        case.assertNotIn(lease.token, str(lease))
        case.assertIsNone(self.store().read_lease("t").token, "a reader is not handed the holder's secret")
        case.assertNotIn("token", self.store().read_lease("t").to_json())
        with case.assertRaises(LeaseHeldError) as caught:
            self.store().acquire_lease("t", "owner-b", TTL, self.now())
        case.assertNotIn(lease.token, str(caught.exception))
        holder = caught.exception.holder
        assert isinstance(holder, Lease)
        case.assertIsNone(holder.token, "nor is a contender")

    def test_contract_a_damaged_lease_record_is_repaired_above_every_recorded_epoch(self) -> None:
        case, store = self._case, self.store()
        if not callable(getattr(store, "repair_lease", None)):
            case.skipTest("the store has no repair_lease")
        first, state = self.committed(store)
        store.release_lease(first, self.now())
        other = self.store()
        second = other.acquire_lease("t", "owner-b", TTL, self.now())
        other.load("t", lease=second)
        other.commit(second, state)
        other.release_lease(second, self.now())
        self.damage_lease(store, "t")
        with self.quiet():
            with case.assertRaises(CorruptStateError):
                self.store().acquire_lease("t", "owner-c", TTL, self.now())
            with case.assertRaises(CorruptStateError):
                self.store().read_lease("t")
            repair = self.store().repair_lease("t", self.now())
        case.assertGreaterEqual(repair.lease.epoch, second.epoch, "never below an epoch the state records")
        case.assertTrue(repair.lease.expired(self.now()), "the repaired lease is released")
        case.assertTrue(repair.quarantined, "the damaged record is kept aside, never deleted")
        case.assertTrue(repair.damage)
        case.assertEqual(self.store().read_lease("t").epoch, repair.lease.epoch)
        taken = self.store().acquire_lease("t", "owner-c", TTL, self.now())
        case.assertGreater(taken.epoch, second.epoch)
        case.assertGreater(taken.epoch, repair.lease.epoch)
        before = self.snapshot()
        for _ in range(2):
            with case.assertRaises(InvalidInputError):  # nothing damaged: nothing to repair
                self.store().repair_lease("t", self.now())
        case.assertEqual(self.snapshot(), before)
        case.assertEqual(self.store().load("t", lease=taken).state.revision, state.revision)
        with case.assertRaises(UnknownTaskError):
            self.store().repair_lease("ghost", self.now())

    def test_contract_bad_lease_arguments_are_refused(self) -> None:
        case, store = self._case, self.store()
        for ttl in (0, -1.0, float("nan"), True, "30"):
            with case.subTest(ttl=ttl), case.assertRaises(InvalidInputError):
                store.acquire_lease("t", "owner-a", ttl, self.now())
        for owner in ("", None, 5):
            with case.subTest(owner=owner), case.assertRaises(InvalidInputError):
                store.acquire_lease("t", owner, TTL, self.now())
        case.assertEqual(store.list_tasks(), [], "a refused acquisition creates no task")

    def test_contract_concurrent_acquirers_on_separate_instances_get_one_lease_per_round(self) -> None:
        case = self._case
        contenders = 6
        stores = [self.store() for _ in range(contenders)]
        winners_by_round: list[list[Lease]] = []
        for round_number in range(4):
            barrier = threading.Barrier(contenders)
            results: list[Lease | BaseException] = []
            guard = threading.Lock()

            def contend(index: int) -> None:
                barrier.wait()
                try:
                    outcome: Lease | BaseException = stores[index].acquire_lease("race", f"owner-{index}", TTL, self.now())
                except BaseException as exc:  # collected and asserted on below
                    outcome = exc
                with guard:
                    results.append(outcome)

            threads = [threading.Thread(target=contend, args=(i,)) for i in range(contenders)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            winners = [item for item in results if isinstance(item, Lease)]
            losers = [item for item in results if not isinstance(item, Lease)]
            case.assertEqual(len(winners), 1, f"round {round_number}: {results}")
            for loser in losers:
                case.assertIsInstance(loser, LeaseHeldError)
            winners_by_round.append(winners)
            winner = winners[0]
            stores[int(winner.owner.split("-")[1])].release_lease(winner, self.now())
        epochs = [round_winners[0].epoch for round_winners in winners_by_round]
        case.assertEqual(epochs, sorted(set(epochs)))

    # -- fencing ------------------------------------------------------------------------------

    def test_contract_every_mutating_call_with_a_stale_lease_is_fenced_and_changes_nothing(self) -> None:
        case, store = self._case, self.store()
        stale, state = self.committed(store)
        store.write_cancellation(Cancellation("t", 1.0, "ops", "keep"))
        now = self.expire(store, stale)
        newer = self.store().acquire_lease("t", "owner-b", TTL, now)
        case.assertGreater(newer.epoch, stale.epoch)
        before = self.snapshot()
        calls: dict[str, Callable[[], object]] = {
            "commit": lambda: store.commit(stale, state, set(state.effects)),
            "commit of nothing changed": lambda: store.commit(stale, state),
            "renew": lambda: store.renew_lease(stale, TTL, self.now()),
            "release": lambda: store.release_lease(stale, self.now()),
            "repairing load": lambda: store.load("t", lease=stale),
            "commit from a fresh instance": lambda: self.store().commit(stale, sample_state("t"), ()),
        }
        for name, call in calls.items():
            revision = state.revision
            with case.subTest(call=name):
                with case.assertRaises(FencedError) as caught:
                    call()
                case.assertEqual(caught.exception.write_epoch, stale.epoch)
                case.assertEqual(self.snapshot(), before, f"{name} changed the store")
                case.assertEqual(state.revision, revision, "a fenced commit leaves the caller's revision alone")
        # The current holder is unaffected by all of that.
        self.store().load("t", lease=newer)

    def test_contract_a_lease_the_store_never_issued_is_fenced(self) -> None:
        case, store = self._case, self.store()
        real, state = self.committed(store)
        before = self.snapshot()
        forged = [
            dataclasses.replace(real, epoch=real.epoch + 1),
            dataclasses.replace(real, epoch=real.epoch + 1000),
            dataclasses.replace(real, epoch=0),
        ]
        call: Callable[[], object]
        for lease in forged:
            with case.subTest(epoch=lease.epoch):
                for call in (
                    lambda: store.commit(lease, state, set(state.effects)),
                    lambda: store.renew_lease(lease, TTL, self.now()),
                    lambda: store.release_lease(lease, self.now()),
                    lambda: store.load("t", lease=lease),
                ):
                    with case.assertRaises(FencedError):
                        call()
                case.assertEqual(self.snapshot(), before)
        with case.assertRaises(FencedError):  # the right epoch under another owner's name
            store.renew_lease(dataclasses.replace(real, owner="impostor"), TTL, self.now())

    def test_contract_a_lease_for_one_task_cannot_commit_another(self) -> None:
        case, store = self._case, self.store()
        lease, _ = self.committed(store, "t")
        self.committed(self.store(), "u")
        before = self.snapshot("u")
        with case.assertRaises(InvalidInputError):
            store.commit(lease, sample_state("u"), ())
        case.assertEqual(self.snapshot("u"), before)
