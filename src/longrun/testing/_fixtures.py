"""Fixtures for users' own tests: a fake clock and a fictional local effect target.

``FakeClock`` makes time pass only when told (``advance``, or ``sleep``, which advances instead of
waiting), so backoff, expiry and budgets are tested without real delays.

``OutboxAdapter(path)`` is a target whose effects are lines in a JSON-lines outbox. ``apply``
appends ``{"task_id", "key", "payload_digest", "payload", "epoch", "attempt"}`` and fsyncs; ``observe`` reads
the outbox back. It never hides a duplicate: every apply is a line, so a test counts lines per
key. Like a target that fences, it refuses an apply whose epoch is older than the newest epoch
that applied or observed anything of the same task. It can be told to fail transiently N times, fail permanently, raise after applying (outcome
unknown), answer observations with ``unknown``, or SIGKILL its own process right after the line is durable and before returning, which
is exactly the window where a crash leaves an effect applied but not recorded.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import threading
from collections import Counter
from typing import Any, Collection

from ..adapters import EffectRequest, Observation, Receipt
from ..errors import PermanentError, TransientError

__all__ = ["FakeClock", "OutboxAdapter", "copy_keeping_links", "read_outbox"]


class FakeClock:
    """A clock that moves only when told. Thread-safe.

    ``advance`` and ``sleep`` move the wall clock and the monotonic clock together (time passes);
    ``step`` moves the wall clock alone, as an operator or NTP stepping it does. ``timeline`` names
    the monotonic clock's timeline (``monotonic_id()``), as ``SystemClock`` names this boot; None
    (the default) says readings are comparable with no other clock's, so stores and the runner
    judge leases and backoffs by wall clock.
    """

    def __init__(self, start: float = 1_700_000_000.0, *, timeline: str | None = None):
        self._monotonic = float(start)
        self._wall_offset = 0.0
        self._lock = threading.Lock()
        self._timeline = timeline
        self.sleeps: list[float] = []

    def now(self) -> float:
        with self._lock:
            return self._monotonic + self._wall_offset

    def monotonic(self) -> float:
        """Durations on this clock are what ``advance`` and ``sleep`` made; ``step`` leaves it alone."""
        with self._lock:
            return self._monotonic

    def monotonic_id(self) -> str | None:
        return self._timeline

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._monotonic += seconds

    def step(self, seconds: float) -> None:
        """Step the wall clock by ``seconds`` (either sign) without any time passing."""
        with self._lock:
            self._wall_offset += seconds

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if seconds > 0:
            self.advance(seconds)


def read_outbox(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every line of an outbox, parsed; an empty list if it does not exist."""
    try:
        with open(path, "rb") as handle:
            return [json.loads(line) for line in handle if line.strip()]
    except FileNotFoundError:
        return []


