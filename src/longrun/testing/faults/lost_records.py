"""Group 10, damaged blobs and lost records: what a durable function recorded must never change.

A durable task records a model's answer of 64 KiB or more (kept as a blob), a small call and a
person's answer (``run.ask``), makes one effect with them and finishes. Each call returns a new
value on every invocation (it counts its invocations in a file), so a call made again shows as a
changed answer. Then, one case at a time on a copy of the finished task: its blob file gets a bit
flipped, is cut short or deleted; a bit is flipped in each journal line; the snapshot is damaged;
on SQLite the blob row is damaged or deleted and each effect row deleted. A fresh process's
``run()`` (here a fresh store object, in process) must end ``done`` with the same answer and
without calling anything again, or stop ``state-unrecoverable`` (and keep stopping, committing
nothing) when ``longrun verify`` also finds the state damaged; a file whose first line now reads as
another schema version is refused by ``run()`` with that typed error, before anything runs. A declared plan with a large
payload, its blob damaged the same ways, must end ``done`` with its effect applied once, its
damaged blob quarantined and written afresh, so that the next run loads cleanly and commits only a
few revisions more.

Counted: ``changed`` (a recorded call or answer that a run returns differently, or a call made
again), ``duplicates`` (an effect applied twice), ``lost`` (a verified effect that a finished
task no longer records), ``resets`` (a task that started afresh).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sqlite3
import time
from functools import partial
from typing import Any, Callable

from ...approval import Approval
from ...cli import main as cli_main
from ...contract import RunContract, Step
from ...errors import CorruptStateError
from ...functions import DurableFunction, Run, durable
from ...outcome import Status
from ...protocols import Store
from ...runner import Runner
from ...stores.jsonfile import JsonFileStore
from ...stores.sqlite import SqliteStore
from .. import OutboxAdapter, read_outbox
from .results import GroupResult
from .store_history import copy_tree, scratch_base

__all__ = ["run"]

TASK = "answered"
PLAN_TASK = "planned"
PADDING = "d" * (70 * 1024)
"""Makes the draft a blob (at least ``stores.blobs.BLOB_MIN_BYTES``)."""
STORES = ("json", "sqlite")


def _invocation(log: str, name: str) -> int:
    """Log one invocation of call ``name`` and return how many there have been."""
    with open(log, "a") as handle:
        handle.write(name + "\n")
    with open(log) as handle:
        return handle.read().split("\n").count(name)


def draft(log: str) -> dict[str, Any]:
    """A model's long answer: another one on every invocation."""
    return {"draft": f"draft-{_invocation(log, 'draft')}", "padding": PADDING}


def pick(log: str) -> str:
    """A small model answer: another one on every invocation."""
    return f"pick-{_invocation(log, 'pick')}"


def answered(run: Run, log: str) -> dict[str, Any]:
    """The task: two recorded calls, a person's answer, one effect carrying all three."""
    long_answer = run.call("draft", draft, log)
    short_answer = run.call("pick", pick, log)
    who = run.ask("who", "whom does the draft go to?")
    run.effect("send", "write", {"draft": long_answer["draft"], "pick": short_answer, "to": who})
    return {"draft": long_answer["draft"], "pick": short_answer, "to": who}


class _Case:
    """One store kind's finished tasks, kept as a reference and copied back for each damage."""

    def __init__(self, base: str, kind: str):
        self.kind = kind
        self.work = os.path.join(base, f"{kind}-case")
        self.reference = os.path.join(base, f"{kind}-reference")
        self.log = os.path.join(self.work, "calls.log")
        self.outbox = os.path.join(self.work, "outbox.jsonl")

    def store(self) -> Any:
        if self.kind == "json":
            return JsonFileStore(os.path.join(self.work, "store"), create=True)
        return SqliteStore(os.path.join(self.work, "store.sqlite"), create=True)

    def function(self, store: Store) -> DurableFunction[dict[str, Any]]:
        contract = RunContract(TASK, "a task whose answers must never change")
        return durable(store=store, adapters={"write": OutboxAdapter(self.outbox)}, contract=contract)(answered)

    def runner(self, store: Store) -> Runner:
        steps = [Step("big", "write", {"padding": PADDING}), Step("small", "write", {"n": 1})]
        return Runner(RunContract(PLAN_TASK, "a declared plan with a large payload"), steps, store=store,
                      adapters={"write": OutboxAdapter(self.outbox)})  # fmt: skip

    def build(self) -> dict[str, Any]:
        """Finish both tasks, keep the tree as the reference; the durable task's result."""
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work)
        store = self.store()
        function = self.function(store)
        function.run(TASK, self.log)  # stops awaiting the person's answer
        state = store.load(TASK).state
        request = state.approval_requests["who"]
        now = time.time()
        answer = Approval.for_request(request, approval_id="answer-1", approver="fault-suite", granted_at=now, expires_at=now + 1e9, answer="alice")
        store.write_approval(answer)
        outcome = function.run(TASK, self.log)
        if outcome.status is not Status.DONE:
            raise AssertionError(f"the reference task ended {outcome.status.value}: {outcome.next_action}")
        if self.runner(store).run().status is not Status.DONE:
            raise AssertionError("the reference plan did not finish")
        _close(store)
        copy_tree(self.work, self.reference)
        return dict(outcome.result)  # type: ignore[arg-type]

    def restore(self) -> None:
        copy_tree(self.reference, self.work)


