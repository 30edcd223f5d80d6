"""Groups 3 to 8 of the fault-injection suite (see ``longrun.testing.faults`` for the whole)."""

from __future__ import annotations

import contextlib
import dataclasses
import errno as errno_module
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Generator

from ..approval import ApprovalRequest
from ..cancellation import Cancellation
from ..envelope import RunState
from ..errors import CorruptStateError, FencedError, LeaseHeldError, StorageError, UnknownTaskError
from ..functions import FUNCTION_STEP
from ..lease import Lease
from ..ledger import EffectState
from ..outcome import Evidence, Status
from ..protocols import LoadResult
from ._fixtures import copy_keeping_links
from ..stores import jsonfile
from ..stores.jsonfile import JsonFileStore
from ._powerloss import RecordingIO, crash_states, materialize
from .faults import (
    GroupResult,
    _check_final,
    _child_command,
    _child_env,
    _merge,
    _outbox_counts,
    _Workdir,
    call_counts,
    call_log_of,
    check_calls,
    durable_arguments,
    durable_task,
    function_result,
)
from .store_contract import sample_state

TASK = "t"


@contextlib.contextmanager
def _compact_early() -> Generator[None, None, None]:
    """Compaction within a handful of commits, so every write protocol runs in a short history."""
    original = jsonfile.COMPACT_MIN_BYTES
    jsonfile.COMPACT_MIN_BYTES = 0
    try:
        yield
    finally:
        jsonfile.COMPACT_MIN_BYTES = original


def _evolve(state: RunState, step: int, rng: random.Random) -> set[str]:
    """Change a state the way a runner does (an effect moves, a list grows...); return the changed step ids."""
    state.updated_at = 1_700_001_000.0 + step
    state.next_action = f"action {step}"
    changed = set()
    step_id = rng.choice(sorted(state.effects))
    record = state.effects[step_id]
    state.effects[step_id] = dataclasses.replace(
        record, attempts=record.attempts + 1, state=rng.choice(list(EffectState)), evidence=f"seen {step}", updated_at=2e9 + step
    )
    changed.add(step_id)
    if step % 4 == 0:
        state.note_control(Evidence("control", f"approval record {step}", float(step)))
    if step % 5 == 0:
        state.consumed_approvals.append(f"ap-{step}")
    if step % 3 == 0:
        state.budget = dataclasses.replace(state.budget, attempts_total=state.budget.attempts_total + 1)
    return changed


def _content(document: dict[str, Any]) -> str:
    document = dict(document)
    document.pop("revision", None)
    document.pop("reconcile_all", None)
    return json.dumps(document, sort_keys=True)


