"""Run the test suite on every core: ``python -m tests [-v] [--workers N] [MODULE ...]``, from the repository root.

The suite is one ``unittest`` suite (``python -m unittest discover -s tests`` runs the same tests in
one process). This runner starts ``--workers`` worker processes (default: the cores this process
may use, at most 4) and hands each the next test module as soon as it is free, the slowest modules
first, so that the kill, fault and fleet tests of one module wait on their children while another
module uses the other core. Each module runs whole in one worker (its ``setUpModule``, class
fixtures and tests in order, as ``unittest`` runs them); its report is printed when it finishes,
never interleaved with another's. The summary at the end counts every module's tests, as
``unittest`` does, and the exit status is 0 only when every test passed or was skipped.

``--workers 1`` runs the modules one after another in one worker process. ``MODULE`` names test
modules (``test_cli``, or ``tests/test_cli.py``); without one, every ``tests/test_*.py`` runs.
A worker that dies (a test that kills its own process, say) fails the module it was running, and
a fresh worker takes the next one.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import select
import signal
import subprocess
import sys
import time
import traceback
import unittest
from typing import Any

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)

# The modules that take longest at the default scale (measured on 2 cores), started first so that
# no long module starts last while the other worker idles. Only the order depends on this list: a
# module missing from it runs after these, and a stale entry costs time, never a test.
SLOWEST_FIRST = (
    "test_fleet_crash",
    "test_functions_crash",
    "test_faults_processes",
    "test_crash",
    "test_talk_crash",
    "test_session_crash",
    "test_async_crash",
    "test_faults_storage",
    "test_faults_leases",
    "test_async",
    "test_console",
    "test_cli_ops",
    "test_session",
    "test_journal",
    "test_fuzz_loaders",
    "test_mcp",
    "test_mcp_crash",
    "test_waiting",
)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests", description=__doc__.split("\n\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="print one line per test, as unittest -v does")
    parser.add_argument("--workers", type=int, default=default_workers(), help="worker processes (default: %(default)s)")
    parser.add_argument("--dir", default=TESTS, help="the directory of the test modules (default: this one)")
    parser.add_argument("--worker", metavar="FDS", help=argparse.SUPPRESS)
    parser.add_argument("modules", nargs="*", metavar="MODULE", help="test modules to run (default: all)")
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    restore_interrupt()
    if args.worker is not None:
        return serve(args.worker, os.path.abspath(args.dir), verbosity=2 if args.verbose else 1)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    directory = os.path.abspath(args.dir)
    modules = [module_name(name) for name in args.modules] or discover(directory)
    unknown = [name for name in modules if not os.path.isfile(os.path.join(directory, name + ".py"))]
    if unknown or not modules:
        parser.error(f"no such test module in {directory}: {', '.join(unknown)}" if unknown else f"no test_*.py in {directory}")
    units = ordered(modules)
    return Pool(min(args.workers, len(units)), directory, verbose=args.verbose).run(units)


def default_workers() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, 4))


def restore_interrupt() -> None:
    """A shell starts a background job with SIGINT ignored, and every child would inherit that: the
    tests that stop a child with SIGINT (as Ctrl-C does) need it delivered, as in a foreground run."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def module_name(name: str) -> str:
    base = os.path.basename(name)
    return base[: -len(".py")] if base.endswith(".py") else base


def discover(directory: str) -> list[str]:
    return sorted(name[:-3] for name in os.listdir(directory) if name.startswith("test_") and name.endswith(".py"))


# Modules that never run at the same time as each other: their sessions run shell commands under the
# same effect keys (task ``t1``, step ``append-a``), and the command adapter finds a step's running
# commands by the key in the environment of every process on the machine, so one module would see
# the other's command as its own, still running. They run one after another in one worker.
TOGETHER = (("test_session_crash", "test_session", "test_mcp", "test_mcp_crash", "test_mcp_sdk"),)


