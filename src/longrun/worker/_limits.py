"""A fleet-wide limit on concurrent applies of one action: K slots in the store's database.

``LimitedAdapter`` wraps an effect adapter so that ``apply`` runs only while its worker holds one of
the action's K slots (``TaskQueue.acquire_slot``: a row claimed with ``SKIP LOCKED`` on PostgreSQL,
under SQLite's write lock otherwise). A slot is held for ``ttl_s`` and renewed in the background
while the apply runs, so a worker killed mid-apply frees its slot when the expiry passes. ``observe``
is not limited: it reads the target, it does not act on it.

Guaranteed: while every holder is alive and renewing, at most K applies of the action are under way
across every worker that gives the same K (slots are rows 0..K-1; a worker given a larger K uses
more of them). Not guaranteed: a holder frozen (SIGSTOP, a VM pause) past ``ttl_s`` loses its slot,
and its apply, still in flight, may overlap with the K that follow; the wait for a slot has no
deadline (a full limit makes applies queue, which is the point), so a limit of 0 is refused.
"""

from __future__ import annotations

import logging
import random
import threading
import time

from ..adapters import EffectRequest, Observation, Receipt
from ..errors import InvalidInputError, StorageError, TransientError
from ..protocols import EffectAdapter
from ..stores.queue import SlotHold, TaskQueue

__all__ = ["LimitedAdapter", "SlotKeeper"]

log = logging.getLogger("longrun")


class SlotKeeper:
    """Takes, renews and releases action slots for one worker through its own ``TaskQueue``.

    One background thread renews every slot held, every ``ttl_s / 3``; it runs only while a slot is held."""

    def __init__(self, queue: TaskQueue, holder: str, *, ttl_s: float = 30.0):
        if not ttl_s > 0:
            raise InvalidInputError(f"a slot's ttl must be positive, got {ttl_s!r}")
        self._queue = queue
        self.holder = holder
        self.ttl_s = float(ttl_s)
        self._held: dict[str, SlotHold] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._renewer: threading.Thread | None = None

    def acquire(self, action: str, limit: int) -> SlotHold:
        """Wait until one of ``action``'s ``limit`` slots is free, and take it."""
        delay = 0.01
        waited_since = time.monotonic()
        reported = False
        while True:
            hold = self._queue.acquire_slot(action, limit, self.holder, self.ttl_s)
            if hold is not None:
                break
            if not reported and time.monotonic() - waited_since > 10.0:
                log.info("waiting for one of the %d slots of action %r", limit, action, extra={"step": action})
                reported = True
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.2)
        with self._lock:
            self._held[hold.token] = hold
            if self._renewer is None:
                self._renewer = threading.Thread(target=self._renew_loop, name="longrun-slots", daemon=True)
                self._renewer.start()
        return hold

    def release(self, hold: SlotHold) -> None:
        with self._lock:
            self._held.pop(hold.token, None)
        try:
            self._queue.release_slot(hold)
        except StorageError as exc:  # it expires by itself after ttl_s
            log.warning("releasing slot %d of %r failed (%s); it frees itself when it expires", hold.slot, hold.action, exc)

    def _renew_loop(self) -> None:
        while True:
            with self._lock:
                self._changed.wait(self.ttl_s / 3)
                holds = list(self._held.values())
                if not holds:
                    self._renewer = None
                    return
            for hold in holds:
                try:
                    if not self._queue.renew_slot(hold, self.ttl_s):
                        log.warning("slot %d of %r expired before it was renewed; the limit may be exceeded once", hold.slot, hold.action)
                except StorageError as exc:
                    log.warning("renewing slot %d of %r failed: %s", hold.slot, hold.action, exc)


class LimitedAdapter:
    """``adapter`` with at most ``limit`` applies of ``action`` at once across the fleet (see the module)."""

    def __init__(self, adapter: EffectAdapter, action: str, limit: int, slots: SlotKeeper):
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidInputError(f"the limit of action {action!r} must be an integer >= 1, got {limit!r}")
        self.inner = adapter
        self.action = action
        self.limit = limit
        self.deduplicates = adapter.deduplicates
        self._slots = slots

    def apply(self, request: EffectRequest) -> Receipt:
        try:
            hold = self._slots.acquire(self.action, self.limit)
        except StorageError as exc:  # apply was not called: the effect certainly did not happen
            raise TransientError(f"no slot of action {self.action!r} could be taken: {exc}") from exc
        try:
            return self.inner.apply(request)
        finally:
            self._slots.release(hold)

    def observe(self, request: EffectRequest) -> Observation:
        return self.inner.observe(request)
