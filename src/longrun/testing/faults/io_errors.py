"""Group 5, I/O errors: the N-th I/O call fails (N = 1, 2, ...) until the operation completes.

With ENOSPC, EIO and EACCES, once or from then on (``FaultyIO``), over a sequence of lease
acquisition, load, six commits, renewal and release. Each failure must surface as a
``StorageError`` caused by the ``OSError``; a store whose write failed must refuse the next commit
until it reloads, and never flush again a file whose flush failed; a fresh store must then read the
state before or after the operation that failed.
"""

from __future__ import annotations

import errno as errno_module
import os
import random
import shutil
from typing import Any

from ...errors import StorageError
from ...lease import Lease
from ...stores.jsonfile import JsonFileStore
from .. import FaultyIO
from .results import GroupResult
from .store_history import TASK, build_history, compact_early, content, copy_tree, evolve, scratch_base

__all__ = ["run"]


def _cause_chain(exc: BaseException) -> list[BaseException]:
    chain, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        chain.append(exc)
        exc = exc.__cause__  # type: ignore[assignment]
    return chain


def run(base: str, *, full: bool) -> GroupResult:
    """Fail the N-th I/O call (N = 1, 2, ...) with ENOSPC, EIO and EACCES, once or from then on."""
    result = GroupResult(5, "I/O errors")
    template = os.path.join(base, "template")
    committed, _ = build_history(template, commits=4)
    scratch = scratch_base(base)
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
                    copy_tree(template, work)
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
    with compact_early():
        try:
            failed_at = "acquire"
            lease = store.acquire_lease(TASK, "next", 3600.0, 1_800_000_000.0)
            failed_at = "load"
            state = store.load(TASK, lease=lease).state
            assert state is not None, "the task committed above did not load"
            state_box["state"] = state
            for number in range(6):
                changed = evolve(state, 100 + number, rng)
                failed_at = f"commit {number}"
                allowed = {before}
                state.lease_epoch, state.lease_owner, state.lease_expires_at = lease.epoch, lease.owner, lease.expires_at
                after = content(state.to_json())
                allowed.add(after)
                store.commit(lease, state, changed)
                before = content(state.to_json())
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
    seen = content(loaded.state.to_json())
    if seen not in allowed:
        result.lost += 1
        return bool(io.injected), problem or f"after the fault at {failed_at}, a fresh store reads neither the before- nor the after-state"
    return bool(io.injected), problem
