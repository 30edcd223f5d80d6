"""Group 7, stale epoch: every mutating operation made with a lease another owner has since replaced.

On the JSON-file and SQLite stores, each operation (a state write, a ledger write, renew, release,
an approval consumed, a cancellation acknowledged, a repairing load) under the old epoch after the
new owner wrote must raise ``FencedError`` and change nothing stored. Then a real runner process
is frozen (SIGSTOP) inside an apply (the durable face: inside a call) past its lease, taken over,
and thawed: it must stop ``lease-lost`` without changing a byte.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import time
from typing import Any, Callable

from ...approval import ApprovalRequest
from ...cancellation import Cancellation
from ...envelope import RunState
from ...errors import FencedError
from ...outcome import Evidence, Status
from ...stores.jsonfile import INDEX_FILE, JsonFileStore
from ...stores.sqlite import SqliteStore
from ..store_contract import sample_state
from .checks import check_final
from .children import Workdir, child_command, child_env
from .results import GroupResult, merge
from .store_history import TASK

__all__ = ["run"]


def _tree_bytes(root: str) -> dict[str, bytes]:
    """Every file under ``root``, byte for byte; the JSON-file store's summary index (an SQLite
    database whose write-ahead log SQLite folds into the file when its last connection closes) by
    its rows, read from a copy so that reading it changes nothing."""
    out = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, root)
            if directory == root and name.startswith(INDEX_FILE):
                continue
            with open(path, "rb") as handle:
                out[relative] = handle.read()
    if os.path.exists(os.path.join(root, INDEX_FILE)):
        with tempfile.TemporaryDirectory() as copy:
            for suffix in ("", "-wal"):
                if os.path.exists(os.path.join(root, INDEX_FILE + suffix)):
                    shutil.copyfile(os.path.join(root, INDEX_FILE + suffix), os.path.join(copy, INDEX_FILE + suffix))
            out[INDEX_FILE] = _sqlite_dump(os.path.join(copy, INDEX_FILE)).encode()
    return out


def _sqlite_dump(path: str) -> str:
    connection = sqlite3.connect(path)
    try:
        return "\n".join(connection.iterdump())
    finally:
        connection.close()


_STALE_OPERATIONS: dict[str, Callable[[Any, Any, RunState], Any]] = {}


def _stale(name: str) -> Callable[[Callable[[Any, Any, RunState], Any]], Callable[[Any, Any, RunState], Any]]:
    def register(function: Callable[[Any, Any, RunState], Any]) -> Callable[[Any, Any, RunState], Any]:
        _STALE_OPERATIONS[name] = function
        return function

    return register


@_stale("state write")
def _stale_state_write(store: Any, lease: Any, state: RunState) -> None:
    state.next_action = "a stale write"
    store.commit(lease, state, set())


@_stale("ledger write")
def _stale_ledger_write(store: Any, lease: Any, state: RunState) -> None:
    step_id = sorted(state.effects)[0]
    state.effects[step_id] = dataclasses.replace(state.effects[step_id], evidence="a stale observation")
    store.commit(lease, state, {step_id})


@_stale("lease renew")
def _stale_renew(store: Any, lease: Any, state: RunState) -> None:
    store.renew_lease(lease, 10.0, 1_700_000_030.0)


@_stale("lease release")
def _stale_release(store: Any, lease: Any, state: RunState) -> None:
    store.release_lease(lease, 1_700_000_030.0)


@_stale("approval consume")
def _stale_approval(store: Any, lease: Any, state: RunState) -> None:
    request = ApprovalRequest(TASK, state.plan_digest, "step-001", "sha256:" + "3" * 64, "write", 1.0, 2e9)
    state.approval_requests.pop(request.step_id, None)
    state.consumed_approvals.append("stale-approval")
    store.commit(lease, state, set())


@_stale("cancel acknowledge")
def _stale_cancel(store: Any, lease: Any, state: RunState) -> None:
    record = Cancellation(task_id=TASK, requested_by="operator", reason="stop", requested_at=1.0)
    state.note_control(Evidence("control", f"cancellation record {record.requested_by}", 2.0))
    state.status = Status.CANCELLED
    state.next_action = "nothing: cancelled"
    store.commit(lease, state, set())


@_stale("state repair (load under the lease)")
def _stale_repair(store: Any, lease: Any, state: RunState) -> None:
    store.load(TASK, lease=lease)


def run(base: str, *, full: bool, face: str = "runner") -> GroupResult:
    """Every mutating operation with an expired epoch after another owner took the next one and wrote.

    The store operations are the same under either face; under the durable face only the real
    process is run: frozen inside a call, and (full counts) inside an apply."""
    result = GroupResult(7, "stale epoch", face)
    if face == "durable":
        if full:
            merge(result, _stale_with_sigstop(base, face, "apply"))
        merge(result, _stale_with_sigstop(base, face, "call"))
        return result
    kinds: dict[str, tuple[Callable[[str], Any], Callable[[str], Any]]] = {
        "json": (lambda where: JsonFileStore(os.path.join(where, "root"), create=True), lambda where: _tree_bytes(os.path.join(where, "root"))),
        "sqlite": (lambda where: SqliteStore(os.path.join(where, "db.sqlite"), create=True), lambda where: _sqlite_dump(os.path.join(where, "db.sqlite"))),
    }
    for kind, (make, snapshot) in kinds.items():
        for name, operation in _STALE_OPERATIONS.items():
            where = os.path.join(base, f"{kind}-{len(os.listdir(base))}")
            os.makedirs(where)
            first = make(where)
            t0 = 1_700_000_000.0
            old = first.acquire_lease(TASK, "first", 10.0, t0)
            first.load(TASK, lease=old)
            state = sample_state(TASK, effects=4)
            state.revision = 0
            first.commit(old, state, None)
            second = make(where)
            new = second.acquire_lease(TASK, "second", 10.0, t0 + 11.0)  # the first lease expired on the fake clock
            taken = second.load(TASK, lease=new).state
            taken.next_action = "written by the new owner"
            second.commit(new, taken, set())
            before = snapshot(where)
            result.cases += 1
            result.faults += 1
            try:
                operation(first, old, state)
            except FencedError:
                pass
            except Exception as exc:  # noqa: BLE001
                result.fail(f"{kind}, {name} at epoch {old.epoch}: {type(exc).__name__} instead of FencedError: {exc}")
            else:
                result.fail(f"{kind}, {name} at epoch {old.epoch} after epoch {new.epoch} wrote: accepted")
            if snapshot(where) != before:
                result.lost += 1
                result.fail(f"{kind}, {name}: the refused operation changed what is stored")
            for store in (first, second):
                close = getattr(store, "close", None)
                if callable(close):
                    close()
    merge(result, _stale_with_sigstop(base, face, "apply"))
    return result


def _stale_with_sigstop(base: str, face: str, inside: str) -> GroupResult:
    """A real runner process frozen (SIGSTOP) inside an apply (or a call) past its 1 s lease, taken over, thawed."""
    result = GroupResult(7, "")
    work = Workdir(base, f"sigstop-{inside}")
    signal_path = os.path.join(work.dir, f"in-{inside}.txt")
    steps = 6
    options = ["--face", face, "--steps", str(steps), "--ttl", "1", "--offset", "0"]
    slow = ["--slow", "0.3", "--signal", signal_path] if inside == "apply" else ["--slow-call", "0.3", "--call-signal", signal_path]
    stale = subprocess.Popen(
        [*child_command(work.root, work.outbox, *options), *slow],
        env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(signal_path) and stale.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(stale.pid, signal.SIGSTOP)
        result.cases += 1
        result.faults += 1
        time.sleep(1.5)  # real time past the frozen owner's 1 s lease, on the machine's monotonic clock
        taker = subprocess.run(child_command(work.root, work.outbox, *options), env=child_env(), capture_output=True, text=True, timeout=120)
        outcome = json.loads(taker.stdout.strip().splitlines()[-1]) if taker.stdout.strip() else None
        if outcome is None or outcome["status"] != "done":
            result.fail(f"sigstop in {inside}: the taker did not finish: {outcome} {taker.stderr[-300:]}")
        before = _tree_bytes(work.root)
    finally:
        os.kill(stale.pid, signal.SIGCONT)
    out, err = stale.communicate(timeout=120)
    status = json.loads(out.strip().splitlines()[-1])["status"] if out.strip() else f"exit {stale.returncode}"
    if status != "lease-lost":
        result.fail(f"sigstop in {inside}: the thawed owner ended {status}, not lease-lost: {err[-300:]}")
    if _tree_bytes(work.root) != before:
        result.lost += 1
        result.fail(f"sigstop in {inside}: the thawed owner changed the stored bytes after the takeover")
    # Every effect once, the task done; under the durable face the frozen owner's call (or the one
    # before its apply) may run again under the taker: one interruption.
    check_final(result, work, "fault-task", steps, f"sigstop in {inside}", verified_before={}, face=face, interruptions=1,
                 outcome=outcome)  # fmt: skip
    return result
