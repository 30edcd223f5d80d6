"""The effect lifecycle: only the drawn moves are legal."""

from __future__ import annotations

import unittest

import helpers  # noqa: F401  (puts src on sys.path)
from longrun import CorruptStateError, EffectRecord, EffectState
from longrun.ledger import IllegalTransitionError

S = EffectState
LEGAL = {
    (S.PLANNED, S.STARTED),
    (S.PLANNED, S.FAILED),
    (S.PLANNED, S.UNCERTAIN),
    (S.STARTED, S.ACKNOWLEDGED),
    (S.STARTED, S.UNCERTAIN),
    (S.STARTED, S.VERIFIED),
    (S.STARTED, S.PLANNED),
    (S.STARTED, S.FAILED),
    (S.ACKNOWLEDGED, S.VERIFIED),
    (S.ACKNOWLEDGED, S.UNCERTAIN),
    (S.ACKNOWLEDGED, S.PLANNED),
    (S.UNCERTAIN, S.VERIFIED),
    (S.UNCERTAIN, S.PLANNED),
}


def record(state: EffectState) -> EffectRecord:
    return EffectRecord(key="t/s", step_id="s", action="write", payload={}, payload_digest="sha256:x", state=state)


class LifecycleTests(unittest.TestCase):
    def test_exactly_the_drawn_moves_are_legal(self) -> None:
        for source in S:
            for target in S:
                with self.subTest(move=f"{source.value}->{target.value}"):
                    if (source, target) in LEGAL:
                        self.assertIs(record(source).move(target, 1.0).state, target)
                    else:
                        with self.assertRaises(IllegalTransitionError):
                            record(source).move(target, 1.0)

    def test_verified_is_final(self) -> None:
        for target in S:
            with self.assertRaises(IllegalTransitionError):
                record(S.VERIFIED).move(target, 1.0)

    def test_with_changes_copies_every_field_and_refuses_unknown_ones(self) -> None:
        from dataclasses import fields, replace

        original = record(S.STARTED)
        changes = dict(attempts=2, evidence="seen", result={"id": 1})
        self.assertEqual(original.with_changes(**changes), replace(original, **changes))
        self.assertEqual([f.name for f in fields(original)], [f.name for f in fields(original.with_changes())])
        with self.assertRaises(TypeError):
            original.with_changes(colour="red")

    def test_round_trip_and_validation(self) -> None:
        original = record(S.ACKNOWLEDGED).move(S.VERIFIED, 2.0, result={"id": 7}, evidence="seen")
        self.assertEqual(EffectRecord.from_json(original.to_json()), original)
        broken = original.to_json()
        for field, value in (("state", "done"), ("attempts", -1), ("attempts", "1"), ("payload", []), ("cost", float("nan"))):
            with self.subTest(field=field, value=value), self.assertRaises(CorruptStateError):
                EffectRecord.from_json({**broken, field: value})
        with self.assertRaises(CorruptStateError):
            EffectRecord.from_json({k: v for k, v in broken.items() if k != "key"})
        with self.assertRaises(CorruptStateError):
            EffectRecord.from_json(["not", "an", "object"])

    def test_a_record_built_from_checked_values_is_a_frozen_effect_record_like_any_other(self) -> None:
        import dataclasses

        from longrun.budget import Backoff

        original = dataclasses.replace(
            record(S.UNCERTAIN), attempts=3, epoch=2, result=[1, {"a": None}], cost=1.5, receipt="r", evidence="e",
            last_error="x", not_before=9.0, approval_id="a1", updated_at=4.0, backoff=Backoff(2.0, 1.0),
        )  # fmt: skip
        built = EffectRecord.from_checked([getattr(original, f.name) for f in dataclasses.fields(EffectRecord)])
        self.assertIs(type(built), EffectRecord)
        self.assertEqual(built, original)
        with self.assertRaises(dataclasses.FrozenInstanceError):
            built.attempts = 4  # type: ignore[misc]
        self.assertEqual(built.move(S.VERIFIED, 5.0).state, S.VERIFIED)
        self.assertEqual(built.with_changes(attempts=4).attempts, 4)
        self.assertEqual(EffectRecord.from_json(built.to_json()), built)

    def test_a_copy_with_changes_is_a_frozen_effect_record_that_changes_only_what_was_named(self) -> None:
        import dataclasses

        original = record(S.STARTED)
        copy = original.with_changes(state=S.ACKNOWLEDGED, attempts=2, evidence="ok")
        self.assertIs(type(copy), EffectRecord)
        self.assertEqual(copy, dataclasses.replace(original, state=S.ACKNOWLEDGED, attempts=2, evidence="ok"))
        self.assertEqual(original.state, S.STARTED, "the original is untouched")
        with self.assertRaises(dataclasses.FrozenInstanceError):
            copy.attempts = 4  # type: ignore[misc]
        with self.assertRaises(TypeError):
            original.with_changes(colour="red")


class VerifiedResultsTests(unittest.TestCase):
    def test_a_view_of_the_verified_results_only_that_follows_the_ledger_and_cannot_be_written(self) -> None:
        from longrun.ledger import VerifiedResults

        effects = {"a": record(S.VERIFIED).with_changes(step_id="a", result={"n": 1}), "b": record(S.STARTED).with_changes(step_id="b")}
        results = VerifiedResults(effects)
        self.assertEqual(dict(results), {"a": {"n": 1}})
        self.assertEqual((len(results), "a" in results, "b" in results, results.get("b")), (1, True, False, None))
        with self.assertRaises(KeyError):
            results["b"]
        effects["b"] = effects["b"].with_changes(state=S.VERIFIED, result=[2])
        self.assertEqual(results["b"], [2], "the view follows the ledger")
        with self.assertRaises(TypeError):
            results["c"] = 3  # type: ignore[index]


if __name__ == "__main__":
    unittest.main()
