"""Run contract, steps and the plan digest."""

from __future__ import annotations

import hashlib
import json
import pickle
import random
import unittest
from typing import Any, Sequence

import helpers  # noqa: F401  (puts src on sys.path)
from longrun import InvalidInputError, RunContract, Step, plan_digest
from longrun.canonical import canonical_bytes, digest_of, ensure_json
from longrun.contract import check_step_id, check_task_id, plan_prefix_digests, validate_plan
from longrun.names import are_step_ids


def encoded_afresh(contract: RunContract, steps: Sequence[Step]) -> str:
    """The plan digest by its definition: one ``json.dumps`` of the contract and every step's
    ``static_json``, independent of how ``plan_digest`` assembles the same bytes."""
    document = {"contract": contract.to_json(), "steps": [step.static_json(contract.task_id) for step in steps]}
    data = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    return "sha256:" + hashlib.sha256(data).hexdigest()


def varied_steps(rng: random.Random, count: int) -> list[Step]:
    """Steps that exercise every part ``static_json`` pins, and every value the encoder escapes."""
    texts = ["plain", "", 'quote " and \\ backslash', "tab\t nl\n nul\x00 \x1f", "café ∑ 😀", "slash / </script>", "\u2028\u2029"]
    values: list[Any] = [0, -1, 2**70, 1.5, -0.0, 1e-7, 1e300, True, False, None, [], {}, [1, [2, {"z": None}]]]
    steps: list[Step] = []
    for index in range(count):
        step_id = rng.choice([f"s{index}", f"step-{index}.x", f"a:{index}/b@c+d=e_f"])
        payload: Any = {rng.choice(texts) + str(key): rng.choice(values + texts) for key in range(rng.randint(0, 4))}
        if rng.random() < 0.1:
            payload = lambda results: {}  # noqa: E731
        elif rng.random() < 0.05:
            payload = {"big": "x" * rng.choice([5000, 20_000, 70_000]), "n": 1}  # kept out of the step's part; long strings spliced
        after: tuple[str, ...] | None = None
        if steps and rng.random() < 0.3:
            after = tuple(rng.sample([step.step_id for step in steps], rng.randint(0, min(3, len(steps)))))
        steps.append(
            Step(
                step_id,
                rng.choice(["write", "send", "é-action", 'q"uote', "\\back"]),
                payload,
                approval=rng.random() < 0.3,
                key=rng.choice([None, None, None, f"k{index}", f"ключ/{index}", f'k"{index}']),
                observe_first=rng.random() < 0.2,
                after=after,
            )
        )
    return steps


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


