"""Effect records as rows, and a state's header: the compact encoding both kinds of file share.

Holds the row layouts (``EFFECT_FIELDS`` and the older and blob-carrying widths), ``row_of`` and
``record_from_row`` (a record to a row and back, validated), ``record_changes`` (the fields of a
record a journal line names), the header keys, ``header_of`` (a state's flat header) and
``build_state`` (a header and rows validated into a ``RunState``). The import-time checks below
fail if ``RunState`` or ``EffectRecord`` gains a field these codecs would not store.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from typing import Any, Callable, Mapping

from ..._fields import MAX_INT, finite_float
from ...budget import Backoff, BudgetCounters
from ...names import are_step_ids, check_step_id
from ...envelope import RunState
from ...errors import CorruptStateError, InvalidInputError
from ...ledger import EffectRecord, EffectState
from ...outcome import Status
from ..blobs import BLOBS_KEY, BlobCodec, BlobRef, refs_from_json, refs_to_json
from ._lines import encode_json

__all__ = [
    "BLOBS_AT",
    "BLOB_ROW_FIELDS",
    "BlobFetch",
    "CHANGE_INDEX",
    "EFFECT_FIELDS",
    "FIRST_EFFECT_FIELDS",
    "HEADER_KEYS",
    "LIST_KEYS",
    "RECORD_KEYS",
    "ROW_WIDTHS",
    "SCALAR_KEYS",
    "build_state",
    "header_of",
    "record_changes",
    "record_from_row",
    "row_of",
    "scalar_values",
]

_step_id_of = operator.attrgetter("step_id")

EFFECT_FIELDS: tuple[str, ...] = (
    "key", "step_id", "action", "payload", "payload_digest", "state", "attempts", "epoch", "result",
    "cost", "receipt", "evidence", "last_error", "not_before", "approval_id", "updated_at", "backoff",
)  # fmt: skip
FIRST_EFFECT_FIELDS = EFFECT_FIELDS[:-1]
"""The row as first written, before ``backoff``: still read, the missing value being null. A
snapshot's meta names the fields its rows hold; a journal row's length tells."""
BLOB_ROW_FIELDS = (*EFFECT_FIELDS, BLOBS_KEY)
"""A row whose payload or result is kept as a blob: the fields, the out-of-line ones null, then the
reference map (``stores.blobs``). A snapshot that holds one writes every row this wide (the map
null where there is none) and names these fields in its meta."""
ROW_WIDTHS = (len(EFFECT_FIELDS), len(FIRST_EFFECT_FIELDS), len(BLOB_ROW_FIELDS))
_FIELD_INDEX = {name: index for index, name in enumerate(EFFECT_FIELDS)}
CHANGE_INDEX = {name: index for index, name in enumerate(BLOB_ROW_FIELDS)}
BLOBS_AT = len(EFFECT_FIELDS)
BlobFetch = Callable[[BlobRef, str], Any]
"""How a reader resolves a blob reference: the value the blob holds, checked (``blobs.decode_blob``)."""
_STATES = {state.value: state for state in EffectState}

SCALAR_KEYS = (
    "task_id", "plan_digest", "created_at", "updated_at", "status", "current_step", "next_action",
    "lease_owner", "lease_epoch", "lease_expires_at", "reconcile_all",
)  # fmt: skip
scalar_values = operator.attrgetter(*SCALAR_KEYS)
_EVIDENCE_LISTS = ("control_observations", "unknowns")
LIST_KEYS = frozenset(("consumed_approvals", *_EVIDENCE_LISTS))
_BUDGET_KEYS = tuple("budget." + field.name for field in dataclasses.fields(BudgetCounters))
RECORD_KEYS = ("plan_outline", "progress", "effect_latency")
"""The header's optional records (each written only when the state has one, as its ``to_json``)."""
HEADER_KEYS = frozenset((*SCALAR_KEYS, *_BUDGET_KEYS, "approval_requests", *LIST_KEYS, *RECORD_KEYS))
_LATER_HEADER_KEYS = frozenset(("budget.worked_s", "budget.worked_at_progress_s", *RECORD_KEYS))
"""Header fields that states written before them lack (``BudgetCounters.from_json`` fills them in;
the ``RECORD_KEYS`` are written only when the state has one)."""
_FIRST_HEADER_KEYS = HEADER_KEYS - _LATER_HEADER_KEYS

