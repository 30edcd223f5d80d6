"""The test case of the Runner's tests: a fake clock, a store that remembers every commit, an outbox,
and a runner over them (``RunnerCase.runner``); an adapter that counts calls (``RecordingAdapter``)."""

from __future__ import annotations

import json
from typing import Collection

from longrun import Approval, JsonFileStore, Lease, RetryPolicy, RunContract, Runner, RunState, Step
from longrun.adapters import EffectRequest, Observation, Receipt
from longrun.testing import FakeClock, OutboxAdapter

from .support import TempDirTest


class SpyStore(JsonFileStore):
    """A JSON-file store that remembers every committed state, to check the order of transitions."""

    def __init__(self, root: str):
        super().__init__(root, create=True)
        self.commits: list[dict] = []

    def commit(self, lease: Lease, state: RunState, changed: Collection[str] | None = None) -> int:
        revision = super().commit(lease, state, changed)
        self.commits.append(json.loads(json.dumps(state.to_json())))
        return revision

    def states_of(self, step_id: str) -> list[str]:
        seen = []
        for snapshot in self.commits:
            for effect in snapshot["effects"]:
                if effect["step_id"] == step_id and (not seen or seen[-1] != effect["state"]):
                    seen.append(effect["state"])
        return seen


class RecordingAdapter:
    """Counts calls; the effect is 'applied' once apply returned, or as scripted."""

    deduplicates = False

    def __init__(self) -> None:
        self.applied: list[str] = []
        self.events: list[tuple[str, str]] = []
        self.observe_as: dict[str, Observation] = {}
        self.on_apply = None

    def apply(self, request: EffectRequest) -> Receipt:
        self.events.append(("apply", request.key))
        if self.on_apply is not None:
            self.on_apply(request)
        self.applied.append(request.key)
        return Receipt(result={"ok": request.key}, cost=1.0, evidence="recorded")

    def observe(self, request: EffectRequest) -> Observation:
        self.events.append(("observe", request.key))
        if request.key in self.observe_as:
            return self.observe_as[request.key]
        if request.key in self.applied:
            return Observation.applied("in the record", {"ok": request.key})
        return Observation.absent("not in the record")


class RunnerCase(TempDirTest):
    def setUp(self) -> None:
        super().setUp()
        self.clock = FakeClock()
        self.store = SpyStore(self.path("store"))
        self.outbox = OutboxAdapter(self.path("outbox.jsonl"))

    def runner(self, steps=None, *, contract=None, adapter=None, limits=None, retry=None, owner=None, store=None):
        contract = contract or RunContract("task-1", "write three lines")
        steps = steps if steps is not None else [Step(f"s{i}", "write", {"n": i}) for i in range(3)]
        return Runner(
            contract,
            steps,
            store=store or self.store,
            adapters={"write": adapter or self.outbox},
            clock=self.clock,
            limits=limits,
            retry=retry or RetryPolicy(base_delay_s=1.0, max_delay_s=8.0, jitter=0.0),
            owner=owner,
        )

    def approve(self, state: RunState, step_id: str, **changes) -> Approval:
        request = state.approval_requests[step_id]
        fields = dict(approval_id=f"ap-{step_id}", approver="ops", granted_at=self.clock.now(), expires_at=self.clock.now() + 600)
        fields.update(changes)
        return Approval.for_request(request, **fields)
