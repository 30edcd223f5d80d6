"""The store contract, control records and names: cancellations and approvals handed over raw
(damaged ones too) and never fenced, unknown tasks a typed error, unsafe task ids refused."""

from __future__ import annotations

import dataclasses
from typing import Callable

from ...approval import Approval
from ...cancellation import Cancellation
from ...errors import FencedError, InvalidInputError, UnknownTaskError
from ...lease import Lease
from ._base import BAD_TASK_IDS, TTL, ContractBase, sample_state

__all__ = ["ControlContract"]


class ControlContract(ContractBase):
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