# The codecs below name every field of RunState and EffectRecord; fail at import, not on a
# customer's disk, if one of them gains a field that would silently not be stored.
if {field.name for field in dataclasses.fields(EffectRecord)} != set(EFFECT_FIELDS):
    raise ImportError("EffectRecord's fields changed: update EFFECT_FIELDS and row_of in stores/_journal/_rows.py")
if {field.name for field in dataclasses.fields(RunState)} != {
    *SCALAR_KEYS, "budget", "approval_requests", *LIST_KEYS, "effects", "revision", *RECORD_KEYS
}:
    raise ImportError("RunState's fields changed: update the header codec in stores/_journal/_rows.py")


def row_of(record: EffectRecord, blobs: BlobCodec | None = None, introduced: list[BlobRef] | None = None) -> list[Any]:
    """An effect record as a row of values in ``EFFECT_FIELDS`` order; with ``blobs``, a large
    payload or result as a blob reference (``BLOB_ROW_FIELDS``), its reference added to ``introduced``."""
    payload: Any = record.payload
    result: Any = record.result
    refs = None
    if blobs is not None:
        (payload, result), found = blobs.split((("payload", payload), ("result", result)))
        if found:
            refs = found
            if introduced is not None:
                introduced.extend(found.values())
    row = [
        record.key, record.step_id, record.action, payload, record.payload_digest, record.state.value,
        record.attempts, record.epoch, result, record.cost, record.receipt, record.evidence,
        record.last_error, record.not_before, record.approval_id, record.updated_at,
        record.backoff.to_json() if record.backoff is not None else None,
    ]  # fmt: skip
    if refs is not None:
        row.append(refs_to_json(refs))
    return row


def _bad(field: str, value: object) -> CorruptStateError:
    return CorruptStateError(f"effect record: field {field!r} has a bad value {value!r:.60}")


def _number(field: str, value: object) -> float:
    """A finite number as a float (ints accepted, bools not), as ``_fields.get_float`` reads it."""
    number = finite_float(value)
    if number is None:
        raise _bad(field, value)
    return number


_isfinite = math.isfinite


_WIDTH = len(EFFECT_FIELDS)
_from_checked = EffectRecord.from_checked


def record_from_row(row: object, fetch: BlobFetch | None = None) -> EffectRecord:
    """Validate a row with the rules of ``EffectRecord.from_json`` and build the record; a blob
    reference is resolved with ``fetch`` (which checks the blob).

    A load builds one record per row, so the row as writers write it (every value of the type it is
    written as, no blob, no backoff) is checked in one expression; any other row, valid or not, takes
    the checks field by field (``_record_from_any_row``), which name the field a bad value is in."""
    if type(row) is list and len(row) == _WIDTH:
        (key, step_id, action, payload, payload_digest, state, attempts, epoch, result, cost, receipt, evidence,
         last_error, not_before, approval_id, updated_at, backoff) = row  # fmt: skip
        if (
            type(key) is str and type(step_id) is str and type(action) is str and type(payload) is dict
            and type(payload_digest) is str and type(state) is str and (lifecycle := _STATES.get(state)) is not None
            and type(attempts) is int and 0 <= attempts <= MAX_INT and type(epoch) is int and 0 <= epoch <= MAX_INT
            and type(cost) is float and _isfinite(cost) and type(updated_at) is float and _isfinite(updated_at)
            and (not_before is None or (type(not_before) is float and _isfinite(not_before)))
            and (receipt is None or type(receipt) is str) and (evidence is None or type(evidence) is str)
            and (last_error is None or type(last_error) is str) and (approval_id is None or type(approval_id) is str)
            and backoff is None
        ):  # fmt: skip
            return _from_checked((
                key, step_id, action, payload, payload_digest, lifecycle, attempts, epoch, result,
                cost, receipt, evidence, last_error, not_before, approval_id, updated_at, None,
            ))  # fmt: skip
    return _record_from_any_row(row, fetch)


