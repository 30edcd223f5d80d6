"""Metrics of a store's tasks, in the Prometheus text exposition format, from the standard library.

``collect(store, fleet)`` reads every task's state (read-only: no lease, nothing moved) and, if a
fleet is given (``stores.queue.TaskQueue``, or anything with its ``workers`` and ``entries``), its
workers and queue, and returns a frozen ``MetricsSnapshot``; ``render(snapshot)`` writes it as the
text format 0.0.4 (``# HELP``, ``# TYPE``, one sample a line, label values escaped). What
``longrun metrics STORE`` prints, ``longrun console`` serves at ``/metrics`` and ``longrun worker
--metrics-port`` serves to a scraper.

The counters are derived from the recorded ledgers, not counted in a process: an effect's attempts,
its verification and its observation are in its record, so every process that reads the store
gives the same numbers, after any restart. They fall only when tasks are deleted (a scraper reads
that as a counter reset). The effect latency histogram sums what each task recorded
(``RunState.effect_latency``); the run duration histogram is computed from the states of the tasks
that ended (first revision to the last).

Families (each with its HELP and TYPE lines)::

    longrun_tasks{status,function}                              gauge
    longrun_tasks_failed{function,error_type}                   gauge
    longrun_step_failures_total{function,error_type}            counter  steps recorded failed (a call that raised, ...)
    longrun_effects{action,state}                               gauge
    longrun_effects_applied_total{action}                       counter  attempts started
    longrun_effects_verified_total{action}                      counter
    longrun_effects_uncertain_total{action}                     counter  outcomes known by observation only
    longrun_effects_retried_total{action}                       counter  attempts after the first
    longrun_pending_requests{kind}                              gauge    approvals and questions
    longrun_pending_request_oldest_age_seconds{kind}            gauge
    longrun_queue_depth{function}                               gauge    due and not claimed (fleet)
    longrun_queue_lag_seconds{function}                         gauge    how long the oldest due task waits
    longrun_workers_alive, longrun_workers_known                gauge    (fleet)
    longrun_worker_tasks_held{worker}                           gauge    alive workers
    longrun_task_progress_done / _total{task,function}          gauge    run.progress of unfinished tasks
    longrun_task_progress_rate{task,function}                   gauge    units per second
    longrun_task_progress_remaining_seconds{task,function}      gauge    time left at that rate
    longrun_run_duration_seconds{function}                      histogram
    longrun_effect_latency_seconds{action}                      histogram
    longrun_collect_errors                                      gauge    tasks whose state could not be read

``function`` is the durable function's name, empty for a declared plan or a session; ``status`` is
a run status, ``new``, ``DAMAGED`` or ``UNREADABLE`` (as ``longrun ls`` says).

``collect(store, ledgers=False)`` (``longrun metrics --summaries``) reads the tasks by status and
function, the run durations and the collect errors from the summary rows instead, and loads only
the failed tasks, those waiting on a person and the unfinished ones that have run; the effect
families, step failures and effect latency need every ledger and are left out.

One concept, so one module, longer than most: collecting the metrics (from the states, or from the
summary rows) and rendering them, every family's reading beside its declaration.

Not guaranteed: a consistent view across tasks (each is read after the other), or a cheap scrape of
a store with many large ledgers (each scrape loads every state: scrape less often, or scrape the
summaries).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence

from .canonical import JSONValue
from .contract import INTERNAL_PREFIX, is_internal
from .envelope import RunState
from .errors import CorruptStateError, LongrunError
from .ledger import EffectRecord, EffectState
from .outcome import TERMINAL, Status
from .progress import pending_of
from .protocols import Store, SummaryStore
from .summary import TaskSummary
from .telemetry import LATENCY_BOUNDS, EffectLatency

__all__ = [
    "CONTENT_TYPE",
    "DURATION_BOUNDS",
    "FAILED_STATUSES",
    "FleetView",
    "LEDGER_FAMILIES",
    "MetricFamily",
    "MetricsSnapshot",
    "Sample",
    "collect",
    "failure_of",
    "function_of",
    "render",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The HTTP content type of ``render``'s text."""
DURATION_BOUNDS: tuple[float, ...] = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 43200.0, 86400.0, 604800.0)
"""The upper bounds (seconds) of the run duration buckets."""
FUNCTION_STEP = INTERNAL_PREFIX + "function"
"""A durable function's own record, whose payload names the function."""
FAILED_STATUSES = frozenset(
    {Status.LIMITS_EXHAUSTED, Status.DEADLINE_EXCEEDED, Status.BLOCKED, Status.UNSAFE_TO_CONTINUE, Status.STATE_UNRECOVERABLE}
)
"""The statuses ``longrun_tasks_failed`` counts: a run that ended, or stopped, on an error."""


