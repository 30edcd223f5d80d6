"""The operator's interventions: ``resolve`` (the outcome of an uncertain effect, as a person saw it),
``resume --reopen`` (a task that ended unfinished goes on) and ``fork`` (a new task from a step).

``resolve`` and the reopen write one control record each (``longrun.intervention``), where an
approval would go: into the store, or under ``--control-root``, signed with ``--sign-key`` when
given; the task's next run acts on it once. ``resume --reopen`` then runs the task here, as
``resume STORE TASK`` does; ``fork`` records the new task (a worker or ``resume`` runs it).

Each shows what it wrote; with ``--json``, one JSON object. Refusals are typed errors, exit 2, with
nothing written: an unknown task or step, an effect not in flight or not the one checked
(``--key``, ``--payload-digest``), a task that cannot be reopened, a fork onto an existing task.

Not guaranteed: that the run acts on the record (it must read where it was written: a run whose
approval source is a control root does not read one written into the store).
"""

from __future__ import annotations

import json
from typing import Any, TextIO

from ..approval import Approval
from ..authority import key_id, load_key, sign_approval
from ..canonical import JSONValue, parse_json
from ..errors import CorruptStateError
from ..intervention import ApprovalWriter, Reopen, Resolution, Signer, reopen, resolve
from ..protocols import Store
from ._common import CliError, ExitCode, checked_task, format_time, write_json
from ._control import open_control_root

__all__ = ["cmd_fork", "cmd_resolve", "parse_result", "signer", "write_reopen"]


def parse_result(text: str | None) -> JSONValue:
    """``--result JSON``: the recorded result of an effect resolved as applied."""
    if text is None:
        return None
    try:
        return parse_json(text.encode("utf-8", "surrogatepass"), what="--result", max_bytes=64 * 1024)
    except CorruptStateError as exc:
        raise CliError(str(exc), ExitCode.USAGE) from None


def _writer(control_root: str | None) -> ApprovalWriter | None:
    return open_control_root(control_root)


def cmd_resolve(
    store: Store,
    task_id: str,
    step_id: str,
    *,
    applied: bool,
    evidence: str,
    by: str,
    result: JSONValue,
    key: str | None,
    payload_digest: str | None,
    out: TextIO,
    sign_key: str | None = None,
    control_root: str | None = None,
    as_json: bool = False,
) -> int:
    task_id = checked_task(task_id)
    if result is not None and not applied:
        raise CliError("--result goes with --applied: an effect found absent has no result", ExitCode.USAGE)
    secret = load_key(sign_key) if sign_key is not None else None
    writer = _writer(control_root)
    approval = resolve(
        store, task_id, step_id, applied=applied, evidence=evidence, by=by, result=result, key=key,
        payload_digest=payload_digest, write_to=writer, sign=signer(secret),
    )  # fmt: skip
    resolution = Resolution.from_json(approval.answer)
    if as_json:
        write_json(out, _written(approval, secret, control_root))
        return 0
    effect = "applied: verified, and never applied again" if applied else "absent: planned again, and applied again"
    out.write(
        f"resolved step {step_id} of task {task_id} as {resolution.outcome}\n"
        f"  effect key      {resolution.key}\n"
        f"  payload digest  {approval.payload_digest}\n"
        f"  by              {approval.approver}, at {format_time(approval.granted_at)}\n"
        f"  evidence        {resolution.evidence}\n"
        + (f"  result          {_short(resolution.result)}\n" if resolution.result is not None else "")
        + f"  record          {approval.approval_id} (used once; expires {format_time(approval.expires_at)})\n"
        + (f"  signed          hmac-sha256 with key {key_id(secret)}\n" if secret is not None else "")
        + (f"  written under   {control_root}\n" if control_root is not None else "")
        + f"next: run the task again; its next run takes the effect as {effect}\n"
    )
    return 0


def write_reopen(
    store: Store,
    task_id: str,
    *,
    reason: str,
    by: str,
    add_attempts: int,
    add_time_s: float,
    err: TextIO,
    sign_key: str | None,
    control_root: str | None,
    as_json: bool,
) -> None:
    """Write the reopen record ``resume --reopen`` runs the task after (said on ``err``: the outcome
    goes to stdout)."""
    secret = load_key(sign_key) if sign_key is not None else None
    approval = reopen(
        store, task_id, reason, by=by, add_attempts=add_attempts, add_time_s=add_time_s, write_to=_writer(control_root), sign=signer(secret)
    )
    record = Reopen.from_json(approval.answer)
    if not as_json:
        err.write(
            f"reopened task {task_id} (it ended {record.status} at revision {record.revision}) by {approval.approver}: {record.reason}"
            + (f"; {record.add_attempts} more attempts" if record.add_attempts else "")
            + (f"; {record.add_time_s:g} s more work" if record.add_time_s else "")
            + f" (record {approval.approval_id})\n"
        )


def signer(secret: bytes | None) -> Signer | None:
    """The signing a ``--sign-key`` asks for, as the interventions take it (none without a key)."""
    if secret is None:
        return None
    return lambda approval: sign_approval(approval, secret)


def _written(approval: Approval, secret: bytes | None, control_root: str | None) -> dict[str, JSONValue]:
    return {"record": approval.to_json(), "signed_with_key": key_id(secret) if secret is not None else None, "written_under": control_root}


def _short(value: JSONValue) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= 200 else text[:197] + "..."


def cmd_fork(
    store: Store, function: Any, task_id: str, new_task_id: str, from_step: str | None, as_json: bool, out: TextIO
) -> int:
    """``longrun fork STORE TASK NEW_TASK [--from STEP]`` with ``function`` (the task's own, imported)."""
    start_at = function.with_options(store=store).fork(task_id, new_task_id, from_step=from_step)
    if as_json:
        write_json(out, {"task_id": new_task_id, "forked_from": {"task": task_id, "step": start_at}, "function": function.name})
        return 0
    where = f"from step {start_at}" if start_at else "after its last step"
    out.write(
        f"task {new_task_id}: a fork of {task_id} {where} ({function.name}, the same arguments)\n"
        f"  copied     the verified effects and recorded calls before it, as recorded: they are not applied again\n"
        f"  new keys   {new_task_id}/<step id> from {start_at or 'its next step'} on: the target sees those as new effects\n"
        f"next: a worker runs it, or `longrun resume STORE {new_task_id}`\n"
    )
    return 0
