"""The steps by which tasks talk: a message sent, a message received, an event set.

Module-level step procedures over an ``Invocation`` (the rules every step keeps first are in
``engine._steps``); the store is reached only by yielding ``SendMessage`` and ``ReadMessages``
(``engine._ops``), which the drivers perform, and every write of the run's own state goes out with
a fenced ``COMMIT``. What each promises:

- ``send``: the attempt is committed before the message is handed to the store, and the message
  carries the step's key, so a send that the process died in is sent again and the receiver's
  store finds it a duplicate: one message whatever the kills. Its record (the message's number)
  replays without sending. A receiver the store does not hold is recorded as the step's failure
  and raised into the function on every replay (``UnknownTaskError``).
- ``receive``: the oldest message of the topic that no receive of this task recorded is taken,
  and the record that names it (its number) is this task's own, committed in its own fenced
  commit with the next step's start or the stop, like a call's result: nothing the function does
  with the message can be durable before that record is, and a run that dies before it picks the
  same message again (the mailbox numbers messages in the order the sends committed). A message
  from outside waits as a control record, read through the run's approval source
  (``READ_APPROVALS``, see ``outside_messages``): of the mailbox's oldest unreceived message and
  the oldest unconsumed record, the one sent first is taken; a record's message is put in this
  task's mailbox under its key first (a kill after that finds the key there: the same message),
  and the record's id is consumed in the commit that records the receive. With a timeout, the time it ends is recorded when the step is first
  reached; at that time the step is recorded as timed out, and replays as timed out. Without a
  message the run waits in the process for a timeout within ``Limits.max_block_s`` (reading the
  mailbox every ``RECEIVE_POLL_S``), and otherwise stops ``awaiting-input`` (with ``wake_at``, the
  timeout's end, if it has one; naming the control records not used, refused by a strict or a
  signed-only source); a send to the task wakes a worker's copy of it.
- ``set_event``: the key's value, numbered after every set this task made, recorded and committed
  at once, so that readers see it; replay sets nothing.

Not guaranteed: that a message is received by anyone (a task that never receives its topic keeps
it), or that an event's reader sees every value of a key that changes fast.
"""

from __future__ import annotations

import dataclasses

from .. import _crashpoints
from ..approval import Approval
from ..canonical import JSONValue
from ..contract import Step
from ..control import ControlRecord
from ..errors import CorruptStateError, StorageError, UnknownTaskError, describe_exception, exception_message
from ..ledger import EffectRecord, EffectState
from ..messages import RECV_ACTION, Delivery, Message, consumed_messages
from ..outcome import Status
from ..outside_messages import pending_messages
from ..task_events import EVENT_ACTION, event_seq
from ._config import utc
from ._invocation import Invocation
from ._ops import COMMIT, READ_APPROVALS, RENEW_LEASE, ReadMessages, SendMessage, Sleep, Steps
from ._steps import check_cancellation, clamp_to_deadline, plan, ready, start_attempt, stop, transient

__all__ = ["RECEIVE_POLL_S", "receive", "send", "set_event"]

RECEIVE_POLL_S = 0.2
"""How often a receive that waits in the process reads the mailbox again."""

_SETTLED = frozenset({EffectState.VERIFIED, EffectState.FAILED})


