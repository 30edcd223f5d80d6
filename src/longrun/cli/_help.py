"""The help texts of ``longrun --help`` and of each command: the description and the exit-code tables."""

from __future__ import annotations

from ._common import EXIT_CODES_HELP, STORE_HELP

__all__ = [
    "DESCRIPTION",
    "EPILOG",
    "INTERNAL_ERROR",
    "REPAIR_EPILOG",
    "RESUME_EPILOG",
    "SESSION_EPILOG",
    "START_EPILOG",
    "VERIFY_EPILOG",
    "WORKER_EPILOG",
]

INTERNAL_ERROR = 70
"""A bug in longrun (an exception the CLI did not expect), or, for ``resume``, an exception from
the task's own code inside ``run()``; the traceback is printed."""

DESCRIPTION = (
    "Inspect, verify, steer and resume durable longrun tasks, and run checkpointed sessions from a terminal "
    "(init, next, exec, checkpoint, done, stop). The store is a JSON-file store directory, sqlite:PATH or a "
    "postgresql:// URL."
)
EPILOG = (
    STORE_HELP
    + "\n"
    + EXIT_CODES_HELP
    + f"  {INTERNAL_ERROR} internal error (a bug in longrun; resume: the task's own code raised; the traceback is printed)\n"
    + "\nErrors are one line on stderr; with --json, stdout holds only the JSON document.\n"
)

VERIFY_EPILOG = """\
exit codes (whether the run can be resumed safely):
  0  safe to resume now with nobody's help: done (nothing left), new, interrupted or in progress
     (in-flight effects are observed first), a retry backoff, or an approval already in the store
  1  resumable only after an operator acts: awaiting approval, unsafe-to-continue, a damaged
     cancellation record
  2  usage: wrong arguments, unknown task, missing store, unsafe task id
  3  damaged: state, lease record or ledger; the output says whether the backup validates, in
     which case `longrun resume` would recover from it (look first)
  4  the run ended without finishing (cancelled, limits-exhausted, deadline-exceeded, blocked)
"""

RESUME_EPILOG = """\
FUNCTION is called with no arguments and must return a longrun Runner; resume calls its run()
once. MODULE is searched in the --path directories, then the current directory, then sys.path.

exit codes (from the outcome's status):
  0   done
  1   not finished; a later run (or an operator, then a later run) continues it: awaiting-approval,
      retry-scheduled, already-running, lease-lost, unsafe-to-continue, plan-mismatch,
      state-unrecoverable
  2   the target is wrong (bad MODULE:FUNCTION, import error, no such function, it raised or did
      not return a Runner), or the library refused an input (InvalidInputError)
  3   storage error or damaged state raised by the store
  4   the run ended without finishing: cancelled, limits-exhausted, deadline-exceeded, blocked (stop the timer)
  70  run() raised an exception that is not longrun's (the task's own code, or a bug); traceback printed
"""

START_EPILOG = """\
exit codes:
  0   recorded (or already recorded with these arguments); with --run, as resume: done
  1   with --run: not finished; a later run continues it
  2   the target is wrong (bad MODULE:FUNCTION, import error, not a durable function), bad JSON, or the
      task exists with other arguments or another function (nothing changed)
  3   storage error or damaged state
  4   with --run: the run ended without finishing (cancelled, limits-exhausted, deadline-exceeded, blocked)
  70  with --run: the function raised; its traceback is printed
"""

WORKER_EPILOG = """\
exit codes:
  0  drained after SIGTERM or SIGINT: every run under way stopped at a step boundary, committed and
     released its lease
  2  usage: a module that cannot be imported or holds no durable function, a bad --limit
  3  storage error: the store cannot be reached when the worker starts (later outages are logged and
     retried)

LONGRUN_WORKER_CLOCK_OFFSET_S (a testing aid) shifts the wall clock the functions run with.
"""

REPAIR_EPILOG = """\
exit codes:
  0  repaired: the damaged lease record is in the task's quarantine, and a released lease stands at
     the highest epoch the store records elsewhere; the next run gets a newer epoch
  1  refused, nothing changed: the lease record is not damaged, or a process on this machine
     still holds the task's lease (stop it, or let it finish, first)
  2  usage: wrong arguments (what to repair: --lease), unknown task, missing store, unsafe task id
  3  storage error, or a lease record written by a newer longrun (upgrade longrun instead)
"""

SESSION_EPILOG = """\
exit codes:
  0  next: there is an action for the agent (or the task is done); exec, checkpoint: the step is
     recorded (now or before); init: started (or already, with this contract); done: done; stop: recorded
  1  not now: wait, or a person must act (approve, answer, resolve); exec/checkpoint stopped short of
     recording the step; done refused because completion evidence is missing (it names it)
  2  usage or bad input: a bad run contract (with its line), unknown task or step, a step out of order
  3  storage error or damaged state
  4  the run ended without finishing (cancelled, limits-exhausted, deadline-exceeded, blocked)
"""
