"""What wakes a worker between two polls of its queue: a control record that arrived, or a row made due.

PostgreSQL notifies (``TaskQueue.listen``). Elsewhere, and for control records that are files on
any store, a ``ControlWatch`` looks at most every ``WATCH_S`` (250 ms), cheaply:

- the queue's change counter (SQLite's ``PRAGMA data_version``, one read of the database header):
  when another connection committed (a trigger made an approved task's row due, ``longrun``
  woke a row), it asks whether a row of the worker's functions is due, and wakes the worker if so;
- the time stamps of each watched control root (``protocols.WatchedSource``: a
  ``FileControlSource``'s root, the JSON-file store's root, behind signature checks or not): one
  ``stat`` of the root per look. longrun's writers touch the root after each record
  (``stores.controlfiles``), so a changed root leads to a sweep: one ``lstat`` of
  ``<root>/<task>/control`` and ``control/approvals`` for each task the queue holds unfinished.
  A task whose directories changed is woken (``TaskQueue.wake``: due now, or again as soon as the
  run under way ends). A sweep also runs every ``sweep_s`` whatever the root says, for a record
  placed by a writer that does not touch the root (by hand, or without the right to).

A directory's times can tick more coarsely than two writes follow each other: while a directory
is younger than ``RECENT_S``, its listing (and the cancellation file's identity) is part of what is
compared, so a second record written within the same tick is not missed.

A task seen for the first time (a new row, or the watch's first sweep) has nothing to compare
with: it is woken if its row is parked and its control directory changed within ``RECENT_S`` of
the previous look, and, at the first sweep of a control root that is not the store itself, if it
has a control directory there at all, since a record may have arrived while no worker watched (a
wasted run at most). The store's own older records need no such sweep: triggers (SQL stores) and
the rescan (the JSON-file store) already compare them with what the row last saw.

Waking is ``TaskQueue.wake``: on PostgreSQL it also notifies the other workers. Several workers
watching the same root may each wake the task; the claim lets one run it, and a wake that came
during that run makes it due once more (a wasted run, never a second holder).

Not guaranteed: anything about records read through a source that is not a ``WatchedSource``
(they are seen when the task next runs), nor about tasks the queue holds as ended.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
import time
from typing import Callable, Iterable, Sequence

from ..errors import LongrunError
from ..protocols import WatchedSource
from ..stores.controlfiles import APPROVALS, CANCEL, CONTROL
from ..stores.queue import TaskQueue

__all__ = ["RECENT_S", "WATCH_S", "ControlWatch", "watch_roots"]

log = logging.getLogger("longrun")

WATCH_S = 0.25
"""How often a worker looks (the most it waits before seeing a control record)."""
RECENT_S = 2.0
"""A directory younger than this is compared by its listing too, not only by its times."""

_Signature = tuple[tuple[int, int, int, int] | None, tuple[object, ...] | None]
"""A directory's (mtime_ns, ctime_ns, nlink, size), or None if absent; and its listing while recent."""


def watch_roots(sources: Iterable[object]) -> list[str]:
    """The distinct directories the given control sources keep their records under."""
    roots: list[str] = []
    for source in sources:
        if isinstance(source, WatchedSource):
            for root in source.watch_roots():
                if root not in roots:
                    roots.append(root)
    return roots


def _directory(path: str, now_ns: int, listing: Callable[[str], tuple[object, ...]]) -> _Signature:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return (None, None)
    except OSError as exc:
        log.debug("control watch: cannot look at %s (%s)", path, exc)
        return (None, None)
    plain = (info.st_mtime_ns, info.st_ctime_ns, info.st_nlink, info.st_size)
    if not stat.S_ISDIR(info.st_mode) or now_ns - info.st_mtime_ns > RECENT_S * 1e9:
        return (plain, None)
    try:
        return (plain, listing(path))
    except OSError:
        return (plain, None)


def _names(path: str) -> tuple[object, ...]:
    return tuple(sorted(os.listdir(path)))


def _cancel_identity(path: str) -> tuple[object, ...]:
    with contextlib.suppress(FileNotFoundError):
        info = os.lstat(os.path.join(path, CANCEL))
        return (info.st_ino, info.st_size, info.st_mtime_ns)
    return ()


def _changed(old: _Signature, new: _Signature) -> bool:
    if old[0] != new[0]:
        return True
    return old[1] is not None and new[1] is not None and old[1] != new[1]


