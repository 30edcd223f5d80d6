"""The floors: what one durable write costs on this disk, whatever is written.

Each function runs ``ops`` operations in ``directory`` and returns the mean seconds per operation.
Nothing here imports longrun; these are the numbers longrun's own figures are divided by.
"""

from __future__ import annotations

import os
import sqlite3
import time

__all__ = ["append_fdatasync", "atomic_replace", "overwrite_fdatasync", "sqlite_wal_full"]

RECORD = b"x" * 255 + b"\n"
_fdatasync = getattr(os, "fdatasync", os.fsync)


def append_fdatasync(directory: str, ops: int) -> float:
    """``write`` a 256-byte record to a file opened ``O_APPEND``, then ``fdatasync``."""
    path = os.path.join(directory, "append.log")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, RECORD)
        os.fsync(fd)
        started = time.perf_counter()
        for _ in range(ops):
            os.write(fd, RECORD)
            _fdatasync(fd)
        return (time.perf_counter() - started) / ops
    finally:
        os.close(fd)
        os.unlink(path)


def overwrite_fdatasync(directory: str, ops: int) -> float:
    """``pwrite`` a 256-byte record into zeros written (and synced) ahead, then ``fdatasync``:
    no file size changes, so the flush carries no metadata. What longrun's journal does."""
    path = os.path.join(directory, "overwrite.log")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.write(fd, bytes(len(RECORD) * (ops + 1)))
        os.fsync(fd)
        started = time.perf_counter()
        for index in range(ops):
            os.pwrite(fd, RECORD, index * len(RECORD))
            _fdatasync(fd)
        return (time.perf_counter() - started) / ops
    finally:
        os.close(fd)
        os.unlink(path)


def atomic_replace(directory: str, ops: int) -> float:
    """Write a temporary file, ``fsync`` it, ``rename`` it over the target, ``fsync`` the directory."""
    target = os.path.join(directory, "state.json")
    temp = target + ".tmp"
    started = time.perf_counter()
    for _ in range(ops):
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, RECORD)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, target)
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    elapsed = (time.perf_counter() - started) / ops
    os.unlink(target)
    return elapsed


def sqlite_wal_full(directory: str, ops: int) -> float:
    """One ``INSERT`` per transaction in a WAL-mode database with ``synchronous=FULL``."""
    path = os.path.join(directory, "floor.sqlite")
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=FULL")
        connection.execute("CREATE TABLE records (id INTEGER PRIMARY KEY, body BLOB)")
        started = time.perf_counter()
        for index in range(ops):
            connection.execute("BEGIN")
            connection.execute("INSERT INTO records VALUES (?, ?)", (index, RECORD))
            connection.execute("COMMIT")
        return (time.perf_counter() - started) / ops
    finally:
        connection.close()
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(path + suffix):
                os.unlink(path + suffix)
