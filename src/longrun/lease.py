"""The task lease: one owner at a time, with an expiry and a fencing epoch.

A lease is acquired atomically by a store (see ``stores.base``), which issues an epoch one higher
than any it issued before for the task. Every state, ledger and control write names the epoch it
was made under, and the store rejects it (``FencedError``) unless that epoch is still current. So
a writer that paused past its expiry and was taken over cannot change anything, even if it never
notices. The epoch is also handed to adapters so a target can fence its own writes.

``LeaseKeeper`` renews the lease from a background thread for as long as a run holds it. If a
renewal fails it records why, and the runner stops (``lease-lost``) before its next write. It
measures the lease's freshness on a monotonic clock from the grant, never by comparing the
lease's expiry (which a database store stamps with its own clock) with the runner's wall clock.

Not guaranteed: that the adapter call itself stops when the lease is lost. A thread cannot be
killed; a target that must refuse stale work checks ``EffectRequest.epoch`` itself.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from . import _fields as f
from .canonical import JSONValue
__all__ = ["Lease", "LeaseKeeper"]

log = logging.getLogger("longrun")


@dataclass(frozen=True, slots=True)
class Lease:
    task_id: str
    owner: str
    epoch: int
    acquired_at: float
    expires_at: float

    def expired(self, now: float) -> bool:
        return now >= self.expires_at

    def remaining(self, now: float) -> float:
        return self.expires_at - now

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "task_id": self.task_id,
            "owner": self.owner,
            "epoch": self.epoch,
            "acquired_at": self.acquired_at,
            "expires_at": self.expires_at,
        }

    @classmethod
    def from_json(cls, data: object) -> "Lease":
        what = "lease record"
        d: Mapping[str, Any] = f.require_mapping(data, what)
        return cls(
            task_id=f.get_str(d, "task_id", what),
            owner=f.get_str(d, "owner", what),
            epoch=f.get_int(d, "epoch", what),
            acquired_at=f.get_float(d, "acquired_at", what),
            expires_at=f.get_float(d, "expires_at", what),
        )


class LeaseKeeper:
    """Renews a lease every ``interval_s`` seconds of real time until stopped.

    ``renew`` is called with the current lease and returns the renewed one, or raises. The first
    failure stops the keeper and is kept in ``failure``; ``lease`` is always the latest good lease.
    """

    def __init__(
        self, lease: Lease, renew: Callable[[Lease], Lease], interval_s: float, monotonic: Callable[[], float] = time.monotonic
    ):
        self._lease = lease
        self._monotonic = monotonic
        self.renewed_at = monotonic()
        """When (on ``monotonic``) the lease was last granted: its freshness, immune to wall-clock skew."""
        self._renew = renew
        self._interval_s = max(0.01, interval_s)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name=f"longrun-lease-{lease.task_id}", daemon=True)

    @property
    def lease(self) -> Lease:
        with self._lock:
            return self._lease

    def replace(self, lease: Lease) -> None:
        """Adopt a lease the caller renewed itself."""
        with self._lock:
            self._lease = lease
            self.renewed_at = self._monotonic()

    def __enter__(self) -> "LeaseKeeper":
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                renewed = self._renew(self.lease)
            except Exception as exc:  # recorded and acted on by the runner, never dropped
                log.warning("lease renewal for %s failed: %s", self._lease.task_id, exc)
                self.failure = exc
                return
            with self._lock:
                self._lease = renewed
                self.renewed_at = self._monotonic()