class WorkerView(Protocol):
    """What the metrics read of a worker's row (``stores.queue.WorkerRecord``)."""

    @property
    def name(self) -> str: ...

    @property
    def alive(self) -> bool: ...

    @property
    def running(self) -> int: ...


class QueueView(Protocol):
    """What the metrics read of a queue row (``stores.queue.QueueEntry``)."""

    @property
    def function(self) -> str: ...

    @property
    def due_in_s(self) -> float | None: ...

    @property
    def claimed_by(self) -> str | None: ...


class FleetView(Protocol):
    """A store's fleet tables as the metrics read them (``stores.queue.TaskQueue``)."""

    def workers(self) -> Sequence[WorkerView]: ...

    def entries(self) -> Sequence[QueueView]: ...


@dataclass(frozen=True, slots=True)
class Sample:
    """One line of a family: ``name`` is the family's name plus a suffix (``_bucket``, ``_sum``, ...)."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


@dataclass(frozen=True, slots=True)
class MetricFamily:
    name: str
    kind: str
    """``gauge``, ``counter`` or ``histogram``."""
    help: str
    samples: tuple[Sample, ...]


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """Every family, as collected at ``collected_at`` (seconds since the epoch)."""

    families: tuple[MetricFamily, ...]
    collected_at: float

    def family(self, name: str) -> MetricFamily:
        for item in self.families:
            if item.name == name:
                return item
        raise KeyError(name)

    def to_json(self) -> dict[str, JSONValue]:
        """``{collected_at, families: [{name, type, help, samples: [{name, labels, value}]}]}``; a
        value that JSON cannot hold (an infinite bound never is one: bounds are labels) as None."""
        families: list[JSONValue] = []
        for item in self.families:
            samples: list[JSONValue] = [
                {"name": sample.name, "labels": dict(sample.labels), "value": sample.value if math.isfinite(sample.value) else None}
                for sample in item.samples
            ]
            families.append({"name": item.name, "type": item.kind, "help": item.help, "samples": samples})
        return {"collected_at": self.collected_at, "families": families}

    def value(self, name: str, **labels: str) -> float | None:
        """The value of the sample ``name`` with exactly these labels, or None (for tests and tools)."""
        wanted = tuple(sorted(labels.items()))
        for item in self.families:
            for sample in item.samples:
                if sample.name == name and tuple(sorted(sample.labels)) == wanted:
                    return sample.value
        return None


def function_of(state: RunState) -> str:
    """The durable function a task runs, or ``""`` for a declared plan or a session."""
    record = state.effects.get(FUNCTION_STEP)
    name = record.payload.get("function") if record is not None else None
    return name if isinstance(name, str) else ""


def failure_of(state: RunState) -> str | None:
    """The error type of a task that failed (``longrun_tasks_failed``), or None if it did not.

    The one place that says what a failure is: a status of ``FAILED_STATUSES``, typed by the
    failed record that stopped it (the ``type`` a call's or a child's recorded failure names; an
    effect fails only on ``PermanentError``), else by the status itself (``limits-exhausted``,
    ``unsafe-to-continue``, ...)."""
    if state.status not in FAILED_STATUSES:
        return None
    for record in reversed(list(state.effects.values())):
        if record.state is EffectState.FAILED:
            return _error_type(record)
    return state.status.value


def _error_type(record: EffectRecord) -> str:
    """The exception type a failed record names: a call's or a child's recorded ``type``; an
    effect fails only on ``PermanentError``."""
    result = record.result
    if isinstance(result, dict) and isinstance(result.get("type"), str) and result["type"]:
        return str(result["type"])
    return "PermanentError"


class _Families:
    """Families under construction, in the order first named."""

    def __init__(self) -> None:
        self._kinds: dict[str, tuple[str, str]] = {}
        self._values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}

    def declare(self, name: str, kind: str, help: str) -> None:
        self._kinds[name] = (kind, help)
        self._values.setdefault(name, {})

    def add(self, family: str, value: float, *, suffix: str = "", **labels: str) -> None:
        key = (family + suffix, tuple(sorted(labels.items())))
        values = self._values[family]
        values[key] = values.get(key, 0.0) + value

    def set(self, family: str, value: float, *, suffix: str = "", **labels: str) -> None:
        self._values[family][(family + suffix, tuple(sorted(labels.items())))] = value

    def maximum(self, family: str, value: float, **labels: str) -> None:
        key = (family, tuple(sorted(labels.items())))
        values = self._values[family]
        values[key] = max(values.get(key, value), value)

    def histogram(self, family: str, bounds: Sequence[float], counts: Sequence[float], total: float, **labels: str) -> None:
        """Add a histogram's buckets (``counts`` per bucket, not cumulative, one more than ``bounds``)."""
        running = 0.0
        for bound, count in zip((*bounds, math.inf), counts):
            running += count
            self.add(family, running, suffix="_bucket", le=_number(bound), **labels)
        self.add(family, total, suffix="_sum", **labels)
        self.add(family, running, suffix="_count", **labels)

    def build(self) -> tuple[MetricFamily, ...]:
        families = []
        for name, (kind, help) in self._kinds.items():
            samples = tuple(Sample(sample, labels, value) for (sample, labels), value in self._values[name].items())
            families.append(MetricFamily(name, kind, help, samples))
        return tuple(families)


