"""The real clock: wall time for records people read, the monotonic clock for durations.

``SystemClock`` implements ``protocols.Clock`` and its optional monotonic capability. Tests inject
``longrun.testing.FakeClock`` instead and never sleep to make time pass.
"""

from __future__ import annotations

import time

from .lease import boot_clock_id

__all__ = ["SystemClock"]


class SystemClock:
    """The real wall clock, and the system's monotonic clock for measuring durations."""

    # The C functions themselves, not methods that call them: read several times on every step.
    now = staticmethod(time.time)
    """The wall clock: seconds since the epoch (``time.time``)."""
    monotonic = staticmethod(time.monotonic)
    """The system's monotonic clock (``time.monotonic``): durations, never dates."""

    def monotonic_id(self) -> str | None:
        """The timeline ``monotonic()`` is on: this boot of this machine (see ``longrun.lease``)."""
        return boot_clock_id()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)
