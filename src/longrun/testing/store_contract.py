"""The store contract: one unittest suite that every ``Store`` must pass, whatever it stores in.

Mix ``StoreContract`` into a ``unittest.TestCase`` and provide ``make_store``::

    class MyStoreContract(StoreContract, unittest.TestCase):
        def make_store(self):
            return MyStore(self.location)        # a new instance over this test's data

The suite drives only the ``Store`` protocol: leases (exclusion, takeover, epochs that strictly
increase, renewal, release), fencing of every mutating call that carries a lease (commit, renew,
release, repairing load: ``FencedError`` and nothing changed), revisions, the atomicity of a
commit, the round trip of a ``RunState`` written record by record, cancellation and approval
records, unknown tasks and unsafe task ids, and concurrent acquirers on separate instances.

What only the store can do is asked through hooks; a hook a store does not provide skips the tests
that need it (so a skip here is a gap in the store's own tests, not a pass):

- ``make_store()`` (required): a new store instance over this test's backing data. Called more
  than once per test; each instance must see the others' writes, like another process would.
- ``expire(store, lease) -> now``: make ``lease`` expired for the store and return the ``now`` to
  pass. The default returns ``lease.expires_at``, right for stores that judge expiry by the
  caller's clock; a store that uses its own clock (a database server's) must override it.
- ``damage_state(store, task_id)``: damage the task's stored state so that nothing valid remains.
- ``plant_foreign_state(store, task_id, source_task_id)``: make ``task_id``'s stored state a valid
  copy of ``source_task_id``'s.
- ``plant_future_schema(store, task_id)``: make the stored data claim a schema version newer than
  the code knows (the next ``make_store()`` must then refuse it with ``SchemaVersionError``).
- ``plant_control_text(store, task_id, kind, text)``: store raw text as the task's cancellation
  (``kind="cancellation"``) or as one approval record (``kind="approval"``).
- ``fail_nth_operation(store, n)``: a context manager in which the store's ``n``-th low-level
  I/O operation (a system call, an SQL statement) raises ``OSError`` or the driver's error.
- ``damage_lease(store, task_id)``: damage the task's stored lease record so that it no longer
  validates (for ``repair_lease``, which the stores built on ``BaseStore`` offer).

Not covered: durability across power loss (that needs a machine that loses power), and
exclusion across machines (the PostgreSQL store's own tests race processes with skewed clocks).
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
import copy
import dataclasses
import logging
import threading
import time
import unittest
from typing import Any, Callable, Generator

from ..approval import Approval, ApprovalRequest
from ..budget import Backoff, BudgetCounters
from ..cancellation import Cancellation
from ..envelope import PlanOutline, RunState
from ..errors import (
    CorruptStateError,
    FencedError,
    ForeignStateError,
    InvalidInputError,
    LeaseHeldError,
    LongrunError,
    SchemaVersionError,
    StateUnrecoverableError,
    StorageError,
    UnknownTaskError,
)
from ..lease import Lease
from ..ledger import EffectRecord, EffectState
from ..outcome import Evidence, Status
from ..protocols import Store

__all__ = ["StoreContract", "sample_state"]

TTL = 30.0
BAD_TASK_IDS = ("../t", "", "a/b", ".hidden", "-x", "t\x00", "x" * 129, 7, None)


def sample_state(task_id: str, *, effects: int = 3) -> RunState:
    """A ``RunState`` that uses every field, with ``effects`` effect records in several states."""
    records = {}
    lifecycle = (EffectState.VERIFIED, EffectState.STARTED, EffectState.PLANNED, EffectState.UNCERTAIN)
    for index in range(effects):
        step_id = f"step-{index:03d}"
        records[step_id] = EffectRecord(
            key=f"{task_id}/{step_id}",
            step_id=step_id,
            action="write",
            payload={"n": index, "text": "ünïcødé ✓", "nested": {"list": [1, 2.5, None, True]}},
            payload_digest=f"sha256:{index:064x}",
            state=lifecycle[index % len(lifecycle)],
            attempts=index,
            epoch=1,
            result={"line": index} if index % 4 == 0 else None,
            cost=0.25 * index,
            receipt="acknowledged" if index % 2 else None,
            evidence="observed" if index % 3 == 0 else None,
            last_error="transient: busy" if index == 2 else None,
            not_before=1_700_000_100.5 if index == 2 else None,
            approval_id="ap-1" if index == 1 else None,
            updated_at=1_700_000_000.0 + index,
            backoff=Backoff(0.5, 1_700_000_100.0, "boot:contract", 12.25) if index == 2 else None,
        )
    return RunState(
        task_id=task_id,
        plan_digest="sha256:" + "ab" * 32,
        budget=BudgetCounters(
            created_at=1_700_000_000.0, first_started_at=1_700_000_001.0, attempts_total=effects, cost_spent=1.5,
            last_progress_at=1_700_000_002.0, worked_s=2.5, worked_at_progress_s=1.25,
        ),
        created_at=1_700_000_000.0,
        updated_at=1_700_000_003.0,
        status=Status.RUNNING,
        current_step="step-001" if effects > 1 else None,
        next_action="observe whether effect 'x' took place",
        effects=records,
        approval_requests={
            "step-002": ApprovalRequest(task_id, "sha256:" + "ab" * 32, "step-002", "sha256:" + "02" * 32, "write", 1.0, 2.0)
        },
        consumed_approvals=["ap-0"],
        control_observations=[Evidence("control", "approval record x (sha256:1)", 1_700_000_002.5)],
        unknowns=[Evidence("target:write", "whether step-003 landed", 1_700_000_002.75)],
        plan_outline=PlanOutline((*records, "later/1", "later/2"), ("write",) * len(records) + ("mail", "write")),
    )


class _ExplodingPayload(dict):  # type: ignore[type-arg]
    """A payload whose encoding fails with an error no check foresees: a write that fails part way."""

    def items(self) -> Any:
        raise RuntimeError("the payload raised while it was being encoded")


class StoreContract:
    """The contract every store passes. Mix into ``unittest.TestCase``; see the module docstring."""

    # -- hooks --------------------------------------------------------------------------------

    def make_store(self) -> Store:
        raise NotImplementedError("a StoreContract test case must define make_store()")

    def expire(self, store: Store, lease: Lease) -> float:
        return lease.expires_at

    def damage_state(self, store: Store, task_id: str) -> None:
        self._case.skipTest("the store gives no damage_state hook")

    def plant_foreign_state(self, store: Store, task_id: str, source_task_id: str) -> None:
        self._case.skipTest("the store gives no plant_foreign_state hook")

    def plant_future_schema(self, store: Store, task_id: str) -> None:
        self._case.skipTest("the store gives no plant_future_schema hook")

    def plant_control_text(self, store: Store, task_id: str, kind: str, text: bytes) -> None:
        self._case.skipTest("the store gives no plant_control_text hook")

    def fail_nth_operation(self, store: Store, n: int) -> contextlib.AbstractContextManager[None]:
        self._case.skipTest("the store gives no fail_nth_operation hook")
        raise AssertionError  # pragma: no cover

    def damage_lease(self, store: Store, task_id: str) -> None:
        self._case.skipTest("the store gives no damage_lease hook")

    # -- helpers ------------------------------------------------------------------------------

    @property
    def _case(self) -> unittest.TestCase:
        assert isinstance(self, unittest.TestCase), "mix StoreContract into a unittest.TestCase"
        return self

    def store(self) -> Any:
        """A new instance from ``make_store``, closed at the end of the test if it can be."""
        store = self.make_store()
        close = getattr(store, "close", None)
        if callable(close):
            self._case.addCleanup(close)
        return store

    @staticmethod
    @contextlib.contextmanager
    def quiet() -> Generator[None, None, None]:
        """Silence longrun's log while a test provokes what a store rightly warns about."""
        logger = logging.getLogger("longrun")
        disabled, logger.disabled = logger.disabled, True
        try:
            yield
        finally:
            logger.disabled = disabled

    @staticmethod
    def now() -> float:
        return time.time()

    def leased(self, store: Any, task_id: str = "t", owner: str = "owner-a") -> Lease:
        lease: Lease = store.acquire_lease(task_id, owner, TTL, self.now())
        store.load(task_id, lease=lease)
        return lease

    def committed(self, store: Any, task_id: str = "t", *, effects: int = 3) -> tuple[Lease, RunState]:
        lease = self.leased(store, task_id)
        state = sample_state(task_id, effects=effects)
        store.commit(lease, state, set(state.effects))
        return lease, state

    @contextlib.contextmanager
    def reader(self) -> Generator[Any, None, None]:
        """A new instance for one look, closed right after (if it can be)."""
        store = self.make_store()
        try:
            yield store
        finally:
            close = getattr(store, "close", None)
            if callable(close):
                close()

    def snapshot(self, task_id: str = "t") -> tuple[object, ...]:
        """Everything a reader can see of a task, through a fresh instance."""
        with self.reader() as reader:
            try:
                state = reader.load(task_id).state
            except CorruptStateError as exc:
                state_view: object = type(exc).__name__
            else:
                state_view = state.to_json() if state is not None else None
            cancellation = reader.read_cancellation(task_id)
            return (
                reader.read_lease(task_id),
                state_view,
                cancellation.body if cancellation else None,
                tuple(sorted((record.body for record in reader.read_approvals(task_id)), key=repr)),
            )

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

    # -- state --------------------------------------------------------------------------------

    def test_contract_a_task_with_no_commit_loads_as_none(self) -> None:
        case, store = self._case, self.store()
        lease = store.acquire_lease("t", "owner-a", TTL, self.now())
        for result in (store.load("t"), store.load("t", lease=lease)):
            case.assertIsNone(result.state)
            case.assertFalse(result.recovered)

    def test_contract_state_round_trips_exactly_and_revisions_increase(self) -> None:
        case, store = self._case, self.store()
        lease, state = self.committed(store, effects=5)
        case.assertEqual(state.revision, 1)
        case.assertEqual((state.lease_epoch, state.lease_owner, state.lease_expires_at), (lease.epoch, lease.owner, lease.expires_at))
        loaded = self.store().load("t")
        case.assertEqual(loaded.state.to_json(), state.to_json())
        case.assertEqual(loaded.source, "primary")
        case.assertTrue(loaded.digest.startswith("sha256:"), loaded.digest)
        case.assertGreaterEqual(loaded.revision_floor, 1)
        revisions = [state.revision]
        for _ in range(3):
            revisions.append(store.commit(lease, state))
        case.assertEqual(revisions, [1, 2, 3, 4])
        case.assertEqual(self.store().load("t").state.revision, 4)
        case.assertEqual(self.store().load("t").state.to_json(), state.to_json())

    def test_contract_records_written_as_changed_add_up_to_the_runners_state(self) -> None:
        """A runner commits with ``changed`` naming only the effect records it touched."""
        case, store = self._case, self.store()
        lease = self.leased(store)
        state = sample_state("t", effects=0)
        store.commit(lease, state)
        for index in range(6):
            step_id = f"step-{index:03d}"
            record = EffectRecord(f"t/{step_id}", step_id, "write", {"n": index}, f"sha256:{index:064x}")
            state.effects[step_id] = record
            store.commit(lease, state, {step_id})
            state.effects[step_id] = record.move(EffectState.STARTED, 2.0, attempts=1, epoch=lease.epoch)
            store.commit(lease, state, {step_id})
            if index % 2:
                state.effects[step_id] = state.effects[step_id].move(EffectState.VERIFIED, 3.0, result={"n": index})
                state.next_action = f"after {step_id}"
                store.commit(lease, state, {step_id})
            case.assertEqual(self.store().load("t").state.to_json(), state.to_json(), f"after {step_id}")
        # A second instance that never loaded the task may commit too (it cannot know what is stored).
        other = self.store()
        state.effects["step-000"] = state.effects["step-000"].move(EffectState.VERIFIED, 4.0)
        revision = other.commit(lease, state, {"step-000"})
        case.assertEqual(revision, state.revision)
        reloaded = self.store().load("t").state
        case.assertEqual(reloaded.to_json(), state.to_json())
        case.assertEqual(list(reloaded.effects), [f"step-{i:03d}" for i in range(6)], "plan order is kept")

    def test_contract_the_plan_outline_round_trips_is_replaced_and_may_be_absent(self) -> None:
        case, store = self._case, self.store()
        lease, state = self.committed(store, effects=2)
        case.assertEqual(self.store().load("t").state.plan_outline, state.plan_outline)
        assert state.plan_outline is not None
        state.next_action = "a commit that leaves the outline as it was"
        store.commit(lease, state, ())
        case.assertEqual(self.store().load("t").state.plan_outline, state.plan_outline)
        grown = PlanOutline((*state.plan_outline.steps, "later/3"), (*state.plan_outline.actions, "mail"))
        state.plan_outline = grown  # a plan that grew
        store.commit(lease, state, ())
        reloaded = self.store().load("t").state
        case.assertEqual(reloaded.plan_outline, grown)
        case.assertEqual(reloaded.to_json(), state.to_json())
        lease_u = self.leased(store, "u")
        bare = sample_state("u", effects=2)
        bare.plan_outline = None  # a durable function's state, or one written before outlines
        store.commit(lease_u, bare, set(bare.effects))
        loaded = self.store().load("u").state
        case.assertIsNone(loaded.plan_outline)
        case.assertNotIn("plan_outline", loaded.to_json())

    def test_contract_a_commit_that_does_not_say_what_changed_loses_nothing(self) -> None:
        """``changed=None`` means "not known": every replaced record must still be persisted."""
        case, store = self._case, self.store()
        lease = self.leased(store)
        state = sample_state("t", effects=3)
        store.commit(lease, state)
        first = next(iter(state.effects))
        state.effects[first] = replace(state.effects[first], evidence="replaced without being named")
        store.commit(lease, state)
        case.assertEqual(self.store().load("t").state.to_json(), state.to_json())
        state.next_action = "header only"
        store.commit(lease, state, ())  # nothing changed among the records: the header still lands
        case.assertEqual(self.store().load("t").state.next_action, "header only")

    def test_contract_a_commit_cut_short_at_any_io_leaves_the_previous_or_the_next_revision(self) -> None:
        case, store = self._case, self.store()
        lease, state = self.committed(store, effects=4)
        before = self.snapshot()[1]
        assert isinstance(before, dict)
        before.pop("reconcile_all")
        landed = False
        n = 0
        while not landed:
            n += 1
            case.assertLess(n, 1000, "the commit never completed")
            next_state = copy.deepcopy(state)
            next_state.next_action = f"attempt {n}"
            next_state.effects["step-001"] = dataclasses.replace(state.effects["step-001"], evidence=f"attempt {n}")
            next_state.effects["step-new"] = EffectRecord("t/step-new", "step-new", "write", {"n": n}, "sha256:" + "0" * 64)
            failed: BaseException | None = None
            with self.fail_nth_operation(store, n):
                try:
                    store.commit(lease, next_state, {"step-001", "step-new"})
                except (OSError, LongrunError) as exc:
                    failed = exc
            seen = self.snapshot()[1]
            assert isinstance(seen, dict), seen
            # A store may answer a cut-short commit by recovering (observing every unverified
            # step first); what it may not do is lose or mix revisions.
            seen.pop("reconcile_all")
            if seen["revision"] == before["revision"]:
                case.assertEqual(seen, before, f"operation {n} failed: the previous revision must be intact")
                case.assertIsNotNone(failed, "a commit that returned must have landed")
            else:
                # Above the previous revision; a store may skip numbers a failed commit may have used.
                case.assertGreater(seen["revision"], before["revision"])
                expected = next_state.to_json()
                expected["revision"] = seen["revision"]
                expected.pop("reconcile_all")
                case.assertEqual(seen, expected, f"operation {n} failed: the next revision must be whole")
                landed = True
            if failed is not None:
                store.load("t", lease=lease)  # a failed write poisons the task until it is loaded again
        case.assertGreater(n, 1, "the hook never made an operation fail")

    def test_contract_a_failed_write_keeps_the_previous_revision_and_poisons_the_task_until_reloaded(self) -> None:
        case, store = self._case, self.store()
        lease, state = self.committed(store)
        before = self.snapshot()
        bad = copy.deepcopy(state)
        # Encoding the second changed record fails in a way no check foresaw: the write fails part
        # way through. (``with_changes`` builds the record without checking it, as the runner does.)
        bad.effects["step-002"] = bad.effects["step-002"].with_changes(payload=_ExplodingPayload(n=2))
        with case.assertRaises(RuntimeError):
            store.commit(lease, bad, {"step-001", "step-002"})
        case.assertEqual(bad.revision, state.revision, "a failed commit leaves the caller's revision alone")
        case.assertEqual(self.snapshot(), before)
        with case.assertRaises(StorageError):
            store.commit(lease, state, ())  # refused: the store must load the task again first
        case.assertEqual(self.snapshot(), before)
        store.load("t", lease=lease)
        case.assertEqual(store.commit(lease, state, ()), before[1]["revision"] + 1)  # type: ignore[index]

    def test_contract_a_state_the_loader_would_refuse_is_refused_before_anything_is_written(self) -> None:
        case, store = self._case, self.store()
        lease, state = self.committed(store)
        before = self.snapshot()
        for name, value in (("payload", {"unencodable": object()}), ("payload", {"name": "caf\udce9"}),
                            ("result", 10**5000), ("evidence", {"http": 200}), ("receipt", 123)):  # fmt: skip
            bad = copy.deepcopy(state)
            # Built without checks (as ``move`` and ``with_changes`` build them on the runner's path).
            bad.effects["step-002"] = bad.effects["step-002"].with_changes(**{name: value})
            with case.subTest(field=name, value=type(value).__name__), case.assertRaises(InvalidInputError):
                store.commit(lease, bad, {"step-001", "step-002"})
            case.assertEqual(bad.revision, state.revision, "a refused commit leaves the caller's revision alone")
            case.assertEqual(self.snapshot(), before)
        bad = copy.deepcopy(state)
        bad.next_action = "check the file caf\udce9"
        with case.assertRaises(InvalidInputError):
            store.commit(lease, bad, ())
        case.assertEqual(self.snapshot(), before)
        # A refusal is not a failed write: the task is not poisoned, the next commit lands at once.
        case.assertEqual(store.commit(lease, state, ()), before[1]["revision"] + 1)  # type: ignore[index]
        case.assertEqual(self.store().load("t").state.to_json(), state.to_json())

    def test_contract_damaged_state_is_refused_and_stays_refused(self) -> None:
        store = self.store()
        lease, _ = self.committed(store)
        self.damage_state(store, "t")
        with self.quiet():
            self._damaged_state_checks(store, lease)

    def _damaged_state_checks(self, store: Any, lease: Lease) -> None:
        case = self._case
        with case.assertRaises(StateUnrecoverableError) as caught:
            self.store().load("t")
        case.assertIsInstance(caught.exception, ValueError)
        for _ in range(2):
            with case.assertRaises(StateUnrecoverableError):
                store.load("t", lease=lease)  # a repairing load sets damage aside but never starts afresh
        fresh = self.store()
        now = self.expire(store, lease)
        takeover = fresh.acquire_lease("t", "owner-b", TTL, now)
        with case.assertRaises(StateUnrecoverableError):
            fresh.load("t", lease=takeover)
        with case.assertRaises(CorruptStateError):
            self.store().commit(takeover, sample_state("t"), ())  # an instance that never loaded cannot guess
        with case.assertRaises(StateUnrecoverableError):
            self.store().load("t")

    def test_contract_foreign_state_is_refused_and_left_in_place(self) -> None:
        case, store = self._case, self.store()
        self.committed(store, "source")
        lease = self.leased(self.store(), "t")
        self.plant_foreign_state(store, "t", "source")
        for attempt in range(2):
            with case.subTest(attempt=attempt):
                with case.assertRaises(ForeignStateError):
                    self.store().load("t")
                with case.assertRaises(ForeignStateError):
                    self.store().load("t", lease=lease)
        case.assertEqual(self.store().load("source").state.task_id, "source")

    def test_contract_a_newer_schema_is_refused(self) -> None:
        case, store = self._case, self.store()
        self.committed(store)
        self.plant_future_schema(store, "t")
        with case.assertRaises(SchemaVersionError) as caught:
            self.store().load("t")
        case.assertIn("version", str(caught.exception))

    # -- control records ----------------------------------------------------------------------

    def test_contract_cancellation_records_round_trip(self) -> None:
        case, store = self._case, self.store()
        self.leased(store)
        case.assertIsNone(store.read_cancellation("t"))
        first = Cancellation("t", 1_700_000_000.5, "ops", "stop, please ✋")
        self.store().write_cancellation(first)
        record = store.read_cancellation("t")
        case.assertEqual(record.body, first.to_json())
        case.assertIsNone(record.error)
        case.assertTrue(record.digest.startswith("sha256:"))
        case.assertEqual(Cancellation.from_json(record.body), first)
        second = Cancellation("t", 1_700_000_001.0, "ops", "really")
        store.write_cancellation(second)
        case.assertEqual(self.store().read_cancellation("t").body, second.to_json())

    def test_contract_approval_records_round_trip(self) -> None:
        case, store = self._case, self.store()
        self.leased(store)
        case.assertEqual(store.read_approvals("t"), ())
        approvals = [
            Approval(f"ap-{i}", "t", "sha256:p", f"step-{i}", f"sha256:{i}", "write", 2e9, "ops", 1e9) for i in range(3)
        ]
        for approval in approvals:
            self.store().write_approval(approval)
        bodies = [record.body for record in store.read_approvals("t")]
        case.assertCountEqual(bodies, [approval.to_json() for approval in approvals])
        case.assertTrue(all(record.digest.startswith("sha256:") and record.error is None for record in store.read_approvals("t")))
        replaced = dataclasses.replace(approvals[0], approver="someone else")
        store.write_approval(replaced)  # the same id replaces its record
        bodies = [record.body for record in self.store().read_approvals("t")]
        case.assertEqual(len(bodies), 3)
        case.assertIn(replaced.to_json(), bodies)
        for bad_id in ("../x", "", "a/b"):
            with case.subTest(approval_id=bad_id), case.assertRaises(InvalidInputError):
                store.write_approval(dataclasses.replace(approvals[0], approval_id=bad_id))

    def test_contract_damaged_control_records_are_handed_over_not_raised(self) -> None:
        case, store = self._case, self.store()
        self.leased(store)
        self.plant_control_text(store, "t", "cancellation", b"{not json")
        record = self.store().read_cancellation("t")
        case.assertIsNotNone(record, "a damaged cancellation still means stop: it must be handed over")
        case.assertIsNotNone(record.error)
        case.assertTrue(record.digest.startswith("sha256:"))
        self.plant_control_text(store, "t", "approval", b"[1, 2")
        records = self.store().read_approvals("t")
        case.assertEqual(len(records), 1)
        case.assertIsNotNone(records[0].error)

    def test_contract_control_records_do_not_need_the_lease_and_are_not_fenced_by_it(self) -> None:
        """Operators write control records; the lease only fences the runner's own writes."""
        case, store = self._case, self.store()
        lease, state = self.committed(store)
        before_state = self.snapshot()[1]
        self.store().write_cancellation(Cancellation("t", 1.0, "ops", "stop"))
        self.store().write_approval(Approval("ap-1", "t", "sha256:p", "s", "sha256:d", "write", 2e9, "ops", 1e9))
        case.assertEqual(self.snapshot()[1], before_state)
        case.assertEqual(store.read_lease("t"), lease)
        case.assertEqual(store.commit(lease, state), state.revision)

    # -- names --------------------------------------------------------------------------------

    def test_contract_unknown_tasks_are_a_typed_error(self) -> None:
        case, store = self._case, self.store()
        self.committed(store, "t")
        ghost = Lease("ghost", "owner-a", 1, self.now(), self.now() + TTL)
        calls: dict[str, Callable[[], object]] = {
            "read_lease": lambda: store.read_lease("ghost"),
            "load": lambda: store.load("ghost"),
            "repairing load": lambda: store.load("ghost", lease=ghost),
            "read_cancellation": lambda: store.read_cancellation("ghost"),
            "read_approvals": lambda: store.read_approvals("ghost"),
            "write_cancellation": lambda: store.write_cancellation(Cancellation("ghost", 0.0, "ops", "stop")),
            "write_approval": lambda: store.write_approval(Approval("ap", "ghost", "p", "s", "d", "a", 1.0, "ops", 0.0)),
        }
        for name, call in calls.items():
            with case.subTest(call=name), case.assertRaises(UnknownTaskError) as caught:
                call()
            case.assertIsInstance(caught.exception, LookupError)
        for name, call in {
            "renew": lambda: store.renew_lease(ghost, TTL, self.now()),
            "release": lambda: store.release_lease(ghost, self.now()),
            "commit": lambda: store.commit(ghost, sample_state("ghost"), ()),
        }.items():
            with case.subTest(call=name), case.assertRaises((UnknownTaskError, FencedError)):
                call()
        case.assertEqual(store.list_tasks(), ["t"], "no call on an unknown task creates it")

    def test_contract_unsafe_task_ids_are_refused_everywhere(self) -> None:
        case, store = self._case, self.store()
        call: Callable[[], object]
        for bad in BAD_TASK_IDS:
            for name, call in {
                "acquire_lease": lambda: store.acquire_lease(bad, "owner-a", TTL, self.now()),
                "read_lease": lambda: store.read_lease(bad),
                "load": lambda: store.load(bad),
                "read_cancellation": lambda: store.read_cancellation(bad),
                "read_approvals": lambda: store.read_approvals(bad),
            }.items():
                with case.subTest(task_id=bad, call=name), case.assertRaises(InvalidInputError):
                    call()
        case.assertEqual(store.list_tasks(), [])

    def test_contract_list_tasks_names_every_task_once_in_order(self) -> None:
        case, store = self._case, self.store()
        case.assertEqual(store.list_tasks(), [])
        for task_id in ("b-task", "c.task", "A_task"):
            self.store().acquire_lease(task_id, "owner-a", TTL, self.now())
        self.committed(store, "a-task")  # acquired and committed
        case.assertEqual(store.list_tasks(), sorted(["b-task", "a-task", "c.task", "A_task"]))

