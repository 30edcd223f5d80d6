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
import importlib
import json
import os
import random
import signal
import sys
import time
import traceback
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src"))

import longrun  # noqa: E402
from longrun import EffectRequest, Limits, Observation, Receipt, RetryPolicy, SystemClock  # noqa: E402
from longrun import _crashpoints  # noqa: E402
from longrun.stores._spec import open_store  # noqa: E402
from longrun.testing import OutboxAdapter  # noqa: E402


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
        limits=Limits(max_attempts=1000),
        retry=RetryPolicy(base_delay_s=0.0, jitter=0.0),
        max_parallel=count,
    )(fan_out)
    try:
        return agent.run(task, count)
    finally:
        close = getattr(store, "close", None)
        if callable(close):
            close()


def serve_one(request: dict[str, Any]) -> dict[str, Any]:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: arm the crash points as the environment would, run once, report
        os.close(read_end)
        code = 0
        try:
            os.environ.pop("LONGRUN_CRASH_AT", None)
            os.environ.pop("LONGRUN_CRASH_TRACE", None)
            if request.get("crash_at"):
                os.environ["LONGRUN_CRASH_AT"] = request["crash_at"]
            if request.get("trace"):
                os.environ["LONGRUN_CRASH_TRACE"] = request["trace"]
            importlib.reload(_crashpoints)
            random.seed()
            outcome = run_once(
                request["spec"], request["outbox"], request["task"], request["count"], request["later"], request["adapter"]
            )
            body = json.dumps(outcome.to_json()).encode()
            while body:
                body = body[os.write(write_end, body) :]
        except BaseException:
            traceback.print_exc()
            code = 70
        finally:
            os._exit(code)
    os.close(write_end)
    if request.get("kill_after_s") is not None:
        time.sleep(request["kill_after_s"])
        os.kill(pid, signal.SIGKILL)  # a zombie that already exited ignores it
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    exit_code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    output = b"".join(chunks)
    return {"exit": exit_code, "outcome": json.loads(output) if output else None}


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"]:
        for line in sys.stdin:
            if line.strip():
                print(json.dumps(serve_one(json.loads(line))), flush=True)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
