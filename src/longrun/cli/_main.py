"""``main``: turn a command line into one command call and an exit code.

Guarantees: ``main`` returns an int and never raises for operator mistakes or storage trouble;
each error is one ``longrun <command>: error: ...`` line on stderr with the exit code from
``_common.ExitCode`` (argparse's own usage errors exit 2 as well, with the command's usage). Output
meant for the operator goes to stdout (with ``--json``, only the JSON document); warnings, prompts
and errors go to stderr. The library's log records are routed to stderr only for the duration of
the call. A traceback is printed only for an exception nobody expected (exit 70): a bug in
longrun, or, under ``resume``, the task's own code raising inside ``run()``.

``--json`` may be given before the command (``longrun --json status ...``) or after it, and so
may ``--log-format text|json`` and ``--log-level`` (``longrun.logging``: ISO-8601 UTC times in both
formats; ``-v`` is ``--log-level info``, ``-vv`` debug).

The store of every command that takes one is named once: as the ``STORE`` argument before
``TASK``, or with ``--store SPEC``. Both at once are accepted only when they agree.

The parser is in ``_parser``, the checks every argument passes before anything is opened in
``_arguments``, the help texts in ``_help``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from typing import TYPE_CHECKING, Sequence, TextIO

from ..errors import LongrunError
from ..logging import configure
from ..protocols import Store
from ._common import (
    CliError,
    ExitCode,
    TaskCodeError,
    checked_task,
    close_store,
    error_text,
    exit_code_for,
    login_name,
    open_store,
    store_label,
)
from ._help import INTERNAL_ERROR
from ._arguments import path
from ._parser import build_parser

if TYPE_CHECKING:
    from ._filters import TaskFilter

__all__ = ["build_parser", "error_text", "main"]

_SESSION_COMMANDS = ("init", "next", "exec", "checkpoint", "done", "stop")
_STORE_COMMANDS = (
    "status", "history", "verify", "approve", "answer", "cancel", "repair", "ls", "watch", "console", "worker", "workers",
    "mcp", "resolve", "fork", "send", "event", "metrics", "delete", "prune", "schedule", "queues", *_SESSION_COMMANDS,
)  # fmt: skip
_TASK_COMMANDS = (
    "status", "history", "verify", "approve", "answer", "cancel", "repair", "watch", "init", "next", "done", "stop", "resolve", "fork",
    "send", "event", "delete",
)  # fmt: skip
_BULK_COMMANDS = ("approve", "cancel")
"""Commands that take a filter (``_filters``) instead of TASK: ``_bulk``."""
_STEP_COMMANDS = ("exec", "checkpoint")
"""Commands with a STEP after TASK (STORE must come first, or be given with --store)."""


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
        return path(spec)  # again: a STORE moved over from TASK did not pass argparse's check
    except argparse.ArgumentTypeError as exc:
        command_parser.error(f"argument STORE: {exc}")


def _dispatch(args: argparse.Namespace) -> int:
    out, err = sys.stdout, sys.stderr
    if args.command == "demo":
        from ._demo import run_demo, run_worker  # imports the runner: only when asked for

        if args.worker is not None:
            return run_worker(args.worker, out)
        return run_demo(args.keep, out, as_json=args.json, err=err)
    reopen_options = (args.reason, args.by, args.add_attempts, args.add_time, args.sign_key, args.control_root) if args.command == "resume" else ()
    if args.command == "resume" and not args.reopen and any(option not in (None, 0, 0.0) for option in reopen_options):
        raise CliError("--reason, --by, --add-attempts, --add-time, --sign-key and --control-root go with --reopen", ExitCode.USAGE)
    filtered = args.command == "resume" and not _task_filter(args).empty
    no_task = _resume_without_task(args)
    if args.command == "resume" and (filtered or args.yes) and not args.reopen:
        raise CliError("a filter (--status, --function, --since, --until, --match) and --yes go with --reopen", ExitCode.USAGE)
    if args.command == "resume" and args.reopen and no_task and not filtered:
        raise CliError(
            "--reopen needs STORE TASK, or STORE and a filter (--status, --function, --since, --until, --match)", ExitCode.USAGE
        )
    if args.command == "resume" and args.reopen and not no_task and filtered:
        raise CliError("give a TASK or a filter (--status, --function, --since, --until, --match), not both", ExitCode.USAGE)
    if args.command == "resume" and args.reopen and args.reason is None:
        raise CliError("--reopen needs --reason TEXT: why the task goes on is recorded", ExitCode.USAGE)
    if args.command == "resume" and no_task and not filtered:
        from ._resume import cmd_resume

        return cmd_resume(args.target, args.path, args.json, out, err, verbose=args.verbose > 0)
    if filtered:
        from ._bulk import REOPEN, cmd_bulk

        store = open_store(args.target)
        try:
            return cmd_bulk(
                store, REOPEN(args.add_attempts, args.add_time), _task_filter(args), assume_yes=args.yes,
                who=args.by or login_name(), reason=args.reason, out=out, err=err, sign_key=args.sign_key,
                control_root=args.control_root, as_json=args.json,
            )  # fmt: skip
        finally:
            close_store(store)
    if args.command == "resume":
        from ._resume import cmd_resume_task

        reopen = None
        if args.reopen:
            reopen = {
                "reason": args.reason, "by": args.by or login_name(), "add_attempts": args.add_attempts, "add_time_s": args.add_time,
                "sign_key": args.sign_key, "control_root": args.control_root,
            }  # fmt: skip
        return cmd_resume_task(path(args.target), args.task, args.path, args.json, out, err, verbose=args.verbose > 0, reopen=reopen)
    if args.command == "start":
        from ._resume import cmd_start

        return cmd_start(
            args.target, args.task, args.args, args.kwargs, args.path, args.json, out, err,
            verbose=args.verbose > 0, run=args.run, priority=args.priority,
        )  # fmt: skip
    spec = args.store_spec
    if (args.command in _TASK_COMMANDS or args.command in _STEP_COMMANDS) and not (args.command in _BULK_COMMANDS and args.task is None):
        checked_task(args.task)  # an unsafe id is refused before the store is opened
    if args.command == "init":
        from ..contractfile import load_contract
        from ._session import create_store

        load_contract(args.contract)  # a bad contract is refused before anything is created
        if args.create_store:
            create_store(spec)
    if args.command == "mcp":
        from ._session import create_store

        if args.task is not None:
            checked_task(args.task)
        if args.create_store:
            create_store(spec)
    store = open_store(spec)
    try:
        return _store_command(args, store, store_label(spec), out, err)
    finally:
        close_store(store)


def _resume_without_task(args: argparse.Namespace) -> bool:
    """``resume`` given no TASK (a function to resume, or a filter). A function, not a condition
    in place: type checkers then keep ``args.task`` unnarrowed for the commands that need it."""
    return bool(args.command == "resume" and args.task is None)


def _task_filter(args: argparse.Namespace) -> "TaskFilter":
    import time

    from ._filters import TaskFilter, parse_moment

    now = time.time()
    return TaskFilter(
        statuses=tuple(status for group in args.filter_statuses for status in group),
        functions=tuple(args.filter_functions),
        since=parse_moment(args.filter_since, now, option="--since") if args.filter_since is not None else None,
        until=parse_moment(args.filter_until, now, option="--until") if args.filter_until is not None else None,
        match=args.filter_match,
    )


def _check_bulk(args: argparse.Namespace) -> None:
    """TASK or a filter, not both; refused before the store is opened."""
    command_parser: argparse.ArgumentParser = args.command_parser
    try:
        chosen = _task_filter(args)
    except LongrunError as exc:
        command_parser.error(str(exc))
    if args.task is not None and not chosen.empty:
        command_parser.error("give a TASK or a filter (--status, --function, --since, --until, --match), not both")
    if args.task is None and chosen.empty:
        command_parser.error("the task is missing: give TASK, or choose tasks with --status, --function, --since, --until or --match")


def _store_command(args: argparse.Namespace, store: Store, label: str, out: TextIO, err: TextIO) -> int:
    if args.command in _BULK_COMMANDS and args.task is None:
        from ._bulk import APPROVE, CANCEL, cmd_bulk

        return cmd_bulk(
            store, APPROVE(args.step) if args.command == "approve" else CANCEL, _task_filter(args), assume_yes=args.yes,
            who=(args.approver if args.command == "approve" else args.by) or login_name(),
            reason=getattr(args, "reason", ""), out=out, err=err, ttl_s=getattr(args, "ttl", None),
            sign_key=args.sign_key, control_root=args.control_root, as_json=args.json,
        )  # fmt: skip
    if args.command == "delete":
        from ._bulk import cmd_delete

        return cmd_delete(store, args.task, out=out, as_json=args.json)
    if args.command == "prune":
        from ._bulk import cmd_prune

        chosen = _task_filter(args)
        return cmd_prune(
            store, args.before, statuses=chosen.statuses, functions=chosen.functions, match=chosen.match,
            since=chosen.since, until=chosen.until, dry_run=args.dry_run, out=out, err=err, as_json=args.json,
        )  # fmt: skip
    if args.command == "worker":
        from ._worker import cmd_worker

        return cmd_worker(
            store, args.modules, args.path, concurrency=args.concurrency, name=args.name, limits=dict(args.limit),
            claim_ttl_s=args.claim_ttl, poll_s=args.poll, as_json=args.json, out=out, err=err, verbose=args.verbose > 0,
            metrics_port=args.metrics_port, version_policy=args.version_policy,
        )  # fmt: skip
    if args.command == "queues":
        from ._worker import cmd_queues

        return cmd_queues(store, args.json, out)
    if args.command == "schedule":
        from ._schedule import cmd_schedule

        return cmd_schedule(store, args, out, err)
    if args.command == "workers":
        from ._worker import cmd_workers

        return cmd_workers(store, args.json, out)
    if args.command == "metrics":
        from ._metrics import cmd_metrics

        return cmd_metrics(store, args.json, out, summaries=args.summaries)
    if args.command == "status":
        from ._inspect import cmd_status

        return cmd_status(store, label, args.task, args.json, out)
    if args.command == "ls":
        from ._inspect import cmd_ls

        return cmd_ls(
            store, label, args.json, out, statuses=args.statuses, since=args.since, limit=args.limit, functions=args.functions,
            match=args.match, long=args.long,
        )  # fmt: skip
    if args.command == "watch":
        from ._watch import cmd_watch

        return cmd_watch(store, args.task, interval=args.interval, out=out, as_json=args.json, label=label)
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

        return cmd_history(store, args.task, args.json, out, label)
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
    if args.command == "resolve":
        from ._intervene import cmd_resolve, parse_result

        return cmd_resolve(
            store, args.task, args.step, applied=args.applied, evidence=args.evidence, by=args.by or login_name(),
            result=parse_result(args.result), key=args.key, payload_digest=args.payload_digest, out=out,
            sign_key=args.sign_key, control_root=args.control_root, as_json=args.json,
        )  # fmt: skip
    if args.command == "fork":
        from ._intervene import cmd_fork
        from ._resume import recorded_function

        checked_task(args.new_task)
        function, _, _ = recorded_function(store, label, args.task, args.path, err, args.verbose > 0)
        return cmd_fork(store, function, args.task, args.new_task, args.from_step, args.json, out)
    if args.command == "send":
        from ._talk import cmd_send

        return cmd_send(
            store, args.task, args.topic, args.value, key=args.key, sender=args.sender or login_name(), out=out, as_json=args.json,
            sign_key=args.sign_key, control_root=args.control_root,
        )
    if args.command == "event":
        from ._talk import cmd_event

        return cmd_event(store, args.task, args.key, wait_s=args.wait, out=out, as_json=args.json)
    if args.command == "repair":
        from ._control import cmd_repair

        return cmd_repair(store, args.task, repaired_by=f"longrun repair ({login_name()})", out=out, as_json=args.json)
    if args.command in _SESSION_COMMANDS:
        return _session_command(args, store, out, err)
    if args.command == "mcp":
        from ._mcp import cmd_mcp

        return cmd_mcp(store, args.store_spec, task=args.task, control_root=args.control_root)
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
    if args.command in _BULK_COMMANDS and args.store is not None and args.task is None and args.store_option is not None:
        args.store, args.task = None, args.store  # `cancel --store SPEC TASK`: the one positional is TASK
    args.json = args.json or args.json_first  # every command takes --json, before it or after it
    args.log_format = args.log_format or args.log_format_first or "text"  # and --log-format, --log-level
    args.log_level = args.log_level or args.log_level_first
    if args.command in _STORE_COMMANDS:
        args.store_spec = _store_spec(args)
    if args.command in _BULK_COMMANDS:
        _check_bulk(args)
    if args.command == "repair" and not args.lease:
        command_parser.error("say what to repair: --lease (the lease record; the state repairs itself on the next run)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``longrun`` command line; return its exit code (see ``--help``)."""
    parser = build_parser()
    try:
        args = _parse(parser, list(argv) if argv is not None else None)
    except SystemExit as exc:  # argparse exits 2 on usage errors and 0 after --help
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else ExitCode.USAGE)
    logger = logging.getLogger("longrun")
    previous_level = logger.level
    level = args.log_level or {0: "warning", 1: "info"}.get(args.verbose, "debug")
    handler = configure(sys.stderr, log_format=args.log_format, level=level)
    try:
        return int(_dispatch(args))
    except (CliError, LongrunError, OSError) as exc:
        if isinstance(exc, BrokenPipeError):
            _silence_stdout()
            return ExitCode.NOT_AS_ASKED
        sys.stderr.write(f"longrun {args.command}: error: {error_text(exc)}\n")
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
