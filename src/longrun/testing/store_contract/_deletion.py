"""The store contract, deletion: ``delete_task`` removes a task whose run ended, whole (state, lease,
control records, large values), and refuses, changing nothing, a task still live or not ended."""

from __future__ import annotations

import dataclasses

from ...approval import Approval
from ...cancellation import Cancellation
from ...errors import InvalidInputError, LeaseHeldError, LongrunError, TaskNotFinishedError, UnknownTaskError
from ...messages import Message
from ...outcome import Status
from ._base import BAD_TASK_IDS, ContractBase, sample_state

__all__ = ["DeletionContract"]

_LARGE = "x" * (70 * 1024)
"""Over ``stores.blobs.BLOB_MIN_BYTES``: stored apart from its effect record where a store does that."""


class DeletionContract(ContractBase):
    def ended(self, store: object, task_id: str, status: Status = Status.DONE) -> None:
        """A task that committed ``status`` with every kind of record (a large payload, an approval,
        a cancellation), its lease released."""
        lease = self.leased(store, task_id)
        state = sample_state(task_id)
        step = next(iter(state.effects))
        state.effects[step] = dataclasses.replace(state.effects[step], payload={"text": _LARGE})
        state.status = status
        store.commit(lease, state, set(state.effects))  # type: ignore[attr-defined]
        store.write_approval(Approval("ap-1", task_id, "sha256:p", "s", "sha256:d", "write", 2e9, "ops", 1e9))  # type: ignore[attr-defined]
        store.write_cancellation(Cancellation(task_id, 1e9, "ops", "stop"))  # type: ignore[attr-defined]
        store.send_message(Message(task_id, "orders", {"n": 1}, "k1", "ops", 1e9))  # type: ignore[attr-defined]
        store.release_lease(lease, self.now())  # type: ignore[attr-defined]

    def test_contract_delete_removes_an_ended_task_whole_and_its_id_starts_afresh(self) -> None:
        case, store = self._case, self.store()
        self.ended(store, "gone", Status.CANCELLED)
        self.ended(store, "kept")
        deletion = store.delete_task("gone", self.now())
        case.assertEqual((deletion.task_id, deletion.status), ("gone", "cancelled"))
        case.assertGreater(deletion.revision, 0)
        case.assertTrue(deletion.removed)
        with self.reader() as reader:
            case.assertEqual(reader.list_tasks(), ["kept"])
            for read in (reader.load, reader.read_lease, reader.read_approvals, reader.read_cancellation, reader.read_messages):
                with case.subTest(read=read.__name__), case.assertRaises(UnknownTaskError):
                    read("gone")
            case.assertEqual(reader.load("kept").state.status, Status.DONE)  # the other task untouched
            case.assertEqual(len(reader.read_approvals("kept")), 1)
        # The id is free: a new task under it has no record of the old one, in this object or another.
        for instance in (store, self.store()):
            lease = instance.acquire_lease("gone", "owner-b", 30.0, self.now())
            case.assertIsNone(instance.load("gone", lease=lease).state)
            case.assertEqual(instance.read_approvals("gone"), ())
            case.assertIsNone(instance.read_cancellation("gone"))
            case.assertEqual(instance.read_messages("gone"), ())
            fresh = sample_state("gone", effects=1)
            case.assertEqual(instance.commit(lease, fresh, set(fresh.effects)), 1)
            instance.release_lease(lease, self.now())
            fresh.status = Status.DONE
            lease = instance.acquire_lease("gone", "owner-b", 30.0, self.now())
            instance.load("gone", lease=lease)
            instance.commit(lease, fresh, set())
            instance.release_lease(lease, self.now())
            instance.delete_task("gone", self.now())
        with case.assertRaises(UnknownTaskError):
            store.delete_task("gone", self.now())

    def test_contract_delete_refuses_a_task_not_ended_or_live_and_changes_nothing(self) -> None:
        case, store = self._case, self.store()
        lease = self.leased(store, "live")
        state = sample_state("live")
        state.status = Status.DONE
        store.commit(lease, state, set(state.effects))
        before = self.snapshot("live")
        with case.assertRaises(LeaseHeldError):  # ended, but its lease is live: someone may be at it
            self.store().delete_task("live", self.now())
        case.assertEqual(self.snapshot("live"), before)
        running = sample_state("running")
        lease = self.leased(store, "running")
        store.commit(lease, running, set(running.effects))
        store.release_lease(lease, self.now())
        before = self.snapshot("running")
        with case.assertRaises(TaskNotFinishedError) as caught:
            self.store().delete_task("running", self.now())
        case.assertEqual(caught.exception.status, "running")
        case.assertIsInstance(caught.exception, InvalidInputError)
        case.assertEqual(self.snapshot("running"), before)
        lease = self.leased(store, "empty")  # a lease and no state: nothing has ended
        store.release_lease(lease, self.now())
        with case.assertRaises(TaskNotFinishedError):
            store.delete_task("empty", self.now())
        case.assertCountEqual(store.list_tasks(), ["live", "running", "empty"])
        for bad in BAD_TASK_IDS:
            with case.subTest(task_id=bad), case.assertRaises(InvalidInputError):
                store.delete_task(bad, self.now())

    def test_contract_a_delete_cut_short_leaves_the_whole_task_or_nothing_that_loads(self) -> None:
        # The n-th low-level operation of the deletion fails, for n = 1, 2, ... until one completes:
        # each time, another reader sees the task whole (as it was) or not at all, never damaged.
        case = self._case
        n = 0
        for n in range(1, 500):
            store, task_id = self.store(), f"cut-{n}"
            self.ended(store, task_id)
            before = self.snapshot(task_id)
            failed: BaseException | None = None
            with self.fail_nth_operation(store, n):
                try:
                    store.delete_task(task_id, self.now())
                except (OSError, LongrunError) as exc:
                    failed = exc
            with self.reader() as reader:
                present = task_id in reader.list_tasks()
            if present:
                case.assertIsNotNone(failed, f"operation {n} failed: a delete that returned must have deleted")
                case.assertEqual(self.snapshot(task_id), before, f"operation {n} failed: the task must be whole")
                self.store().delete_task(task_id, self.now())  # and it can still be deleted
            else:
                with self.reader() as reader, case.assertRaises(UnknownTaskError):
                    reader.load(task_id)
            if failed is None:
                break
        case.assertGreater(n, 1, "the hook never made an operation fail")
