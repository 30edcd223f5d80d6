"""The exception tree of longrun, drawn once.

::

    LongrunError                      root of every error the library raises itself
    +-- InvalidInputError(ValueError) bad arguments: task id, payload, limits, contract, a record
    |   |                             that could not be read back if it were written
    |   +-- SizeLimitError            a value or the state is over a size limit; nothing was written
    |   +-- UnknownActionError        a step names an action with no adapter
    |   +-- UnknownTaskError(LookupError) no such task in the store
    |   +-- ChildCycleError           a durable task asked for itself or an ancestor as its child
    |   +-- ApprovalWaitingError      an approval or answer of the same request already waits, unused
    |   +-- ContractFileError         a run-contract file that cannot be used (its file and line)
    |   +-- NotAStoreError            a directory or database that is not a longrun store (its path)
    |   +-- TaskNotFinishedError      a task asked to be deleted has not ended (its status)
    |   +-- UnknownStepError(LookupError) the task has no step by that id
    |   +-- TaskExistsError           a new task (a fork) was asked for under an id already in use
    |   +-- ResolveRefusedError       an effect's outcome cannot be resolved as asked (not in flight, another key or payload)
    |   +-- ReopenRefusedError        a task cannot be reopened (it is done, or has not ended)
    |   +-- ForkRefusedError          a task cannot be forked from that step (an effect before it is in flight)
    |   +-- CronError                 a cron expression that is not five valid fields (names the field)
    |   +-- ZoneNotFoundError         a time-zone name this machine does not know (install tzdata)
    |   +-- ScheduleError(LookupError) no schedule by that name, or one with another definition
    |   +-- DuplicateTaskError        an enqueue whose dedup_id another task that has not ended holds (names it)
    |   +-- SignatureRequiredError    an unsigned control record for a reader that accepts only signed ones
    +-- StorageError(OSError)         the store could not read or write; __cause__ holds the OSError
    |   +-- FencedError               a write carried an epoch other than the store's current one
    |   +-- LeaseHeldError            another live owner holds the task's lease
    +-- CorruptStateError(ValueError) stored bytes fail validation (checksum, syntax, fields)
    |   +-- ForeignStateError         valid state that belongs to another task
    |   +-- SchemaVersionError        a schema version this code does not know
    |   +-- StateUnrecoverableError   neither the state nor its backup validates
    +-- PayloadError                  a step's payload factory raised; its exception is the cause
    +-- CallFailed                    a durable function's recorded call raised: replayed as recorded
    +-- EffectFailed                  an effect with on_exhausted="raise" used all its attempts: replayed as recorded
    +-- IllegalTransitionError        a ledger move the effect lifecycle does not allow: a bug, never retried
    +-- AdapterError                  base of the two classified adapter failures
        +-- TransientError            the effect did not take place; retry within budget
        +-- PermanentError            the effect did not take place and never will; stop `blocked`

Any other exception escaping ``EffectAdapter.apply`` is treated as "outcome unknown": the
effect becomes ``uncertain`` and is reconciled by observation, never blindly retried.

``exception_message`` and ``describe_exception`` are how longrun describes an exception it did not
raise itself (a user's call, adapter, payload factory or store): a ``__str__`` that raises, or
returns something other than text, is never called unguarded; the description then says
``<unprintable TypeName>``.
"""

from __future__ import annotations

__all__ = [
    "AdapterError",
    "ApprovalWaitingError",
    "CallFailed",
    "ChildCycleError",
    "ContractFileError",
    "CronError",
    "DuplicateTaskError",
    "EffectFailed",
    "CorruptStateError",
    "FencedError",
    "ForeignStateError",
    "ForkRefusedError",
    "IllegalTransitionError",
    "InvalidInputError",
    "LeaseHeldError",
    "LongrunError",
    "NotAStoreError",
    "PayloadError",
    "PermanentError",
    "ReopenRefusedError",
    "ResolveRefusedError",
    "ScheduleError",
    "SchemaVersionError",
    "SignatureRequiredError",
    "SizeLimitError",
    "StateUnrecoverableError",
    "StorageError",
    "TaskNotFinishedError",
    "TaskExistsError",
    "TransientError",
    "UnknownActionError",
    "UnknownStepError",
    "UnknownTaskError",
    "ZoneNotFoundError",
    "describe_exception",
    "exception_message",
    "exception_type_name",
]


