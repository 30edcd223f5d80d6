"""``python -m longrun demo``: a real SIGKILL of a worker between effect and checkpoint, then a resume."""

import json
import os
import re
import unittest

from helpers.cli_process import run_longrun
from helpers.support import TempDirTest, run_python

from longrun.testing import read_outbox

TASK = "newsletter-issue-42"
KEYS = [f"{TASK}/{step}" for step in ("render", "upload", "send-list-a", "send-list-b", "archive")]


class DemoTest(TempDirTest):
    def test_demo_kills_the_worker_and_resumes_exactly_once(self) -> None:
        result = run_python(["-m", "longrun", "demo"])
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        out = result.stdout
        self.assertIn("worker died by SIGKILL (returncode -9)", out)
        self.assertRegex(out, r"send-list-a\s+started\s+attempts 1\s+<- applied in the outbox, not recorded")
        self.assertIn("send-list-a on resume: apply calls 0, observe calls 1", out)
        for key in KEYS:
            self.assertRegex(out, rf"{re.escape(key)}\s+x1\n")
            self.assertRegex(out, rf"{re.escape(key)}\s+verified\s+1\s+sha256:[0-9a-f]{{12}}")
        self.assertIn("observations (", out)
        self.assertIn("inferences (", out)
        self.assertIn("unknowns (0)", out)
        self.assertIn("next action: nothing: every required effect is verified", out)
        self.assertEqual(out.count("PASS"), 5)
        self.assertNotIn("FAIL", out)
        self.assertTrue(out.rstrip().endswith("demo passed"))
        self.assertLess(len(out.splitlines()), 80)
        self.assertEqual(result.stderr, "")

    def test_demo_keep_leaves_a_store_the_cli_can_inspect(self) -> None:
        root = self.path("demo")
        result = run_longrun(["demo", "--keep", root])
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        lines = read_outbox(os.path.join(root, "outbox.jsonl"))
        self.assertEqual(sorted(line["key"] for line in lines), sorted(KEYS))
        status = run_longrun(["status", os.path.join(root, "store"), TASK, "--json"])
        self.assertEqual(status.returncode, 0, status.stderr)
        data = json.loads(status.stdout)
        self.assertEqual(data["status"], "done")
        self.assertEqual([(e["key"], e["state"], e["attempts"]) for e in data["effects"]], [(k, "verified", 1) for k in KEYS])
        self.assertEqual(data["store_lease"]["epoch"], 2, "the resume must have taken over the dead worker's lease")
        archive = data["effects"][-1]["payload"]
        self.assertEqual(archive["send_receipts"], [2, 3], "the archive payload is computed from the sends' results")

    def test_demo_keep_refuses_a_non_empty_directory(self) -> None:
        with open(self.path("something"), "w") as handle:
            handle.write("x")
        result = run_longrun(["demo", "--keep", self.tmp])
        self.assertEqual(result.returncode, 2)
        self.assertIn("new or empty directory", result.stderr)
        self.assertEqual(os.listdir(self.tmp), ["something"])


if __name__ == "__main__":
    unittest.main()
