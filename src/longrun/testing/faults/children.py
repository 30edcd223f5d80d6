"""The fault task in child processes: what runs in them, and how the groups start and watch them.

``python -m longrun.testing.faults child ROOT OUTBOX [options]`` runs the task once over a
``JsonFileStore`` whose I/O names the crash points (``CrashPointIO``) and prints its outcome as one
JSON line; ``... race WORKDIR [options]`` runs it until it is done, whoever holds the lease,
logging every lease and state write in order (``RaceLogIO``) for ``check_race_log``.

Inside ``fork_servers()``, ``spawn`` forks each child from a server process (``... fork-server``)
that imported this module once, instead of starting Python: importing longrun and this suite costs
most of a short child's time. A forked child is armed from its environment as a started one is
(``LONGRUN_CRASH_AT``, ``LONGRUN_CRASH_TRACE``, read again after the fork), writes its output to
files, and is a process of its own: its SIGKILL is the server's child's, reported as the exit code.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import queue
import random
import select
import shutil
import signal
import subprocess
import sys
import time
import traceback
from typing import Any, Generator, Sequence

from ... import _crashpoints

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

__all__ = [
    "SRC", "ForkServer", "RaceLogIO", "Workdir", "child_command", "child_env", "child_main", "fork_server_main", "fork_servers",
    "race_command", "race_main", "spawn",
]  # fmt: skip

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
    crash = {"LONGRUN_CRASH_TRACE": work.trace(index), **({"LONGRUN_CRASH_AT": crash_at} if crash_at else {})}
    offset = str(1e6 * (index + 1))  # each child is far past the leases of the ones before it
    arguments = [work.root, work.outbox, "--offset", offset, *options]
    pool = _servers
    if pool is not None:
        server = pool.get()
        try:
            output = os.path.join(work.dir, f"child-{index}")
            code = server.run(arguments, crash, output, timeout)
        finally:
            pool.put(server)
        stdout, stderr = (_read_text(f"{output}.{stream}") for stream in ("out", "err"))
    else:
        completed = subprocess.run(child_command(*arguments), env=child_env(**crash), capture_output=True, text=True, timeout=timeout)
        code, stdout, stderr = completed.returncode, completed.stdout, completed.stderr
    outcome = None
    if stdout.strip():
        try:
            outcome = json.loads(stdout.strip().splitlines()[-1])
        except ValueError:
            outcome = None
    return code, outcome, stderr


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


class ForkServer:
    """A server process that imported the fault task once; ``run`` forks one child of it per call."""

    def __init__(self) -> None:
        # A session of its own: on a timeout the server and the child it forked are killed together.
        self.process = subprocess.Popen(
            [sys.executable, "-m", "longrun.testing.faults", "fork-server"], env=child_env(), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip

    def run(self, arguments: list[str], crash: dict[str, str], output: str, timeout: float) -> int:
        """Run ``child_main(arguments)`` in a child forked with ``crash`` added to its environment, its
        stdout and stderr in ``output``.out and ``output``.err: its exit code (negative: its signal)."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"arguments": arguments, "crash": crash, "output": output}) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            self.kill()
            raise subprocess.TimeoutExpired(child_command(*arguments), timeout) if not ready else RuntimeError("the fork server died")
        code: int = json.loads(line)["exit"]
        return code

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()
        if self.process.stdout is not None:
            self.process.stdout.close()


_servers: queue.Queue[ForkServer] | None = None


@contextlib.contextmanager
def fork_servers(count: int) -> Generator[None]:
    """While open, ``spawn`` forks its children from ``count`` servers (one per thread that spawns
    at once) instead of starting a Python process for each."""
    global _servers
    if _servers is not None:  # already inside: the outer servers serve
        yield
        return
    pool: queue.Queue[ForkServer] = queue.Queue()
    servers = [ForkServer() for _ in range(count)]
    for server in servers:
        pool.put(server)
    _servers = pool
    try:
        yield
    finally:
        _servers = None
        for server in servers:
            server.close()


def fork_server_main() -> int:
    """The server: for each request line on stdin, fork a child that runs ``child_main`` armed with
    the request's crash settings, wait for it, and answer its exit code on one line."""
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            _forked_child(request)
        _, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        sys.stdout.write(json.dumps({"exit": code}) + "\n")
        sys.stdout.flush()
    return 0


def _forked_child(request: dict[str, Any]) -> None:
    """In the forked child: the environment and the streams of a started child, then ``child_main``."""
    code = 1
    try:
        for name in [name for name in os.environ if name.startswith("LONGRUN_CRASH_")]:
            del os.environ[name]
        os.environ.update(request["crash"])
        importlib.reload(_crashpoints)  # armed from the environment, as at a process's start
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, stream in ((1, "out"), (2, "err")):
            target = os.open(f"{request['output']}.{stream}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(target, fd)
            os.close(target)
        code = child_main(request["arguments"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


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
        limits=Limits(max_attempts=args.max_attempts, max_block_s=0.0, max_failures=10_000),  # killed again and again
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
            limits=Limits(max_attempts=10_000, max_block_s=0.0, max_failures=10_000),  # racers take leases over mid-step
            retry=RetryPolicy(base_delay_s=0.0, max_delay_s=0.0, jitter=0.0),
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
