"""longrun: make a long task durable.

A run contract and plan pinned by a digest; a checksummed state envelope written atomically with a
validated backup; an effect ledger that never repeats a verified effect; a lease with a fencing
epoch that the store checks; fresh cancellation and scoped approval; bounded retry whose counters
survive restarts; and one ``Runner`` that composes them over pluggable adapters and stores.
"""

from typing import TYPE_CHECKING

__version__ = "0.1.0"
"""The release: the one place it is written (pyproject.toml reads it from here)."""

from .adapters import EffectRequest, Observation, ObservedState, Receipt
from .approval import Approval, ApprovalRequest
from .budget import Backoff, BudgetCounters, Limits, RetryPolicy
from .cancellation import Cancellation
from .contract import RunContract, Step, plan_digest
from .envelope import RunState
from .events import RunEvent
from .errors import (
    AdapterError,
    ApprovalWaitingError,
    CallFailed,
    ChildCycleError,
    CorruptStateError,
    EffectFailed,
    FencedError,
    ForeignStateError,
    IllegalTransitionError,
    InvalidInputError,
    LeaseHeldError,
    LongrunError,
    PayloadError,
    PermanentError,
    SchemaVersionError,
    SignatureRequiredError,
    SizeLimitError,
    StateUnrecoverableError,
    StorageError,
    TaskNotFinishedError,
    TransientError,
    UnknownActionError,
    UnknownTaskError,
)
from .lease import Lease
from .messages import Delivery, Message
from .outside_messages import Posted
from .queues import Queue
from .schedules import Schedule, ScheduleError
from .ledger import EffectRecord, EffectState
from .outcome import Evidence, PendingRequest, RunOutcome, Status
from .protocols import AsyncEffectAdapter, Clock, EffectAdapter, LoadResult, Store
from .stores import BaseStore, JsonFileStore, PostgresStore, SqliteStore

if TYPE_CHECKING:
    # Type checkers see the real classes (so ``from longrun import Runner`` types as the class);
    # at run time they come from __getattr__ below.
    from .functions import AsyncRun, DurableFunction, Run, durable, scheduled
    from .runner import Runner, SystemClock


def __getattr__(name: str) -> object:
    # The runner is imported lazily so that importing longrun for its records or stores does not
    # pull in the runner (and so nothing but the CLI and examples import it eagerly).
    if name in ("Runner", "SystemClock"):
        from . import runner

        return getattr(runner, name)
    if name in ("durable", "DurableFunction", "Run", "AsyncRun", "scheduled"):
        from . import functions

        return getattr(functions, name)
    raise AttributeError(f"module 'longrun' has no attribute {name!r}")


__all__ = [
    "AdapterError",
    "Approval",
    "ApprovalRequest",
    "ApprovalWaitingError",
    "AsyncEffectAdapter",
    "AsyncRun",
    "Backoff",
    "BaseStore",
    "BudgetCounters",
    "CallFailed",
    "Cancellation",
    "ChildCycleError",
    "Clock",
    "CorruptStateError",
    "Delivery",
    "DurableFunction",
    "EffectFailed",
    "EffectAdapter",
    "EffectRecord",
    "EffectRequest",
    "EffectState",
    "Evidence",
    "FencedError",
    "ForeignStateError",
    "IllegalTransitionError",
    "InvalidInputError",
    "JsonFileStore",
    "Lease",
    "LeaseHeldError",
    "Limits",
    "LoadResult",
    "LongrunError",
    "Message",
    "Observation",
    "ObservedState",
    "PayloadError",
    "PendingRequest",
    "PermanentError",
    "Posted",
    "PostgresStore",
    "Queue",
    "Receipt",
    "RetryPolicy",
    "Run",
    "RunContract",
    "RunEvent",
    "RunOutcome",
    "RunState",
    "Runner",
    "Schedule",
    "ScheduleError",
    "SchemaVersionError",
    "SignatureRequiredError",
    "SizeLimitError",
    "SqliteStore",
    "StateUnrecoverableError",
    "Status",
    "Step",
    "Store",
    "StorageError",
    "SystemClock",
    "TaskNotFinishedError",
    "TransientError",
    "UnknownActionError",
    "UnknownTaskError",
    "durable",
    "plan_digest",
    "scheduled",
]
