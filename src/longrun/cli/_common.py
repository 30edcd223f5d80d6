"""What every command shares: exit codes, the operator-facing error, opening a store, formatting.

Owns the mapping from longrun's exception tree to exit codes (``exit_code_for``) and the few
text helpers the commands print with. Guarantees: opening a store never creates its root, and a
task id is checked before any path is built from it. Not owned here: printing (the commands do it).
"""

from __future__ import annotations

import enum
import getpass
import math
import os
import time

from ..contract import check_task_id
from ..errors import CorruptStateError, InvalidInputError, StorageError
from ..lease import Lease
from ..outcome import Evidence
from ..stores import JsonFileStore

__all__ = [
    "EXIT_CODES_HELP",
    "CliError",
    "ExitCode",
    "checked_task",
    "evidence_line",
    "exit_code_for",
    "format_duration",
    "format_time",
    "lease_summary",
    "login_name",
    "open_store",
    "relative",
    "short_digest",
]


class ExitCode(enum.IntEnum):
    OK = 0
    NOT_AS_ASKED = 1
    """The run is not done, or not in the state the command needs (demo: a check failed)."""
    USAGE = 2
    """Bad arguments or input: argparse's own errors, an unknown task, a missing directory."""
    STORAGE = 3
    """The store could not be read or written, or its state is damaged."""


EXIT_CODES_HELP = """\
exit codes:
  0  ok
  1  the run is not done / not in the state the command needs (demo: a check failed)
  2  usage or bad input: wrong arguments, unknown task, missing directory, unsafe task id
  3  storage error or damaged (corrupt) state
"""


class CliError(Exception):
    """An error the CLI reports as one line on stderr and an exit code."""

    def __init__(self, message: str, code: ExitCode):
        super().__init__(message)
        self.code = code


def exit_code_for(exc: BaseException) -> ExitCode:
    """The exit code for an error from the library (see the ``errors`` module's tree)."""
    if isinstance(exc, CliError):
        return exc.code
    if isinstance(exc, InvalidInputError):  # includes UnknownTaskError
        return ExitCode.USAGE
    if isinstance(exc, (CorruptStateError, StorageError, OSError)):
        return ExitCode.STORAGE
    raise TypeError(f"no exit code for {type(exc).__name__}")  # pragma: no cover


def open_store(directory: str) -> JsonFileStore:
    """A ``JsonFileStore`` on an existing directory; a missing one is a usage error, never created."""
    if not os.path.exists(directory):
        raise CliError(f"store directory {directory!r} does not exist", ExitCode.USAGE)
    if not os.path.isdir(directory):
        raise CliError(f"{directory!r} is not a directory", ExitCode.USAGE)
    return JsonFileStore(directory)


def checked_task(task_id: str) -> str:
    """``task_id`` if it is a safe single path component; else ``InvalidInputError`` (exit 2)."""
    return check_task_id(task_id)


def login_name() -> str:
    """The operator's login name, for approvals and cancellations; ``"operator"`` if unknown."""
    try:
        return getpass.getuser() or "operator"
    except Exception:  # getuser raises OSError or KeyError when no user can be found
        return "operator"


def short_digest(digest: str, length: int = 12) -> str:
    """``sha256:<first hex digits>`` for display; the full digest stays in the state."""
    algorithm, _, hex_part = digest.partition(":")
    return f"{algorithm}:{hex_part[:length]}" if hex_part else digest[:length]


def format_time(at: float | None) -> str:
    if at is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(at))


def format_duration(seconds: float) -> str:
    seconds = abs(seconds)
    if not math.isfinite(seconds):
        return "forever"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"


def relative(at: float, now: float) -> str:
    """``in 3.0s`` or ``3.0s ago``."""
    return f"in {format_duration(at - now)}" if at > now else f"{format_duration(now - at)} ago"


def lease_summary(lease: Lease | None, now: float) -> str:
    if lease is None:
        return "none (never acquired)"
    state = "expired" if lease.expired(now) else "held"
    return (
        f"{state}: owner {lease.owner}, epoch {lease.epoch}, "
        f"expires {format_time(lease.expires_at)} ({relative(lease.expires_at, now)})"
    )


def evidence_line(item: Evidence) -> str:
    return f"[{item.source}] {item.detail}"
