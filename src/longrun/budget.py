"""Bounded retry: limits, backoff and the counters that a restart does not reset.

``Limits`` says how far a run may go; ``RetryPolicy`` how it waits between attempts;
``BudgetCounters`` is what has been spent so far. The counters live in the state envelope and are
committed before the attempt they count, so a crash during an attempt can never grant an extra
one. ``exhausted`` returns the first exhausted limit (the run then stops ``limits-exhausted``, recorded
as terminal), and ``RetryPolicy.delay`` gives capped exponential backoff with bounded jitter.

The jitter is drawn from a hash of the effect key and attempt number: it spreads retries of
different effects apart, yet the same attempt always waits the same time, which keeps runs and
tests reproducible.

Time budgets charge *worked* time: seconds a runner held the task and was working on it, measured
on the clock's monotonic clock within one run and summed across runs (``worked_s``). Time between
runs, and waiting within one (for an approval, input, a child, a backoff), is never charged, so a
wall clock stepped between runs, or a person who answers an hour later, spends nothing.
``Backoff`` is a wait scheduled as a duration anchored on the clocks it began by, so a stepped wall
clock neither lengthens it nor, on the same monotonic timeline, shortens it.

Not guaranteed: work since a run's last charge (its last commit, to within ``WORK_CHARGE_STEP_S``)
is not charged if the process dies (the attempt counters, committed before each attempt, still
bound such runs); a clock without ``monotonic()`` measures work by wall clock; a backoff judged
away from its timeline (another boot, a clock with no ``monotonic_id``) ends early if the wall
clock was stepped forward.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, Mapping

from . import _fields as f
from .canonical import JSONValue
from .errors import CorruptStateError, InvalidInputError
from .lease import MonotonicReading

__all__ = ["Backoff", "BudgetCounters", "Limits", "RetryPolicy", "WORK_CHARGE_STEP_S", "describe_wall_gap"]

WORK_CHARGE_STEP_S = 0.1
"""Work is charged to the durable counters in steps of at least this (and in full when a run stops),
so a run of quick effects does not rewrite them on every commit. Limits are judged on the exact
figure; a crash may leave up to this much more uncharged, and no-progress may count up to this much
of the work before a verification."""


def _non_negative(owner: object, name: str, value: object, *, optional: bool, integer: bool = False) -> None:
    if value is None and optional:
        return
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value) or value < 0:
        raise InvalidInputError(f"{type(owner).__name__}.{name} must be a non-negative number, got {value!r}")


@dataclass(frozen=True, slots=True)
class Limits:
    """How far a run may go. ``None`` means unlimited. All counts survive restarts."""

    max_attempts: int = 3
    """Attempts per effect, including the first."""
    max_steps: int | None = None
    """Effect attempts started across the whole run, all restarts included."""
    max_elapsed_s: float | None = None
    """Seconds of work on the run, all runs together (see the module docstring: waiting is not work)."""
    max_cost: float | None = None
    """Sum of ``Receipt.cost`` over every attempt."""
    max_no_progress_s: float | None = None
    """Seconds of work since the last verified effect (or the run's creation); waiting is not work."""
    max_block_s: float = 60.0
    """The longest a single ``run()`` call sleeps for a backoff before returning ``retry-scheduled``."""
    approval_ttl_s: float = 86_400.0
    """How long an approval request stays open."""
    max_failures: int = 5
    """Failures of a durable function's run in a row (its own code raised, or its process died inside
    a step) before the task stops ``failed``; progress (a step settled) starts the count again."""
    deadline_s: float | None = None
    """A wall-clock deadline for the whole task, this many seconds after its first run starts
    (``longrun.deadline``): recorded then, kept across restarts, inherited by its children; when it
    passes the task stops ``deadline-exceeded``. Unlike ``max_elapsed_s`` it counts waiting too."""

    def __post_init__(self) -> None:
        _non_negative(self, "max_attempts", self.max_attempts, optional=False, integer=True)
        if self.max_attempts < 1:
            raise InvalidInputError("Limits.max_attempts must be at least 1")
        _non_negative(self, "max_steps", self.max_steps, optional=True, integer=True)
        for name in ("max_elapsed_s", "max_cost", "max_no_progress_s", "deadline_s"):
            _non_negative(self, name, getattr(self, name), optional=True)
        _non_negative(self, "max_block_s", self.max_block_s, optional=False)
        _non_negative(self, "approval_ttl_s", self.approval_ttl_s, optional=False)
        _non_negative(self, "max_failures", self.max_failures, optional=False, integer=True)
        if self.max_failures < 1:
            raise InvalidInputError("Limits.max_failures must be at least 1")

    def attempts_exhausted(self, key: str, attempts: int, last_error: str | None) -> str | None:
        """Why one more attempt of effect ``key`` is not allowed, or None: the per-effect attempt limit."""
        if attempts >= self.max_attempts:
            why = "no error was recorded" if last_error is None else f"last error: {last_error}"
            return f"effect {key!r} used all {self.max_attempts} attempts ({why})"
        return None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Capped exponential backoff with bounded jitter, and the per-operation deadline."""

    base_delay_s: float = 1.0
    max_delay_s: float = 60.0
    multiplier: float = 2.0
    jitter: float = 0.2
    """Fraction of the delay that is randomised: the wait lies in [delay * (1 - jitter), delay]."""
    deadline_s: float = 300.0
    """Deadline handed to the adapter for one ``apply`` or ``observe`` call."""

    def __post_init__(self) -> None:
        for name in ("base_delay_s", "max_delay_s", "deadline_s"):
            _non_negative(self, name, getattr(self, name), optional=False)
        _non_negative(self, "multiplier", self.multiplier, optional=False)
        if self.multiplier < 1:
            raise InvalidInputError("RetryPolicy.multiplier must be at least 1")
        _non_negative(self, "jitter", self.jitter, optional=False)
        if self.jitter > 1:
            raise InvalidInputError("RetryPolicy.jitter must lie in [0, 1]")

    def delay(self, key: str, attempt: int) -> float:
        """The wait before attempt ``attempt + 1`` of effect ``key`` (``attempt`` >= 1)."""
        if self.base_delay_s == 0:
            return 0.0
        exponent = max(0, attempt - 1)
        ceiling = self.max_delay_s
        # Compare in log space first so a large attempt number cannot overflow a float.
        if exponent * math.log(self.multiplier) < math.log(self.max_delay_s / self.base_delay_s + 1):
            ceiling = min(ceiling, self.base_delay_s * self.multiplier**exponent)
        digest = hashlib.sha256(f"{key}\x00{attempt}".encode()).digest()
        unit = int.from_bytes(digest[:8], "big") / 2**64
        return ceiling * (1.0 - self.jitter * unit)


_COUNTER_SPEC = (
    f.Field("created_at", f.Kind.NUMBER),
    f.Field("first_started_at", f.Kind.NUMBER, optional=True),
    f.Field("attempts_total", f.Kind.INT),
    f.Field("cost_spent", f.Kind.NUMBER),
    f.Field("last_progress_at", f.Kind.NUMBER),
    f.Field("worked_s", f.Kind.NUMBER),
    f.Field("worked_at_progress_s", f.Kind.NUMBER),
)
_COUNTER_READ_SPEC = (*_COUNTER_SPEC[:5], *(f.Field(field.name, field.kind, optional=True) for field in _COUNTER_SPEC[5:]))
"""What a load reads: the worked-time counters may be missing from counters written before them."""
_COUNTER_FIELDS = frozenset(field.name for field in _COUNTER_SPEC)
_FAST = f.fast_check(_COUNTER_SPEC)


@dataclass(frozen=True, slots=True)
class BudgetCounters:
    """What the run has spent. Persisted in every revision; never reset by a restart.

    The timestamps (``created_at``, ``first_started_at``, ``last_progress_at``) are wall-clock
    times for people to read; no limit is judged on them. ``worked_s`` and ``worked_at_progress_s``
    are what the time limits compare (see the module docstring).
    """

    created_at: float
    first_started_at: float | None = None
    attempts_total: int = 0
    cost_spent: float = 0.0
    last_progress_at: float = 0.0
    worked_s: float = 0.0
    """Seconds of work on the run so far, summed over every run (monotonic-clock deltas)."""
    worked_at_progress_s: float = 0.0
    """``worked_s`` when an effect was last verified: work since then is work without progress."""

    def __post_init__(self) -> None:
        if not _FAST(self):
            f.check(_COUNTER_SPEC, self, "budget counters")

    # Built directly rather than with dataclasses.replace: these run on every effect's path.
    def started(self, now: float) -> "BudgetCounters":
        first = self.first_started_at if self.first_started_at is not None else now
        return BudgetCounters(
            self.created_at, first, self.attempts_total + 1, self.cost_spent, self.last_progress_at, self.worked_s, self.worked_at_progress_s
        )

    def spent(self, cost: float) -> "BudgetCounters":
        return BudgetCounters(
            self.created_at, self.first_started_at, self.attempts_total, self.cost_spent + cost, self.last_progress_at,
            self.worked_s, self.worked_at_progress_s,
        )  # fmt: skip

    def worked(self, seconds: float) -> "BudgetCounters":
        """The counters after ``seconds`` more of work (``self`` if none)."""
        if not seconds > 0:
            return self
        return BudgetCounters(
            self.created_at, self.first_started_at, self.attempts_total, self.cost_spent, self.last_progress_at,
            self.worked_s + seconds, self.worked_at_progress_s,
        )  # fmt: skip

    def progressed(self, now: float, pending_s: float = 0.0) -> "BudgetCounters":
        """An effect was verified at wall time ``now``, after ``pending_s`` more seconds of work
        (charged here): the no-progress count starts again."""
        worked = self.worked_s + pending_s if pending_s > 0 else self.worked_s
        return BudgetCounters(self.created_at, self.first_started_at, self.attempts_total, self.cost_spent, now, worked, worked)

    def exhausted(self, limits: Limits, *, pending_s: float = 0.0) -> str | None:
        """The first limit this run has reached before starting one more attempt, or None.

        ``pending_s`` is work done since the counters were last charged (the runner charges at
        each commit); it counts as if charged."""
        if limits.max_steps is not None and self.attempts_total >= limits.max_steps:
            return f"step budget spent: {self.attempts_total} attempts of {limits.max_steps}"
        if limits.max_cost is not None and self.cost_spent >= limits.max_cost:
            return f"cost budget spent: {self.cost_spent:g} of {limits.max_cost:g}"
        worked = self.worked_s + pending_s if pending_s > 0 else self.worked_s
        if limits.max_elapsed_s is not None and worked >= limits.max_elapsed_s:
            return f"elapsed budget spent: {worked:.1f}s of work of {limits.max_elapsed_s:g}s"
        if limits.max_no_progress_s is not None:
            idle = worked - self.worked_at_progress_s
            if idle >= limits.max_no_progress_s:
                return f"no progress for {idle:.1f}s of work (limit {limits.max_no_progress_s:g}s)"
        return None

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "created_at": self.created_at,
            "first_started_at": self.first_started_at,
            "attempts_total": self.attempts_total,
            "cost_spent": self.cost_spent,
            "last_progress_at": self.last_progress_at,
            "worked_s": self.worked_s,
            "worked_at_progress_s": self.worked_at_progress_s,
        }

    @classmethod
    def from_json(cls, data: object) -> "BudgetCounters":
        """Validate counters. Counters written before worked time was kept have no ``worked_s``:
        they load with none recorded. Their wall-clock spans include the waiting these counters
        exclude, and a run that stops ``limits-exhausted`` is over for good, so a guess from them
        must not end it; the attempt, step and cost counters carry over exactly."""
        what = "budget counters"
        d: Mapping[str, Any] = f.require_mapping(data, what)
        f.check_fields(d, _COUNTER_FIELDS, what)
        for name in ("worked_s", "worked_at_progress_s"):
            if name in d and d[name] is None:
                raise CorruptStateError(f"{what}: field {name!r} must be a finite number, got NoneType")
        values = f.read(_COUNTER_READ_SPEC, d, what)
        # Counters written before worked time was kept read as no work yet.
        worked = values["worked_s"] = values["worked_s"] or 0.0
        at_progress = values["worked_at_progress_s"] = values["worked_at_progress_s"] or 0.0
        if not 0 <= at_progress <= worked:
            raise CorruptStateError(f"{what}: worked_at_progress_s ({at_progress!r}) must lie in [0, worked_s ({worked!r})]")
        return cls(**values)


IMPLAUSIBLE_GAP_S = 366 * 86_400.0
"""A wall-clock gap between runs longer than this (a year) is noted as implausible."""


def describe_wall_gap(last_commit_at: float, now: float) -> str:
    """The observation a resuming run records about the wall-clock time since the last commit.

    The gap is evidence, never a charge: whatever it is (hours waiting for a person, a clock
    stepped either way), no budget counts it. A negative or implausibly long gap is named as such."""
    gap = now - last_commit_at
    if gap < 0:
        seen = f"the wall clock reads {-gap:.1f}s before the last commit: it was stepped back, or is behind the clock that wrote it"
    elif gap > IMPLAUSIBLE_GAP_S:
        seen = f"{gap:.0f}s ({gap / 86_400:.0f} days) of wall time since the last commit: implausible, the wall clock may be wrong"
    else:
        seen = f"{gap:.1f}s of wall time since the last commit"
    return seen + "; time between runs is not charged to any budget"


_BACKOFF_SPEC = (
    f.Field("duration_s", f.Kind.NUMBER),
    f.Field("scheduled_at", f.Kind.NUMBER),
    f.Field("monotonic_clock", f.Kind.TEXT, optional=True),
    f.Field("monotonic_at", f.Kind.NUMBER, optional=True),
)
_BACKOFF_FIELDS = frozenset(field.name for field in _BACKOFF_SPEC)


@dataclass(frozen=True, slots=True)
class Backoff:
    """A wait before an effect's next attempt: a duration, anchored on the clocks it began by.

    Judged by a run whose monotonic clock is on the timeline it was scheduled on (``SystemClock``:
    the same boot), the wait is measured there, so a wall clock stepped either way changes nothing.
    Judged elsewhere, it is measured by wall clock from ``scheduled_at`` but never as more than
    ``duration_s`` from now: a clock stepped back cannot lengthen it. Not guaranteed there: a
    clock stepped forward is indistinguishable from time passing, so the retry may come early
    (a retry follows only a failure that left the effect absent, so early costs a call, not safety).
    """

    duration_s: float
    scheduled_at: float
    """Wall-clock time the wait began."""
    monotonic_clock: str | None = None
    """The timeline of ``monotonic_at`` (``SystemClock``: this boot), if the scheduling clock named one."""
    monotonic_at: float | None = None

    def __post_init__(self) -> None:
        f.check(_BACKOFF_SPEC, self, "backoff")
        problem = _backoff_problem(self.duration_s, self.monotonic_clock, self.monotonic_at)
        if problem is not None:
            raise InvalidInputError(f"backoff: {problem}")

    @classmethod
    def begin(cls, duration_s: float, now: float, monotonic: MonotonicReading | None = None) -> "Backoff":
        if monotonic is None:
            return cls(duration_s, now)
        return cls(duration_s, now, monotonic.timeline, monotonic.seconds)

    @property
    def until(self) -> float:
        """The wall-clock time it ends, as scheduled (for people; see ``remaining``)."""
        return self.scheduled_at + self.duration_s

    def measured_on(self, monotonic: MonotonicReading | None) -> bool:
        """Whether a reading ``monotonic`` is on this wait's timeline, so measures it exactly."""
        return monotonic is not None and self.monotonic_clock is not None and monotonic.timeline == self.monotonic_clock

    def remaining(self, now: float, monotonic: MonotonicReading | None = None) -> float:
        """Seconds still to wait for a caller whose clocks read ``now`` and ``monotonic``; 0 when over."""
        if self.measured_on(monotonic) and self.monotonic_at is not None:
            assert monotonic is not None
            waited = monotonic.seconds - self.monotonic_at
        else:
            waited = now - self.scheduled_at
        return min(self.duration_s, max(0.0, self.duration_s - waited))

    def resumed(self, now: float, monotonic: MonotonicReading | None = None) -> "Backoff":
        """What is left of this wait, anchored on the clocks of a run that resumes it at ``now``:
        later runs measure from here, on this timeline when they share it."""
        return Backoff.begin(self.remaining(now, monotonic), now, monotonic)

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "duration_s": self.duration_s,
            "scheduled_at": self.scheduled_at,
            "monotonic_clock": self.monotonic_clock,
            "monotonic_at": self.monotonic_at,
        }

    @classmethod
    def from_json(cls, data: object) -> "Backoff":
        what = "backoff"
        d: Mapping[str, Any] = f.require_mapping(data, what)
        f.check_fields(d, _BACKOFF_FIELDS, what)
        values = f.read(_BACKOFF_SPEC, d, what)
        problem = _backoff_problem(values["duration_s"], values["monotonic_clock"], values["monotonic_at"])
        if problem is not None:
            raise CorruptStateError(f"{what}: {problem}")
        return cls(**values)


def _backoff_problem(duration_s: object, clock: object, reading: object) -> str | None:
    """What a backoff's fields may not be, beyond their types: one rule for writing and reading."""
    if isinstance(duration_s, (int, float)) and duration_s < 0:
        return f"field 'duration_s' must be >= 0, got {duration_s!r}"
    if (clock is None) != (reading is None):
        return "monotonic_clock and monotonic_at come together or not at all"
    return None
