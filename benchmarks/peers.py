"""The peers, each in its own process: ``python benchmarks/peers.py NAME STEPS DIRECTORY``.

Runs the same loop as longrun's benchmark (``STEPS`` sequential no-op steps, each durably recorded)
through a peer framework, and prints one JSON line: ``{"per_step_s": ..., "label": ...}``, or
``{"skipped": "why"}`` when the peer is not installed or cannot run here. A separate process keeps
a framework's global state, threads and logging out of the other measurements. ``NAME`` is
``langgraph`` (SqliteSaver), ``dbos`` (its system database in SQLite, in ``DIRECTORY``) or
``dbos-postgres`` (its system database on the server ``LONGRUN_TEST_POSTGRES_DSN`` names, in a
throwaway database this creates and drops; skipped when that variable is not set).
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import sqlite3
import sys
import time
from typing import Any


def version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def langgraph(steps: int, directory: str) -> dict[str, Any]:
    """A LangGraph graph whose one node loops ``steps`` times; SqliteSaver checkpoints every step."""
    try:
        from typing import TypedDict

        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.graph import END, START, StateGraph
    except ImportError as exc:
        return {"skipped": f"not installed ({exc.name}); pip install langgraph langgraph-checkpoint-sqlite"}

    class Counter(TypedDict):
        n: int

    connection = sqlite3.connect(os.path.join(directory, "langgraph.sqlite"), check_same_thread=False)
    mode = connection.execute("PRAGMA journal_mode").fetchone()[0]
    synchronous = connection.execute("PRAGMA synchronous").fetchone()[0]
    graph = StateGraph(Counter)
    graph.add_node("step", lambda state: {"n": state["n"] + 1})
    graph.add_edge(START, "step")
    graph.add_conditional_edges("step", lambda state: END if state["n"] >= steps else "step")
    app = graph.compile(checkpointer=SqliteSaver(connection))
    started = time.perf_counter()
    result = app.invoke({"n": 0}, {"configurable": {"thread_id": "bench"}, "recursion_limit": steps + 10})
    elapsed = time.perf_counter() - started
    assert result["n"] == steps, result
    checkpoints = connection.execute("SELECT count(*) FROM checkpoints").fetchone()[0]
    connection.close()
    return {
        "per_step_s": elapsed / steps,
        "label": f"LangGraph {version('langgraph')} + SqliteSaver {version('langgraph-checkpoint-sqlite')}",
        "detail": f"{checkpoints} checkpoints, journal_mode={mode}, synchronous={synchronous}",
    }


def dbos_loop(steps: int, config: dict[str, Any]) -> float:
    """Seconds per step of one DBOS workflow of ``steps`` no-op steps, after one warm-up workflow."""
    from dbos import DBOS

    logging.disable(logging.INFO)
    DBOS(config={"name": "longrun-bench", "run_admin_server": False, **config})  # type: ignore[typeddict-item]

    @DBOS.step()
    def noop(index: int) -> int:
        return index

    @DBOS.workflow()
    def workflow(count: int) -> int:
        for index in range(count):
            noop(index)
        return count

    DBOS.launch()
    try:
        workflow(3)  # warm up the machinery once, as longrun's loop has its task created first
        started = time.perf_counter()
        workflow(steps)
        elapsed = time.perf_counter() - started
    finally:
        DBOS.destroy()
    return elapsed / steps


def dbos(steps: int, directory: str) -> dict[str, Any]:
    """A DBOS workflow of ``steps`` no-op steps, with its system database in SQLite."""
    try:
        import dbos as _installed  # noqa: F401 - the import is the check
    except ImportError as exc:
        return {"skipped": f"not installed ({exc.name}); pip install dbos"}
    per_step = dbos_loop(steps, {"system_database_url": f"sqlite:///{os.path.join(directory, 'dbos.sqlite')}"})
    return {"per_step_s": per_step, "label": f"DBOS {version('dbos')} on SQLite", "detail": "one workflow, steps recorded in its system database"}


def dbos_postgres(steps: int, directory: str) -> dict[str, Any]:
    """The same DBOS workflow with its system database on the server ``LONGRUN_TEST_POSTGRES_DSN`` names.

    The system database is a throwaway database on that server, created here and dropped after the
    run; where the role may not create databases, a throwaway schema (DBOS's ``dbos_system_schema``)
    in the DSN's own database instead, dropped likewise. PostgreSQL's own settings are left as the
    server has them (``synchronous_commit`` on by default, as for longrun's PostgresStore row).
    """
    url = os.environ.get("LONGRUN_TEST_POSTGRES_DSN")
    if not url:
        return {"skipped": "set LONGRUN_TEST_POSTGRES_DSN to include it"}
    try:
        import dbos as _installed  # noqa: F401 - the import is the check
        import psycopg
    except ImportError as exc:
        return {"skipped": f"not installed ({exc.name}); pip install dbos psycopg"}
    import urllib.parse

    name = f"lr_bench_dbos_{os.getpid()}_{int(time.time())}"
    parts = urllib.parse.urlsplit(url)
    admin = psycopg.connect(url, autocommit=True)
    try:
        try:
            admin.execute(f'CREATE DATABASE "{name}"')
        except psycopg.errors.InsufficientPrivilege:
            admin.execute(f'CREATE SCHEMA "{name}"')
            config: dict[str, Any] = {"system_database_url": url, "dbos_system_schema": name}
            drop, where = f'DROP SCHEMA IF EXISTS "{name}" CASCADE', "a throwaway schema"
        else:
            config = {"system_database_url": urllib.parse.urlunsplit(parts._replace(path=f"/{name}"))}
            drop, where = f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', "a throwaway database"
        try:
            per_step = dbos_loop(steps, config)
        finally:
            admin.execute(drop)
        synchronous_commit = admin.execute("SHOW synchronous_commit").fetchone()
        server = admin.info.server_version
    finally:
        admin.close()
    return {
        "per_step_s": per_step,
        "label": f"DBOS {version('dbos')} on PostgreSQL",
        "detail": f"one workflow, system database in {where}, PostgreSQL {server // 10000}.{server % 10000}, "
        f"synchronous_commit={synchronous_commit[0] if synchronous_commit else '?'}",
    }


PEERS = {"langgraph": langgraph, "dbos": dbos, "dbos-postgres": dbos_postgres}


def main() -> None:
    name, steps, directory = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    try:
        result = PEERS[name](steps, directory)
    except Exception as exc:  # a peer that cannot run here is reported, not a crash of the benchmark
        result = {"skipped": f"failed to run here: {type(exc).__name__}: {exc}"[:300]}
    sys.stdout.write("\n" + json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
