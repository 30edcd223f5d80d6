"""What every command shares: exit codes, the operator-facing error, opening a store, formatting.

Owns the mapping from longrun's exception tree to exit codes (``exit_code_for``), the one way the
commands open a store from what the operator typed (``open_store``), and the few text helpers the
commands print with. Guarantees: opening a store never creates it (a missing JSON-file directory
or SQLite file is a usage error, exit 2), and a task id is checked before any path is built from
it. Not owned here: printing (the commands do it).
"""

from __future__ import annotations

import enum
import getpass
import json
import math
import os
import re
import shlex
import time
import urllib.parse
from typing import TextIO

from ..contract import check_task_id
from ..errors import CorruptStateError, InvalidInputError, LongrunError, StorageError, exception_message
from ..lease import Lease
from ..outcome import Evidence
from ..protocols import ClosableStore, Store

__all__ = [
    "EXIT_CODES_HELP",
    "STORE_HELP",
    "CliError",
    "ExitCode",
    "TaskCodeError",
    "checked_task",
    "error_text",
    "close_store",
    "evidence_line",
    "exit_code_for",
    "format_duration",
    "format_time",
    "lease_summary",
    "login_name",
    "name_store",
    "open_store",
    "relative",
    "short_digest",
    "store_label",
    "write_json",
]


class ExitCode(enum.IntEnum):
    OK = 0
    NOT_AS_ASKED = 1
    """The run is not done, or not in the state the command needs (demo: a check failed)."""
    USAGE = 2
    """Bad arguments or input: argparse's own errors, an unknown task, a missing store."""
    STORAGE = 3
    """The store could not be read or written, or its state is damaged."""
    ENDED = 4
    """``resume`` and ``verify`` only: the run ended without finishing (cancelled, limits-exhausted, deadline-exceeded, blocked)."""


EXIT_CODES_HELP = """\
exit codes:
  0  ok
  1  the run is not done / not in the state the command needs (demo: a check failed)
  2  usage or bad input: wrong arguments, unknown task, missing store, unsafe task id
  3  storage error or damaged (corrupt) state
  4  resume, verify: the run ended without finishing (cancelled, limits-exhausted, deadline-exceeded, blocked)
"""

STORE_HELP = """\
stores:
  STORE (or --store SPEC) names the store: a JSON-file store directory, sqlite:PATH (an existing
  SQLite file), or postgresql://user:password@host/db (needs psycopg or pg8000). Give it either as
  the first argument or with --store, not both. The CLI never creates a store.
"""


class CliError(Exception):
    """An error the CLI reports as one line on stderr and an exit code."""

    def __init__(self, message: str, code: ExitCode):
        super().__init__(message)
        self.code = code


class TaskCodeError(Exception):
    """``resume``: the task's ``run()`` raised an exception that is not longrun's (its cause).

    Reported with the cause's traceback and exit 70: it is the task's own code (a payload
    factory) or a bug in longrun, and a person needs the traceback to tell which.
    """


def exit_code_for(exc: BaseException) -> ExitCode:
    """The exit code for an error from the library (see the ``errors`` module's tree)."""
    if isinstance(exc, CliError):
        return exc.code
    if isinstance(exc, InvalidInputError):  # includes UnknownTaskError
        return ExitCode.USAGE
    if isinstance(exc, (CorruptStateError, StorageError, OSError)):
        return ExitCode.STORAGE
    raise TypeError(f"no exit code for {type(exc).__name__}")  # pragma: no cover


