"""Whether a session task's lease holder still runs: a command that died leaves its lease behind."""

from __future__ import annotations

import os
import socket

from ..lease import Lease, boot_clock_id

__all__ = ["holder_gone"]


def holder_gone(lease: Lease) -> bool:
    """True if the lease's holder was a process on this machine that no longer runs.

    Owners are ``host:pid:token`` (``engine.default_owner``). A pid that is gone (or a zombie) cannot
    be holding the task; anything else, including a pid now used by another process, counts as alive,
    which only makes a caller wait for the lease to expire."""
    parts = lease.owner.rsplit(":", 2)
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    if lease.monotonic_clock is not None and lease.monotonic_clock != boot_clock_id():
        return False
    pid = int(parts[1])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return False
    fields = stat.rsplit(b")", 1)[-1].split()
    return bool(fields) and fields[0] in (b"Z", b"X")