def _record_from_any_row(row: object, fetch: BlobFetch | None) -> EffectRecord:
    """``record_from_row`` for any row: each field checked on its own, a bad one named."""
    if type(row) is not list or len(row) not in ROW_WIDTHS:
        raise CorruptStateError(f"effect record row must be a list of {len(EFFECT_FIELDS)} values")
    values: list[Any] = row if len(row) == len(EFFECT_FIELDS) else [*row, None] if len(row) < len(EFFECT_FIELDS) else row[:BLOBS_AT]
    (key, step_id, action, payload, payload_digest, state, attempts, epoch, result, cost, receipt, evidence,
     last_error, not_before, approval_id, updated_at, backoff) = values  # fmt: skip
    if len(row) > BLOBS_AT and row[BLOBS_AT] is not None:
        what = f"effect record {step_id!r:.80}"
        refs = refs_from_json(row[BLOBS_AT], what)
        if fetch is None:
            raise CorruptStateError(f"{what} references a blob, and no blob store was given to read it")
        if "payload" in refs:
            if payload is not None:
                raise CorruptStateError(f"{what}: its payload is both inline and a blob")
            payload = fetch(refs["payload"], f"{what} payload")
        if "result" in refs:
            if result is not None:
                raise CorruptStateError(f"{what}: its result is both inline and a blob")
            result = fetch(refs["result"], f"{what} result")
    for name, value in (("key", key), ("step_id", step_id), ("action", action), ("payload_digest", payload_digest)):
        if type(value) is not str:
            raise _bad(name, value)
    for name, value in (("receipt", receipt), ("evidence", evidence), ("last_error", last_error), ("approval_id", approval_id)):
        if value is not None and type(value) is not str:
            raise _bad(name, value)
    if type(payload) is not dict:
        raise _bad("payload", payload)
    lifecycle = _STATES.get(state) if type(state) is str else None
    if lifecycle is None:
        raise _bad("state", state)
    if type(attempts) is not int or not 0 <= attempts <= MAX_INT:
        raise _bad("attempts", attempts)
    if type(epoch) is not int or not 0 <= epoch <= MAX_INT:
        raise _bad("epoch", epoch)
    # The common case inline (floats as written); anything else goes through _number's full rules.
    if type(cost) is not float or not _isfinite(cost):
        cost = _number("cost", cost)
    if not_before is not None and (type(not_before) is not float or not _isfinite(not_before)):
        not_before = _number("not_before", not_before)
    if type(updated_at) is not float or not _isfinite(updated_at):
        updated_at = _number("updated_at", updated_at)
    if backoff is not None:
        if type(backoff) is not dict:
            raise _bad("backoff", backoff)
        backoff = Backoff.from_json(backoff)
    # Checked above with the rules of the record's spec (JSON values by ``parse_json``): built as is.
    return _from_checked((
        key, step_id, action, payload, payload_digest, lifecycle, attempts, epoch, result,
        cost, receipt, evidence, last_error, not_before, approval_id, updated_at, backoff,
    ))  # fmt: skip


def _same_json(a: object, b: object) -> bool:
    """Whether two JSON values encode alike (``1 == 1.0`` and ``True == 1`` are not alike here)."""
    if a is b:
        return True
    if type(a) is not type(b) or a != b:
        return False
    if isinstance(a, (dict, list)):
        return encode_json(a) == encode_json(b)  # equal, but a nested 1 and 1.0 would still differ
    return True


_record_values = operator.attrgetter(*EFFECT_FIELDS)


