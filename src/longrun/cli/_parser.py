"""The argument parser: every command, its arguments and its help (``longrun --help``, ``longrun COMMAND --help``).

One concept: the command line's grammar. It is long because it declares every command in one
place, which is what a reader looking for a flag wants; the commands' work is in their own modules.
The types that check each argument, and the options several commands share, are in ``_arguments``.
"""

from __future__ import annotations

import argparse

from .. import __version__
from ._arguments import (
    action_limit,
    add_authority_options,
    add_json,
    add_log_options,
    add_module_options,
    add_store,
    add_task_filters,
    moment,
    count,
    interval,
    non_empty,
    path,
    port,
    positive_int,
    positive_seconds,
    priority,
    reason,
    since,
    step_id,
    topic_name,
)
from ._common import STORE_HELP
from ._help import DESCRIPTION, EPILOG, REPAIR_EPILOG, RESUME_EPILOG, SESSION_EPILOG, START_EPILOG, VERIFY_EPILOG, WORKER_EPILOG
from ._inspect import LS_STATUSES
from ..outcome import TERMINAL, Status

__all__ = ["build_parser"]

_RUN_STATUSES = (*(status.value for status in Status), "new")
_ENDED_STATUSES = tuple(sorted(status.value for status in TERMINAL))


_MCP_EPILOG = """\
exit codes:
  0  stdin ended and every request read was answered
  2  usage or bad input before serving: a missing store, an unsafe task id, a missing control root
  3  storage error before serving
A tool's errors are tool results (isError) with the error line of its command; the server goes on.
See docs/mcp.md for the tools, the resources, the prompt and how to register the server with a host.
"""


