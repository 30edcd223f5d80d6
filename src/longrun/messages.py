"""Messages between tasks: the record a store keeps in a task's mailbox, and the rules of one.

A message is sent to one task (its receiver) on a topic, with a JSON value and a deduplication
``key``. The store assigns each message of a receiver a sequence number, ``seq``, in the order the
sends commit (1, 2, 3, ...: the send takes the receiver's exclusive transaction), and keeps at most
one message per key: a second send with a key already in the mailbox stores nothing and answers
with the first one's number (``Delivery.duplicate``). A durable function's ``run.send`` derives its
key from the sending task and the step id, so a send repeated after a crash is that duplicate.

A message from outside any task (``fn.send``, ``longrun send``) travels as a control record, like an
answer (``outside_messages``), and enters the receiver's mailbox, under its key, when a receive
takes it.

The store never marks a message consumed: the receiver records, in its own state, which messages
its receives returned (each ``run.recv`` record names the message's ``seq``), in the same fenced
commit as the rest of its progress. A receive returns the oldest message of its topic that no
receive of that task has recorded; a crash before that record is committed loses nothing (the next
run picks the same message again), and a record committed is never picked twice.

Limits: a topic is 1-100 characters of a step id's alphabet; a key at most ``MAX_KEY_CHARS``
characters of text; a value plain JSON of at most ``MAX_MESSAGE_BYTES`` encoded; a mailbox at most
``MAX_MESSAGES`` messages (consumed ones count: the store keeps them). Past any of them the send is
refused with a typed error and nothing is stored. A message to a task the store does not hold is
refused with ``UnknownTaskError``.

Stored form (``encode_message``): the record's JSON with a ``checksum`` over the rest; a stored
message that fails its checksum or its fields raises ``CorruptStateError`` naming it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from . import _fields as f
from .canonical import JSONValue, canonical_bytes, ensure_json, parse_json, sha256_hex
from .contract import INTERNAL_PREFIX
from .errors import CorruptStateError, InvalidInputError, SizeLimitError

__all__ = [
    "MAX_KEY_CHARS",
    "MAX_MESSAGES",
    "MAX_MESSAGE_BYTES",
    "RECV_ACTION",
    "SEND_ACTION",
    "TOPIC_PATTERN",
    "Delivery",
    "Message",
    "check_topic",
    "consumed_messages",
    "decode_message",
    "encode_message",
    "sent_key",
]

SEND_ACTION = INTERNAL_PREFIX + "send"
"""The action of a ``run.send`` record: its payload names the receiver, the topic, the key and the value."""
RECV_ACTION = INTERNAL_PREFIX + "recv"
"""The action of a ``run.recv`` record: its result names the message it returned (or none, timed out)."""

TOPIC_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+=-]{0,99}")
"""What a topic (and an event's key) may be: 1-100 characters of a step id's alphabet."""
MAX_KEY_CHARS = 512
MAX_MESSAGE_BYTES = 64 * 1024
"""The largest canonical encoding of one message's value (64 KiB): pass a reference for more."""
MAX_MESSAGES = 100_000
"""The most messages one task's mailbox holds, consumed ones included."""
MAX_STORED_BYTES = MAX_MESSAGE_BYTES + 4 * 1024
"""The largest stored message (value, fields and checksum) a reader accepts."""

_SPEC = (
    f.Field("task_id", f.Kind.NAME),
    f.Field("topic", f.Kind.STEP),
    f.Field("key", f.Kind.TEXT),
    f.Field("sender", f.Kind.TEXT),
    f.Field("sent_at", f.Kind.NUMBER),
    f.Field("seq", f.Kind.INT),
    f.Field("value", f.Kind.JSON),
)
_FIELDS = frozenset({"schema_version", *(field.name for field in _SPEC)})


def check_topic(topic: object, *, what: str = "topic") -> str:
    """Return ``topic`` if it is a valid topic (or event key), else raise ``InvalidInputError``."""
    if not isinstance(topic, str) or not TOPIC_PATTERN.fullmatch(topic):
        raise InvalidInputError(f"{what} {topic!r} is not valid: use 1-100 of [A-Za-z0-9._:/@+=-], starting with a letter or digit")
    return topic


def sent_key(task_id: str, step_id: str) -> str:
    """The key a ``run.send`` without one gets: its task and step, so a send repeated after a crash
    is the same message to the receiver."""
    return f"{task_id}:{step_id}"


@dataclass(frozen=True, slots=True)
class Message:
    """One message in a task's mailbox (see the module docstring). ``seq`` is 0 until the store
    assigns it; ``sender`` is the sending task's id, or who sent it from outside."""

    task_id: str
    topic: str
    value: JSONValue
    key: str
    sender: str
    sent_at: float
    seq: int = 0

    def __post_init__(self) -> None:
        f.check(_SPEC, self, "message")
        check_topic(self.topic)
        if not self.key or len(self.key) > MAX_KEY_CHARS:
            raise InvalidInputError(f"a message key must be 1-{MAX_KEY_CHARS} characters, got {len(self.key)}")
        if not self.sender or len(self.sender) > 200:
            raise InvalidInputError("a message's sender must be 1-200 characters")
        size = len(canonical_bytes(self.value))
        if size > MAX_MESSAGE_BYTES:
            raise SizeLimitError(
                f"the value of a message on topic {self.topic!r} is {size} bytes encoded, over MAX_MESSAGE_BYTES "
                f"({MAX_MESSAGE_BYTES}): send a reference (a path, a digest) instead; nothing was sent",
                size=size, limit=MAX_MESSAGE_BYTES, limit_name="MAX_MESSAGE_BYTES",
            )  # fmt: skip

    @classmethod
    def of(cls, task_id: str, topic: str, value: object, *, key: str, sender: str, sent_at: float) -> "Message":
        """A message to send, its value checked as JSON first (``InvalidInputError`` naming the bad part)."""
        return cls(task_id, check_topic(topic), ensure_json(value, what=f"the value of a message on topic {topic!r}"), key, sender, sent_at)

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "schema_version": f.RECORD_SCHEMA_VERSION,
            "task_id": self.task_id,
            "topic": self.topic,
            "key": self.key,
            "sender": self.sender,
            "sent_at": self.sent_at,
            "seq": self.seq,
            "value": self.value,
        }

    @classmethod
    def from_json(cls, data: object) -> "Message":
        what = "message"
        d: Mapping[str, Any] = f.require_mapping(data, what)
        f.check_fields(d, _FIELDS, what)
        f.check_record_version(d, what)
        try:
            return cls(**f.read(_SPEC, d, what))
        except InvalidInputError as exc:  # a stored record the writer would have refused is damage
            raise CorruptStateError(f"{what}: {exc}") from None


