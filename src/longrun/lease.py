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

Whether a lease is still live is judged on a monotonic clock when one can be: a runner whose
clock offers ``monotonic_id()`` (``SystemClock`` does: this boot of this machine) hands the store
its ``(id, monotonic())`` reading, and a store that keeps it (the JSON-file store) records the
lease's expiry on that timeline too. A contender on the same timeline then takes over only when
*its own* monotonic reading is past that expiry: no sooner than the lease's TTL after the holder's
last grant or renewal, measured on the one clock both share. A wall clock that jumps, freezes or
runs at the wrong rate changes nothing. A lease recorded during another boot of the machine
(``boot:`` ids that differ) has no live holder: the reboot ended it. Without a shared timeline (a
clock with no ``monotonic_id``, a store that does not keep it, the database stores) expiry is
judged by wall clock: the caller's, or the database server's.

Who holds a lease is decided by a secret, not a name. ``acquire_lease`` issues a random ``token``
with every grant; renewal, release, commits and a repairing load must present it with the epoch,
and a live lease is re-entered only by the caller that presents its token. The ``owner`` is a
label for people (``status``, logs): two runs that call themselves by the same name (the host
name, say) are still two holders, and the second gets ``LeaseHeldError``. The token never appears
in ``repr``, in ``read_lease`` or in a ``LeaseHeldError``; anyone who can read the store's files can
read it there, so it tells holders apart, it does not keep out someone who can edit the store.

On one machine a store can also prove that a holder died (``holder_lock``, see
``stores._holders``): the holder keeps a kernel lock for the lease's life, the kernel drops it when
the process dies, and a contender on the same boot that finds the lock free takes the lease at
once, with the next epoch, instead of waiting for the expiry. A holder that is only paused keeps
its lock and is waited for; a holder on another machine is judged by expiry alone.

Not guaranteed: that the adapter call itself stops when the lease is lost. A thread cannot be
killed; a target that must refuse stale work checks ``EffectRequest.epoch`` itself. Nor a right
judgement if the kernel's monotonic clock is itself wrong (it is never stepped; NTP slews it by
at most 0.05%).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from . import _fields as f
from .canonical import JSONValue
from .errors import CorruptStateError, InvalidInputError, describe_exception
__all__ = ["Lease", "LeaseKeeper", "LeaseRepair", "MonotonicReading", "boot_clock_id"]

log = logging.getLogger("longrun")


_LEASE_SPEC = (
    f.Field("task_id", f.Kind.NAME),
    f.Field("owner", f.Kind.TEXT),
    f.Field("epoch", f.Kind.INT),
    f.Field("acquired_at", f.Kind.NUMBER),
    f.Field("expires_at", f.Kind.NUMBER),
    f.Field("monotonic_clock", f.Kind.TEXT, optional=True),
    f.Field("monotonic_expires_at", f.Kind.NUMBER, optional=True),
    f.Field("committed_revision", f.Kind.INT),
    f.Field("token", f.Kind.TEXT, optional=True),
    f.Field("holder_lock", f.Kind.TEXT, optional=True),
)
_LEASE_READ_SPEC = (*_LEASE_SPEC[:7], f.Field("committed_revision", f.Kind.INT, optional=True), *_LEASE_SPEC[8:])
"""What a load reads: records written before the committed revision was kept have none."""
_LEASE_FIELDS = frozenset({"schema_version", *(field.name for field in _LEASE_SPEC)})
_FAST = f.fast_check(_LEASE_SPEC)
MAX_TOKEN_CHARS = 128
RELEASED = 0.0
"""The expiry a released lease records: over whatever any clock says (a clock stepped back after a
release must not bring the lease back to life and keep the next owner out)."""

@dataclass(frozen=True, slots=True)
class MonotonicReading:
    """A monotonic clock reading and the timeline it is comparable on (``SystemClock``: this boot of
    this machine, ``boot:<id>``). Readings on one timeline compare; on different ones they do not.
    The engine passes one to the store's lease calls and to backoffs when its clock names its
    timeline (``protocols.TimelineClock``)."""

    timeline: str
    seconds: float

    def __post_init__(self) -> None:
        if not isinstance(self.timeline, str) or not self.timeline:
            raise InvalidInputError(f"monotonic reading: the timeline must be a non-empty string, got {self.timeline!r}")
        if isinstance(self.seconds, bool) or not isinstance(self.seconds, (int, float)) or not math.isfinite(self.seconds):
            raise InvalidInputError(f"monotonic reading: seconds must be a finite number, got {self.seconds!r}")

_BOOT_ID: list[str | None] = []


def boot_clock_id() -> str | None:
    """``"boot:<id>"`` for this boot of this machine (Linux): the timeline of ``time.monotonic()``,
    shared by every process on it. None where the platform does not say."""
    if not _BOOT_ID:
        try:
            with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
                value = handle.read().strip()
        except OSError:
            value = ""
        _BOOT_ID.append("boot:" + value if value else None)
    return _BOOT_ID[0]