class OutboxAdapter:
    """A fictional local target that appends each applied effect to a JSON-lines outbox."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fail_transient: int = 0,
        fail_permanent: bool = False,
        raise_after_apply: Collection[str] = (),
        kill_after_apply: Collection[str] = (),
        deduplicates: bool = False,
        unobservable: Collection[str] = (),
        unknown_observations: int = 0,
        check_epoch: bool = True,
        cost: float = 0.0,
    ):
        self.path = os.fspath(path)
        self.fail_transient = fail_transient
        self.fail_permanent = fail_permanent
        self.raise_after_apply = frozenset(raise_after_apply)
        self.kill_after_apply = frozenset(kill_after_apply)
        """Step ids (or keys) after whose apply the process SIGKILLs itself."""
        self.deduplicates = deduplicates
        self.unobservable = frozenset(unobservable)
        self.unknown_observations = unknown_observations
        """The first N observations answer ``unknown`` (a target that is briefly unreadable)."""
        self.check_epoch = check_epoch
        self.cost = cost
        self.calls: Counter[str] = Counter()
        self.observe_calls: Counter[str] = Counter()

    def _lines(self) -> list[dict[str, Any]]:
        return read_outbox(self.path)

    def apply(self, request: EffectRequest) -> Receipt:
        self.calls[request.key] += 1
        if self.fail_permanent:
            raise PermanentError(f"outbox refuses {request.key}")
        if self.fail_transient > 0:
            self.fail_transient -= 1
            raise TransientError(f"outbox busy for {request.key}")
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            lines = self._lines()
            if self.check_epoch:
                same_task = (line.get("epoch", 0) for line in lines if line.get("task_id") == request.task_id)
                newest = max(max(same_task, default=0), self._fences().get(request.task_id, 0))
                if request.epoch < newest:  # the target fences stale writers itself, per task
                    raise PermanentError(f"stale epoch {request.epoch} < {newest}: the target fences this write")
            if self.deduplicates and any(line["key"] == request.key for line in lines):
                number = next(i for i, line in enumerate(lines) if line["key"] == request.key)
            else:
                entry = {
                    "task_id": request.task_id,
                    "key": request.key,
                    "payload_digest": request.payload_digest,
                    "payload": request.payload,
                    "epoch": request.epoch,
                    "attempt": request.attempt,
                }
                os.write(fd, (json.dumps(entry, sort_keys=True) + "\n").encode())
                os.fsync(fd)
                number = len(lines)
        finally:
            os.close(fd)
        if request.step_id in self.kill_after_apply or request.key in self.kill_after_apply:
            os.kill(os.getpid(), signal.SIGKILL)
        if request.step_id in self.raise_after_apply or request.key in self.raise_after_apply:
            raise ConnectionError(f"connection dropped after sending {request.key}")
        return Receipt(result={"line": number}, cost=self.cost, evidence=f"outbox line {number}")

    def observe(self, request: EffectRequest) -> Observation:
        self.observe_calls[request.key] += 1
        if self.unknown_observations > 0:
            self.unknown_observations -= 1
            return Observation.unknown(f"outbox briefly unreadable for {request.key}")
        if request.step_id in self.unobservable or request.key in self.unobservable:
            return Observation.unknown(f"outbox cannot be read for {request.key}")
        if self.check_epoch:
            self._raise_fence(request)
        for number, line in enumerate(self._lines()):
            if line.get("key") == request.key:
                return Observation.applied(f"outbox line {number} holds {request.key}", {"line": number})
        return Observation.absent(f"no outbox line holds {request.key}")

    @property
    def fence_path(self) -> str:
        return self.path + ".fence"

    def _fences(self) -> dict[str, int]:
        try:
            with open(self.fence_path) as handle:
                fences: dict[str, int] = json.load(handle)
                return fences
        except FileNotFoundError:
            return {}

    def _raise_fence(self, request: EffectRequest) -> None:
        """Remember the newest epoch that has looked at this task, so an older owner that wakes up
        after a newer one observed "absent" cannot apply behind its back (a target-side fence)."""
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # the same lock apply takes: the check and the raise are atomic
            fences = self._fences()
            if request.epoch > fences.get(request.task_id, 0):
                fences[request.task_id] = request.epoch
                temp = self.fence_path + ".tmp"
                with open(temp, "w") as handle:
                    json.dump(fences, handle)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(temp, self.fence_path)
        finally:
            os.close(fd)

    def counts(self) -> Counter[str]:
        """Outbox lines per effect key: a duplicate shows as a count above 1."""
        return Counter(line["key"] for line in self._lines())


def copy_keeping_links(source: str, target: str) -> None:
    """Copy a task directory as a crash leaves it: two names of one file stay one file.

    ``shutil.copytree`` would turn the JSON store's hard-linked backup into a separate copy, which
    a load rightly takes for a rolled-back file. Tests that snapshot a task tree use this instead.
    """
    copied: dict[tuple[int, int], str] = {}
    for directory, _, names in os.walk(source):
        destination = os.path.join(target, os.path.relpath(directory, source))
        os.makedirs(destination, exist_ok=True)
        for name in names:
            path = os.path.join(directory, name)
            info = os.lstat(path)
            key = (info.st_dev, info.st_ino)
            if key in copied:
                os.link(copied[key], os.path.join(destination, name))
            else:
                shutil.copy2(path, os.path.join(destination, name))
                copied[key] = os.path.join(destination, name)
