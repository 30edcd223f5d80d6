"""Every benchmark the docs cite, once each: ``python benchmarks/all.py [--quick] [--out DIR] [--only NAMES]``.

Runs, one after another, each as a subprocess of the interpreter that runs this (so the peers and
the PostgreSQL drivers installed in it are measured too), with the sizes the docs quote:

- ``run.py``: the durability table (floors, the Runner on each store, the peers, ledger sizes);
- ``parallel.py``: effects in flight, the sequential sync face, a 1 MB payload;
- ``sql_commits.py``: the SQL stores per commit at 1,000 and 20,000 effects, PostgreSQL beside its floor;
- ``invocation.py``: one ``run()`` call with and without its first observe;
- ``outline.py``: recording a 100,000-step plan's outline;
- ``resume.py``: the resume of 100,000 verified effects, and of a 20,000-call durable function;
- ``many_tasks.py``: 10,000 and 100,000 tasks on SQLite and PostgreSQL, 1,000 on the JSON-file store;
- ``fleet.py --sqlite``: the worker fleet (needs ``LONGRUN_TEST_POSTGRES_DSN``; skipped without it).

``--quick`` is a smoke run: it passes ``--quick`` to the benchmarks that take it and small sizes to
the others (their figures then say little). ``--only run,fleet`` runs those alone.

Each benchmark's standard output goes to ``NAME.txt`` and its standard error (progress lines,
warnings, a traceback) to ``NAME.log`` in the output directory (``--out DIR``, by default a new
dated directory under the system's temporary directory). This prints, and writes to
``summary.txt`` there: the date, the machine, the Python, the checkout's commit, the peers
installed, whether PostgreSQL is measured, and for each benchmark its command, its exit status, its
wall time and the load average (1 minute) before and after it. Benchmarks that share a machine
with other work measure that work too: read the load averages before the figures. Exits 1 naming
every benchmark that failed (a non-zero exit, a signal, or one that could not start), 2 on a usage
error, 0 otherwise. Standard library only.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """One script of this directory: the arguments of a full run and of a smoke run."""

    name: str
    full: tuple[str, ...]
    quick: tuple[str, ...]
    needs_postgres: bool = False

    @property
    def script(self) -> str:
        return os.path.join(HERE, f"{self.name}.py")


# In the order a reader meets them in docs/performance.md; the full arguments are the sizes the
# docs quote (the scripts' defaults, but for the JSON-file store's many-tasks size and the fleet's
# SQLite rows).
BENCHMARKS = (
    Benchmark("run", (), ("--quick",)),
    Benchmark("parallel", (), ("--quick",)),
    Benchmark("sql_commits", (), ("--sizes", "200,1000", "--commits", "50", "--rounds", "2", "--effects", "50")),
    Benchmark("invocation", (), ("--quick",)),
    Benchmark("outline", (), ("--steps", "10000", "--rounds", "1", "--commits", "20")),
    Benchmark("resume", (), ("--size", "10000", "--function-size", "2000")),
    Benchmark("many_tasks", ("--json-sizes", "1000"), ("--sizes", "1000,5000", "--json-sizes", "200", "--rounds", "5")),
    Benchmark("fleet", ("--sqlite",), ("--sqlite", "--tasks", "40", "--workers", "1,2", "--rounds", "2"), needs_postgres=True),
)

PEERS = ("langgraph", "langgraph-checkpoint-sqlite", "dbos", "psycopg", "pg8000")


@dataclasses.dataclass
class Outcome:
    benchmark: Benchmark
    command: list[str]
    status: str  # "ok", "exit N", "signal NAME", "could not start: ...", "skipped: ..."
    wall_s: float | None = None
    load_before: float | None = None
    load_after: float | None = None

    @property
    def failed(self) -> bool:
        return self.status != "ok" and not self.status.startswith("skipped")


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:  # a system without a load average
        return None


def installed(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def checkout_commit() -> str:
    try:
        completed = subprocess.run(
            ["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=30, check=False
        )  # fmt: skip
    except OSError as exc:
        return f"unknown ({exc.strerror})"
    return completed.stdout.strip() or f"unknown (git: {completed.stderr.strip()[:100]})"


def postgres_server() -> str | None:
    """Where LONGRUN_TEST_POSTGRES_DSN points, without its user or password; None when it is not set."""
    url = os.environ.get("LONGRUN_TEST_POSTGRES_DSN")
    if not url:
        return None
    parts = urllib.parse.urlsplit(url)
    return f"{parts.hostname}:{parts.port or 5432}{parts.path}" if parts.hostname else "set (not a URL)"


def header(quick: bool, out: str) -> list[str]:
    memory = ""
    try:
        memory = f", {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.1f} GiB"
    except (ValueError, OSError, AttributeError):  # not every system names these
        pass
    peers = ", ".join(f"{name} {version}" for name in PEERS if (version := installed(name))) or "none"
    server = postgres_server()
    return [
        f"longrun benchmarks{' (quick: a smoke run, its figures say little)' if quick else ''}",
        f"  date        {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"  machine     {platform.node()}: {platform.system()} {platform.release()} {platform.machine()}, {os.cpu_count()} CPUs{memory}",
        f"  Python      {platform.python_implementation()} {platform.python_version()} ({sys.executable})",
        f"  checkout    {ROOT} at {checkout_commit()}",
        f"  installed   {peers}",
        f"  PostgreSQL  {server if server else 'not measured (set LONGRUN_TEST_POSTGRES_DSN to include it)'}",
        f"  output      {out}",
    ]


def run_one(benchmark: Benchmark, quick: bool, out: str) -> Outcome:
    command = [sys.executable, benchmark.script, *(benchmark.quick if quick else benchmark.full)]
    outcome = Outcome(benchmark, command, "ok")
    if benchmark.needs_postgres and not os.environ.get("LONGRUN_TEST_POSTGRES_DSN"):
        outcome.status = "skipped: needs LONGRUN_TEST_POSTGRES_DSN"
        return outcome
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.join(ROOT, "src"), environment.get("PYTHONPATH")]))
    outcome.load_before = load_average()
    started = time.perf_counter()
    with open(os.path.join(out, f"{benchmark.name}.txt"), "w") as stdout, open(os.path.join(out, f"{benchmark.name}.log"), "w") as stderr:
        try:
            completed = subprocess.run(command, stdout=stdout, stderr=stderr, cwd=ROOT, env=environment, check=False)
        except OSError as exc:
            outcome.status = f"could not start: {exc}"
            return outcome
    outcome.wall_s = time.perf_counter() - started
    outcome.load_after = load_average()
    if completed.returncode < 0:
        outcome.status = f"signal {_signal_name(-completed.returncode)}"
    elif completed.returncode > 0:
        outcome.status = f"exit {completed.returncode} (see {benchmark.name}.log)"
    return outcome


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def figure(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def row(outcome: Outcome) -> str:
    wall = figure(outcome.wall_s, ",.0f")
    return f"  {outcome.benchmark.name:12} {wall:>8} {figure(outcome.load_before, '.2f'):>7} {figure(outcome.load_after, '.2f'):>7}  {outcome.status}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: --quick or small sizes for each benchmark")
    parser.add_argument("--out", default=None, help="directory for each benchmark's output (default: a new dated one under the temp dir)")
    parser.add_argument("--only", default=None, help="comma-separated names to run alone: " + ", ".join(b.name for b in BENCHMARKS))
    args = parser.parse_args(argv)
    chosen = list(BENCHMARKS)
    if args.only is not None:
        names = [name.strip().removesuffix(".py") for name in args.only.split(",") if name.strip()]
        unknown = sorted(set(names) - {b.name for b in BENCHMARKS})
        if unknown or not names:
            parser.error(f"--only: unknown benchmark {', '.join(unknown)}" if unknown else "--only: name at least one benchmark")
        chosen = [b for b in BENCHMARKS if b.name in names]
    if args.out is None:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        out = tempfile.mkdtemp(prefix=f"longrun-benchmarks-{stamp}-")
    else:
        out = os.path.abspath(args.out)
        try:
            os.makedirs(out, exist_ok=True)
        except OSError as exc:
            parser.error(f"--out: cannot make {out}: {exc.strerror}")
    lines = header(args.quick, out)
    header_lines = len(lines)
    print("\n".join(lines), flush=True)
    began = time.perf_counter()
    outcomes: list[Outcome] = []
    for benchmark in chosen:
        print(f"  {benchmark.name} ...", flush=True)
        outcome = run_one(benchmark, args.quick, out)
        outcomes.append(outcome)
        print(row(outcome), flush=True)
    failed = [outcome.benchmark.name for outcome in outcomes if outcome.failed]
    lines += [
        "",
        f"  {'benchmark':12} {'wall s':>8} {'load':>7} {'load':>7}  status (output in NAME.txt, progress and errors in NAME.log)",
        f"  {'':12} {'':>8} {'before':>7} {'after':>7}",
        *(row(outcome) for outcome in outcomes),
        "",
        *(f"  {outcome.benchmark.name:12} {' '.join(os.path.relpath(part, ROOT) if part.startswith(ROOT) else part for part in outcome.command)}" for outcome in outcomes),
        "",
        f"all took {time.perf_counter() - began:,.0f} s; " + (f"FAILED: {', '.join(failed)}" if failed else "no benchmark failed"),
    ]
    print("\n".join(lines[header_lines:]), flush=True)
    with open(os.path.join(out, "summary.txt"), "w") as handle:
        handle.write("\n".join(lines) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
