"""The one I/O layer the file stores use: every open, read, write, fsync, truncation and rename,
and every look at the file system (``lstat``, ``fstat``, listings) and lock (``flock``).

Routing file I/O through one small object gives the crash and fault tests a single place to
count, fail or record calls (``FileIO`` can be subclassed or wrapped); the helpers below call the
file system only through it too. Two durable-write protocols
live here. Writing into a journal is ``write_all_at`` followed by ``FileIO.fdatasync``, which
flushes the data and any metadata needed to read it back (a new file size); the journal's name was
made durable when it was created, so no directory fsync is needed. Replacing a whole file is
``write_atomic``:

1. create a temporary file beside the destination (``O_EXCL``, owner-only, never following links);
2. write it completely and ``fsync`` it;
3. optionally hard-link the current destination to a backup name (costs no data write);
4. ``os.replace`` the temporary file onto the destination;
5. ``fsync`` the directory, so the renames themselves are durable.

After step 5 returns the new content is durable; a crash at any earlier point leaves the old
content in place (a leftover temporary file is never read as state). Not guaranteed: durability
on file systems or devices that ignore fsync.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import stat
from typing import TYPE_CHECKING, Sequence

__all__ = [
    "FileIO", "ensure_dir", "ensure_dirs", "lexists", "read_file", "remove_tree", "read_prefix", "read_small", "read_small_fd", "read_upto", "write_all",
    "write_all_at", "write_atomic", "write_new_files",
]  # fmt: skip

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
"""Reads open with O_NONBLOCK: a FIFO planted in place of a file must not hang the reader (it then
fails the regular-file check). It changes nothing for regular files."""
TEMP_MARK = ".tmp-"
# Where the platform has no fdatasync (macOS), fsync flushes at least as much.
_fdatasync = getattr(os, "fdatasync", os.fsync)


class FileIO:
    """Thin wrappers over ``os``; subclass to inject faults or record a trace."""

    # The calls every commit makes are the ``os`` functions themselves at run time (no wrapper
    # frame on the path of every commit); type checkers see the seam's own signatures, and a
    # subclass overrides any of them with a method all the same.
    if TYPE_CHECKING:

        def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int: ...

        def pread(self, fd: int, size: int, offset: int) -> bytes: ...

        def fdatasync(self, fd: int) -> None:
            """Flush the file's data and the metadata needed to read it back (its size), not its times."""

        def lstat(self, path: str, *, dir_fd: int | None = None) -> os.stat_result: ...

        def fstat(self, fd: int) -> os.stat_result: ...

        def flock(self, fd: int, operation: int) -> None:
            """``flock(2)``; the store holds its task locks through it."""

    else:
        pwrite = staticmethod(os.pwrite)
        pread = staticmethod(os.pread)
        fdatasync = staticmethod(_fdatasync)
        lstat = staticmethod(os.lstat)
        fstat = staticmethod(os.fstat)
        flock = staticmethod(fcntl.flock)

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        return os.open(path, flags | _NOFOLLOW | _CLOEXEC, mode)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        return os.write(fd, data)

    def read(self, fd: int, size: int) -> bytes:
        return os.read(fd, size)


    def fsync(self, fd: int) -> None:
        os.fsync(fd)


    def truncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)

    def close(self, fd: int) -> None:
        os.close(fd)

    def replace(self, source: str, destination: str) -> None:
        os.replace(source, destination)

    def link(self, source: str, destination: str) -> None:
        os.link(source, destination, follow_symlinks=False)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def mkdir(self, path: str, mode: int = 0o700) -> None:
        os.mkdir(path, mode)

    def rmdir(self, path: str) -> None:
        os.rmdir(path)

    def utime(self, path: str) -> None:
        """Set the access and modification times of ``path`` to now (following a link)."""
        os.utime(path)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def listdir_at(self, dir_fd: int) -> list[str]:
        """The names in the directory open as ``dir_fd`` (the directory checked is the one listed)."""
        return os.listdir(dir_fd)

    def open_at(self, dir_fd: int | None, name: str, flags: int, mode: int = 0o600, *, follow: bool = False) -> int:
        """``open`` relative to the directory open as ``dir_fd`` (None: ``name`` is a path). A
        symbolic link is refused (``O_NOFOLLOW``) unless ``follow``."""
        return os.open(name, flags | _CLOEXEC | (0 if follow else _NOFOLLOW), mode, dir_fd=dir_fd)


    def stat(self, path: str) -> os.stat_result:
        """``stat`` following symbolic links (only the store root may be one)."""
        return os.stat(path)


    def chmod(self, path: str, mode: int) -> None:
        os.chmod(path, mode)

    def fchmod(self, fd: int, mode: int) -> None:
        os.fchmod(fd, mode)


    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def ensure_dir(io: FileIO, path: str, mode: int = 0o700) -> None:
    """Create ``path`` with ``mode`` (owner-only by default) if missing; refuse a symlink or a
    non-directory in its place."""
    try:
        io.mkdir(path, mode)
    except FileExistsError:
        info = io.lstat(path)
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
            raise OSError(errno.ENOTDIR, "exists and is not a plain directory", path) from None
        return
    io.chmod(path, mode)  # mkdir's mode is filtered by the umask
    io.fsync_dir(os.path.dirname(path) or ".")