LEDGER_FAMILIES = frozenset({
    "longrun_step_failures_total", "longrun_effects", "longrun_effects_applied_total", "longrun_effects_verified_total",
    "longrun_effects_uncertain_total", "longrun_effects_retried_total", "longrun_effect_latency_seconds",
})  # fmt: skip
"""The families only every task's ledger answers: left out of ``collect(ledgers=False)``."""
_LOADED_FOR = frozenset({*(status.value for status in FAILED_STATUSES), Status.AWAITING_APPROVAL.value, Status.AWAITING_INPUT.value})
"""Summary statuses whose task ``collect(ledgers=False)`` loads: a failure's error type, a pending request."""
_NOT_LOADED = frozenset({*(status.value for status in TERMINAL), Status.QUEUED.value, "new", "unreadable"})
"""Summary statuses whose task it does not load otherwise (an unfinished task is loaded for its progress report)."""


def _declare(families: _Families, *, ledgers: bool = True) -> None:
    for name, kind, help in (
        ("longrun_tasks", "gauge", "Tasks in the store by status and durable function (empty for a plan or a session)."),
        ("longrun_tasks_failed", "gauge", "Tasks whose run ended or stopped on an error, by function and error type."),
        ("longrun_step_failures_total", "counter", "Steps recorded as failed (a call or child that raised, an effect refused for good), by function and error type."),
        ("longrun_effects", "gauge", "Effect records by action and ledger state."),
        ("longrun_effects_applied_total", "counter", "Apply attempts started, by action, from the recorded ledgers."),
        ("longrun_effects_verified_total", "counter", "Effects verified, by action, from the recorded ledgers."),
        ("longrun_effects_uncertain_total", "counter", "Effects whose outcome was uncertain: uncertain now, or verified by observation alone, by action."),
        ("longrun_effects_retried_total", "counter", "Apply attempts after an effect's first, by action."),
        ("longrun_pending_requests", "gauge", "Approval requests and questions waiting for a person, by kind."),
        ("longrun_pending_request_oldest_age_seconds", "gauge", "How long the oldest pending request of each kind has waited."),
        ("longrun_queue_depth", "gauge", "Fleet tasks due now and not claimed by a worker, by function."),
        ("longrun_queue_lag_seconds", "gauge", "How long past its due time the oldest due, unclaimed task has waited, by function."),
        ("longrun_workers_alive", "gauge", "Fleet workers whose heartbeat is current."),
        ("longrun_workers_known", "gauge", "Fleet workers that have recorded a heartbeat, alive or not."),
        ("longrun_worker_tasks_held", "gauge", "Tasks each alive worker held at its last heartbeat."),
        ("longrun_task_progress_done", "gauge", "Units done, as an unfinished task last reported with run.progress."),
        ("longrun_task_progress_total", "gauge", "Units in all, as an unfinished task last reported with run.progress."),
        ("longrun_task_progress_rate", "gauge", "Units per second between the task's last two reported progress points."),
        ("longrun_task_progress_remaining_seconds", "gauge", "Time left to the reported total at the reported rate."),
        ("longrun_run_duration_seconds", "histogram", "Time from a task's first revision to the one that ended it, for tasks that ended."),
        ("longrun_effect_latency_seconds", "histogram", "Time from an effect attempt's start to its verification, by action."),
        ("longrun_collect_errors", "gauge", "Tasks whose state could not be read while collecting (DAMAGED or UNREADABLE)."),
    ):  # fmt: skip
        if ledgers or name not in LEDGER_FAMILIES:
            families.declare(name, kind, help)


