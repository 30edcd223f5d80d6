"""The operator's writing commands: ``approve``, ``cancel`` and ``repair``.

``approve`` and ``cancel`` write one control record and nothing else; neither takes the lease or
touches the state. ``repair --lease`` replaces a damaged lease record through the store's
``repair_lease`` (the damaged record is moved aside, never deleted; see ``stores.base``).

``cancel`` also cancels the unfinished children a durable task started (not those started with
``detached=True``), and theirs, each by a record naming its parent, written the same way; it says
how many.

Given a filter instead of a task, ``approve`` and ``cancel`` act on many tasks (``_bulk``).

``approve`` first shows the pending request in full: the task, step and action, the payload the
step will apply (pretty-printed from the state's record, long values elided with their size, every
control character escaped: see ``_payload``), its digest and the expiry. It then copies the
request's scope (task, plan digest, step, payload digest, action) into a new ``Approval`` with a
fresh random id, so it authorizes exactly that effect, once, until its expiry. It refuses to guess: with several pending requests it needs
``--step``. ``cancel`` writes the task's cancellation record, which the runner reads before every
new effect.

With ``--sign-key FILE`` either command signs its record (HMAC-SHA256 over every field; for an
approval that is the full scope, the expiry, the approver and the approval id, its nonce), for a
runner that accepts only signed records (``longrun.authority``). With ``--control-root DIR`` the
record is written under DIR, a control area laid out like a store that a runner reads with
``FileControlSource`` in strict mode, instead of into the store; the pending request and the
task's state are still read from the store.

With ``--json`` each prints one JSON object (the request and the approval; the cancellation) on
stdout instead of the text; ``approve`` then shows the request on stderr when it asks for
confirmation.

Not guaranteed: that the runner acts on the record (it reads it on its next run: a live worker
runs the task within a second of the record's arrival, see ``worker._watch``), or who the
operator is (the approver name is what the caller says, by default the login name; a signature
shows only that the signer held the key).
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from typing import TextIO

from ..approval import Approval, ApprovalRequest, refuse_second, waiting_approvals
from ..authority import FileControlSource, key_id, load_key, sign_approval, sign_cancellation, verify_approval
from ..cancellation import Cancellation
from ..canonical import JSONValue, digest_of, ensure_json, parse_json
from ..contract import ASK_ACTION
from ..envelope import RunState
from ..errors import CorruptStateError, InvalidInputError, LeaseHeldError, LongrunError, UnknownTaskError
from ..outcome import TERMINAL
from ..protocols import ApprovalSource, RepairableStore, Store
from ._common import CliError, ExitCode, checked_task, format_time, relative, write_json
from ._payload import payload_lines, safe_text

__all__ = [
    "cmd_approve", "cmd_cancel", "cmd_repair", "open_control_root", "parse_answer", "payload_view", "request_lines", "unconsumed_matches",
    "write_approval", "write_cancellation",
]  # fmt: skip

def parse_answer(text: str) -> JSONValue:
    """An answer as the operator typed it: JSON if it parses as JSON, else the plain string."""
    try:
        return parse_json(text.encode("utf-8"), what="answer", max_bytes=MAX_ANSWER_BYTES)
    except (CorruptStateError, UnicodeEncodeError):
        if len(text.encode("utf-8", "surrogatepass")) > MAX_ANSWER_BYTES:
            raise CliError(f"the answer is longer than {MAX_ANSWER_BYTES} bytes", ExitCode.USAGE) from None
        try:
            return ensure_json(text, what="answer")
        except InvalidInputError as exc:
            raise CliError(str(exc), ExitCode.USAGE) from None


MAX_ANSWER_BYTES = 64 * 1024

REISSUED_REQUEST_TTL_S = 3600.0
"""How long an approval without ``--ttl`` lasts when its request has already expired (the next run
issues the same request again, with the same scope, and the approval still matches it)."""


def _approval_expiry(request: ApprovalRequest, ttl_s: float | None, now: float) -> float:
    """``--ttl`` from now if given; else as long as the request it answers lasts."""
    if ttl_s is not None:
        return now + ttl_s
    return request.expires_at if request.expires_at > now else now + REISSUED_REQUEST_TTL_S


def _pick_request(requests: dict[str, ApprovalRequest], step: str | None, task_id: str) -> ApprovalRequest:
    if not requests:
        raise CliError(f"task {task_id!r} has no pending approval request", ExitCode.NOT_AS_ASKED)
    pending = ", ".join(f"{r.step_id} (action {r.action}, payload {r.payload_digest})" for r in requests.values())
    if step is not None:
        request = requests.get(step)
        if request is None:
            raise CliError(f"task {task_id!r} has no pending approval request for step {step!r}; pending: {pending}", ExitCode.USAGE)
        return request
    if len(requests) > 1:
        raise CliError(
            f"task {task_id!r} has {len(requests)} pending approval requests; choose one with --step: {pending}", ExitCode.USAGE
        )
    return next(iter(requests.values()))


def open_control_root(directory: str | None) -> FileControlSource | None:
    """The control area to write to instead of the store, if one was given; it must exist."""
    if directory is None:
        return None
    if not os.path.isdir(directory):
        raise CliError(f"control root {directory!r} is not an existing directory", ExitCode.USAGE)
    return FileControlSource(directory, strict=False)


def unconsumed_matches(source: ApprovalSource, request: ApprovalRequest, consumed: list[str], now: float) -> list[str]:
    """Ids of existing, unexpired, unconsumed approvals that already cover ``request``, the one the
    run would use first."""
    return [approval.approval_id for approval in waiting_approvals(request, source.read_approvals(request.task_id), consumed, now)]


def _check_choice(state: RunState, request: ApprovalRequest, answer: JSONValue) -> None:
    """``InvalidInputError`` listing the choices if the question has some and ``answer`` is not one
    (by the rule the run applies: Python equality, so ``1`` and ``1.0`` are the same answer)."""
    record = state.effects.get(request.step_id)
    payload = record.payload if record is not None else None
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if isinstance(choices, list) and answer not in choices:
        listed = json.dumps(choices, ensure_ascii=False)
        raise InvalidInputError(
            f"{json.dumps(answer, ensure_ascii=False)[:200]} is not one of the choices of step {request.step_id!r}: "
            f"{listed[:1000]}; nothing was written"
        )


def _confirm(stdin: TextIO, err: TextIO) -> bool:
    err.write("approve this request? [y/N] ")
    err.flush()
    answer = stdin.readline()
    if not answer.endswith("\n"):
        err.write("\n")
    return answer.strip().lower() in ("y", "yes")


def payload_view(state: RunState, request: ApprovalRequest) -> tuple[JSONValue, list[str]]:
    """The payload the request's step will apply, as recorded, and notes on it for the approver.

    The payload shown is the one the runner planned and persisted; a note says if its digest is
    not the one the request (and so the approval) binds, which a runner re-issuing the request
    resolves. None (with a note) if the state holds no record of the step."""
    record = state.effects.get(request.step_id)
    if record is None:
        return None, ["the payload is not recorded in the state: do not approve blind; check the task's code"]
    notes = []
    if digest_of(record.payload) != request.payload_digest or record.payload_digest != request.payload_digest:
        notes.append(
            "the recorded payload's digest is not the one the request binds: the approval would not match it; "
            "run the task again so that it re-issues the request"
        )
    return record.payload, notes


def request_lines(task_id: str, state: RunState, request: ApprovalRequest, now: float) -> list[str]:
    """What an approver must see before approving: the request's scope and the payload in full."""
    payload, notes = payload_view(state, request)
    question = request.action == ASK_ACTION
    lines = [
        f"pending {'question' if question else 'approval request'} of task {task_id}:",
        f"  task            {task_id}",
        f"  step            {safe_text(request.step_id)}",
        f"  action          {safe_text(request.action)}",
    ]
    if question and isinstance(payload, dict):
        lines.append(f"  question        {safe_text(str(payload.get('question')))}")
        if payload.get("choices") is not None:
            lines.append(f"  choices         {safe_text(json.dumps(payload.get('choices'), ensure_ascii=False))}")
    else:
        lines.append("  payload         (what the step will apply, as planned and recorded)")
        lines += ["    " + line for line in payload_lines(payload)] if payload is not None else []
    lines += [
        f"  payload digest  {request.payload_digest}",
        f"  plan digest     {request.plan_digest}",
        f"  requested       {format_time(request.requested_at)}, expires {format_time(request.expires_at)} ({relative(request.expires_at, now)})",
    ]
    lines += [f"  note: {note}" for note in notes]
    if request.expired(now):
        lines.append("  note: the request has expired; the runner re-issues it with the same scope, which this approval covers")
    return lines


