"""A run that failed: the record of its last failure, and how failures in a row are counted.

``RunFailure`` is what a task's state keeps of the last time a run of it failed: the durable
function's own code raised (``kind`` ``"exception"``: the exception's type, message and a bounded
traceback), or the process running it died inside a step (``kind`` ``"crash"``: found by the next
run, which takes a new lease epoch over a state still recorded ``running``). It is committed in the
same revision that schedules the retry (status ``retry-scheduled``, ``retry_at``) or ends the task
(status ``failed``, once ``Limits.max_failures`` failures came in a row).

Failures in a row: ``attempt`` counts the failures since the run last made progress. Progress is
a step settled (verified, or a call that failed and is replayed as recorded): ``progress`` holds how
many steps were settled when the failure was recorded, and a failure that finds more settled starts
the count again at 1 (``next_attempt``).

Not guaranteed: that a crash is told from a lost lease (a runner that paused past its lease, and
was taken over mid-step, counts as a crash too: it too never recorded a stop), or that the
traceback is whole (it keeps the innermost ``MAX_TRACEBACK_CHARS``).
"""

from __future__ import annotations

import os
import traceback
import types
from dataclasses import dataclass
from typing import Any, Mapping

from . import _fields as f
from .canonical import JSONValue, printable
from .errors import CorruptStateError, InvalidInputError, exception_message, exception_type_name

__all__ = ["CRASH_TYPE", "FAILURE_KINDS", "MAX_MESSAGE_CHARS", "MAX_TRACEBACK_CHARS", "RunFailure", "next_attempt"]

MAX_TRACEBACK_CHARS = 8_000
"""The most of a traceback a failure record keeps: its end (the innermost frames and the error)."""
_MAX_PIECE_CHARS = 1_000
"""The most of one piece of a traceback (a frame, the error line) a failure record keeps."""
MAX_MESSAGE_CHARS = 2_000
"""The most of an exception's message a failure record keeps."""
CRASH_TYPE = "ProcessDied"
"""The ``error_type`` of a crash: the process died inside a step (killed, out of memory, a segfault)."""
FAILURE_KINDS = ("exception", "crash")

_SPEC = (
    f.Field("kind", f.Kind.TEXT),
    f.Field("error_type", f.Kind.TEXT),
    f.Field("message", f.Kind.TEXT),
    f.Field("traceback", f.Kind.TEXT),
    f.Field("attempt", f.Kind.INT, minimum=1),
    f.Field("max_failures", f.Kind.INT, minimum=1),
    f.Field("at", f.Kind.NUMBER),
    f.Field("epoch", f.Kind.INT),
    f.Field("revision", f.Kind.INT),
    f.Field("progress", f.Kind.INT),
    f.Field("step", f.Kind.TEXT, optional=True),
    f.Field("retry_at", f.Kind.NUMBER, optional=True),
)
_FIELDS = frozenset(field.name for field in _SPEC)