def exception_type_name(exc: BaseException) -> str:
    """The name of ``exc``'s type; a metaclass may make even that raise, so it is guarded too."""
    try:
        name = type(exc).__name__
    except Exception:
        return "<unnamed exception type>"
    return name if isinstance(name, str) else "<unnamed exception type>"


def exception_message(exc: BaseException) -> str:
    """``str(exc)``, or ``<unprintable TypeName>`` when its ``__str__`` raises (anything but a
    ``BaseException`` that is not an ``Exception``, such as ``KeyboardInterrupt``, which propagates);
    lone surrogates are escaped, so the text can be stored as JSON."""
    try:
        text = str(exc)
    except Exception:
        return f"<unprintable {exception_type_name(exc)}>"
    # The escaping ``canonical.printable`` does (errors imports nothing of longrun's).
    return text if text.isascii() else text.encode("utf-8", "backslashreplace").decode("utf-8")


def describe_exception(exc: BaseException) -> str:
    """``TypeName: message`` for an exception longrun did not raise itself (see ``exception_message``)."""
    return f"{exception_type_name(exc)}: {exception_message(exc)}"


class LongrunError(Exception):
    """Root of every error longrun raises itself."""


class InvalidInputError(LongrunError, ValueError):
    """An argument is malformed: nothing was written."""


class SizeLimitError(InvalidInputError):
    """A payload, a result or the whole state would be over a size limit that the loaders enforce
    (``limit_name``, such as ``MAX_VALUE_BYTES`` or ``MAX_STATE_BYTES``); nothing was written."""

    def __init__(self, message: str, *, size: int, limit: int, limit_name: str):
        super().__init__(message)
        self.size = size
        self.limit = limit
        self.limit_name = limit_name


class UnknownActionError(InvalidInputError):
    """A step names an action for which no adapter was given."""


class UnknownTaskError(InvalidInputError, LookupError):
    """The store holds no task by that id."""


class ChildCycleError(InvalidInputError):
    """A durable task asked for itself, or one of its ancestors, as its child: it would wait on
    itself for ever. ``lineage`` is the chain from the task up to its root; nothing was started."""

    def __init__(self, message: str, *, child: str, lineage: tuple[str, ...]):
        super().__init__(message)
        self.child = child
        self.lineage = lineage


class ApprovalWaitingError(InvalidInputError):
    """An approval (or an answer) of the same request is already written and not yet used: a second
    one is refused, so that which one counts never depends on storage order. Nothing was written;
    ``waiting`` names the approval id already waiting."""

    def __init__(self, message: str, *, waiting: str):
        super().__init__(message)
        self.waiting = waiting


class NotAStoreError(InvalidInputError):
    """A store was opened on a directory or database that is not a longrun store: it holds no store
    marker and nothing longrun wrote. Nothing was read from it as state, and nothing was written."""

    def __init__(self, message: str, *, path: str):
        super().__init__(message)
        self.path = path


class TaskNotFinishedError(InvalidInputError):
    """A task was asked to be deleted (``Store.delete_task``, ``longrun delete``, ``longrun prune``)
    but its run has not ended: it is not ``done``, ``cancelled``, ``limits-exhausted`` or
    ``blocked``, or it has no committed state yet. ``status`` is what the store holds (``new`` for
    no state). Nothing was deleted."""

    def __init__(self, message: str, *, status: str):
        super().__init__(message)
        self.status = status
class UnknownStepError(InvalidInputError, LookupError):
    """The task records no step by that id; nothing was written."""


class TaskExistsError(InvalidInputError):
    """A new task was asked for (a fork) under an id the store already holds; nothing was written."""


class ResolveRefusedError(InvalidInputError):
    """An effect's outcome cannot be resolved as asked: it is not in flight, is not an effect, or its
    key or payload digest is not the one the person checked. Nothing was written."""


class ReopenRefusedError(InvalidInputError):
    """A task cannot be reopened: it is ``done``, or it has not ended. Nothing was written."""


class ForkRefusedError(InvalidInputError):
    """A task cannot be forked as asked (an effect before the step is still in flight, or the task
    is not a durable function's). Nothing was written."""


