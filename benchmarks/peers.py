"""The peers, each in its own process: ``python benchmarks/peers.py NAME STEPS DIRECTORY``.

Runs the same loop as longrun's benchmark (``STEPS`` sequential no-op steps, each durably recorded)
through a peer framework, and prints one JSON line: ``{"per_step_s": ..., "label": ...}``, or
``{"skipped": "why"}`` when the peer is not installed or cannot run here. A separate process keeps
a framework's global state, threads and logging out of the other measurements.
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


def dbos(steps: int, directory: str) -> dict[str, Any]:
    """A DBOS workflow of ``steps`` no-op steps, with its system database in SQLite."""
    try:
        from dbos import DBOS
    except ImportError as exc:
        return {"skipped": f"not installed ({exc.name}); pip install dbos"}
    logging.disable(logging.INFO)
    DBOS(config={"name": "longrun-bench", "system_database_url": f"sqlite:///{os.path.join(directory, 'dbos.sqlite')}", "run_admin_server": False})  # type: ignore[typeddict-unknown-key]

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
    return {"per_step_s": elapsed / steps, "label": f"DBOS {version('dbos')} on SQLite", "detail": "one workflow, steps recorded in its system database"}


PEERS = {"langgraph": langgraph, "dbos": dbos}


def main() -> None:
    name, steps, directory = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    try:
        result = PEERS[name](steps, directory)
    except Exception as exc:  # a peer that cannot run here is reported, not a crash of the benchmark
        result = {"skipped": f"failed to run here: {type(exc).__name__}: {exc}"[:300]}
    sys.stdout.write("\n" + json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
