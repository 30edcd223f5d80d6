"""Waiting in the process: ``fn.run(task, ..., wait=True, timeout_s=...)`` runs the task again as
soon as what it waits for may have come, until it ends or ``timeout_s`` passes.

A run that reaches a wait (an approval, an answer, a message, a sleep, a child) stops with a
waiting status, as always. ``Waiting`` then watches what could end that wait and runs the task
again when it changes:

- the task's control records as its approval and cancellation sources hand them over (the store,
  or a control root's files, or signed records: a write to any of them is seen), its mailbox, its
  lease (another runner took or released it) and its committed revision, and the same for each
  unfinished child, recursively;
- the wake time the outcome names (a sleep, a retry, a receive's timeout, a child's);
- PostgreSQL ``NOTIFY`` on the fleet's channel, which the store's triggers send when an approval,
  an answer, a cancellation or a message reaches a task (a listener thread wakes the poll at once);
- otherwise polling, every ``MIN_POLL_S`` at first, slowing to ``MAX_POLL_S``, and a run at least
  every ``RECHECK_S`` whatever the marks say (a change that landed between the run's last read and
  the first look afterwards is picked up then).

The lease: a wait whose end is known and within ``Limits.max_block_s`` is waited inside the run,
which renews its lease meanwhile (``run.sleep``, ``run.recv(timeout_s=...)``). Every other wait
ends the run, which releases the lease; ``Waiting`` holds none while it watches, and the next run
takes it again. A worker, or another process, may run the task in between: whoever holds the lease
runs it, and the waiter's next run either finds the lease held (``already-running``: it watches the
lease and tries again when it is released) or replays what the other recorded and returns the
outcome, ``done`` with the same result included. Nothing is ever run twice by the two.

Time is the function's clock: with ``SystemClock`` the waits are real (and a ``NOTIFY`` cuts them
short); an injected clock's ``sleep`` is the wait, so a test's ``FakeClock`` makes time pass.

Not guaranteed: that the wake-up is immediate on a store without ``NOTIFY`` (it is within the
polling interval), or that a task waiting on a person ever ends without ``timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
from typing import Awaitable, Callable, Iterator

from ..canonical import JSONValue, canonical_bytes, sha256_hex
from ..clock import SystemClock
from ..errors import InvalidInputError, LongrunError
from ..outcome import WAITING, RunOutcome, Status
from ..protocols import ApprovalSource, CancellationSource, Clock, Store
from ._family import unfinished_children

__all__ = ["MAX_POLL_S", "MIN_POLL_S", "RECHECK_S", "Waiting", "check_wait"]

log = logging.getLogger("longrun")

MIN_POLL_S = 0.2
"""The first pause between two looks at what a waiting task waits for."""
MAX_POLL_S = 1.0
"""The longest pause between two looks (the pause doubles from ``MIN_POLL_S`` up to this)."""
RECHECK_S = 15.0
"""The longest a waiting task goes without being run again, whatever the looks saw."""
_MAX_FAMILY = 64
"""The most tasks (the task and its unfinished descendants) one look reads."""

_WAITS_ON = WAITING | {Status.ALREADY_RUNNING}


def check_wait(wait: bool, timeout_s: float | None) -> None:
    """Refuse a ``wait`` that is not a bool and a ``timeout_s`` that is not a finite, non-negative
    number or that comes without ``wait=True`` (``InvalidInputError``); nothing is run then."""
    if not isinstance(wait, bool):
        raise InvalidInputError(f"wait must be True or False, not {wait!r}; nothing was run")
    if timeout_s is None:
        return
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not math.isfinite(timeout_s) or timeout_s < 0:
        raise InvalidInputError(f"timeout_s must be a finite number of seconds >= 0, not {timeout_s!r}; nothing was run")
    if not wait:
        raise InvalidInputError("timeout_s bounds a wait: give it with wait=True; nothing was run")


class Waiting:
    """Runs one task until it stops waiting or ``timeout_s`` passes (see the module docstring).

    ``run`` and ``arun`` take the function that runs the task once; use it as a context manager, so
    that the ``NOTIFY`` listener (PostgreSQL only) is stopped when the wait ends."""

    def __init__(
        self,
        task_id: str,
        store: Store,
        approvals: ApprovalSource,
        cancellations: CancellationSource,
        clock: Clock,
        timeout_s: float | None,
    ):
        self.task_id = task_id
        self._store = store
        self._approvals = approvals
        self._cancellations = cancellations
        self._clock = clock
        self._until = None if timeout_s is None else clock.now() + timeout_s
        self._real_time = isinstance(clock, SystemClock)
        self._woken = threading.Event()
        self._stop = threading.Event()
        self._listener: threading.Thread | None = None
        self._outside = ""

    def __enter__(self) -> "Waiting":
        if self._real_time and self._notifies():
            self._listener = threading.Thread(target=self._listen, name=f"longrun-wait-{self.task_id}", daemon=True)
            self._listener.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._listener is not None:
            self._listener.join(timeout=5.0)

    # -- the two loops: the same rule, driven synchronously or awaited ----------------------------

    def run(self, once: Callable[[], RunOutcome]) -> RunOutcome:
        """Run the task with ``once`` until it ends, or stops waiting, or the time is up."""
        self._outside = self._outside_marks()
        outcome = once()
        while self._goes_on(outcome):
            self._wait(outcome)
            if self._time_is_up():
                break
            self._outside = self._outside_marks()
            outcome = once()
        return outcome

    async def arun(self, once: Callable[[], Awaitable[RunOutcome]]) -> RunOutcome:
        """``run``, awaited: each look and each pause happens in a worker thread, off the event loop."""
        self._outside = await asyncio.to_thread(self._outside_marks)
        outcome = await once()
        while self._goes_on(outcome):
            await asyncio.to_thread(self._wait, outcome)
            if self._time_is_up():
                break
            self._outside = await asyncio.to_thread(self._outside_marks)
            outcome = await once()
        return outcome

    # -- the rule --------------------------------------------------------------------------------

    def _goes_on(self, outcome: RunOutcome) -> bool:
        return outcome.status in _WAITS_ON and not self._time_is_up()

    def _time_is_up(self) -> bool:
        return self._until is not None and self._clock.now() >= self._until

    def _wait(self, outcome: RunOutcome) -> None:
        """Return when what ``outcome`` waits for may have come: a mark changed, its wake time or
        the timeout came, or ``RECHECK_S`` passed."""
        after = self._marks()
        started = self._clock.now()
        ends = [started + RECHECK_S]
        if outcome.wake_at is not None:
            ends.append(outcome.wake_at)
        if self._until is not None:
            ends.append(self._until)
        end = min(ends)
        pause = MIN_POLL_S
        while True:
            left = end - self._clock.now()
            if left <= 0:
                return
            if self._pause(min(pause, left)):
                return  # a NOTIFY: something reached a task; the run sees whether it was this one
            pause = min(pause * 2, MAX_POLL_S)
            now = self._marks()
            if now != after or now[0] != self._outside:
                return

    def _pause(self, seconds: float) -> bool:
        """Pause ``seconds`` on the clock; True if a ``NOTIFY`` cut it short."""
        if not self._real_time:
            self._clock.sleep(seconds)
            return False
        woken = self._woken.wait(seconds)
        self._woken.clear()
        return woken

    # -- what is watched ---------------------------------------------------------------------------

    def _outside_marks(self) -> str:
        """The task's control records and mailbox: what others write and a run of it only reads."""
        return _digest(self._outside_of(self.task_id))

    def _outside_of(self, task_id: str) -> list[JSONValue]:
        try:
            approvals: list[JSONValue] = [*sorted(record.digest or record.name for record in self._approvals.read_approvals(task_id))]
            cancellation = self._cancellations.read_cancellation(task_id)
            messages = len(self._store.read_messages(task_id))
        except LongrunError as exc:  # the next run meets it too and stops with it as evidence
            return [f"unreadable: {type(exc).__name__}: {exc}"]
        return [approvals, None if cancellation is None else cancellation.digest or cancellation.name, messages]

    def _marks(self) -> tuple[str, str]:
        """(the task's outside marks, the marks of the task and its unfinished descendants)."""
        family: list[JSONValue] = []
        for task_id in self._family():
            family.append([task_id, self._outside_of(task_id), self._own(task_id)])
        return self._outside_marks(), _digest(family)

    def _own(self, task_id: str) -> list[JSONValue]:
        try:
            lease = self._store.read_lease(task_id)
            state = self._store.load(task_id).state
        except LongrunError as exc:
            return [f"unreadable: {type(exc).__name__}: {exc}"]
        return [
            None if lease is None else [lease.epoch, lease.released],
            None if state is None else [state.revision, state.status.value],
        ]

    def _family(self) -> Iterator[str]:
        seen: set[str] = set()
        todo = [self.task_id]
        while todo and len(seen) < _MAX_FAMILY:
            task_id = todo.pop()
            if task_id in seen:
                continue
            seen.add(task_id)
            yield task_id
            with contextlib.suppress(LongrunError):  # an unreadable child is marked so by _own; its children are not walked
                state = self._store.load(task_id).state
                if state is not None:
                    todo.extend(unfinished_children(state, detached=True))

    # -- PostgreSQL NOTIFY -----------------------------------------------------------------------

    def _notifies(self) -> bool:
        from ..stores.postgres import PostgresStore  # only a PostgreSQL store has NOTIFY

        return isinstance(self._store, PostgresStore)

    def _listen(self) -> None:
        from ..stores.queue import open_queue  # the fleet's channel: its triggers send the NOTIFY

        try:
            queue = open_queue(self._store)
            try:
                queue.ensure()  # the triggers exist, and this task has its row, before the first wait
                queue.listen(self._woken.set, self._stop, timeout_s=MAX_POLL_S)
            finally:
                queue.close()
        except LongrunError as exc:  # polling goes on without it: a late wake-up, never a lost one
            log.warning("task %r: cannot listen for NOTIFY (%s); waiting by polling every %.1f s", self.task_id, exc, MAX_POLL_S)


def _digest(value: JSONValue) -> str:
    return "sha256:" + sha256_hex(canonical_bytes(value))
