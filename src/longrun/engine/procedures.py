"""The step procedures a face hands its ``Engine``: the one steps API of ``Run``, ``AsyncRun``,
``Runner`` and the session.

Each takes the invocation first; a face never passes it itself but names the procedure and its
arguments: ``engine.drive(procedures.effect, step)`` runs it to its end from synchronous code,
``await engine.driver.step(engine.steps(procedures.effect, step))`` under the async driver, and
``engine.record(procedures.complete, step_id, result)`` applies a rule that only changes the working
state (no I/O). Every I/O a procedure needs, the store's included, is a request it yields to the
driver (``engine._ops``), so none of them blocks an event loop.
"""

from ._effects import ON_EXHAUSTED, effect, verified_prefix
from ._steps import (
    ask,
    call,
    check_cancellation,
    complete,
    finish,
    mismatch,
    plan,
    read_store,
    record_plan_growth,
    refused_action,
    report_progress,
    timer,
    wait,
)
from ._talk import receive, send, set_event

__all__ = [
    "ON_EXHAUSTED",
    "ask",
    "call",
    "check_cancellation",
    "complete",
    "effect",
    "finish",
    "mismatch",
    "plan",
    "read_store",
    "receive",
    "record_plan_growth",
    "refused_action",
    "report_progress",
    "send",
    "set_event",
    "timer",
    "verified_prefix",
    "wait",
]
