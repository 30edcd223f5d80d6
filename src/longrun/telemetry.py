"""What a run records about itself for people and scrapers, not for replay: the progress a durable
function reports (``ProgressReport``) and how long its effects took (``EffectLatency``).

Both are state (a task's ``RunState`` holds them, committed with its revisions, read back by any
process after any restart) and neither is a step: no record of the ledger, no part of the plan
digest, nothing a replay compares. A state written before them has neither (the fields are
optional and written only when set, so such a state encodes exactly as before).

``ProgressReport`` holds the latest point a function reported (``done`` of ``total``, a note, when)
and one earlier point to measure the rate against: ``then`` moves the earlier point up to the
latest one once that one is ``RATE_SPAN_S`` old, so the rate is measured over the last few seconds
of reports (at least one reporting interval, at most about ``RATE_SPAN_S`` plus one), and counting
down (a new pass) starts the measure again. The time left is what remains of ``total`` at that rate.

``EffectLatency`` is a histogram per action of the time from an attempt's start to its
verification (fixed bounds, ``LATENCY_BOUNDS`` seconds). A task adds one observation per verified
effect whose start it saw: the engine measures from the attempt's start as recorded; after a
restart, from the record's last recorded move (a lower bound). Summed over tasks it is what
``longrun metrics`` exports as ``longrun_effect_latency_seconds``. A run notes its latencies as
plain numbers and adds them to the state's histogram at most once every ``LATENCY_FOLD_S``, and at
its stop: the histogram is built and written once a second, not on every effect's commit.

Not guaranteed: a rate that means much for a function whose units of work take very different
times, or across a pause of the run (the rate counts calendar time between the two points); the
latencies a run noted in the last ``LATENCY_FOLD_S`` before its process died (they are telemetry,
not the ledger: the effects themselves are recorded with every commit).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from . import _fields as f
from .canonical import JSONValue
from .errors import CorruptStateError, InvalidInputError

__all__ = ["LATENCY_BOUNDS", "LATENCY_FOLD_S", "MAX_NOTE_CHARS", "RATE_SPAN_S", "EffectLatency", "ProgressReport"]

RATE_SPAN_S = 5.0
"""How old the latest reported point must be before it becomes the one the rate is measured from."""
MAX_NOTE_CHARS = 500
"""The longest note ``run.progress`` records."""
LATENCY_BOUNDS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
"""The upper bounds (seconds) of the effect latency buckets; a last bucket holds what is above."""
LATENCY_FOLD_S = 1.0
"""How often, at most, a run adds the latencies it noted to its state's histogram (and at its stop)."""
MAX_ACTIONS = 1000
"""The most actions one task's latency histogram holds (a state stays bounded)."""

_PROGRESS_SPEC = (
    f.Field("done", f.Kind.NUMBER),
    f.Field("total", f.Kind.NUMBER, optional=True),
    f.Field("note", f.Kind.TEXT, optional=True),
    f.Field("at", f.Kind.NUMBER),
    f.Field("since_done", f.Kind.NUMBER, optional=True),
    f.Field("since_at", f.Kind.NUMBER, optional=True),
)
"""The one schema of a progress report: what ``from_json`` reads and the constructor checks."""
_PROGRESS_FIELDS = frozenset(item.name for item in _PROGRESS_SPEC)


def _progress_problem(report: "ProgressReport") -> str | None:
    if report.done < 0:
        return f"done must be >= 0, got {report.done!r}"
    if report.total is not None and report.total < 0:
        return f"total must be >= 0, got {report.total!r}"
    if report.note is not None and len(report.note) > MAX_NOTE_CHARS:
        return f"the note is {len(report.note)} characters, over {MAX_NOTE_CHARS}"
    if (report.since_done is None) != (report.since_at is None):
        return "since_done and since_at are given together or not at all"
    if report.since_at is not None and report.since_at > report.at:
        return "the earlier point (since_at) is later than the latest one"
    return None