def _scratch_base(base: str) -> str:
    """A directory for the many small crash states: in memory (``/dev/shm``) where there is one."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return tempfile.mkdtemp(prefix="longrun-faults-", dir="/dev/shm")
    return tempfile.mkdtemp(prefix="scratch-", dir=base)


# -- group 3: power loss ---------------------------------------------------------------------------

COMMITS = 20


def _record_history(root: str) -> tuple[RecordingIO, dict[int, str]]:
    """A 20-commit history with compactions and lease writes, recorded; returns the trace and the
    content committed at each revision."""
    io = RecordingIO()
    committed: dict[int, str] = {}
    with _compact_early():
        store = JsonFileStore(root, io=io, create=True)
        lease = store.acquire_lease(TASK, "holder", 3600.0, 1_700_000_000.0)
        store.load(TASK, lease=lease)
        state = sample_state(TASK, effects=6)
        state.revision = 0
        rng = random.Random(3)
        for number in range(1, COMMITS + 1):
            changed = _evolve(state, number, rng) if number > 1 else set(state.effects)
            before = committed.get(number - 1)
            io.mark("begin", number, before)
            store.commit(lease, state, changed)
            committed[state.revision] = _content(state.to_json())
            io.mark("end", number, committed[state.revision])
            if number % 7 == 0:
                lease = store.renew_lease(lease, 3600.0, 1_700_000_000.0 + number)
        store.release_lease(lease, 1_700_000_100.0)
        store.close()
    return io, committed


def _check_power_loss(
    ops: list[tuple[Any, ...]], source_root: str, scratch: str, *, ignore: frozenset[str] = frozenset(), stop_at_first: bool = False
) -> tuple[int, list[str], dict[str, int]]:
    """Every crash state of every prefix: the load must give the before- or the after-state of the
    commit in flight, whole, and a crash that garbled nothing must not look like damage."""
    cases, problems = 0, []
    figures = {"resets": 0, "lost": 0}
    in_flight: tuple[str | None, str] | None = None
    durable: str | None = None
    for prefix in range(len(ops) + 1):
        if prefix and ops[prefix - 1][0] == "mark":
            mark = ops[prefix - 1]
            if mark[1] == "begin":
                in_flight = (mark[3], "")
            else:
                durable, in_flight = mark[3], None
            continue
        allowed = {durable} if in_flight is None else {in_flight[0]}
        if in_flight is not None:
            # the after-state is the content the "end" mark will name
            after = next(op[3] for op in ops[prefix:] if op[0] == "mark" and op[1] == "end")
            allowed.add(after)
        for label, names, contents in crash_states(ops, prefix, ignore_sites=ignore):
            cases += 1
            target = os.path.join(scratch, f"crash-{cases % 2}")
            shutil.rmtree(target, ignore_errors=True)
            materialize(names, contents, source_root, target)
            where = f"after I/O op {prefix} ({ops[prefix - 1][0] if prefix else 'nothing'}), {label}"
            loaded: LoadResult | None = None
            try:
                loaded = JsonFileStore(target).load(TASK)
            except UnknownTaskError:
                loaded = LoadResult(state=None)  # the task's directory itself was lost
            except CorruptStateError as exc:
                problems.append(f"{where}: the committed state became unreadable: {exc}")
                figures["lost"] += 1
            except Exception as exc:  # noqa: BLE001 - anything else leaking is the finding
                problems.append(f"{where}: {type(exc).__name__} leaked: {exc}")
            if loaded is not None:
                seen = _content(loaded.state.to_json()) if loaded.state is not None else None
                if seen not in allowed:
                    if seen is None:
                        figures["resets"] += 1
                    else:
                        figures["lost"] += 1
                    problems.append(f"{where}: loaded {'no state' if seen is None else 'a state'} that is neither before nor after the commit in flight")
                elif loaded.state is not None and (loaded.source != "primary" or loaded.state.reconcile_all) and not label.startswith("garbled"):
                    problems.append(f"{where}: a power loss that garbled nothing was taken for damage: {[item.detail for item in loaded.observations][:3]}")
            if problems and stop_at_first:
                return cases, problems, figures
    return cases, problems, figures


def group3(base: str, *, full: bool) -> GroupResult:
    """Power loss: every prefix of a recorded 20-commit history, unsynced writes written, dropped,
    torn or garbled, unsynced names kept or lost; then the mutation check."""
    result = GroupResult(3, "power loss (model)")
    source_root = os.path.join(base, "recorded")
    io, _ = _record_history(source_root)
    scratch = _scratch_base(base)
    try:
        cases, problems, figures = _check_power_loss(io.ops, source_root, scratch)
        result.cases += cases
        result.faults += cases
        result.resets += figures["resets"]
        result.lost += figures["lost"]
        for problem in problems:
            result.fail(problem)
        sites = sorted({op[2] for op in io.ops if op[0] in ("sync", "dirsync")})
        result.notes.append(f"{len(io.ops)} I/O operations recorded, {len(sites)} flush sites: {', '.join(sites)}")
        # The mutation check: without any one flush of the protocol, some crash state must break.
        for site in sites:
            mutated_cases, mutated_problems, _ = _check_power_loss(io.ops, source_root, scratch, ignore=frozenset({site}), stop_at_first=True)
            result.cases += mutated_cases
            if not mutated_problems:
                result.fail(f"mutation check: removing the flush at {site} breaks nothing the test checks")
            else:
                result.notes.append(f"without the flush at {site}: {mutated_problems[0]}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return result


# -- group 4: truncation and bit flips --------------------------------------------------------------


def _build_history(root: str, commits: int = 17) -> tuple[dict[int, str], str]:
    committed: dict[int, str] = {}
    with _compact_early():
        store = JsonFileStore(root, create=True)
        lease = store.acquire_lease(TASK, "holder", 3600.0, 1_700_000_000.0)
        store.load(TASK, lease=lease)
        state = sample_state(TASK, effects=6)
        state.revision = 0
        rng = random.Random(4)
        for number in range(1, commits + 1):
            changed = _evolve(state, number, rng) if number > 1 else set(state.effects)
            store.commit(lease, state, changed)
            committed[state.revision] = _content(state.to_json())
        store.renew_lease(lease, 3600.0, 1_700_000_010.0)
        store.close()
    return committed, committed[max(committed)]


def _copy_tree(source: str, target: str) -> None:
    shutil.rmtree(target, ignore_errors=True)
    copy_keeping_links(source, target)


def group4(base: str, *, full: bool) -> GroupResult:
    """Truncate every file of a task at every byte offset and flip one bit in every byte."""
    result = GroupResult(4, "truncation and bit flips")
    root = os.path.join(base, "history")
    committed, latest = _build_history(root)
    task_dir = os.path.join(root, TASK)
    names = sorted(name for name in os.listdir(task_dir) if name.startswith(("state.json", "journal.", "lease.json")))
    original_lease = JsonFileStore(root).read_lease(TASK)
    scratch = _scratch_base(base)
    older = 0
    try:
        target = os.path.join(scratch, "damaged")
        _copy_tree(root, target)
        for name in names:
            path = os.path.join(target, TASK, name)
            with open(path, "rb") as handle:
                data = handle.read()
            end = data.find(b"\0") if name.startswith("journal.") else -1
            limit = len(data) if end < 0 else min(len(data), end + 64)  # zeros beyond: the same case again and again
            stride = 1 if full else 5
            damages: list[tuple[str, bytes]] = [(f"cut at {offset}", data[:offset]) for offset in range(0, limit, stride)]
            damages += [(f"cut at {len(data) - 1}", data[:-1])]
            for offset in range(0, limit, stride):
                flipped = bytearray(data)
                flipped[offset] ^= 1 << (offset % 8)
                damages.append((f"bit {offset % 8} of byte {offset} flipped", bytes(flipped)))
            for label, damaged in damages:
                result.cases += 1
                result.faults += 1
                with open(path, "wb") as handle:
                    handle.write(damaged)
                where = f"{name}: {label}"
                if name == jsonfile.LEASE:
                    try:
                        lease = JsonFileStore(target).read_lease(TASK)
                    except CorruptStateError:
                        continue
                    except Exception as exc:  # noqa: BLE001
                        result.fail(f"{where}: {type(exc).__name__} leaked: {exc}")
                        continue
                    if lease != original_lease:
                        result.resets += 1
                        result.fail(f"{where}: read as a different lease (epoch {lease and lease.epoch}), not refused")
                    continue
                try:
                    loaded = JsonFileStore(target).load(TASK)
                except CorruptStateError:
                    continue
                except Exception as exc:  # noqa: BLE001
                    result.fail(f"{where}: {type(exc).__name__} leaked: {exc}")
                    continue
                if loaded.state is None:
                    result.resets += 1
                    result.fail(f"{where}: a silent reset to no state")
                    continue
                seen = _content(loaded.state.to_json())
                flagged = loaded.source != "primary" or loaded.state.reconcile_all
                if seen == latest:
                    continue
                if seen not in committed.values():
                    result.lost += 1
                    result.fail(f"{where}: loaded a state that was never committed")
                elif not flagged:
                    if name.startswith("journal.") and label.startswith("cut"):
                        older += 1  # a cut journal looks like a crash mid-append: its last whole record wins (documented)
                    else:
                        result.lost += 1
                        result.fail(f"{where}: an older version was loaded and the damage went unnoticed")
            with open(path, "wb") as handle:
                handle.write(data)
        if older:
            result.notes.append(
                f"{older} cuts of the journal loaded the last committed version it still held, unflagged: a journal cut "
                "short looks like a crash in the middle of an append (a write-ahead log cannot tell them apart)"
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return result


# -- group 5: I/O errors ---------------------------------------------------------------------------


def _cause_chain(exc: BaseException) -> list[BaseException]:
    chain, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        chain.append(exc)
        exc = exc.__cause__  # type: ignore[assignment]
    return chain


def group5(base: str, *, full: bool) -> GroupResult:
    """Fail the N-th I/O call (N = 1, 2, ...) with ENOSPC, EIO and EACCES, once or from then on."""
    from .faults import FaultyIO

    result = GroupResult(5, "I/O errors")
    template = os.path.join(base, "template")
    committed, _ = _build_history(template, commits=4)
    scratch = _scratch_base(base)
    errors = (errno_module.ENOSPC, errno_module.EIO, errno_module.EACCES)
    try:
        for error in errors:
            for persistent in (False, True):
                mode = f"{errno_module.errorcode[error]} {'persistent' if persistent else 'transient'}"
                n = 0
                while True:
                    n += 1
                    if n > 2000:
                        result.fail(f"{mode}: the operation never completed")
                        break
                    work = os.path.join(scratch, "work")
                    _copy_tree(template, work)
                    io = FaultyIO(n, error, persistent=persistent)
                    hit, problem = _io_case(work, io, committed, result)
                    result.cases += 1
                    if problem:
                        result.fail(f"{mode}, fault at I/O call {n}: {problem}")
                    if not hit:
                        break
                    result.faults += 1
                result.notes.append(f"{mode}: operation completed after {n - 1} failing positions")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return result


_WRITES = frozenset(("write", "pwrite", "fsync", "fdatasync", "truncate", "replace", "link", "unlink", "fsync_dir", "mkdir"))


def _io_case(work: str, io: Any, committed: dict[int, str], result: GroupResult) -> tuple[bool, str]:
    """One run of the operation sequence with ``io``; returns (fault hit, problem or "")."""
    store = JsonFileStore(work, io=io, create=True)
    state_box: dict[str, Any] = {}
    before = committed[max(committed)]
    allowed = {before}
    failed_at = ""
    error: BaseException | None = None
    lease: Lease | None = None
    rng = random.Random(5)
    expected = dict(committed)
    with _compact_early():
        try:
            failed_at = "acquire"
            lease = store.acquire_lease(TASK, "next", 3600.0, 1_800_000_000.0)
            failed_at = "load"
            state = store.load(TASK, lease=lease).state
            assert state is not None, "the task committed above did not load"
            state_box["state"] = state
            for number in range(6):
                changed = _evolve(state, 100 + number, rng)
                failed_at = f"commit {number}"
                allowed = {before}
                state.lease_epoch, state.lease_owner, state.lease_expires_at = lease.epoch, lease.owner, lease.expires_at
                after = _content(state.to_json())
                allowed.add(after)
                store.commit(lease, state, changed)
                before = _content(state.to_json())
            failed_at = "renew"
            allowed = {before}
            lease = store.renew_lease(lease, 3600.0, 1_800_000_001.0)
            failed_at = "release"
            store.release_lease(lease, 1_800_000_002.0)
            failed_at = ""
        except Exception as exc:  # noqa: BLE001 - classified below
            error = exc
    del expected
    problem = ""
    if error is not None:
        chain = _cause_chain(error)
        if not io.injected:
            problem = f"{failed_at} failed without a fault: {type(error).__name__}: {error}"
        elif not isinstance(error, StorageError) or not any(
            isinstance(item, OSError) and not isinstance(item, StorageError) for item in chain
        ):
            problem = f"{failed_at} raised {type(error).__name__} ({error}), not a StorageError caused by the OSError"
        elif failed_at.startswith("commit") and lease is not None and "state" in state_box and io.injected_operations[-1] in _WRITES:
            # SQLite's pager rule: after a failed write, no more writes until a reload.
            io.fail_at = 0
            syncs_before = len(io.synced_after_failure)
            try:
                store.commit(lease, state_box["state"], set())
                problem = f"{failed_at} failed, yet the next commit on the same store was accepted without a reload"
            except StorageError:
                pass
            if len(io.synced_after_failure) > syncs_before:
                problem = f"after a failed flush the store flushed {io.synced_after_failure[-1]} again"
    elif io.injected and failed_at == "":
        # A fault absorbed after the commit was durable (a compaction or an old journal's removal).
        allowed = {before}
    if io.synced_after_failure and not problem:
        problem = f"a file whose flush failed was flushed again and reported durable: {io.synced_after_failure[0]}"
    store.close()
    try:
        loaded = JsonFileStore(work).load(TASK)
    except Exception as exc:  # noqa: BLE001
        return bool(io.injected), problem or f"after the fault at {failed_at}, a fresh store cannot load: {type(exc).__name__}: {exc}"
    if loaded.state is None:
        result.resets += 1
        return bool(io.injected), f"after the fault at {failed_at}, a fresh store finds no state"
    seen = _content(loaded.state.to_json())
    if seen not in allowed:
        result.lost += 1
        return bool(io.injected), problem or f"after the fault at {failed_at}, a fresh store reads neither the before- nor the after-state"
    return bool(io.injected), problem


# -- groups 6, 7, 8 follow -------------------------------------------------------------------------


def _tree_bytes(root: str) -> dict[str, bytes]:
    out = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            with open(path, "rb") as handle:
                out[os.path.relpath(path, root)] = handle.read()
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


def group7(base: str, *, full: bool, face: str = "runner") -> GroupResult:
    """Every mutating operation with an expired epoch after another owner took the next one and wrote.

    The store operations are the same under either face; under the durable face only the real
    process is run: frozen inside a call, and (full counts) inside an apply."""
    from ..stores.sqlite import SqliteStore

    result = GroupResult(7, "stale epoch", face)
    if face == "durable":
        if full:
            _merge(result, _stale_with_sigstop(base, face, "apply"))
        _merge(result, _stale_with_sigstop(base, face, "call"))
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
    _merge(result, _stale_with_sigstop(base, face, "apply"))
    return result


def _stale_with_sigstop(base: str, face: str, inside: str) -> GroupResult:
    """A real runner process frozen (SIGSTOP) inside an apply (or a call) past its 1 s lease, taken over, thawed."""
    result = GroupResult(7, "")
    work = _Workdir(base, f"sigstop-{inside}")
    signal_path = os.path.join(work.dir, f"in-{inside}.txt")
    steps = 6
    options = ["--face", face, "--steps", str(steps), "--ttl", "1", "--offset", "0"]
    slow = ["--slow", "0.3", "--signal", signal_path] if inside == "apply" else ["--slow-call", "0.3", "--call-signal", signal_path]
    stale = subprocess.Popen(
        [*_child_command(work.root, work.outbox, *options), *slow],
        env=_child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(signal_path) and stale.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(stale.pid, signal.SIGSTOP)
        result.cases += 1
        result.faults += 1
        time.sleep(1.5)  # real time past the frozen owner's 1 s lease, on the machine's monotonic clock
        taker = subprocess.run(_child_command(work.root, work.outbox, *options), env=_child_env(), capture_output=True, text=True, timeout=120)
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
    _check_final(result, work, "fault-task", steps, f"sigstop in {inside}", verified_before={}, face=face, interruptions=1,
                 outcome=outcome)  # fmt: skip
    return result


# -- group 8: clock faults -------------------------------------------------------------------------


class _Timeline:
    """A shared fake monotonic timeline (what CLOCK_MONOTONIC is to the processes of one boot)."""

    def __init__(self, name: str):
        self.name = name
        self.value = 0.0


class FaultClock:
    """A wall clock with a fault (``jump+``, ``jump-``, ``frozen``, ``half``, ``double``, ``honest``)
    over an honest monotonic timeline."""

    def __init__(self, timeline: _Timeline, fault: str, start: float = 1_700_000_000.0):
        self.timeline, self.fault, self.start = timeline, fault, start

    def now(self) -> float:
        elapsed = self.timeline.value
        return self.start + {
            "honest": elapsed, "jump+": elapsed + 3600.0, "jump-": elapsed - 3600.0, "frozen": 0.0,
            "half": 0.5 * elapsed, "double": 2.0 * elapsed,
        }[self.fault]  # fmt: skip

    def monotonic(self) -> float:
        return self.timeline.value

    def monotonic_id(self) -> str:
        return self.timeline.name

    def sleep(self, seconds: float) -> None:
        self.timeline.value += max(0.0, seconds)


class _WallOnly:
    """The same clock without a monotonic timeline: expiry is judged by wall clock."""

    def __init__(self, clock: FaultClock):
        self.clock = clock

    def now(self) -> float:
        return self.clock.now()

    def sleep(self, seconds: float) -> None:
        self.clock.sleep(seconds)


FAULTS = ("jump+", "jump-", "frozen", "half", "double")
TTL = 10.0


def group8(base: str, *, full: bool, face: str = "runner") -> GroupResult:
    """Wall-clock faults on the holder or on the contender: the contender takes over no sooner than
    the TTL after the lease's last renewal on its own monotonic clock, and no stale write lands.

    The lease checks are the store's, the same under either face; under the durable face only the
    task whose clock is an hour ahead is run, as a durable function."""
    result = GroupResult(8, "clock faults", face)
    step = 0.25 if full else 0.5
    if face == "durable":
        _merge(result, _clock_ahead(base, face, step))
        return result
    early_wall = []
    for fault in FAULTS:
        for faulty in ("contender", "holder"):
            where = f"{fault} on the {faulty}"
            timeline = _Timeline(f"fault-suite:{fault}:{faulty}")
            holder_clock = FaultClock(timeline, fault if faulty == "holder" else "honest")
            contender_clock = FaultClock(timeline, fault if faulty == "contender" else "honest")
            root = os.path.join(base, f"clock-{fault}-{faulty}")
            holder = JsonFileStore(root, create=True)
            contender = JsonFileStore(root, create=True)

            def reading(clock: FaultClock) -> tuple[str, float]:
                return (clock.monotonic_id(), clock.monotonic())

            lease = holder.acquire_lease(TASK, "holder", TTL, holder_clock.now(), monotonic=reading(holder_clock))
            holder.load(TASK, lease=lease)
            state = sample_state(TASK, effects=2)
            state.revision = 0
            holder.commit(lease, state, None)
            renewed_at = 0.0
            taken_at = None
            while timeline.value <= 4 * TTL:
                if timeline.value == TTL / 2:
                    lease = holder.renew_lease(lease, TTL, holder_clock.now(), monotonic=reading(holder_clock))
                    renewed_at = timeline.value
                result.cases += 1
                result.faults += fault != "honest"
                try:
                    contender.acquire_lease(TASK, "contender", TTL, contender_clock.now(), monotonic=reading(contender_clock))
                except LeaseHeldError:
                    timeline.value += step
                    continue
                taken_at = timeline.value
                break
            if taken_at is None:
                result.fail(f"{where}: the contender never took over an abandoned lease")
            elif taken_at < renewed_at + TTL:
                result.fail(f"{where}: taken over {taken_at - renewed_at:.2f} s after the last renewal, before the {TTL:.0f} s TTL")
            else:
                result.notes.append(f"{where}: taken over {taken_at - renewed_at:.2f} s after the last renewal")
            # The old holder is fenced, whatever its clock says.
            for name, operation in (("commit", lambda: holder.commit(lease, state, set())),
                                    ("renew", lambda: holder.renew_lease(lease, TTL, holder_clock.now(), monotonic=reading(holder_clock)))):  # fmt: skip
                result.cases += 1
                try:
                    operation()
                    result.fail(f"{where}: the old holder's {name} was accepted after the takeover")
                except FencedError:
                    pass
            # The same contender judging by wall clock alone (the old rule) for contrast.
            wall_root = os.path.join(base, f"wall-{fault}-{faulty}")
            wall_store = JsonFileStore(wall_root, create=True)
            timeline.value = 0.0
            wall_store.acquire_lease(TASK, "holder", TTL, holder_clock.now())
            try:
                wall_store.acquire_lease(TASK, "contender", TTL, _WallOnly(contender_clock).now())
                early_wall.append(where)
            except LeaseHeldError:
                pass
            holder.close()
            contender.close()
    _merge(result, _clock_ahead(base, face, step))
    result.notes.append(
        f"judged by wall clock alone, a contender would have taken a live lease at once in {len(early_wall)} of "
        f"{2 * len(FAULTS)} cases ({', '.join(early_wall)})"
    )
    return result


def _clock_ahead(base: str, face: str, step: float) -> GroupResult:
    """A task whose wall clock jumped an hour ahead returns already-running, then runs once the TTL passed."""
    from ..contract import RunContract, Step
    from ..runner import Runner
    from ._fixtures import OutboxAdapter

    result = GroupResult(8, "")
    timeline = _Timeline(f"fault-suite:{face}")
    root = os.path.join(base, face)
    outbox = os.path.join(base, f"{face}-outbox.jsonl")
    holder = JsonFileStore(root, create=True)
    holder.acquire_lease(TASK, "holder", TTL, FaultClock(timeline, "honest").now(), monotonic=(timeline.name, 0.0))
    options: dict[str, Any] = dict(
        store=JsonFileStore(root, create=True), adapters={"write": OutboxAdapter(outbox)}, clock=FaultClock(timeline, "jump+"), lease_ttl_s=TTL
    )
    if face == "durable":
        function, arguments = durable_task(**options), durable_arguments(1, (), call_log_of(outbox))
        run: Callable[[], Any] = lambda: function.run(TASK, *arguments)  # noqa: E731
    else:
        run = Runner(RunContract(TASK, "clock faults"), [Step("s0", "write", {"n": 0})], **options).run
    for at, expected in ((TTL - step, Status.ALREADY_RUNNING), (TTL, Status.DONE)):
        timeline.value = at
        result.cases += 1
        result.faults += 1
        outcome = run()
        if outcome.status is not expected:
            result.fail(f"{face} with a clock an hour ahead at {at} s into a {TTL:.0f} s lease: {outcome.status.value}, expected {expected.value}")
    if face == "durable":
        if outcome.result != function_result(1) or call_counts(call_log_of(outbox)) != {"call-000": 1}:
            result.fail(f"durable with a clock an hour ahead: result {outcome.result!r}, calls {call_counts(outbox + '.calls')}")
    holder.close()
    return result


# -- group 6: racing runners -----------------------------------------------------------------------


def group6(base: str, *, full: bool, face: str = "runner") -> GroupResult:
    """4 runner processes race for one 50-step task, SIGKILLed and SIGSTOPped (past the lease) at
    random; 3 seeds (the durable face at quick counts: 1)."""
    result = GroupResult(6, "racing runners", face)
    for seed in range(3 if full or face == "runner" else 1):
        _merge(result, _race(base, seed, events=24 if full else 10, face=face))
    return result


def _race(base: str, seed: int, *, events: int, processes: int = 4, steps: int = 50, ttl: float = 1.0, face: str = "runner") -> GroupResult:
    from .faults import SRC, check_race_log

    result = GroupResult(6, "")
    rng = random.Random(seed)
    work = os.path.join(base, f"race-{seed}")
    os.makedirs(work)
    children: list[subprocess.Popen[bytes]] = []
    killed: set[int] = set()
    stopped: dict[int, float] = {}

    def spawn() -> subprocess.Popen[bytes]:
        child = subprocess.Popen(
            [sys.executable, "-m", "longrun.testing.faults", "race", work, "--face", face, "--steps", str(steps), "--ttl", str(ttl),
             "--seed", str(seed)],
            env=_child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=SRC,
        )  # fmt: skip
        children.append(child)
        return child

    live = [spawn() for _ in range(processes)]
    try:
        for _ in range(events):
            time.sleep(rng.uniform(0.1, 0.3))
            for pid, until in list(stopped.items()):
                if time.monotonic() >= until:
                    os.kill(pid, signal.SIGCONT)
                    del stopped[pid]
            running = [child for child in live if child.poll() is None and child.pid not in stopped]
            if not running:
                break
            victim = rng.choice(running)
            result.faults += 1
            if rng.random() < 0.5:
                victim.kill()
                victim.wait()
                killed.add(victim.pid)
                live.remove(victim)
                live.append(spawn())
            else:
                os.kill(victim.pid, signal.SIGSTOP)
                stopped[victim.pid] = time.monotonic() + ttl * rng.uniform(1.2, 1.6)
        while stopped:
            pid, until = min(stopped.items(), key=lambda item: item[1])
            time.sleep(max(0.0, until - time.monotonic()))
            os.kill(pid, signal.SIGCONT)
            del stopped[pid]
        deadline = time.monotonic() + 120
        for child in live:
            child.wait(timeout=max(1.0, deadline - time.monotonic()))
            if child.returncode != 0:
                result.fail(f"seed {seed}: a racer ended with exit code {child.returncode}")
    finally:
        for child in children:
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGCONT)
                child.kill()
                child.wait()
    result.cases += len(children)
    with open(os.path.join(work, "writes.jsonl")) as handle:
        entries = [json.loads(line) for line in handle if line.endswith("\n")]
    problems, writes = check_race_log(entries, killed)
    for problem in problems:
        result.fail(f"seed {seed}: {problem}")
    loaded = JsonFileStore(os.path.join(work, "store")).load("race-task")
    state = loaded.state
    if state is None:
        result.resets += 1
        result.fail(f"seed {seed}: no state")
        return result
    if state.revision != writes:
        result.fail(f"seed {seed}: final revision {state.revision}, {writes} writes were accepted")
    counts = _outbox_counts(os.path.join(work, "outbox.jsonl"))
    result.duplicates += sum(count - 1 for count in counts.values() if count > 1)
    missing = {f"race-task/step-{i:03d}" for i in range(steps)} - set(counts)
    result.lost += len(missing)
    if state.status is not Status.DONE or missing:
        result.fail(f"seed {seed}: ended {state.status.value} with {len(missing)} effects never applied")
    if face == "durable":
        # A call runs again only when its process lost the task before committing its value: each
        # such loss is followed by a new epoch (a kill or a freeze past the lease, or a slow renewal).
        epochs = len({entry["epoch"] for entry in entries if entry["event"] == "lease"})
        runs = call_counts(call_log_of(os.path.join(work, "outbox.jsonl")))
        check_calls(result, runs, state, steps, f"seed {seed}", settled={}, interruptions=max(0, epochs - 1))
        result.notes.append(f"seed {seed}: {sum(runs.values())} call runs for {steps} calls under {epochs} epochs")
        if state.effects.get(FUNCTION_STEP) is None or state.effects[FUNCTION_STEP].result != function_result(steps):
            result.fail(f"seed {seed}: the function's result is not recorded")
    result.notes.append(f"seed {seed}: {len(children)} processes, {len(killed)} SIGKILLed, {writes} revisions, "
                        f"{sum(1 for entry in entries if entry['event'] == 'lease')} lease writes")  # fmt: skip
    return result
