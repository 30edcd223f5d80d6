"""The argument parser and ``main``: turn a command line into one command call and an exit code.

Guarantees: ``main`` returns an int and never raises for operator mistakes or storage trouble;
each error is one ``longrun <command>: error: ...`` line on stderr with the exit code from
``_common.ExitCode`` (argparse's own usage errors exit 2 as well, with the command's usage). Output
meant for the operator goes to stdout (with ``--json``, only the JSON document); warnings, prompts
and errors go to stderr. The library's log records are routed to stderr only for the duration of
the call. A traceback is printed only for an exception nobody expected (exit 70): a bug in
longrun, or, under ``resume``, the task's own code raising inside ``run()``.

``--json`` may be given before the command (``longrun --json status ...``) or after it.

The store of every command that takes one is named once: as the ``STORE`` argument before
``TASK``, or with ``--store SPEC``. Both at once are accepted only when they agree.

Every argument is checked before anything is opened (a usage error, exit 2): paths must be free
of NUL bytes and at most ``MAX_PATH_BYTES``; ``TASK`` and ``--step`` must be safe
names; ``--ttl`` a finite number of seconds in (0, ``MAX_TTL_S``]; ``--approver``, ``--by`` and
``--reason`` non-empty text without control characters, at most ``MAX_NAME_CHARS`` and
``MAX_REASON_CHARS`` characters, so that a record the CLI writes is one every reader accepts.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
import sys
import traceback
from typing import Sequence, TextIO

from .. import __version__
from ..contract import check_step_id
from ..errors import CorruptStateError, InvalidInputError, LongrunError, StorageError
from ..protocols import Store
from ._inspect import LS_STATUSES
from ._common import (
    EXIT_CODES_HELP,
    STORE_HELP,
    CliError,
    ExitCode,
    TaskCodeError,
    checked_task,
    close_store,
    exit_code_for,
    login_name,
    open_store,
    store_label,
)

__all__ = ["build_parser", "main"]

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
  4  the run ended without finishing (cancelled, limits-exhausted, blocked)
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
  4   the run ended without finishing: cancelled, limits-exhausted, blocked (stop the timer)
  70  run() raised an exception that is not longrun's (the task's own code, or a bug); traceback printed
"""

START_EPILOG = """\
exit codes:
  0   recorded (or already recorded with these arguments); with --run, as resume: done
  1   with --run: not finished; a later run continues it
  2   the target is wrong (bad MODULE:FUNCTION, import error, not a durable function), bad JSON, or the
      task exists with other arguments or another function (nothing changed)
  3   storage error or damaged state
  4   with --run: the run ended without finishing (cancelled, limits-exhausted, blocked)
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

_SESSION_COMMANDS = ("init", "next", "exec", "checkpoint", "done", "stop")
_STORE_COMMANDS = (
    "status", "history", "verify", "approve", "answer", "cancel", "repair", "ls", "watch", "console", "worker", "workers",
    *_SESSION_COMMANDS,
)  # fmt: skip
_TASK_COMMANDS = ("status", "history", "verify", "approve", "answer", "cancel", "repair", "watch", "init", "next", "done", "stop")
_STEP_COMMANDS = ("exec", "checkpoint")
"""Commands with a STEP after TASK (STORE must come first, or be given with --store)."""

SESSION_EPILOG = """\
exit codes:
  0  next: there is an action for the agent (or the task is done); exec, checkpoint: the step is
     recorded (now or before); init: started (or already, with this contract); done: done; stop: recorded
  1  not now: wait, or a person must act (approve, answer, resolve); exec/checkpoint stopped short of
     recording the step; done refused because completion evidence is missing (it names it)
  2  usage or bad input: a bad run contract (with its line), unknown task or step, a step out of order
  3  storage error or damaged state
  4  the run ended without finishing (cancelled, limits-exhausted, blocked)
