"""The fault report: runs the groups and prints one line of figures per group (and face).

``python -m longrun.testing.faults --report`` runs every group at the full counts; ``--quick``
the smaller counts the unit tests use, ``--group N`` one group, ``--face F`` one face of the
groups that drive the engine. The last four figures of each line (duplicates, verified effects
lost, silent resets, changed answers) must be zero; the exit status is 0 only if every group passed.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Iterable, Sequence

from . import (
    clock_faults, damaged_files, io_errors, kill_points, lost_records, power_loss, racing_runners, random_kills, retry_limits, stale_epochs,
)  # fmt: skip
from .children import child_main, fork_server_main, race_main
from .results import HEADER, GroupResult, merge
from .task import FACES

__all__ = ["DESCRIPTION", "FACED_GROUPS", "GROUPS", "main", "run_group", "run_groups"]

DESCRIPTION = "The crash-consistency and fault-injection suite: break longrun's promises on purpose, count what broke."

GROUPS: dict[int, Callable[..., GroupResult]] = {
    1: kill_points.run,
    2: random_kills.run,
    3: power_loss.run,
    4: damaged_files.run,
    5: io_errors.run,
    6: racing_runners.run,
    7: stale_epochs.run,
    8: clock_faults.run,
    9: retry_limits.run,
    10: lost_records.run,
}
"""Each group's ``run(base, *, full[, face][, small])`` by its number."""
FACED_GROUPS = frozenset((1, 2, 6, 7, 8, 9))
"""The groups that drive the engine, run once per face; the others test the store alone."""
SMALL_GROUPS = frozenset((1, 2, 4, 6))
"""The groups with a scale below the quick counts (``small``), for the unit tests' default scale."""


def run_group(number: int, *, full: bool, base: str | None = None, face: str = "runner", small: bool = False) -> GroupResult:
    """Run one group in a scratch directory (removed afterwards unless ``base`` is given); the
    groups in ``FACED_GROUPS`` run under ``face``, the others under neither. ``small`` runs the
    groups in ``SMALL_GROUPS`` below the quick counts (every point and file still, fewer seeds and
    offsets); the others run their quick counts. It does not combine with ``full``."""
    if full and small:
        raise ValueError("full and small are two scales: ask for one")
    if face not in FACES:
        raise ValueError(f"face must be one of {FACES}, got {face!r}")
    if face != "runner" and number not in FACED_GROUPS:
        raise ValueError(f"group {number} tests the store alone: it has no {face} face")
    own = base is None
    base = base or tempfile.mkdtemp(prefix=f"longrun-faults-{number}-")
    logger = logging.getLogger("longrun")
    level = logger.level
    logger.setLevel(logging.CRITICAL)  # the damage is on purpose; its warnings would drown the figures
    try:
        group = GROUPS[number]
        options: dict[str, Any] = {"small": True} if small and number in SMALL_GROUPS else {}
        return group(base, full=full, face=face, **options) if number in FACED_GROUPS else group(base, full=full, **options)
    finally:
        logger.setLevel(level)
        if own:
            shutil.rmtree(base, ignore_errors=True)


def run_groups(numbers: Iterable[int], *, full: bool, out: Any = None, faces: Sequence[str] = FACES) -> list[GroupResult]:
    """Run the groups, each faced one once per face in ``faces``; write one line per run to ``out``."""
    out = out or sys.stdout
    results = []
    out.write(HEADER + "\n")
    out.flush()
    for number in numbers:
        for face in faces if number in FACED_GROUPS else ("runner",):
            started = time.monotonic()
            result = run_group(number, full=full, face=face)
            results.append(result)
            out.write(result.line() + f"  {time.monotonic() - started:.0f}s\n")
            out.flush()
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: ``--report`` (see the module docstring), or ``child`` / ``race`` for a child process."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "child":
        return child_main(argv[1:])
    if argv and argv[0] == "race":
        return race_main(argv[1:])
    if argv == ["fork-server"]:
        return fork_server_main()
    parser = argparse.ArgumentParser(prog="python -m longrun.testing.faults", description=DESCRIPTION)
    parser.add_argument("--report", action="store_true", help="run the groups and print one line per group")
    parser.add_argument("--quick", action="store_true", help="the smaller counts the unit tests use")
    parser.add_argument("--group", type=int, action="append", help="run only this group (repeatable)")
    parser.add_argument("--face", choices=FACES, action="append", help="run the faced groups under this face only (repeatable)")
    parser.add_argument("--verbose", action="store_true", help="print each group's notes and failures")
    args = parser.parse_args(argv)
    if not args.report:
        parser.print_help()
        return 2
    groups = args.group or sorted(GROUPS)
    started = time.monotonic()
    print(f"longrun fault-injection report ({'quick' if args.quick else 'full'} counts), Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    results = run_groups(groups, full=not args.quick, faces=args.face or FACES)
    for result in results:
        if args.verbose or not result.ok:
            for note in result.notes:
                print(f"   group {result.group}{f' ({result.face})' if result.face else ''} note: {note}")
            for failure in result.failures:
                print(f"   group {result.group}{f' ({result.face})' if result.face else ''} FAILURE: {failure}")
    total = GroupResult(0, "total")
    for result in results:
        merge(total, result)
    print(f"total: {total.cases} cases, {total.faults} faults injected, {total.duplicates} duplicates, "
          f"{total.lost} verified effects lost, {total.resets} silent resets, "
          f"{total.changed} changed answers ({time.monotonic() - started:.0f} s)")  # fmt: skip
    return 0 if all(result.ok for result in results) else 1

