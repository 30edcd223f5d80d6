"""The run contract and its plan, pinned by one digest.

A ``RunContract`` says what a task is for and what it may do; a list of ``Step``s says what it
will do, in order. ``plan_digest`` is SHA-256 over the canonical JSON of the contract and the
steps' static parts (a callable payload contributes only the fact that it is dynamic). A run
records the digest in its first revision; resuming with any other plan is refused
(``plan-mismatch``) before anything changes.

A payload must be plain JSON that a load reads back (``canonical.ensure_json``: no lone
surrogates, no integer over 4300 digits, ...) and encode to at most ``canonical.MAX_VALUE_BYTES``;
a static payload is checked when its ``Step`` is built, a dynamic one when its effect is planned
(before it is recorded or applied), and a refusal names the step and the path to the bad value.

Not guaranteed: that a dynamic payload callable returns the same value twice. It is evaluated
once, when its effect is planned, and the value is persisted; resumes use the persisted value.
"""

from __future__ import annotations

import hashlib
import operator
from dataclasses import dataclass, field
from itertools import repeat
from json.encoder import encode_basestring
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from .canonical import LARGE_VALUE_BYTES, MAX_VALUE_BYTES, JSONValue, canonical_bytes, canonical_pieces, digest_of, ensure_json, sha256_hex
from .errors import InvalidInputError
from .names import SAFE_NAME, STEP_ID_PATTERN, check_step_id, check_task_id

if TYPE_CHECKING:
    from .budget import RetryPolicy

__all__ = [
    "ASK_ACTION",
    "INTERNAL_PREFIX",
    "PayloadFactory",
    "RunContract",
    "SAFE_NAME",
    "STEP_ID_PATTERN",
    "Step",
    "check_step_id",
    "check_task_id",
    "is_internal",
    "plan_digest",
    "plan_prefix_digests",
    "validate_plan",
]

PayloadFactory = Callable[[Mapping[str, Any]], Mapping[str, Any]]
"""Receives the results of completed steps (step id -> result) and returns the payload. The results
are typed ``Any``: their shape is what the step's own adapter returned, which the caller knows and
a type checker cannot, so ``results["render"]["html"]`` type-checks as written."""


INTERNAL_PREFIX = "longrun."
"""Actions and step ids the engine records for itself (calls, timers, a durable function's own record)."""


ASK_ACTION = INTERNAL_PREFIX + "ask"
"""The action of a durable function's question (``run.ask``): answered with ``longrun answer``, not approved."""


def is_internal(name: str) -> bool:
    return name.startswith(INTERNAL_PREFIX)


def _names(values: Sequence[str], what: str) -> tuple[str, ...]:
    if isinstance(values, str):
        raise InvalidInputError(f"{what} must be a sequence of names, not a single string")
    out = tuple(values)
    for value in out:
        if not isinstance(value, str) or not value:
            raise InvalidInputError(f"{what} must contain non-empty strings, got {value!r}")
    if len(set(out)) != len(out):
        raise InvalidInputError(f"{what} contains duplicates: {out!r}")
    return out


@dataclass(frozen=True, slots=True)
class RunContract:
    """What the task is for and what it may do."""

    task_id: str
    goal: str
    non_goals: tuple[str, ...] = ()
    allowed_actions: tuple[str, ...] = ()
    forbidden_actions: tuple[str, ...] = ()
    completion_evidence: tuple[str, ...] = ()
    """Step ids whose effects must be verified before the run is ``done``; empty means every step."""

    def __post_init__(self) -> None:
        check_task_id(self.task_id)
        if not isinstance(self.goal, str) or not self.goal.strip():
            raise InvalidInputError("a run contract needs a non-empty goal")
        for name in ("non_goals", "allowed_actions", "forbidden_actions", "completion_evidence"):
            object.__setattr__(self, name, _names(getattr(self, name), name))

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "task_id": self.task_id,
            "goal": self.goal,
            "non_goals": list(self.non_goals),
            "allowed_actions": list(self.allowed_actions),
            "forbidden_actions": list(self.forbidden_actions),
            "completion_evidence": list(self.completion_evidence),
        }

    def action_refusal(self, action: str) -> str | None:
        """Why ``action`` may not run under this contract, or None if it may."""
        if action in self.forbidden_actions:
            return f"action {action!r} is forbidden by the run contract"
        if self.allowed_actions and action not in self.allowed_actions:
            return f"action {action!r} is not among the contract's allowed actions {list(self.allowed_actions)}"
        return None