def collect(
    store: Store, fleet: FleetView | None = None, *, now: float | None = None, tasks: Iterable[str] | None = None, ledgers: bool = True
) -> MetricsSnapshot:
    """Read ``store`` (every task, or ``tasks``) and ``fleet`` once; return what they say as metrics.

    With ``ledgers=False`` (a store that keeps summaries: ``SummaryStore``, and no ``tasks``), what
    the summary rows answer is read from them, not from every state: the tasks by status and
    function, the run durations, the collect errors (a summary marked unreadable). Only the tasks
    that need their state are loaded: a failed one (its error type), one waiting on a person (its
    pending requests) and an unfinished one that has run (its progress report); a queued, new or
    ended task is not. The families that only every ledger answers (``LEDGER_FAMILIES``: effects
    by action and state, the effect counters, step failures, effect latency) are left out."""
    at = time.time() if now is None else now
    if not ledgers and (tasks is not None or not isinstance(store, SummaryStore)):
        ledgers = True  # nothing lists the summaries: every state is read
    families = _Families()
    _declare(families, ledgers=ledgers)
    for kind in ("approval", "question"):
        families.set("longrun_pending_requests", 0.0, kind=kind)
        families.set("longrun_pending_request_oldest_age_seconds", 0.0, kind=kind)
    families.set("longrun_collect_errors", 0.0)
    latency: dict[str, tuple[list[float], float]] = {}
    durations: dict[str, tuple[list[float], float]] = {}
    if not ledgers:
        assert isinstance(store, SummaryStore)
        _from_summaries(families, store, store.list_summaries(), at, durations)
    for task_id in () if not ledgers else store.list_tasks() if tasks is None else tasks:
        try:
            state = store.load(task_id).state
        except CorruptStateError:
            families.add("longrun_tasks", 1.0, status="DAMAGED", function="")
            families.add("longrun_collect_errors", 1.0)
            continue
        except LongrunError:
            families.add("longrun_tasks", 1.0, status="UNREADABLE", function="")
            families.add("longrun_collect_errors", 1.0)
            continue
        if state is None:
            families.add("longrun_tasks", 1.0, status="new", function="")
            continue
        _task(families, state, at, latency, durations)
    for action, (counts, total) in sorted(latency.items()):
        families.histogram("longrun_effect_latency_seconds", LATENCY_BOUNDS, counts, total, action=action)
    for function, (counts, total) in sorted(durations.items()):
        families.histogram("longrun_run_duration_seconds", DURATION_BOUNDS, counts, total, function=function)
    if fleet is not None:
        _fleet(families, fleet)
    return MetricsSnapshot(families.build(), at)


def _from_summaries(
    families: _Families, store: Store, summaries: Iterable[TaskSummary], now: float, durations: dict[str, tuple[list[float], float]]
) -> None:
    """``collect(ledgers=False)``'s reading: every summary row, and the states only some need."""
    for summary in summaries:
        function = summary.function or ""
        if summary.status == "unreadable":
            families.add("longrun_tasks", 1.0, status="UNREADABLE", function="")
            families.add("longrun_collect_errors", 1.0)
            continue
        families.add("longrun_tasks", 1.0, status=summary.status, function=function)
        if summary.status in _TERMINAL_VALUES and summary.created_at is not None and summary.updated_at is not None:
            _add_duration(durations, function, summary.updated_at - summary.created_at)
        if summary.status in _LOADED_FOR or summary.status not in _NOT_LOADED:
            try:
                state = store.load(summary.task_id).state
            except LongrunError:
                families.add("longrun_collect_errors", 1.0)  # counted by its summary's status above
                continue
            if state is not None:
                _task(families, state, now, {}, durations, ledgers=False)


_TERMINAL_VALUES = frozenset(status.value for status in TERMINAL)


def _add_duration(durations: dict[str, tuple[list[float], float]], function: str, seconds: float) -> None:
    counts, total = durations.setdefault(function, ([0.0] * (len(DURATION_BOUNDS) + 1), 0.0))
    seconds = max(0.0, seconds)
    counts[_bucket(DURATION_BOUNDS, seconds)] += 1
    durations[function] = (counts, total + seconds)


