"""The store contract, large values: a payload or result of 64 KiB or more (``stores.blobs``)
round-trips exactly, is written once (later commits and compactions keep only its reference), and
a damaged copy of it is reported as damage, never read as something else or dropped.

Hooks (optional; a store without them skips the tests that need them):

- ``damage_blobs(store, task_id) -> int``: flip a byte in every large value the store keeps apart
  from the task's state (its blobs); return how many it damaged.
- ``state_bytes(store, task_id) -> int``: how many bytes the task's state takes, its blobs left out
  (the JSON-file store: its snapshot and journals; a database: its state and effect rows).
"""

from __future__ import annotations

from typing import Any

from ...canonical import LARGE_VALUE_BYTES, digest_of
from ...errors import CorruptStateError, StateUnrecoverableError
from ...ledger import EffectRecord, EffectState
from ._base import ContractBase, sample_state

__all__ = ["BlobContract", "large_payload"]

MEGABYTE = 1024 * 1024


def large_payload(tag: str, size: int = MEGABYTE) -> dict[str, Any]:
    """A distinct payload of about ``size`` bytes encoded: a long string, and a little structure."""
    return {"blob": tag + "x" * (size - len(tag)), "tag": tag, "list": [1, 2.5, None, True, "ünï"]}


class BlobContract(ContractBase):
    def damage_blobs(self, store: Any, task_id: str) -> int:
        self._case.skipTest("the store gives no damage_blobs hook")
        raise AssertionError  # pragma: no cover

    def state_bytes(self, store: Any, task_id: str) -> int:
        self._case.skipTest("the store gives no state_bytes hook")
        raise AssertionError  # pragma: no cover

    def _large_state(self, store: Any) -> Any:
        lease = self.leased(store)
        state = sample_state("t", effects=2)
        payload = large_payload("p0")
        step_id = "big"
        state.effects[step_id] = EffectRecord(
            "t/big", step_id, "write", payload, digest_of(payload, checked=True), EffectState.VERIFIED, 1, lease.epoch,
            result=[large_payload("r0", 100 * 1024)], updated_at=1.0,
        )  # fmt: skip
        store.commit(lease, state, set(state.effects))
        return lease, state

    def test_contract_a_large_payload_and_result_round_trip(self) -> None:
        case, store = self._case, self.store()
        lease, state = self._large_state(store)
        loaded = self.store().load("t").state
        case.assertEqual(loaded.effects["big"], state.effects["big"])
        case.assertEqual(loaded.to_json(), state.to_json())
        # A record added later, a large value changed, one made small: all read back as written.
        state.effects["later"] = EffectRecord("t/later", "later", "write", large_payload("p1"), "sha256:" + "0" * 64, updated_at=2.0)
        store.commit(lease, state, {"later"})
        state.effects["big"] = state.effects["big"].with_changes(result={"small": True}, updated_at=3.0)
        state.effects["later"] = state.effects["later"].with_changes(result=large_payload("r1", LARGE_VALUE_BYTES), updated_at=3.0)
        store.commit(lease, state, {"big", "later"})
        case.assertEqual(self.store().load("t").state.to_json(), state.to_json())
        store.commit(lease, state)  # not told what changed: compared, and still only references
        reloaded = self.store().load("t").state
        case.assertEqual(reloaded.to_json(), state.to_json())

    def test_contract_a_large_value_is_not_copied_by_later_commits(self) -> None:
        case, store = self._case, self.store()
        lease, state = self._large_state(store)
        for index in range(40):
            record = state.effects["big"]
            state.effects["big"] = record.with_changes(attempts=record.attempts + 1, updated_at=10.0 + index)
            state.next_action = f"commit {index}"
            store.commit(lease, state, {"big"} if index % 2 else None)
        size = self.state_bytes(store, "t")
        case.assertLess(size, MEGABYTE // 4, f"the state takes {size} bytes besides its blobs: a large value was copied")
        case.assertEqual(self.store().load("t").state.to_json(), state.to_json())

    def test_contract_a_damaged_large_value_is_reported_not_swallowed(self) -> None:
        case, store = self._case, self.store()
        lease, _ = self._large_state(store)
        case.assertGreater(self.damage_blobs(store, "t"), 0)
        with self.quiet():
            with case.assertRaises(CorruptStateError):
                self.store().load("t")
            for _ in range(2):
                with case.assertRaises(StateUnrecoverableError):
                    self.store().load("t", lease=lease)  # a repairing load never starts afresh
            with case.assertRaises(CorruptStateError):
                self.store().load("t")
