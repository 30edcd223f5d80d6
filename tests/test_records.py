"""One schema per record, read and written: what a loader would refuse is refused when it is built.

Two properties, over records generated from fixed seeds (stdlib ``random``, so a failure names a
case that fails again):

- every valid record written (``to_json`` -> canonical bytes -> ``parse_json`` -> ``from_json``,
  and through the JSON-file and SQLite stores) reads back equal to what was written;
- every invalid value, in every field of every record, is refused when the record is built
  (``InvalidInputError``), and the loader refuses the same value (``CorruptStateError``): the
  two directions apply one set of rules.

Also the encoder itself: a value that is not plain JSON is a typed error naming the path to it,
never a raw ``UnicodeEncodeError`` or ``ValueError`` from inside ``json``.
"""

from __future__ import annotations

import dataclasses
import random
import unittest
from typing import Any, Callable

from helpers import support
from longrun import Observation, Receipt
from longrun._fields import MAX_INT, Field, Kind
from longrun.approval import Approval, ApprovalRequest
from longrun.budget import BudgetCounters
from longrun.cancellation import Cancellation
from longrun.canonical import (
    MAX_INT_DIGITS,
    JSONValue,
    canonical_bytes,
    digest_of,
    ensure_json,
    parse_json,
    printable,
)
from longrun.envelope import MAX_STATE_BYTES, PlanOutline, RunState, decode, encode
from longrun.errors import CorruptStateError, InvalidInputError, SizeLimitError
from longrun.lease import Lease
from longrun.ledger import EffectRecord, EffectState
from longrun.outcome import Evidence, Status
from longrun.stores import _journal
from longrun.stores.jsonfile import JsonFileStore
from longrun.stores.sqlite import SqliteStore

SEEDS = range(300)

# -- generators of valid values -----------------------------------------------------------------

_ALPHABETS = (
    "abcdefghijklmnopqrstuvwxyz0123456789",
    " \t\n\"\\/'{}[]:,\x00\x1f\x7f",
    "ünïcødé✓é中文\u2028\u2029\ufeff\uffff",
    "\U0001f600\U00010348\U0010ffff",
)


def text(rng: random.Random, limit: int = 12) -> str:
    return "".join(rng.choice(rng.choice(_ALPHABETS)) for _ in range(rng.randint(0, limit)))


def name(rng: random.Random) -> str:
    first = rng.choice("abcXYZ019")
    return first + "".join(rng.choice("abc-_.019") for _ in range(rng.randint(0, 20)))


def number(rng: random.Random) -> float:
    return rng.choice(
        [0.0, -0.0, 1.5, -2.25, 1e308, -1e308, 5e-324, 1_700_000_000.123456, rng.uniform(-1e9, 1e9), float(rng.randint(-9, 9))]
    )


def integer(rng: random.Random, minimum: int = 0) -> int:
    return rng.choice([minimum, minimum + 1, rng.randint(minimum, 10**6), MAX_INT])


