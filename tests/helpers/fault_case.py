"""The test case the fault-group tests share: run one group of ``longrun.testing.faults``, assert its figures."""

from __future__ import annotations

import unittest

from longrun.testing import faults


class FaultGroupCase(unittest.TestCase):
    def run_group(self, number: int, face: str = "runner") -> faults.GroupResult:
        """Run group ``number`` under ``face`` (quick counts unless ``LONGRUN_FAULTS_FULL=1``): faults were
        injected, nothing was applied twice, lost, silently reset or answered differently, and nothing else broke."""
        result = faults.run_group(number, full=faults.full_scale(), face=face)
        self.assertEqual(result.face, face if number in faults.FACED_GROUPS else "")
        details = "\n".join(result.failures + result.notes)
        self.assertGreater(result.cases, 0, details)
        self.assertGreater(result.faults, 0, details)
        self.assertEqual((result.duplicates, result.lost, result.resets, result.changed), (0, 0, 0, 0), details)
        self.assertEqual(result.failures, [], details)
        return result
