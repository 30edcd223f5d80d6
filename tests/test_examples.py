"""The runnable examples run from a clean checkout and do what they say."""

from __future__ import annotations

import os
import unittest

import support


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


if __name__ == "__main__":
    unittest.main()
