"""``EngineConfig``: an engine's configuration, checked once when it is built and never changed.

Every face passes the same options (``EngineOptions``); ``EngineConfig.of`` checks them and raises
``InvalidInputError`` naming the bad one. The record holds values and the objects the drivers talk
to (the store, the control sources, the adapters, the clock); the step procedures read the values
only, and reach the objects only through the requests they yield (``engine._ops``).
"""

from __future__ import annotations

import datetime
import math
import os
import secrets
import socket
import types
from dataclasses import dataclass
from typing import Mapping, TypedDict

from ..budget import Limits, RetryPolicy
from ..contract import RunContract
from ..errors import InvalidInputError, UnknownActionError
from ..names import store_spec_of
from ..events import EventHook
from ..protocols import (
    AnyEffectAdapter,
    ApprovalSource,
    CancellationSource,
    Clock,
    MonotonicClock,
    PausingSource,
    Store,
    TimelineClock,
)
from ..clock import SystemClock
from ._ops import is_async_callable

__all__ = ["EngineConfig", "EngineOptions", "check_parallel", "check_timeout", "default_owner", "utc"]


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


class EngineOptions(TypedDict, total=False):
    """The engine's options every face takes as keywords (``Runner(...)``, ``@durable(...)``), each
    optional; the defaults are ``Engine``'s."""

    owner: str | None
    """A label for people (the lease's owner); a random ``host:pid:hex`` by default. It does not
    authorize anything: re-entering a live lease takes its secret token."""
    clock: Clock | None
    """``SystemClock()`` by default; tests pass ``testing.FakeClock``."""
    limits: Limits | None
    """The run's budgets and waits (``Limits()`` by default)."""
    retry: RetryPolicy | None
    """The retry policy of every step that does not name its own (``RetryPolicy()`` by default)."""
    lease_ttl_s: float
    """How long the lease lasts unless renewed (30 s); it is renewed every third of that."""
    approvals: ApprovalSource | None
    """Where approvals are read, fresh before each gated effect (the store by default)."""
    cancellations: CancellationSource | None
    """Where the cancellation record is read, fresh before each new effect (the store by default)."""
    on_event: EventHook | None
    """Called with a ``longrun.events.RunEvent`` after each commit that made a transition durable;
    an exception it raises is logged, never breaks the run."""
    timeout_s: float | None
    """Bounds every ``apply``, ``observe`` and call; a step's own overrides it (none by default)."""
    max_parallel: int
    """The most steps in flight at once (16), for steps the face runs in parallel."""


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What one engine runs with, checked (``of``); the clock's optional capabilities looked up once."""

    contract: RunContract
    store: Store
    approvals: ApprovalSource
    cancellations: CancellationSource
    adapters: Mapping[str, AnyEffectAdapter]
    owner: str
    clock: Clock
    limits: Limits
    retry: RetryPolicy
    lease_ttl_s: float
    timeout_s: float | None
    max_parallel: int
    asynchronous: bool
    on_event: EventHook | None
    monotonic_clock: MonotonicClock | None
    timeline_clock: TimelineClock | None
    pausing: PausingSource | None

    @property
    def task_id(self) -> str:
        return self.contract.task_id

    @property
    def store_spec(self) -> str:
        """How a command names this engine's store in a next action (``<store>`` if it cannot be named)."""
        return store_spec_of(self.store)

    def adapter_for(self, action: str, *, step_id: str) -> AnyEffectAdapter:
        """The adapter of ``action``; ``UnknownActionError`` naming the step if it has none."""
        adapter = self.adapters.get(action)
        if adapter is None:
            raise UnknownActionError(
                f"step {step_id!r} uses action {action!r}, which has no adapter (have: {sorted(self.adapters)})"
            )
        return adapter

    @classmethod
    def of(
        cls,
        contract: RunContract,
        *,
        store: Store,
        adapters: Mapping[str, AnyEffectAdapter],
        owner: str | None = None,
        clock: Clock | None = None,
        limits: Limits | None = None,
        retry: RetryPolicy | None = None,
        lease_ttl_s: float = 30.0,
        approvals: ApprovalSource | None = None,
        cancellations: CancellationSource | None = None,
        on_event: EventHook | None = None,
        timeout_s: float | None = None,
        max_parallel: int = 16,
        asynchronous: bool = False,
    ) -> "EngineConfig":
        """Check every option; ``InvalidInputError`` names the first that is wrong."""
        if not isinstance(contract, RunContract):
            raise InvalidInputError("contract must be a RunContract")
        if not isinstance(adapters, Mapping):
            raise InvalidInputError("adapters must map action names to EffectAdapter objects")
        # The Protocol check is once per action, not once per step (a plan may have 100,000 steps).
        for action, adapter in adapters.items():
            if not all(hasattr(adapter, name) for name in ("apply", "observe", "deduplicates")):
                raise InvalidInputError(f"adapter for {action!r} lacks apply, observe or deduplicates")
            if not asynchronous and (is_async_callable(adapter.apply) or is_async_callable(adapter.observe)):
                raise InvalidInputError(
                    f"adapter for {action!r} is async (its apply or observe is a coroutine function): run it with the "
                    "async face (an async durable function, or Runner.arun)"
                )
        if isinstance(lease_ttl_s, bool) or not isinstance(lease_ttl_s, (int, float)) or not lease_ttl_s > 0:
            raise InvalidInputError(f"lease_ttl_s must be a positive number, got {lease_ttl_s!r}")
        if owner is not None and (not isinstance(owner, str) or not owner):
            raise InvalidInputError("owner must be a non-empty string")
        if approvals is not None and not isinstance(approvals, ApprovalSource):
            raise InvalidInputError("approvals must be an ApprovalSource (a read_approvals(task_id) method)")
        if cancellations is not None and not isinstance(cancellations, CancellationSource):
            raise InvalidInputError("cancellations must be a CancellationSource (a read_cancellation(task_id) method)")
        if limits is not None and not isinstance(limits, Limits):
            raise InvalidInputError("limits must be a Limits")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise InvalidInputError("retry must be a RetryPolicy")
        the_clock: Clock = clock or SystemClock()
        the_cancellations: CancellationSource = cancellations if cancellations is not None else store
        return cls(
            contract=contract,
            store=store,
            approvals=approvals if approvals is not None else store,
            cancellations=the_cancellations,
            adapters=types.MappingProxyType(dict(adapters)),
            owner=owner or default_owner(),
            clock=the_clock,
            limits=limits or Limits(),
            retry=retry or RetryPolicy(),
            lease_ttl_s=float(lease_ttl_s),
            timeout_s=None if timeout_s is None else check_timeout(timeout_s, "the run"),
            max_parallel=check_parallel(max_parallel),
            asynchronous=asynchronous,
            on_event=on_event,
            monotonic_clock=the_clock if isinstance(the_clock, MonotonicClock) else None,
            timeline_clock=the_clock if isinstance(the_clock, TimelineClock) else None,
            pausing=the_cancellations if isinstance(the_cancellations, PausingSource) else None,
        )
