"""An async durable function with many effects in flight, in its own process, for tests that SIGKILL it
(tests/test_async_crash.py).

A fork server, so that a test can kill a hundred processes without paying a hundred interpreter
starts::

    python async_child.py serve

reads one JSON request per line (``spec outbox task count later adapter``, and ``crash_at``
("name:N"), ``kill_after_s`` or ``trace``), forks a process that arms the crash points as
``LONGRUN_CRASH_AT`` and ``LONGRUN_CRASH_TRACE`` would, runs the task once and reports; then
answers one JSON line ``{"exit": returncode, "outcome": outcome or null}`` (a SIGKILLed process
exits -9).

The task: ``count`` effects at once (``asyncio.gather``, ``max_parallel=count``), each one line in an
``OutboxAdapter`` outbox (an ``O_APPEND`` write and an ``fsync`` under a lock, fenced by epoch).
``adapter`` is ``async`` (an async adapter that waits a random few milliseconds, so that many
applies are in flight at once, then writes) or ``sync`` (the outbox itself, in worker threads).
``spec`` names the store as ``longrun.stores.open_store`` reads it: a directory, ``sqlite:PATH`` or a
``postgresql://`` URL.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src"))  # run by path: longrun from src
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests: for helpers

import longrun  # noqa: E402
from longrun import EffectRequest, Limits, Observation, Receipt, RetryPolicy, SystemClock  # noqa: E402
from longrun.stores._spec import open_store  # noqa: E402
from longrun.testing import OutboxAdapter  # noqa: E402

from helpers import forked  # noqa: E402


class LaterClock(SystemClock):
    """The real clock shifted forward, so a resumed process finds a killed one's lease expired."""

    def __init__(self, offset: float):
        self.offset = offset

    def now(self) -> float:
        return super().now() + self.offset

    def monotonic(self) -> float:
        return super().monotonic() + self.offset


class AsyncOutbox:
    """The outbox behind an async adapter: each apply first waits a few milliseconds (many are in
    flight at once), then writes its line."""

    deduplicates = False

    def __init__(self, inner: OutboxAdapter):
        self.inner = inner

    async def apply(self, request: EffectRequest) -> Receipt:
        await asyncio.sleep(random.uniform(0.0, 0.01))
        return self.inner.apply(request)

    async def observe(self, request: EffectRequest) -> Observation:
        return self.inner.observe(request)


async def fan_out(run: longrun.AsyncRun, count: int) -> list[Any]:
    return list(await asyncio.gather(*(run.effect(f"e/{i}", "write", {"n": i}) for i in range(count))))


def run_once(spec: str, outbox: str, task: str, count: int, later: float, adapter: str) -> longrun.RunOutcome:
    target = OutboxAdapter(outbox)
    store = open_store(spec)
    agent = longrun.durable(
        store=store,
        adapters={"write": AsyncOutbox(target) if adapter == "async" else target},
        allowed_actions=("write",),
        clock=LaterClock(later),
        # Kills may land in the same effect many times: the attempt budget is not what is tested.
        limits=Limits(max_attempts=1000, max_failures=1000),  # killed again and again: never failed for it
        retry=RetryPolicy(base_delay_s=0.0, jitter=0.0),
        max_parallel=count,
    )(fan_out)
    try:
        return agent.run(task, count)
    finally:
        close = getattr(store, "close", None)
        if callable(close):
            close()


def run_request(request: dict[str, Any]) -> Any:
    random.seed()
    return run_once(request["spec"], request["outbox"], request["task"], request["count"], request["later"], request["adapter"])


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"]:
        return forked.serve(run_request)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