@dataclass(frozen=True, slots=True)
class Step:
    """One effect the plan will make: an action with a payload, optionally behind an approval."""

    step_id: str
    action: str
    payload: Mapping[str, Any] | PayloadFactory = field(default_factory=dict)
    approval: bool = False
    key: str | None = None
    """The stable semantic key of the effect; defaults to ``"<task id>/<step id>"``."""
    observe_first: bool = False
    """Observe the target before this step's first apply: for an effect that an earlier system, or
    this plan under another task id, may already have made. Applied: the step is verified and never
    applied. Absent: it is applied. Unknown: the run stops ``unsafe-to-continue`` unless the adapter
    deduplicates. The observation asks for the step's effect key, so a step moved to a new task id
    keeps its old key (``key="<old task id>/<step id>"``) for the target to find it."""
    after: tuple[str, ...] | None = None
    """The steps this one starts after (each must come earlier in the plan). ``None``, the default,
    means after the step before it, so a plan that never says ``after`` runs in order; ``()`` means
    at once. A ``Runner`` starts every step whose steps before are verified, up to ``max_parallel``
    at a time. Pinned by the plan digest when set."""
    timeout_s: float | None = None
    """Bounds each ``apply`` of this step (the run's ``timeout_s`` otherwise); not pinned by the digest."""
    retry: RetryPolicy | None = None
    """This step's retry policy (the run's otherwise); not pinned by the digest."""
    _static: tuple[dict[str, JSONValue], str, bytes | None, bytes | None] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    """A static payload as plain JSON and its digest, made once when the step is built; then what
    the step adds to the plan digest's encoding (``_pinned_parts``), made from the payload's encoding
    that its digest took anyway: None, None for a payload over ``_PINNED_PAYLOAD_BYTES`` (not kept
    twice) or a step that cannot be encoded (``plan_digest`` encodes ``static_json`` then, and
    names the bad value). Until a plan holding the step is first digested, the last two are the
    payload's encoding (or None) and ``_UNBUILT``; ``_built`` makes the parts then, once.
    In this one field: a field more would make each step a larger object,
    which the garbage collector's passes over a long plan were measured to walk at twice the cost."""

    def __post_init__(self) -> None:
        check_step_id(self.step_id)
        if not isinstance(self.action, str) or not self.action:
            raise InvalidInputError(f"step {self.step_id!r} needs a non-empty action name")
        if not isinstance(self.approval, bool):
            raise InvalidInputError(f"step {self.step_id!r}: approval must be True or False")
        if not isinstance(self.observe_first, bool):
            raise InvalidInputError(f"step {self.step_id!r}: observe_first must be True or False")
        if self.key is not None and (not isinstance(self.key, str) or not self.key):
            raise InvalidInputError(f"step {self.step_id!r}: key must be a non-empty string")
        if self.after is not None:
            if isinstance(self.after, str) or not isinstance(self.after, (tuple, list)):
                raise InvalidInputError(f"step {self.step_id!r}: after must be a tuple of step ids, got {self.after!r}")
            for name in self.after:
                check_step_id(name)
            object.__setattr__(self, "after", tuple(self.after))
        if self.timeout_s is not None and (
            isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) or not 0 < self.timeout_s < float("inf")
        ):
            raise InvalidInputError(f"step {self.step_id!r}: timeout_s must be a finite number > 0, got {self.timeout_s!r}")
        if self.retry is not None:
            from .budget import RetryPolicy  # here: budget's records import this module's step id rules

            if not isinstance(self.retry, RetryPolicy):
                raise InvalidInputError(f"step {self.step_id!r}: retry must be a RetryPolicy")
        if not callable(self.payload):
            if type(self.payload) is not dict and not isinstance(self.payload, Mapping):  # a dict skips the ABC's check
                raise InvalidInputError(f"step {self.step_id!r}: payload must be a mapping or a callable")
            # Plain JSON a load reads back, within the size a run records: refused here, before any
            # run. The payload is captured now: the plain copy and its digest serve every planning.
            what = f"step {self.step_id!r} payload"
            plain = ensure_json(self.payload, what=what)
            pieces = canonical_pieces(plain, what=what)
            if len(pieces) == 1 and len(pieces[0]) < LARGE_VALUE_BYTES:  # under the size limit, and too small for a store to reuse
                encoded = pieces[0]
                digest = "sha256:" + sha256_hex(encoded)
            else:  # size-checked, hashed piece by piece and remembered for the store that writes it as a blob
                encoded = b"".join(pieces) if sum(map(len, pieces)) <= _PINNED_PAYLOAD_BYTES else b""
                digest = digest_of(plain, what=what, max_bytes=MAX_VALUE_BYTES, checked=True, pieces=pieces)
            # The plan digest's parts are built from this encoding when a plan is first digested
            # (``_built``): a durable function's steps are never digested, so they never build them.
            pinned = encoded if 0 < len(encoded) <= _PINNED_PAYLOAD_BYTES else None
            object.__setattr__(self, "_static", (plain, digest, pinned, _UNBUILT))

    @property
    def dynamic(self) -> bool:
        return callable(self.payload)

    @property
    def static_payload(self) -> tuple[dict[str, JSONValue], str] | None:
        """A static step's payload as plain JSON and its digest (computed once, when the step was
        built); None for a payload factory."""
        return None if self._static is None else self._static[:2]

    def effect_key(self, task_id: str) -> str:
        return self.key if self.key is not None else f"{task_id}/{self.step_id}"

    def static_json(self, task_id: str) -> dict[str, JSONValue]:
        """The parts of the step that the plan digest pins.

        ``observe_first`` changes what a run does (an unknown observation stops it where it would
        otherwise apply), so it is pinned like the rest; it appears only when set, so the digest of
        every plan that does not use it is the one it always had."""
        payload: JSONValue = {"$dynamic": True} if self._static is None else self._static[0]
        pinned: dict[str, JSONValue] = {
            "step_id": self.step_id,
            "action": self.action,
            "approval": self.approval,
            "key": self.effect_key(task_id),
            "payload": payload,
        }
        if self.observe_first:
            pinned["observe_first"] = True
        if self.after is not None:
            pinned["after"] = list(self.after)
        return pinned

    def evaluate_payload(self, results: Mapping[str, JSONValue]) -> dict[str, JSONValue]:
        """The payload as plain JSON: the mapping itself, or what the factory returns for ``results``."""
        if self._static is not None:
            return self._static[0]
        value = self.payload(results) if callable(self.payload) else self.payload
        if not isinstance(value, Mapping):
            raise InvalidInputError(
                f"payload of step {self.step_id!r} must be a mapping, got {type(value).__name__}"
            )
        payload = ensure_json(value, what=f"step {self.step_id!r} payload")
        assert isinstance(payload, dict)  # a Mapping, made plain
        return payload