def _request_text(task_id: str, state: RunState, request: ApprovalRequest, now: float) -> str:
    return "".join(line + "\n" for line in request_lines(task_id, state, request, now))


def write_approval(
    store: Store,
    request: ApprovalRequest,
    *,
    approver: str,
    ttl_s: float | None,
    now: float,
    key: bytes | None,
    control: FileControlSource | None,
    answer: JSONValue = None,
) -> tuple[Approval, str | None]:
    """Write an approval of exactly ``request``'s scope with a fresh id, signed with ``key`` if given,
    into ``control`` if given, else the store; return it and the file written (None: the store)."""
    approval = Approval.for_request(
        request, approval_id=secrets.token_hex(16), approver=approver, granted_at=now, expires_at=_approval_expiry(request, ttl_s, now), answer=answer
    )
    if key is not None:
        approval = sign_approval(approval, key)
    if control is not None:
        return approval, control.write_approval(approval)
    store.write_approval(approval)
    return approval, None


def cmd_approve(
    store: Store,
    task_id: str,
    *,
    step: str | None,
    approver: str,
    ttl_s: float | None,
    assume_yes: bool,
    out: TextIO,
    err: TextIO,
    stdin: TextIO | None = None,
    sign_key: str | None = None,
    control_root: str | None = None,
    as_json: bool = False,
    answer: JSONValue = None,
    expected_digest: str | None = None,
) -> int:
    """Approve the task's pending request (with ``answer``: answer the pending question). With ``as_json`` the request and the approval are one
    JSON object on ``out`` at the end; the request is shown on ``err`` only if confirmation is asked.
    With ``expected_digest`` (the console passes the payload digest the operator was shown), a
    pending request with another payload digest is refused and nothing is written."""
    task_id = checked_task(task_id)
    key = load_key(sign_key) if sign_key is not None else None  # a bad key file fails before any question
    control = open_control_root(control_root)
    state = store.load(task_id).state
    if state is None:
        raise CliError(f"task {task_id!r} has no committed state yet; nothing to approve", ExitCode.NOT_AS_ASKED)
    if state.status in TERMINAL:
        raise CliError(f"the run of {task_id!r} already ended {state.status.value}; nothing to approve", ExitCode.NOT_AS_ASKED)
    request = _pick_request(state.approval_requests, step, task_id)
    if expected_digest is not None and request.payload_digest != expected_digest:
        raise CliError(
            f"the pending request of step {request.step_id!r} now binds payload {request.payload_digest}, not the "
            f"{expected_digest} that was shown; nothing was written: look at it again",
            ExitCode.NOT_AS_ASKED,
        )
    if (answer is not None) != (request.action == ASK_ACTION):
        if answer is None:
            raise CliError(f"step {request.step_id!r} asks a question: answer it with `longrun answer`", ExitCode.USAGE)
        raise CliError(f"step {request.step_id!r} is an effect, not a question: approve it with `longrun approve`", ExitCode.USAGE)
    if answer is not None:
        _check_choice(state, request, answer)
    now = time.time()
    # Where this command writes is where a second record would go: refused there, before anything is asked.
    # A signed approval is not blocked by an unsigned one, which a runner that wants signatures refuses.
    counts = None if key is None else (lambda approval: verify_approval(approval, key) is None)
    refuse_second(request, (control or store).read_approvals(task_id), state.consumed_approvals, now, counts=counts)
    shown = _request_text(task_id, state, request, now)
    if not as_json:
        out.write(shown)
        out.flush()
    elif not assume_yes:
        err.write(shown)
    if not assume_yes and not _confirm(stdin if stdin is not None else sys.stdin, err):
        raise CliError("not approved; nothing was written", ExitCode.NOT_AS_ASKED)
    approval, written = write_approval(store, request, approver=approver, ttl_s=ttl_s, now=now, key=key, control=control, answer=answer)
    if as_json:
        write_json(
            out,
            {
                "request": request.to_json(),
                "payload": payload_view(state, request)[0],
                "approval": approval.to_json(),
                "signed_with_key": key_id(key) if key is not None else None,
                "written_to": written,
            },
        )
        return 0
    verb = "approved" if answer is None else f"answered ({json.dumps(answer)[:200]})"
    out.write(
        f"{verb} step {approval.step_id} of task {task_id}\n"
        f"  approval id  {approval.approval_id}\n"
        f"  approver     {approval.approver}\n"
        f"  scope        action {approval.action}, payload {approval.payload_digest}, plan {approval.plan_digest}\n"
        f"  expires      {format_time(approval.expires_at)} ({relative(approval.expires_at, now)})\n"
        + (f"  signed       hmac-sha256 with key {key_id(key)}\n" if key is not None else "")
        + (f"  written to   {written}\n" if written is not None else "")
        + (
            "next: a live worker runs the task within a second (it watches for this record); without one, run it "
            "again (`longrun resume STORE TASK`); the approval authorizes this one effect, once\n"
            if answer is None
            else "next: a live worker runs the task within a second (it watches for this record); without one, run it "
            "again (`longrun resume STORE TASK`); the answer is used once, for this question\n"
        )
    )
    return 0