_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def open_store(spec: str) -> Store:
    """The store ``spec`` names (see ``STORE_HELP``), which must already exist; else exit 2.

    A ``sqlite:`` or ``postgresql://`` spec goes to ``longrun.stores.open_store`` with
    ``create=False`` (so a SQLite file that holds another application's tables is refused by the
    store, unchanged); anything else is a JSON-file store directory, checked here so that a
    missing directory or a plain file gets a message that says which.
    """
    from ..stores import open_store as open_spec  # the SQL stores load only when named

    if not spec:
        raise CliError("the store is empty: give a directory, sqlite:PATH or postgresql://...", ExitCode.USAGE)
    if spec.startswith(("sqlite:", "postgresql://", "postgres://")):
        return open_spec(spec, create=False)
    if not os.path.exists(spec):
        if _URL.match(spec):
            raise CliError(
                f"unknown kind of store {spec.split('://', 1)[0]!r}: use a directory, sqlite:PATH or postgresql://...",
                ExitCode.USAGE,
            )
        raise CliError(f"store directory {spec!r} does not exist", ExitCode.USAGE)
    if not os.path.isdir(spec):
        raise CliError(
            f"{spec!r} is not a directory (a SQLite store is named sqlite:{spec})" if spec.endswith((".db", ".sqlite", ".sqlite3"))
            else f"{spec!r} is not a directory",
            ExitCode.USAGE,
        )
    return open_spec(spec, create=False)


def close_store(store: object) -> None:
    """Close a store that holds descriptors or a connection (``ClosableStore``)."""
    if isinstance(store, ClosableStore):
        store.close()


def store_label(spec: str) -> str:
    """How to name the store in output: the spec as typed, with any password in a URL masked."""
    if not _URL.match(spec):
        return os.path.abspath(spec) if not spec.startswith("sqlite:") else spec
    try:
        parts = urllib.parse.urlsplit(spec)
        if parts.password is None:
            return spec
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    except ValueError:
        return spec.split("://", 1)[0] + "://..."


STORE_PLACEHOLDER = "<store>"
"""What a next action recorded by a run says for a store it could not name; a command puts the
store it read the action from in its place (``name_store``)."""


def name_store(text: str, label: str) -> str:
    """``text`` (a next action) with the store it was read from, as one shell word, in place of
    ``<store>``; ``label`` is ``store_label(spec)``."""
    return text.replace(STORE_PLACEHOLDER, shlex.quote(label))


def checked_task(task_id: str) -> str:
    """``task_id`` if it is a safe single path component; else ``InvalidInputError`` (exit 2)."""
    return check_task_id(task_id)


def login_name() -> str:
    """The operator's login name, for approvals and cancellations; ``"operator"`` if unknown."""
    try:
        return getpass.getuser() or "operator"
    except Exception:  # getuser raises OSError or KeyError when no user can be found
        return "operator"


def write_json(out: TextIO, value: object) -> None:
    """One JSON document, indented, keys sorted, newline-terminated."""
    out.write(json.dumps(value, indent=2, sort_keys=True) + "\n")


def short_digest(digest: str, length: int = 12) -> str:
    """``sha256:<first hex digits>`` for display; the full digest stays in the state."""
    algorithm, _, hex_part = digest.partition(":")
    return f"{algorithm}:{hex_part[:length]}" if hex_part else digest[:length]


def format_time(at: float | None, *, precise: bool = False) -> str:
    """UTC, to the second (``precise``: to the millisecond); ``-`` for no time."""
    if at is None:
        return "-"
    try:
        text = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at))
    except (OverflowError, OSError, ValueError):  # a time no calendar can show (a damaged record)
        return f"{at!r:.30} (not a date)"
    if precise:
        text += f".{int((at % 1) * 1000):03d}"
    return text + "Z"


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
    if lease.released:
        return f"expired: owner {lease.owner}, epoch {lease.epoch}, released by its holder"
    state = "expired" if lease.expired(now) else "held"
    return (
        f"{state}: owner {lease.owner}, epoch {lease.epoch}, "
        f"expires {format_time(lease.expires_at)} ({relative(lease.expires_at, now)})"
    )


def evidence_line(item: Evidence) -> str:
    return f"[{item.source}] {item.detail}"


def error_text(exc: BaseException) -> str:
    """The error as one line (a driver's message may span several)."""
    message = exception_message(exc)  # an OSError may come from a user's store or adapter
    if isinstance(exc, CorruptStateError):
        text = f"damaged state: {message}"
    elif isinstance(exc, StorageError) or (isinstance(exc, OSError) and not isinstance(exc, LongrunError)):
        text = f"storage error: {message}"
    else:
        text = message
    return re.sub(r"\s*\n\s*", " ", text.strip())
