"""Cancellation records and their judgement, directly (the runner's use of them is in
``test_runner.CancellationTests``; each verdict's basic case in ``test_rules``)."""

from __future__ import annotations

import unittest

import helpers  # noqa: F401  (puts src on sys.path)
from longrun import Cancellation, CorruptStateError, InvalidInputError, SchemaVersionError
from longrun.cancellation import judge_cancellation
from longrun.control import ControlRecord, RefusedRecord


class RecordTests(unittest.TestCase):
    def test_round_trip_with_and_without_a_signature(self) -> None:
        for record in (Cancellation("t", 1_700_000_000.5, "ops", "stop ✋"), Cancellation("t", 5, "ops", "stop", signature="hmac-sha256:k1:ab")):
            with self.subTest(signed=record.signature is not None):
                self.assertEqual(Cancellation.from_json(record.to_json()), record)

    def test_the_signature_covers_every_field_but_itself_with_the_time_as_a_float(self) -> None:
        signed = Cancellation("t", 5, "ops", "stop", signature="hmac-sha256:k1:ab")
        fields = signed.signed_fields()
        self.assertEqual(fields, {"task_id": "t", "requested_at": 5.0, "requested_by": "ops", "reason": "stop"})
        self.assertIsInstance(fields["requested_at"], float, "5 and 5.0 must sign the same")
        self.assertEqual(fields, Cancellation("t", 5.0, "ops", "stop").signed_fields())
        self.assertNotEqual(fields, Cancellation("t", 5.0, "ops", "stop!").signed_fields())

    def test_a_record_without_a_schema_version_is_version_1_and_another_version_is_refused(self) -> None:
        body = Cancellation("t", 1.0, "ops", "stop").to_json()
        del body["schema_version"]
        self.assertEqual(Cancellation.from_json(body).reason, "stop")
        with self.assertRaises(SchemaVersionError):
            Cancellation.from_json({**body, "schema_version": 2})

    def test_malformed_records_are_corrupt_and_bad_ones_are_refused_when_built(self) -> None:
        body = Cancellation("t", 1.0, "ops", "stop").to_json()
        for change in ({"requested_at": "now"}, {"task_id": "../t"}, {"reason": None}, {"urgency": "high"}, {"signature": 7}):
            with self.subTest(change=change), self.assertRaises(CorruptStateError):
                Cancellation.from_json({**body, **change})
        missing = dict(body)
        del missing["requested_by"]
        with self.assertRaises(CorruptStateError):
            Cancellation.from_json(missing)
        for bad in (dict(task_id="a/b"), dict(requested_at=float("nan")), dict(requested_by=3)):
            with self.subTest(built=bad), self.assertRaises(InvalidInputError):
                Cancellation(**{**dict(task_id="t", requested_at=1.0, requested_by="ops", reason="stop"), **bad})  # type: ignore[arg-type]


class JudgementTests(unittest.TestCase):
    def body(self, task_id: str = "t") -> object:
        return Cancellation(task_id, 1.0, "ops", "stop").to_json()

    def test_a_refused_record_is_refused_even_if_its_body_is_a_valid_cancellation(self) -> None:
        judged = judge_cancellation(RefusedRecord(name="cancel.json", body=self.body(), error="bad signature"), "t")
        self.assertEqual(judged.verdict, "refused")
        self.assertIsNone(judged.record, "nobody's unverified word is taken as the record")

    def test_a_record_read_with_an_error_is_damaged_even_if_a_body_came_with_it(self) -> None:
        judged = judge_cancellation(ControlRecord(name="cancel.json", body=self.body(), error="unreadable: EIO"), "t")
        self.assertEqual(judged.verdict, "damaged")
        self.assertIn("EIO", judged.problem or "")

    def test_a_record_for_another_task_is_damaged_and_says_whose_it_is(self) -> None:
        judged = judge_cancellation(ControlRecord(name="cancel.json", body=self.body("other")), "t")
        self.assertEqual(judged.verdict, "damaged")
        self.assertEqual(judged.record and judged.record.task_id, "other")

    def test_only_a_valid_record_for_this_task_cancels(self) -> None:
        for raw in (ControlRecord(name="cancel.json"), ControlRecord(name="cancel.json", body=[1, 2]), ControlRecord(name="cancel.json", body="stop")):
            with self.subTest(body=raw.body):
                self.assertEqual(judge_cancellation(raw, "t").verdict, "damaged")
        cancelled = judge_cancellation(ControlRecord(name="cancel.json", body=self.body()), "t")
        self.assertEqual((cancelled.verdict, cancelled.problem), ("cancelled", None))


if __name__ == "__main__":
    unittest.main()