def write_cancellation(
    store: Store,
    task_id: str,
    state: RunState | None,
    *,
    reason: str,
    requested_by: str,
    now: float,
    key: bytes | None,
    control: FileControlSource | None,
) -> tuple[Cancellation, str | None, list[str]]:
    """Write the task's cancellation (signed with ``key`` if given, into ``control`` if given, else
    the store), and one for each unfinished child it started (``state``: its state, None if it
    cannot be read); return the record as written, the file (None: the store) and the children."""

    def write(record: Cancellation) -> str | None:
        """Sign ``record`` if asked to, and write it where this command writes: the control root or the store."""
        if key is not None:
            record = sign_cancellation(record, key)
        if control is not None:
            return control.write_cancellation(record)
        store.write_cancellation(record)
        return None

    record = Cancellation(task_id=task_id, requested_at=now, requested_by=requested_by, reason=reason)
    written = write(record)
    children: list[str] = []
    if state is not None:
        from ..functions import cancel_children  # the durable face: only a task that may have children

        children = cancel_children(store, task_id, record, write=write, source=control or store, state=state)
    if key is not None:
        record = sign_cancellation(record, key)  # as written, for the JSON report
    return record, written, children


def cmd_cancel(
    store: Store,
    task_id: str,
    *,
    reason: str,
    requested_by: str,
    out: TextIO,
    err: TextIO,
    sign_key: str | None = None,
    control_root: str | None = None,
    as_json: bool = False,
) -> int:
    task_id = checked_task(task_id)
    key = load_key(sign_key) if sign_key is not None else None
    control = open_control_root(control_root)
    try:
        state = store.load(task_id).state  # UnknownTaskError (exit 2) propagates
    except CorruptStateError as exc:
        err.write(f"longrun: warning: the task's state is damaged ({exc}); writing the cancellation anyway\n")
        state = None
    if state is not None and state.status in TERMINAL:
        err.write(f"longrun: note: the run already ended {state.status.value}; the cancellation changes nothing\n")
    try:
        earlier = (control or store).read_cancellation(task_id)
    except LongrunError as exc:  # only used to say whether a record is replaced: report, go on
        err.write(f"longrun: note: the earlier cancellation record could not be read ({exc}); it is replaced\n")
        earlier = None
    now = time.time()
    record, written, children = write_cancellation(
        store, task_id, state, reason=reason, requested_by=requested_by, now=now, key=key, control=control
    )
    if as_json:
        write_json(
            out,
            {
                "cancellation": record.to_json(),
                "children_cancelled": children,
                "replaced_earlier_record": earlier is not None,
                "signed_with_key": key_id(key) if key is not None else None,
                "written_to": written,
                "run_already_ended": state.status.value if state is not None and state.status in TERMINAL else None,
            },
        )
        return 0
    out.write(
        f"cancellation recorded for task {task_id}{' (replacing an earlier record)' if earlier is not None else ''}\n"
        f"  by      {requested_by}\n"
        f"  reason  {reason}\n"
        f"  at      {format_time(now)}\n"
        + (f"  signed  hmac-sha256 with key {key_id(key)}\n" if key is not None else "")
        + (f"  file    {written}\n" if written is not None else "")
        + (f"  children  {len(children)} cancelled ({', '.join(children)}): the unfinished tasks it started, and theirs\n" if children else "")
        + "the runner reads it before every new effect: an effect in flight is still reconciled, "
        "then the run ends cancelled\n"
    )
    return 0