def send(inv: Invocation, step: Step) -> Steps[EffectRecord]:
    """Send the message of ``step`` (payload: ``to``, ``topic``, ``key``, ``value``) once; return its
    settled record: verified with ``{"seq": n, "duplicate": bool}``, or failed (no such task)."""
    while True:
        record, settled = yield from ready(inv, step, _SETTLED)
        if settled:
            return record
        record = yield from start_attempt(inv, step, record, f"send the message of step {step.step_id!r} again (its key makes it one message)")
        payload = record.payload
        assert isinstance(payload, dict)
        message = Message.of(
            str(payload["to"]), str(payload["topic"]), payload.get("value"), key=str(payload["key"]), sender=inv.task_id, sent_at=inv.clock.now()
        )
        try:
            delivery: Delivery = yield SendMessage(message)
        except UnknownTaskError as exc:
            yield RENEW_LEASE
            failure: JSONValue = {"type": "UnknownTaskError", "message": exception_message(exc)}
            inv.evidence.observed(f"send:{step.step_id}", f"refused by the store: {describe_exception(exc)}")
            record = record.move(EffectState.FAILED, inv.clock.now(), result=failure, last_error=exception_message(exc))
            inv.put(record)
            return record
        except StorageError as exc:  # the key makes another attempt safe: a message stored is a duplicate
            yield from transient(inv, step, record, exc)
            continue
        if _crashpoints.ARMED:
            _crashpoints.hit("message.sent", f"{step.step_id}#{delivery.seq}")
        yield RENEW_LEASE
        now = inv.clock.now()
        what = "already in its mailbox (a duplicate key)" if delivery.duplicate else "stored"
        inv.evidence.observed(f"send:{step.step_id}", f"message {delivery.seq} to task {message.task_id!r} on topic {message.topic!r} {what}")
        record = record.move(EffectState.VERIFIED, now, result={"seq": delivery.seq, "duplicate": delivery.duplicate}, receipt="sent")
        inv.state.budget = inv.state.budget.progressed(now, inv.take_work())
        inv.put(record)  # committed with the next step's start, or the stop
        return record


def receive(inv: Invocation, step: Step, timeout_s: float | None) -> Steps[EffectRecord]:
    """The oldest unconsumed message of the step's topic, recorded as this step's result
    (``{"task", "seq", "value", "sender", "key", "sent_at"}``: the mailbox and the message, and
    ``"record"``, the control record's id, for a message from outside), or ``{"timed_out": true}``
    once the recorded timeout passed; otherwise wait (see the module docstring)."""
    state = inv.state
    payload = step.payload
    assert isinstance(payload, dict)
    topic = str(payload["topic"])
    while True:
        record = state.effects.get(step.step_id)
        if record is not None and record.state is EffectState.VERIFIED:
            return record
        yield from check_cancellation(inv)
        state.current_step = step.step_id
        if record is None:
            now = inv.clock.now()
            record = plan(inv, step, now)
            if timeout_s is not None:
                record = record.with_changes(not_before=now + timeout_s)  # the timeout's end, recorded once
                inv.put(record)
        try:
            messages: tuple[Message, ...] = yield ReadMessages(topic)
        except CorruptStateError as exc:
            inv.evidence.unknown("messages", str(exc))
            raise (
                yield from stop(
                    inv,
                    Status.UNSAFE_TO_CONTINUE,
                    f"inspect the mailbox of task {inv.task_id!r}: {exc}; restore or remove the damaged message, then run again",
                )
            ) from None
        records: list[ControlRecord] = yield READ_APPROVALS
        outside, reasons = pending_messages(records, inv.task_id, inv.plan_digest, state.consumed_approvals, topic)
        consumed = consumed_messages(inv.task_id, [(other.action, other.result) for other in state.effects.values() if other.action == RECV_ACTION])
        chosen = next((message for message in messages if message.seq not in consumed), None)
        origin: str | None = None
        if outside and (chosen is None or outside[0][1].sent_at < chosen.sent_at):
            approval, carried = outside[0]
            delivered = yield from _take_outside(inv, step, approval, carried, messages, consumed)
            if delivered is None:
                continue  # its key was another message's: look again
            chosen, origin = delivered, approval.approval_id
        now = inv.clock.now()
        if chosen is not None:
            taken: dict[str, JSONValue] = {
                "task": inv.task_id, "seq": chosen.seq, "value": chosen.value, "sender": chosen.sender, "key": chosen.key, "sent_at": chosen.sent_at,
            }  # fmt: skip
            if origin is not None:
                taken["record"] = origin
            result: JSONValue = taken
            whence = f" (control record {origin})" if origin is not None else ""
            inv.evidence.observed(f"recv:{step.step_id}", f"message {chosen.seq} on topic {topic!r} from {chosen.sender}{whence}, consumed once")
        elif record.not_before is not None and now >= record.not_before:
            result = {"timed_out": True}
            inv.evidence.observed(f"recv:{step.step_id}", f"no message on topic {topic!r} before the timeout at {utc(record.not_before)}")
        else:
            wake_at = clamp_to_deadline(inv, record.not_before)  # a receive past the deadline ends at it
            if wake_at is not None and wake_at - now <= inv.limits.max_block_s:
                yield COMMIT  # the timeout's end outlives a process that stops during the wait
                yield Sleep(min(RECEIVE_POLL_S, wake_at - now))
                continue
            for reason in reasons:
                inv.evidence.unknown("message", reason)
            until = f", or run it again at or after {utc(wake_at)}, when the receive times out" if wake_at is not None else ""
            signed = " --sign-key <key file>" if inv.signed_approvals else ""
            note = f" ({len(reasons)} control record{'s' if len(reasons) != 1 else ''} not used: see the unknowns)" if reasons else ""
            raise (
                yield from stop(
                    inv,
                    Status.AWAITING_INPUT,
                    f"send a message on topic {topic!r} to task {inv.task_id!r} (`longrun send {inv.store_spec} {inv.task_id} {topic} VALUE{signed}`, "
                    f"or run.send from another task), then run it again{until}{note}",
                    wake_at=wake_at,
                )
            )
        record = record.move(EffectState.STARTED, now).move(EffectState.VERIFIED, now, result=result, not_before=None)
        state.budget = state.budget.progressed(now, inv.take_work())
        inv.put(record)  # the consumption: this task's own record, committed with the next step's start or the stop
        if _crashpoints.ARMED:
            _crashpoints.hit("message.received", step.step_id)
        return record