def json_value(rng: random.Random, depth: int = 0) -> JSONValue:
    kind = rng.randrange(9 if depth < 8 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice([0, -1, 2**63, -(2**64), 10 ** (MAX_INT_DIGITS - 1), -(10 ** (MAX_INT_DIGITS - 1)) + 1])
    if kind == 3:
        return number(rng)
    if kind in (4, 5):
        return text(rng)
    if kind == 6:
        return [json_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {text(rng, 6): json_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def json_object(rng: random.Random) -> dict[str, JSONValue]:
    return {text(rng, 6): json_value(rng, 1) for _ in range(rng.randint(0, 5))}


def optional(rng: random.Random, make: Callable[[], Any]) -> Any:
    return None if rng.random() < 0.3 else make()


def effect_record(rng: random.Random, step_id: str | None = None) -> EffectRecord:
    return EffectRecord(
        key=text(rng, 30),
        step_id=step_id or name(rng),
        action=text(rng),
        payload=json_object(rng),
        payload_digest=text(rng),
        state=rng.choice(list(EffectState)),
        attempts=integer(rng),
        epoch=integer(rng),
        result=json_value(rng),
        cost=abs(number(rng)),
        receipt=optional(rng, lambda: text(rng)),
        evidence=optional(rng, lambda: text(rng)),
        last_error=optional(rng, lambda: text(rng)),
        not_before=optional(rng, lambda: number(rng)),
        approval_id=optional(rng, lambda: text(rng)),
        updated_at=number(rng),
    )


def evidence(rng: random.Random) -> Evidence:
    return Evidence(text(rng), text(rng, 40), number(rng))


def approval_request(rng: random.Random, task_id: str | None = None, step_id: str | None = None) -> ApprovalRequest:
    return ApprovalRequest(task_id or name(rng), text(rng), step_id or name(rng), text(rng), text(rng), number(rng), number(rng))


def approval(rng: random.Random) -> Approval:
    return Approval(
        approval_id=name(rng), task_id=name(rng), plan_digest=text(rng), step_id=name(rng), payload_digest=text(rng),
        action=text(rng), expires_at=number(rng), approver=text(rng), granted_at=number(rng),
        signature=optional(rng, lambda: text(rng)),
    )  # fmt: skip


def cancellation(rng: random.Random) -> Cancellation:
    return Cancellation(name(rng), number(rng), text(rng), text(rng), optional(rng, lambda: text(rng)))


def lease(rng: random.Random) -> Lease:
    timeline = rng.random() < 0.5
    return Lease(
        name(rng), text(rng), integer(rng), number(rng), number(rng),
        text(rng) if timeline else None, number(rng) if timeline else None,
    )  # fmt: skip


def budget(rng: random.Random) -> BudgetCounters:
    return BudgetCounters(number(rng), optional(rng, lambda: number(rng)), integer(rng), abs(number(rng)), number(rng))


def plan_outline(rng: random.Random) -> PlanOutline:
    steps = list(dict.fromkeys(f"{name(rng)}/{index}" for index in range(rng.randint(0, 6))))
    return PlanOutline(tuple(steps), tuple(text(rng) or "a" for _ in steps))


def run_state(rng: random.Random, task_id: str | None = None, effects: int | None = None) -> RunState:
    task_id = task_id or name(rng)
    records = {}
    for index in range(rng.randint(0, 6) if effects is None else effects):
        step_id = f"s{index}-{name(rng)}"
        records[step_id] = effect_record(rng, step_id)
    requests = {step_id: approval_request(rng, task_id, step_id) for step_id in list(records)[:2]}
    state = RunState(
        task_id=task_id,
        plan_digest=text(rng),
        budget=budget(rng),
        revision=integer(rng, 1),
        created_at=number(rng),
        updated_at=number(rng),
        status=rng.choice(list(Status)),
        current_step=optional(rng, lambda: text(rng)),
        next_action=text(rng, 40),
        effects=records,
        approval_requests=requests,
        consumed_approvals=[text(rng) for _ in range(rng.randint(0, 3))],
        control_observations=[evidence(rng) for _ in range(rng.randint(0, 3))],
        unknowns=[evidence(rng) for _ in range(rng.randint(0, 3))],
        lease_owner=optional(rng, lambda: text(rng)),
        lease_epoch=integer(rng),
        lease_expires_at=optional(rng, lambda: number(rng)),
        reconcile_all=rng.random() < 0.5,
        plan_outline=optional(rng, lambda: plan_outline(rng)),
    )
    state.validate()
    return state


RECORDS: dict[type, Callable[[random.Random], Any]] = {
    EffectRecord: effect_record,
    Evidence: evidence,
    ApprovalRequest: approval_request,
    Approval: approval,
    Cancellation: cancellation,
    Lease: lease,
    BudgetCounters: budget,
    PlanOutline: plan_outline,
}


def read_back(record: Any) -> Any:
    """``record`` written as a store writes JSON, then read as a loader reads it."""
    data = canonical_bytes(record.to_json())
    return type(record).from_json(parse_json(data, what="record", max_bytes=MAX_STATE_BYTES))


# -- invalid values, by the kind of field they are refused from ------------------------------------

_DEEP: JSONValue = []
for _ in range(70):
    _DEEP = [_DEEP]
UNREADABLE_JSON: list[Any] = [
    object(), b"bytes", {1, 2}, {"a": float("nan")}, [float("inf")],
    ["a lone \udcff surrogate"], {"key \ud800": 1}, {"n": 10**MAX_INT_DIGITS}, [-(10**5000)],
]  # fmt: skip
"""Values no load reads back: the encoders refuse them too."""
READABLE_ONCE_ENCODED: list[Any] = [{1: "non-string key"}, _DEEP]
BAD_JSON: list[Any] = [*UNREADABLE_JSON, *READABLE_ONCE_ENCODED]
"""Also refused where values enter: a key the encoder would turn into a string (so what is read back
differs), and nesting deeper than a payload or result may go (what is read back would be refused
inside a deeper document)."""
BAD: dict[Kind, list[Any]] = {
    Kind.TEXT: [123, b"bytes", {"http": 200}, ["a"], 1.5, True, "lone \udcff", "\ud800"],
    Kind.NAME: ["../x", "", "a/b", ".hidden", "-x", 7, "x" * 129, "caf\udce9", None],
    Kind.STEP: ["", ".x", "-x", "a b", "a\\b", 7, "x" * 257, "caf\udce9", None],
    Kind.RECORD: [[], "x", 5, {"duration_s": 1.0}, {"duration_s": -1.0, "scheduled_at": 0.0}],
    Kind.INT: [-1, "1", 1.5, True, None, MAX_INT + 1, 10**400, -(10**5000)],
    Kind.NUMBER: [float("nan"), float("inf"), -float("inf"), "1", True, 10**400, -(10**5000), b"1", [1.0]],
    Kind.BOOL: [1, 0, "true", None],
    Kind.CHOICE: ["no-such-value", 5, None],
    Kind.OBJECT: [[], "x", 5, None, *[{"v": value} for value in BAD_JSON]],
    Kind.JSON: BAD_JSON,
    Kind.TEXTS: ["abc", [1], ["\udcff"], None, [None]],
    Kind.TUPLE: ["abc", 5, {"a": 1}, [1], ["\udcff"], None, [None], ["ok", ""]],
}
READABLE = (type(None), bool, int, float, str, list, dict)


def readable(value: Any) -> bool:
    """Whether ``value`` is something ``from_json`` can be handed (a parsed JSON document holds only these)."""
    if isinstance(value, dict):
        return all(isinstance(key, str) and readable(item) for key, item in value.items())
    if isinstance(value, list):
        return all(readable(item) for item in value)
    return isinstance(value, READABLE)


def spec_of(kind: type) -> tuple[Field, ...]:
    from longrun import approval as approval_module, budget as budget_module, cancellation as cancellation_module
    from longrun import envelope, lease as lease_module, ledger, outcome

    return {
        EffectRecord: ledger._SPEC,
        Evidence: outcome._EVIDENCE_SPEC,
        ApprovalRequest: approval_module._REQUEST_SPEC,
        Approval: approval_module._APPROVAL_SPEC,
        Cancellation: cancellation_module._SPEC,
        Lease: lease_module._LEASE_SPEC,
        BudgetCounters: budget_module._COUNTER_SPEC,
        PlanOutline: envelope._OUTLINE_SPEC,
    }[kind]


class RoundTripTests(unittest.TestCase):
    def test_every_valid_record_reads_back_equal(self) -> None:
        for seed in SEEDS:
            rng = random.Random(seed)
            for kind, make in RECORDS.items():
                record = make(rng)
                with self.subTest(seed=seed, record=kind.__name__):
                    self.assertEqual(read_back(record), record)
            with self.subTest(seed=seed, record="RunState"):
                state = run_state(rng)
                self.assertEqual(RunState.from_json(parse_json(canonical_bytes(state.to_json()), what="s", max_bytes=MAX_STATE_BYTES)), state)
                self.assertEqual(decode(encode(state)), state)

    def test_what_is_built_is_what_is_read_tuples_and_integer_times_included(self) -> None:
        record = EffectRecord("k", "s", "a", {"list": (1, (2, 3))}, "d", result=("x", {"y": ()}), cost=3, updated_at=7)
        self.assertEqual(record.payload, {"list": [1, [2, 3]]})
        self.assertEqual(record.result, ["x", {"y": []}])
        self.assertIs(type(record.cost), float)
        self.assertEqual(read_back(record), record)
        self.assertEqual(Receipt(result=(1, 2), cost=2).result, [1, 2])

    def test_effect_rows_of_the_journal_read_back_equal(self) -> None:
        for seed in SEEDS:
            record = effect_record(random.Random(seed))
            row = parse_json(_journal.frame(_journal.row_of(record)).split(b" ", 1)[1], what="row", max_bytes=MAX_STATE_BYTES)
            with self.subTest(seed=seed):
                self.assertEqual(_journal.record_from_row(row), record)

    def test_a_row_with_a_bad_value_in_any_field_is_refused_naming_the_field(self) -> None:
        record = EffectRecord("t/s", "s", "write", {"n": 1}, "sha256:x", EffectState.VERIFIED, 1, 1, receipt="ok", updated_at=1.0)
        row = _journal.row_of(record)
        self.assertEqual(_journal.record_from_row(list(row)), record)
        bad: dict[str, list[Any]] = {
            "key": [None, 1, ["t/s"]],
            "step_id": [None, 1],
            "action": [None, {"a": 1}],
            "payload": [None, [], "x", 1],
            "payload_digest": [None, 1],
            "state": ["done", "VERIFIED", None, 1, ["verified"], {"verified": 1}],
            "attempts": [-1, 1.0, "1", True, None, MAX_INT + 1],
            "epoch": [-1, 1.0, "1", False, None, MAX_INT + 1],
            "cost": ["1", None, True, float("nan"), float("inf"), 10**400, [0.0]],
            "receipt": [1, {"r": 1}, False],
            "evidence": [1, ["e"]],
            "last_error": [1.5, {}],
            "not_before": ["x", True, float("-inf"), {}],
            "approval_id": [1, []],
            "updated_at": [None, "x", True, float("nan"), 10**400],
            "backoff": [1, "x", [], {}, {"duration_s": -1.0, "scheduled_at": 1.0}],
        }
        self.assertEqual(set(bad), set(_journal.EFFECT_FIELDS) - {"result"}, "every field but result (any JSON) is tried")
        for name, values in bad.items():
            index = _journal.EFFECT_FIELDS.index(name)
            for value in values:
                for width, extra in (("current", []), ("blob-carrying", [None])):
                    broken = [*row, *extra]
                    broken[index] = value
                    with self.subTest(field=name, value=value, row=width), self.assertRaises(CorruptStateError) as caught:
                        _journal.record_from_row(broken)
                    self.assertIn(repr(name) if name != "backoff" else "backoff", str(caught.exception))

    def test_rows_of_every_width_and_of_values_written_another_way_read_as_the_record_they_hold(self) -> None:
        from longrun.budget import Backoff

        record = EffectRecord("t/s", "s", "write", {"n": 1}, "sha256:x", EffectState.PLANNED, 2, 3, updated_at=1.0)
        first = _journal.row_of(record)[:-1]  # written before rows had a backoff
        self.assertEqual(_journal.record_from_row(first), record)
        self.assertEqual(_journal.record_from_row([*_journal.row_of(record), None]), record)  # a blob row without blobs
        waiting = dataclasses.replace(record, not_before=5.0, backoff=Backoff(4.0, 1.0), cost=2.0, updated_at=7.0)
        row = _journal.row_of(waiting)
        self.assertEqual(_journal.record_from_row(row), waiting)
        as_integers = list(row)
        for name in ("cost", "not_before", "updated_at"):
            as_integers[_journal.EFFECT_FIELDS.index(name)] = int(getattr(waiting, name))
        read = _journal.record_from_row(as_integers)
        self.assertEqual(read, waiting)
        self.assertEqual([type(read.cost), type(read.not_before), type(read.updated_at)], [float, float, float])
        with self.assertRaises(CorruptStateError):
            _journal.record_from_row(row[:-2])
        with self.assertRaises(CorruptStateError):
            _journal.record_from_row(tuple(row))


class StoreRoundTripTests(support.TempDirTest):
    def test_random_states_committed_and_changed_read_back_equal_from_both_stores(self) -> None:
        stores = {"json": lambda: JsonFileStore(self.path("json"), create=True), "sqlite": lambda: SqliteStore(self.path("db.sqlite"), create=True)}
        for label, open_store in stores.items():
            store = open_store()
            for seed in range(40):
                rng = random.Random(seed)
                task_id = f"t{seed}"
                lease_now = store.acquire_lease(task_id, "owner", 30.0, 1_700_000_000.0)
                state = run_state(rng, task_id, effects=rng.randint(1, 5))
                state.lease_owner, state.lease_epoch = None, 0
                store.commit(lease_now, state)
                for round_ in range(3):  # journal commits: records replaced through with_changes, as the runner does
                    step_id = rng.choice(list(state.effects))
                    changed = effect_record(rng, step_id)
                    state.effects[step_id] = state.effects[step_id].with_changes(
                        result=changed.result, evidence=changed.evidence, attempts=changed.attempts, cost=changed.cost
                    )
                    state.next_action = text(rng, 30)
                    state.unknowns.append(evidence(rng))
                    store.commit(lease_now, state, {step_id})
                    with self.subTest(store=label, seed=seed, round=round_):
                        self.assertEqual(open_store().load(task_id).state, state)


class RefusedBothWaysTests(unittest.TestCase):
    def test_every_invalid_value_is_refused_when_built_and_when_read(self) -> None:
        rng = random.Random(4)
        checked = 0
        for kind, make in RECORDS.items():
            valid = make(rng)
            document = valid.to_json()
            for field in spec_of(kind):
                for value in BAD[field.kind]:
                    if value is None and (field.optional or field.kind is Kind.JSON):
                        continue
                    if kind is Evidence and isinstance(value, str):
                        continue  # diagnostic text: a lone surrogate is kept as its escape (tested below)
                    with self.subTest(record=kind.__name__, field=field.name, value=type(value).__name__):
                        with self.assertRaises(InvalidInputError) as built:
                            kind(**{**{f.name: getattr(valid, f.name) for f in dataclasses.fields(valid)}, field.name: value})
                        self.assertIn(repr(field.name) if field.kind not in (Kind.JSON, Kind.OBJECT) else field.name, str(built.exception))
                        if readable(value) and field.kind not in (Kind.JSON, Kind.OBJECT):
                            with self.assertRaises(CorruptStateError):
                                kind.from_json({**document, field.name: value})
                        checked += 1
        self.assertGreater(checked, 300)

    def test_json_values_the_loader_refuses_are_typed_errors_in_the_encoders_too(self) -> None:
        for value in BAD_JSON:
            with self.subTest(value=type(value).__name__), self.assertRaises(InvalidInputError):
                ensure_json(value)
        for value in UNREADABLE_JSON:
            for encode in (canonical_bytes, _journal.frame):
                with self.subTest(value=type(value).__name__, encoder=encode.__name__), self.assertRaises(InvalidInputError):
                    encode(value)

    def test_random_invalid_values_in_effect_records_built_from_random_valid_ones(self) -> None:
        from longrun import ledger

        for seed in SEEDS:
            rng = random.Random(seed)
            valid = effect_record(rng)
            field = rng.choice(ledger._SPEC)
            candidates = [value for value in BAD[field.kind] if value is not None or not (field.optional or field.kind is Kind.JSON)]
            value = rng.choice(candidates)
            with self.subTest(seed=seed, field=field.name), self.assertRaises(InvalidInputError):
                dataclasses.replace(valid, **{field.name: value})
            if any(value is bad or value == {"v": bad} for bad in READABLE_ONCE_ENCODED):
                continue  # readable once encoded (see BAD_JSON): only where values enter is it refused
            # The unchecked copy the runner's hot path makes is caught by the store's check before any write.
            with self.subTest(seed=seed, field=field.name, path="with_changes"), self.assertRaises(InvalidInputError):
                copy = valid.with_changes(**{field.name: value})
                copy.check_types()
                canonical_bytes(copy.to_json())

    def test_the_adapter_facing_records_refuse_at_the_adapter_s_call(self) -> None:
        for make in (
            lambda: Receipt(evidence=123),  # type: ignore[arg-type]
            lambda: Receipt(evidence=b"ok"),  # type: ignore[arg-type]
            lambda: Receipt(cost=10**400),
            lambda: Receipt(cost=-1.0),
            lambda: Receipt(result=object()),  # type: ignore[arg-type]
            lambda: Receipt(result={"name": "caf\udce9"}),
            lambda: Observation.applied({"http": 200}),  # type: ignore[arg-type]
            lambda: Observation("applied", "x"),  # type: ignore[arg-type]
            lambda: Observation.applied("ok", {"n": 10**5000}),
        ):
            with self.assertRaises(InvalidInputError):
                make()
        # Diagnostic text keeps a lone surrogate as its escape (it came from a file name, say).
        self.assertEqual(Receipt(evidence="wrote caf\udce9").evidence, "wrote caf\\udce9")
        self.assertEqual(Observation.unknown("gone: \udcff").evidence, "gone: \\udcff")
        self.assertEqual(Evidence("a\udcff", "b\udcfe", 1).detail, "b\\udcfe")

    def test_a_state_header_the_loader_would_refuse_is_refused(self) -> None:
        state = run_state(random.Random(1))
        for field, value in (("next_action", {"a": 1}), ("next_action", "x\udcff"), ("status", "done"), ("lease_epoch", -1),
                             ("created_at", float("nan")), ("current_step", 5), ("reconcile_all", "yes")):  # fmt: skip
            broken = dataclasses.replace(state)
            setattr(broken, field, value)
            with self.subTest(field=field), self.assertRaises(InvalidInputError):
                broken.check_header()


class EncoderTests(unittest.TestCase):
    def test_a_value_that_is_not_plain_json_is_a_typed_error_naming_its_path(self) -> None:
        cases = {
            "payload.files[1] holds a lone surrogate": {"files": ["a.txt", "caf\udce9.txt"]},
            "payload.n is an integer of more than 4300 digits": {"n": 10**4300},
            "payload.x[0].y is a non-finite number": {"x": [{"y": float("nan")}]},
            "payload.blob is not JSON-able: bytes": {"blob": b"\x00"},
            "payload['a key'] is not JSON-able: set": {"a key": {1}},
        }
        for message, value in cases.items():
            for call in (ensure_json, digest_of, canonical_bytes):
                with self.subTest(call=call.__name__, message=message), self.assertRaises(InvalidInputError) as caught:
                    call(value, what="payload")  # type: ignore[operator]
                self.assertIn(message, str(caught.exception))

    def test_a_non_string_key_is_refused_where_values_enter(self) -> None:
        for call in (ensure_json, digest_of):
            with self.assertRaises(InvalidInputError) as caught:
                call({"x": {1: "y"}}, what="payload")
            self.assertIn("payload.x has a non-string key 1", str(caught.exception))

    def test_an_encoding_over_the_byte_limit_is_refused_naming_the_limit(self) -> None:
        with self.assertRaises(SizeLimitError) as caught:
            digest_of({"text": "x" * 100}, what="step 'big' payload", max_bytes=50)
        self.assertIn("step 'big' payload is 111 bytes encoded, over the 50-byte limit (MAX_VALUE_BYTES)", str(caught.exception))
        self.assertEqual((caught.exception.size, caught.exception.limit, caught.exception.limit_name), (111, 50, "MAX_VALUE_BYTES"))
        self.assertEqual(digest_of({"text": "x"}, max_bytes=50), digest_of({"text": "x"}))

    def test_printable_escapes_lone_surrogates_only(self) -> None:
        self.assertEqual(printable("plain ✓ \U0001f600"), "plain ✓ \U0001f600")
        self.assertEqual(printable("caf\udce9"), "caf\\udce9")
        printable("caf\udce9").encode("utf-8")


if __name__ == "__main__":
    unittest.main()
