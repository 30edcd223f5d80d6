"""The commands by which an operator talks to tasks: ``send`` (a message) and ``event`` (read one).

``send`` puts one message in a task's mailbox through the store (``Store.send_message``): its
``run.recv(TOPIC)`` returns it, and a worker running the task is woken by it as by an answer. VALUE
is read as JSON if it parses, else as plain text (like ``answer``). ``--key`` deduplicates: a second
send with a key already in the mailbox stores nothing and says so. It takes no lease and touches no
state. ``event`` reads the latest value a task set for KEY (``run.set_event``) from its committed
state, waiting up to ``--wait`` seconds for it to be set; exit 1 if it is not.

With ``--json`` each prints one JSON object.

Not guaranteed: that the task receives the message (a task that never receives the topic keeps it).
"""

from __future__ import annotations

import json
import secrets
from typing import TextIO

from ..clock import SystemClock
from ..messages import Message
from ..protocols import Store
from ..task_events import read_event
from ._common import CliError, ExitCode, checked_task, write_json
from ._control import parse_answer

__all__ = ["cmd_event", "cmd_send"]


def cmd_send(store: Store, task_id: str, topic: str, value: str, *, key: str | None, sender: str, out: TextIO, as_json: bool) -> int:
    task_id = checked_task(task_id)
    parsed = parse_answer(value)
    message = Message.of(task_id, topic, parsed, key=key if key is not None else secrets.token_hex(16), sender=sender, sent_at=SystemClock().now())
    delivery = store.send_message(message)
    if as_json:
        write_json(out, {"task_id": task_id, "topic": topic, "key": message.key, "seq": delivery.seq, "duplicate": delivery.duplicate})
        return 0
    if delivery.duplicate:
        out.write(
            f"not sent again: task {task_id} already holds message {delivery.seq} with key {message.key!r}\n"
        )
        return 0
    out.write(
        f"message {delivery.seq} sent to task {task_id} on topic {topic}\n"
        f"  value   {json.dumps(parsed, ensure_ascii=False)[:200]}\n"
        f"  key     {message.key}\n"
        f"  sender  {sender}\n"
        f"next: the task's next run.recv({topic!r}) returns it (a worker runs the task again by itself)\n"
    )
    return 0


def cmd_event(store: Store, task_id: str, key: str, *, wait_s: float | None, out: TextIO, as_json: bool) -> int:
    task_id = checked_task(task_id)
    found, value = read_event(store, task_id, key, timeout_s=wait_s, clock=SystemClock())
    if as_json:
        write_json(out, {"task_id": task_id, "key": key, "set": found, "value": value})
        return 0 if found else int(ExitCode.NOT_AS_ASKED)
    if not found:
        waited = f" within {wait_s:g} s" if wait_s is not None else ""
        raise CliError(f"task {task_id!r} has not set event {key!r}{waited}", ExitCode.NOT_AS_ASKED)
    out.write(json.dumps(value, ensure_ascii=False) + "\n")
    return 0
