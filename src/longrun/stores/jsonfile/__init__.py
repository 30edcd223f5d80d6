"""The local JSON-file store: one directory per task, for one machine; one fsync per commit.

Layout under ``root`` (directories 0700, files 0600)::

    .longrun-store          the store marker, written with the first task: a directory without it
                            that is not empty and holds no task longrun wrote is refused
    <task id>/
        state.json          the snapshot: the whole state at one revision (format in ``_journal``)
        journal.<R>.log     the journal: one line per commit after revision R, then zero padding
        state.json.bak      the previous snapshot, a hard link made by each compaction
        journal.<B>.log     the previous snapshot's journal (B = its revision), kept beside it
        lease.json          owner, epoch, expiry, the holder's token, the revision last known committed
                            (the state's witness, ``stores.base`` invariant 7); never deleted, so epochs
                            never restart (a damaged one is moved to quarantine by ``repair_lease``)
        lease.lock          held with flock(2) by the lease's holder for the lease's life, so a
                            contender can tell a dead holder from a paused one (``_holders``)
        lock                flock(2) target: every read-modify-write of the task runs under it
        control/cancel.json
        control/approvals/<approval id>.json
        messages/<seq>.<key digest>.json    the task's mailbox, one file per message (``_mailbox``)
        quarantine/         damaged files, moved aside with a timestamp, never deleted
    .summaries.sqlite       the summary index (``INDEX_FILE``): a row per task, derived from the
                            task files, so listings cost O(page) (``_index``)
    .deleted.<task id>.<random>/
                            a task being deleted (``delete_task``): renamed here in one step, then
                            removed; never listed or loaded (a dot name is never a task id)

A commit writes one line naming only what changed (the header fields that differ, the effect
records the caller names in ``changed``) into the journal, then calls ``fdatasync``: O(1) bytes and
one durable write, whatever the size of the ledger. The journal is zero-filled ahead of its end, so
the line overwrites blocks that are already allocated and written: ``fdatasync`` then flushes data
only, not the inode (an append would change the file size, which costs a metadata flush); the
padding is extended, by the journal's own size up to 1 MiB, in one write with the line that needs
it. The journal's name was made durable (directory fsync) when it was created, so no commit needs a
directory fsync. When the journal outgrows half the snapshot (and ``COMPACT_MIN_BYTES``), the
commit is followed by a compaction: a new journal is created, then the state is written as a new
snapshot with ``write_atomic`` (which hard-links the old one to ``state.json.bak``), then journals
older than the backup's are deleted. A compaction costs O(n) after O(n) bytes of commits, so a
commit costs amortized O(1), and a load reads at most a snapshot and half its size in journal.

Invariants (``tests/test_store_jsonfile.py`` and ``tests/test_journal.py`` are built to break them):

1. A commit is durable when it returns: its line is written and ``fdatasync`` returned. It is
   made under the task's exclusive flock after the fencing check, so a stale epoch never lands.
   A failed write puts the padding back (where it can), and the task is poisoned until reloaded.
2. A chain is a snapshot at revision R followed by ``journal.R.log``, whose records end at some
   revision E, followed by ``journal.E.log`` if that exists, and so on. Every file a chain needs is
   durable before anything names it: a snapshot's journal is created before the snapshot is
   published. So a snapshot without its journal means files were lost, not a crash.
3. Load follows the chain from ``state.json``. A torn last line (incomplete: its write was cut
   short, so its fdatasync never returned and the commit was never acknowledged) is dropped, and
   cut off the journal by a repairing load. Anything else that fails validation is damage.
4. On damage (a snapshot or a journal line that fails its checksum or its rules, a snapshot not
   newer than its backup, a journal with records the chain cannot reach) the state is rebuilt from
   the longest valid chain, from ``state.json`` or from ``state.json.bak``, with ``reconcile_all``
   set, so every unverified step is observed before it is applied. A repairing load makes that
   durable: damaged snapshots aside, a new journal, damaged journals aside, then the recovered
   state as a new snapshot at a revision above every revision that may have been committed (a
   damaged journal counts as holding as many as its size allows). If nothing validates it raises
   ``StateUnrecoverableError``, and keeps raising it: never a silent fresh start. A rebuild is
   refused the same way, before anything is moved or written, if the state it gives lacks a
   revision the journals or the lease record show committed and the task's records are not all
   effects (a durable function's or a session's: ``stores.base`` invariant 7). A blob that fails
   its SHA-256 is named in the evidence and, by a repairing load, moved to
   ``quarantine/blob.<sha256>.<time>.damaged``, so the next write of that content makes a fresh
   file; a blob written again over a damaged file of its name moves that file aside first.
5. A store object remembers what it last wrote (the shadow of the journal) and checks, under the
   lock, that the snapshot is still the one it wrote and that the journal's padding at its end is
   untouched; if another writer changed either, it refuses to commit until the task is loaded again.
6. Every state committed has a snapshot of at most ``MAX_STATE_BYTES``, the most a load reads. A
   snapshot is measured when it is encoded, before any I/O (``SizeLimitError`` if it is over); a
   journal line is appended only while the snapshot's size plus the journal's (an upper bound on
   the next snapshot: each line carries every value it changes) stays within the limit, and
   otherwise the commit writes a snapshot instead, so a compaction never meets a state too large.
   A journal's zero padding stops at ``MAX_JOURNAL_BYTES``: a load reads no larger file.

Reading is hardened against planted and damaged files: every file is opened ``O_NOFOLLOW`` (and
``O_NONBLOCK``, so a FIFO cannot hang a reader) and must be a regular file within its limit
(``MAX_STATE_BYTES`` for snapshots and journals, ``MAX_RECORD_BYTES`` for the lease and control
records, ``MAX_APPROVAL_FILES``); the task directory and ``quarantine`` must be plain directories
(``lstat``), and control records are read by walking open descriptors down from the root
(``stores.controlfiles``), so nothing is read from, written to or quarantined into a place outside
the task directory; names read from listings are used only if they match ``journal.<R>.log`` or end
in ``.json``. JSON is parsed by ``canonical.parse_json``. A read-only load changes no byte and no
name; only a repairing load (with the lease) moves damaged files into ``quarantine``. The directory
checks are ``lstat`` calls before use: someone who can swap a directory in between can edit the
state anyway.

The store root must be a directory, or a symbolic link to a directory owned by this user through a
link owned by this user or root; it is created only with ``create=True``. Inside it, links are
refused as above.

Threads. A store object may be shared by threads. Each task has a gate in the store object (a lock
and a count of the threads that hold or wait for it): a transaction holds its task's gate, then
the flock, so the object's threads take turns per task while other processes are held off by the
flock. The writer, the journal descriptor and the caches of a task are touched only in its turn,
except that the descriptor cache (``MAX_OPEN_JOURNALS``) closes a descriptor only when its task's
count is zero; so a descriptor is never closed, and its number never reused, under a commit.

Held descriptors (``_layout.Handles``). Besides the journal, a store object keeps a task's lock file open
(each transaction locks and unlocks it: no open and close per commit), the lease file it last read
(open only so that its inode is not reused: every lease write replaces the file, so an ``lstat``
that finds the same inode, size and times finds the same bytes), and the task's ``control``
directory (its cancellation is read with one ``openat``). A lock file whose name no longer gives
the held file (deleted or replaced) is noticed under the lock and opened again by name. A commit
then makes eight system calls: lock, three ``lstat`` (the lock file, the lease, the snapshot), the
padding check, the write, ``fdatasync``, unlock; a cancellation read one.
Held descriptors are bounded like the journals', closed by ``close``, dropped after an OS error
(the next transaction opens the files by name), and forgotten in a child after ``fork`` (a copied
lock descriptor would share the parent's locks).

``changed``: a caller names the step ids whose effect records it replaced since its last commit
(the Runner does). Added and removed records are found even if not named; ``changed=None`` (the
default) means "not known" and makes the store compare every record (correct, O(n)).

Not guaranteed: exclusion across machines (flock on a network file system is not trustworthy; use
a database store), protection from a user who edits the files with the right permissions, or
durability where ``fsync``/``fdatasync`` is ignored. A journal cut exactly at a line boundary, or
damage that looks exactly like a torn last line, loses the commits past the cut, as in any
write-ahead log, unless ``lease.json`` witnessed one of them (then the load refuses, see
``stores.base``). The backup generation is validated when it is needed, not on every load.

The package, one module per part (each reaches the file system only through the store's
``FileIO``, so the fault tests reach every call):

- ``_layout``: the names above, the limits, the checks on paths, the gates (a task's turn among
  a store object's threads), the held descriptors above, and the transaction that locks the task;
- ``_reading``: snapshots, journals and the chains they form, and the recent timeline the
  journals hold;
- ``_recovery``: one load (``Load``): the clean chain, or the longest valid one, and the repair;
- ``_writing``: commits (a journal line or a snapshot), compaction, and what a store object
  remembers of what it wrote;
- ``_store``: ``JsonFileStore``, the ``stores.base`` primitives over these parts. Control records
  are read and written by ``stores.controlfiles``, shared with ``authority.FileControlSource``.
"""

