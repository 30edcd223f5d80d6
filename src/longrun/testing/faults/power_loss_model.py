"""A power-loss model of a local file system, for the JSON-file store's write protocols.

``RecordingIO`` passes every call through to the disk and records what it did: files created,
bytes written where, flushes (with the line of code that asked for them), truncations, links,
renames, unlinks, directory creations and directory flushes. ``crash_states`` replays a prefix of
that trace into a model of what a power loss may leave, in the spirit of ALICE and of SQLite's
crash tests:

- a write not followed by an ``fsync``/``fdatasync`` of its file is *written*, *dropped*, *torn*
  (half of the last write landed) or *garbled* (the last write's bytes are noise);
- a created, linked, renamed or removed name is lost unless its directory was fsynced after it;
  names not yet made durable survive as a prefix of the order they were changed in (file systems
  that journal metadata keep that order);
- a synced file's data and a synced directory's names survive.

``ignore_sites`` drops every flush made from the given lines of code: the mutation check removes
one flush of the write protocol at a time and expects some crash state to break a promise.

Not modelled: reordering of metadata operations, lost or garbled *synced* data, or a device that
lies about flushes. A directory's own creation counts as a name in its parent.
"""

from __future__ import annotations

import dataclasses
import os
import random
import sys
from typing import Any, Iterator

from ...stores import FileIO

__all__ = ["RecordingIO", "crash_states", "materialize"]

_O_CREAT = os.O_CREAT


class RecordingIO(FileIO):
    """A ``FileIO`` that records a trace of what reached the file system (see the module docstring)."""

    def __init__(self) -> None:
        self.ops: list[tuple[Any, ...]] = []
        self._paths: dict[int, str] = {}
        self._positions: dict[int, int] = {}

    def mark(self, *label: object) -> None:
        self.ops.append(("mark", *label))

    @staticmethod
    def _site(depth: int) -> str:
        """Where the flush was asked for: file, function and line of the store's code."""
        frame = sys._getframe(depth)
        return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}:{frame.f_lineno}"

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        existed = os.path.lexists(path)
        fd = super().open(path, flags, mode)
        if flags & _O_CREAT and not existed:
            self.ops.append(("create", path))
        self._paths[fd] = path
        self._positions[fd] = 0
        return fd

    def close(self, fd: int) -> None:
        self._paths.pop(fd, None)
        self._positions.pop(fd, None)
        super().close(fd)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        written = super().write(fd, data)
        offset = self._positions.get(fd, 0)
        self.ops.append(("write", self._paths[fd], offset, bytes(data[:written])))
        self._positions[fd] = offset + written
        return written

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        written = super().pwrite(fd, data, offset)
        self.ops.append(("write", self._paths[fd], offset, bytes(data[:written])))
        return written

    def _flush(self, fd: int) -> None:
        self.ops.append(("sync", self._paths[fd], self._site(3)))

    def fsync(self, fd: int) -> None:
        super().fsync(fd)
        self._flush(fd)

    def fdatasync(self, fd: int) -> None:
        super().fdatasync(fd)
        self._flush(fd)

    def truncate(self, fd: int, length: int) -> None:
        super().truncate(fd, length)
        self.ops.append(("truncate", self._paths[fd], length))

    def replace(self, source: str, destination: str) -> None:
        super().replace(source, destination)
        self.ops.append(("rename", source, destination))

    def link(self, source: str, destination: str) -> None:
        super().link(source, destination)
        self.ops.append(("link", source, destination))

    def unlink(self, path: str) -> None:
        super().unlink(path)
        self.ops.append(("unlink", path))

    def mkdir(self, path: str, mode: int = 0o700) -> None:
        super().mkdir(path, mode)
        self.ops.append(("mkdir", path))

    def fsync_dir(self, path: str) -> None:
        super().fsync_dir(path)
        self.ops.append(("dirsync", path.rstrip(os.sep), self._site(2)))


@dataclasses.dataclass
class _Inode:
    durable: bytearray
    current: bytearray
    pending: list[tuple[int, bytes]]
    """Writes since the last flush: (offset, bytes); a truncation is (length, b"") with offset -1-length."""


