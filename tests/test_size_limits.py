"""Size limits hold on the write side: nothing is written that a load could not read back.

A load reads at most ``MAX_STATE_BYTES`` (256 MiB) of state, so a state that grew past it would be
written once and then be unreadable for good (every resume, ``verify`` and ``approve`` failing).
The writers refuse instead: a payload over ``MAX_VALUE_BYTES`` when its step is planned, before
anything is applied; a result over it is recorded by its size and digest; and a commit that would
make the state too large raises ``SizeLimitError`` and writes nothing, which the runner turns into
a recorded ``unsafe-to-continue`` stop. The state limit is lowered here (on the reading and the
writing side alike, as one constant serves both) so that the tests need not write 256 MiB.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator
from unittest import mock

from helpers import support
from longrun import (
    EffectRecord,
    JsonFileStore,
    Observation,
    Receipt,
    RunContract,
    Runner,
    SizeLimitError,
    SqliteStore,
    Status,
    Step,
)
from longrun.adapters import EffectRequest
from longrun.canonical import MAX_VALUE_BYTES, canonical_bytes, sha256_hex
from longrun.cli._verify import verify
from longrun.ledger import OMITTED
from longrun.testing import FakeClock
from longrun.testing.store_contract import sample_state


@contextlib.contextmanager
def state_limit(limit: int) -> Iterator[None]:
    """``MAX_STATE_BYTES`` lowered to ``limit`` everywhere a store reads or writes with it."""
    with contextlib.ExitStack() as stack:
        for target in (
            "longrun.envelope.MAX_STATE_BYTES",
            "longrun.stores.jsonfile.MAX_STATE_BYTES",
            "longrun.stores.jsonfile.MAX_JOURNAL_BYTES",
            "longrun.stores._journal.MAX_STATE_BYTES",
            "longrun.stores._sql.MAX_STATE_BYTES",
        ):
            stack.enter_context(mock.patch(target, limit))
        yield


class Target:
    """An adapter over a dict: counts applies, observes exactly, returns what it is told to."""

    deduplicates = False

    def __init__(self, result: object = None, observed_result: object = None, raise_after_apply: bool = False) -> None:
        self.applied: list[str] = []
        self.result = result
        self.observed_result = observed_result
        self.raise_after_apply = raise_after_apply

    def apply(self, request: EffectRequest) -> Receipt:
        self.applied.append(request.key)
        if self.raise_after_apply:
            raise ConnectionError("the connection dropped after the request was sent")
        return Receipt(result=self.result, evidence="stored")

    def observe(self, request: EffectRequest) -> Observation:
        if request.key in self.applied:
            return Observation.applied("found", self.observed_result)
        return Observation.absent("not found")


class LimitCase(support.TempDirTest):
    def setUp(self) -> None:
        super().setUp()
        self.clock = FakeClock()

    def runner(self, steps: list[Step], target: Target, *, task_id: str = "big", store=None) -> Runner:
        return Runner(
            RunContract(task_id, "move large things"),
            steps,
            store=store or JsonFileStore(self.path("store"), create=True),
            adapters={"put": target},
            clock=self.clock,
        )


class ValueLimitTests(LimitCase):
    def test_a_static_payload_over_the_value_limit_is_refused_when_the_step_is_built(self) -> None:
        with self.assertRaises(SizeLimitError) as caught:
            Step("upload", "put", {"blob": "x" * MAX_VALUE_BYTES})
        self.assertIn("step 'upload' payload is", str(caught.exception))
        self.assertIn("MAX_VALUE_BYTES", str(caught.exception))
        self.assertEqual(caught.exception.limit, MAX_VALUE_BYTES)

    def test_a_dynamic_payload_over_the_value_limit_is_refused_at_planning_before_anything_is_applied(self) -> None:
        target = Target()
        steps = [Step("small", "put", {"n": 1}), Step("upload", "put", lambda results: {"blob": "x" * MAX_VALUE_BYTES})]
        with self.assertRaises(SizeLimitError) as caught:
            self.runner(steps, target).run()
        self.assertIn("step 'upload' payload is", str(caught.exception))
        self.assertIn(f"over the {MAX_VALUE_BYTES}-byte limit (MAX_VALUE_BYTES)", str(caught.exception))
        self.assertEqual(target.applied, ["big/small"])
        loaded = JsonFileStore(self.path("store")).load("big")
        self.assertNotIn("upload", loaded.state.effects)

    def test_a_result_over_the_value_limit_is_recorded_by_its_size_and_digest(self) -> None:
        large = {"rows": ["y" * 1024] * (MAX_VALUE_BYTES // 1024)}
        data = canonical_bytes(large)
        expected = {OMITTED: {"bytes": len(data), "digest": "sha256:" + sha256_hex(data), "limit": MAX_VALUE_BYTES}}
        for path, target in (("receipt", Target(result=large)), ("observation", Target(observed_result=large, raise_after_apply=True))):
            with self.subTest(path=path), self.assertLogs("longrun", "WARNING") as logs:
                outcome = self.runner([Step("export", "put", {})], target, task_id=f"big-{path}").run()
                self.assertIn("ConnectionError" if path == "observation" else "MAX_VALUE_BYTES", "\n".join(logs.output))
                self.assertIs(outcome.status, Status.DONE, "the effect took place and is verified")
                self.assertEqual(target.applied, [f"big-{path}/export"])
                self.assertEqual(outcome.results["export"], expected)
                state = JsonFileStore(self.path("store")).load(f"big-{path}").state
                self.assertEqual(state.effects["export"].result, expected)
                if path == "receipt":
                    self.assertTrue(any("MAX_VALUE_BYTES" in item.detail for item in outcome.unknowns))
                else:
                    self.assertIn("MAX_VALUE_BYTES", state.effects["export"].evidence)


class StateLimitTests(LimitCase):
    LIMIT = 100_000

    def six_payloads_and_an_approval(self) -> list[Step]:
        steps = [Step(f"part{index}", "put", {"chunk": f"{index}" * 20_000}) for index in range(6)]
        return [*steps, Step("publish", "put", {"all": True}, approval=True)]

    def test_a_commit_that_would_make_the_state_unreadable_stops_the_run_and_records_why(self) -> None:
        for label, store in (("json", lambda: JsonFileStore(self.path("store"), create=True)), ("sqlite", lambda: SqliteStore(self.path("db.sqlite"), create=True))):
            with self.subTest(store=label), state_limit(self.LIMIT if label == "json" else 30_000):
                target = Target()
                steps = self.six_payloads_and_an_approval() if label == "json" else [Step("big", "put", {"chunk": "z" * 40_000})]
                outcome = self.runner(steps, target, store=store()).run()
                self.assertIs(outcome.status, Status.UNSAFE_TO_CONTINUE)
                self.assertIn("MAX_STATE_BYTES", outcome.next_action)
                self.assertTrue(any("MAX_STATE_BYTES" in item.detail for item in outcome.unknowns))
                applied = list(target.applied)
                self.assertLess(len(applied), len(steps), "the step that would overflow the state was not applied")
                loaded = store().load("big")  # the durable state reads back, from its primary copy
                self.assertEqual(loaded.source, "primary")
                self.assertIs(loaded.state.status, Status.UNSAFE_TO_CONTINUE)
                self.assertIn("MAX_STATE_BYTES", loaded.state.next_action)
                _, code = verify(store(), "big", self.clock.now())
                self.assertEqual(int(code), 1, "verify: resumable once an operator acts")
                again = self.runner(steps, target, store=store()).run()
                self.assertIs(again.status, Status.UNSAFE_TO_CONTINUE)
                self.assertEqual(target.applied, applied, "nothing applied twice, nothing more applied")
                if label == "json":
                    for name in os.listdir(self.path("store", "big")):
                        if name.startswith(("state.json", "journal.")):
                            self.assertLessEqual(os.path.getsize(self.path("store", "big", name)), self.LIMIT, name)

    def test_the_json_store_never_commits_a_state_its_load_cannot_read(self) -> None:
        with state_limit(self.LIMIT):
            store = JsonFileStore(self.path("store"), create=True)
            lease = store.acquire_lease("t", "owner", 30.0, 1_700_000_000.0)
            state = sample_state("t", effects=1)
            store.commit(lease, state)
            refused = None
            for index in range(40):  # one 7 kB record per commit, appended to the journal
                step_id = f"grow-{index}"
                state.effects[step_id] = EffectRecord(f"t/{step_id}", step_id, "put", {"chunk": "q" * 7000}, "sha256:x")
                try:
                    store.commit(lease, state, {step_id})
                except SizeLimitError as exc:
                    refused = exc
                    break
                self.assertEqual(JsonFileStore(self.path("store")).load("t").state, state, f"commit {index} reads back")
            self.assertIsNotNone(refused, "the state grew past the limit without a refusal")
            assert refused is not None
            self.assertEqual((refused.limit, refused.limit_name), (self.LIMIT, "MAX_STATE_BYTES"))
            del state.effects[step_id]
            before = JsonFileStore(self.path("store")).load("t").state
            self.assertEqual(before, state, "the refused commit wrote nothing")
            state.next_action = "smaller again"
            store.commit(lease, state, {step_id})  # a refusal does not poison the task: no reload needed
            self.assertEqual(JsonFileStore(self.path("store")).load("t").state.next_action, "smaller again")