def record_changes(
    old: EffectRecord, new: EffectRecord, blobs: BlobCodec | None = None, introduced: list[BlobRef] | None = None
) -> dict[str, Any]:
    changes = {
        name: b for name, a, b in zip(EFFECT_FIELDS, _record_values(old), _record_values(new)) if a is not b and not _same_json(a, b)
    }
    if "state" in changes:
        changes["state"] = changes["state"].value
    if changes.get("backoff") is not None:
        changes["backoff"] = changes["backoff"].to_json()
    if blobs is not None and ("payload" in changes or "result" in changes):
        # The stored form: a large value as a reference; the map is written whole when it changes.
        _, before = blobs.split((("payload", old.payload), ("result", old.result)))
        (payload, result), after = blobs.split((("payload", new.payload), ("result", new.result)))
        if "payload" in changes:
            changes["payload"] = payload
        if "result" in changes:
            changes["result"] = result
        if before != after:
            changes[BLOBS_KEY] = refs_to_json(after)
        if introduced is not None:
            introduced.extend(ref for name, ref in after.items() if name in changes)
    return changes


# -- the header -------------------------------------------------------------------------------


def header_of(state: RunState) -> dict[str, Any]:
    """The flat header of a state: every field but the effect records and the revision."""
    header: dict[str, Any] = {}
    for key in SCALAR_KEYS:
        value = getattr(state, key)
        header[key] = value.value if isinstance(value, Status) else value
    for key, value in state.budget.to_json().items():
        header["budget." + key] = value
    header["approval_requests"] = [request.to_json() for request in state.approval_requests.values()]
    header["consumed_approvals"] = list(state.consumed_approvals)
    for key in _EVIDENCE_LISTS:
        header[key] = [item.to_json() for item in getattr(state, key)]
    for key in RECORD_KEYS:
        record = getattr(state, key)
        if record is not None:  # absent otherwise: such a header is what older code wrote
            header[key] = record.to_json()
    return header


def build_state(
    header: Mapping[str, Any], revision: int, rows: Mapping[str, list[Any]], fetch: BlobFetch | None = None
) -> RunState:
    """Validate a flat header and effect rows and build the ``RunState`` they describe (blob
    references resolved with ``fetch``)."""
    keys = header.keys()
    if keys != HEADER_KEYS and not _FIRST_HEADER_KEYS <= keys <= HEADER_KEYS:
        missing = sorted(_FIRST_HEADER_KEYS - keys)
        extra = sorted(keys - HEADER_KEYS)
        raise CorruptStateError(f"state header: missing fields {missing}, unknown fields {extra[:5]}")
    document = {key: header[key] for key in SCALAR_KEYS if not key.startswith("lease_")}
    document.update(
        revision=revision,
        budget={key[len("budget.") :]: header[key] for key in _BUDGET_KEYS if key in header},
        lease={"owner": header["lease_owner"], "epoch": header["lease_epoch"], "expires_at": header["lease_expires_at"]},
        approval_requests=header["approval_requests"],
        consumed_approvals=header["consumed_approvals"],
        control_observations=header["control_observations"],
        unknowns=header["unknowns"],
        effects=[],
        completed_steps=[],
    )
    for key in RECORD_KEYS:
        if header.get(key) is not None:
            document[key] = header[key]
    state = RunState.from_json(document)
    effects = {step_id: record_from_row(row, fetch) for step_id, row in rows.items()}
    if not are_step_ids(list(effects)):  # check_step_id's rule, in one match for all of them
        for step_id in effects:
            try:
                check_step_id(step_id)
            except InvalidInputError as exc:
                raise CorruptStateError(str(exc)) from None
    if list(map(_step_id_of, effects.values())) != list(effects):
        step_id, record = next(item for item in effects.items() if item[1].step_id != item[0])
        raise CorruptStateError(f"effect record filed under {step_id!r} names step {record.step_id!r}")
    state.effects = effects
    return state
