"""The test case the fault-group tests share: run one group of ``longrun.testing.faults``, assert its figures."""

from __future__ import annotations

import shutil
import tempfile
import unittest

from longrun.testing import faults

from . import scale, support


def small_scale() -> bool:
    """Whether the groups run below their quick counts: the suite's default scale, unless
    ``LONGRUN_TEST_SCALE=full`` (the quick counts) or ``LONGRUN_FAULTS_FULL=1`` (the full ones)."""
    return not scale.FULL and not faults.full_scale()


class FaultGroupCase(unittest.TestCase):
    def run_group(self, number: int, face: str = "runner") -> faults.GroupResult:
        """Run group ``number`` under ``face`` (``small_scale()``, the quick counts, or the full ones under
        ``LONGRUN_FAULTS_FULL=1``): faults were injected, nothing was applied twice, lost, silently
        reset or answered differently, and nothing else broke. The scratch directory is in memory where it can be (``MEMORY_TMP``)."""
        base = tempfile.mkdtemp(prefix=f"longrun-faults-{number}-", dir=support.MEMORY_TMP)
        self.addCleanup(shutil.rmtree, base, ignore_errors=True)
        result = faults.run_group(number, full=faults.full_scale(), small=small_scale(), base=base, face=face)
        self.assertEqual(result.face, face if number in faults.FACED_GROUPS else "")
        details = "\n".join(result.failures + result.notes)
        self.assertGreater(result.cases, 0, details)
        self.assertGreater(result.faults, 0, details)
        self.assertEqual((result.duplicates, result.lost, result.resets, result.changed), (0, 0, 0, 0), details)
        self.assertEqual(result.failures, [], details)
        return result
