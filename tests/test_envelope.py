"""The state envelope: round trip, and every kind of damage detected as a typed error."""

from __future__ import annotations

import json
import unittest

import helpers  # noqa: F401  (puts src on sys.path)
from longrun import CorruptStateError, ForeignStateError, InvalidInputError, RunState, SchemaVersionError
from longrun.approval import ApprovalRequest
from longrun.budget import BudgetCounters
from longrun.envelope import PlanOutline, decode, encode
from longrun.ledger import EffectRecord, EffectState
from longrun.outcome import Evidence


def sample() -> RunState:
    state = RunState(task_id="t", plan_digest="sha256:p", budget=BudgetCounters(created_at=1.0, last_progress_at=1.0), revision=3)
    state.effects["a"] = EffectRecord("t/a", "a", "write", {"n": 1}, "sha256:d", EffectState.VERIFIED, attempts=1, result={"ok": True})
    state.effects["b"] = EffectRecord("t/b", "b", "write", {"n": 2}, "sha256:e", EffectState.STARTED, attempts=2, epoch=4)
    state.approval_requests["b"] = ApprovalRequest("t", "sha256:p", "b", "sha256:e", "write", 1.0, 2.0)
    state.consumed_approvals.append("ap-1")
    state.note_control(Evidence("control", "cancel absent", 1.5))
    return state


class PlanOutlineTests(unittest.TestCase):
    def test_round_trip(self) -> None:
        outline = PlanOutline(tuple(f"s{i}" for i in range(6)), ("render",) + ("mail",) * 4 + ("render",))
        body = outline.to_json()
        self.assertEqual(body, {"steps": [f"s{i}" for i in range(6)], "actions": ["render", "mail", "mail", "mail", "mail", "render"]})
        self.assertEqual(PlanOutline.from_json(json.loads(json.dumps(body))), outline)
        self.assertEqual(len(outline), 6)
        self.assertEqual(PlanOutline.from_json({"steps": [], "actions": []}), PlanOutline((), ()))
        self.assertEqual(PlanOutline(["label/42"], ["mail"]).steps, ("label/42",))  # held as tuples, as read
        self.assertEqual(PlanOutline.from_json({"steps": ["a", "b"], "actions": ["mail", "é-mail"]}).actions, ("mail", "é-mail"))

    BAD = [
        {"steps": ["a", "a"], "actions": ["x", "x"]}, {"steps": ["../a"], "actions": ["x"]},
        {"steps": ["a", "b"], "actions": ["x"]}, {"steps": ["a"], "actions": ["x", "y"]}, {"steps": ["a"], "actions": [""]},
        {"steps": ["a"], "actions": [1]}, {"steps": [1], "actions": ["x"]}, {"steps": "a", "actions": ["x"]},
        {"steps": ["a"], "actions": ["\ud800"]}, {"steps": ["a\nb"], "actions": ["x"]}, {"steps": ["a", "b\n"], "actions": ["x", "y"]},
    ]  # fmt: skip

    def test_one_schema_refuses_a_malformed_outline_when_read_and_when_built(self) -> None:
        for body in [[], {"steps": ["a"]}, {"steps": ["a"], "actions": ["x"], "extra": 1}, *self.BAD]:
            with self.subTest(body=body), self.assertRaises(CorruptStateError):
                PlanOutline.from_json(body)
        for body in self.BAD:
            with self.subTest(built=body), self.assertRaises(InvalidInputError):
                PlanOutline(body["steps"], body["actions"])  # type: ignore[arg-type]

    def test_a_state_without_an_outline_encodes_as_before_and_one_with_it_round_trips(self) -> None:
        state = sample()
        self.assertNotIn("plan_outline", state.to_json())
        state.plan_outline = PlanOutline(("a", "b", "c"), ("write", "write", "mail"))
        again = decode(encode(state), expected_task="t")
        self.assertEqual(again.plan_outline, state.plan_outline)
        self.assertEqual(again.to_json(), state.to_json())
        body = state.to_json()
        body["plan_outline"] = {"steps": ["a"], "actions": []}
        with self.assertRaises(CorruptStateError):
            RunState.from_json(body)
        body["plan_outline"] = ["a"]
        with self.assertRaises(CorruptStateError):
            RunState.from_json(body)

    def test_a_state_holding_something_else_as_its_outline_is_refused_before_a_commit(self) -> None:
        state = sample()
        state.plan_outline = {"steps": ["a"], "actions": ["x"]}  # type: ignore[assignment]
        with self.assertRaises(InvalidInputError):
            state.check_header()