def _close(store: Any) -> None:
    close = getattr(store, "close", None)
    if close is not None:
        close()


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ (1 << (offset % 8))]))


def _cut(path: str, size: int) -> None:
    with open(path, "r+b") as handle:
        handle.truncate(size)


def _json_damages(case: _Case, full: bool) -> list[tuple[str, str, Callable[[], None]]]:
    """(task, label, damage) for the JSON-file store: blobs, journal lines, snapshots."""
    damages: list[tuple[str, str, Callable[[], None]]] = []
    for task in (TASK, PLAN_TASK):
        directory = os.path.join(case.reference, "store", task)
        blobs = os.path.join(directory, "blobs")
        for name in sorted(os.listdir(blobs)):
            path = os.path.join(case.work, "store", task, "blobs", name)
            size = os.path.getsize(os.path.join(blobs, name))
            for offset in range(0, size, max(size // (24 if full else 4), 1)):
                damages.append((task, f"{task} blob {name[:8]}: bit flipped at {offset}", partial(_flip, path, offset)))
            damages.append((task, f"{task} blob {name[:8]}: cut short", partial(_cut, path, size // 2)))
            damages.append((task, f"{task} blob {name[:8]}: deleted", partial(os.unlink, path)))
        for name in sorted(os.listdir(directory)):
            if not name.startswith(("journal.", "state.json")):
                continue
            with open(os.path.join(directory, name), "rb") as handle:
                data = handle.read()
            path = os.path.join(case.work, "store", task, name)
            if name.startswith("journal."):
                content = data.split(b"\0", 1)[0]  # the zero padding ahead of the journal's end holds no line
                start = content.find(b"\n") + 1  # past the meta line
                for index, line in enumerate(content[start:].split(b"\n")[:-1]):  # a bit in the middle of every record line
                    damages.append((task, f"{task} {name} line {index + 1}: bit flipped", partial(_flip, path, start + len(line) // 2)))
                    start += len(line) + 1
            else:
                for offset in range(0, len(data), max(len(data) // (12 if full else 2), 1)):
                    damages.append((task, f"{task} {name}: bit flipped at {offset}", partial(_flip, path, offset)))
    return damages


def _sqlite_damages(case: _Case) -> list[tuple[str, str, Callable[[], None]]]:
    """(task, label, damage) for the SQLite store: the blob row, and each effect row deleted."""
    database = os.path.join(case.work, "store.sqlite")
    reference = sqlite3.connect(os.path.join(case.reference, "store.sqlite"))
    try:
        digests = [row[0] for row in reference.execute("SELECT digest FROM longrun_blobs WHERE task_id = ?", (TASK,))]
        steps = [row[0] for row in reference.execute("SELECT step_id FROM longrun_effects WHERE task_id = ?", (TASK,))]
    finally:
        reference.close()

    def run_sql(statement: str, params: tuple[Any, ...]) -> None:
        connection = sqlite3.connect(database)
        try:
            if statement.startswith("FLIP"):
                (data,) = connection.execute("SELECT data FROM longrun_blobs WHERE task_id = ? AND digest = ?", params).fetchone()
                flipped = bytearray(data)
                flipped[len(flipped) // 2] ^= 1
                connection.execute("UPDATE longrun_blobs SET data = ? WHERE task_id = ? AND digest = ?", (bytes(flipped), *params))
            else:
                connection.execute(statement, params)
            connection.commit()
        finally:
            connection.close()

    damages: list[tuple[str, str, Callable[[], None]]] = []
    for digest in digests:
        damages.append((TASK, f"blob row {digest[:8]}: bit flipped", partial(run_sql, "FLIP", (TASK, digest))))
        damages.append((TASK, f"blob row {digest[:8]}: deleted",
                        partial(run_sql, "DELETE FROM longrun_blobs WHERE task_id = ? AND digest = ?", (TASK, digest))))  # fmt: skip
    for step in steps:
        damages.append((TASK, f"effect row {step}: deleted",
                        partial(run_sql, "DELETE FROM longrun_effects WHERE task_id = ? AND step_id = ?", (TASK, step))))  # fmt: skip
    return damages


def _calls(log: str) -> int:
    try:
        with open(log) as handle:
            return len(handle.read().split("\n")) - 1
    except FileNotFoundError:
        return 0


def _verify(case: _Case) -> int:
    """``longrun verify`` on the durable task, as an operator runs it: its exit code."""
    spec = os.path.join(case.work, "store") if case.kind == "json" else "sqlite:" + os.path.join(case.work, "store.sqlite")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return cli_main(["verify", spec, TASK, "--json"])


def _committed(store: Any, task: str) -> int:
    lease = store.read_lease(task)
    return lease.committed_revision if lease is not None else 0


def _check_durable(case: _Case, expected: dict[str, Any], result: GroupResult, where: str) -> str:
    """Run the damaged durable task; what it ended as (counted in ``result`` if wrong)."""
    calls_before = _calls(case.log)
    store = case.store()
    try:
        code = _verify(case)
        if code not in (0, 3):
            result.fail(f"{where}: longrun verify exited {code}")
            return "failed"
        function = case.function(store)
        try:
            outcome = function.run(TASK, case.log)
        except CorruptStateError as exc:  # refused before anything ran: a schema it does not know, a foreign file
            if _calls(case.log) != calls_before or code != 3:
                result.fail(f"{where}: run() raised {type(exc).__name__} ({exc}) after calls, or while verify exited {code}")
            return "refused"
        sent = [line for line in read_outbox(case.outbox) if line["task_id"] == TASK]
        if len(sent) > 1:
            result.duplicates += len(sent) - 1
            result.fail(f"{where}: the effect was applied {len(sent)} times")
        if _calls(case.log) != calls_before:
            result.changed += 1
            result.fail(f"{where}: a recorded call was made again ({_calls(case.log) - calls_before} invocations)")
        if outcome.status is Status.DONE:
            if outcome.result != expected:
                result.changed += 1
                result.fail(f"{where}: the task's answer changed: {outcome.result!r}, recorded {expected!r}")
            state = store.load(TASK).state
            if state is None:
                result.resets += 1
                result.fail(f"{where}: no state after a done run")
            elif state.effects.get("send") is None or state.effects["send"].state.value != "verified":
                result.lost += 1
                result.fail(f"{where}: the verified effect is no longer recorded")
            return "done"
        if outcome.status is not Status.STATE_UNRECOVERABLE:
            result.changed += 1  # an answer asked again, a call pending again: the record is gone
            result.fail(f"{where}: ended {outcome.status.value}, neither done with its answer nor state-unrecoverable")
            return "failed"
        if code != 3:
            result.fail(f"{where}: run() stopped state-unrecoverable but verify exited {int(code)}")
        committed = _committed(store, TASK)
        again = function.run(TASK, case.log)
        if again.status is not Status.STATE_UNRECOVERABLE or _committed(store, TASK) != committed:
            result.fail(f"{where}: a second run ended {again.status.value}, revision {committed} -> {_committed(store, TASK)}")
        return "stopped"
    finally:
        _close(store)


def _check_plan(case: _Case, result: GroupResult, where: str) -> str:
    """Run the damaged declared plan; what it ended as (counted in ``result`` if wrong)."""
    store = case.store()
    try:
        outcome = case.runner(store).run()
        sent = [line for line in read_outbox(case.outbox) if line["task_id"] == PLAN_TASK]
        if len(sent) != 2:
            result.duplicates += max(len(sent) - 2, 0)
            result.fail(f"{where}: the plan's 2 effects were applied {len(sent)} times")
        if outcome.status is Status.DONE:
            before = _committed(store, PLAN_TASK)
            loaded = store.load(PLAN_TASK)
            if loaded.source != "primary":
                result.fail(f"{where}: the damage was found again after a rebuild (the damaged blob was kept)")
            if case.runner(store).run().status is not Status.DONE or _committed(store, PLAN_TASK) - before > 5:
                result.fail(f"{where}: a run of the done plan took the revision from {before} to {_committed(store, PLAN_TASK)}")
            return "plan done"
        if outcome.status is not Status.STATE_UNRECOVERABLE:
            result.fail(f"{where}: the plan ended {outcome.status.value}")
            return "failed"
        return "plan stopped"
    finally:
        _close(store)


def run(base: str, *, full: bool) -> GroupResult:
    """Damage a finished durable task's blobs and records (and a declared plan's blob) case by case."""
    result = GroupResult(10, "damaged blobs and lost records")
    scratch = scratch_base(base)
    ends: dict[str, int] = {}
    try:
        for kind in STORES:
            case = _Case(scratch, kind)
            expected = case.build()
            damages = _json_damages(case, full) if kind == "json" else _sqlite_damages(case)
            for task, label, damage in damages:
                where = f"{kind}: {label}"
                result.cases += 1
                result.faults += 1
                case.restore()
                damage()
                try:
                    end = _check_durable(case, expected, result, where) if task == TASK else _check_plan(case, result, where)
                except Exception as exc:  # noqa: BLE001 - anything leaking is the finding
                    result.fail(f"{where}: {type(exc).__name__} leaked: {exc}")
                    end = "failed"
                ends[f"{kind} {end}"] = ends.get(f"{kind} {end}", 0) + 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result.notes.append(
        "cases by how they ended (done: the recorded answers, nothing called again; stopped: state-unrecoverable, "
        f"verify agreeing, nothing committed): {dict(sorted(ends.items()))}"
    )
    return result