_PINNED_PAYLOAD_BYTES = 4096
"""The longest payload encoding a step keeps in its part of the plan encoding; a longer one is encoded
again when a plan is digested, rather than held twice for as long as the step lives."""
if not _PINNED_PAYLOAD_BYTES < LARGE_VALUE_BYTES <= MAX_VALUE_BYTES:  # Step.__post_init__ hashes a small payload itself
    raise ImportError("a payload under LARGE_VALUE_BYTES must be under the size limit, and one small enough to pin under both")


def _text(value: str) -> bytes:
    """A string as the canonical encoder writes it (``ensure_ascii=False``: the same escapes)."""
    return encode_basestring(value).encode("utf-8")  # a lone surrogate raises UnicodeEncodeError


def _pinned_parts(step: Step, payload: bytes) -> tuple[bytes | None, bytes | None]:
    """What ``step`` adds to the plan digest's encoding: ``static_json``'s keys in the canonical
    (sorted) order, each value as ``canonical_bytes`` writes it. The default effect key holds the
    task id, which a step does not know: then the bytes before the task id and the bytes after it;
    with a key of its own, all of it and None; None, None if a value cannot be encoded."""
    try:
        head = b'{"action":' + _text(step.action)
        if step.after is not None:
            head += b',"after":[' + b",".join(map(_text, step.after)) + b"]"
        head += b',"approval":' + (b"true" if step.approval else b"false") + b',"key":'
        tail = b',"observe_first":true' if step.observe_first else b""
        tail += b',"payload":' + payload + b',"step_id":' + _text(step.step_id) + b"}"
        if step.key is not None:
            return head + _text(step.key) + tail, None
    except UnicodeEncodeError:
        return None, None
    # The default key, "<task id>/<step id>": both are names that JSON writes as they are.
    return head + b'"', b"/" + step.step_id.encode("ascii") + b'"' + tail


