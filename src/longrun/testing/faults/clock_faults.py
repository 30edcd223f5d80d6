"""Group 8, clock faults: wall clocks that jump, freeze or run at the wrong rate, on either side of a lease.

A holder and a contender share one monotonic timeline (as the processes of one boot do); the
faulty wall clock is the holder's or the contender's. The contender must take over no sooner than
the TTL after the holder's last renewal, measured on that timeline, and the old holder's writes
must then be fenced. A task whose wall clock is an hour ahead waits out the lease, then runs.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from ...contract import RunContract, Step
from ...errors import FencedError, LeaseHeldError
from ...lease import MonotonicReading
from ...outcome import Status
from ...runner import Runner
from ...stores.jsonfile import JsonFileStore
from .. import OutboxAdapter
from ..store_contract import sample_state
from .checks import call_counts
from .results import GroupResult, merge
from .store_history import TASK
from .task import call_log_of, durable_arguments, durable_task, function_result

__all__ = ["FaultClock", "run"]


class _Timeline:
    """A shared fake monotonic timeline (what CLOCK_MONOTONIC is to the processes of one boot)."""

    def __init__(self, name: str):
        self.name = name
        self.value = 0.0


class FaultClock:
    """A wall clock with a fault (``jump+``, ``jump-``, ``frozen``, ``half``, ``double``, ``honest``)
    over an honest monotonic timeline."""

    def __init__(self, timeline: _Timeline, fault: str, start: float = 1_700_000_000.0):
        self.timeline, self.fault, self.start = timeline, fault, start

    def now(self) -> float:
        elapsed = self.timeline.value
        return self.start + {
            "honest": elapsed, "jump+": elapsed + 3600.0, "jump-": elapsed - 3600.0, "frozen": 0.0,
            "half": 0.5 * elapsed, "double": 2.0 * elapsed,
        }[self.fault]  # fmt: skip

    def monotonic(self) -> float:
        return self.timeline.value

    def monotonic_id(self) -> str:
        return self.timeline.name

    def sleep(self, seconds: float) -> None:
        self.timeline.value += max(0.0, seconds)


class _WallOnly:
    """The same clock without a monotonic timeline: expiry is judged by wall clock."""

    def __init__(self, clock: FaultClock):
        self.clock = clock

    def now(self) -> float:
        return self.clock.now()

    def sleep(self, seconds: float) -> None:
        self.clock.sleep(seconds)


FAULTS = ("jump+", "jump-", "frozen", "half", "double")
TTL = 10.0


def run(base: str, *, full: bool, face: str = "runner") -> GroupResult:
    """Wall-clock faults on the holder or on the contender: the contender takes over no sooner than
    the TTL after the lease's last renewal on its own monotonic clock, and no stale write lands.

    The lease checks are the store's, the same under either face; under the durable face only the
    task whose clock is an hour ahead is run, as a durable function."""
    result = GroupResult(8, "clock faults", face)
    step = 0.25 if full else 0.5
    if face == "durable":
        merge(result, _clock_ahead(base, face, step))
        return result
    early_wall = []
    for fault in FAULTS:
        for faulty in ("contender", "holder"):
            where = f"{fault} on the {faulty}"
            timeline = _Timeline(f"fault-suite:{fault}:{faulty}")
            holder_clock = FaultClock(timeline, fault if faulty == "holder" else "honest")
            contender_clock = FaultClock(timeline, fault if faulty == "contender" else "honest")
            root = os.path.join(base, f"clock-{fault}-{faulty}")
            holder = JsonFileStore(root, create=True)
            contender = JsonFileStore(root, create=True)

            def reading(clock: FaultClock) -> MonotonicReading:
                return MonotonicReading(clock.monotonic_id(), clock.monotonic())

            lease = holder.acquire_lease(TASK, "holder", TTL, holder_clock.now(), monotonic=reading(holder_clock))
            holder.load(TASK, lease=lease)
            state = sample_state(TASK, effects=2)
            state.revision = 0
            holder.commit(lease, state, None)
            renewed_at = 0.0
            taken_at = None
            while timeline.value <= 4 * TTL:
                if timeline.value == TTL / 2:
                    lease = holder.renew_lease(lease, TTL, holder_clock.now(), monotonic=reading(holder_clock))
                    renewed_at = timeline.value
                result.cases += 1
                result.faults += fault != "honest"
                try:
                    contender.acquire_lease(TASK, "contender", TTL, contender_clock.now(), monotonic=reading(contender_clock))
                except LeaseHeldError:
                    timeline.value += step
                    continue
                taken_at = timeline.value
                break
            if taken_at is None:
                result.fail(f"{where}: the contender never took over an abandoned lease")
            elif taken_at < renewed_at + TTL:
                result.fail(f"{where}: taken over {taken_at - renewed_at:.2f} s after the last renewal, before the {TTL:.0f} s TTL")
            else:
                result.notes.append(f"{where}: taken over {taken_at - renewed_at:.2f} s after the last renewal")
            # The old holder is fenced, whatever its clock says.
            for name, operation in (("commit", lambda: holder.commit(lease, state, set())),
                                    ("renew", lambda: holder.renew_lease(lease, TTL, holder_clock.now(), monotonic=reading(holder_clock)))):  # fmt: skip
                result.cases += 1
                try:
                    operation()
                    result.fail(f"{where}: the old holder's {name} was accepted after the takeover")
                except FencedError:
                    pass
            # The same contender judging by wall clock alone (the old rule) for contrast.
            wall_root = os.path.join(base, f"wall-{fault}-{faulty}")
            wall_store = JsonFileStore(wall_root, create=True)
            timeline.value = 0.0
            wall_store.acquire_lease(TASK, "holder", TTL, holder_clock.now())
            try:
                wall_store.acquire_lease(TASK, "contender", TTL, _WallOnly(contender_clock).now())
                early_wall.append(where)
            except LeaseHeldError:
                pass
            holder.close()
            contender.close()
    merge(result, _clock_ahead(base, face, step))
    result.notes.append(
        f"judged by wall clock alone, a contender would have taken a live lease at once in {len(early_wall)} of "
        f"{2 * len(FAULTS)} cases ({', '.join(early_wall)})"
    )
    return result


def _clock_ahead(base: str, face: str, step: float) -> GroupResult:
    """A task whose wall clock jumped an hour ahead returns already-running, then runs once the TTL passed."""
    result = GroupResult(8, "")
    timeline = _Timeline(f"fault-suite:{face}")
    root = os.path.join(base, face)
    outbox = os.path.join(base, f"{face}-outbox.jsonl")
    holder = JsonFileStore(root, create=True)
    holder.acquire_lease(TASK, "holder", TTL, FaultClock(timeline, "honest").now(), monotonic=MonotonicReading(timeline.name, 0.0))
    options: dict[str, Any] = dict(
        store=JsonFileStore(root, create=True), adapters={"write": OutboxAdapter(outbox)}, clock=FaultClock(timeline, "jump+"), lease_ttl_s=TTL
    )
    if face == "durable":
        function, arguments = durable_task(**options), durable_arguments(1, (), call_log_of(outbox))
        run: Callable[[], Any] = lambda: function.run(TASK, *arguments)  # noqa: E731
    else:
        run = Runner(RunContract(TASK, "clock faults"), [Step("s0", "write", {"n": 0})], **options).run
    for at, expected in ((TTL - step, Status.ALREADY_RUNNING), (TTL, Status.DONE)):
        timeline.value = at
        result.cases += 1
        result.faults += 1
        outcome = run()
        if outcome.status is not expected:
            result.fail(f"{face} with a clock an hour ahead at {at} s into a {TTL:.0f} s lease: {outcome.status.value}, expected {expected.value}")
    if face == "durable":
        if outcome.result != function_result(1) or call_counts(call_log_of(outbox)) != {"call-000": 1}:
            result.fail(f"durable with a clock an hour ahead: result {outcome.result!r}, calls {call_counts(outbox + '.calls')}")
    holder.close()
    return result
