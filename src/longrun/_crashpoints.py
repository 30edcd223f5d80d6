"""Named crash points: places in the library where the fault-injection suite may kill the process.

The library calls ``hit(name)`` at a handful of moments that matter for durability (an effect's
intent is durable, the adapter returned, a lease was acquired...), always guarded as
``if _crashpoints.ARMED: _crashpoints.hit(...)``, so a process that was not started for a fault
test pays one attribute lookup per point and nothing else. ``ARMED`` is fixed at import time from
the environment:

- ``LONGRUN_CRASH_AT="name:N"``: the process SIGKILLs itself at the N-th hit of ``name`` (counted in
  this process). Nothing is flushed or cleaned up: it is a crash, not an exception.
- ``LONGRUN_CRASH_TRACE=PATH``: every hit is appended to PATH as one line ``name N [detail]``
  (one ``write`` on an ``O_APPEND`` descriptor, so it survives the SIGKILL that may follow).

The point names and what they mean are listed in ``longrun.testing.faults.points``. Not a public API:
nothing here is meant for production use, and its names may change with the tests.
"""

from __future__ import annotations

import os
import signal

__all__ = ["ARMED", "hit"]

_AT = os.environ.get("LONGRUN_CRASH_AT", "")
_TRACE = os.environ.get("LONGRUN_CRASH_TRACE", "")
ARMED = bool(_AT or _TRACE)
"""True only if this process was started with a crash target or a trace file."""

_target_name, _, _target_count = _AT.rpartition(":")
_TARGET = (_target_name, int(_target_count)) if _target_name and _target_count.isdigit() else None
_counts: dict[str, int] = {}


def hit(name: str, detail: object = None) -> None:
    """Count a pass through the point ``name``; trace it, and SIGKILL the process if it is the target."""
    count = _counts.get(name, 0) + 1
    _counts[name] = count
    if _TRACE:
        line = f"{name} {count}" + ("" if detail is None else f" {detail}") + "\n"
        fd = os.open(_TRACE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    if _TARGET is not None and _TARGET[0] == name and _TARGET[1] == count:
        os.kill(os.getpid(), signal.SIGKILL)
