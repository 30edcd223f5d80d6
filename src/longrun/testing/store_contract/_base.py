"""What every part of the store contract stands on: the hooks a store's test case provides, the
helpers the tests share, and ``sample_state``, a state that uses every field."""

from __future__ import annotations

import contextlib
import logging
import time
import unittest
from typing import Any, Generator

from ...approval import ApprovalRequest
from ...budget import Backoff, BudgetCounters
from ...envelope import PlanOutline, RunState
from ...errors import CorruptStateError
from ...lease import Lease
from ...ledger import EffectRecord, EffectState
from ...outcome import Evidence, Status
from ...protocols import Store

__all__ = ["BAD_TASK_IDS", "TTL", "ContractBase", "sample_state"]

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


class ContractBase:
    """The hooks (see ``longrun.testing.store_contract``) and the helpers every part of the contract uses."""

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
