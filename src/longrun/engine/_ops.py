"""Every request a step procedure yields: the one way a step reaches anything outside the run.

The step procedures (``engine._steps``, ``engine._effects``) are generators. Every adapter call,
user call and sleep they need, and every read or write of the store and the control sources
(loading the state, committing it, reading the cancellation record and the approvals, sending
and reading messages, the lease to write under), is *yielded* as one of the records below, and the value (or the exception) comes
back at the ``yield``. The two drivers (``engine._drivers``) perform them: the synchronous one at
once in the calling thread, the async one without blocking the event loop (store and control I/O
in the invocation's own I/O thread, adapters awaited or in worker threads), with the commits that
steps ask for together made as one. Every rule (what is durable before what, when to observe,
what a failure means) is written once, in the generators; the drivers only decide how to wait.
"""

from __future__ import annotations

import concurrent.futures
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Generator, TypeVar

from ..adapters import EffectRequest
from ..errors import LongrunError
from ..control import ControlRecord
from ..lease import Lease
from ..messages import Message
from ..protocols import Store

__all__ = [
    "COMMIT",
    "READ_APPROVALS",
    "RENEW_LEASE",
    "CancellationRead",
    "Apply",
    "ApplyInterrupted",
    "ApplyTimedOut",
    "Commit",
    "Gather",
    "Invoke",
    "Observe",
    "Op",
    "Sleep",
    "Load",
    "ReadApprovals",
    "ReadCancellation",
    "ReadStore",
    "RenewLease",
    "ReadMessages",
    "SendMessage",
    "Steps",
    "is_async_callable",
]

T = TypeVar("T")


class ApplyTimedOut(LongrunError):
    """An ``apply`` (or a call) ran past its timeout. Its outcome is unknown.

    ``still_running`` is True when it could not be stopped (a synchronous adapter in a worker
    thread): the run must not apply the effect again while that attempt may still reach the target.
    """

    def __init__(self, timeout_s: float, *, pending: "concurrent.futures.Future[Any] | None" = None):
        still_running = pending is not None and not pending.done()
        super().__init__(f"timed out after {timeout_s:g} s" + ("; the attempt may still be running" if still_running else ""))
        self.timeout_s = timeout_s
        self.pending = pending if still_running else None
        """The attempt that may still be running, to wait for before the lease may be released."""

    @property
    def still_running(self) -> bool:
        return self.pending is not None and not self.pending.done()


class ApplyInterrupted(LongrunError):
    """An async ``apply`` was cancelled because the task was cancelled while it ran: outcome unknown."""


@dataclass(frozen=True, slots=True)
class Apply:
    """``adapter.apply(request)``: a ``Receipt`` back, or the adapter's exception thrown in."""

    adapter: Any
    request: EffectRequest
    timeout_s: float | None = None


@dataclass(frozen=True, slots=True)
class Observe:
    """``adapter.observe(request)``: an ``Observation`` back, never an exception (see ``recovery``).
    Past ``timeout_s`` the observation is unknown (the target did not answer in time)."""

    adapter: Any
    request: EffectRequest
    timeout_s: float | None = None


@dataclass(frozen=True, slots=True)
class Invoke:
    """A user's call (``run.call``): its value back (awaited if it is awaitable), or its exception."""

    fn: Callable[[], object]
    timeout_s: float | None = None
    awaitable: bool = False
    """``fn()`` returns an awaitable (a coroutine function's call): only the async driver can wait for it."""


@dataclass(frozen=True, slots=True)
class Sleep:
    """Wait ``seconds`` on the engine's clock without charging it as work."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Commit:
    """Make what the step changed durable before it goes on (a start before its apply)."""


COMMIT = Commit()


@dataclass(frozen=True, slots=True)
class Gather:
    """Run independent step procedures (recovery's observations) and return their values in order.

    The synchronous driver runs them one after another; the async one at once, ``limit`` at a time.
    """

    steps: tuple["Steps[Any]", ...]
    limit: int = 16


@dataclass(frozen=True, slots=True)
class CancellationRead:
    """What ``ReadCancellation`` found: the record and whose it is, or none; ``paused`` when there
    is none and the source asks the run to stop between two steps (a worker that drains)."""

    whose: str
    record: "ControlRecord | None"
    paused: bool = False


@dataclass(frozen=True, slots=True)
class Load:
    """The task's state of record, loaded under the lease (``Store.load``): a ``LoadResult`` back."""

    lease: Lease


@dataclass(frozen=True, slots=True)
class ReadCancellation:
    """The cancellation record, read fresh through the run's cancellation source: the task's own,
    then each of ``ancestors`` in order until one has a record. A ``CancellationRead`` back."""

    ancestors: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ReadApprovals:
    """The task's approval records, read fresh through the run's approval source: a list back."""


@dataclass(frozen=True, slots=True)
class RenewLease:
    """The lease to write under, renewed first if the background renewal is late; a ``Stop``
    (``lease-lost``) thrown in if that renewal failed."""


@dataclass(frozen=True, slots=True)
class ReadStore:
    """A read of the store beyond the task's own state (another task's records, the family of a
    child about to start): ``read(store)``'s value back, or its exception."""

    read: Callable[[Store], Any]


@dataclass(frozen=True, slots=True)
class SendMessage:
    """Put ``message`` in its receiver's mailbox through the run's store (``Store.send_message``):
    a ``messages.Delivery`` back, or the store's error (``UnknownTaskError`` for no such task)."""

    message: Message


@dataclass(frozen=True, slots=True)
class ReadMessages:
    """The run's own messages of ``topic``, oldest first, read fresh (``Store.read_messages``)."""

    topic: str


READ_APPROVALS = ReadApprovals()
RENEW_LEASE = RenewLease()


Op = (
    Apply | Observe | Invoke | Sleep | Commit | Gather | Load | ReadCancellation | ReadApprovals | ReadStore | RenewLease | SendMessage
    | ReadMessages
)
Steps = Generator[Op, Any, T]
"""A step procedure: yields what it waits for, returns its value."""


def is_async_callable(fn: object) -> bool:
    """Whether calling ``fn`` returns a coroutine (a coroutine function, or an object whose
    ``__call__`` is one)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))