_UNBUILT = b"\0unbuilt"
"""In a step's ``_static``, where the tail goes: its digest parts are not built yet. Compared by
equality, never identity (a step pickled and loaded again holds an equal copy): a built tail is
None or starts with ``/``, so it never equals this."""


def _built(step: Step) -> tuple[dict[str, JSONValue], str, bytes | None, bytes | None] | None:
    """``step._static`` with the plan digest's parts built (once: kept on the step). Two threads
    digesting one plan at once may both build them; both build the same bytes."""
    static = step._static
    if static is None or static[3] != _UNBUILT:
        return static
    payload = static[2]
    head, tail = _pinned_parts(step, payload) if payload is not None else (None, None)
    built = (static[0], static[1], head, tail)
    object.__setattr__(step, "_static", built)
    return built


def _step_encoding(step: Step, task_id: str, index: int) -> bytes:
    """``canonical_bytes(step.static_json(task_id))``, from the parts the step made when it has them."""
    static = _built(step)
    if static is None or static[2] is None:
        return canonical_bytes(step.static_json(task_id), what=f"plan.steps[{index}]")
    head, tail = static[2], static[3]
    return head if tail is None else head + task_id.encode("ascii") + tail


_statics_of = operator.attrgetter("_static")
_heads_of = operator.itemgetter(2)
_tails_of = operator.itemgetter(3)


_PIECES_PER_PART = 16384
"""How many pieces ``_plan_encoding`` joins at a time: parts of a few hundred kilobytes, hashed as
they come, rather than one buffer of the whole plan (10 MB for 100,000 steps) written once, read once."""


def _plan_encoding(contract: RunContract, steps: Sequence[Step]) -> Iterator[bytes]:
    """The canonical JSON of ``{"contract": C, "steps": [S1, ..., Sk]}`` (``plan_digest``'s
    definition), in consecutive parts: its keys in order, the contract encoded, each step's part as
    the step made it.

    When every step has its part and the default key (static payloads, the common plan), the parts
    are laid out around the task id by list slicing, with no Python-level loop over the steps."""
    task_id = contract.task_id.encode("ascii")  # a safe name
    yield b'{"contract":' + canonical_bytes(contract.to_json(), what="plan.contract") + b',"steps":['
    statics: list[Any] = list(map(_statics_of, steps))  # every item a 4-tuple once all(statics) holds
    count = len(statics)
    if count and all(statics):
        if _UNBUILT in map(_tails_of, statics):  # a plan digested for the first time: its steps' parts built once
            statics = list(map(_built, steps))
        heads: list[bytes] = list(map(_heads_of, statics))
        tails: list[bytes] = list(map(_tails_of, statics))
        if all(heads) and all(tails):  # no None among them
            pieces = [b","] * (4 * count)  # per step: head, task id, tail, comma
            pieces[0::4] = heads
            pieces[1::4] = [task_id] * count
            pieces[2::4] = tails
            pieces[-1] = b"]}"
            for start in range(0, len(pieces), _PIECES_PER_PART):
                yield b"".join(pieces[start : start + _PIECES_PER_PART])
            return
    for index, step in enumerate(steps):
        encoded = _step_encoding(step, contract.task_id, index)
        yield b"," + encoded if index else encoded
    yield b"]}"


