"""The task every engine-driving fault group runs, under both faces.

``runner``: a declared plan (``Runner``) of N steps, each an outbox write (``OutboxAdapter``), some
behind an approval that ``pre_approve`` grants before the run. ``durable``: the same task as a
durable function (``fault_function``): per step, ``run.call`` of a deterministic computation that
logs each invocation to an ``O_APPEND`` file, then ``run.effect`` of the same outbox write with the
call's value in its payload. The effect keys are the same under both faces (``TASK/step-NNN``).
"""

from __future__ import annotations

import os
import time
from typing import Any, Sequence

from ...approval import Approval
from ...canonical import digest_of
from ...contract import RunContract, Step, plan_digest
from ...functions import DurableFunction, Run, durable
from ...lease import boot_clock_id
from ...stores.jsonfile import JsonFileStore

__all__ = [
    "APPROVALS", "FACES", "GOAL", "ShiftedClock", "SlowAdapter", "call_log_of", "computed_value", "durable_arguments", "durable_task",
    "fault_computation", "fault_function", "function_result", "pace_calls", "plan", "pre_approve", "step_payload",
]  # fmt: skip

FACES = ("runner", "durable")
"""The faces a task runs under: a declared plan (``Runner``) or a durable function."""
GOAL = "a fault-injection task that writes numbered lines to an outbox"
APPROVALS = (5, 12)
"""The steps behind an approval in the groups that run a task of 20 steps or more."""


def plan(task: str, steps: int, approvals: Sequence[int] = ()) -> tuple[RunContract, list[Step]]:
    """The fault task as a declared plan: ``steps`` outbox writes, ``approvals`` (step numbers) gated."""
    contract = RunContract(task, GOAL)
    return contract, [Step(f"step-{i:03d}", "write", {"n": i}, approval=i in approvals) for i in range(steps)]


# -- the same task as a durable function -------------------------------------------------------


def computed_value(n: int) -> int:
    """What the durable face's call ``call-NNN`` returns: deterministic, so a replay is checkable."""
    return (n * 7919 + 13) % 1009


_call_pace: tuple[float, str] = (0.0, "")
"""Seconds each call of ``fault_computation`` takes, and a file it appends to first (``pace_calls``)."""


def pace_calls(seconds: float, signal_path: str) -> None:
    """Make every later call of ``fault_computation`` in this process take ``seconds`` and, if
    ``signal_path`` is given, append a line to it first (a child's ``--slow-call`` and ``--call-signal``)."""
    global _call_pace
    _call_pace = (seconds, signal_path)


def fault_computation(n: int, call_log: str) -> int:
    """The durable face's call: logs each invocation (one ``O_APPEND`` write, so it survives the
    SIGKILL that may follow) and returns ``computed_value(n)``."""
    fd = os.open(call_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, f"call-{n:03d} {os.getpid()}\n".encode())
    finally:
        os.close(fd)
    seconds, signal_path = _call_pace
    if signal_path:
        with open(signal_path, "a") as handle:
            handle.write(f"call-{n:03d}\n")
    if seconds:
        time.sleep(seconds)
    return computed_value(n)


def step_payload(n: int, face: str) -> dict[str, int]:
    """The payload of effect ``step-NNN``: the durable face writes the call's value with it."""
    return {"n": n, "computed": computed_value(n)} if face == "durable" else {"n": n}


def fault_function(run: Run, steps: int, approvals: list[int], call_log: str) -> dict[str, int]:
    """The fault task as a durable function: per step a recorded call, then the outbox write that
    carries the call's value (the same effect keys as the declared plan, ``TASK/step-NNN``)."""
    total = 0
    for n in range(steps):
        value = run.call(f"call-{n:03d}", fault_computation, n, call_log)
        run.effect(f"step-{n:03d}", "write", {"n": n, "computed": value}, approval=n in approvals)
        total += value
    return {"steps": steps, "total": total}


def function_result(steps: int) -> dict[str, int]:
    """What ``fault_function`` returns for a ``steps``-step task."""
    return {"steps": steps, "total": sum(computed_value(n) for n in range(steps))}


def durable_task(store: Any, adapters: dict[str, Any], **options: Any) -> DurableFunction[dict[str, int]]:
    """``fault_function`` made durable over ``store`` (the engine's options as keywords)."""
    return durable(store=store, adapters=adapters, contract=RunContract("fault-task", GOAL), **options)(fault_function)


def durable_arguments(steps: int, approvals: Sequence[int], call_log: str) -> tuple[int, list[int], str]:
    """The arguments a child runs ``fault_function`` with (recorded with the task: every child of
    one case must pass the same)."""
    return steps, list(approvals), call_log


def pre_approve(root: str, task: str, steps: int, approvals: Sequence[int], *, face: str = "runner", call_log: str = "") -> None:
    """Write an approval for every gated step before the run starts, as an operator would later."""
    store = JsonFileStore(root, create=True)
    store.create_root()  # the store (and its marker) before the task directory made by hand below
    os.makedirs(os.path.join(root, task), mode=0o700, exist_ok=True)
    if face == "durable":
        function = durable_task(store, {})
        # The digest a durable task's approvals bind to: the contract, the function's name, its arguments.
        digest = function.plan_digest(task, *durable_arguments(steps, approvals, call_log))
    else:
        contract, plan_steps = plan(task, steps, approvals)
        digest = plan_digest(contract, plan_steps)
    for index in approvals:
        store.write_approval(
            Approval(
                approval_id=f"pre-{index}", task_id=task, plan_digest=digest, step_id=f"step-{index:03d}",
                payload_digest=digest_of(step_payload(index, face)), action="write", expires_at=time.time() + 1e10,
                approver="fault-suite", granted_at=time.time(),
            )
        )  # fmt: skip


class ShiftedClock:
    """The real clocks moved forward by ``offset`` (so a crashed child's lease is over for the next one)
    on this boot's monotonic timeline; with ``step``, each ``monotonic()`` reading also adds ``step``
    seconds, so that the runner renews its lease on its own every few commits."""

    def __init__(self, offset: float, step: float = 0.0):
        self.offset, self.step, self.ticks = offset, step, 0
        self._timeline = boot_clock_id() or "fault-suite"

    def now(self) -> float:
        return time.time() + self.offset

    def monotonic(self) -> float:
        self.ticks += 1
        return time.monotonic() + self.offset + self.ticks * self.step

    def monotonic_id(self) -> str:
        return self._timeline

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(min(seconds, 0.05))


class SlowAdapter:
    """Before applying, sleeps (a window for outside kills) and touches ``signal`` if given."""

    def __init__(self, inner: Any, seconds: float, signal_path: str):
        self.inner, self.seconds, self.signal_path = inner, seconds, signal_path
        self.deduplicates = inner.deduplicates

    def apply(self, request: Any) -> Any:
        if self.signal_path:
            with open(self.signal_path, "a") as handle:
                handle.write(f"{request.step_id} {request.attempt}\n")
        if self.seconds:
            time.sleep(self.seconds)
        return self.inner.apply(request)

    def observe(self, request: Any) -> Any:
        return self.inner.observe(request)


def call_log_of(outbox: str) -> str:
    """The file the durable face's calls log their invocations to, next to the outbox."""
    return outbox + ".calls"
