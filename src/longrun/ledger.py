"""The effect ledger: one record per side effect, and the only legal moves between its states.

Lifecycle::

    planned -> started -> acknowledged -> verified
                       -> uncertain    -> verified
    started/acknowledged/uncertain -> planned   (observed absent: a retry is allowed)
    planned/started -> failed                   (the adapter raised PermanentError)
    planned -> uncertain                        (a start may be lost or made elsewhere: observe it)

Guarantees this module enforces: a record changes only by ``EffectRecord.move``, which refuses any
move not drawn above, so a verified effect can never go back to planned and be applied again.
``started`` carries the attempt number, the payload digest and the fencing epoch of the writer.
A record is built only from values its loader would read back (one field spec, ``_SPEC``, for
``from_json`` and the constructor, which raises ``InvalidInputError``); ``move`` and
``with_changes`` do not check again, on every effect's path: the runner checks what comes from
outside (payload, receipt, observation, error text) where it enters.
Not guaranteed here: durability. The runner commits records through a store before and after
each adapter call; this module only says which records are legal.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, fields
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from . import _fields as f
from .adapters import Receipt
from .budget import Backoff
from .canonical import MAX_VALUE_BYTES, JSONValue, canonical_bytes, sha256_hex
from .errors import IllegalTransitionError

__all__ = [
    "CheckedReceipt", "EffectRecord", "EffectState", "IllegalTransitionError", "OMITTED", "VerifiedResults", "check_receipt",
    "raised_into_function", "recordable_result",
]  # fmt: skip


class EffectState(str, enum.Enum):
    PLANNED = "planned"
    STARTED = "started"
    ACKNOWLEDGED = "acknowledged"
    UNCERTAIN = "uncertain"
    VERIFIED = "verified"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


_MOVES: dict[EffectState, frozenset[EffectState]] = {
    # planned -> uncertain only to observe before an apply: the state came from a backup (a lost revision
    # may have started it), or it is the first apply of a run or of an ``observe_first`` step.
    EffectState.PLANNED: frozenset({EffectState.STARTED, EffectState.FAILED, EffectState.UNCERTAIN}),
    EffectState.STARTED: frozenset(
        {EffectState.ACKNOWLEDGED, EffectState.UNCERTAIN, EffectState.VERIFIED, EffectState.PLANNED, EffectState.FAILED}
    ),
    EffectState.ACKNOWLEDGED: frozenset({EffectState.VERIFIED, EffectState.UNCERTAIN, EffectState.PLANNED}),
    EffectState.UNCERTAIN: frozenset({EffectState.VERIFIED, EffectState.PLANNED}),
    EffectState.VERIFIED: frozenset(),
    EffectState.FAILED: frozenset(),
}

IN_FLIGHT = frozenset({EffectState.STARTED, EffectState.ACKNOWLEDGED, EffectState.UNCERTAIN})
"""States whose outcome at the target is not yet known to the ledger: reconcile before anything else."""


@dataclass(frozen=True, slots=True)
class EffectRecord:
    """One side effect in the ledger: its stable key, payload and digest, where it is in the
    lifecycle (see the module docstring), its attempts and epoch, and what the target said.

    Frozen; it changes only by ``move`` (a legal transition) or ``with_changes``."""

    key: str
    step_id: str
    action: str
    payload: dict[str, JSONValue]
    payload_digest: str
    state: EffectState = EffectState.PLANNED
    attempts: int = 0
    epoch: int = 0
    """The fencing epoch under which the latest attempt started."""
    result: JSONValue = None
    cost: float = 0.0
    receipt: str | None = None
    """The adapter's acknowledgement evidence for the latest attempt, if it returned one."""
    evidence: str | None = None
    """What observation said about the effect, latest first."""
    last_error: str | None = None
    not_before: float | None = None
    """Wall-clock time before which the next attempt does not start, as scheduled (see ``backoff``)."""
    approval_id: str | None = None
    updated_at: float = 0.0
    backoff: Backoff | None = None
    """The wait ``not_before`` was scheduled as, anchored on the clocks it began by: how a later run
    judges it (``Backoff.remaining``). None in records written before backoffs kept their duration."""

    def __post_init__(self) -> None:
        if not _FAST(self):
            f.check(_SPEC, self, "effect record")

    def check_types(self) -> None:
        """What a store checks before it writes a record that ``move`` or ``with_changes`` built
        unchecked: every field's type (``InvalidInputError``), JSON values only as far as their
        type (the store's encoder refuses what is not plain JSON, naming it)."""
        if not _FAST_TYPES(self):
            f.check(_SPEC, self, f"effect record {self.step_id!r:.60}", shallow=True)

    @classmethod
    def from_checked(cls, values: Sequence[Any]) -> "EffectRecord":
        """A record of ``values`` (in field order) that a loader has already checked with ``_SPEC``'s
        rules: built without checking them again, as ``with_changes`` builds a copy."""
        return _build_checked(values)

    @classmethod
    def from_checked_columns(cls, columns: Sequence[Iterable[Any]]) -> Iterator["EffectRecord"]:
        """``from_checked`` for many records at once, their values given as one iterable per
        field (in field order): no tuple and no call per record but the build itself."""
        return map(_build_checked_fields, *columns)

    def move(self, state: EffectState, at: float, **changes: Any) -> "EffectRecord":
        if state not in _MOVES[self.state]:
            raise IllegalTransitionError(f"effect {self.key!r}: {self.state.value} -> {state.value} is not allowed")
        return self.with_changes(state=state, updated_at=at, **changes)

    def with_changes(self, **changes: Any) -> "EffectRecord":
        """``dataclasses.replace`` without its per-call introspection: this is on every effect's path.

        Only field names are accepted; values are not re-validated (records are built from checked
        parts, and ``from_json`` validates what is read back).
        """
        unknown = changes.keys() - _FIELD_NAMES
        if unknown:
            raise TypeError(f"EffectRecord has no field(s) {sorted(unknown)}")
        return _copy_with(self, changes)

    @property
    def in_flight(self) -> bool:
        return self.state in IN_FLIGHT

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "key": self.key,
            "step_id": self.step_id,
            "action": self.action,
            "payload": self.payload,
            "payload_digest": self.payload_digest,
            "state": self.state.value,
            "attempts": self.attempts,
            "epoch": self.epoch,
            "result": self.result,
            "cost": self.cost,
            "receipt": self.receipt,
            "evidence": self.evidence,
            "last_error": self.last_error,
            "not_before": self.not_before,
            "approval_id": self.approval_id,
            "updated_at": self.updated_at,
            "backoff": self.backoff.to_json() if self.backoff is not None else None,
        }

    @classmethod
    def from_json(cls, data: object) -> "EffectRecord":
        what = "effect record"
        d: Mapping[str, Any] = f.require_mapping(data, what)
        f.check_fields(d, _FIELDS, what)
        values = _FAST_READ(d)
        if values is None:
            read = f.read(_SPEC, d, what)
            values = [read[name] for name in _FIELD_ORDER]
        return cls.from_checked(values)