@dataclass(frozen=True, slots=True)
class Delivery:
    """What ``Store.send_message`` did: the message's number in the receiver's mailbox, and whether
    the key was already there (then nothing was stored, and ``seq`` is the first message's)."""

    seq: int
    duplicate: bool = False


def encode_message(message: Message) -> bytes:
    """The stored bytes of ``message``: its JSON with a checksum over the rest."""
    body = message.to_json()
    return canonical_bytes({**body, "checksum": "sha256:" + sha256_hex(canonical_bytes(body))})


def decode_message(data: bytes, name: str) -> Message:
    """A stored message read back; ``CorruptStateError`` naming ``name`` if it is damaged."""
    try:
        document = parse_json(data, what=f"message {name}", max_bytes=MAX_STORED_BYTES, unique_keys=True)
        if not isinstance(document, dict):
            raise CorruptStateError("not a JSON object")
        body = dict(document)
        checksum = body.pop("checksum", None)
        if checksum != "sha256:" + sha256_hex(canonical_bytes(body)):
            raise CorruptStateError("its checksum does not match its bytes")
        return Message.from_json(body)
    except CorruptStateError as exc:
        raise CorruptStateError(f"message {name} is damaged: {exc}") from exc


def consumed_messages(task_id: str, records: Sequence[tuple[str, JSONValue]]) -> set[int]:
    """The ``seq`` of every message of ``task_id``'s mailbox that the receives in ``records``
    returned: ``(action, result)`` pairs of the task's effect records (only ``RECV_ACTION`` results
    that name this mailbox count: a task forked from another keeps the receives it copied, whose
    numbers are the other task's)."""
    consumed = set()
    for action, result in records:
        if action == RECV_ACTION and isinstance(result, dict) and result.get("task") == task_id:
            seq = result.get("seq")
            if isinstance(seq, int) and not isinstance(seq, bool):
                consumed.add(seq)
    return consumed
