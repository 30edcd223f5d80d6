"""The approval gate: only an exact, unexpired, unconsumed approval authorizes; broader is refused."""

from __future__ import annotations

import unittest

import helpers  # noqa: F401  (puts src on sys.path)
from longrun.approval import Approval, ApprovalRequest, GateVerdict, evaluate_gate, refuse_second
from longrun.errors import ApprovalWaitingError, InvalidInputError
from longrun.control import ControlRecord

REQUEST = ApprovalRequest("t", "sha256:plan", "s1", "sha256:payload", "send", requested_at=0.0, expires_at=100.0)


def approval(**changes) -> ControlRecord:
    body = Approval.for_request(REQUEST, approval_id="ap", approver="ops", granted_at=1.0, expires_at=50.0).to_json()
    body.update(changes)
    return ControlRecord(name=f"{body.get('approval_id')}.json", body=body, digest="sha256:x")


class GateTests(unittest.TestCase):
    def test_exact_approval_is_granted(self) -> None:
        decision = evaluate_gate(REQUEST, [approval()], set(), now=10.0)
        self.assertIs(decision.verdict, GateVerdict.GRANTED)
        self.assertEqual(decision.approval.approval_id, "ap")

    def test_each_scope_field_must_match(self) -> None:
        for field in ("task_id", "plan_digest", "payload_digest", "action"):
            with self.subTest(field=field):
                decision = evaluate_gate(REQUEST, [approval(**{field: "other"})], set(), now=10.0)
                self.assertIs(decision.verdict, GateVerdict.AWAITING)
                self.assertIn(field, decision.reasons[0])

    def test_of_several_exact_approvals_the_first_granted_is_used_whatever_order_they_are_read_in(self) -> None:
        records = [approval(approval_id="b", granted_at=2.0), approval(approval_id="c", granted_at=1.0), approval(approval_id="a", granted_at=2.0)]
        for order in (records, records[::-1], records[1:] + records[:1]):
            with self.subTest(order=[raw.name for raw in order]):
                decision = evaluate_gate(REQUEST, order, set(), now=10.0)
                self.assertEqual(decision.approval.approval_id, "c", "the earliest granted")
        tied = evaluate_gate(REQUEST, [approval(approval_id="b"), approval(approval_id="a")], set(), now=10.0)
        self.assertEqual(tied.approval.approval_id, "a", "a tie goes to the smaller id")
        self.assertIn("approval b also matches; a, granted first, is used", tied.reasons)
        consumed = evaluate_gate(REQUEST, records, {"c"}, now=10.0)
        self.assertEqual(consumed.approval.approval_id, "a", "then the next one, once the first is used")

    def test_a_second_approval_of_a_request_is_refused_before_it_is_written(self) -> None:
        refuse_second(REQUEST, [approval(approval_id="old", expires_at=5.0)], set(), now=10.0)  # expired: no longer waiting
        refuse_second(REQUEST, [approval(approval_id="used")], {"used"}, now=10.0)  # consumed
        refuse_second(REQUEST, [approval(step_id="s2")], set(), now=10.0)  # another step's
        with self.assertRaises(ApprovalWaitingError) as raised:
            refuse_second(REQUEST, [approval(approval_id="late", granted_at=3.0), approval(approval_id="first")], set(), now=10.0)
        self.assertEqual(raised.exception.waiting, "first")
        self.assertIsInstance(raised.exception, InvalidInputError)
        self.assertIn("an approval (approval first, by ops), and 1 more waiting", str(raised.exception))

    def test_an_approval_for_another_step_is_ignored(self) -> None:
        decision = evaluate_gate(REQUEST, [approval(step_id="s2")], set(), now=10.0)
        self.assertIs(decision.verdict, GateVerdict.AWAITING)

    def test_expired_consumed_missing_and_malformed_keep_awaiting(self) -> None:
        cases = {
            "expired": ([approval()], set(), 60.0),
            "consumed": ([approval()], {"ap"}, 10.0),
            "missing": ([], set(), 10.0),
            "unreadable": ([ControlRecord("x.json", error="not valid JSON")], set(), 10.0),
            "not an object": ([ControlRecord("x.json", body=[1, 2])], set(), 10.0),
            "wrong type": ([approval(expires_at="tomorrow")], set(), 10.0),
        }
        for name, (records, consumed, now) in cases.items():
            with self.subTest(case=name):
                decision = evaluate_gate(REQUEST, records, consumed, now)
                self.assertIs(decision.verdict, GateVerdict.AWAITING)
                self.assertTrue(decision.reasons)

    def test_broader_than_requested_is_refused_even_beside_an_exact_one(self) -> None:
        for change in ({"payload_digest": "*"}, {"step_id": "*"}, {"action": ""}, {"plan_digest": None}, {"expires_at": None}):
            with self.subTest(change=change):
                decision = evaluate_gate(REQUEST, [approval(approval_id="wide", **change), approval()], set(), now=10.0)
                self.assertIs(decision.verdict, GateVerdict.REFUSED)
                self.assertIn("broader", decision.reasons[0])


if __name__ == "__main__":
    unittest.main()