class CronError(InvalidInputError):
    """A cron expression that is not five valid fields (the message names the field and why)."""


class ZoneNotFoundError(InvalidInputError):
    """A time-zone name this machine's time-zone database does not know (or it has none: install ``tzdata``)."""


class DuplicateTaskError(InvalidInputError):
    """An enqueue refused: its ``dedup_id`` is held in that queue by ``holder``, a task that has not ended."""

    def __init__(self, message: str, *, holder: str):
        super().__init__(message)
        self.holder = holder


class SignatureRequiredError(InvalidInputError):
    """A control record (a message from outside) written unsigned for a task whose configuration
    accepts only signed records: it would never be used. Nothing was written."""


class ScheduleError(InvalidInputError, LookupError):
    """A schedule that does not exist, or exists with another definition (the message names it)."""


class ContractFileError(InvalidInputError):
    """A run-contract file that cannot be used, with the file and line that hold the problem."""

    def __init__(self, source: str, line: int | None, message: str):
        where = f"{source}, line {line}" if line is not None else source
        super().__init__(f"{where}: {message}")
        self.source = source
        self.line = line
        self.problem = message


class StorageError(LongrunError, OSError):
    """The store could not complete a read or write. The cause is chained."""


class FencedError(StorageError):
    """A write carried a fencing epoch that is not the store's current epoch.

    The writer's lease was taken over (or never issued); the write changed nothing.
    """

    def __init__(self, message: str, *, current_epoch: int | None = None, write_epoch: int | None = None):
        super().__init__(message)
        self.current_epoch = current_epoch
        self.write_epoch = write_epoch


class LeaseHeldError(StorageError):
    """Another owner holds an unexpired lease on the task."""

    def __init__(self, message: str, *, holder: object | None = None):
        super().__init__(message)
        self.holder = holder


class CorruptStateError(LongrunError, ValueError):
    """Stored bytes failed validation. They were not used."""


class ForeignStateError(CorruptStateError):
    """The stored state is well formed but names another task."""


class SchemaVersionError(CorruptStateError):
    """The stored record has a schema version this code does not know."""


class StateUnrecoverableError(CorruptStateError):
    """Neither the state nor its backup validates; damaged files were quarantined."""


class PayloadError(LongrunError):
    """A step's payload callable raised. Nothing was planned for the step; the cause is chained."""


class CallFailed(LongrunError):
    """A durable function's ``run.call`` (or child task) raised; raised into the function.

    The exception's type name and message were recorded when it first happened, and the same
    ``CallFailed`` is raised again on every replay without calling anything, so a function that
    handles it behaves the same way each time. To call again after fixing the cause, give the
    call a new step id.
    """

    def __init__(self, step_id: str, type_name: str, message: str):
        super().__init__(f"step {step_id!r} raised {type_name}: {message}")
        self.step_id = step_id
        self.type_name = type_name
        self.message = message


class EffectFailed(LongrunError):
    """An effect made with ``run.effect(..., on_exhausted="raise")`` used all its attempts, each of
    which certainly did not take place (a transient failure, or observed absent): raised into the
    durable function, which may compensate (a saga) instead of the run stopping ``limits-exhausted``.

    The failure is recorded with the step, so every replay raises the same ``EffectFailed``
    without trying the effect again. ``attempts`` is how many were made; ``last_error`` what the
    last one reported.
    """

    def __init__(self, step_id: str, attempts: int, last_error: str):
        super().__init__(f"effect step {step_id!r} failed after {attempts} attempt{'s' if attempts != 1 else ''}: {last_error}")
        self.step_id = step_id
        self.attempts = attempts
        self.last_error = last_error


class IllegalTransitionError(LongrunError):
    """A ledger move that the effect lifecycle does not allow; a bug in the caller, never retried."""


class AdapterError(LongrunError):
    """Base of the failures an adapter classifies itself."""


class TransientError(AdapterError):
    """Raise from ``apply`` only when the effect certainly did not take place and may succeed later.

    An ambiguous failure (a timeout after the request was sent) must raise anything else, so that
    the runner marks the effect uncertain and observes before any retry.
    """


class PermanentError(AdapterError):
    """Raise from ``apply`` when the effect did not take place and retrying cannot help."""