def _take_outside(
    inv: Invocation, step: Step, approval: Approval, carried: Message, messages: tuple[Message, ...], consumed: set[int]
) -> Steps[Message | None]:
    """Put the message a control record carries in this task's mailbox (under its key) and mark the
    record consumed (committed with the receive); the message to receive, or None if its key is a
    message already received or of another topic (the record is then only consumed)."""
    delivery: Delivery = yield SendMessage(carried)
    if _crashpoints.ARMED:
        _crashpoints.hit("message.imported", f"{step.step_id}#{delivery.seq}")
    inv.state.consumed_approvals.append(approval.approval_id)
    inv.dirty = True
    if not delivery.duplicate:
        return dataclasses.replace(carried, seq=delivery.seq)
    held = next((message for message in messages if message.seq == delivery.seq), None)
    if held is not None and held.seq not in consumed:
        return held  # put there by a run that died before it recorded the receive
    inv.evidence.observed(
        f"recv:{step.step_id}",
        f"message record {approval.approval_id} from {approval.approver} not received: its key {carried.key!r} is message {delivery.seq}'s",
    )
    return None


def set_event(inv: Invocation, step: Step) -> Steps[EffectRecord]:
    """Record the event of ``step`` (payload: ``key``, ``value``) as this task's latest set of its
    key, and commit it at once; a recorded set replays without setting anything."""
    state = inv.state
    record = state.effects.get(step.step_id)
    if record is not None and record.state is EffectState.VERIFIED:
        return record
    yield from check_cancellation(inv)
    state.current_step = step.step_id
    now = inv.clock.now()
    record = plan(inv, step, now) if record is None else record
    seq = 1 + max((event_seq(other) or 0 for other in state.effects.values() if other.action == EVENT_ACTION), default=0)
    record = record.move(EffectState.STARTED, now).move(EffectState.VERIFIED, now, result={"seq": seq})
    state.budget = state.budget.progressed(now, inv.take_work())
    inv.put(record)
    if _crashpoints.ARMED:
        _crashpoints.hit("event.set", step.step_id)
    yield COMMIT  # readers see it now
    return record
