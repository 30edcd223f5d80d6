"""Messages from outside: a message sent to a task by a caller that is not a task (``fn.send``,
``longrun send``) travels as a control record, like an answer.

The record is an ``approval.Approval`` with an action of its own (``MESSAGE_ACTION``); its step id
is ``MESSAGE_STEP_PREFIX`` and the topic, and ``answer`` holds the message (``topic``, ``key``,
``value``), whose digest is the record's ``payload_digest``; ``approver`` is the sender and
``granted_at`` the time it was sent. So it goes through every control source an answer goes
through: the store, a strict ``FileControlSource`` (where only files in its directory, owned by
the approver account, count) and ``SignedApprovals`` (whose signature covers every field, the
message included). A source that refuses it hands it over as a ``RefusedRecord``: it is then not
delivered, and stays where it was written (nothing is lost; sign it, or write it where the task
reads, and send it again). A writer whose configuration requires signed records refuses to write
an unsigned one (``SignatureRequiredError``, nothing written). The approval gate never takes one
for an approval (its step id and action are no step's).

The receiving task's ``run.recv`` takes it (``engine._talk``): the record's message is put in the
task's own mailbox (``Store.send_message``, with the record's key), then received like any other
message, and the record's id is recorded among the state's consumed approvals in the same fenced
commit as the receive. The key deduplicates at the receiver: a record whose key the mailbox
already holds stores nothing there, so a message sent twice with one key (two records), or taken
again after a kill between the mailbox write and the commit, is received once.

Order: a receive takes the oldest message of its topic, merging the two kinds by time: the
mailbox's unreceived messages in the order their sends committed, the unconsumed records in the
order they were sent (``granted_at``, then the id, which begins with the writer's clock in
nanoseconds: ``record_id``), and of the two oldest the one sent first (on a tie, the mailbox's).

Not guaranteed: the order of a record and a task's message sent within the clock skew between
their senders' machines; that a record written after the receive that it would have preceded
(a late or back-dated one) goes first: it is received next.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from .approval import Approval
from .canonical import JSONValue, canonical_bytes, digest_of
from .contract import INTERNAL_PREFIX
from .control import MAX_RECORD_BYTES, ControlRecord
from .errors import CorruptStateError, SignatureRequiredError, SizeLimitError, UnknownTaskError
from .intervention import ApprovalWriter, Signer
from .messages import Message, check_topic
from .protocols import SigningSource, Store

__all__ = [
    "MESSAGE_ACTION",
    "MESSAGE_KEEP_S",
    "MESSAGE_STEP_PREFIX",
    "Posted",
    "outside_message",
    "pending_messages",
    "post_message",
    "record_id",
    "requires_signature",
]

MESSAGE_ACTION = INTERNAL_PREFIX + "message"
"""The action of a control record that carries a message from outside."""
MESSAGE_STEP_PREFIX = INTERNAL_PREFIX + "message/"
"""The step id of such a record is this prefix and the message's topic."""
MESSAGE_KEEP_S = 10 * 366 * 86_400.0
"""A record's ``expires_at`` is this long after it was sent: a message does not expire (a receive
never judges the expiry of one); the field is there because every control record has one."""
_SIGNATURE_ROOM = 160
"""Bytes a signature adds to a record (``"signature":"hmac-sha256:<16 hex>:<64 hex>"`` and more)."""

@dataclass(frozen=True, slots=True)
class Posted:
    """What a send from outside did: the control record written (``record_id``; ``written_to`` the
    file, or None for the store; ``signed``), or nothing when the task's mailbox already holds a
    message with the key (``duplicate``; ``seq`` is that message's number, else 0: a message
    from outside is numbered when the task receives it)."""

    task_id: str
    topic: str
    key: str
    record_id: str | None
    written_to: str | None = None
    signed: bool = False
    duplicate: bool = False
    seq: int = 0


def outside_message(
    task_id: str,
    plan_digest: str,
    topic: str,
    value: object,
    *,
    key: str,
    sender: str,
    sent_at: float,
    record_id: str,
) -> Approval:
    """The control record that carries a message to ``task_id`` (a task of ``plan_digest``).
    ``InvalidInputError`` for a bad topic, key, sender or a value that is not JSON; ``SizeLimitError``
    for a value over ``messages.MAX_MESSAGE_BYTES`` or a record (signature included) over
    ``control.MAX_RECORD_BYTES``."""
    message = Message.of(task_id, topic, value, key=key, sender=sender, sent_at=sent_at)  # every field checked
    body: dict[str, JSONValue] = {"topic": message.topic, "key": message.key, "value": message.value}
    record = Approval(
        approval_id=record_id, task_id=task_id, plan_digest=plan_digest, step_id=MESSAGE_STEP_PREFIX + message.topic,
        payload_digest=digest_of(body), action=MESSAGE_ACTION, expires_at=sent_at + MESSAGE_KEEP_S, approver=sender,
        granted_at=sent_at, answer=body,
    )  # fmt: skip
    size = len(canonical_bytes(record.to_json())) + _SIGNATURE_ROOM
    if size > MAX_RECORD_BYTES:
        raise SizeLimitError(
            f"a message from outside travels as a control record of at most {MAX_RECORD_BYTES} bytes, and this one "
            f"(topic {topic!r}) would be {size}: send a reference (a path, a digest) instead; nothing was sent",
            size=size, limit=MAX_RECORD_BYTES, limit_name="MAX_RECORD_BYTES",
        )  # fmt: skip
    return record


