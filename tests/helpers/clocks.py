"""A clock for the child programs that tests kill and resume."""

from __future__ import annotations

from longrun import SystemClock


class LaterClock(SystemClock):
    """The real clock shifted forward by ``offset`` seconds, so a process started later finds the
    leases of the ones before it (a killed one's) expired without waiting. Leases are judged on the
    monotonic timeline this boot shares, so that one is shifted too."""

    def __init__(self, offset: float):
        self.offset = offset

    def now(self) -> float:
        return super().now() + self.offset

    def monotonic(self) -> float:
        return super().monotonic() + self.offset