def ordered(modules: list[str]) -> list[list[str]]:
    """The modules as units of work, slowest first: each module alone, or a ``TOGETHER`` group (in
    its order) where its first member would stand."""
    rank = {name: index for index, name in enumerate(SLOWEST_FIRST)}
    units: list[list[str]] = []
    placed: set[str] = set()
    for name in sorted(modules, key=lambda name: (rank.get(name, len(rank)), name)):
        if name in placed:
            continue
        group = next((group for group in TOGETHER if name in group), (name,))
        unit = [member for member in group if member in modules]
        units.append(unit)
        placed.update(unit)
    return units


class Pool:
    """The parent: hands out modules, prints each module's report whole, and sums the counts."""

    def __init__(self, size: int, directory: str, *, verbose: bool) -> None:
        self.size = size
        self.directory = directory
        self.verbose = verbose
        self.totals = dict.fromkeys(COUNTS, 0)
        self.failed: list[str] = []

    def run(self, units: list[list[str]]) -> int:
        started = time.perf_counter()
        queue = [list(unit) for unit in units]
        workers: list[Worker] = []
        try:
            while queue or workers:
                while queue and len(workers) < self.size:
                    worker = Worker(self.directory, self.verbose)
                    worker.take_unit(queue.pop(0))
                    workers.append(worker)
                for worker in Worker.wait_any(workers):
                    self.report(worker.take())
                    if worker.alive() and worker.pending:
                        worker.give(worker.pending.pop(0))
                    elif worker.alive() and queue:
                        worker.take_unit(queue.pop(0))
                    else:
                        if worker.pending:  # its worker died: the rest of its unit goes to a fresh one
                            queue.insert(0, worker.pending)
                        worker.close()
                        workers.remove(worker)
        except KeyboardInterrupt:
            for worker in workers:
                worker.kill()
            print("\ninterrupted", file=sys.stderr)
            return 130
        return self.summary(time.perf_counter() - started)

    def report(self, result: dict[str, Any]) -> None:
        counts = ", ".join(f"{result[key]} {key.replace('_', ' ')}" for key in COUNTS[1:] if result[key])
        state = "FAILED" if result["failed"] else "ok"
        tests = "test" if result["run"] == 1 else "tests"
        line = f"{result['module']}: {result['run']} {tests} in {result['seconds']:.1f}s, {state}" + (f" ({counts})" if counts else "")
        sys.stderr.write(result["output"] + line + "\n")
        sys.stderr.flush()
        for key in COUNTS:
            self.totals[key] += int(result[key])
        self.failed.extend(result["failed"])

    def summary(self, seconds: float) -> int:
        t = self.totals
        plural = "es" if self.size != 1 else ""
        lines = ["-" * 70, f"Ran {t['run']} tests in {seconds:.3f}s ({self.size} worker process{plural})", ""]
        ok = not t["failures"] and not t["errors"] and not t["unexpected_successes"]
        parts = [f"{key.replace('_', ' ')}={t[key]}" for key in COUNTS[1:] if t[key]]
        lines.append(("OK" if ok else "FAILED") + (f" ({', '.join(parts)})" if parts else ""))
        lines.extend(f"  failed: {name}" for name in self.failed)
        sys.stderr.write("\n".join(lines) + "\n")
        sys.stderr.flush()
        return 0 if ok else 1


COUNTS = ("run", "failures", "errors", "skipped", "expected_failures", "unexpected_successes")


