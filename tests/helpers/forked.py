"""The kill tests' fork servers (``durable_child``, ``async_child``): the server process imports
longrun once and forks one child per run, armed with crash points, which is much cheaper than
starting a Python process each time; ``Server`` is the test's side of it.

The kill loops' tasks are independent of each other, while each loop drives its task's runs one
after another, one core at a time: ``Servers`` keeps a server per worker so that ``concurrently``
can drive several tasks at once (one thread each, every task in its own store directory), which
keeps the cores of a small machine busy."""

from __future__ import annotations

import collections
import concurrent.futures
import importlib
import json
import os
import queue
import select
import signal
import subprocess
import sys
import time
import traceback
import unittest
from typing import Any, Callable, Iterable, Iterator, TypeVar

from longrun import _crashpoints

from . import support


def serve_one(request: dict[str, Any], run: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    """Fork; in the child, arm the crash points ``request`` names, call ``run(request)`` and write
    its outcome's JSON back; SIGKILL the child after ``kill_after_s`` if given. The child's exit
    code (negative: the signal that ended it) and outcome (None if it wrote none)."""
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
            body = json.dumps(run(request).to_json()).encode()
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


def serve(run: Callable[[dict[str, Any]], Any]) -> int:
    """Read one JSON request a line from stdin, answer each with ``serve_one``'s result, a line."""
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(serve_one(json.loads(line), run)), flush=True)
    return 0


KILLED = -signal.SIGKILL
"""The exit code ``serve_one`` reports for a child that was SIGKILLed."""


class Server:
    """The test's side: ``python CHILD serve`` started on first use, one request a line, stopped
    by the test's cleanup. A reply that is neither a clean exit nor a SIGKILL fails the test with
    the server's error output."""

    def __init__(self, case: unittest.TestCase, child: str, errors_path: str, *, timeout_s: float = 120.0):
        self._case = case
        self._child = child
        self._errors_path = errors_path
        self._timeout_s = timeout_s
        self._process: subprocess.Popen[str] | None = None

    def _started(self) -> subprocess.Popen[str]:
        if self._process is None:
            errors = open(self._errors_path, "w")
            self._case.addCleanup(errors.close)
            self._process = subprocess.Popen(
                [sys.executable, self._child, "serve"],
                env=support.child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True,
            )  # fmt: skip
            self._case.addCleanup(self._stop)
        return self._process

    def _stop(self) -> None:
        assert self._process is not None and self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.close()
        self._process.wait(timeout=30)
        self._process.stdout.close()

    def run(self, request: dict[str, Any], what: str) -> dict[str, Any]:
        """Send one run; its reply (``exit``: 0 or ``KILLED``, ``outcome``)."""
        process = self._started()
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(json.dumps(request) + "\n")
        process.stdin.flush()
        if not select.select([process.stdout], [], [], self._timeout_s)[0]:  # one line a request: nothing is left buffered
            process.kill()
            self._case.fail(f"{what} did not finish in {self._timeout_s:g} s")
        reply: dict[str, Any] = json.loads(process.stdout.readline())
        if reply["exit"] not in (0, KILLED):
            with open(self._errors_path) as handle:
                self._case.fail(f"{what} exited {reply['exit']}:\n{handle.read()}")
        return reply


WORKERS = 2
"""How many tasks ``concurrently`` drives at once: the two cores of a small machine; each is a
server process more to start (an interpreter and ``import longrun``), so no more than that."""

_T = TypeVar("_T")
_R = TypeVar("_R")


class Servers:
    """``WORKERS`` fork servers of ``child`` for one test, each started on first use: ``run`` sends
    a request to one that is free (each answers one request at a time), so threads may share them."""

    def __init__(self, case: unittest.TestCase, child: str, errors_prefix: str, *, workers: int = WORKERS, timeout_s: float = 120.0):
        self._idle: queue.SimpleQueue[Server] = queue.SimpleQueue()
        for i in range(workers):
            self._idle.put(Server(case, child, f"{errors_prefix}.{i}", timeout_s=timeout_s))

    def run(self, request: dict[str, Any], what: str) -> dict[str, Any]:
        """``Server.run`` on whichever server is free."""
        server = self._idle.get()
        try:
            return server.run(request, what)
        finally:
            self._idle.put(server)


def concurrently(job: Callable[[_T], _R], items: Iterable[_T], *, workers: int = WORKERS) -> Iterator[_R]:
    """``job(item)`` for each item, ``workers`` at a time in threads; yields the results in the items'
    order. ``items`` is read lazily: the next item is taken only when a job has ended and its result
    been yielded, so a generator of items may stop on what the ended jobs did. A job's failure (an
    assertion included) is raised here as the job raised it, once the jobs already started have
    ended; no job starts after it."""
    remaining = iter(items)
    pending: collections.deque[concurrent.futures.Future[_R]] = collections.deque()
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        try:
            while True:
                while len(pending) < workers and (item := next(remaining, _END)) is not _END:
                    pending.append(pool.submit(job, item))
                if not pending:
                    return
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


_END: Any = object()
