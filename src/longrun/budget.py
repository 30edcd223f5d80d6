"""Bounded retry: limits, backoff and the counters that a restart does not reset.

``Limits`` says how far a run may go; ``RetryPolicy`` how it waits between attempts;
``BudgetCounters`` is what has been spent so far. The counters live in the state envelope and are
committed before the attempt they count, so a crash during an attempt can never grant an extra
one. ``check`` returns the first exhausted limit (the run then stops ``limits-exhausted``, recorded
as terminal), and ``RetryPolicy.delay`` gives capped exponential backoff with bounded jitter.

The jitter is drawn from a hash of the effect key and attempt number: it spreads retries of
different effects apart, yet the same attempt always waits the same time, which keeps runs and
tests reproducible. Not guaranteed: wall-clock precision; times come from the injected clock.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, Mapping

from . import _fields as f
from .canonical import JSONValue
from .errors import InvalidInputError

__all__ = ["BudgetCounters", "Limits", "RetryPolicy"]


def _non_negative(owner: object, name: str, value: object, *, optional: bool, integer: bool = False) -> None:
    if value is None and optional:
        return
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value) or value < 0:  # type: ignore[arg-type]
        raise InvalidInputError(f"{type(owner).__name__}.{name} must be a non-negative number, got {value!r}")


@dataclass(frozen=True, slots=True)
class Limits:
    """How far a run may go. ``None`` means unlimited. All counts survive restarts."""

    max_attempts: int = 3
    """Attempts per effect, including the first."""
    max_steps: int | None = None
    """Effect attempts started across the whole run, all restarts included."""
    max_elapsed_s: float | None = None
    """Seconds since the run's first effect started."""
    max_cost: float | None = None
    """Sum of ``Receipt.cost`` over every attempt."""
    max_no_progress_s: float | None = None
    """Seconds since the last revision that verified an effect (or created the run)."""
    max_block_s: float = 60.0
    """The longest a single ``run()`` call sleeps for a backoff before returning ``retry-scheduled``."""
    approval_ttl_s: float = 86_400.0
    """How long an approval request stays open."""

    def __post_init__(self) -> None:
        _non_negative(self, "max_attempts", self.max_attempts, optional=False, integer=True)
        if self.max_attempts < 1:
            raise InvalidInputError("Limits.max_attempts must be at least 1")
        _non_negative(self, "max_steps", self.max_steps, optional=True, integer=True)
        for name in ("max_elapsed_s", "max_cost", "max_no_progress_s"):
            _non_negative(self, name, getattr(self, name), optional=True)
        _non_negative(self, "max_block_s", self.max_block_s, optional=False)
        _non_negative(self, "approval_ttl_s", self.approval_ttl_s, optional=False)


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
)
_COUNTER_FIELDS = frozenset(field.name for field in _COUNTER_SPEC)
_FAST = f.fast_check(_COUNTER_SPEC)


@dataclass(frozen=True, slots=True)
class BudgetCounters:
    """What the run has spent. Persisted in every revision; never reset by a restart."""

    created_at: float
    first_started_at: float | None = None
    attempts_total: int = 0
    cost_spent: float = 0.0
    last_progress_at: float = 0.0

    def __post_init__(self) -> None:
        if not _FAST(self):
            f.check(_COUNTER_SPEC, self, "budget counters")

    # Built directly rather than with dataclasses.replace: these run on every effect's path.
    def started(self, now: float) -> "BudgetCounters":
        first = self.first_started_at if self.first_started_at is not None else now
        return BudgetCounters(self.created_at, first, self.attempts_total + 1, self.cost_spent, self.last_progress_at)

    def spent(self, cost: float) -> "BudgetCounters":
        return BudgetCounters(self.created_at, self.first_started_at, self.attempts_total, self.cost_spent + cost, self.last_progress_at)

    def progressed(self, now: float) -> "BudgetCounters":
        return BudgetCounters(self.created_at, self.first_started_at, self.attempts_total, self.cost_spent, now)

    def exhausted(self, limits: Limits, now: float) -> str | None:
        """The first limit this run has reached before starting one more attempt, or None."""
        if limits.max_steps is not None and self.attempts_total >= limits.max_steps:
            return f"step budget spent: {self.attempts_total} attempts of {limits.max_steps}"
        if limits.max_cost is not None and self.cost_spent >= limits.max_cost:
            return f"cost budget spent: {self.cost_spent:g} of {limits.max_cost:g}"
        if limits.max_elapsed_s is not None and self.first_started_at is not None:
            elapsed = now - self.first_started_at
            if elapsed >= limits.max_elapsed_s:
                return f"elapsed budget spent: {elapsed:.1f}s of {limits.max_elapsed_s:g}s since the first effect"
        if limits.max_no_progress_s is not None:
            idle = now - self.last_progress_at
            if idle >= limits.max_no_progress_s:
                return f"no progress for {idle:.1f}s (limit {limits.max_no_progress_s:g}s)"
        return None

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "created_at": self.created_at,
            "first_started_at": self.first_started_at,
            "attempts_total": self.attempts_total,
            "cost_spent": self.cost_spent,
            "last_progress_at": self.last_progress_at,
        }

    @classmethod
    def from_json(cls, data: object) -> "BudgetCounters":
        what = "budget counters"
        d: Mapping[str, Any] = f.require_mapping(data, what)
        f.check_fields(d, _COUNTER_FIELDS, what)
        return cls(**f.read(_COUNTER_SPEC, d, what))
