"""The waits a step makes, as records a driver performs: one engine, a synchronous and an async driver.

The engine's step procedures (``Engine._effect`` and the rest) are generators. Every adapter call,
user call, sleep and group commit they need is *yielded* as one of the records below, and the
value (or the exception) comes back at the ``yield``. The synchronous driver (``drive``) performs
each at once in the calling thread; the async driver (``longrun._concurrency``) awaits it, so that
many steps wait at the same time, and makes the commits they ask for together into one. Every
rule (what is durable before what, when to observe, what a failure means) is written once, in the
generators; the drivers only decide how to wait.
"""

from __future__ import annotations

import concurrent.futures
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Generator, TypeVar

from .adapters import EffectRequest
from .errors import LongrunError

__all__ = [
    "COMMIT",
    "Apply",
    "ApplyInterrupted",
    "ApplyTimedOut",
    "Commit",
    "Gather",
    "Invoke",
    "Observe",
    "Op",
    "Sleep",
    "Steps",
    "drive",
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


Op = Apply | Observe | Invoke | Sleep | Commit | Gather
Steps = Generator[Op, Any, T]
"""A step procedure: yields what it waits for, returns its value."""


def drive(steps: Steps[T], perform: Callable[[Op], Any]) -> T:
    """Run a step procedure to its end, performing each wait with ``perform`` in this thread.

    Whatever ``perform`` raises (an adapter's exception, a stop from a commit) is thrown into the
    procedure at the ``yield`` that asked for it, as if the call had been made there."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            op = steps.throw(error) if error is not None else steps.send(value)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        error = None
        value = None
        try:
            value = perform(op)
        except BaseException as exc:  # thrown into the procedure, where the call was asked for
            error = exc


def call_in_thread(fn: Callable[[], T], timeout_s: float) -> T:
    """``fn()`` in a worker thread, waiting at most ``timeout_s``; ``ApplyTimedOut`` after that.

    A thread cannot be stopped: on a timeout it goes on running, and the error says so."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="longrun-apply")
    future = pool.submit(fn)
    pool.shutdown(wait=False)
    try:
        return future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        raise ApplyTimedOut(timeout_s, pending=future) from None


def is_async_callable(fn: object) -> bool:
    """Whether calling ``fn`` returns a coroutine (a coroutine function, or an object whose
    ``__call__`` is one)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))
