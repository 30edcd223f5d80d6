"""The runnable examples run from a clean checkout and do what they say."""

from __future__ import annotations

import json
import os
import unittest

from helpers import support


class ExampleTests(support.TempDirTest):
    def run_example(self, name: str):
        result = support.run_python([os.path.join(support.ROOT, "examples", name), "--dir", self.tmp], timeout=120)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        return result.stdout

    def test_resumable_task_survives_a_sigkill_and_repeats_nothing(self) -> None:
        out = self.run_example("resumable_task.py")
        self.assertIn("child exit status -9", out)
        self.assertIn("apac verified by observation", out)
        self.assertEqual(sorted(os.listdir(os.path.join(self.tmp, "reports"))), ["apac.json", "emea.json", "index.json"])

    def test_approval_and_cancel(self) -> None:
        out = self.run_example("approval_and_cancel.py")
        self.assertIn("does not match the request in payload_digest", out)
        self.assertIn("run 3 with the exact approval", out)
        with open(os.path.join(self.tmp, "outbox.jsonl")) as handle:
            keys = [line.split('"key": "')[1].split('"')[0] for line in handle]
        self.assertEqual(keys.count("payout-2026-11/pay"), 1)
        self.assertNotIn("newsletter-48/mail-3", keys)

    def test_agent_loop_survives_a_sigkill_waits_for_approval_and_repeats_nothing(self) -> None:
        out = self.run_example("agent_loop.py")
        self.assertIn("worker exit status -9", out)
        self.assertIn("recovery: agent-1/tool/1 verified by observation", out)
        self.assertIn("longrun approve exit status 0", out)
        self.assertIn("status: done", out)
        self.assertIn("the model was asked 0 more times", out)
        with open(os.path.join(self.tmp, "mailbox.jsonl")) as handle:
            keys = [json.loads(line)["key"] for line in handle]
        self.assertEqual(len(keys), len(set(keys)), "no mail sent twice")
        self.assertIn("agent-1/send-summary", keys)

    def test_inbox_triage_labels_the_inbox_it_fetched_once_and_reports_after_approval(self) -> None:
        out = self.run_example("inbox_triage.py")
        self.assertIn("status: done; result: {'labelled': 3}; report: n=3", out)
        self.assertEqual(sorted(os.listdir(os.path.join(self.tmp, "labels"))), ["m1.json", "m2.json", "m3.json"])
        self.assertEqual(os.listdir(os.path.join(self.tmp, "reports")), ["2026-11-30.json"])


if __name__ == "__main__":
    unittest.main()
