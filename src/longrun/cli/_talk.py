"""The commands by which an operator talks to tasks: ``send`` (a message) and ``event`` (read one).

``send`` sends one message from outside, as a control record like an answer
(``longrun.outside_messages``): into the store, or under ``--control-root`` (a control area a
strict ``FileControlSource`` reads), signed with ``--sign-key`` when given; the task's
``run.recv(TOPIC)`` receives it, once, and a waiting run or a worker running the task is woken by
it as by an answer. VALUE is read as JSON if it parses, else as plain text (like ``answer``).
``--key`` deduplicates at the receiver: of the messages with one key one is received, and when
the task's mailbox already holds it nothing is written (it says so). It takes no lease and
touches no state. ``event`` reads the latest value a task set for KEY (``run.set_event``) from
its committed state, waiting up to ``--wait`` seconds for it to be set; exit 1 if it is not.

With ``--json`` each prints one JSON object.

Not guaranteed: that the task receives the message (a task that never receives the topic keeps
it; a runner that reads another control source, or only signed records, does not use one written
elsewhere or unsigned, and says so in its next action).
"""

from __future__ import annotations

import json
import time
from typing import TextIO

from ..authority import key_id, load_key
from ..clock import SystemClock
from ..outside_messages import post_message
from ..protocols import Store
from ..task_events import read_event
from ._common import CliError, ExitCode, checked_task, write_json
from ._control import open_control_root, parse_answer
from ._intervene import signer

__all__ = ["cmd_event", "cmd_send"]


def cmd_send(
    store: Store,
    task_id: str,
    topic: str,
    value: str,
    *,
    key: str | None,
    sender: str,
    out: TextIO,
    as_json: bool,
    sign_key: str | None = None,
    control_root: str | None = None,
) -> int:
    task_id = checked_task(task_id)
    secret = load_key(sign_key) if sign_key is not None else None
    control = open_control_root(control_root)
    parsed = parse_answer(value)
    posted = post_message(store, task_id, topic, parsed, key=key, sender=sender, sent_at=time.time(), write_to=control, sign=signer(secret))
    if as_json:
        write_json(out, {
            "task_id": task_id, "topic": topic, "key": posted.key, "duplicate": posted.duplicate, "seq": posted.seq or None,
            "record_id": posted.record_id, "written_to": posted.written_to, "signed_with_key": key_id(secret) if secret is not None else None,
        })  # fmt: skip
        return 0
    if posted.duplicate:
        out.write(f"not sent again: task {task_id} already holds message {posted.seq} with key {posted.key!r}\n")
        return 0
    out.write(
        f"message for task {task_id} on topic {topic} sent\n"
        f"  value   {json.dumps(parsed, ensure_ascii=False)[:200]}\n"
        f"  key     {posted.key}\n"
        f"  sender  {sender}\n"
        f"  record  {posted.record_id} (a control record, used once)\n"
        + (f"  signed  hmac-sha256 with key {key_id(secret)}\n" if secret is not None else "")
        + (f"  written under {control_root}\n" if control_root is not None else "")
        + f"next: the task's next run.recv({topic!r}) returns it, once (a worker runs the task again by itself)\n"
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
