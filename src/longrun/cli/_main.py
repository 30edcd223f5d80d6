"""The argument parser and ``main``: turn a command line into one command call and an exit code.

Guarantees: ``main`` returns an int and never raises for operator mistakes or storage trouble;
each error is one ``longrun: error: ...`` line on stderr with the exit code from
``_common.ExitCode`` (argparse's own usage errors exit 2 as well). Output meant for the operator
goes to stdout; warnings, prompts and errors go to stderr. The library's log records are routed to
stderr only for the duration of the call.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import traceback
from typing import Sequence

from ..errors import CorruptStateError, LongrunError, StorageError
from ._common import EXIT_CODES_HELP, CliError, ExitCode, exit_code_for, login_name

__all__ = ["build_parser", "main"]

INTERNAL_ERROR = 70
"""A bug in longrun (an exception the CLI did not expect); the traceback is printed."""

DESCRIPTION = "Inspect and steer durable longrun tasks kept in a JSON-file store directory."
EPILOG = EXIT_CODES_HELP + f"  {INTERNAL_ERROR} internal error (a bug in longrun; the traceback is printed)\n"


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number of seconds")
    return value


def _non_empty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def _add_authority_options(command: argparse.ArgumentParser, record: str) -> None:
    command.add_argument(
        "--sign-key",
        metavar="FILE",
        help=f"sign the {record} with HMAC-SHA256 under the key in FILE (mode 0600, at least 32 bytes), "
        "for a runner that accepts only signed records",
    )
    command.add_argument(
        "--control-root",
        metavar="DIR",
        help=f"write the {record} under DIR (an existing control area read by a strict FileControlSource) "
        "instead of into the store",
    )


def build_parser() -> argparse.ArgumentParser:
    common = {"epilog": EPILOG, "formatter_class": argparse.RawDescriptionHelpFormatter}
    parser = argparse.ArgumentParser(prog="longrun", description=DESCRIPTION, **common)  # type: ignore[arg-type]
    parser.add_argument("-v", "--verbose", action="count", default=0, help="show the library's log: -v info, -vv debug")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = commands.add_parser(
        "demo",
        help="run a fictional 5-step task, SIGKILL its worker mid-effect, resume, check exactly-once",
        description="Run a fictional newsletter task in a worker process that is SIGKILLed right after "
        "its third effect, resume it here, and check that every effect happened exactly once.",
        **common,  # type: ignore[arg-type]
    )
    demo.add_argument("--keep", metavar="DIR", help="run in DIR (new or empty) and keep it, instead of a temporary directory")
    demo.add_argument("--worker", metavar="ROOT", help=argparse.SUPPRESS)

    status = commands.add_parser(
        "status",
        help="show one task's state, lease, effects, pending approvals and next action (read-only)",
        description="Show a task's status, revision, plan digest, lease, effects, pending approval "
        "requests and its one next action. Read-only: takes no lease, moves no file.",
        **common,  # type: ignore[arg-type]
    )
    status.add_argument("dir", metavar="DIR", help="the store directory (a JsonFileStore root)")
    status.add_argument("task", metavar="TASK", help="the task id")
    status.add_argument(
        "--json", action="store_true", help="print one JSON object: state.to_json() plus store_lease, load and checked_at"
    )

    approve = commands.add_parser(
        "approve",
        help="approve a task's pending approval request (exactly its scope, once)",
        description="Show the task's pending approval request and write an approval bound to its "
        "task, plan digest, step, payload digest and action. It authorizes that one effect, once.",
        **common,  # type: ignore[arg-type]
    )
    approve.add_argument("dir", metavar="DIR", help="the store directory")
    approve.add_argument("task", metavar="TASK", help="the task id")
    approve.add_argument("--step", metavar="STEP", help="which pending request, when there are several")
    approve.add_argument("--approver", metavar="NAME", type=_non_empty, help="who approves (default: the login name)")
    approve.add_argument(
        "--ttl", metavar="SECONDS", type=_positive_seconds, default=3600.0, help="how long the approval is valid (default 3600)"
    )
    approve.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    _add_authority_options(approve, "approval")

    cancel = commands.add_parser(
        "cancel",
        help="ask a task to start no new effect; its next run ends cancelled",
        description="Write the task's cancellation record. The runner reads it before every new "
        "effect; an effect already in flight is still reconciled, then the run ends cancelled.",
        **common,  # type: ignore[arg-type]
    )
    cancel.add_argument("dir", metavar="DIR", help="the store directory")
    cancel.add_argument("task", metavar="TASK", help="the task id")
    cancel.add_argument("--reason", metavar="TEXT", type=_non_empty, default="cancelled by an operator from the command line")
    cancel.add_argument("--by", metavar="NAME", type=_non_empty, help="who cancels (default: the login name)")
    _add_authority_options(cancel, "cancellation")

    listing = commands.add_parser(
        "ls", help="list the tasks in a store with status, revision and next action", **common  # type: ignore[arg-type]
    )
    listing.add_argument("dir", metavar="DIR", help="the store directory")
    return parser


def _dispatch(args: argparse.Namespace) -> int:
    out, err = sys.stdout, sys.stderr
    if args.command == "demo":
        from ._demo import run_demo, run_worker  # imports the runner: only when asked for

        if args.worker is not None:
            return run_worker(args.worker, out)
        return run_demo(args.keep, out)
    if args.command == "status":
        from ._inspect import cmd_status

        return cmd_status(args.dir, args.task, args.json, out)
    if args.command == "ls":
        from ._inspect import cmd_ls

        return cmd_ls(args.dir, out)
    if args.command == "approve":
        from ._control import cmd_approve

        return cmd_approve(
            args.dir,
            args.task,
            step=args.step,
            approver=args.approver or login_name(),
            ttl_s=args.ttl,
            assume_yes=args.yes,
            out=out,
            err=err,
            sign_key=args.sign_key,
            control_root=args.control_root,
        )
    if args.command == "cancel":
        from ._control import cmd_cancel

        return cmd_cancel(
            args.dir,
            args.task,
            reason=args.reason,
            requested_by=args.by or login_name(),
            out=out,
            err=err,
            sign_key=args.sign_key,
            control_root=args.control_root,
        )
    raise AssertionError(f"unhandled command {args.command!r}")  # pragma: no cover


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, CorruptStateError):
        return f"damaged state: {exc}"
    if isinstance(exc, StorageError):
        return f"storage error: {exc}"
    if isinstance(exc, OSError) and not isinstance(exc, LongrunError):
        return f"storage error: {exc}"
    return str(exc)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``longrun`` command line; return its exit code (see ``--help``)."""
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
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
