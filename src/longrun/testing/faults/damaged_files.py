"""Group 4, truncation and bit flips: every file of a task cut at every byte and flipped at every bit.

Each damaged state file must be refused (``CorruptStateError``) or recovered (flagged, so the
runner observes every unverified step before applying anything), never silently reset and never
read as a state that was not committed; a damaged lease record must be refused, never read as a
different lease.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Callable

from ...errors import CorruptStateError
from ...stores import jsonfile
from ...stores.jsonfile import JsonFileStore
from .results import GroupResult
from .store_history import TASK, build_history, content, copy_tree, scratch_base

__all__ = ["run"]


def _read_damaged(read: Callable[[], Any], result: GroupResult, where: str) -> tuple[bool, Any]:
    """``(True, what read() returned)``; or ``(False, None)`` if it refused the damage with
    ``CorruptStateError`` (right) or raised anything else (a failure, noted in ``result``)."""
    try:
        return True, read()
    except CorruptStateError:
        return False, None
    except Exception as exc:  # noqa: BLE001 - anything else leaking is the finding
        result.fail(f"{where}: {type(exc).__name__} leaked: {exc}")
        return False, None


def run(base: str, *, full: bool, small: bool = False) -> GroupResult:
    """Truncate every file of a task at every byte offset and flip one bit in every byte (quick
    counts: every 5th byte; ``small``: every 11th, every file still, and its last byte)."""
    result = GroupResult(4, "truncation and bit flips")
    root = os.path.join(base, "history")
    committed, latest = build_history(root)
    task_dir = os.path.join(root, TASK)
    names = sorted(name for name in os.listdir(task_dir) if name.startswith(("state.json", "journal.", "lease.json")))
    original_lease = JsonFileStore(root).read_lease(TASK)
    scratch = scratch_base(base)
    older = 0
    try:
        target = os.path.join(scratch, "damaged")
        copy_tree(root, target)
        for name in names:
            path = os.path.join(target, TASK, name)
            with open(path, "rb") as handle:
                data = handle.read()
            end = data.find(b"\0") if name.startswith("journal.") else -1
            limit = len(data) if end < 0 else min(len(data), end + 64)  # zeros beyond: the same case again and again
            stride = 1 if full else 11 if small else 5
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
                    read, lease = _read_damaged(lambda: JsonFileStore(target).read_lease(TASK), result, where)
                    if read and lease != original_lease:
                        result.resets += 1
                        result.fail(f"{where}: read as a different lease (epoch {lease and lease.epoch}), not refused")
                    continue
                read, loaded = _read_damaged(lambda: JsonFileStore(target).load(TASK), result, where)
                if not read:
                    continue
                if loaded.state is None:
                    result.resets += 1
                    result.fail(f"{where}: a silent reset to no state")
                    continue
                seen = content(loaded.state.to_json())
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
