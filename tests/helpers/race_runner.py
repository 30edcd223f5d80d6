"""A runner process for the store race tests: runs every task of a shared store until all are done.

Usage: python race_runner.py WORKDIR --slot N (--sqlite PATH | --postgres-schema NAME [--driver D])
                              [--tasks N] [--steps N] [--ttl S] [--skew S] [--seed N]

Many of these race for the same tasks while the test kills (SIGKILL) and freezes (SIGSTOP past the
lease) them. Each loop picks a task that is not known to be done and runs it once. What the test
checks afterwards is written as JSON lines under WORKDIR:

- ``outbox.jsonl``: one line per applied effect (``longrun.testing.OutboxAdapter``).
- ``events.jsonl``: every lease this process acquired (task, epoch, the store's acquired_at) and
  every run's outcome.
- ``refused.jsonl``: every apply the target refused because a newer epoch had reached it.

The target fences the way the README asks of targets that must refuse stale work: it remembers the
highest epoch that has *observed or applied* a task's effects and refuses an apply below it. (The
outbox alone fences only on the epochs of applied lines, which leaves the window between a new
owner's observation and its apply open to a frozen old owner: the documented limit of a target
that does not fence.)
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import random
import sys
import time
from typing import Any, Iterator

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src"))  # run by path: longrun from src
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests: for helpers.pg_support

from longrun import Limits, LongrunError, PermanentError, RetryPolicy, RunContract, Runner, Status, Step  # noqa: E402
from longrun.adapters import EffectRequest, Observation, Receipt  # noqa: E402
from longrun.testing import OutboxAdapter  # noqa: E402


def append(path: str, entry: dict[str, Any]) -> None:
    """One JSON line, appended in one write (so lines of racing processes never interleave)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, (json.dumps(entry, sort_keys=True) + "\n").encode())
    finally:
        os.close(fd)


class FencingOutbox:
    """An ``OutboxAdapter`` behind a target-side fence on the highest epoch seen per task."""

    def __init__(self, workdir: str, rng: random.Random):
        self.inner = OutboxAdapter(os.path.join(workdir, "outbox.jsonl"))
        self.deduplicates = False
        self.workdir = workdir
        self.rng = rng
        self.fences = os.path.join(workdir, "fences.json")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, int]]:
        fd = os.open(os.path.join(self.workdir, "fences.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                with open(self.fences) as handle:
                    fences = json.load(handle)
            except FileNotFoundError:
                fences = {}
            before = dict(fences)
            yield fences
            if fences != before:
                temp = self.fences + f".{os.getpid()}"
                with open(temp, "w") as handle:
                    json.dump(fences, handle)
                os.replace(temp, self.fences)
        finally:
            os.close(fd)

    def apply(self, request: EffectRequest) -> Receipt:
        time.sleep(self.rng.uniform(0.05, 0.2))  # the work before the target is reached
        with self._locked() as fences:
            newest = fences.get(request.task_id, 0)
            if request.epoch < newest:
                append(
                    os.path.join(self.workdir, "refused.jsonl"),
                    {"task": request.task_id, "key": request.key, "epoch": request.epoch, "fence": newest, "pid": os.getpid()},
                )
                raise PermanentError(f"stale epoch {request.epoch} < {newest}: the target fences this write")
            fences[request.task_id] = request.epoch
            receipt = self.inner.apply(request)
        time.sleep(self.rng.uniform(0.0, 0.04))  # the effect happened; the runner has not recorded it yet
        return receipt

    def observe(self, request: EffectRequest) -> Observation:
        with self._locked() as fences:
            fences[request.task_id] = max(fences.get(request.task_id, 0), request.epoch)
            return self.inner.observe(request)


class SkewedClock:
    """The real clock, off by ``skew`` seconds, as on a machine whose clock is wrong."""

    def __init__(self, skew: float):
        self.skew = skew

    def now(self) -> float:
        return time.time() + self.skew

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(min(seconds, 0.5))


class RecordingStore:
    """Passes every call through to the store; logs each lease acquired, with the store's times."""

    def __init__(self, inner: Any, events: str, slot: int):
        self.inner = inner
        self.events = events
        self.slot = slot

    def acquire_lease(self, task_id: str, owner: str, ttl_s: float, now: float, *, monotonic: Any = None) -> Any:
        lease = self.inner.acquire_lease(task_id, owner, ttl_s, now, monotonic=monotonic)
        append(
            self.events,
            {"event": "acquired", "task": task_id, "epoch": lease.epoch, "acquired_at": lease.acquired_at,
             "slot": self.slot, "pid": os.getpid()},
        )
        return lease

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def open_store(args: argparse.Namespace) -> Any:
    if args.sqlite:
        from longrun import SqliteStore

        return SqliteStore(args.sqlite, create=True)
    from helpers import pg_support
    from longrun import PostgresStore
    from longrun.stores._spec import postgres_connector

    connect = postgres_connector(pg_support.dsn() or "", driver=args.driver)
    schema = args.postgres_schema

    def factory() -> Any:
        connection = connect()
        connection.cursor().execute(f"SET search_path TO {schema}")
        connection.commit()
        return connection

    return PostgresStore(factory)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir")
    parser.add_argument("--slot", type=int, required=True)
    parser.add_argument("--sqlite", default="")
    parser.add_argument("--postgres-schema", default="")
    parser.add_argument("--driver", default=None)
    parser.add_argument("--tasks", type=int, default=6)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--ttl", type=float, default=1.0)
    parser.add_argument("--skew", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deadline", type=float, default=90.0)
    args = parser.parse_args()
    rng = random.Random(args.seed * 1000 + os.getpid())
    events = os.path.join(args.workdir, "events.jsonl")
    store = RecordingStore(open_store(args), events, args.slot)
    adapter = FencingOutbox(args.workdir, rng)
    steps = [Step(f"step-{i:02d}", "write", {"n": i}) for i in range(args.steps)]
    pending = [f"task-{i:02d}" for i in range(args.tasks)]
    stop_at = time.monotonic() + args.deadline
    while pending and time.monotonic() < stop_at:
        task = rng.choice(pending)
        runner = Runner(
            RunContract(task, "race for the same tasks"),
            steps,
            store=store,  # type: ignore[arg-type]
            adapters={"write": adapter},  # type: ignore[dict-item]
            owner=f"slot{args.slot}:{os.getpid()}",
            clock=SkewedClock(args.skew),
            limits=Limits(max_attempts=10_000, max_block_s=0.0, max_failures=10_000),  # racers take leases over mid-step
            retry=RetryPolicy(base_delay_s=0.0, jitter=0.0),
            lease_ttl_s=args.ttl,
        )
        try:
            outcome = runner.run()
        except (LongrunError, OSError) as exc:
            append(events, {"event": "error", "task": task, "error": f"{type(exc).__name__}: {exc}", "slot": args.slot, "pid": os.getpid()})
            time.sleep(0.05)
            continue
        append(events, {"event": "outcome", "task": task, "status": outcome.status.value, "epoch": outcome.epoch,
                        "slot": args.slot, "pid": os.getpid()})
        if outcome.status is Status.DONE:
            pending.remove(task)
        elif outcome.status in (Status.ALREADY_RUNNING, Status.LEASE_LOST, Status.RETRY_SCHEDULED):
            time.sleep(rng.uniform(0.02, 0.1))
        else:  # anything else is a failure the test reports
            pending.remove(task)
    sys.exit(0 if not pending else 3)


if __name__ == "__main__":
    main()
