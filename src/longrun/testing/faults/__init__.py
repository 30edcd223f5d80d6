"""The crash-consistency and fault-injection suite: break longrun's promises on purpose, count what broke.

Run it with ``python -m longrun.testing.faults --report`` (from a checkout: ``PYTHONPATH=src``). It
prints one line per group: cases run, faults injected, duplicated effects, verified effects lost,
silent resets, changed answers (a recorded call or answer that a later run returns differently;
the last four must be zero). ``--quick`` runs the smaller counts the unit tests use;
``--group N`` runs one group. The unit tests (``tests/test_faults_*.py``) run each group at the quick
scale and assert every figure; ``LONGRUN_FAULTS_FULL=1`` makes them run the full counts.

This is the project's own suite, not an API: what users import to test their code is in
``longrun.testing`` (``FaultyIO`` among it). One module per group, named by what it breaks:

====  ==================  ==================================================================
  #   module              what it breaks
====  ==================  ==================================================================
  1   ``kill_points``     a runner process, SIGKILLed by itself at each named crash point
  2   ``random_kills``    a runner process, SIGKILLed from outside at random moments
  3   ``power_loss``      the disk: every prefix of a recorded history under a power-loss model
  4   ``damaged_files``   a task's files: cut at every byte, a bit flipped in every byte
  5   ``io_errors``       the N-th I/O call, failed with ENOSPC, EIO or EACCES
  6   ``racing_runners``  exclusion: racing processes SIGKILLed and frozen past their lease
  7   ``stale_epochs``    fencing: every mutating operation under a replaced lease
  8   ``clock_faults``    wall clocks that jump, freeze or run at the wrong rate
  9   ``retry_limits``    the attempt limit, with a process killed during every attempt
 10   ``lost_records``    a finished task's blobs, journal lines and rows: calls and answers lost
====  ==================  ==================================================================

Two faces. The groups that drive the engine (1, 2, 6, 7, 8, 9: ``FACED_GROUPS``) run once per
face, one line each: ``runner``, the task as a declared plan (``Runner``), and ``durable``, the same
task as a durable function (see ``task``). ``--face`` picks one. For the durable face the checks
add: every call's recorded result is replayed, never recomputed once its record is committed (a
call runs again only if the process died between its start and the commit that records its value,
so invocations <= calls + kills), and the function's return value is recorded when the task is done.

What they share, each in its own module: the named crash points and the I/O that names them
(``points``), the task (``task``), its child processes (``children``), the checks made after the
faults (``checks``), the histories the store groups damage (``store_history``), the power-loss
model (``power_loss_model``), a group's figures (``results``) and the report (``report``).

Not covered: faults in the database stores' own storage (SQLite and PostgreSQL have their own
suites), and power loss on a real machine (the model in ``power_loss_model`` stands in for it).
"""

from .._faulty_io import FaultyIO
from .checks import call_counts, check_calls, check_race_log, check_revisions
from .points import BLOB_POINTS, CALL_POINTS, POINTS, CrashPointIO, points_for
from .report import FACED_GROUPS, GROUPS, main, run_group, run_groups
from .results import GroupResult, full_scale
from .task import FACES, call_log_of, function_result

__all__ = [
    "BLOB_POINTS", "CALL_POINTS", "FACED_GROUPS", "FACES", "GROUPS", "POINTS", "CrashPointIO", "FaultyIO", "GroupResult", "call_counts",
    "call_log_of", "check_calls", "check_race_log", "check_revisions", "full_scale", "function_result", "main", "points_for",
    "run_group", "run_groups",
]  # fmt: skip