def _bounded_tail(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"[{len(text) - limit} characters cut]\n" + text[-limit:]


def _bounded_head(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    end = "\n" if text.endswith("\n") else ""
    return text[:limit] + f" [{len(text) - limit} characters cut]" + end


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _from_user_code(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback from its first frame outside longrun (the engine frames that called the
    function say nothing about its bug); the whole of it if every frame is longrun's."""
    first = tb
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_PACKAGE):
        tb = tb.tb_next
    return tb if tb is not None else first


def _problem(kind: object, attempt: object, max_failures: object) -> str | None:
    if kind not in FAILURE_KINDS:
        return f"field 'kind' must be one of {list(FAILURE_KINDS)}, got {kind!r:.40}"
    if isinstance(attempt, int) and isinstance(max_failures, int) and attempt > max_failures:
        return f"attempt {attempt} is over max_failures {max_failures}"
    return None


@dataclass(frozen=True, slots=True)
class RunFailure:
    """The last failure of a task's run (see the module docstring)."""

    kind: str
    """``"exception"`` (the function's code raised) or ``"crash"`` (the process died in a step)."""
    error_type: str
    """The exception's type name (``ValueError``), or ``ProcessDied`` for a crash."""
    message: str
    traceback: str
    """The formatted traceback, at most ``MAX_TRACEBACK_CHARS`` (its end); empty for a crash."""
    attempt: int
    """Failures in a row so far, this one included (progress starts the count again)."""
    max_failures: int
    """``Limits.max_failures`` when it was recorded: at ``attempt == max_failures`` the task is ``failed``."""
    at: float
    """When it was recorded, by the run's clock."""
    epoch: int
    """The lease epoch of the run that failed (for a crash: of the run that found it)."""
    revision: int
    """The revision that recorded it: when it is the state's latest, the task's last run failed."""
    progress: int
    """Steps settled when it was recorded."""
    step: str | None = None
    """The step the run was in (the last one started), if any."""
    retry_at: float | None = None
    """When the task is run again (None once it is ``failed``, or for a crash found by a run that goes on)."""

    def __post_init__(self) -> None:
        for name in ("message", "traceback", "error_type"):
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, printable(value))
        f.check(_SPEC, self, "run failure")
        problem = _problem(self.kind, self.attempt, self.max_failures)
        if problem is not None:
            raise InvalidInputError(f"run failure: {problem}")

    @classmethod
    def of_exception(cls, exc: BaseException, **fields: Any) -> "RunFailure":
        """The record of ``exc`` raised by the function's code (its message and traceback bounded)."""
        try:
            # Each piece bounded (a message of a megabyte is one), then the whole, keeping its end.
            pieces = traceback.format_exception(type(exc), exc, _from_user_code(exc.__traceback__))
            trace = "".join(_bounded_head(piece, _MAX_PIECE_CHARS) for piece in pieces)
        except Exception:  # a traceback that cannot be formatted (an exception whose __str__ raises, say)
            trace = f"{exception_type_name(exc)}: <traceback could not be formatted>"
        return cls(
            kind="exception",
            error_type=exception_type_name(exc),
            message=_bounded_head(exception_message(exc), MAX_MESSAGE_CHARS),
            traceback=_bounded_tail(trace, MAX_TRACEBACK_CHARS),
            **fields,
        )

    @property
    def failed_for_good(self) -> bool:
        """Whether this failure ended the task ``failed`` (the limit of failures in a row was reached)."""
        return self.attempt >= self.max_failures

    def summary(self) -> str:
        """One line for people: ``ValueError: bad input (failure 2 of 5, in step 'lookup')``."""
        where = "" if not self.step else (f", inside step {self.step!r}" if self.kind == "crash" else f", last step {self.step!r}")
        what = "the process died inside a step" if self.kind == "crash" else f"{self.error_type}: {self.message}"
        return f"{what} (failure {self.attempt} of {self.max_failures} in a row{where})"

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "kind": self.kind,
            "error_type": self.error_type,
            "message": self.message,
            "traceback": self.traceback,
            "attempt": self.attempt,
            "max_failures": self.max_failures,
            "at": self.at,
            "epoch": self.epoch,
            "revision": self.revision,
            "progress": self.progress,
            "step": self.step,
            "retry_at": self.retry_at,
        }

    @classmethod
    def from_json(cls, data: object) -> "RunFailure":
        what = "run failure"
        d: Mapping[str, Any] = f.require_mapping(data, what)
        f.check_fields(d, _FIELDS, what)
        values = f.read(_SPEC, d, what)
        problem = _problem(values["kind"], values["attempt"], values["max_failures"])
        if problem is not None:
            raise CorruptStateError(f"{what}: {problem}")
        return cls(**values)


def next_attempt(previous: RunFailure | None, progress: int, failures: int = 1) -> int:
    """The ``attempt`` after ``failures`` more failures found with ``progress`` steps settled, after
    ``previous``: ``failures`` more than it, unless the run made progress since (then ``failures``)."""
    if previous is None or progress != previous.progress:
        return failures
    return previous.attempt + failures