def build_parser() -> argparse.ArgumentParser:
    common = {"epilog": EPILOG, "formatter_class": argparse.RawDescriptionHelpFormatter}
    parser = argparse.ArgumentParser(prog="longrun", description=DESCRIPTION, **common)  # type: ignore[arg-type]
    parser.add_argument("-v", "--verbose", action="count", default=0, help="show the library's log: -v info, -vv debug")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    # Its own dest: a subcommand's default (json=False) would overwrite a value stored under "json".
    parser.add_argument(
        "--json", dest="json_first", action="store_true", help="print JSON on stdout (the same as --json after the command)"
    )
    add_log_options(parser, first=True)
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
        add_log_options(command, first=False)
        return command

    listing = add(
        "ls",
        "list the tasks in a store with status, progress, revision and next action (read-only)",
        "List the tasks in a store, most recently updated first: status, progress (verified/total for a "
        "declared plan, else the verified step count), revision, last update and next action. Read-only.",
    )
    add_store(listing, task=False)
    listing.add_argument(
        "--status", dest="statuses", metavar="S", action="append", default=[], choices=LS_STATUSES,
        help="only tasks with this status (repeatable): a run status, new, DAMAGED or UNREADABLE",
    )  # fmt: skip
    listing.add_argument(
        "--since", metavar="DURATION|TIME", type=since,
        help="only tasks updated since: a duration back from now (90s, 15m, 2h, 3d, 1w) or a time "
        "(2026-11-30T14:00Z; UTC unless it says); tasks whose state cannot be read are kept",
    )
    listing.add_argument("--limit", metavar="N", type=positive_int, help="at most N tasks (after sorting)")
    listing.add_argument(
        "--function", dest="functions", metavar="NAME", action="append", default=[],
        help="only durable tasks of this function (repeatable): module:qualname, its qualname alone, or a glob (billing:*)",
    )  # fmt: skip
    listing.add_argument(
        "--match", metavar="GLOB", action="append", default=[], help="only tasks whose id matches this glob (repeatable): 'invoice-*'"
    )
    listing.add_argument(
        "--long", action="store_true",
        help="also each task's function, recorded arguments, result, parent, children and last error",
    )  # fmt: skip
    add_json(
        listing,
        "a list of {task_id, status, revision, next_action, source, error, updated_at, progress, function, last_error, "
        "last_run_failed, what_ran}",
    )

    status = add(
        "status",
        "show one task's state, lease, effects, pending approvals and next action (read-only)",
        "Show a task's status, revision, plan digest, lease, what ran (a durable function's name, recorded arguments, "
        "result, parent and children), its last error with the traceback, effects, pending approval "
        "requests and its one next action. Read-only: takes no lease, moves no file.",
    )
    add_store(status, task=True)
    add_json(status, "one object: state.to_json() plus store_lease, load, checked_at, progress, what_ran, last_run_failed and queue_position")

    history = add(
        "history",
        "show a task's timeline: commits, effects, approvals, control records read and their digests (read-only)",
        "Show a task's timeline, oldest first: its revisions (from the store's own history when it keeps one, "
        "else the first and the latest), each effect's latest move with attempts, epoch, receipt, evidence and "
        "error, approvals requested and consumed, the control records the runner read with their SHA-256 "
        "digests, the unknowns of the last stop, and the lease. Read-only.",
    )
    add_store(history, task=True)
    add_json(history, "a list of {at, kind, detail, source, revision, epoch, step, digest}")

    verify = add(
        "verify",
        "check a task's state, lease, ledger and control records; the exit code says if it can resume safely",
        "Read-only checks: the state validates (checksum, schema, task identity), the plan digest and "
        "revision are recorded, the effect records are consistent with their lifecycle and the status, "
        "the in-flight effects (observed first on resume), the lease, and the control records a resume "
        "would act on. Takes no lease and moves no file, even when the state is damaged.",
        VERIFY_EPILOG,
    )
    add_store(verify, task=True)
    add_json(verify, "one object: verdict, exit_code, status, checks [{name, result, detail}], in_flight")

    approve = add(
        "approve",
        "approve a task's pending approval request (exactly its scope, once)",
        "Show the task's pending approval request and write an approval bound to its "
        "task, plan digest, step, payload digest and action. It authorizes that one effect, once. "
        "Refused (exit 2, nothing written) if an approval of the request is already waiting, unused.",
    )
    add_store(approve, task=True, task_optional=True)
    approve.add_argument("--step", metavar="STEP", type=step_id, help="which pending request, when there are several")
    add_task_filters(approve, _RUN_STATUSES, "instead of TASK: approve every pending request of")
    approve.add_argument("--approver", metavar="NAME", type=non_empty, help="who approves (default: the login name)")
    approve.add_argument(
        "--ttl", metavar="SECONDS", type=positive_seconds, default=None,
        help="how long the approval is valid (default: until the request expires, or an hour if it already has)"
    )
    approve.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    add_authority_options(approve, "approval")
    add_json(approve, "{request, payload, approval, signed_with_key, written_to} (the prompt goes to stderr)")

    answer = add(
        "answer",
        "answer a pending question (a durable function's run.ask, a session's stop) with a value, once",
        "Write an answer bound to the task, plan digest, step and the question's digest, as an approval "
        "of that question that carries the value. VALUE is read as JSON if it parses (42, true, "
        '"text", [1, 2]), else as a plain string. Refused (exit 2, nothing written) if the question '
        "already has an answer waiting (the first one written is the one the run reads; the error names "
        "it) or if VALUE is not one of the question's choices (the error lists them).",
    )
    add_store(answer, task=True)
    answer.add_argument("step", metavar="STEP", type=step_id, help="the step id of the question")
    answer.add_argument("value", metavar="VALUE", help="the answer: JSON, or else plain text")
    answer.add_argument("--approver", metavar="NAME", type=non_empty, help="who answers (default: the login name)")
    answer.add_argument(
        "--ttl", metavar="SECONDS", type=positive_seconds, default=None,
        help="how long the answer is valid (default: until the question's request expires, or an hour if it already has)"
    )
    add_authority_options(answer, "answer")
    add_json(answer, "{request, payload, approval, signed_with_key, written_to}")

    send = add(
        "send",
        "send a message to a task on a topic: its run.recv(TOPIC) returns it (once)",
        "Send one message as a control record, like an answer (into the store, or --control-root, signed "
        "with --sign-key): the task's next run.recv(TOPIC) that finds no older unreceived message of that "
        "topic returns it, once, and a waiting run or a worker running the task is woken. "
        'VALUE is read as JSON if it parses (42, true, "text", {"a": 1}), else as a plain string; at most '
        "64 KiB encoded. --key deduplicates at the receiver: of the messages with one key one is received, "
        "and when the mailbox already holds it nothing is written (say so, exit 0). Takes no lease and "
        "touches no state.",
    )
    add_store(send, task=True)
    send.add_argument("topic", metavar="TOPIC", type=topic_name, help="the topic: 1-100 of [A-Za-z0-9._:/@+=-]")
    send.add_argument("value", metavar="VALUE", help="the value: JSON, or else plain text")
    send.add_argument("--key", metavar="KEY", type=non_empty, help="a deduplication key (default: a new random one)")
    send.add_argument("--sender", metavar="NAME", type=non_empty, help="who sends (default: the login name)")
    add_authority_options(send, "message")
    add_json(send, "{task_id, topic, key, duplicate, seq, record_id, written_to, signed_with_key}")

    event = add(
        "event",
        "print the latest value a task set for an event key (run.set_event), waiting for it if asked",
        "Read the task's committed state and print the latest value it set for KEY, as JSON. With --wait S, "
        "wait up to S seconds for the key to be set. Exit 1 if it is not set. Read-only.",
    )
    add_store(event, task=True)
    event.add_argument("key", metavar="KEY", type=topic_name, help="the event key")
    event.add_argument("--wait", metavar="SECONDS", type=positive_seconds, default=None, help="wait up to this long for the key to be set")
    add_json(event, "{task_id, key, set, value}")

    cancel = add(
        "cancel",
        "ask a task to start no new effect; its next run ends cancelled",
        "Write the task's cancellation record. The runner reads it before every new "
        "effect; an effect already in flight is still reconciled, then the run ends cancelled. The "
        "unfinished children a durable task started (not detached ones) are cancelled too, the same way.",
    )
    add_store(cancel, task=True, task_optional=True)
    cancel.add_argument("--reason", metavar="TEXT", type=reason, default="cancelled by an operator from the command line")
    add_task_filters(cancel, _RUN_STATUSES, "instead of TASK: cancel")
    cancel.add_argument("--yes", "-y", action="store_true", help="with a filter: do it (without, the tasks are only listed)")
    cancel.add_argument("--by", metavar="NAME", type=non_empty, help="who cancels (default: the login name)")
    add_authority_options(cancel, "cancellation")
    add_json(cancel, "{cancellation, children_cancelled, replaced_earlier_record, signed_with_key, written_to, run_already_ended}")

    # -- retention: delete and prune -----------------------------------------------------------
    delete = add(
        "delete",
        "delete one task whose run ended (its state, journal, blobs, control records, fleet row); prints what went",
        "Delete TASK from the store: its state and journal, its large values, its control records, its "
        "quarantine and its row in the fleet's queue, through the store's own delete_task. Refused (exit 1, "
        "nothing deleted) for a task whose run has not ended (done, cancelled, limits-exhausted, deadline-exceeded, blocked), "
        "whose lease is live, or whose parent has not ended.",
    )
    add_store(delete, task=True)
    add_json(delete, "{task_id, status, revision, removed}")

    prune = add(
        "prune",
        "delete the tasks whose run ended before a moment (--before 30d); prints what went",
        "Delete every task whose run ended (done, cancelled, limits-exhausted, deadline-exceeded, blocked; or the --status given) "
        "and whose last update is before --before, as `longrun delete` does each. Never a task that has not "
        "ended, one whose lease is live, or a child whose parent has not ended. --dry-run lists only.",
    )
    add_store(prune, task=False)
    prune.add_argument(
        "--before", metavar="DURATION|TIME", type=moment("--before"), required=True,
        help="only tasks last updated before this: a duration back from now (30d, 12h) or a time (2026-11-01)",
    )  # fmt: skip
    add_task_filters(prune, _ENDED_STATUSES, "only")
    prune.add_argument("--dry-run", action="store_true", help="list what would be deleted; delete nothing")
    add_json(prune, "{before, filter, dry_run, would_delete, deleted [{task_id, status, revision, removed}], skipped}")

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
    add_store(repair, task=True)
    repair.add_argument("--lease", action="store_true", help="repair the lease record (the one repair there is)")
    add_json(repair, "{task_id, damage, quarantined, epoch, next_epoch, lease} (the lease without its holder's token)")

    watch = add(
        "watch",
        "follow a task live until its run stops: progress, the current effect, the last events (read-only)",
        "Poll the store (from any process or machine that can read it) and show the task's progress live: "
        "verified/total with the rate and the time left for a declared plan, counts for a durable function, "
        "the current effect and its age, and the last events. On a terminal the view is redrawn in place; "
        "otherwise (a pipe, a file) one plain line per event. Exits when the run stops (any status but "
        "running): 0 done, 1 another stop, 4 ended without finishing. Read-only.",
    )
    add_store(watch, task=True)
    watch.add_argument(
        "--interval", metavar="SECONDS", type=interval, default=1.0, help="seconds between two reads of the store (default 1)"
    )
    add_json(watch, "one JSON object per line: each event, then the stop")

    console = add(
        "console",
        "serve a local web console: tasks, timelines, evidence, and pending approvals and questions to act on",
        "Serve a web console on 127.0.0.1 (standard library only) that refreshes itself every few seconds: a "
        "summary band (tasks by status, pending approvals, failures in the last hour, queue depth, workers alive), "
        "the task list, searched, filtered and paged; each task's timeline, effects and evidence (observations, "
        "inferences, unknowns); its pending approvals and questions with the payload shown in full, and forms to "
        "approve, answer, cancel, resolve or reopen, which write the same records as the commands of those names "
        "into --control-root (signed with --sign-key when given): run it as the approver. Without --control-root it "
        "is read-only. A page per worker and per queue. It prints a URL with a random token; requests without the "
        "token are refused, every change is a POST with a CSRF token, and pages run no script but the console's "
        "own (Content-Security-Policy). Stop it with Ctrl-C.",
    )
    add_store(console, task=False)
    console.add_argument("--port", metavar="P", type=port, default=0, help="the port on 127.0.0.1 (default 0: any free port)")
    console.add_argument(
        "--read-only", action="store_true", help="show only: no approve, answer or cancel (the default without --control-root)"
    )
    console.add_argument("--approver", metavar="NAME", type=non_empty, help="who approves (default: the login name)")
    add_authority_options(console, "approvals, answers and cancellations")
    add_json(console, "one line {url, store, read_only, approver, control_root, signed} before serving")

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
    add_module_options(resume)
    resume.add_argument(
        "--reopen", action="store_true",
        help="with STORE TASK: reopen a task that ended cancelled, blocked, limits-exhausted, deadline-exceeded (or failed), then run it",
    )  # fmt: skip
    resume.add_argument("--reason", metavar="TEXT", type=reason, help="with --reopen: why (recorded; required)")
    resume.add_argument("--by", metavar="NAME", type=non_empty, help="with --reopen: who reopens (default: the login name)")
    resume.add_argument(
        "--add-attempts", metavar="N", type=count(0, 1_000_000), default=0,
        help="with --reopen: N more attempts for every effect not verified, and for the run's step budget",
    )  # fmt: skip
    resume.add_argument(
        "--add-time", metavar="S", type=positive_seconds, default=0.0,
        help="with --reopen: S more seconds of work under the time limits (max_elapsed_s, max_no_progress_s); for a deadline-exceeded task (where it is required) a new deadline S seconds after the later of the old one and the reopen",
    )  # fmt: skip
    add_task_filters(resume, _ENDED_STATUSES, "with --reopen, instead of TASK: reopen")
    resume.add_argument("--yes", "-y", action="store_true", help="with --reopen and a filter: do it (without, the tasks are only listed)")
    add_authority_options(resume, "reopen record")

    # -- the operator's interventions: resolve, fork (resume --reopen is above) ------------------------
    resolve = add(
        "resolve",
        "record, after checking the target, whether an uncertain effect took place (--applied) or not (--absent)",
        "Write a person's observation of an effect in flight (a task unsafe-to-continue, or an uncertain "
        "ledger entry), bound to the task, plan digest, step, effect key and payload digest, as a control "
        "record like an approval (into the store, or --control-root, signed with --sign-key). The task's "
        "next run uses it once, before observing anything: --applied makes the effect verified (never "
        "applied again; --result is its recorded result), --absent plans it again (the run applies it "
        "again). Refused (exit 2, nothing written) for an unknown task or step, an effect not in flight, "
        "or a --key or --payload-digest that is not the effect's.",
    )
    add_store(resolve, task=True)
    resolve.add_argument("step", metavar="STEP", type=step_id, help="the step id of the effect")
    outcome = resolve.add_mutually_exclusive_group(required=True)
    outcome.add_argument("--applied", action="store_true", help="the effect took place at the target")
    outcome.add_argument("--absent", action="store_true", help="the effect did not take place at the target")
    resolve.add_argument("--evidence", metavar="TEXT", type=reason, required=True, help="what you checked and saw (recorded)")
    resolve.add_argument("--result", metavar="JSON", help="with --applied: the effect's result to record (JSON)")
    resolve.add_argument("--by", metavar="NAME", type=non_empty, help="who checked (default: the login name)")
    resolve.add_argument("--key", metavar="KEY", help="refuse unless the effect's key is KEY")
    resolve.add_argument("--payload-digest", metavar="DIGEST", help="refuse unless the effect's payload digest is DIGEST")
    add_authority_options(resolve, "resolution")
    add_json(resolve, "{record, signed_with_key, written_under}")

    fork = add(
        "fork",
        "record a new task from a durable task: its records before STEP copied, STEP on made anew under new keys",
        "Import the durable function TASK records and record NEW_TASK with the same arguments: the verified "
        "effects and recorded calls of TASK before STEP are copied as recorded (never applied again), and "
        "NEW_TASK makes STEP and every later step itself, under its own effect keys (NEW_TASK/<step id>), "
        "which the target sees as new effects. Without --from, from TASK's first step that is not verified. "
        "NEW_TASK records its origin; TASK lists its forks (longrun status). A worker runs NEW_TASK, or "
        "longrun resume STORE NEW_TASK. Refused (exit 2, nothing written) for an unknown task or step, an "
        "effect before STEP still in flight, or a NEW_TASK that exists.",
    )
    add_store(fork, task=True)
    fork.add_argument("new_task", metavar="NEW_TASK", help="the new task's id")
    fork.add_argument("--from", dest="from_step", metavar="STEP", type=step_id, help="the first step the fork makes anew")
    fork.add_argument(
        "--path", metavar="DIR", type=path, action="append", default=[], help="search DIR for the function's module first (repeatable)"
    )
    add_json(fork, "{task_id, forked_from: {task, step}, function}")

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
        "--priority", metavar="N", type=priority, default=0, help="the queue priority: higher runs first (default 0)"
    )
    add_module_options(start)

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
    add_store(worker, task=False)
    worker.add_argument(
        "--import", dest="modules", metavar="MODULE", action="append", required=True,
        help="a module whose durable functions this worker runs (repeatable)",
    )  # fmt: skip
    worker.add_argument("--concurrency", metavar="N", type=count(1, 1024), default=4, help="tasks run at once (default 4)")
    worker.add_argument("--name", metavar="NAME", type=non_empty, help="how `longrun workers` names it (default HOST:PID)")
    worker.add_argument(
        "--limit", metavar="ACTION=K", type=action_limit, action="append", default=[],
        help="at most K applies of ACTION at once across every worker given the same limit (repeatable)",
    )  # fmt: skip
    worker.add_argument(
        "--claim-ttl", metavar="SECONDS", type=positive_seconds, default=30.0,
        help="how long a dead worker's claims last (default 30; about the functions' lease_ttl_s)",
    )  # fmt: skip
    worker.add_argument(
        "--poll", metavar="SECONDS", type=positive_seconds, default=1.0,
        help="how often to look for due tasks without a notification (default 1)",
    )  # fmt: skip
    worker.add_argument(
        "--path", metavar="DIR", type=path, action="append", default=[], help="search DIR for MODULE first (repeatable)"
    )
    worker.add_argument(
        "--metrics-port", metavar="PORT", type=port,
        help="serve the store's metrics (Prometheus text format) at http://127.0.0.1:PORT/metrics while the worker runs",
    )  # fmt: skip
    worker.add_argument(
        "--version-policy", choices=("any", "same"), default="any",
        help="same: run and recover only tasks that recorded this code's version of their function (default any)",
    )  # fmt: skip
    add_json(worker, "at exit, {name, runs, statuses, drained}")

    metrics = add(
        "metrics",
        "print a store's metrics once in the Prometheus text format: tasks, effects, approvals, queue, workers (read-only)",
        "Print the store's metrics in the Prometheus text exposition format: tasks by status and function, "
        "failures by function and error type, effects applied, verified, uncertain and retried by action "
        "(counted from the recorded ledgers, so every process agrees), pending approvals and questions with "
        "the oldest's age, the fleet's queue depth and lag and its workers, reported progress with its rate "
        "and time left, and run duration and effect latency histograms. `longrun console` serves the same at "
        "/metrics; `longrun worker --metrics-port` serves it to a scraper. See docs/observability.md.",
    )
    add_store(metrics, task=False)
    metrics.add_argument(
        "--summaries", action="store_true",
        help="read tasks by status and function and run durations from the summary rows, loading only failed, waiting "
        "and running tasks; leaves out the families only every ledger answers (effects, step failures, effect latency)",
    )  # fmt: skip
    add_json(metrics, "{collected_at, families: [{name, type, help, samples: [{name, labels, value}]}]}")

    queues = add("queues", "list the fleet's queues: depth, running, oldest wait and limits (read-only)")
    add_store(queues, task=False)
    queues.set_defaults(task=None)  # a store command without a task
    add_json(queues, "a list of {queue, depth, running, oldest_wait_s, limits}")

    schedule = add(
        "schedule",
        "add, list, pause, resume, remove, trigger or backfill the cron schedules of a store's durable functions",
        "Schedules start a durable function at each slot of a cron expression (five fields: minute hour "
        "day-of-month month day-of-week), once across the fleet: each slot's task id is NAME.YYYYmmddTHHMMZ, "
        "so a slot is recorded once however many workers start it. Workers serving the function start the slots; "
        "missed slots are started (--catchup backfill) or skipped but the latest (skip).",
    )
    schedule_actions = schedule.add_subparsers(dest="schedule_action", metavar="ACTION", required=True)

    def schedule_action(name: str, help: str, *, named: bool = True) -> argparse.ArgumentParser:
        command = schedule_actions.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".")
        command.set_defaults(command_parser=command, task=None)  # a store command without a task
        add_store(command, task=False)
        if named:
            command.add_argument("name", metavar="NAME", help="the schedule's name")
        add_json(command, "the schedule(s) or the tasks recorded")
        return command

    schedule_add = schedule_action("add", "store a schedule: NAME starts --function at each slot of --cron")
    schedule_add.add_argument("--function", metavar="MODULE:FUNCTION", required=True, help="a @longrun.durable function")
    schedule_add.add_argument("--cron", metavar="EXPR", required=True, help='five fields, e.g. "*/15 * * * *" or "0 9 * * mon-fri"')
    schedule_add.add_argument("--timezone", metavar="ZONE", default="UTC", help="the zone the fields are read in (default UTC)")
    schedule_add.add_argument("--catchup", choices=("skip", "backfill"), default="skip", help="missed slots: start the latest only (skip, default) or every one")
    schedule_add.add_argument("--since", metavar="TIME", help="ISO 8601: the first slot is the first at or after TIME (default: after now)")
    schedule_add.add_argument("--replace", action="store_true", help="replace a schedule of that name (else refused, exit 2)")
    schedule_action("ls", "list the schedules: function, cron, zone, catch-up, next and last slot (read-only)", named=False)
    schedule_action("pause", "pause a schedule: no slot starts until it is resumed")
    schedule_action("resume", "resume a schedule from the first slot after now (slots missed while paused: backfill)")
    schedule_action("rm", "remove a schedule (the tasks it started stay)")
    schedule_trigger = schedule_action("trigger", "record a run of the schedule's function now (task NAME.manual.TIME)")
    schedule_backfill = schedule_action("backfill", "record the task of every slot in [--since, --until] not recorded before")
    schedule_backfill.add_argument("--since", metavar="TIME", required=True, help="ISO 8601 (a time without a zone is UTC)")
    schedule_backfill.add_argument("--until", metavar="TIME", help="ISO 8601 (default: now)")
    schedule_backfill.add_argument("--max", metavar="N", type=count(1, 100_000), default=1000, help="at most N slots (default 1000)")
    for command in (schedule_add, schedule_trigger, schedule_backfill):
        command.add_argument(
            "--path", metavar="DIR", type=path, action="append", default=[], help="search DIR for the function's module first (repeatable)"
        )

    workers = add("workers", "list the workers of a store's fleet: name, host, tasks held, last heartbeat (read-only)")
    add_store(workers, task=False)
    add_json(workers, "a list of {name, host, pid, state, alive, running, claimed, heartbeat_age_s, functions, ...}")

    init = add(
        "init",
        "start a checkpointed session's task from a machine-readable run contract (TOML)",
        "Validate the run contract (templates/run-contract.toml) and start TASK from it: the contract is recorded "
        "with the task's first revision and pinned by its plan digest. The same contract again changes nothing; "
        "another is refused. A bad contract is refused with the line that holds the problem, and nothing is created.",
        SESSION_EPILOG,
    )
    add_store(init, task=True)
    init.add_argument("--contract", metavar="FILE", type=path, required=True, help="the run contract (TOML)")
    init.add_argument(
        "--create-store", action="store_true", help="create the store if it does not exist (a directory, or sqlite:PATH's file)"
    )
    add_json(init, "{created, next, ...} (see next --json for the next action's fields)")

    next_ = add(
        "next",
        "say exactly one safe next action for a checkpointed session (the continuation rule; read-only)",
        "From the store alone: the one safe next action for the agent (the commands to run), or the legal stop "
        "and what would unblock it. An agent that lost its context runs this and nothing else to know what to do. "
        "Read-only: takes no lease.",
        SESSION_EPILOG,
    )
    add_store(next_, task=True)
    add_json(next_, "{kind, who, next_action, commands, cwd, step, evidence, unblock, retry_after_s, notes, ...}")

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
    exec_.add_argument("store", metavar="STORE", nargs="?", type=path, help="the store (or use --store)")
    exec_.add_argument("task", metavar="TASK", help="the task id")
    exec_.add_argument("step", metavar="STEP", type=step_id, help="the step id, as the run contract names it")
    exec_.add_argument("--store", dest="store_option", metavar="SPEC", type=path, help="the store, instead of the STORE argument")
    exec_.add_argument("--observe", metavar="CMD", type=reason, help="a shell command: exit 0 if the effect took place, 1 if not")
    exec_.add_argument("--approval", action="store_true", help="gate the command on `longrun approve` (also if the contract says so)")
    exec_.add_argument("--timeout", metavar="SECONDS", type=positive_seconds, help="kill the command after this long (its outcome is then observed)")
    add_json(exec_, "{status, step, record, outcome, next, exit_code} (the command's own output goes to stderr)")

    checkpoint = add(
        "checkpoint",
        "record a session step that is not an external effect, with its evidence's digest",
        "Record STEP (a file written, a test run) with its evidence: --evidence FILE records the file's SHA-256, "
        "--note TEXT a note. A checkpoint is recorded once.",
        SESSION_EPILOG,
    )
    checkpoint.add_argument("store", metavar="STORE", nargs="?", type=path, help="the store (or use --store)")
    checkpoint.add_argument("task", metavar="TASK", help="the task id")
    checkpoint.add_argument("step", metavar="STEP", type=step_id, help="the step id, as the run contract names it")
    checkpoint.add_argument("--store", dest="store_option", metavar="SPEC", type=path, help="the store, instead of the STORE argument")
    evidence = checkpoint.add_mutually_exclusive_group(required=True)
    evidence.add_argument("--evidence", metavar="FILE", type=path, help="the file the step produced: its SHA-256 is recorded")
    evidence.add_argument("--note", metavar="TEXT", type=reason, help="what was done and how you know")
    add_json(checkpoint, "{status, step, record, outcome, next, exit_code}")

    done = add(
        "done",
        "end a checkpointed session done, if the contract's completion evidence is recorded",
        "Check the run contract's completion evidence against what was recorded: end the run done, or refuse "
        "(exit 1), naming what is missing, and write nothing.",
        SESSION_EPILOG,
    )
    add_store(done, task=True)
    add_json(done, "{status, missing, notes, outcome, next, exit_code}")

    stop = add(
        "stop",
        "record a legal stop in a checkpointed session (blocked, needs a decision) for a person to answer",
        "Record a stop: a question for a person (step decision-N), so the next session sees it. Until a person "
        "answers it with `longrun answer STORE TASK decision-N VALUE`, every command stops awaiting-input.",
        SESSION_EPILOG,
    )
    add_store(stop, task=True)
    stop.add_argument("--reason", metavar="TEXT", type=reason, required=True, help="why: what is blocked or must be decided")
    add_json(stop, "{status, step, outcome, next, exit_code}")

    mcp = add(
        "mcp",
        "serve a checkpointed session's tools to an agent over the Model Context Protocol (stdio)",
        "Serve the Level A commands as MCP tools (longrun_init, longrun_next, longrun_exec, longrun_checkpoint, "
        "longrun_done, longrun_stop, longrun_status), each task's contract, status and history as longrun://TASK/... "
        "resources, and the continuation rule as a prompt, over stdin and stdout (JSON-RPC 2.0, one message a line). "
        "Each tool is the same call as its command, with the same guarantees. There is no tool to approve, answer or "
        "cancel: a person does that with longrun approve, answer and cancel. Register it with an MCP host as the "
        "command `longrun mcp STORE --task TASK`. It serves until stdin ends; the library's log goes to stderr.",
        _MCP_EPILOG,
    )
    add_store(mcp, task=False)
    mcp.add_argument("--task", metavar="TASK", help="serve this task only (its tools then need no task argument)")
    mcp.add_argument(
        "--control-root", metavar="DIR", type=path,
        help="read approvals and cancellations from DIR (a control area only the approver's account can write, read "
        "by a strict FileControlSource) instead of from the store",
    )  # fmt: skip
    mcp.add_argument(
        "--create-store", action="store_true", help="create the store if it does not exist (a directory, or sqlite:PATH's file)"
    )
    mcp.add_argument("--json", action="store_true", help="accepted as by every command: stdout carries only JSON-RPC messages anyway")

    demo = add(
        "demo",
        "run a fictional 5-step task, SIGKILL its worker mid-effect, resume, check exactly-once",
        "Run a fictional newsletter task in a worker process that is SIGKILLed right after "
        "its third effect, resume it here, and check that every effect happened exactly once.",
    )
    demo.add_argument("--keep", metavar="DIR", type=path, help="run in DIR (new or empty) and keep it, instead of a temporary directory")
    demo.add_argument("--worker", metavar="ROOT", type=path, help=argparse.SUPPRESS)
    add_json(demo, "a summary {passed, checks, outcome} (the narrative goes to stderr)")
    return parser
