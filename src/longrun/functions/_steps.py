"""What both faces of a durable function share: the step ids claimed once per run, divergence
from the record, and how each kind of step is built and its record replayed (a child's lineage
and the cycle it refuses: ``functions._lineage``; a send, a receive and an event, whose step ids
may be derived: ``<action>:<target>@<n>``, the n-th of its kind and target in this run)."""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

from .. import _crashpoints
from ..canonical import JSONValue, canonical_bytes, digest_of, ensure_json
from ..contract import ASK_ACTION, INTERNAL_PREFIX, Step, check_step_id, check_task_id
from ..engine import Engine, Invocation, Steps, procedures
from ..errors import CallFailed, ChildCycleError, EffectFailed, InvalidInputError, SizeLimitError, UnknownTaskError
from ..ledger import EffectRecord, EffectState
from ..messages import MAX_KEY_CHARS, MAX_MESSAGE_BYTES, RECV_ACTION, SEND_ACTION, check_topic, sent_key
from ..outcome import ENDED_UNFINISHED, RunOutcome, Status
from ..task_events import EVENT_ACTION

from ._family import waiting_path
from ._lineage import (
    CALL_ACTION,
    CHILD_ACTION,
    SLEEP_ACTION,
    ChildFunction,
    ChildLink,
    TaskFunction,
    cancelled_with,
    check_no_cycle,
    lineage,
    qualified_name,
)

__all__ = ["RunSteps", "check_on_exhausted"]