"""


MAX_TTL_S = 10 * 366 * 86_400.0
"""The longest ``--ttl``: ten years. Longer is a typo, and a time far enough out cannot be shown."""
MAX_NAME_CHARS = 256
"""``--approver`` and ``--by``."""
MAX_REASON_CHARS = 4096
"""``--reason``: with the other fields, a record stays far below the readers' 64 KiB limit."""
MAX_PATH_BYTES = 4096
"""A path argument (PATH_MAX on Linux)."""
_CONTROL_CHARACTERS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _priority(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not -(2**31) <= value < 2**31:
        raise argparse.ArgumentTypeError("a priority is an integer in [-2147483648, 2147483647]")
    return value


def _count(low: int, high: int):  # type: ignore[no-untyped-def]
    def check(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in [{low}, {high}]")
        return value

    return check


def _action_limit(text: str) -> tuple[str, int]:
    action, separator, count = text.rpartition("=")
    if not separator or not action:
        raise argparse.ArgumentTypeError(f"{text!r} is not ACTION=K (for example api.send=4)")
    try:
        limit = int(count)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: K must be an integer") from None
    if not 1 <= limit <= 10_000:
        raise argparse.ArgumentTypeError(f"{text!r}: K must be in [1, 10000]")
    return action, limit


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} must be a positive number of seconds")
    if value > MAX_TTL_S:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is more than ten years ({MAX_TTL_S:.0f} seconds)")
    return value


def _text_argument(limit: int, what: str):  # type: ignore[no-untyped-def]
    """An argparse type for free text that goes into a record: non-empty, bounded, printable."""

    def check(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError("must not be empty")
        if len(text) > limit:
            raise argparse.ArgumentTypeError(f"{what} is {len(text)} characters, over the limit of {limit}")
        if _CONTROL_CHARACTERS.search(text) or not _encodable(text):
            raise argparse.ArgumentTypeError(f"{what} holds a control character or bytes that are not text")
        return text

    return check


_non_empty = _text_argument(MAX_NAME_CHARS, "the name")
_reason = _text_argument(MAX_REASON_CHARS, "the reason")


def _encodable(text: str) -> bool:
    """False for text holding a lone surrogate (how Python passes on argument bytes that are not UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _path(text: str) -> str:
    """An argparse type for a path: no NUL byte (which no system call takes), bounded. An empty one
    passes, so that the command says what it needed there."""
    if "\0" in text or len(os.fsencode(text)) > MAX_PATH_BYTES:
        raise argparse.ArgumentTypeError(f"{text[:80]!r} is not a usable path")
    return text


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} must be at least 1")
    return value


def _since(text: str) -> str:
    from ._inspect import parse_since

    try:
        parse_since(text, 0.0)
    except InvalidInputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _interval(text: str) -> float:
    value = _positive_seconds(text)
    if value < 0.05 or value > 3600:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: the interval must be between 0.05 and 3600 seconds")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a port number (0-65535)")
    return value


def _step_id(text: str) -> str:
    try:
        return check_step_id(text)
    except InvalidInputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_module_options(command: argparse.ArgumentParser) -> None:
    """``--path`` and ``--json`` of the commands that import a task's code and run it once."""
    command.add_argument(
        "--path", metavar="DIR", type=_path, action="append", default=[], help="search DIR for MODULE first (repeatable)"
    )
    _add_json(command, "the outcome (RunOutcome.to_json())")


def _add_authority_options(command: argparse.ArgumentParser, record: str) -> None:
    command.add_argument(
        "--sign-key",
        metavar="FILE",
        type=_path,
        help=f"sign the {record} with HMAC-SHA256 under the key in FILE (mode 0600, at least 32 bytes), "
        "for a runner that accepts only signed records",
    )
    command.add_argument(
        "--control-root",
        metavar="DIR",
        type=_path,
        help=f"write the {record} under DIR (an existing control area read by a strict FileControlSource) "
        "instead of into the store",
    )


def _add_store(command: argparse.ArgumentParser, *, task: bool) -> None:
    command.add_argument(
        "store", metavar="STORE", nargs="?", type=_path, help="the store: a directory, sqlite:PATH or postgresql://... (or use --store)"
    )
    if task:
        command.add_argument("task", metavar="TASK", help="the task id")
    command.add_argument(
        "--store", dest="store_option", metavar="SPEC", type=_path, help="the store, instead of the STORE argument"
    )


def _add_json(command: argparse.ArgumentParser, what: str) -> None:
    command.add_argument("--json", action="store_true", help=f"print JSON on stdout: {what}")


def build_parser() -> argparse.ArgumentParser:
    common = {"epilog": EPILOG, "formatter_class": argparse.RawDescriptionHelpFormatter}
    parser = argparse.ArgumentParser(prog="longrun", description=DESCRIPTION, **common)  # type: ignore[arg-type]
    parser.add_argument("-v", "--verbose", action="count", default=0, help="show the library's log: -v info, -vv debug")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    # Its own dest: a subcommand's default (json=False) would overwrite a value stored under "json".
    parser.add_argument(
        "--json", dest="json_first", action="store_true", help="print JSON on stdout (the same as --json after the command)"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, help: str, description: str | None = None, epilog: str = EPILOG) -> argparse.ArgumentParser:
        command = commands.add_parser(
            name,
            help=help,
            description=description or help[0].upper() + help[1:] + ".",
            epilog=epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.set_defaults(command_parser=command)
        return command

    listing = add(
        "ls",
        "list the tasks in a store with status, progress, revision and next action (read-only)",
        "List the tasks in a store, most recently updated first: status, progress (verified/total for a "
        "declared plan, else the verified step count), revision, last update and next action. Read-only.",
    )
    _add_store(listing, task=False)
    listing.add_argument(
        "--status", dest="statuses", metavar="S", action="append", default=[], choices=LS_STATUSES,
        help="only tasks with this status (repeatable): a run status, new, DAMAGED or UNREADABLE",
    )  # fmt: skip
    listing.add_argument(
        "--since", metavar="DURATION|TIME", type=_since,
        help="only tasks updated since: a duration back from now (90s, 15m, 2h, 3d, 1w) or a time "
        "(2026-11-30T14:00Z; UTC unless it says); tasks whose state cannot be read are kept",
    )
    listing.add_argument("--limit", metavar="N", type=_positive_int, help="at most N tasks (after sorting)")
    _add_json(listing, "a list of {task_id, status, revision, next_action, source, error, updated_at, progress}")

    status = add(
        "status",
        "show one task's state, lease, effects, pending approvals and next action (read-only)",
        "Show a task's status, revision, plan digest, lease, effects, pending approval "
        "requests and its one next action. Read-only: takes no lease, moves no file.",
    )
    _add_store(status, task=True)
    _add_json(status, "one object: state.to_json() plus store_lease, load and checked_at")

    history = add(
        "history",
        "show a task's timeline: commits, effects, approvals, control records read and their digests (read-only)",
        "Show a task's timeline, oldest first: its revisions (from the store's own history when it keeps one, "
        "else the first and the latest), each effect's latest move with attempts, epoch, receipt, evidence and "
        "error, approvals requested and consumed, the control records the runner read with their SHA-256 "
        "digests, the unknowns of the last stop, and the lease. Read-only.",
    )
    _add_store(history, task=True)
    _add_json(history, "a list of {at, kind, detail, source, revision, epoch, step, digest}")

    verify = add(
        "verify",
        "check a task's state, lease, ledger and control records; the exit code says if it can resume safely",
        "Read-only checks: the state validates (checksum, schema, task identity), the plan digest and "
        "revision are recorded, the effect records are consistent with their lifecycle and the status, "
        "the in-flight effects (observed first on resume), the lease, and the control records a resume "
        "would act on. Takes no lease and moves no file, even when the state is damaged.",
        VERIFY_EPILOG,
    )
    _add_store(verify, task=True)
    _add_json(verify, "one object: verdict, exit_code, status, checks [{name, result, detail}], in_flight")

    approve = add(
        "approve",
        "approve a task's pending approval request (exactly its scope, once)",
        "Show the task's pending approval request and write an approval bound to its "
        "task, plan digest, step, payload digest and action. It authorizes that one effect, once.",
    )
    _add_store(approve, task=True)
    approve.add_argument("--step", metavar="STEP", type=_step_id, help="which pending request, when there are several")
    approve.add_argument("--approver", metavar="NAME", type=_non_empty, help="who approves (default: the login name)")
    approve.add_argument(
        "--ttl", metavar="SECONDS", type=_positive_seconds, default=3600.0, help="how long the approval is valid (default 3600)"
    )
    approve.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    _add_authority_options(approve, "approval")
    _add_json(approve, "{request, approval, signed_with_key, written_to, unused_matching_approvals} (the prompt goes to stderr)")

    answer = add(
        "answer",
        "answer a pending question (a durable function's run.ask, a session's stop) with a value, once",
        "Write an answer bound to the task, plan digest, step and the question's digest, as an approval "
        "of that question that carries the value. VALUE is read as JSON if it parses (42, true, "
        '"text", [1, 2]), else as a plain string.',
    )
    _add_store(answer, task=True)
    answer.add_argument("step", metavar="STEP", type=_step_id, help="the step id of the question")
    answer.add_argument("value", metavar="VALUE", help="the answer: JSON, or else plain text")
    answer.add_argument("--approver", metavar="NAME", type=_non_empty, help="who answers (default: the login name)")
    answer.add_argument(
        "--ttl", metavar="SECONDS", type=_positive_seconds, default=3600.0, help="how long the answer is valid (default 3600)"
    )
    _add_authority_options(answer, "answer")
    _add_json(answer, "{request, approval, signed_with_key, written_to, unused_matching_approvals}")

    cancel = add(
        "cancel",
        "ask a task to start no new effect; its next run ends cancelled",
        "Write the task's cancellation record. The runner reads it before every new "
        "effect; an effect already in flight is still reconciled, then the run ends cancelled.",
    )
    _add_store(cancel, task=True)
    cancel.add_argument("--reason", metavar="TEXT", type=_reason, default="cancelled by an operator from the command line")
    cancel.add_argument("--by", metavar="NAME", type=_non_empty, help="who cancels (default: the login name)")
    _add_authority_options(cancel, "cancellation")
    _add_json(cancel, "{cancellation, replaced_earlier_record, signed_with_key, written_to, run_already_ended}")

    repair = add(
        "repair",
        "repair a task's damaged lease record (--lease) so that its next run can start, at a newer epoch",
        "With --lease: move the task's damaged lease record aside into the task's quarantine (it is never "
        "deleted) and write a released lease at the highest epoch the store records elsewhere (the state "
        "and its journal; a database's own epoch floor), so the next run acquires a strictly higher epoch "
        "and nothing written under an earlier one is accepted. Refused, changing nothing, when the lease "
        "record is not damaged or while a process on this machine holds the task's lease.",
        STORE_HELP + "\n" + REPAIR_EPILOG,
    )
    _add_store(repair, task=True)
    repair.add_argument("--lease", action="store_true", help="repair the lease record (the one repair there is)")
    _add_json(repair, "{task_id, damage, quarantined, epoch, next_epoch, lease} (the lease without its holder's token)")

    watch = add(
        "watch",
        "follow a task live until its run stops: progress, the current effect, the last events (read-only)",
        "Poll the store (from any process or machine that can read it) and show the task's progress live: "
        "verified/total with the rate and the time left for a declared plan, counts for a durable function, "
        "the current effect and its age, and the last events. On a terminal the view is redrawn in place; "
        "otherwise (a pipe, a file) one plain line per event. Exits when the run stops (any status but "
        "running): 0 done, 1 another stop, 4 ended without finishing. Read-only.",
    )
    _add_store(watch, task=True)
    watch.add_argument(
        "--interval", metavar="SECONDS", type=_interval, default=1.0, help="seconds between two reads of the store (default 1)"
    )
    _add_json(watch, "one JSON object per line: each event, then the stop")

    console = add(
        "console",
        "serve a local web console: tasks, timelines, evidence, and pending approvals and questions to act on",
        "Serve a web console on 127.0.0.1 (standard library only, no JavaScript): the task list with status, "
        "progress and filters; each task's timeline, effects and evidence (observations, inferences, unknowns); "
        "its pending approvals and questions with the payload shown in full, and forms to approve, answer or "
        "cancel, which write the same records as `longrun approve`, `answer` and `cancel` into --control-root "
        "(signed with --sign-key when given): run it as the approver. Without --control-root it is read-only. It prints "
        "a URL with a random token; requests without the token are refused, every change is a POST with a "
        "CSRF token, and pages forbid scripts (Content-Security-Policy). Stop it with Ctrl-C.",
    )
    _add_store(console, task=False)
    console.add_argument("--port", metavar="P", type=_port, default=0, help="the port on 127.0.0.1 (default 0: any free port)")
    console.add_argument(
        "--read-only", action="store_true", help="show only: no approve, answer or cancel (the default without --control-root)"
    )
    console.add_argument("--approver", metavar="NAME", type=_non_empty, help="who approves (default: the login name)")
    _add_authority_options(console, "approvals, answers and cancellations")
    _add_json(console, "one line {url, store, read_only, approver, control_root, signed} before serving")

    resume = add(
        "resume",
        "import MODULE, call FUNCTION() for a Runner and run it once: the recovery trigger for cron or systemd",
        "Import MODULE, call FUNCTION() (no arguments), which must return a longrun Runner, run it once and "
        "print the outcome. Starting, resuming after a crash and continuing after an approval or a backoff "
        "are the same call; an overlapping call returns already-running and changes nothing.",
        RESUME_EPILOG,
    )
    resume.add_argument(
        "target",
        metavar="MODULE:FUNCTION | STORE",
        help="for example mytasks.nightly:build_runner; or the STORE of a durable-function task, with TASK",
    )
    resume.add_argument(
        "task", metavar="TASK", nargs="?",
        help="with STORE: resume the durable function the task records, with the arguments it records",
    )  # fmt: skip
    _add_module_options(resume)

    start = add(
        "start",
        "record a durable function's task with JSON arguments for a worker to run (--run: run it once here)",
        "Import MODULE, whose FUNCTION must be a @longrun.durable function, and record TASK with the "
        "arguments given as JSON in the function's store, without running it: a worker (longrun worker) "
        "runs it, or longrun resume STORE TASK. The same task id with the same arguments changes nothing "
        "(but the priority); with other arguments it is refused (exit 2) and nothing changes. With --run, "
        "run TASK once in this process instead (the same arguments resume it; others stop plan-mismatch).",
        START_EPILOG,
    )
    start.add_argument("target", metavar="MODULE:FUNCTION", help="for example mytasks.agents:triage")
    start.add_argument("task", metavar="TASK")
    start.add_argument("--args", metavar="JSON", default="[]", help="positional arguments, a JSON array (default [])")
    start.add_argument("--kwargs", metavar="JSON", default="{}", help="keyword arguments, a JSON object (default {})")
    start.add_argument("--run", action="store_true", help="run the task once here instead of leaving it to a worker")
    start.add_argument(
        "--priority", metavar="N", type=_priority, default=0, help="the queue priority: higher runs first (default 0)"
    )
    _add_module_options(start)

    worker = add(
        "worker",
        "run every runnable task of the durable functions in the --import modules, until SIGTERM or SIGINT",
        "A long-running worker: it imports each MODULE, finds its @longrun.durable functions, and runs every task "
        "of theirs that is due in STORE: new tasks, retries and timers whose time came, tasks whose approval, "
        "answer, cancellation or child just arrived, and tasks whose holder's lease expired (taken over with a "
        "newer epoch, observing first). At most --concurrency at once (threads; async functions on one event "
        "loop). On SIGTERM or SIGINT it drains: it starts nothing new, stops each run at its next step boundary "
        "(the effect in flight settles first), commits, releases every lease and exits 0. A SIGKILL loses "
        "nothing: another worker takes the tasks over when their claims and leases expire.",
        WORKER_EPILOG,
    )
    _add_store(worker, task=False)
    worker.add_argument(
        "--import", dest="modules", metavar="MODULE", action="append", required=True,
        help="a module whose durable functions this worker runs (repeatable)",
    )  # fmt: skip
    worker.add_argument("--concurrency", metavar="N", type=_count(1, 1024), default=4, help="tasks run at once (default 4)")
    worker.add_argument("--name", metavar="NAME", type=_non_empty, help="how `longrun workers` names it (default HOST:PID)")
    worker.add_argument(
        "--limit", metavar="ACTION=K", type=_action_limit, action="append", default=[],
        help="at most K applies of ACTION at once across every worker given the same limit (repeatable)",
    )  # fmt: skip
    worker.add_argument(
        "--claim-ttl", metavar="SECONDS", type=_positive_seconds, default=30.0,
        help="how long a dead worker's claims last (default 30; about the functions' lease_ttl_s)",
    )  # fmt: skip
    worker.add_argument(
        "--poll", metavar="SECONDS", type=_positive_seconds, default=1.0,
        help="how often to look for due tasks without a notification (default 1)",
    )  # fmt: skip
    worker.add_argument(
        "--path", metavar="DIR", type=_path, action="append", default=[], help="search DIR for MODULE first (repeatable)"
    )
    _add_json(worker, "at exit, {name, runs, statuses, drained}")

    workers = add("workers", "list the workers of a store's fleet: name, host, tasks held, last heartbeat (read-only)")
    _add_store(workers, task=False)
    _add_json(workers, "a list of {name, host, pid, state, alive, running, claimed, heartbeat_age_s, functions, ...}")

    init = add(
        "init",
        "start a checkpointed session's task from a machine-readable run contract (TOML)",
        "Validate the run contract (templates/run-contract.toml) and start TASK from it: the contract is recorded "
        "with the task's first revision and pinned by its plan digest. The same contract again changes nothing; "
        "another is refused. A bad contract is refused with the line that holds the problem, and nothing is created.",
        SESSION_EPILOG,
    )
    _add_store(init, task=True)
    init.add_argument("--contract", metavar="FILE", type=_path, required=True, help="the run contract (TOML)")
    init.add_argument(
        "--create-store", action="store_true", help="create the store if it does not exist (a directory, or sqlite:PATH's file)"
    )
    _add_json(init, "{created, next, ...} (see next --json for the next action's fields)")

    next_ = add(
        "next",
        "say exactly one safe next action for a checkpointed session (the continuation rule; read-only)",
        "From the store alone: the one safe next action for the agent (the commands to run), or the legal stop "
        "and what would unblock it. An agent that lost its context runs this and nothing else to know what to do. "
        "Read-only: takes no lease.",
        SESSION_EPILOG,
    )
    _add_store(next_, task=True)
    _add_json(next_, "{kind, who, next_action, commands, cwd, step, evidence, unblock, retry_after_s, notes, ...}")

    exec_ = add(
        "exec",
        "run a session step's command as an effect through the ledger, exactly once",
        "Run STEP's command (after --, or the one the run contract gives) through the effect ledger: the intent "
        "is durable before it starts, the step's action must be allowed by the contract, cancellation and approval "
        "are read fresh, the lease is held; the exit status and the digests of stdout and stderr are the receipt. "
        "Run again after a crash, it observes (--observe CMD: exit 0 applied, 1 absent, else unknown) instead of "
        "running the command again; without an observe command an interrupted command is unknown and the task "
        "stops unsafe-to-continue.",
        SESSION_EPILOG,
    )
    exec_.add_argument("store", metavar="STORE", nargs="?", type=_path, help="the store (or use --store)")
    exec_.add_argument("task", metavar="TASK", help="the task id")
    exec_.add_argument("step", metavar="STEP", type=_step_id, help="the step id, as the run contract names it")
    exec_.add_argument("--store", dest="store_option", metavar="SPEC", type=_path, help="the store, instead of the STORE argument")
    exec_.add_argument("--observe", metavar="CMD", type=_reason, help="a shell command: exit 0 if the effect took place, 1 if not")
    exec_.add_argument("--approval", action="store_true", help="gate the command on `longrun approve` (also if the contract says so)")
    exec_.add_argument("--timeout", metavar="SECONDS", type=_positive_seconds, help="kill the command after this long (its outcome is then observed)")
    _add_json(exec_, "{status, step, record, outcome, next, exit_code} (the command's own output goes to stderr)")

    checkpoint = add(
        "checkpoint",
        "record a session step that is not an external effect, with its evidence's digest",
        "Record STEP (a file written, a test run) with its evidence: --evidence FILE records the file's SHA-256, "
        "--note TEXT a note. A checkpoint is recorded once.",
        SESSION_EPILOG,
    )
    checkpoint.add_argument("store", metavar="STORE", nargs="?", type=_path, help="the store (or use --store)")
    checkpoint.add_argument("task", metavar="TASK", help="the task id")
    checkpoint.add_argument("step", metavar="STEP", type=_step_id, help="the step id, as the run contract names it")
    checkpoint.add_argument("--store", dest="store_option", metavar="SPEC", type=_path, help="the store, instead of the STORE argument")
    evidence = checkpoint.add_mutually_exclusive_group(required=True)
    evidence.add_argument("--evidence", metavar="FILE", type=_path, help="the file the step produced: its SHA-256 is recorded")
    evidence.add_argument("--note", metavar="TEXT", type=_reason, help="what was done and how you know")
    _add_json(checkpoint, "{status, step, record, outcome, next, exit_code}")

    done = add(
        "done",
        "end a checkpointed session done, if the contract's completion evidence is recorded",
        "Check the run contract's completion evidence against what was recorded: end the run done, or refuse "
        "(exit 1), naming what is missing, and write nothing.",
        SESSION_EPILOG,
    )
    _add_store(done, task=True)
    _add_json(done, "{status, missing, notes, outcome, next, exit_code}")

    stop = add(
        "stop",
        "record a legal stop in a checkpointed session (blocked, needs a decision) for a person to answer",
        "Record a stop: a question for a person (step decision-N), so the next session sees it. Until a person "
        "answers it with `longrun answer STORE TASK decision-N VALUE`, every command stops awaiting-input.",
        SESSION_EPILOG,
    )
    _add_store(stop, task=True)
    stop.add_argument("--reason", metavar="TEXT", type=_reason, required=True, help="why: what is blocked or must be decided")
    _add_json(stop, "{status, step, outcome, next, exit_code}")

    demo = add(
        "demo",
        "run a fictional 5-step task, SIGKILL its worker mid-effect, resume, check exactly-once",
        "Run a fictional newsletter task in a worker process that is SIGKILLed right after "
        "its third effect, resume it here, and check that every effect happened exactly once.",
    )
    demo.add_argument("--keep", metavar="DIR", type=_path, help="run in DIR (new or empty) and keep it, instead of a temporary directory")
    demo.add_argument("--worker", metavar="ROOT", type=_path, help=argparse.SUPPRESS)
    _add_json(demo, "a summary {passed, checks, outcome} (the narrative goes to stderr)")
    return parser


def _store_spec(args: argparse.Namespace) -> str:
    """The one store the operator named, as the STORE argument or with --store (not both)."""
    positional, option = args.store, args.store_option
    # Typed, so that checkers know error() does not return (it exits with status 2).
    command_parser: argparse.ArgumentParser = args.command_parser
    if positional is not None and option is not None and positional != option:
        command_parser.error(f"the store is given twice ({positional!r} and --store {option!r}); give it once")
    spec = positional if positional is not None else option
    if spec is None:
        where = "as STORE before TASK" if args.command in _TASK_COMMANDS else "as STORE"
        command_parser.error(f"the store is missing: give it {where}, or with --store SPEC")
    try:
        return _path(spec)  # again: a STORE moved over from TASK did not pass argparse's check
    except argparse.ArgumentTypeError as exc:
        command_parser.error(f"argument STORE: {exc}")


def _dispatch(args: argparse.Namespace) -> int:
    out, err = sys.stdout, sys.stderr
    if args.command == "demo":
        from ._demo import run_demo, run_worker  # imports the runner: only when asked for

        if args.worker is not None:
            return run_worker(args.worker, out)
        return run_demo(args.keep, out, as_json=args.json, err=err)
    if args.command == "resume" and args.task is None:
        from ._resume import cmd_resume

        return cmd_resume(args.target, args.path, args.json, out, err, verbose=args.verbose > 0)
    if args.command == "resume":
        from ._resume import cmd_resume_task

        return cmd_resume_task(_path(args.target), args.task, args.path, args.json, out, err, verbose=args.verbose > 0)
    if args.command == "start":
        from ._resume import cmd_start

        return cmd_start(
            args.target, args.task, args.args, args.kwargs, args.path, args.json, out, err,
            verbose=args.verbose > 0, run=args.run, priority=args.priority,
        )  # fmt: skip
    spec = args.store_spec
    if args.command in _TASK_COMMANDS or args.command in _STEP_COMMANDS:
        checked_task(args.task)  # an unsafe id is refused before the store is opened
    if args.command == "init":
        from ..contractfile import load_contract
        from ._session import create_store

        load_contract(args.contract)  # a bad contract is refused before anything is created
        if args.create_store:
            create_store(spec)
    store = open_store(spec)
    try:
        return _store_command(args, store, store_label(spec), out, err)
    finally:
        close_store(store)


def _store_command(args: argparse.Namespace, store: Store, label: str, out: TextIO, err: TextIO) -> int:
    if args.command == "worker":
        from ._worker import cmd_worker

        return cmd_worker(
            store, args.modules, args.path, concurrency=args.concurrency, name=args.name, limits=dict(args.limit),
            claim_ttl_s=args.claim_ttl, poll_s=args.poll, as_json=args.json, out=out, err=err, verbose=args.verbose > 0,
        )  # fmt: skip
    if args.command == "workers":
        from ._worker import cmd_workers

        return cmd_workers(store, args.json, out)
    if args.command == "status":
        from ._inspect import cmd_status

        return cmd_status(store, args.task, args.json, out)
    if args.command == "ls":
        from ._inspect import cmd_ls

        return cmd_ls(store, label, args.json, out, statuses=args.statuses, since=args.since, limit=args.limit)
    if args.command == "watch":
        from ._watch import cmd_watch

        return cmd_watch(store, args.task, interval=args.interval, out=out, as_json=args.json)
    if args.command == "console":
        from ._console import cmd_console

        return cmd_console(
            store,
            label,
            port=args.port,
            read_only=args.read_only,
            approver=args.approver or login_name(),
            sign_key=args.sign_key,
            control_root=args.control_root,
            out=out,
            as_json=args.json,
        )
    if args.command == "history":
        from ._history import cmd_history

        return cmd_history(store, args.task, args.json, out)
    if args.command == "verify":
        from ._verify import cmd_verify

        return cmd_verify(store, label, args.task, args.json, out)
    if args.command == "approve":
        from ._control import cmd_approve

        return cmd_approve(
            store,
            args.task,
            step=args.step,
            approver=args.approver or login_name(),
            ttl_s=args.ttl,
            assume_yes=args.yes,
            out=out,
            err=err,
            sign_key=args.sign_key,
            control_root=args.control_root,
            as_json=args.json,
        )
    if args.command == "answer":
        from ._control import cmd_approve, parse_answer

        return cmd_approve(
            store,
            args.task,
            step=args.step,
            approver=args.approver or login_name(),
            ttl_s=args.ttl,
            assume_yes=True,
            out=out,
            err=err,
            sign_key=args.sign_key,
            control_root=args.control_root,
            as_json=args.json,
            answer=parse_answer(args.value),
        )
    if args.command == "cancel":
        from ._control import cmd_cancel

        return cmd_cancel(
            store,
            args.task,
            reason=args.reason,
            requested_by=args.by or login_name(),
            out=out,
            err=err,
            sign_key=args.sign_key,
            control_root=args.control_root,
            as_json=args.json,
        )
    if args.command == "repair":
        from ._control import cmd_repair

        return cmd_repair(store, args.task, repaired_by=f"longrun repair ({login_name()})", out=out, as_json=args.json)
    if args.command in _SESSION_COMMANDS:
        return _session_command(args, store, out, err)
    raise AssertionError(f"unhandled command {args.command!r}")  # pragma: no cover


def _session_command(args: argparse.Namespace, store: Store, out: TextIO, err: TextIO) -> int:
    from . import _session as session

    spec = args.store_spec
    if args.command == "init":
        return session.cmd_init(store, spec, args.task, args.contract, args.json, out, err)
    if args.command == "next":
        return session.cmd_next(store, spec, args.task, args.json, out, err)
    if args.command == "exec":
        return session.cmd_exec(
            store, spec, args.task, args.step, args.command_argv,
            observe=args.observe, timeout_s=args.timeout, approval=args.approval, as_json=args.json, out=out, err=err,
        )  # fmt: skip
    if args.command == "checkpoint":
        return session.cmd_checkpoint(
            store, spec, args.task, args.step, evidence=args.evidence, note=args.note, as_json=args.json, out=out, err=err
        )
    if args.command == "done":
        return session.cmd_done(store, spec, args.task, args.json, out, err)
    return session.cmd_stop(store, spec, args.task, args.reason, args.json, out, err)


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parse_args``, except that ``STORE --option TASK`` (an option between the two) still parses,
    and that everything after ``exec``'s ``--`` is its command, untouched."""
    words = list(sys.argv[1:] if argv is None else argv)
    command_argv: list[str] = []
    first = next((index for index, word in enumerate(words) if not word.startswith("-")), None)
    if first is not None and words[first] == "exec" and "--" in words[first:]:
        cut = words.index("--", first)
        words, command_argv = words[:cut], words[cut + 1 :]
    args, extras = parser.parse_known_args(words)
    args.command_argv = command_argv
    command_parser = getattr(args, "command_parser", parser)
    if extras and args.command == "exec":
        command_parser.error(f"unrecognized arguments: {' '.join(extras)} (put the command after --)")
    if (
        extras
        and args.command in _TASK_COMMANDS
        and args.store is None
        and len(extras) == 1
        and not extras[0].startswith("-")
    ):
        # argparse gives a lone positional before an option to TASK (STORE is optional); the
        # operator meant STORE TASK.
        args.store, args.task = args.task, extras[0]
    elif extras:
        command_parser.error(f"unrecognized arguments: {' '.join(extras)}")
    args.json = args.json or args.json_first  # every command takes --json, before it or after it
    if args.command in _STORE_COMMANDS:
        args.store_spec = _store_spec(args)
    if args.command == "repair" and not args.lease:
        command_parser.error("say what to repair: --lease (the lease record; the state repairs itself on the next run)")
    return args


def _error_text(exc: BaseException) -> str:
    """The error as one line (a driver's message may span several)."""
    if isinstance(exc, CorruptStateError):
        text = f"damaged state: {exc}"
    elif isinstance(exc, StorageError) or (isinstance(exc, OSError) and not isinstance(exc, LongrunError)):
        text = f"storage error: {exc}"
    else:
        text = str(exc)
    return re.sub(r"\s*\n\s*", " ", text.strip())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``longrun`` command line; return its exit code (see ``--help``)."""
    parser = build_parser()
    try:
        args = _parse(parser, list(argv) if argv is not None else None)
    except SystemExit as exc:  # argparse exits 2 on usage errors and 0 after --help
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else ExitCode.USAGE)
    logger = logging.getLogger("longrun")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("longrun: %(levelname)s: %(message)s"))
    previous_level = logger.level
    logger.addHandler(handler)
    logger.setLevel({0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG))
    try:
        return int(_dispatch(args))
    except (CliError, LongrunError, OSError) as exc:
        if isinstance(exc, BrokenPipeError):
            _silence_stdout()
            return ExitCode.NOT_AS_ASKED
        sys.stderr.write(f"longrun {args.command}: error: {_error_text(exc)}\n")
        return exit_code_for(exc)
    except KeyboardInterrupt:
        sys.stderr.write("longrun: interrupted\n")
        return 130
    except TaskCodeError as exc:
        sys.stderr.write(f"longrun {args.command}: error: {exc}; its traceback follows\n")
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        traceback.print_exception(type(cause), cause, cause.__traceback__, file=sys.stderr)
        return INTERNAL_ERROR
    except Exception:
        sys.stderr.write(f"longrun {args.command}: internal error (a bug in longrun, please report it):\n")
        traceback.print_exc(file=sys.stderr)
        return INTERNAL_ERROR
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous_level)


def _silence_stdout() -> None:
    """After the reader of stdout went away (``longrun ls | head``), avoid a second error at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