from __future__ import annotations

import sys
import types

from . import _layout
# The names the module had before it became a package, re-exported explicitly.
from ._layout import (
    APPROVALS as APPROVALS,
    BACKUP as BACKUP,
    CANCEL as CANCEL,
    COMPACT_MIN_BYTES as COMPACT_MIN_BYTES,
    COMPACT_RATIO as COMPACT_RATIO,
    CONTROL as CONTROL,
    HOLDER_LOCK as HOLDER_LOCK,
    LEASE as LEASE,
    LOCK as LOCK,
    MARKER as MARKER,
    MAX_APPROVAL_FILES as MAX_APPROVAL_FILES,
    MAX_JOURNAL_BYTES as MAX_JOURNAL_BYTES,
    MAX_OPEN_JOURNALS as MAX_OPEN_JOURNALS,
    MAX_RECORD_BYTES as MAX_RECORD_BYTES,
    MAX_STATE_BYTES as MAX_STATE_BYTES,
    PREALLOCATE_MAX as PREALLOCATE_MAX,
    PREALLOCATE_MIN as PREALLOCATE_MIN,
    QUARANTINE as QUARANTINE,
    STATE as STATE,
    journal_name as journal_name,
)
from ._index import INDEX_FILE
from ._store import JsonFileStore

__all__ = ["INDEX_FILE", "JsonFileStore"]

_TUNABLES = frozenset(
    {"MAX_STATE_BYTES", "MAX_JOURNAL_BYTES", "COMPACT_MIN_BYTES", "COMPACT_RATIO", "MAX_OPEN_JOURNALS", "PREALLOCATE_MIN", "PREALLOCATE_MAX"}
)
"""Limits the code reads from ``_layout`` when it uses them; setting one here sets it there."""


class _Package(types.ModuleType):
    """This package as a module object: a tunable set on it (``jsonfile.COMPACT_MIN_BYTES = 0``, or
    ``mock.patch`` of ``longrun.stores.jsonfile.MAX_STATE_BYTES``) reaches the module that reads it,
    as it did when the store was one module."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in _TUNABLES:
            setattr(_layout, name, value)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