@dataclass(frozen=True, slots=True)
class Lease:
    """A grant of one task to one holder until ``expires_at``, fenced by ``epoch`` (see the module
    docstring): the holder writes under it, and a store refuses a write whose epoch is not current."""

    task_id: str
    owner: str
    epoch: int
    acquired_at: float
    expires_at: float
    monotonic_clock: str | None = None
    """The timeline ``monotonic_expires_at`` is on (see the module docstring), if the grant had one."""
    monotonic_expires_at: float | None = None
    committed_revision: int = 0
    """A revision of the task's state known committed (its write had returned) when the store wrote
    this record. The record lives apart from the state, so a state that loads below it was rolled
    back further than a crash can take it (see ``stores.base``). 0: none known."""
    token: str | None = field(default=None, repr=False, compare=False)
    """The grant's secret: only its holder has it (see the module docstring). None in a record read
    by someone else, and in a record written before tokens existed (then the epoch alone fences)."""
    holder_lock: str | None = None
    """The kernel lock the holder keeps for the lease's life (``boot id/device/inode``), if it has one."""

    @property
    def released(self) -> bool:
        """Whether the holder gave the lease up (``release_lease``, or a repair wrote it released)."""
        return self.expires_at == RELEASED

    def __post_init__(self) -> None:
        if not _FAST(self):
            f.check(_LEASE_SPEC, self, "lease record")
        if self.token is not None and not 0 < len(self.token) <= MAX_TOKEN_CHARS:
            raise InvalidInputError(f"lease record: field 'token' must hold 1 to {MAX_TOKEN_CHARS} characters")

    def expired(self, now: float, monotonic: MonotonicReading | None = None) -> bool:
        """Whether the lease has ended for a caller whose wall clock says ``now`` and whose monotonic
        clock reads ``monotonic``: judged on the shared monotonic timeline if there is one."""
        return self.remaining(now, monotonic) <= 0

    def remaining(self, now: float, monotonic: MonotonicReading | None = None) -> float:
        if self.expires_at == RELEASED:
            return 0.0  # given up: over on every clock, however far one was stepped back
        if monotonic is not None and self.monotonic_clock is not None and self.monotonic_expires_at is not None:
            if monotonic.timeline == self.monotonic_clock:
                return self.monotonic_expires_at - monotonic.seconds
            if monotonic.timeline.startswith("boot:") and self.monotonic_clock.startswith("boot:"):
                return 0.0  # granted during an earlier boot of this machine: its holder is gone
        return self.expires_at - now

    def to_json(self) -> dict[str, JSONValue]:
        data: dict[str, JSONValue] = {
            "schema_version": f.RECORD_SCHEMA_VERSION,
            "task_id": self.task_id,
            "owner": self.owner,
            "epoch": self.epoch,
            "acquired_at": self.acquired_at,
            "expires_at": self.expires_at,
        }
        if self.monotonic_clock is not None and self.monotonic_expires_at is not None:
            data["monotonic_clock"] = self.monotonic_clock
            data["monotonic_expires_at"] = self.monotonic_expires_at
        if self.committed_revision:
            data["committed_revision"] = self.committed_revision
        if self.token is not None:
            data["token"] = self.token
        if self.holder_lock is not None:
            data["holder_lock"] = self.holder_lock
        return data

    @classmethod
    def from_json(cls, data: object) -> "Lease":
        """Validate a lease record (see ``_fields`` for the rules; ``schema_version`` may be absent)."""
        what = "lease record"
        d: Mapping[str, Any] = f.require_mapping(data, what)
        f.check_fields(d, _LEASE_FIELDS, what)
        f.check_record_version(d, what)
        if "committed_revision" in d and d["committed_revision"] is None:
            raise CorruptStateError(f"{what}: field 'committed_revision' must be an integer, got NoneType")
        values = f.read(_LEASE_READ_SPEC, d, what)  # a record written before it was kept has none: 0
        values["committed_revision"] = values["committed_revision"] or 0
        values["token"] = _token(d, what)
        return cls(**values)

    def without_token(self) -> "Lease":
        """The record as anyone but its holder may see it."""
        return self if self.token is None else replace(self, token=None)


def _token(d: Mapping[str, Any], what: str) -> str | None:
    token: str | None = f.get_str(d, "token", what, optional=True)
    if token is not None and not 0 < len(token) <= MAX_TOKEN_CHARS:
        raise CorruptStateError(f"{what}: field 'token' must hold 1 to {MAX_TOKEN_CHARS} characters")
    return token


@dataclass(frozen=True, slots=True)
class LeaseRepair:
    """What ``repair_lease`` did: where the damaged record went, and the released lease written."""

    lease: Lease
    """The released record now stored, at the highest epoch recorded anywhere but the lost record."""
    quarantined: str
    """Where the damaged record was moved (a path in the task directory, or a quarantine row)."""
    damage: str
    """Why the record did not validate."""

    @property
    def next_epoch(self) -> int:
        return self.lease.epoch + 1


class LeaseKeeper:
    """Renews a lease every ``interval_s`` seconds of real time until stopped.

    ``renew`` is called with the current lease and returns the renewed one, or raises. The first
    failure stops the keeper and is kept in ``failure``; ``lease`` is always the latest good lease.
    ``on_renewed`` runs after each renewal (the engine reads cancellation there, so that it reaches
    an effect that is running).
    """

    def __init__(
        self,
        lease: Lease,
        renew: Callable[[Lease], Lease],
        interval_s: float,
        monotonic: Callable[[], float] = time.monotonic,
        *,
        on_renewed: Callable[[], None] | None = None,
    ):
        self._lease = lease
        self._on_renewed = on_renewed
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

    def stale(self, ttl_s: float) -> bool:
        """Whether the lease was last granted more than half its ``ttl_s`` ago (on the monotonic
        clock): too old to write under without renewing first, whatever the background thread did."""
        return self._monotonic() - self.renewed_at > ttl_s / 2

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
                log.warning("lease renewal for %s failed: %s", self._lease.task_id, describe_exception(exc))
                self.failure = exc
                return
            with self._lock:
                self._lease = renewed
                self.renewed_at = self._monotonic()
            if self._on_renewed is not None:
                try:
                    self._on_renewed()
                except Exception:  # the lease stays good; the failure is logged with its traceback, not dropped
                    log.exception("after renewing the lease for %s, reading its cancellation failed", renewed.task_id)