_SPEC = (
    f.Field("key", f.Kind.TEXT),
    f.Field("step_id", f.Kind.STEP),
    f.Field("action", f.Kind.TEXT),
    f.Field("payload", f.Kind.OBJECT),
    f.Field("payload_digest", f.Kind.TEXT),
    f.Field("state", f.Kind.CHOICE, choices=EffectState),
    f.Field("attempts", f.Kind.INT),
    f.Field("epoch", f.Kind.INT),
    f.Field("result", f.Kind.JSON),
    f.Field("cost", f.Kind.NUMBER),
    f.Field("receipt", f.Kind.TEXT, optional=True),
    f.Field("evidence", f.Kind.TEXT, optional=True),
    f.Field("last_error", f.Kind.TEXT, optional=True),
    f.Field("not_before", f.Kind.NUMBER, optional=True),
    f.Field("approval_id", f.Kind.TEXT, optional=True),
    f.Field("updated_at", f.Kind.NUMBER),
    f.Field("backoff", f.Kind.RECORD, optional=True, record=Backoff),
)
"""The one schema of an effect record: what ``from_json`` reads and the constructor checks."""
_FIELDS = frozenset(field.name for field in _SPEC)
_FAST = f.fast_check(_SPEC)
_FAST_TYPES = f.fast_check(_SPEC, shallow=True)
_FAST_READ = f.fast_read(_SPEC)