_step_ids_of = operator.attrgetter("step_id")
_keys_of = operator.attrgetter("key")
_afters_of = operator.attrgetter("after")


def validate_plan(contract: RunContract, steps: Sequence[Step]) -> tuple[Step, ...]:
    """Check the steps against each other and the contract; return them as a tuple.

    A plan may have a hundred thousand steps, and a resume checks it before anything else: each
    check is one pass in C (``map``, ``set``, ``count``) over the steps, and the ones only some
    plans need (steps with keys of their own, or with ``after``) look at each step only then."""
    if isinstance(contract, RunContract) is False:
        raise InvalidInputError("contract must be a RunContract")
    plan = tuple(steps)
    if not plan:
        raise InvalidInputError("a plan needs at least one step")
    if not all(map(isinstance, plan, repeat(Step, len(plan)))):
        wrong = next(step for step in plan if not isinstance(step, Step))
        raise InvalidInputError(f"plan entries must be Step, got {type(wrong).__name__}")
    ids = list(map(_step_ids_of, plan))
    known = set(ids)
    if len(known) != len(ids):
        raise InvalidInputError(f"step ids must be unique: {ids!r}")
    # With unique step ids the default keys ("<task id>/<step id>") are unique: only a plan that
    # gives some step a key of its own needs its keys compared.
    if list(map(_keys_of, plan)).count(None) != len(plan):
        keys = [step.effect_key(contract.task_id) for step in plan]
        if len(set(keys)) != len(keys):
            raise InvalidInputError(f"effect keys must be unique: {keys!r}")
    if list(map(_afters_of, plan)).count(None) != len(plan):
        seen: set[str] = set()
        for step in plan:
            later = [name for name in step.after or () if name not in seen]
            if later:
                raise InvalidInputError(f"step {step.step_id!r} is after {later!r}, which must be steps earlier in the plan")
            seen.add(step.step_id)
    unknown = [name for name in contract.completion_evidence if name not in known]
    if unknown:
        raise InvalidInputError(f"completion evidence names steps that are not in the plan: {unknown!r}")
    return plan


def plan_digest(contract: RunContract, steps: Sequence[Step]) -> str:
    """SHA-256 over the canonical JSON of the contract and the steps' static parts:
    ``{"contract": contract.to_json(), "steps": [step.static_json(task_id), ...]}``."""
    running = hashlib.sha256()
    for part in _plan_encoding(contract, steps):
        running.update(part)
    return "sha256:" + running.hexdigest()


def plan_prefix_digests(contract: RunContract, steps: Sequence[Step]) -> dict[str, int]:
    """``plan_digest`` of every non-empty prefix of ``steps``, mapped to the prefix's length.

    One pass: the canonical JSON of ``{"contract": C, "steps": [S1, ..., Sk]}`` is a running hash
    of the steps followed by ``]}``, so every prefix costs one hash copy rather than a re-encoding.
    A task whose recorded digest is among these was started with a shorter plan that this one
    extends by appending steps.
    """
    running = hashlib.sha256(b'{"contract":' + canonical_bytes(contract.to_json(), what="plan.contract") + b',"steps":[')
    digests: dict[str, int] = {}
    for index, step in enumerate(steps):
        if index:
            running.update(b",")
        running.update(_step_encoding(step, contract.task_id, index))
        prefix = running.copy()
        prefix.update(b"]}")
        digests["sha256:" + prefix.hexdigest()] = index + 1
    return digests
