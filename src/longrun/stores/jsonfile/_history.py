"""The recent timeline of a task, read from the JSON-file store's journals (read-only)."""

from __future__ import annotations

from ...errors import CorruptStateError
from .. import _journal as journal
from ._layout import TaskFiles
from ._reading import read_journal

__all__ = ["history"]


def history(files: TaskFiles, task_id: str) -> list[dict[str, object]]:
    """The commits the journals still hold, oldest first (see ``JsonFileStore.history``); the
    caller holds the task's lock."""
    entries: dict[int, dict[str, object]] = {}
    for base, name in sorted(files.journals(task_id).items()):
        found = read_journal(files, task_id, name, base)
        if found is None:
            continue
        for body in found.found.bodies:
            try:
                entry = journal.describe_record(body)
            except CorruptStateError:
                break
            entries[entry["revision"]] = entry
    timeline = [entries[revision] for revision in sorted(entries)]
    last_at = None
    for entry in timeline:  # a commit names updated_at only when it changed: carry it forward
        if entry["at"] is None:
            entry["at"] = last_at
        last_at = entry["at"]
    return timeline
