"""The checks every argument passes before anything is opened, and the options several commands share.

Every argument is checked before anything is opened (a usage error, exit 2): paths must be free
of NUL bytes and at most ``MAX_PATH_BYTES``; ``TASK`` and ``--step`` must be safe
names; ``--ttl`` a finite number of seconds in (0, ``MAX_TTL_S``]; ``--approver``, ``--by`` and
``--reason`` non-empty text without control characters, at most ``MAX_NAME_CHARS`` and
``MAX_REASON_CHARS`` characters, so that a record the CLI writes is one every reader accepts.
Each check is an argparse ``type``: it raises ``argparse.ArgumentTypeError``.
"""

from __future__ import annotations

import argparse
import math
import os
import re

from ..contract import check_step_id
from ..errors import InvalidInputError
from ..messages import check_topic

__all__ = [
    "LOG_FORMATS",
    "LOG_LEVELS",
    "MAX_NAME_CHARS",
    "MAX_PATH_BYTES",
    "MAX_REASON_CHARS",
    "MAX_TTL_S",
    "action_limit",
    "add_authority_options",
    "add_json",
    "add_log_options",
    "add_module_options",
    "add_store",
    "add_task_filters",
    "moment",
    "statuses",
    "count",
    "interval",
    "non_empty",
    "path",
    "port",
    "positive_int",
    "positive_seconds",
    "priority",
    "reason",
    "since",
    "step_id",
    "text_argument",
    "topic_name",
]