OMITTED = "longrun.omitted"
"""The key of the stand-in that ``recordable_result`` records for a result too large to keep."""


def raised_into_function(record: EffectRecord) -> bool:
    """Whether a failed record's failure was recorded to be raised into a durable function (a
    call's exception, ``EffectFailed`` of an effect whose attempts ran out, a child that ended
    unfinished, a send to no such task: its result names the type), which the function may have
    handled and gone on from: settled as the function saw it, replayed so, never tried again."""
    return record.state is EffectState.FAILED and isinstance(record.result, dict) and isinstance(record.result.get("type"), str)


def recordable_result(result: JSONValue, *, what: str) -> tuple[JSONValue, str | None]:
    """``result`` as the ledger may record it, and None; or, if its canonical encoding is over
    ``MAX_VALUE_BYTES``, a small stand-in and the reason.

    The effect took place, and the ledger must say so, or it would be applied again; but a result
    that large would make the state too large to read back (``MAX_STATE_BYTES``). So the record
    keeps ``{"longrun.omitted": {"bytes": n, "digest": "sha256:...", "limit": MAX_VALUE_BYTES}}``
    instead, and the caller keeps the reason as evidence (the runner: among the outcome's unknowns
    for a receipt's result, in the effect's evidence for an observation's). A later step whose
    payload is computed from this result receives the stand-in."""
    if result is None or isinstance(result, (bool, int, float)):
        return result, None
    data = canonical_bytes(result, what=what)
    if len(data) <= MAX_VALUE_BYTES:
        return result, None
    digest = "sha256:" + sha256_hex(data)
    stand_in: JSONValue = {OMITTED: {"bytes": len(data), "digest": digest, "limit": MAX_VALUE_BYTES}}
    return stand_in, (
        f"{what} is {len(data)} bytes encoded, over the {MAX_VALUE_BYTES}-byte limit (MAX_VALUE_BYTES): "
        f"only its size and digest {digest} are recorded"
    )


_FIELD_ORDER = tuple(field.name for field in fields(EffectRecord))
if tuple(field.name for field in _SPEC) != _FIELD_ORDER:  # from_checked takes values in this order
    raise ImportError("EffectRecord's fields and _SPEC disagree: update _SPEC in ledger.py")


class _OpenRecord:
    """An ``EffectRecord`` under construction: the very same slots, without the frozen guard, so
    that each field is set by a plain attribute store (``object.__setattr__``, which a frozen class
    needs, costs three times as much). Python lets an object change its class between two classes
    whose slots are the same, which is how the finished record becomes an ``EffectRecord``."""

    __slots__ = EffectRecord.__slots__


def _checked_builder() -> Callable[[Sequence[Any]], EffectRecord]:
    """``from_checked`` as straight-line code (a load builds records by the thousand): one
    assignment per field, generated from the field names, instead of a loop; the record is built
    as an ``_OpenRecord`` and then made an ``EffectRecord``."""
    lines = ["def build(values):", "    record = new(OpenRecord)", f"    ({', '.join(_FIELD_ORDER)},) = values"]
    lines += [f"    record.{name} = {name}" for name in _FIELD_ORDER]
    lines += ["    record.__class__ = EffectRecord", "    return record"]
    names: dict[str, Any] = {"new": object.__new__, "OpenRecord": _OpenRecord, "EffectRecord": EffectRecord}
    exec("\n".join(lines), names)  # built from the dataclass's own field names, never from data
    build: Callable[[Sequence[Any]], EffectRecord] = names["build"]
    return build


_build_checked = _checked_builder()


