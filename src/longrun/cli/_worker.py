"""``longrun worker``: run a fleet worker until SIGTERM or SIGINT; ``longrun workers``: list them.

``worker`` imports each ``--import`` module (``--path`` directories, then the current directory,
searched first), runs every ``@longrun.durable`` function found at its top level through a
``longrun.worker.Worker`` on STORE, and exits 0 once it has drained. With ``--metrics-port`` it
serves the store's metrics at ``http://127.0.0.1:PORT/metrics`` meanwhile (``_metrics``). ``workers`` lists the rows
workers keep in the store (exit 0 if at least one is alive, 1 if none is).
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence, TextIO

from ..errors import InvalidInputError
from ..protocols import Store
from ._common import CliError, ExitCode, write_json
from ._resume import import_module

__all__ = ["cmd_worker", "cmd_workers"]

CLOCK_OFFSET_VARIABLE = "LONGRUN_WORKER_CLOCK_OFFSET_S"


def _functions(modules: Sequence[str], paths: Sequence[str], err: TextIO, verbose: bool) -> list[Any]:
    from ..functions import DurableFunction  # imports the engine: only for commands that run tasks

    found: dict[str, Any] = {}
    for name in modules:
        module = import_module(name, paths, err, verbose)
        durable = [value for value in vars(module).values() if isinstance(value, DurableFunction)]
        if not durable:
            raise CliError(f"module {name!r} holds no @longrun.durable function at its top level", ExitCode.USAGE)
        for function in durable:
            found.setdefault(function.name, function)
    return list(found.values())


def _clock_offset() -> float:
    text = os.environ.get(CLOCK_OFFSET_VARIABLE, "").strip()
    if not text:
        return 0.0
    try:
        return float(text)
    except ValueError:
        raise CliError(f"{CLOCK_OFFSET_VARIABLE}={text!r} is not a number of seconds", ExitCode.USAGE) from None


def cmd_worker(
    store: Store, modules: Sequence[str], paths: Sequence[str], *, concurrency: int, name: str | None,
    limits: Mapping[str, int], claim_ttl_s: float, poll_s: float, as_json: bool, out: TextIO, err: TextIO, verbose: bool,
    metrics_port: int | None = None,
) -> int:  # fmt: skip
    from ..worker import Worker

    functions = _functions(modules, paths, err, verbose)
    known = {action for function in functions for action in function.engine_options.get("adapters", {})}
    unknown = sorted(set(limits) - known)
    if unknown:
        raise CliError(f"--limit names actions no imported function has an adapter for: {unknown}", ExitCode.USAGE)
    try:
        worker = Worker(
            store, functions, concurrency=concurrency, name=name, limits=limits, claim_ttl_s=claim_ttl_s, poll_s=poll_s,
            clock_offset_s=_clock_offset(),
        )  # fmt: skip
    except InvalidInputError as exc:
        raise CliError(str(exc), ExitCode.USAGE) from None
    endpoint = None
    if metrics_port is not None:
        from ._metrics import start_metrics_endpoint

        try:
            endpoint = start_metrics_endpoint(store, metrics_port)
        except OSError as exc:
            raise CliError(f"--metrics-port {metrics_port}: cannot listen on 127.0.0.1:{metrics_port}: {exc}", ExitCode.USAGE) from None
        err.write(f"longrun worker: metrics at {endpoint.url}\n")
        err.flush()
    try:
        report = worker.run()
    finally:
        if endpoint is not None:
            endpoint.stop()
    if as_json:
        write_json(out, {"name": report.name, "runs": report.runs, "statuses": dict(report.statuses), "drained": report.drained})
    else:
        counts = ", ".join(f"{status} {count}" for status, count in sorted(report.statuses.items())) or "none"
        out.write(f"worker {report.name}: stopped after {report.runs} runs ({counts}); {report.drained} drained between two steps\n")
    return ExitCode.OK


def cmd_workers(store: Store, as_json: bool, out: TextIO) -> int:
    from ..stores.queue import open_queue

    queue = open_queue(store)
    try:
        records = queue.workers()
    finally:
        queue.close()
    if as_json:
        write_json(out, [record.to_json() for record in records])
    else:
        if not records:
            out.write("no worker has run on this store\n")
        else:
            out.write(f"{'NAME':24} {'HOST':16} {'PID':>7} {'STATE':9} {'ALIVE':5} {'RUNNING':>7} {'CLAIMED':>7} {'HEARTBEAT':>12}  FUNCTIONS\n")
            for record in records:
                out.write(
                    f"{record.name[:24]:24} {record.host[:16]:16} {record.pid:>7} {record.state:9} "
                    f"{'yes' if record.alive else 'no':5} {record.running:>7} {record.claimed:>7} "
                    f"{record.heartbeat_age_s:>10.1f}s  {', '.join(record.functions)}\n"
                )
    return ExitCode.OK if any(record.alive for record in records) else ExitCode.NOT_AS_ASKED