class _Model:
    def __init__(self, ignore_sites: frozenset[str]):
        self.ignore = ignore_sites
        self.inodes: list[_Inode] = []
        self.names: dict[str, int] = {}
        """Current names: path -> inode number (-1 for a directory)."""
        self.durable: dict[str, int] = {}
        self.pending: list[tuple[str, tuple[Any, ...]]] = []
        """Name changes not yet made durable: (directory, operation), in order."""
        self.last_write: tuple[int, int, int] | None = None
        """(inode, offset, length) of the latest write not yet flushed."""

    def _name_op(self, directory: str, operation: tuple[Any, ...]) -> None:
        _apply_name(self.names, operation)
        self.pending.append((directory, operation))

    def apply(self, op: tuple[Any, ...]) -> None:
        kind = op[0]
        if kind == "create":
            self.inodes.append(_Inode(bytearray(), bytearray(), []))
            self._name_op(os.path.dirname(op[1]), ("set", op[1], len(self.inodes) - 1))
        elif kind == "mkdir":
            self._name_op(os.path.dirname(op[1]), ("set", op[1], -1))
        elif kind == "write":
            _, path, offset, data = op
            number = self.names[path]
            inode = self.inodes[number]
            _write(inode.current, offset, data)
            inode.pending.append((offset, data))
            self.last_write = (number, offset, len(data))
        elif kind == "truncate":
            inode = self.inodes[self.names[op[1]]]
            del inode.current[op[2] :]
            inode.pending.append((-1 - op[2], b""))
        elif kind == "sync":
            number = self.names[op[1]]
            if op[2] in self.ignore:
                return
            inode = self.inodes[number]
            inode.durable = bytearray(inode.current)
            inode.pending = []
            if self.last_write is not None and self.last_write[0] == number:
                self.last_write = None
        elif kind == "rename":
            self._name_op(os.path.dirname(op[2]), ("rename", op[1], op[2]))
        elif kind == "link":
            self._name_op(os.path.dirname(op[2]), ("set", op[2], self.names[op[1]]))
        elif kind == "unlink":
            self._name_op(os.path.dirname(op[1]), ("del", op[1]))
        elif kind == "dirsync":
            if op[2] in self.ignore:
                return
            keep = []
            for directory, operation in self.pending:
                if directory == op[1]:
                    _apply_name(self.durable, operation)
                else:
                    keep.append((directory, operation))
            self.pending = keep

    def crash(self, mode: str, kept_names: int, rng: random.Random) -> tuple[dict[str, int], dict[int, bytes]]:
        """The names and the contents a power loss leaves (see ``crash_states``)."""
        names = dict(self.durable)
        for _, operation in self.pending[:kept_names]:
            _apply_name(names, operation)
        contents: dict[int, bytes] = {}
        for number in set(names.values()):
            if number < 0:
                continue
            inode = self.inodes[number]
            if mode == "written" or not inode.pending:
                contents[number] = bytes(inode.current)
                continue
            data = bytearray(inode.durable)
            writes = inode.pending if mode != "dropped" else []
            last = self.last_write if self.last_write is not None and self.last_write[0] == number else None
            for index, (offset, chunk) in enumerate(writes):
                if offset < 0:
                    del data[-1 - offset :]
                    continue
                if last is not None and index == len(writes) - 1:
                    if mode == "torn":
                        chunk = chunk[: len(chunk) // 2]
                    elif mode == "garbled":
                        chunk = bytes(rng.randrange(1, 256) for _ in chunk)
                _write(data, offset, chunk)
            contents[number] = bytes(data)
        return names, contents


def _write(buffer: bytearray, offset: int, data: bytes) -> None:
    if len(buffer) < offset:
        buffer.extend(bytes(offset - len(buffer)))
    buffer[offset : offset + len(data)] = data


def _apply_name(names: dict[str, int], operation: tuple[Any, ...]) -> None:
    kind = operation[0]
    if kind == "set":
        names[operation[1]] = operation[2]
    elif kind == "del":
        names.pop(operation[1], None)
    elif kind == "rename":
        if operation[1] in names:
            names[operation[2]] = names.pop(operation[1])


MODES = ("written", "dropped", "torn", "garbled")


def crash_states(
    ops: list[tuple[Any, ...]], prefix: int, *, ignore_sites: frozenset[str] = frozenset(), seed: int = 0
) -> Iterator[tuple[str, dict[str, int], dict[int, bytes]]]:
    """Every crash state the model allows after the first ``prefix`` operations: (label, names, contents)."""
    model = _Model(ignore_sites)
    for op in ops[:prefix]:
        if op[0] != "mark":
            model.apply(op)
    rng = random.Random(seed * 7919 + prefix)
    pending = len(model.pending)
    kept_options = sorted({0, pending, pending // 2})
    has_unsynced = any(inode.pending for inode in model.inodes)
    for kept in kept_options:
        for mode in MODES if has_unsynced else ("written",):
            if mode in ("torn", "garbled") and model.last_write is None:
                continue
            names, contents = model.crash(mode, kept, rng)
            yield f"{mode}, {kept}/{pending} unsynced name changes kept", names, contents


def materialize(names: dict[str, int], contents: dict[int, bytes], source_root: str, target_root: str) -> None:
    """Write a crash state under ``target_root`` (paths under ``source_root`` are moved there);
    two names of one inode become two hard links of one file."""
    made: dict[int, str] = {}
    for path in sorted(names, key=len):
        if not (path == source_root or path.startswith(source_root + os.sep)):
            continue
        target = target_root + path[len(source_root) :]
        number = names[path]
        parent = os.path.dirname(target)
        if not os.path.isdir(parent):
            continue  # its directory was lost: so is the name
        if number < 0:
            os.mkdir(target, 0o700)
        elif number in made:
            os.link(made[number], target)
        else:
            with open(target, "wb") as handle:
                handle.write(contents[number])
            os.chmod(target, 0o600)
            made[number] = target