class ControlWatch:
    """Watches ``queue`` and the control ``roots`` of a worker running ``functions`` (see the module
    docstring). ``store_roots`` are the roots that are the store itself (no waking sweep at start).
    One thread calls ``look`` (``run`` does, every ``WATCH_S``); ``woken`` counts the tasks it woke."""

    def __init__(
        self, queue: TaskQueue, functions: Sequence[str], roots: Sequence[str], *, store_roots: Sequence[str] = (), sweep_s: float = 2.0
    ):
        self.queue = queue
        self.functions = sorted(functions)
        self.roots = list(roots)
        self.store_roots = set(store_roots)
        self.sweep_s = sweep_s
        self.woken = 0
        self._counter: int | None = None
        self._root_times: dict[str, tuple[int, int] | None] = {}
        self._seen: dict[tuple[str, str], tuple[_Signature, _Signature]] = {}
        self._swept_at: dict[str, float] = {}
        self._known: set[str] = set()
        """The tasks whose directories were looked at (the queue's unfinished rows at the last sweep)."""
        self._looked_ns = time.time_ns()

    def run(self, nudge: Callable[[], None], stop: threading.Event) -> None:
        """Look every ``WATCH_S`` until ``stop`` is set, calling ``nudge()`` when the worker should
        claim. Trouble with the queue is logged and looked at again next time."""
        while not stop.is_set():
            try:
                if self.look():
                    nudge()
            except LongrunError as exc:
                log.warning("control watch: %s; looking again in %.2fs", exc, WATCH_S)
            stop.wait(WATCH_S)

    def look(self) -> bool:
        """One look; True if a row of the worker's functions may be due now."""
        due = False
        now_ns = time.time_ns()
        counter = self.queue.change_count()
        if counter is not None and counter != self._counter:
            first = self._counter is None
            self._counter = counter
            if not first:
                due_in = self.queue.next_due_in(self.functions)
                due = due_in is not None and due_in <= 0
            if self.roots:  # rows may have come: their directories are compared from now on
                tasks = self.queue.watched(self.functions)
                new = [(task_id, parked) for task_id, parked in tasks if task_id not in self._known]
                due = self._visit([root for root in self.roots if root in self._swept_at], new, now_ns) or due
        if self.roots:
            changed = [root for root in self.roots if self._root_changed(root)]
            now = time.monotonic()
            roots = [root for root in self.roots if root in changed or now - self._swept_at.get(root, -1e18) >= self.sweep_s]
            if roots:
                tasks = self.queue.watched(self.functions)
                due = self._visit(roots, tasks, now_ns) or due
                for root in roots:
                    self._swept_at[root] = now
                self._known = {task_id for task_id, _ in tasks}
                for key in [key for key in self._seen if key[1] not in self._known]:
                    del self._seen[key]
        self._looked_ns = now_ns
        return due

    def _root_changed(self, root: str) -> bool:
        try:
            info = os.stat(root)
            times: tuple[int, int] | None = (info.st_mtime_ns, info.st_ctime_ns)
        except OSError:
            times = None
        before = self._root_times.get(root, ())
        self._root_times[root] = times
        return before != times

    def _visit(self, roots: list[str], tasks: list[tuple[str, bool]], now_ns: int) -> bool:
        """Compare each task's control directories under ``roots`` with the last look; wake those
        that changed. A task not seen before is woken only if its row is parked and its directory
        changed since the previous look (or, at a control root's first sweep, exists at all)."""
        woke = False
        for root in roots:
            first = root not in self._swept_at
            for task_id, parked in tasks:
                self._known.add(task_id)
                control = os.path.join(root, task_id, CONTROL)
                signature = (_directory(control, now_ns, _cancel_identity), _directory(os.path.join(control, APPROVALS), now_ns, _names))
                before = self._seen.get((root, task_id))
                self._seen[(root, task_id)] = signature
                if before is not None:
                    wake = _changed(before[0], signature[0]) or _changed(before[1], signature[1])
                elif not parked or signature[0][0] is None:
                    wake = False
                else:
                    newest = max(part[0][0] for part in signature if part[0] is not None)
                    wake = (first and root not in self.store_roots) or newest >= self._looked_ns - RECENT_S * 1e9
                if wake:
                    log.debug("control watch: a control record of task %s changed under %s; waking it", task_id, root, extra={"task": task_id})
                    if self.queue.wake(task_id):
                        self.woken += 1
                        woke = True
        return woke
