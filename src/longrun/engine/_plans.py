"""What a face hands the engine (``Plan``), the ``Stop`` that unwinds it, and the checks of the
engine's options."""

from __future__ import annotations

import datetime
import math
import os
import secrets
import socket
from typing import TYPE_CHECKING, Protocol

from ..canonical import JSONValue
from ..envelope import RunState
from ..errors import InvalidInputError
from ..outcome import WAITING, Status

if TYPE_CHECKING:
    from ._engine import Engine


__all__ = ["AsyncPlan", "Plan", "Stop", "check_parallel", "check_timeout", "default_owner", "utc"]


def utc(timestamp: float) -> str:
    """A time as UTC ISO 8601 with milliseconds, as next actions print it."""
    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).isoformat(timespec="milliseconds")


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def check_timeout(value: object, what: str) -> float:
    """A timeout in seconds: a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InvalidInputError(f"{what}: timeout_s must be a finite number > 0, got {value!r}")
    return float(value)


def check_parallel(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(f"max_parallel must be an integer >= 1, got {value!r}")
    return value


class Stop(BaseException):
    """Unwinds a face's driving code to ``Engine.run``, which returns it as an outcome.

    A ``BaseException`` so that no broad ``except Exception`` on the way, in the library or in a
    user's durable function, can swallow a stop.
    """

    def __init__(self, status: Status, next_action: str, *, wake_at: float | None = None):
        super().__init__(status.value)
        self.status = status
        self.next_action = next_action
        self.wake_at = wake_at

    def again(self) -> "Stop":
        """The same stop, to raise in another step that may not go on (parallel steps share one)."""
        return Stop(self.status, self.next_action, wake_at=self.wake_at)

    @property
    def waits(self) -> bool:
        """Whether the stop waits for something (a person, a timer, a child): steps in parallel
        that do not depend on the waiting one may still go on."""
        return self.status in WAITING

    def outranks(self, other: "Stop") -> bool:
        """Whether this stop should be the run's outcome rather than ``other``: a stop that ends or
        blocks the run outranks one that waits (for a person, a timer, a child)."""
        return self.status not in WAITING and other.status in WAITING


class Plan(Protocol):
    """What a face hands the engine: the digest that pins the plan, and how to drive it.

    ``digest`` is what approvals bind to. ``initial`` adds the records a first revision needs;
    ``accept`` checks a recorded state against the plan (raising a ``Stop`` on divergence, and may
    record an allowed change such as a grown plan); ``drive`` makes the steps through the engine
    and ends with ``Engine.finish``; ``result`` is the run's result for the outcome.
    """

    digest: str

    def initial(self, engine: Engine, state: RunState) -> None: ...

    def accept(self, engine: Engine, state: RunState) -> None: ...

    def drive(self, engine: Engine) -> None: ...

    def result(self, state: RunState) -> JSONValue: ...

    def progress(self, state: RunState) -> str: ...


class AsyncPlan(Plan, Protocol):
    """A ``Plan`` the async driver can drive: ``adrive`` awaits its steps (``Engine.arun``)."""

    async def adrive(self, engine: Engine) -> None: ...