@dataclass(frozen=True, slots=True)
class ProgressReport:
    """The progress a durable function reported with ``run.progress(done, total, note)``.

    As JSON, ``{"done", "total", "note", "at", "since_done", "since_at"}``: the latest point and
    the earlier point the rate is measured from (None until there is one)."""

    done: float
    total: float | None
    note: str | None
    at: float
    """When the latest point was reported, by the run's clock (seconds since the epoch)."""
    since_done: float | None = None
    since_at: float | None = None

    def __post_init__(self) -> None:
        for name in ("done", "total", "since_done"):  # bools are numbers to Python, not to a reader
            if isinstance(getattr(self, name), bool):
                raise InvalidInputError(f"progress report: {name} must be a number, got a bool")
        f.check(_PROGRESS_SPEC, self, "progress report")
        problem = _progress_problem(self)
        if problem is not None:
            raise InvalidInputError(f"progress report: {problem}")

    @classmethod
    def first(cls, done: float, total: float | None, note: str | None, at: float) -> "ProgressReport":
        return cls(done, total, note, at)

    def then(self, done: float, total: float | None, note: str | None, at: float) -> "ProgressReport":
        """The report after this one, with the earlier point moved up if this one is old enough
        (``RATE_SPAN_S``), or dropped when the count went down (a new pass starts the rate again)."""
        if done < self.done or at < self.at:
            return ProgressReport(done, total, note, at)
        if self.since_at is None or at - self.at >= RATE_SPAN_S or self.at - self.since_at >= RATE_SPAN_S:
            return ProgressReport(done, total, note, at, self.done, self.at)
        return ProgressReport(done, total, note, at, self.since_done, self.since_at)

    @property
    def rate(self) -> float | None:
        """Units done per second between the two points; None without two points apart in time."""
        if self.since_at is None or self.since_done is None or self.at <= self.since_at:
            return None
        return (self.done - self.since_done) / (self.at - self.since_at)

    @property
    def eta_s(self) -> float | None:
        """Seconds until ``total`` at ``rate``; None without a total or a positive rate."""
        rate = self.rate
        if self.total is None or rate is None or rate <= 0:
            return None
        return max(0.0, self.total - self.done) / rate

    @property
    def fraction(self) -> float | None:
        if self.total is None:
            return None
        return min(1.0, self.done / self.total) if self.total else 1.0

    def label(self) -> str:
        """``45/100`` (or ``45`` without a total), as ``ls`` and ``watch`` show it."""
        done = _number_text(self.done)
        return f"{done}/{_number_text(self.total)}" if self.total is not None else done

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "done": self.done,
            "total": self.total,
            "note": self.note,
            "at": self.at,
            "since_done": self.since_done,
            "since_at": self.since_at,
        }

    def summary_json(self) -> dict[str, JSONValue]:
        """What ``ls --json``, ``status --json`` and ``watch --json`` show: the point, rate and time left."""
        return {"done": self.done, "total": self.total, "note": self.note, "at": self.at, "rate": self.rate, "eta_s": self.eta_s}

    @classmethod
    def from_json(cls, data: object) -> "ProgressReport":
        what = "progress report"
        d: Mapping[str, Any] = f.require_mapping(data, what)
        f.check_fields(d, _PROGRESS_FIELDS, what)
        values = f.read(_PROGRESS_SPEC, d, what)
        report = object.__new__(cls)
        for name, value in values.items():
            object.__setattr__(report, name, value)
        problem = _progress_problem(report)
        if problem is not None:
            raise CorruptStateError(f"{what}: {problem}")
        return report


def _number_text(value: float | None) -> str:
    if value is None:
        return "?"
    return str(int(value)) if value == int(value) and abs(value) < 1e15 else f"{value:g}"


