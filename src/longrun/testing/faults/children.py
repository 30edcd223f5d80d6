"""The fault task in child processes: what runs in them, and how the groups start and watch them.

``python -m longrun.testing.faults child ROOT OUTBOX [options]`` runs the task once over a
``JsonFileStore`` whose I/O names the crash points (``CrashPointIO``) and prints its outcome as one
JSON line; ``... race WORKDIR [options]`` runs it until it is done, whoever holds the lease,
logging every lease and state write in order (``RaceLogIO``) for ``check_race_log``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from typing import Any, Sequence

from ...budget import Limits, RetryPolicy
from ...clock import SystemClock
from ...errors import LongrunError
from ...outcome import Status
from ...runner import Runner
from ...stores import jsonfile
from ...stores import TEMP_MARK, FileIO
from .. import OutboxAdapter
from .points import CrashPointIO, file_kind
from .task import FACES, ShiftedClock, SlowAdapter, call_log_of, durable_arguments, durable_task, pace_calls, plan

__all__ = ["SRC", "RaceLogIO", "Workdir", "child_command", "child_env", "child_main", "race_command", "race_main", "spawn"]

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, os.pardir))
"""The directory longrun is imported from (``src`` in a checkout): a child imports the same code."""


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child: this one without crash-point settings, longrun importable, ``extra`` added."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("LONGRUN_CRASH_")}
    env["PYTHONPATH"] = SRC + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


def child_command(root: str, outbox: str, *options: str) -> list[str]:
    """The command line of a child that runs the fault task once (``child_main``)."""
    return [sys.executable, "-m", "longrun.testing.faults", "child", root, outbox, *options]


def race_command(workdir: str, *options: str) -> list[str]:
    """The command line of a racing child (``race_main``)."""
    return [sys.executable, "-m", "longrun.testing.faults", "race", workdir, *options]


class Workdir:
    """A scratch directory for one case; files the checks read are named here."""

    def __init__(self, base: str, name: str):
        self.dir = os.path.join(base, name)
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.root = os.path.join(self.dir, "store")
        self.outbox = os.path.join(self.dir, "outbox.jsonl")
        self.children = 0

    def trace(self, index: int) -> str:
        return os.path.join(self.dir, f"trace-{index}.txt")

    @property
    def calls(self) -> str:
        return call_log_of(self.outbox)


def spawn(work: Workdir, *options: str, crash_at: str = "", timeout: float = 120.0) -> tuple[int, dict[str, Any] | None, str]:
    """Run the fault task in a child process over ``work`` (killed at ``crash_at``, ``name:N``, if
    given) and wait: its exit code, its outcome (None if it printed none) and its stderr."""
    index = work.children
    work.children += 1
    env = child_env(LONGRUN_CRASH_TRACE=work.trace(index), **({"LONGRUN_CRASH_AT": crash_at} if crash_at else {}))
    offset = str(1e6 * (index + 1))  # each child is far past the leases of the ones before it
    completed = subprocess.run(
        child_command(work.root, work.outbox, "--offset", offset, *options), env=env, capture_output=True, text=True, timeout=timeout
    )
    outcome = None
    if completed.stdout.strip():
        try:
            outcome = json.loads(completed.stdout.strip().splitlines()[-1])
        except ValueError:
            outcome = None
    return completed.returncode, outcome, completed.stderr


def child_main(argv: Sequence[str]) -> int:
    """A runner (or, ``--face durable``, the durable function) in this process: runs the fault task
    once and prints its outcome as one JSON line."""
    parser = argparse.ArgumentParser(prog="longrun.testing.faults child")
    parser.add_argument("root")
    parser.add_argument("outbox")
    parser.add_argument("--face", choices=FACES, default="runner", help="a declared plan, or the same task as a durable function")
    parser.add_argument("--task", default="fault-task")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--approvals", default="")
    parser.add_argument("--offset", type=float, default=0.0)
    parser.add_argument("--monotonic-step", type=float, default=0.0)
    parser.add_argument("--ttl", type=float, default=30.0)
    parser.add_argument("--max-attempts", type=int, default=3)
    parser.add_argument("--slow", type=float, default=0.0)
    parser.add_argument("--signal", default="")
    parser.add_argument("--slow-call", type=float, default=0.0, help="seconds each call takes (durable face)")
    parser.add_argument("--call-signal", default="", help="a file each call appends to first (durable face)")
    parser.add_argument("--dedup", action="store_true")
    args = parser.parse_args(argv)
    jsonfile.COMPACT_MIN_BYTES = 0  # compact within a short task: every write protocol runs
    approvals = [int(item) for item in args.approvals.split(",") if item]
    adapter: Any = OutboxAdapter(args.outbox, deduplicates=args.dedup)
    if args.slow or args.signal:
        adapter = SlowAdapter(adapter, args.slow, args.signal)
    options: dict[str, Any] = dict(
        store=jsonfile.JsonFileStore(args.root, io=CrashPointIO(), create=True),
        adapters={"write": adapter},
        clock=ShiftedClock(args.offset, args.monotonic_step),
        limits=Limits(max_attempts=args.max_attempts, max_block_s=0.0),
        retry=RetryPolicy(base_delay_s=0.0, max_delay_s=0.0, jitter=0.0),
        lease_ttl_s=args.ttl,
    )
    if args.face == "durable":
        pace_calls(args.slow_call, args.call_signal)
        function = durable_task(**options)
        outcome = function.run(args.task, *durable_arguments(args.steps, approvals, call_log_of(args.outbox)))
    else:
        contract, steps = plan(args.task, args.steps, approvals)
        outcome = Runner(contract, steps, **options).run()
    print(json.dumps({"status": outcome.status.value, "revision": outcome.revision, "epoch": outcome.epoch,
                      "next_action": outcome.next_action, "result": outcome.result}))  # fmt: skip
    return 0


class RaceLogIO(FileIO):
    """Logs, in the order they happen, every lease write and every state write a racing runner makes.

    Each line is written before the write it announces and under the task's lock (every lease and
    state write is made under it), so the log's order is the order of the writes. A process killed
    between its line and its write leaves a line for a write that may not have landed; the checker
    (``check_race_log``) settles which did from what followed."""

    def __init__(self, path: str):
        self.path = path
        self._journals: set[int] = set()

    def _log(self, entry: dict[str, Any]) -> None:
        entry["pid"] = os.getpid()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, (json.dumps(entry, sort_keys=True) + "\n").encode())
        finally:
            os.close(fd)

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        fd = super().open(path, flags, mode)
        if file_kind(os.path.basename(path)) == "journal":
            self._journals.add(fd)
        return fd

    def close(self, fd: int) -> None:
        self._journals.discard(fd)
        super().close(fd)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        if fd in self._journals and data[:1] not in (b"", b"\0"):
            line = bytes(data).split(b"\n", 1)[0]
            try:
                record = json.loads(line[17:])
                self._log({"event": "commit", "rev": record["rev"], "epoch": record["epoch"]})
            except (ValueError, KeyError, TypeError):
                self._log({"event": "unparsed journal write"})
        return super().pwrite(fd, data, offset)

    def replace(self, source: str, destination: str) -> None:
        name = os.path.basename(destination)
        if name in ("lease.json", "state.json") and TEMP_MARK in source:
            with open(source, "rb") as handle:
                data = handle.read()
            if name == "lease.json":
                lease = json.loads(data)
                self._log({"event": "lease", "epoch": lease["epoch"], "owner": lease["owner"]})
            else:
                meta, header = data.split(b"\n")[:2]
                self._log({"event": "snapshot", "rev": json.loads(meta)["revision"], "epoch": json.loads(header[17:])["lease_epoch"]})
        super().replace(source, destination)


def race_main(argv: Sequence[str]) -> int:
    """A racing runner: runs the task until it is done, whoever holds the lease."""
    parser = argparse.ArgumentParser(prog="longrun.testing.faults race")
    parser.add_argument("workdir")
    parser.add_argument("--face", choices=FACES, default="runner")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--ttl", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deadline", type=float, default=90.0)
    parser.add_argument("--slow", type=float, default=0.04, help="seconds each apply takes")
    args = parser.parse_args(argv)
    jsonfile.COMPACT_MIN_BYTES = 0
    rng = random.Random(args.seed * 1000 + os.getpid())
    contract, steps = plan("race-task", args.steps)
    store = jsonfile.JsonFileStore(os.path.join(args.workdir, "store"), io=RaceLogIO(os.path.join(args.workdir, "writes.jsonl")), create=True)
    outbox = os.path.join(args.workdir, "outbox.jsonl")
    adapter = SlowAdapter(OutboxAdapter(outbox), args.slow, "")
    stop_at = time.monotonic() + args.deadline
    while time.monotonic() < stop_at:
        options: dict[str, Any] = dict(
            store=store, adapters={"write": adapter}, owner=f"racer:{os.getpid()}", clock=SystemClock(),
            limits=Limits(max_attempts=10_000, max_block_s=0.0), retry=RetryPolicy(base_delay_s=0.0, max_delay_s=0.0, jitter=0.0),
            lease_ttl_s=args.ttl,
        )  # fmt: skip
        try:
            if args.face == "durable":
                outcome = durable_task(**options).run("race-task", *durable_arguments(args.steps, (), call_log_of(outbox)))
            else:
                outcome = Runner(contract, steps, **options).run()
        except (LongrunError, OSError):
            time.sleep(0.05)
            continue
        if outcome.status is Status.DONE:
            return 0
        if outcome.status not in (Status.ALREADY_RUNNING, Status.LEASE_LOST, Status.RETRY_SCHEDULED):
            print(json.dumps({"status": outcome.status.value, "next_action": outcome.next_action}))
            return 3
        time.sleep(rng.uniform(0.02, 0.1))
    return 4