def remove_tree(io: FileIO, path: str) -> list[str]:
    """Delete the directory ``path`` and everything in it, depth first, never following a symbolic
    link (a link is unlinked, not entered); return the files removed. A name already gone is skipped."""
    removed: list[str] = []
    try:
        names = io.listdir(path)
    except FileNotFoundError:
        return removed
    for name in sorted(names):
        child = os.path.join(path, name)
        try:
            info = io.lstat(child)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(info.st_mode):
            removed += remove_tree(io, child)
        else:
            with contextlib.suppress(FileNotFoundError):  # gone already: what was asked
                io.unlink(child)
                removed.append(child)
    with contextlib.suppress(FileNotFoundError):
        io.rmdir(path)
    return removed


def ensure_dirs(io: FileIO, path: str) -> None:
    """``ensure_dir`` for ``path`` and every missing directory above it, top down (existing ones,
    links included, are left as they are)."""
    missing = []
    while not lexists(io, path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for directory in reversed(missing):
        ensure_dir(io, directory)


def lexists(io: FileIO, path: str) -> bool:
    """Whether anything (a symbolic link included) has the name ``path``."""
    try:
        io.lstat(path)
    except FileNotFoundError:
        return False
    return True


def read_file(io: FileIO, path: str, limit: int) -> bytes | None:
    """The file's bytes, or None if it does not exist. Refuses symlinks and files over ``limit``."""
    try:
        fd = io.open(path, os.O_RDONLY | _NONBLOCK)
    except FileNotFoundError:
        return None
    try:
        info = io.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        if info.st_size > limit:
            raise OSError(errno.EFBIG, f"file is {info.st_size} bytes, over the {limit}-byte limit", path)
        data = read_upto(io, fd, limit + 1)
        if len(data) > limit:
            raise OSError(errno.EFBIG, f"file grew over the {limit}-byte limit while read", path)
        return data
    finally:
        io.close(fd)


def read_small(io: FileIO, path: str, limit: int) -> bytes | None:
    """A small file's bytes in one read, or None if it does not exist; refuses symlinks and files
    over ``limit``. For files read on every commit (the lease): three system calls, not five."""
    try:
        fd = io.open(path, os.O_RDONLY | _NONBLOCK)
    except FileNotFoundError:
        return None
    try:
        # No fstat (the point is fewer calls): a directory raises IsADirectoryError here, and a FIFO
        # (opened non-blocking) reads as empty, which the caller's parser refuses.
        return read_small_fd(io, fd, path, limit)
    finally:
        io.close(fd)


def read_small_fd(io: FileIO, fd: int, path: str, limit: int) -> bytes:
    """``read_small`` of a file already open (the caller keeps the descriptor)."""
    data = io.read(fd, limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"file is over the {limit}-byte limit", path)
    return data


def read_prefix(io: FileIO, path: str, size: int) -> bytes | None:
    """Up to ``size`` bytes from the start of the file, or None if it does not exist (no symlinks)."""
    try:
        fd = io.open(path, os.O_RDONLY | _NONBLOCK)
    except FileNotFoundError:
        return None
    try:
        if not stat.S_ISREG(io.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        return read_upto(io, fd, size)
    finally:
        io.close(fd)


def read_upto(io: FileIO, fd: int, size: int) -> bytes:
    """Read from ``fd`` until ``size`` bytes or the end of the file, whichever comes first."""
    chunks = []
    remaining = size
    while remaining > 0:
        chunk = io.read(fd, min(remaining, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def write_all(io: FileIO, fd: int, data: bytes) -> None:
    """Write every byte of ``data`` (a short write is continued, a write of nothing is an error)."""
    view = memoryview(data)
    while view:
        written = io.write(fd, view)
        if written <= 0:
            raise OSError(errno.EIO, "write made no progress")
        view = view[written:]


def write_all_at(io: FileIO, fd: int, data: bytes, offset: int) -> None:
    """Write every byte of ``data`` at ``offset`` (``pwrite``; the descriptor's offset is unused)."""
    view = memoryview(data)
    while view:
        written = io.pwrite(fd, view, offset)
        if written <= 0:
            raise OSError(errno.EIO, "write made no progress")
        view = view[written:]
        offset += written


def write_atomic(
    io: FileIO, directory: str, name: str, data: bytes | Sequence[bytes], *, backup: str | None = None, mode: int = 0o600
) -> None:
    """Durably replace ``directory/name`` with ``data`` (bytes, or chunks written in order); see the
    module docstring for the steps. The file gets ``mode`` (owner-only by default)."""
    destination = os.path.join(directory, name)
    temp = os.path.join(directory, f"{name}{TEMP_MARK}{secrets.token_hex(6)}")
    fd = io.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        try:
            if mode != 0o600:
                io.fchmod(fd, mode)  # the umask filters the mode open gives; owner-only needs no fix
            for chunk in (data,) if isinstance(data, (bytes, bytearray)) else data:
                write_all(io, fd, chunk)
            io.fsync(fd)
        finally:
            io.close(fd)
        if backup is not None:
            backup_temp = os.path.join(directory, f"{backup}{TEMP_MARK}{secrets.token_hex(6)}")
            try:
                io.link(destination, backup_temp)
            except FileNotFoundError:
                pass  # first revision: nothing to back up yet
            else:
                io.replace(backup_temp, os.path.join(directory, backup))
        io.replace(temp, destination)
    except BaseException:
        # The original error is what the caller needs; a leftover temp file is harmless (it is
        # never read as state and the store sweeps it on load), so a failed unlink is not raised.
        with contextlib.suppress(OSError):
            io.unlink(temp)
        raise
    io.fsync_dir(directory)


def write_new_files(io: FileIO, directory: str, files: Sequence[tuple[str, bytes | Sequence[bytes]]]) -> None:
    """Durably create each ``directory/name`` with its bytes (or the pieces they are made of,
    written in order, never joined), then ``fsync`` the directory once.

    For immutable, content-addressed files (blobs): each is written to a temporary file,
    ``fdatasync``-ed and renamed to its name, so a name never holds less than its whole content;
    one directory fsync at the end makes every rename durable. A name that already exists is left
    as it is (it holds the same content, written the same way), but the directory is still synced,
    since the rename that made it may not be durable yet."""
    for name, data in files:
        destination = os.path.join(directory, name)
        if lexists(io, destination):
            continue
        temp = os.path.join(directory, f"{name}{TEMP_MARK}{secrets.token_hex(6)}")
        fd = io.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                for piece in (data,) if isinstance(data, (bytes, bytearray)) else data:
                    write_all(io, fd, piece)
                io.fdatasync(fd)
            finally:
                io.close(fd)
            io.replace(temp, destination)
        except BaseException:
            with contextlib.suppress(OSError):
                io.unlink(temp)
            raise
    io.fsync_dir(directory)
