"""Reconcile verdicts, directly: what one observation of an in-flight effect makes of its record.

The rule (``longrun.recovery``): applied becomes verified and is never applied again; absent allows
a retry unless the target had acknowledged the effect; anything else allows a retry only if the
target deduplicates, and otherwise stops the run as unsafe with the effect uncertain.
"""

from __future__ import annotations

import unittest

import helpers  # noqa: F401  (puts src on sys.path)
from longrun.adapters import EffectRequest, Observation, ObservedState, Receipt
from longrun.canonical import MAX_VALUE_BYTES
from longrun.ledger import OMITTED, EffectRecord, EffectState
from longrun.recovery import Verdict, observe_safely, reconcile

NOW = 1_700_000_500.0


class ScriptedTarget:
    """An adapter whose observation is scripted; counts observations, refuses every apply."""

    def __init__(self, answer: object, *, deduplicates: bool = False):
        self.answer = answer
        self.deduplicates = deduplicates
        self.observed = 0

    def apply(self, request: EffectRequest) -> Receipt:
        raise AssertionError("reconcile must never apply")

    def observe(self, request: EffectRequest) -> Observation:
        self.observed += 1
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer  # type: ignore[return-value]


def record(state: EffectState = EffectState.STARTED, **changes: object) -> EffectRecord:
    planned = EffectRecord("t/s", "s", "write", {"n": 1}, "sha256:" + "1" * 64, attempts=1, epoch=2, updated_at=NOW - 10)
    if state is EffectState.PLANNED:
        return planned.with_changes(**changes)
    started = planned.move(EffectState.STARTED, NOW - 9)
    if state is not EffectState.STARTED:
        started = started.move(state, NOW - 8)
    return started.with_changes(**changes)


def request() -> EffectRequest:
    return EffectRequest("t", "s", "write", "t/s", {"n": 1}, "sha256:" + "1" * 64, 1, 2, 0.0)


class VerdictTests(unittest.TestCase):
    def test_applied_is_verified_with_the_observed_result_or_else_the_recorded_one(self) -> None:
        for state in (EffectState.STARTED, EffectState.ACKNOWLEDGED, EffectState.UNCERTAIN):
            with self.subTest(state=state):
                target = ScriptedTarget(Observation.applied("line 4", {"line": 4}))
                settled = reconcile(record(state, result={"line": 0}), target, request(), NOW)
                self.assertIs(settled.verdict, Verdict.VERIFIED)
                self.assertIs(settled.record.state, EffectState.VERIFIED)
                self.assertEqual((settled.record.result, settled.record.evidence, settled.record.updated_at), ({"line": 4}, "line 4", NOW))
                self.assertEqual(target.observed, 1)
        kept = reconcile(record(result={"id": 7}), ScriptedTarget(Observation.applied("seen")), request(), NOW)
        self.assertEqual(kept.record.result, {"id": 7}, "an observation without a result keeps the recorded one")

    def test_an_observed_result_too_large_to_keep_is_verified_by_size_and_digest_with_a_warning(self) -> None:
        huge = {"blob": "x" * (MAX_VALUE_BYTES + 1)}
        with self.assertLogs("longrun", "WARNING") as logs:
            settled = reconcile(record(), ScriptedTarget(Observation.applied("seen", huge)), request(), NOW)
        self.assertIs(settled.verdict, Verdict.VERIFIED)
        assert isinstance(settled.record.result, dict)
        self.assertEqual(list(settled.record.result), [OMITTED])
        self.assertIn("MAX_VALUE_BYTES", settled.record.evidence or "")
        self.assertIn("t/s", "\n".join(logs.output))

    def test_absent_without_an_acknowledgement_may_be_applied_again(self) -> None:
        for state in (EffectState.STARTED, EffectState.UNCERTAIN):
            with self.subTest(state=state):
                settled = reconcile(record(state), ScriptedTarget(Observation.absent("no line")), request(), NOW)
                self.assertIs(settled.verdict, Verdict.RETRY)
                self.assertIs(settled.record.state, EffectState.PLANNED)
                self.assertEqual((settled.record.evidence, settled.record.attempts), ("no line", 1), "the attempt stays counted")
                self.assertIn("observed absent", settled.reason)

    def test_absent_after_the_target_acknowledged_is_unsafe_unless_the_target_deduplicates(self) -> None:
        acknowledged = record(EffectState.ACKNOWLEDGED, receipt="accepted as #9")
        settled = reconcile(acknowledged, ScriptedTarget(Observation.absent("no line")), request(), NOW)
        self.assertIs(settled.verdict, Verdict.UNSAFE)
        self.assertIs(settled.record.state, EffectState.UNCERTAIN)
        self.assertIn("accepted as #9", settled.reason)
        deduplicated = reconcile(acknowledged, ScriptedTarget(Observation.absent("no line"), deduplicates=True), request(), NOW)
        self.assertIs(deduplicated.verdict, Verdict.RETRY)
        self.assertIs(deduplicated.record.state, EffectState.PLANNED)
        self.assertIn("deduplicates", deduplicated.reason)

    def test_unknown_is_unsafe_and_leaves_the_effect_uncertain_unless_the_target_deduplicates(self) -> None:
        for state in (EffectState.STARTED, EffectState.ACKNOWLEDGED, EffectState.UNCERTAIN):
            with self.subTest(state=state):
                settled = reconcile(record(state), ScriptedTarget(Observation.unknown("target down")), request(), NOW)
                self.assertIs(settled.verdict, Verdict.UNSAFE)
                self.assertIs(settled.record.state, EffectState.UNCERTAIN)
                self.assertEqual((settled.record.evidence, settled.record.updated_at), ("target down", NOW))
                self.assertIn("unknown", settled.reason)
        retry = reconcile(record(), ScriptedTarget(Observation.unknown("target down"), deduplicates=True), request(), NOW)
        self.assertIs(retry.verdict, Verdict.RETRY)

    def test_an_observe_that_raises_or_answers_nonsense_is_an_unknown_never_an_error(self) -> None:
        with self.assertLogs("longrun", "WARNING") as logs:
            raised = observe_safely(ScriptedTarget(ConnectionError("reset by peer")), request())
        self.assertIs(raised.state, ObservedState.UNKNOWN)
        self.assertIn("ConnectionError: reset by peer", raised.evidence)
        self.assertIn("reset by peer", "\n".join(logs.output))
        nonsense = observe_safely(ScriptedTarget({"state": "applied"}), request())
        self.assertIs(nonsense.state, ObservedState.UNKNOWN)
        self.assertIn("dict, not an Observation", nonsense.evidence)
        with self.assertLogs("longrun", "WARNING"):
            settled = reconcile(record(), ScriptedTarget(TimeoutError("slow")), request(), NOW)
        self.assertIs(settled.verdict, Verdict.UNSAFE)


if __name__ == "__main__":
    unittest.main()
