"""Run contract, steps and the plan digest."""

from __future__ import annotations

import unittest

import helpers  # noqa: F401  (puts src on sys.path)
from longrun import InvalidInputError, RunContract, Step, plan_digest
from longrun.canonical import canonical_bytes, digest_of, ensure_json
from longrun.contract import check_task_id, validate_plan


class TaskIdTests(unittest.TestCase):
    def test_safe_names_pass(self) -> None:
        for name in ("a", "task-1", "weekly_report.2026-48", "A" * 128):
            self.assertEqual(check_task_id(name), name)

    def test_unsafe_names_are_refused(self) -> None:
        for name in ("", ".", "..", "../etc", "a/b", "/abs", ".hidden", "-flag", "a b", "A" * 129, "tâche", "a\x00b", 7, None):
            with self.subTest(name=name), self.assertRaises(InvalidInputError):
                check_task_id(name)
        with self.assertRaises(InvalidInputError):
            RunContract("../escape", "goal")


class PlanDigestTests(unittest.TestCase):
    contract = RunContract("t", "goal", allowed_actions=("write",))

    def test_digest_is_stable_and_pins_every_static_part(self) -> None:
        base = [Step("a", "write", {"x": 1}), Step("b", "write", lambda r: {"y": 2})]
        digest = plan_digest(self.contract, base)
        self.assertEqual(digest, plan_digest(self.contract, [Step("a", "write", {"x": 1}), Step("b", "write", lambda r: {"z": 3})]))
        variants = [
            [Step("a", "write", {"x": 2}), base[1]],
            [Step("a", "write", {"x": 1}, approval=True), base[1]],
            [Step("a", "send", {"x": 1}), base[1]],
            [Step("a", "write", {"x": 1}, key="other"), base[1]],
            [base[1], base[0]],
            [base[0]],
        ]
        for steps in variants:
            with self.subTest(steps=steps):
                self.assertNotEqual(plan_digest(self.contract, steps), digest)
        for contract in (
            RunContract("t2", "goal", allowed_actions=("write",)),
            RunContract("t", "other goal", allowed_actions=("write",)),
            RunContract("t", "goal", allowed_actions=("write",), non_goals=("x",)),
            RunContract("t", "goal", allowed_actions=("write", "send")),
            RunContract("t", "goal", allowed_actions=("write",), forbidden_actions=("rm",)),
            RunContract("t", "goal", allowed_actions=("write",), completion_evidence=("a",)),
        ):
            with self.subTest(contract=contract):
                self.assertNotEqual(plan_digest(contract, base), digest)

    def test_observe_first_is_pinned_only_when_set_so_existing_digests_stay(self) -> None:
        plan = [Step("a", "write", {"x": 1}), Step("b", "write", lambda r: {}, approval=True, key="k")]
        # The digest this plan had before steps could be marked observe_first (tasks on disk carry it).
        known = "sha256:bb17c3358ca55b4a6acdee29b72838fc483c97750a5c5c52ad3862c7227b5b77"
        self.assertEqual(plan_digest(self.contract, plan), known)
        self.assertEqual(plan_digest(self.contract, [Step("a", "write", {"x": 1}, observe_first=False), plan[1]]), known)
        self.assertNotEqual(plan_digest(self.contract, [Step("a", "write", {"x": 1}, observe_first=True), plan[1]]), known)
        with self.assertRaises(InvalidInputError):
            Step("a", "write", observe_first=1)  # type: ignore[arg-type]

    def test_key_order_in_payload_does_not_change_the_digest(self) -> None:
        one = plan_digest(self.contract, [Step("a", "write", {"x": 1, "y": 2})])
        two = plan_digest(self.contract, [Step("a", "write", {"y": 2, "x": 1})])
        self.assertEqual(one, two)

    def test_bad_plans_are_refused(self) -> None:
        with self.assertRaises(InvalidInputError):
            validate_plan(self.contract, [Step("a", "write"), Step("a", "write")])
        with self.assertRaises(InvalidInputError):
            validate_plan(self.contract, [Step("a", "write", key="k"), Step("b", "write", key="k")])
        with self.assertRaises(InvalidInputError):
            validate_plan(RunContract("t", "g", completion_evidence=("missing",)), [Step("a", "write")])
        with self.assertRaises(InvalidInputError):
            validate_plan(self.contract, [])
        with self.assertRaises(InvalidInputError):
            validate_plan(self.contract, ["not a step"])  # type: ignore[list-item]

    def test_bad_contract_fields_are_refused(self) -> None:
        for kwargs in (dict(goal=""), dict(goal="g", allowed_actions="write"), dict(goal="g", non_goals=("a", "a")), dict(goal="g", forbidden_actions=(3,))):
            with self.subTest(kwargs=kwargs), self.assertRaises(InvalidInputError):
                RunContract("t", **kwargs)  # type: ignore[arg-type]


class PayloadTests(unittest.TestCase):
    def test_payload_must_be_plain_json(self) -> None:
        for payload in ({"a": {1, 2}}, {"a": b"x"}, {1: "a"}, {"a": float("nan")}, {"a": float("inf")}, {"a": object()}):
            with self.subTest(payload=payload), self.assertRaises(InvalidInputError):
                Step("s", "write", payload)
        with self.assertRaises(InvalidInputError):
            Step("s", "write", ["not", "a", "mapping"])  # type: ignore[arg-type]

    def test_dynamic_payload_result_is_validated(self) -> None:
        step = Step("s", "write", lambda results: ["list"])  # type: ignore[arg-type, return-value]
        with self.assertRaises(InvalidInputError):
            step.evaluate_payload({})
        self.assertEqual(Step("s", "write", lambda r: {"t": (1, 2)}).evaluate_payload({}), {"t": [1, 2]})

    def test_canonical_encoding(self) -> None:
        self.assertEqual(canonical_bytes({"b": 1, "a": "é"}), '{"a":"é","b":1}'.encode())
        self.assertEqual(digest_of({"a": (1,)}), digest_of({"a": [1]}))
        deep: object = {}
        for _ in range(100):
            deep = {"d": deep}
        with self.assertRaises(InvalidInputError):
            ensure_json(deep)


if __name__ == "__main__":
    unittest.main()