class EnvelopeTests(unittest.TestCase):
    def test_round_trip(self) -> None:
        state = sample()
        again = decode(encode(state), expected_task="t")
        self.assertEqual(again.to_json(), state.to_json())
        self.assertEqual(again.completed_steps, ["a"])

    def test_every_truncation_is_detected(self) -> None:
        data = encode(sample())
        for end in range(len(data) - 1):  # the final newline is not part of the checksummed document
            with self.subTest(end=end), self.assertRaises(CorruptStateError):
                decode(data[:end])

    def test_every_single_bit_flip_is_detected_or_harmless(self) -> None:
        data = encode(sample())
        original = decode(data).to_json()
        for index in range(len(data)):
            for bit in (0x01, 0x20, 0x80):
                damaged = bytearray(data)
                damaged[index] ^= bit
                try:
                    state = decode(bytes(damaged))
                except CorruptStateError:
                    continue
                # JSON allows a few flips that keep meaning (whitespace); the content must be identical.
                self.assertEqual(state.to_json(), original, f"byte {index} bit {bit:#x} changed the state silently")

    def test_schema_version_format_and_foreign_task(self) -> None:
        document = json.loads(encode(sample()))
        with self.assertRaises(SchemaVersionError):
            decode(json.dumps({**document, "schema_version": 99}).encode())
        with self.assertRaises(CorruptStateError):
            decode(json.dumps({**document, "format": "other"}).encode())
        with self.assertRaises(ForeignStateError):
            decode(encode(sample()), expected_task="someone-else")

    def test_wrong_field_types_with_a_valid_checksum_are_typed_errors(self) -> None:
        from longrun.canonical import canonical_bytes, sha256_hex

        body = sample().to_json()
        mutations = [
            ("revision", "3"),
            ("revision", 0),
            ("status", "finished"),
            ("effects", {}),
            ("budget", None),
            ("completed_steps", ["b"]),
            ("lease", []),
            ("reconcile_all", "no"),
        ]
        for field, value in mutations:
            broken = {**body, field: value}
            data = canonical_bytes(
                {"format": "longrun.state", "schema_version": 1, "checksum": "sha256:" + sha256_hex(canonical_bytes(broken)), "state": broken}
            )
            with self.subTest(field=field), self.assertRaises(CorruptStateError):
                decode(data)

    def test_non_json_and_non_object_documents(self) -> None:
        for data in (b"", b"\xff\xfe", b"[]", b"null", b"{" * 5000 + b"}" * 5000, b'{"format": "longrun.state"}'):
            with self.subTest(data=data[:20]), self.assertRaises(CorruptStateError):
                decode(data)


if __name__ == "__main__":
    unittest.main()


class EncodingTests(unittest.TestCase):
    def test_the_envelope_is_the_canonical_encoding_of_its_fields_with_the_body_encoded_once(self) -> None:
        from longrun.canonical import canonical_bytes, sha256_hex
        from longrun.envelope import FORMAT, SCHEMA_VERSION

        state = RunState(task_id="t", plan_digest="sha256:" + "0" * 64, budget=BudgetCounters(created_at=1.0), created_at=1.0, updated_at=2.0, revision=1)
        for step_id, payload in (("small", {"n": 1, "text": "caf\u00e9 \u2603"}), ("long", {"blob": "x" * 40_000, "quote": '"\\'})):
            state.effects[step_id] = EffectRecord(f"t/{step_id}", step_id, "write", payload, "sha256:" + "1" * 64, EffectState.PLANNED, updated_at=3.0)
        body = state.to_json()
        expected = canonical_bytes({"format": FORMAT, "schema_version": SCHEMA_VERSION, "checksum": "sha256:" + sha256_hex(canonical_bytes(body)), "state": body})
        self.assertEqual(encode(state), expected + b"\n")
        self.assertEqual(decode(encode(state)).to_json(), body)