def _carried(approval: Approval) -> Message:
    """The message ``approval`` carries (``seq`` 0); ``CorruptStateError`` if it does not say one."""
    body = approval.answer
    if not isinstance(body, Mapping) or set(body) != {"topic", "key", "value"}:
        raise CorruptStateError("its answer is not a message (topic, key, value)")
    if approval.payload_digest != digest_of(body):
        raise CorruptStateError("its payload digest does not match the message it carries")
    topic, key = body["topic"], body["key"]
    if not isinstance(topic, str) or approval.step_id != MESSAGE_STEP_PREFIX + topic or not isinstance(key, str):
        raise CorruptStateError("its step id does not name the topic of the message it carries")
    try:
        return Message(approval.task_id, check_topic(topic), body["value"], key, approval.approver, float(approval.granted_at))
    except (ValueError, TypeError) as exc:  # InvalidInputError and SizeLimitError are ValueErrors
        raise CorruptStateError(str(exc)) from None


def pending_messages(
    records: Iterable[ControlRecord], task_id: str, plan_digest: str, consumed: Sequence[str], topic: str | None = None
) -> tuple[list[tuple[Approval, Message]], list[str]]:
    """The messages from outside that ``records`` carry to ``task_id`` (of ``topic``, or all) and
    that no receive consumed, oldest first (sent time, then record id); and why each other record
    that is, or may be, such a message was not used (damaged, refused by its source, for another
    task or plan)."""
    found: list[tuple[Approval, Message]] = []
    reasons: list[str] = []
    used = set(consumed)
    step_id = None if topic is None else MESSAGE_STEP_PREFIX + topic
    for raw in records:
        body = raw.body
        ours = isinstance(body, Mapping) and body.get("action") == MESSAGE_ACTION and (step_id is None or body.get("step_id") == step_id)
        if raw.error is not None:
            if body is None or ours:  # a refused record's body is dropped: it may be a message
                reasons.append(f"control record {raw.name} not used: {raw.error}")
            continue
        if not ours:
            continue
        try:
            approval = Approval.from_json(body)
            message = _carried(approval)
        except CorruptStateError as exc:
            reasons.append(f"message record {raw.name} not used: {exc}")
            continue
        if approval.approval_id in used:
            continue
        if approval.task_id != task_id or approval.plan_digest != plan_digest:
            reasons.append(f"message record {approval.approval_id} from {approval.approver} not used: it is for another task or plan")
            continue
        found.append((approval, message))
    found.sort(key=lambda pair: (float(pair[0].granted_at), pair[0].approval_id))
    return found, reasons


def post_message(
    store: Store,
    task_id: str,
    topic: str,
    value: object,
    *,
    key: str | None,
    sender: str,
    sent_at: float,
    write_to: ApprovalWriter | None = None,
    sign: Signer | None = None,
    signature_required: bool = False,
) -> Posted:
    """Send ``value`` to ``task_id`` on ``topic`` from outside: write the record that carries it to
    ``write_to`` (a ``FileControlSource``), else to the store, signed by
    ``sign`` if given. Nothing is written when the task's mailbox already holds a message with
    ``key`` (``Posted.duplicate``). ``SignatureRequiredError`` if ``signature_required`` and no
    ``sign`` is given, ``UnknownTaskError`` for a task the store does not hold (or has no state
    of), and the errors of ``outside_message``; nothing is written then."""
    check_topic(topic)
    if signature_required and sign is None:
        raise SignatureRequiredError(
            f"task {task_id!r} reads only signed control records: sign the message (sign=functools.partial("
            "longrun.authority.sign_approval, key=key), or `longrun send --sign-key FILE`); nothing was sent"
        )
    state = store.load(task_id).state  # UnknownTaskError for a task the store does not hold
    if state is None:
        raise UnknownTaskError(f"task {task_id!r} has no committed state yet; nothing was sent")
    key = key if key is not None else secrets.token_hex(16)
    record = outside_message(task_id, state.plan_digest, topic, value, key=key, sender=sender, sent_at=sent_at, record_id=record_id())
    held = next((message for message in store.read_messages(task_id) if message.key == key), None)
    if held is not None:
        return Posted(task_id, topic, key, None, duplicate=True, seq=held.seq)
    if sign is not None:
        record = sign(record)
    if write_to is not None:
        where = write_to.write_approval(record)
        return Posted(task_id, topic, key, record.approval_id, where if isinstance(where, str) else None, record.signature is not None)
    store.write_approval(record)
    return Posted(task_id, topic, key, record.approval_id, None, record.signature is not None)


def record_id() -> str:
    """A new record's id: the wall clock in nanoseconds (20 digits), then 12 random hex digits, so
    that of two records sent at one ``sent_at`` (a coarse or a test's clock) the one written first
    sorts first, and no two writers make the same id."""
    return f"m{time.time_ns():020d}{secrets.token_hex(6)}"


def requires_signature(source: object) -> bool:
    """Whether ``source`` (an approval source) accepts only signed records."""
    return isinstance(source, SigningSource) and bool(source.requires_signature)
