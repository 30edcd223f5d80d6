"""The store contract, state: revisions, the exact round trip of a state written record by record,
the atomicity of a commit, a failed write that refuses the next until a reload, and damaged,
foreign or newer state refused."""

from __future__ import annotations

from dataclasses import replace
import copy
import dataclasses
from typing import Any

from ...errors import (
    CorruptStateError,
    ForeignStateError,
    InvalidInputError,
    LongrunError,
    SchemaVersionError,
    StateUnrecoverableError,
    StorageError,
)
from ...envelope import PlanOutline
from ...failures import RunFailure
from ...lease import Lease
from ...ledger import EffectRecord, EffectState
from ._base import TTL, ContractBase, sample_state

__all__ = ["StateContract"]


class _ExplodingPayload(dict):  # type: ignore[type-arg]
    """A payload whose encoding fails with an error no check foresees: a write that fails part way."""

    def items(self) -> Any:
        raise RuntimeError("the payload raised while it was being encoded")


class StateContract(ContractBase):
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

    def test_contract_the_last_failure_round_trips_is_replaced_and_cleared(self) -> None:
        case, store = self._case, self.store()
        lease, state = self.committed(store, effects=2)
        case.assertIsNone(self.store().load("t").state.last_failure)
        case.assertNotIn("last_failure", self.store().load("t").state.to_json())
        first = RunFailure(
            kind="exception", error_type="KeyError", message="'ada'", traceback="Traceback ...\nKeyError: 'ada'\n", attempt=1,
            max_failures=5, at=1_700_000_010.0, epoch=lease.epoch, revision=state.revision + 1, progress=2, step="step-001",
            retry_at=1_700_000_011.0,
        )  # fmt: skip
        for failure in (first, replace(first, kind="crash", error_type="ProcessDied", traceback="", attempt=2, retry_at=None)):
            state.last_failure = failure
            store.commit(lease, state, ())
            reloaded = self.store().load("t").state
            case.assertEqual(reloaded.last_failure, failure)
            case.assertEqual(reloaded.to_json(), state.to_json())
        state.next_action = "a commit that leaves the failure as it was"
        store.commit(lease, state, ())
        case.assertEqual(self.store().load("t").state.last_failure, state.last_failure)
        state.last_failure = None  # the run finished
        store.commit(lease, state, ())
        reloaded = self.store().load("t").state
        case.assertIsNone(reloaded.last_failure)
        case.assertNotIn("last_failure", reloaded.to_json())

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