class RunSteps:
    """What ``Run`` and ``AsyncRun`` share: step ids, and each step checked against what is recorded."""

    def __init__(self, engine: Engine, function: TaskFunction):
        self._engine = engine
        self._function = function
        self._used: set[str] = set()
        self._ordinals: dict[str, int] = {}
        """How many steps of each derived prefix (``longrun.send:<task>/<topic>``, ...) this run asked for."""

    @property
    def task_id(self) -> str:
        return self._engine.config.task_id

    def _claim(self, step_id: str) -> str:
        check_step_id(step_id)
        if step_id.startswith(INTERNAL_PREFIX):
            raise InvalidInputError(f"step id {step_id!r}: ids starting with {INTERNAL_PREFIX!r} are reserved")
        if step_id in self._used:
            raise InvalidInputError(f"step id {step_id!r} is used twice in one run of {self._function.name}")
        self._used.add(step_id)
        return step_id

    def _diverged(self, step_id: str, what: str, recorded: str, now: str) -> BaseException:
        return self._engine.record(
            procedures.mismatch,
            f"step {step_id!r}: recorded {what} {recorded}, the code now asks for {now}",
            f"restore the code that recorded step {step_id!r} ({what} {recorded}), or give the changed step a new id; "
            "nothing was applied",
        )

    def _effect_step(
        self, step_id: str, action: str, payload: Mapping[str, Any], approval: bool, observe_first: bool
    ) -> Step:
        self._claim(step_id)
        engine = self._engine
        if not isinstance(action, str) or action.startswith(INTERNAL_PREFIX):
            raise InvalidInputError(f"step {step_id!r}: action {action!r} is not a user action")
        config = engine.config
        if action not in config.adapters:
            config.adapter_for(action, step_id=step_id)  # raises, naming the actions that have one
        refusal = config.contract.action_refusal(action)
        if refusal is not None:
            raise engine.record(procedures.refused_action, step_id, refusal)
        step = Step(step_id, action, payload, approval=approval, observe_first=observe_first)
        recorded = engine.invocation.state.effects.get(step_id)
        if recorded is not None:
            if recorded.action != action:
                raise self._diverged(step_id, "action", repr(recorded.action), repr(action))
            static = step.static_payload  # the digest the step made when it was built
            digest = static[1] if static is not None else digest_of(step.evaluate_payload({}), what=f"payload of step {step_id!r}")
            if recorded.payload_digest != digest:
                raise self._diverged(step_id, "payload digest", recorded.payload_digest, digest)
        return step

    def _call_step(self, step_id: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], replay: str) -> Step:
        self._claim(step_id)
        if replay not in ("strict", "by-id"):
            raise InvalidInputError(f"step {step_id!r}: replay must be 'strict' or 'by-id', got {replay!r}")
        if not callable(fn):
            raise InvalidInputError(f"step {step_id!r}: {fn!r} is not callable")
        arguments = ensure_json({"args": list(args), "kwargs": dict(kwargs)}, what=f"arguments of step {step_id!r}")
        payload = {"function": qualified_name(fn), "arguments": digest_of(arguments)}
        step = Step(step_id, CALL_ACTION, payload)
        recorded = self._engine.invocation.state.effects.get(step_id)
        if recorded is not None:
            if recorded.action != CALL_ACTION:
                raise self._diverged(step_id, "action", repr(recorded.action), "a call")
            if replay == "strict" and recorded.payload_digest != digest_of(payload):
                raise self._diverged(step_id, "call digest", recorded.payload_digest, digest_of(payload))
        return step

    @staticmethod
    def _call_result(step_id: str, record: EffectRecord) -> Any:
        if record.state is EffectState.FAILED:
            failure = record.result if isinstance(record.result, dict) else {}
            raise CallFailed(step_id, str(failure.get("type", "Exception")), str(failure.get("message", record.last_error)))
        return record.result

    def _sleep_step(self, step_id: str, seconds: float) -> Step:
        self._claim(step_id)
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds < 0:
            raise InvalidInputError(f"step {step_id!r}: seconds must be a finite number >= 0, got {seconds!r}")
        recorded = self._engine.invocation.state.effects.get(step_id)
        if recorded is not None and recorded.action != SLEEP_ACTION:
            raise self._diverged(step_id, "action", repr(recorded.action), "a sleep")
        return Step(step_id, SLEEP_ACTION, {"seconds": seconds})

    def _ask(self, step_id: str, question: str, choices: Sequence[JSONValue] | None) -> JSONValue:
        step, choice_list = self._question(step_id, question, choices)
        return self._engine.drive(procedures.ask, step, choice_list).result

    def _question(self, step_id: str, question: str, choices: Sequence[JSONValue] | None) -> tuple[Step, list[JSONValue] | None]:
        """The step of a question, checked against what is recorded, and its choices."""
        self._claim(step_id)
        if not isinstance(question, str) or not question.strip():
            raise InvalidInputError(f"step {step_id!r}: the question must be a non-empty string")
        listed = None if choices is None else ensure_json(list(choices), what=f"choices of step {step_id!r}")
        payload: dict[str, JSONValue] = {"question": question, "choices": listed}
        recorded = self._engine.invocation.state.effects.get(step_id)
        if recorded is not None:
            if recorded.action != ASK_ACTION:
                raise self._diverged(step_id, "action", repr(recorded.action), "a question")
            if recorded.payload_digest != digest_of(payload):
                raise self._diverged(step_id, "question digest", recorded.payload_digest, digest_of(payload))
        return Step(step_id, ASK_ACTION, payload), listed if isinstance(listed, list) else None

    def _link(self, detached: bool) -> ChildLink:
        """What a child this task starts records of its family: this task, its lineage, and whose
        cancellation reaches the child (this task's and whose reaches this task, unless detached)."""
        state = self._engine.invocation.state
        reached = () if detached else (self.task_id, *cancelled_with(state))
        deadline_at = state.deadline.at if state.deadline is not None and not detached else None
        return ChildLink(self.task_id, (self.task_id, *lineage(state)), detached, reached, deadline_at)

    def _child_record(
        self, inv: Invocation, task_id: str, function: ChildFunction, args: tuple[Any, ...], kwargs: dict[str, Any], detached: bool
    ) -> Steps[tuple[str, EffectRecord]]:
        """The child's record in this run (planned now if new); a planned one is still to be driven.
        A step procedure: the store's family records and the cancellation are read by the driver."""
        check_task_id(task_id)
        if not isinstance(function, ChildFunction):
            raise InvalidInputError(f"child {task_id!r}: {function!r} is not a durable function")
        if not isinstance(detached, bool):
            raise InvalidInputError(f"child {task_id!r}: detached must be True or False, got {detached!r}")
        state = inv.state
        check_no_cycle(self.task_id, task_id, lineage(state))
        step_id = f"{CHILD_ACTION}:{task_id}"
        if step_id not in state.effects:  # a new child: does it (through its own children) wait on this task?
            parent = self.task_id
            path = yield from procedures.read_store(inv, lambda store: waiting_path(store, task_id, parent))
            if path:
                shown = " -> ".join(repr(task) for task in (self.task_id, *path))
                raise ChildCycleError(
                    f"task {self.task_id!r} asks for {task_id!r} as its child, which waits on it ({shown}): both would "
                    "wait for ever; nothing was started: give the child another task id",
                    child=task_id,
                    lineage=(self.task_id, *lineage(state)),
                )
        if step_id in self._used:
            raise InvalidInputError(f"child task {task_id!r} is used twice in one run of {self._function.name}")
        self._used.add(step_id)
        arguments = ensure_json({"args": list(args), "kwargs": dict(kwargs)}, what=f"arguments of child {task_id!r}")
        payload: dict[str, JSONValue] = {"task": task_id, "function": function.name, "arguments": digest_of(arguments)}
        if detached:  # only then: the digest of a child recorded before the option existed is unchanged
            payload["detached"] = True
        recorded = state.effects.get(step_id)
        if recorded is not None and recorded.payload_digest != digest_of(payload):
            raise self._diverged(step_id, "child digest", recorded.payload_digest, digest_of(payload))
        record = procedures.plan(inv, Step(step_id, CHILD_ACTION, payload))
        if record.state is EffectState.PLANNED:
            yield from procedures.check_cancellation(inv)  # a cancelled parent drives its child no further
        return step_id, record

    def _child_settled(self, inv: Invocation, step_id: str, task_id: str, outcome: RunOutcome) -> Steps[EffectRecord]:
        """The child's record settled by its outcome; a child not done yet stops this run (committed)."""
        if _crashpoints.ARMED:
            _crashpoints.hit("child.returned", task_id)
        if outcome.status is Status.DONE:
            return procedures.complete(inv, step_id, outcome.result)
        if outcome.status in ENDED_UNFINISHED:
            failure: JSONValue = {"type": "ChildEnded", "message": f"child task {task_id!r} ended {outcome.status.value}"}
            return procedures.complete(inv, step_id, failure, failed=True)
        raise (
            yield from procedures.wait(
                inv,
                Status.WAITING_ON_CHILD,
                f"child task {task_id!r} is {outcome.status.value} ({outcome.next_action}); run this task again after it",
                wake_at=outcome.wake_at,
            )
        )

    @staticmethod
    def _child_result(step_id: str, record: EffectRecord) -> Any:
        if record.state is EffectState.FAILED:
            failure_record = record.result if isinstance(record.result, dict) else {}
            raise CallFailed(step_id, str(failure_record.get("type", "ChildEnded")), str(failure_record.get("message", "")))
        return record.result

    # -- talking: messages and events (``engine.send``, ``engine.receive``, ``engine.set_event``) ----------

    def _talk_id(self, prefix: str, step_id: str | None) -> str:
        """The step id of a send, a receive or an event: the one given (claimed like any), else
        ``<prefix>@<n>`` for the n-th of that prefix in this run (deterministic as the code is)."""
        if step_id is not None:
            return self._claim(step_id)
        n = self._ordinals.get(prefix, 0) + 1
        self._ordinals[prefix] = n
        derived = check_step_id(f"{prefix}@{n}")
        self._used.add(derived)
        return derived

    def _checked_talk(self, step_id: str, action: str, payload: dict[str, JSONValue], what: str) -> Step:
        recorded = self._engine.invocation.state.effects.get(step_id)
        if recorded is not None:
            if recorded.action != action:
                raise self._diverged(step_id, "action", repr(recorded.action), what)
            if recorded.payload_digest != digest_of(payload):
                raise self._diverged(step_id, f"{what} digest", recorded.payload_digest, digest_of(payload))
        return Step(step_id, action, payload)

    def _send_step(self, to_task: str, topic: str, value: object, key: str | None, step_id: str | None) -> Step:
        check_task_id(to_task)
        check_topic(topic)
        plain = _bounded(value, f"the value of a message on topic {topic!r}")
        if key is not None and (not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS):
            raise InvalidInputError(f"a message key must be a string of 1-{MAX_KEY_CHARS} characters, got {key!r:.80}")
        sid = self._talk_id(f"{SEND_ACTION}:{to_task}/{topic}", step_id)
        payload: dict[str, JSONValue] = {"to": to_task, "topic": topic, "key": key if key is not None else sent_key(self.task_id, sid), "value": plain}
        return self._checked_talk(sid, SEND_ACTION, payload, "a send")

    @staticmethod
    def _sent(record: EffectRecord) -> int:
        if record.state is EffectState.FAILED:
            failure = record.result if isinstance(record.result, dict) else {}
            raise UnknownTaskError(f"step {record.step_id!r}: {failure.get('message', record.last_error)} (recorded: the send is not made again)")
        result = record.result if isinstance(record.result, dict) else {}
        seq = result.get("seq")
        return seq if isinstance(seq, int) else 0

    def _recv_step(self, topic: str, timeout_s: float | None, step_id: str | None) -> Step:
        check_topic(topic)
        if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not math.isfinite(timeout_s) or timeout_s < 0):
            raise InvalidInputError(f"receive on topic {topic!r}: timeout_s must be a finite number >= 0 or None, got {timeout_s!r}")
        sid = self._talk_id(f"{RECV_ACTION}:{topic}", step_id)
        return self._checked_talk(sid, RECV_ACTION, {"topic": topic}, "a receive")

    @staticmethod
    def _received(record: EffectRecord) -> JSONValue:
        result = record.result if isinstance(record.result, dict) else {}
        return None if result.get("timed_out") else result.get("value")

    def _event_step(self, key: str, value: object, step_id: str | None) -> Step:
        check_topic(key, what="event key")
        plain = _bounded(value, f"the value of event {key!r}")
        sid = self._talk_id(f"{EVENT_ACTION}:{key}", step_id)
        return self._checked_talk(sid, EVENT_ACTION, {"key": key, "value": plain}, "an event")

    @staticmethod
    def _effect_result(record: EffectRecord) -> JSONValue:
        """An effect's result; ``EffectFailed`` (as recorded) for one whose attempts ran out."""
        if record.state is EffectState.FAILED:
            failure = record.result if isinstance(record.result, dict) else {}
            attempts = failure.get("attempts", record.attempts)
            raise EffectFailed(record.step_id, attempts if isinstance(attempts, int) else record.attempts, str(failure.get("last_error", record.last_error)))
        return record.result


def _bounded(value: object, what: str) -> JSONValue:
    """``value`` as plain JSON of at most ``MAX_MESSAGE_BYTES`` encoded (``SizeLimitError`` past it)."""
    plain = ensure_json(value, what=what)
    size = len(canonical_bytes(plain))
    if size > MAX_MESSAGE_BYTES:
        raise SizeLimitError(
            f"{what} is {size} bytes encoded, over MAX_MESSAGE_BYTES ({MAX_MESSAGE_BYTES}): pass a reference (a path, a digest) instead",
            size=size, limit=MAX_MESSAGE_BYTES, limit_name="MAX_MESSAGE_BYTES",
        )  # fmt: skip
    return plain


def check_on_exhausted(on_exhausted: str) -> str:
    """``on_exhausted`` if it is ``"stop"`` or ``"raise"``, else ``InvalidInputError``."""
    if on_exhausted not in ("stop", "raise"):
        raise InvalidInputError(f"on_exhausted must be 'stop' or 'raise', got {on_exhausted!r}")
    return on_exhausted