def cmd_repair(store: Store, task_id: str, *, repaired_by: str, out: TextIO, as_json: bool = False) -> int:
    """Repair the task's damaged lease record. A refusal (not damaged, a live holder) is exit 1."""
    task_id = checked_task(task_id)
    if not isinstance(store, RepairableStore):
        raise CliError(f"{type(store).__name__} cannot repair a lease record (it has no repair_lease)", ExitCode.USAGE)
    try:
        result = store.repair_lease(task_id, time.time(), repaired_by=repaired_by)
    except UnknownTaskError:
        raise
    except (InvalidInputError, LeaseHeldError) as exc:
        raise CliError(f"{exc}; nothing was changed", ExitCode.NOT_AS_ASKED) from exc
    lease = result.lease
    if as_json:
        write_json(
            out,
            {
                "task_id": task_id,
                "damage": result.damage,
                "quarantined": result.quarantined,
                "epoch": lease.epoch,
                "next_epoch": result.next_epoch,
                "lease": lease.without_token().to_json(),
            },
        )
        return 0
    out.write(
        f"lease record of task {task_id} repaired\n"
        f"  damage      {result.damage}\n"
        f"  moved to    {result.quarantined} (kept, never deleted)\n"
        f"  new record  released at epoch {lease.epoch}, the highest epoch the store records elsewhere\n"
        f"next: run the task again; the next run gets epoch {result.next_epoch}, above every epoch already used\n"
    )
    return 0