def _task(
    families: _Families,
    state: RunState,
    now: float,
    latency: dict[str, tuple[list[float], float]],
    durations: dict[str, tuple[list[float], float]],
    *,
    ledgers: bool = True,
) -> None:
    """One task's samples; without ``ledgers``, only what its summary did not give (its error
    type, its pending requests, its progress)."""
    function = function_of(state)
    if ledgers:
        families.add("longrun_tasks", 1.0, status=state.status.value, function=function)
    error_type = failure_of(state)
    if error_type is not None:
        families.add("longrun_tasks_failed", 1.0, function=function, error_type=error_type)
    for record in state.effects.values() if ledgers else ():
        action = record.action
        if record.state is EffectState.FAILED:
            families.add("longrun_step_failures_total", 1.0, function=function, error_type=_error_type(record))
        if is_internal(action):
            continue
        families.add("longrun_effects", 1.0, action=action, state=record.state.value)
        families.add("longrun_effects_applied_total", float(record.attempts), action=action)
        families.add("longrun_effects_retried_total", float(max(0, record.attempts - 1)), action=action)
        families.add("longrun_effects_verified_total", 1.0 if record.state is EffectState.VERIFIED else 0.0, action=action)
        # Its outcome came from observation alone: uncertain now, or verified with no receipt (the
        # apply raised, timed out or was cut short by a crash, or it was found already applied).
        uncertain = record.state is EffectState.UNCERTAIN or (record.state is EffectState.VERIFIED and record.receipt is None)
        families.add("longrun_effects_uncertain_total", 1.0 if uncertain else 0.0, action=action)
    for request in pending_of(state):
        families.add("longrun_pending_requests", 1.0, kind=request.kind)
        families.maximum("longrun_pending_request_oldest_age_seconds", max(0.0, now - request.requested_at), kind=request.kind)
    if state.effect_latency is not None and ledgers:
        _add_latency(latency, state.effect_latency)
    if state.status in TERMINAL and ledgers:
        _add_duration(durations, function, state.updated_at - state.created_at)
    report = state.progress
    if report is not None and state.status not in TERMINAL:
        labels = {"task": state.task_id, "function": function}
        families.set("longrun_task_progress_done", report.done, **labels)
        if report.total is not None:
            families.set("longrun_task_progress_total", report.total, **labels)
        if report.rate is not None:
            families.set("longrun_task_progress_rate", report.rate, **labels)
        if report.eta_s is not None:
            families.set("longrun_task_progress_remaining_seconds", report.eta_s, **labels)


def _bucket(bounds: Sequence[float], value: float) -> int:
    for index, bound in enumerate(bounds):
        if value <= bound:
            return index
    return len(bounds)


def _add_latency(into: dict[str, tuple[list[float], float]], recorded: EffectLatency) -> None:
    """Add a task's histogram to the sum; buckets recorded under other bounds go into the first
    current bucket that holds their upper bound (an over-estimate, never an under-estimate)."""
    same = recorded.bounds == LATENCY_BOUNDS
    for action, row in recorded.counts.items():
        counts, total = into.setdefault(action, ([0.0] * (len(LATENCY_BOUNDS) + 1), 0.0))
        for index, count in enumerate(row):
            if same:
                target = index
            else:
                upper = recorded.bounds[index] if index < len(recorded.bounds) else math.inf
                target = _bucket(LATENCY_BOUNDS, upper)
            counts[target] += count
        into[action] = (counts, total + recorded.sums.get(action, 0.0))


def _fleet(families: _Families, fleet: FleetView) -> None:
    workers = fleet.workers()
    families.set("longrun_workers_known", float(len(workers)))
    families.set("longrun_workers_alive", float(sum(1 for worker in workers if worker.alive)))
    for worker in workers:
        if worker.alive:
            families.set("longrun_worker_tasks_held", float(worker.running), worker=worker.name)
    depth: dict[str, int] = {}
    lag: dict[str, float] = {}
    for entry in fleet.entries():
        depth.setdefault(entry.function, 0)
        lag.setdefault(entry.function, 0.0)
        due_in = entry.due_in_s  # a claim holds the row's due time at its expiry: a claimed row is not due
        if due_in is None or due_in > 0:
            continue
        depth[entry.function] += 1
        lag[entry.function] = max(lag[entry.function], -due_in)
    for function in sorted(depth):
        families.set("longrun_queue_depth", float(depth[function]), function=function)
        families.set("longrun_queue_lag_seconds", lag[function], function=function)


# -- the text format ----------------------------------------------------------------------------


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def _label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _help_text(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def render(snapshot: MetricsSnapshot) -> str:
    """The snapshot in the Prometheus text exposition format 0.0.4 (``CONTENT_TYPE``)."""
    lines: list[str] = []
    for item in snapshot.families:
        lines.append(f"# HELP {item.name} {_help_text(item.help)}")
        lines.append(f"# TYPE {item.name} {item.kind}")
        for sample in item.samples:
            if sample.labels:
                labels = ",".join(f'{name}="{_label_value(value)}"' for name, value in sample.labels)
                lines.append(f"{sample.name}{{{labels}}} {_number(sample.value)}")
            else:
                lines.append(f"{sample.name} {_number(sample.value)}")
    return "\n".join(lines) + "\n"

