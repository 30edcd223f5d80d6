"""Fault-injecting file I/O for the stores that route every file operation through ``FileIO``.

``FaultyIO`` fails the N-th I/O call (or every call from the N-th) with a chosen errno, so a test
can walk N = 1, 2, ... until an operation completes and check, after each failure, that the store
still holds the before-state or the after-state, the way SQLite's I/O error tests do::

    store = JsonFileStore(root, io=FaultyIO(3, errno.ENOSPC), create=True)

It also watches the rule a store must keep after a failed flush: a file whose fsync failed is
never fsynced again and reported durable (``synced_after_failure`` names any that was).

Not covered: faults below the file system calls (a disk that lies about flushes), and stores that
do not take a ``FileIO`` (the database stores run their own fault tests).
"""

from __future__ import annotations

import errno as errno_module
import os
from typing import Callable, Iterable

from ..stores import FileIO

__all__ = ["FaultyIO"]


class FaultyIO(FileIO):
    """Fails the ``fail_at``-th I/O call (and, if ``persistent``, every later one) with ``OSError(error)``.

    Counts every operation that can fail on a real disk: open, read, pread, write, pwrite, fsync,
    fdatasync, truncate, replace, link, unlink, mkdir, listdir, the directory fsync, lstat, stat,
    fstat, chmod, fchmod and flock (``open_at`` and ``listdir_at`` count as open and listdir).
    ``kinds`` restricts counting to some of them. It also watches the rule a store must keep after a failed
    flush (SQLite's pager, and PostgreSQL's "fsyncgate"): a file whose fsync failed is never fsynced
    again and reported durable; ``synced_after_failure`` names any that was.
    """

    OPERATIONS = ("open", "read", "pread", "write", "pwrite", "fsync", "fdatasync", "truncate", "replace", "link",
                  "unlink", "mkdir", "listdir", "fsync_dir", "lstat", "stat", "fstat", "chmod", "fchmod", "flock")  # fmt: skip

    def __init__(self, fail_at: int = 0, error: int = errno_module.EIO, *, persistent: bool = False, kinds: Iterable[str] | None = None):
        self.fail_at = fail_at
        self.error = error
        self.persistent = persistent
        self.kinds = frozenset(kinds) if kinds is not None else None
        self.calls = 0
        self.injected = 0
        self.injected_operations: list[str] = []
        self.paths: dict[int, str] = {}
        self.failed_syncs: set[str] = set()
        self.synced_after_failure: list[str] = []

    def _tick(self, operation: str, target: str = "") -> None:
        if self.kinds is not None and operation not in self.kinds:
            return
        self.calls += 1
        if self.fail_at and (self.calls == self.fail_at or (self.persistent and self.calls > self.fail_at)):
            self.injected += 1
            self.injected_operations.append(operation)
            if operation in ("fsync", "fdatasync"):
                self.failed_syncs.add(target)
            raise OSError(self.error, f"injected {os.strerror(self.error)} at I/O call {self.calls} ({operation})", target)

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        self._tick("open", path)
        fd = super().open(path, flags, mode)
        self.paths[fd] = path
        return fd

    def close(self, fd: int) -> None:
        self.paths.pop(fd, None)
        super().close(fd)

    def read(self, fd: int, size: int) -> bytes:
        self._tick("read", self.paths.get(fd, ""))
        return super().read(fd, size)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        self._tick("pread", self.paths.get(fd, ""))
        return super().pread(fd, size, offset)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        self._tick("write", self.paths.get(fd, ""))
        return super().write(fd, data)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        self._tick("pwrite", self.paths.get(fd, ""))
        return super().pwrite(fd, data, offset)

    def _sync(self, operation: str, fd: int, call: Callable[[int], None]) -> None:
        path = self.paths.get(fd, "")
        self._tick(operation, path)
        if path in self.failed_syncs:
            self.synced_after_failure.append(path)
        call(fd)

    def fsync(self, fd: int) -> None:
        self._sync("fsync", fd, super().fsync)

    def fdatasync(self, fd: int) -> None:
        self._sync("fdatasync", fd, super().fdatasync)

    def truncate(self, fd: int, length: int) -> None:
        self._tick("truncate", self.paths.get(fd, ""))
        super().truncate(fd, length)

    def replace(self, source: str, destination: str) -> None:
        self._tick("replace", destination)
        super().replace(source, destination)

    def link(self, source: str, destination: str) -> None:
        self._tick("link", destination)
        super().link(source, destination)

    def unlink(self, path: str) -> None:
        self._tick("unlink", path)
        super().unlink(path)

    def mkdir(self, path: str, mode: int = 0o700) -> None:
        self._tick("mkdir", path)
        super().mkdir(path, mode)

    def listdir(self, path: str) -> list[str]:
        self._tick("listdir", path)
        return super().listdir(path)

    def fsync_dir(self, path: str) -> None:
        self._tick("fsync_dir", path)
        super().fsync_dir(path)

    def open_at(self, dir_fd: int | None, name: str, flags: int, mode: int = 0o600, *, follow: bool = False) -> int:
        path = name if dir_fd is None else os.path.join(self.paths.get(dir_fd, ""), name)
        self._tick("open", path)
        fd = super().open_at(dir_fd, name, flags, mode, follow=follow)
        self.paths[fd] = path
        return fd

    def listdir_at(self, dir_fd: int) -> list[str]:
        self._tick("listdir", self.paths.get(dir_fd, ""))
        return super().listdir_at(dir_fd)

    def lstat(self, path: str, *, dir_fd: int | None = None) -> os.stat_result:
        self._tick("lstat", path if dir_fd is None else os.path.join(self.paths.get(dir_fd, ""), path))
        return super().lstat(path, dir_fd=dir_fd)

    def stat(self, path: str) -> os.stat_result:
        self._tick("stat", path)
        return super().stat(path)

    def fstat(self, fd: int) -> os.stat_result:
        self._tick("fstat", self.paths.get(fd, ""))
        return super().fstat(fd)

    def chmod(self, path: str, mode: int) -> None:
        self._tick("chmod", path)
        super().chmod(path, mode)

    def fchmod(self, fd: int, mode: int) -> None:
        self._tick("fchmod", self.paths.get(fd, ""))
        super().fchmod(fd, mode)

    def flock(self, fd: int, operation: int) -> None:
        self._tick("flock", self.paths.get(fd, ""))
        super().flock(fd, operation)
