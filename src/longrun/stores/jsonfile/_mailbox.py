"""A task's mailbox in the JSON-file store: one file per message, named by its number and key.

Layout, in the task's directory::

    messages/<seq, 12 digits>.<SHA-256 of the key, first 32 hex digits>.json

Each file is written with ``write_atomic`` (fsynced, renamed into place, the directory fsynced)
under the task's exclusive flock, which ``BaseStore.send_message`` holds while it looks the key
up and takes the next number, so numbers follow the order the sends commit and a key is stored
once. A name that does not fit the pattern (a temporary file a crash left) is not a message.
Reading lists the directory and reads each file (``MAX_STORED_BYTES`` at most), checking its
checksum, its number against its name, and its receiver against its directory.
"""

from __future__ import annotations

import os
import re

from ...canonical import sha256_hex
from ...errors import CorruptStateError
from ...messages import MAX_STORED_BYTES, Message, decode_message, encode_message
from .._fileio import FileIO, ensure_dir, read_file, write_atomic

__all__ = ["MESSAGES", "Mailbox"]

MESSAGES = "messages"
_NAME = re.compile(r"([0-9]{12})\.([0-9a-f]{32})\.json")


def _key_digest(key: str) -> str:
    return sha256_hex(key.encode("utf-8"))[:32]


class Mailbox:
    """The mailboxes under a store root (see the module docstring); the caller holds the task's flock."""

    def __init__(self, root: str, io: FileIO):
        self.root = root
        self.io = io

    def _directory(self, task_id: str) -> str:
        return os.path.join(self.root, task_id, MESSAGES)

    def _names(self, task_id: str) -> list[tuple[int, str, str]]:
        """(seq, key digest, file name) of every message file, by number."""
        try:
            names = self.io.listdir(self._directory(task_id))
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            match = _NAME.fullmatch(name)
            if match is not None:
                found.append((int(match.group(1)), match.group(2), name))
        return sorted(found)

    def _read(self, task_id: str, seq: int, name: str) -> Message:
        label = f"{task_id}/{MESSAGES}/{name}"
        data = read_file(self.io, os.path.join(self._directory(task_id), name), MAX_STORED_BYTES)
        if data is None:
            raise CorruptStateError(f"message {label} vanished while it was read")
        message = decode_message(data, label)
        if message.seq != seq:
            raise CorruptStateError(f"message {label} is damaged: it holds number {message.seq}")
        return message

    def with_key(self, task_id: str, key: str) -> Message | None:
        digest = _key_digest(key)
        for seq, named, name in self._names(task_id):
            if named == digest:
                message = self._read(task_id, seq, name)
                if message.key == key:
                    return message
        return None

    def last_seq(self, task_id: str) -> int:
        names = self._names(task_id)
        return names[-1][0] if names else 0

    def put(self, message: Message) -> None:
        directory = self._directory(message.task_id)
        ensure_dir(self.io, directory)
        write_atomic(self.io, directory, f"{message.seq:012d}.{_key_digest(message.key)}.json", encode_message(message))

    def read(self, task_id: str, topic: str | None) -> list[Message]:
        messages = [self._read(task_id, seq, name) for seq, _, name in self._names(task_id)]
        return messages if topic is None else [message for message in messages if message.topic == topic]