def _checked_fields_builder() -> Callable[..., EffectRecord]:
    """``_checked_builder``'s function taking the values as arguments (``from_checked_columns``)."""
    lines = [f"def build({', '.join(_FIELD_ORDER)}):", "    record = new(OpenRecord)"]
    lines += [f"    record.{name} = {name}" for name in _FIELD_ORDER]
    lines += ["    record.__class__ = EffectRecord", "    return record"]
    names: dict[str, Any] = {"new": object.__new__, "OpenRecord": _OpenRecord, "EffectRecord": EffectRecord}
    exec("\n".join(lines), names)  # built from the dataclass's own field names, never from data
    build: Callable[..., EffectRecord] = names["build"]
    return build


_build_checked_fields = _checked_fields_builder()


def _copier() -> Callable[[EffectRecord, dict[str, Any]], EffectRecord]:
    """``with_changes`` as straight-line code (three copies per effect): one assignment per field,
    built as an ``_OpenRecord`` like ``from_checked``'s records."""
    lines = ["def copy_with(self, changes):", "    record = new(OpenRecord)"]
    lines += [f"    record.{name} = changes[{name!r}] if {name!r} in changes else self.{name}" for name in _FIELD_ORDER]
    lines += ["    record.__class__ = EffectRecord", "    return record"]
    names: dict[str, Any] = {"new": object.__new__, "OpenRecord": _OpenRecord, "EffectRecord": EffectRecord}
    exec("\n".join(lines), names)  # built from the dataclass's own field names, never from data
    copy_with: Callable[[EffectRecord, dict[str, Any]], EffectRecord] = names["copy_with"]
    return copy_with


_copy_with = _copier()
_FIELD_NAMES = frozenset(_FIELD_ORDER)


@dataclass(frozen=True, slots=True)
class CheckedReceipt:
    """What the ledger records from an adapter's receipt: the cost to charge and the result to keep,
    with the problems found (each one evidence of an adapter bug or a value too large, never dropped)."""

    cost: float
    result: JSONValue
    evidence: str
    problems: tuple[str, ...] = ()


def check_receipt(receipt: object, *, key: str, step_id: str, already_spent: float) -> CheckedReceipt:
    """The one rule for an acknowledgement: a non-receipt is recorded as such; a cost that is not a
    finite number >= 0, or would make the run's total infinite, is recorded and not charged (a NaN
    would poison every later commit); a result over ``MAX_VALUE_BYTES`` is kept by size and digest."""
    problems: list[str] = []
    if not isinstance(receipt, Receipt):
        receipt = Receipt(evidence=f"apply returned {type(receipt).__name__}, not a Receipt")
    cost: object = receipt.cost
    if (
        isinstance(cost, bool) or not isinstance(cost, (int, float)) or not math.isfinite(cost) or cost < 0
        or not math.isfinite(already_spent + cost)
    ):  # fmt: skip
        problems.append(f"receipt for {key} reports an invalid cost {cost!r}; not charged")
        cost = 0.0
    assert isinstance(cost, (int, float))
    result: JSONValue = receipt.result
    if result is not None:  # most receipts carry none: nothing to measure, no message to make
        result, omitted = recordable_result(result, what=f"the result of step {step_id!r}")
        if omitted is not None:
            problems.append(omitted)
    return CheckedReceipt(float(cost), result, receipt.evidence or "acknowledged", tuple(problems))


class VerifiedResults(Mapping[str, Any]):
    """The results of a ledger's verified effects, by step id: a read-only view of ``effects``, not
    a copy, so that planning each of many dynamic steps costs a lookup, not a pass over the ledger.
    It follows the ledger as it changes; a step that is not verified is not in it."""

    __slots__ = ("_effects",)

    def __init__(self, effects: Mapping[str, EffectRecord]):
        self._effects = effects

    def __getitem__(self, step_id: str) -> Any:
        record = self._effects[step_id]
        if record.state is not EffectState.VERIFIED:
            raise KeyError(step_id)
        return record.result

    def copy(self) -> dict[str, Any]:
        """The results as they are now, in a dict of their own (one pass over the ledger)."""
        verified = EffectState.VERIFIED
        return {step_id: record.result for step_id, record in self._effects.items() if record.state is verified}

    def __iter__(self) -> Iterator[str]:
        return iter(self.copy())

    def __len__(self) -> int:
        return len(self.copy())

    def __repr__(self) -> str:
        return f"VerifiedResults({self.copy()!r})"
