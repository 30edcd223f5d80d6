"""Shared test helpers: the repository's paths, child processes with longrun importable, a test case
with a temporary directory, a ledger that counts reads, and captured warnings (``ExpectedWarnings``)."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from typing import Any

from . import SRC

HELPERS = os.path.dirname(os.path.abspath(__file__))
"""This directory: the programs tests start as child processes live here."""
TESTS = os.path.dirname(HELPERS)
ROOT = os.path.dirname(TESTS)
"""The repository's root."""

CHILD = os.path.join(HELPERS, "child_runner.py")



def _memory_tmp(path: str = "/dev/shm", *, need_bytes: int = 1 << 30) -> str | None:
    # A container's default /dev/shm is 64 MB: too small for the suite's scratch data, so a memory
    # file system is used only where it has room (a gigabyte free); the disk serves otherwise.
    if not (os.path.isdir(path) and os.access(path, os.W_OK)):
        return None
    stats = os.statvfs(path)
    return path if stats.f_bavail * stats.f_frsize >= need_bytes else None


MEMORY_TMP = _memory_tmp()
"""A memory file system for the tests' scratch directories, where there is one: a SIGKILL leaves
the page cache intact, so the kill tests need no disk flush to be honest (power loss is modelled
apart, ``longrun.testing.faults.power_loss_model``), and thousands of commits then cost no fsync waits."""


def child_env() -> dict[str, str]:
    """The environment for a child Python process that must import longrun from ``src``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_python(args: list[str], *, timeout: float = 60.0, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python ARGS`` with longrun importable; capture text output."""
    return subprocess.run(
        [sys.executable, *args], env=child_env(), capture_output=True, text=True, timeout=timeout, input=input, cwd=ROOT
    )


class TempDirTest(unittest.TestCase):
    """A test case with a fresh temporary directory in ``self.tmp``."""

    in_memory = True
    """Whether ``self.tmp`` is on a memory file system (``MEMORY_TMP``, where there is one), as it is
    unless a test case says otherwise: what the tests check is what the store's code does (its
    flushes are counted and modelled, ``longrun.testing.faults``), not how fast a disk makes them
    durable, and each flush to a disk costs a wait of milliseconds that adds up to minutes over the
    suite's commits."""

    def setUp(self) -> None:
        super().setUp()
        self.tmp = tempfile.mkdtemp(prefix="longrun-test-", dir=MEMORY_TMP if self.in_memory else None)
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def path(self, *parts: str) -> str:
        return os.path.join(self.tmp, *parts)


class ReadCountingDict(dict):  # type: ignore[type-arg]
    """A ledger mapping that counts the records read from it by iteration."""

    read = 0

    def _counted(self, items: Any) -> Any:
        for item in items:
            self.read += 1
            yield item

    def __iter__(self) -> Any:
        return self._counted(super().__iter__())

    def __reversed__(self) -> Any:
        return self._counted(super().__reversed__())

    def keys(self) -> Any:
        self.read += len(self)  # a view: counted as reading every record (a set operation does)
        return super().keys()

    def items(self) -> Any:
        self.read += len(self)
        return super().items()

    def values(self) -> Any:
        self.read += len(self)
        return super().values()


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class ExpectedWarnings:
    """For tests that damage state on purpose, thousands of times: the library's warnings are
    captured instead of printed, and each must be one the test provokes (``patterns``), which the
    test checks when it ends. An unexpected warning fails the test; so does none at all, when
    ``at_least_one`` is set."""

    def __init__(self, case: unittest.TestCase, *patterns: str, at_least_one: bool = True):
        self._case = case
        self._patterns = [re.compile(pattern) for pattern in patterns]
        self._at_least_one = at_least_one
        self._handler = _Collect()
        self._logger = logging.getLogger("longrun")

    def start(self) -> None:
        self._propagate = self._logger.propagate
        self._logger.addHandler(self._handler)
        self._logger.propagate = False
        self._case.addCleanup(self._stop)

    def _stop(self) -> None:
        self._logger.removeHandler(self._handler)
        self._logger.propagate = self._propagate
        warnings = [record.getMessage() for record in self._handler.records if record.levelno >= logging.WARNING]
        unexpected = [text for text in warnings if not any(pattern.search(text) for pattern in self._patterns)]
        self._case.assertEqual(unexpected[:5], [], "warnings this test did not provoke")
        if self._at_least_one:
            self._case.assertTrue(warnings, "the damage this test made was not reported in the log")