class Worker:
    """One worker process: module names in on one pipe, one JSON report per module out on another.

    Its standard streams are this process's, as under ``unittest``: a test that reads standard input
    or prints sees the terminal, never the runner's pipes."""

    def __init__(self, directory: str, verbose: bool) -> None:
        commands_read, self.commands = os.pipe()
        reports_read, reports_write = os.pipe()
        command = [sys.executable, "-m", "tests", "--worker", f"{commands_read},{reports_write}", "--dir", directory]
        self.process = subprocess.Popen(command + (["-v"] if verbose else []), cwd=ROOT, pass_fds=(commands_read, reports_write))
        os.close(commands_read)
        os.close(reports_write)
        self.reports = reports_read
        os.set_blocking(reports_read, False)
        self.received = b""
        self.module = "?"
        self.pending: list[str] = []

    def take_unit(self, unit: list[str]) -> None:
        """Run ``unit``'s modules one after another, its first now."""
        self.pending = unit[1:]
        self.give(unit[0])

    def give(self, module: str) -> None:
        self.module = module
        os.write(self.commands, (module + "\n").encode())

    def drain(self) -> None:
        """Read what the worker has written so far, never waiting for more."""
        while True:
            try:
                chunk = os.read(self.reports, 1 << 16)
            except BlockingIOError:
                return
            if not chunk:
                return
            self.received += chunk

    def has_report(self) -> bool:
        return b"\n" in self.received

    @staticmethod
    def wait_any(workers: list[Worker]) -> list[Worker]:
        """The workers with a report to take: one that wrote a whole one, or one whose process has
        ended. Reads never block: a child a test forked may hold the pipe open after the worker is
        gone, so neither the end of the file nor the rest of a line can be waited for."""
        while True:
            select.select([worker.reports for worker in workers], [], [], 0.5)
            for worker in workers:
                worker.drain()
            done = [worker for worker in workers if worker.has_report() or not worker.alive()]
            if done:
                return done

    def take(self) -> dict[str, Any]:
        self.drain()
        if self.has_report():
            line, self.received = self.received.split(b"\n", 1)
            report: dict[str, Any] = json.loads(line)
            return report
        code = self.process.wait()
        output = f"ERROR: {self.module}: its worker process ended with status {code} before it reported\n"
        return {**dict.fromkeys(COUNTS, 0), "errors": 1, "module": self.module, "seconds": 0.0, "output": output, "failed": [self.module]}

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        os.close(self.commands)
        self.process.wait()
        os.close(self.reports)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


def serve(fds: str, directory: str, *, verbosity: int) -> int:
    """The worker: runs each module named on its command pipe; writes each report as one JSON line."""
    commands_fd, reports_fd = (int(fd) for fd in fds.split(","))
    for fd in (commands_fd, reports_fd):
        os.set_inheritable(fd, False)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    with os.fdopen(commands_fd, "r", encoding="utf-8") as commands, os.fdopen(reports_fd, "w", encoding="utf-8") as reports:
        for line in commands:
            module = line.strip()
            if module:
                reports.write(json.dumps(run_module(module, verbosity)) + "\n")
                reports.flush()
    return 0


def run_module(module: str, verbosity: int) -> dict[str, Any]:
    started = time.perf_counter()
    stream = io.StringIO()
    try:
        suite = unittest.TestLoader().loadTestsFromName(module)
    except unittest.SkipTest as skip:  # a module that skips itself on import, as discover allows
        suite = unittest.TestSuite([_placeholder(module, skip=str(skip))])
    except Exception:  # an import that fails other than with ImportError: the module's one error
        suite = unittest.TestSuite([_placeholder(module, error=traceback.format_exc())])
    result = unittest.TextTestResult(unittest.runner._WritelnDecorator(stream), True, 2 if verbosity > 1 else 0)  # type: ignore[attr-defined]
    suite(result)
    result.printErrors()
    failed = [test.id() for test, _ in result.failures + result.errors] + [test.id() for test in result.unexpectedSuccesses]
    output = stream.getvalue() if verbosity > 1 or failed else ""
    counts = (result.testsRun, len(result.failures), len(result.errors), len(result.skipped),
              len(result.expectedFailures), len(result.unexpectedSuccesses))  # fmt: skip
    return {**dict(zip(COUNTS, counts)), "module": module, "seconds": time.perf_counter() - started, "output": output, "failed": failed}


def _placeholder(module: str, *, skip: str = "", error: str = "") -> unittest.TestCase:
    """Stands for a module that could not be loaded: skipped with its reason (as ``discover``
    reports it, so that the counts agree), or one failure carrying the import's traceback."""

    def test_module(self: unittest.TestCase) -> None:
        self.fail(f"{module} could not be imported:\n{error}")

    method = unittest.skip(skip)(test_module) if skip else test_module
    namespace = {"test_module": method, "id": lambda self: f"{module}.load", "__str__": lambda self: f"{module} (its import)"}
    return type("ModuleLoad", (unittest.TestCase,), namespace)("test_module")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