@dataclass(frozen=True, slots=True)
class EffectLatency:
    """Per action, how many verified effects took at most each of ``bounds`` seconds from an
    attempt's start, and the sum of those seconds.

    As JSON, ``{"bounds": [...], "actions": {action: {"counts": [...], "sum": s}}}``, ``counts``
    per bucket (not cumulative), one more than ``bounds`` (the last: above the largest bound)."""

    bounds: tuple[float, ...] = LATENCY_BOUNDS
    counts: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    sums: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problem = _latency_problem(self.bounds, self.counts, self.sums)
        if problem is not None:
            raise InvalidInputError(f"effect latency: {problem}")

    def observed(self, action: str, seconds: float) -> "EffectLatency":
        """This histogram with one more observation (a new record: the state's is replaced)."""
        return self.observed_many(((action, seconds),))

    def observed_many(self, observations: Iterable[tuple[str, float]]) -> "EffectLatency":
        """This histogram with each ``(action, seconds)`` of ``observations`` added: one new record
        however many there are (a run adds those it noted since the last time at once)."""
        bounds = self.bounds
        counts = dict(self.counts)
        sums = dict(self.sums)
        rows: dict[str, list[int]] = {}
        for action, seconds in observations:
            seconds = max(0.0, float(seconds)) if math.isfinite(seconds) else 0.0
            row = rows.get(action)
            if row is None:
                if action not in counts and len(counts) >= MAX_ACTIONS:
                    continue
                if not isinstance(action, str) or not action:
                    raise InvalidInputError("effect latency: an action must be a non-empty string")
                row = rows[action] = list(counts.get(action, (0,) * (len(bounds) + 1)))
                counts[action] = ()  # a placeholder until the row is done, so MAX_ACTIONS counts it
            bucket = bisect.bisect_left(bounds, seconds)
            if row[bucket] >= f.MAX_INT:
                raise InvalidInputError(f"effect latency: action {action!r:.60}: counts must be integers >= 0")
            row[bucket] += 1
            sums[action] = total = sums.get(action, 0.0) + seconds
            if not math.isfinite(total):
                raise InvalidInputError(f"effect latency: action {action!r:.60}: sum must be a finite number >= 0")
        if not rows:
            return self
        for action, row in rows.items():
            counts[action] = tuple(row)
        # This record was checked when it was made; the steps above keep every rule
        # ``_latency_problem`` checks (a count one more, a finite sum larger by a finite seconds >= 0),
        # so the copy is not checked again over every bucket of every action.
        made = object.__new__(EffectLatency)
        object.__setattr__(made, "bounds", bounds)
        object.__setattr__(made, "counts", counts)
        object.__setattr__(made, "sums", sums)
        return made

    def count(self, action: str) -> int:
        return sum(self.counts.get(action, ()))

    def to_json(self) -> dict[str, JSONValue]:
        actions: dict[str, JSONValue] = {
            action: {"counts": list(self.counts[action]), "sum": self.sums.get(action, 0.0)} for action in sorted(self.counts)
        }
        return {"bounds": list(self.bounds), "actions": actions}

    @classmethod
    def from_json(cls, data: object) -> "EffectLatency":
        what = "effect latency"
        d = f.require_mapping(data, what)
        f.check_fields(d, frozenset({"bounds", "actions"}), what)
        bounds = d.get("bounds")
        actions = d.get("actions")
        if not isinstance(bounds, list) or not all(f.finite_float(item) is not None for item in bounds):
            raise CorruptStateError(f"{what}: field 'bounds' must be a list of finite numbers")
        if not isinstance(actions, dict):
            raise CorruptStateError(f"{what}: field 'actions' must be a JSON object")
        counts: dict[str, tuple[int, ...]] = {}
        sums: dict[str, float] = {}
        for action, entry in actions.items():
            row = f.require_mapping(entry, f"{what} of action {action!r:.60}")
            f.check_fields(row, frozenset({"counts", "sum"}), f"{what} of action {action!r:.60}")
            listed, total = row.get("counts"), f.finite_float(row.get("sum"))
            if not isinstance(listed, list) or any(type(item) is not int for item in listed) or total is None:
                raise CorruptStateError(f"{what} of action {action!r:.60}: counts must be integers and sum a finite number")
            counts[action] = tuple(listed)
            sums[action] = total
        read_bounds = tuple(float(item) for item in bounds)
        problem = _latency_problem(read_bounds, counts, sums)
        if problem is not None:
            raise CorruptStateError(f"{what}: {problem}")
        return cls(read_bounds, counts, sums)


def _latency_problem(bounds: tuple[float, ...], counts: Mapping[str, tuple[int, ...]], sums: Mapping[str, float]) -> str | None:
    if not isinstance(bounds, tuple) or not bounds or any(
        isinstance(item, bool) or not isinstance(item, (int, float)) or not math.isfinite(item) for item in bounds
    ):
        return "bounds must be a non-empty tuple of finite numbers"
    if any(later <= earlier for earlier, later in zip(bounds, bounds[1:])):
        return "bounds must increase"
    if not isinstance(counts, Mapping) or not isinstance(sums, Mapping):
        return "counts and sums must be mappings by action"
    if set(counts) != set(sums):
        return "counts and sums must name the same actions"
    if len(counts) > MAX_ACTIONS:
        return f"more than {MAX_ACTIONS} actions"
    for action, row in counts.items():
        if not isinstance(action, str) or not action:
            return "an action must be a non-empty string"
        if not isinstance(row, tuple) or len(row) != len(bounds) + 1:
            return f"action {action!r:.60} needs {len(bounds) + 1} counts"
        if any(isinstance(item, bool) or not isinstance(item, int) or item < 0 or item > f.MAX_INT for item in row):
            return f"action {action!r:.60}: counts must be integers >= 0"
        total = sums[action]
        if isinstance(total, bool) or not isinstance(total, (int, float)) or not math.isfinite(total) or total < 0:
            return f"action {action!r:.60}: sum must be a finite number >= 0"
    return None