MAX_TTL_S = 10 * 366 * 86_400.0
"""The longest ``--ttl``: ten years. Longer is a typo, and a time far enough out cannot be shown."""
MAX_NAME_CHARS = 256
"""``--approver`` and ``--by``."""
MAX_REASON_CHARS = 4096
"""``--reason``: with the other fields, a record stays far below the readers' 64 KiB limit."""
MAX_PATH_BYTES = 4096
"""A path argument (PATH_MAX on Linux)."""
_CONTROL_CHARACTERS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def priority(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not -(2**31) <= value < 2**31:
        raise argparse.ArgumentTypeError("a priority is an integer in [-2147483648, 2147483647]")
    return value


def count(low: int, high: int):  # type: ignore[no-untyped-def]
    def check(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in [{low}, {high}]")
        return value

    return check


def action_limit(text: str) -> tuple[str, int]:
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


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} must be a positive number of seconds")
    if value > MAX_TTL_S:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is more than ten years ({MAX_TTL_S:.0f} seconds)")
    return value


def text_argument(limit: int, what: str):  # type: ignore[no-untyped-def]
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


non_empty = text_argument(MAX_NAME_CHARS, "the name")
reason = text_argument(MAX_REASON_CHARS, "the reason")


def _encodable(text: str) -> bool:
    """False for text holding a lone surrogate (how Python passes on argument bytes that are not UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def path(text: str) -> str:
    """An argparse type for a path: no NUL byte (which no system call takes), bounded. An empty one
    passes, so that the command says what it needed there."""
    if "\0" in text or len(os.fsencode(text)) > MAX_PATH_BYTES:
        raise argparse.ArgumentTypeError(f"{text[:80]!r} is not a usable path")
    return text


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} must be at least 1")
    return value


def since(text: str) -> str:
    from ._inspect import parse_since

    try:
        parse_since(text, 0.0)
    except InvalidInputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def moment(option: str):  # type: ignore[no-untyped-def]
    """An argparse type for ``--since``, ``--until``, ``--before``: a duration back from now or a time."""

    def check(text: str) -> str:
        from ._filters import parse_moment

        try:
            parse_moment(text, 0.0, option=option)
        except InvalidInputError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text

    return check


def statuses(choices: tuple[str, ...]):  # type: ignore[no-untyped-def]
    """An argparse type for ``--status``: one status or several separated by commas, each one of ``choices``."""

    def check(text: str) -> tuple[str, ...]:
        from ._filters import parse_statuses

        try:
            return parse_statuses([text], choices)
        except InvalidInputError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return check


def add_task_filters(command: argparse.ArgumentParser, choices: tuple[str, ...], what: str) -> None:
    """The options that choose tasks instead of naming one (``_filters.TaskFilter``)."""
    command.add_argument(
        "--status", dest="filter_statuses", metavar="S[,S...]", type=statuses(choices), action="append", default=[],
        help=f"{what} the tasks with this status (repeatable, or comma-separated)",
    )  # fmt: skip
    command.add_argument(
        "--function", dest="filter_functions", metavar="MODULE:QUALNAME", action="append", default=[], type=non_empty,
        help="only the tasks of this durable function (a glob is allowed; repeatable)",
    )  # fmt: skip
    command.add_argument("--since", dest="filter_since", metavar="DURATION|TIME", type=moment("--since"), help="only tasks updated since (30m, 2d, 2026-11-30T14:00Z)")
    command.add_argument("--until", dest="filter_until", metavar="DURATION|TIME", type=moment("--until"), help="only tasks updated until (a duration back from now, or a time)")
    command.add_argument("--match", dest="filter_match", metavar="GLOB", type=non_empty, help="only tasks whose id matches GLOB (nightly-*)")


def interval(text: str) -> float:
    value = positive_seconds(text)
    if value < 0.05 or value > 3600:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: the interval must be between 0.05 and 3600 seconds")
    return value


def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a port number (0-65535)")
    return value


def topic_name(text: str) -> str:
    """A message topic or an event key (``messages.check_topic``)."""
    try:
        return check_topic(text)
    except InvalidInputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def step_id(text: str) -> str:
    try:
        return check_step_id(text)
    except InvalidInputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_module_options(command: argparse.ArgumentParser) -> None:
    """``--path`` and ``--json`` of the commands that import a task's code and run it once."""
    command.add_argument(
        "--path", metavar="DIR", type=path, action="append", default=[], help="search DIR for MODULE first (repeatable)"
    )
    add_json(command, "the outcome (RunOutcome.to_json())")


def add_authority_options(command: argparse.ArgumentParser, record: str) -> None:
    command.add_argument(
        "--sign-key",
        metavar="FILE",
        type=path,
        help=f"sign the {record} with HMAC-SHA256 under the key in FILE (mode 0600, at least 32 bytes), "
        "for a runner that accepts only signed records",
    )
    command.add_argument(
        "--control-root",
        metavar="DIR",
        type=path,
        help=f"write the {record} under DIR (an existing control area read by a strict FileControlSource) "
        "instead of into the store",
    )


def add_store(command: argparse.ArgumentParser, *, task: bool, task_optional: bool = False) -> None:
    command.add_argument(
        "store", metavar="STORE", nargs="?", type=path, help="the store: a directory, sqlite:PATH or postgresql://... (or use --store)"
    )
    if task and task_optional:
        command.add_argument("task", metavar="TASK", nargs="?", help="the task id (or choose tasks with the filter options)")
    elif task:
        command.add_argument("task", metavar="TASK", help="the task id")
    command.add_argument(
        "--store", dest="store_option", metavar="SPEC", type=path, help="the store, instead of the STORE argument"
    )


def add_json(command: argparse.ArgumentParser, what: str) -> None:
    command.add_argument("--json", action="store_true", help=f"print JSON on stdout: {what}")


LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")


def add_log_options(command: argparse.ArgumentParser, *, first: bool) -> None:
    """``--log-format`` and ``--log-level``, before the command or after it (``first``: before,
    under a dest of its own, so that a subcommand's default does not overwrite what was given)."""
    suffix = "_first" if first else ""
    command.add_argument(
        "--log-format", dest="log_format" + suffix, choices=LOG_FORMATS, default=None,
        help="the library's log on stderr: text (default) or json, one object a line; both with ISO-8601 UTC times",
    )  # fmt: skip
    command.add_argument(
        "--log-level", dest="log_level" + suffix, choices=LOG_LEVELS, default=None,
        help="the least severe log records shown (default warning; -v is info, -vv debug)",
    )  # fmt: skip