class StepIdTests(unittest.TestCase):
    def test_many_ids_checked_at_once_pass_exactly_when_each_passes_on_its_own(self) -> None:
        valid = ["a", "s1", "label/42", "post:inbox@2026-11-30", "a+b=c", "x" * 256, "9"]
        invalid = ["", "-a", ".a", "a b", "x" * 257, "tâche", "a\n", "\na", "a\nb", "a\n\nb", "a\r", "a\x00"]
        self.assertTrue(are_step_ids(valid))
        self.assertTrue(are_step_ids([]))
        for bad in invalid:
            for position in (0, 3, len(valid)):
                ids = [*valid[:position], bad, *valid[position:]]
                with self.subTest(bad=bad, position=position):
                    self.assertFalse(are_step_ids(ids))
                    with self.assertRaises(InvalidInputError):
                        check_step_id(bad)
        self.assertTrue(are_step_ids([f"s{index}" for index in range(10_000)]))


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

    def test_steps_pickled_and_loaded_again_digest_as_the_originals_do(self) -> None:
        # A plan may travel between processes (multiprocessing, a cache): the copy's digest must
        # pin every static part as the original's does, whether the original was digested first or not.
        contract = RunContract("t1", "g", allowed_actions=("charge", "refund"))
        plans = [
            [Step("s1", "charge", {"amount": 5})],
            [Step("s1", "refund", {"amount": 5}, approval=True)],
            [Step("s1", "charge", {"amount": 5}, key="own"), Step("s2", "charge", {"n": "é"}, after=("s1",))],
        ]
        digested = [pickle.loads(pickle.dumps(plan)) for plan in plans]
        for plan in digested:
            plan_digest(contract, plan)  # parts built before the copy is made
        for original, digested_first in zip(plans, digested):
            fresh = pickle.loads(pickle.dumps(original))
            self.assertEqual(plan_digest(contract, fresh), encoded_afresh(contract, original))
            self.assertEqual(plan_digest(contract, pickle.loads(pickle.dumps(digested_first))), encoded_afresh(contract, original))
        self.assertEqual(len({plan_digest(contract, pickle.loads(pickle.dumps(plan))) for plan in plans}), len(plans))

    def test_observe_first_is_pinned_only_when_set_so_existing_digests_stay(self) -> None:
        plan = [Step("a", "write", {"x": 1}), Step("b", "write", lambda r: {}, approval=True, key="k")]
        # The digest this plan had before steps could be marked observe_first (tasks on disk carry it).
        known = "sha256:bb17c3358ca55b4a6acdee29b72838fc483c97750a5c5c52ad3862c7227b5b77"
        self.assertEqual(plan_digest(self.contract, plan), known)
        self.assertEqual(plan_digest(self.contract, [Step("a", "write", {"x": 1}, observe_first=False), plan[1]]), known)
        self.assertNotEqual(plan_digest(self.contract, [Step("a", "write", {"x": 1}, observe_first=True), plan[1]]), known)
        with self.assertRaises(InvalidInputError):
            Step("a", "write", observe_first=1)  # type: ignore[arg-type]

    def test_the_digest_is_the_sha256_of_one_encoding_of_the_whole_plan_for_varied_plans(self) -> None:
        contracts = [
            self.contract,
            RunContract("task_9.x-y", "goal with \"quotes\", é and \n", non_goals=("n1", "ü"), allowed_actions=("write", "send"),
                        forbidden_actions=("rm",), completion_evidence=()),
        ]  # fmt: skip
        for seed in range(30):
            rng = random.Random(seed)
            steps = varied_steps(rng, rng.randint(1, 40))
            for contract in contracts:
                with self.subTest(seed=seed, task=contract.task_id):
                    self.assertEqual(plan_digest(contract, steps), encoded_afresh(contract, steps))
                    prefixes = plan_prefix_digests(contract, steps)
                    self.assertEqual(prefixes, {encoded_afresh(contract, steps[:length]): length for length in range(1, len(steps) + 1)})
        default_keys_only = [Step(f"s{index}", "write", {"i": index, "t": "é"}) for index in range(1000)]
        self.assertEqual(plan_digest(self.contract, default_keys_only), encoded_afresh(self.contract, default_keys_only))
        self.assertEqual(plan_digest(self.contract, []), encoded_afresh(self.contract, []))

    def test_a_step_s_payload_digest_is_the_digest_of_its_payload_on_both_sides_of_every_size_threshold(self) -> None:
        from longrun.canonical import LARGE_VALUE_BYTES, remembered_encoding
        from longrun.errors import SizeLimitError

        for size in (4096 - 12, 4096 - 11, 4096 - 10, LARGE_VALUE_BYTES - 12, LARGE_VALUE_BYTES - 11, LARGE_VALUE_BYTES - 10):
            step = Step("s", "write", {"t": "x" * size})  # encoded: {"t":"..."} is size + 10 bytes
            static = step.static_payload
            assert static is not None
            with self.subTest(size=size):
                self.assertEqual(static[1], digest_of({"t": "x" * size}))
                self.assertEqual(plan_digest(self.contract, [step]), encoded_afresh(self.contract, [step]))
        large = Step("s", "write", {"t": "x" * LARGE_VALUE_BYTES})
        static = large.static_payload
        assert static is not None
        self.assertIsNotNone(remembered_encoding(static[0]), "a large payload's encoding is kept for the store that writes it")
        with self.assertRaises(SizeLimitError):
            Step("s", "write", {"t": "x" * (16 * 1024 * 1024)})

    def test_a_step_that_cannot_be_encoded_is_named_when_the_plan_is_digested(self) -> None:
        steps = [Step("a", "write", {"x": 1}), Step("b", "wri\udcfete")]
        with self.assertRaises(InvalidInputError) as caught:
            plan_digest(self.contract, steps)
        self.assertIn("plan.steps[1].action holds a lone surrogate", str(caught.exception))
        with self.assertRaises(InvalidInputError) as caught:
            plan_digest(RunContract("t", "go\udcfeal"), steps[:1])
        self.assertIn("plan.contract.goal holds a lone surrogate", str(caught.exception))

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

    def test_every_check_of_a_plan_applies_wherever_the_offending_step_stands(self) -> None:
        many = [Step(f"s{index}", "write") for index in range(500)]
        refused = {
            "a key of its own equal to another step's default key": [*many, Step("x", "write", key="t/s7")],
            "two keys of their own alike": [Step("x", "write", key="k"), *many, Step("y", "write", key="k")],
            "a step id twice, far apart": [*many, Step("s3", "write")],
            "after a later step": [*many[:10], Step("x", "write", after=("s20",)), *many[10:]],
            "after itself": [*many, Step("x", "write", after=("x",))],
            "after an unknown step": [*many, Step("x", "write", after=("s1", "nope"))],
            "not a step, late": [*many, "late"],
        }
        for case, plan in refused.items():
            with self.subTest(case=case), self.assertRaises(InvalidInputError):
                validate_plan(self.contract, plan)  # type: ignore[arg-type]
        accepted = {
            "its own default key, spelled out": [*many, Step("x", "write", key="t/x")],
            "keys of their own that no default key equals": [*many, Step("x", "write", key="other/s7"), Step("y", "write", key="t/s7x")],
            "after earlier steps, and at once": [*many, Step("x", "write", after=("s499", "s0")), Step("y", "write", after=())],
        }
        for case, plan in accepted.items():
            with self.subTest(case=case):
                self.assertEqual(validate_plan(self.contract, plan), tuple(plan))

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
