"""``longrun demo``: a real crash and a real resume, on a fictional newsletter, checked end to end.

The plan publishes issue 42 of a newsletter in five steps (render, upload, two sends, archive),
every one an effect on an ``OutboxAdapter`` (a JSON-lines file standing in for the outside world).
The archive step's payload is computed from the two sends' results.

1. A worker subprocess (``python -m longrun demo --worker ROOT``) runs the plan with an outbox
   that SIGKILLs the worker right after the third effect's line is durable and before the runner
   records it: the effect happened, the state says only ``started``.
2. This process reads the state (read-only) to show exactly that, waits out the dead worker's
   short lease, and resumes in-process with a normal outbox. The runner observes the in-flight
   effect, finds it applied and verifies it without applying it again.
3. It prints the ledger, the outbox lines per key and the outcome's evidence, and checks: the
   worker died by SIGKILL, the resume did not re-apply the killed effect, every key is in the
   outbox exactly once, and the run is ``done``. Exit 0 if every check passes, 1 otherwise.

The run uses the real clock and a real JSON-file store in a temporary directory (or ``--keep DIR``).
With ``--json`` the narrative goes to stderr and stdout gets a JSON summary of the checks and the
resumed run's outcome.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, TextIO, Unpack

from ..canonical import JSONValue
from ..contract import RunContract, Step, plan_digest
from ..ledger import EffectState
from ..outcome import Evidence, RunOutcome, Status
from ..engine import EngineOptions
from ..runner import Runner
from ..stores import JsonFileStore
from ..testing import OutboxAdapter, read_outbox
from ._common import CliError, ExitCode, evidence_line, short_digest

__all__ = ["TASK_ID", "KILLED_STEP", "build_plan", "run_demo", "run_worker"]

TASK_ID = "newsletter-issue-42"
KILLED_STEP = "send-list-a"
"""The third step: the worker dies right after its effect reaches the outbox."""
WORKER_LEASE_TTL_S = 1.0
"""Short, so the resume waits only about a second for the dead worker's lease to expire."""
WORKER_TIMEOUT_S = 60.0
ACTIONS = ("render", "upload", "send", "archive")


def _archive_payload(results: Mapping[str, Any]) -> dict[str, JSONValue]:
    """The archive entry points at the outbox lines of both sends: known only once they are verified."""
    return {
        "issue": 42,
        "archive": "newsletters/2024/issue-42",
        "send_receipts": [results["send-list-a"]["line"], results["send-list-b"]["line"]],
    }


def build_plan() -> tuple[RunContract, list[Step]]:
    contract = RunContract(
        task_id=TASK_ID,
        goal="publish issue 42 of the (fictional) weekly newsletter to both subscriber lists, once",
        non_goals=("edit the issue's content", "change the subscriber lists"),
        allowed_actions=ACTIONS,
    )
    steps = [
        Step("render", "render", {"issue": 42, "template": "weekly"}),
        Step("upload", "upload", {"issue": 42, "file": "issue-42.html"}),
        Step(KILLED_STEP, "send", {"issue": 42, "list": "subscribers A-M"}),
        Step("send-list-b", "send", {"issue": 42, "list": "subscribers N-Z"}),
        Step("archive", "archive", _archive_payload),
    ]
    return contract, steps


def _paths(root: str) -> tuple[str, str]:
    return os.path.join(root, "store"), os.path.join(root, "outbox.jsonl")


def _runner(root: str, adapter: OutboxAdapter, **options: Unpack[EngineOptions]) -> Runner:
    contract, steps = build_plan()
    store_root, _ = _paths(root)
    return Runner(contract, steps, store=JsonFileStore(store_root, create=True), adapters={name: adapter for name in ACTIONS}, **options)


def run_worker(root: str, out: TextIO) -> int:
    """The worker: run the plan with an outbox that kills this process after the third effect."""
    _, outbox = _paths(root)
    adapter = OutboxAdapter(outbox, kill_after_apply={KILLED_STEP})
    outcome = _runner(root, adapter, lease_ttl_s=WORKER_LEASE_TTL_S).run()
    out.write(f"worker finished without being killed: {outcome.status.value}\n")  # not reached when the kill works
    return 0


def _prepare_root(keep: str | None) -> str:
    if keep is None:
        return tempfile.mkdtemp(prefix="longrun-demo-")
    root = os.path.abspath(keep)
    if os.path.exists(root) and (not os.path.isdir(root) or os.listdir(root)):
        raise CliError(f"--keep {keep!r} must be a new or empty directory", ExitCode.USAGE)
    os.makedirs(root, mode=0o700, exist_ok=True)
    return root


def run_demo(keep: str | None, out: TextIO, *, as_json: bool = False, err: TextIO | None = None) -> int:
    """Run the demonstration; with ``as_json`` the narrative goes to ``err`` and ``out`` gets one
    JSON summary: ``{passed, checks: [{ok, what}], outcome, kept}`` (``kept`` is the directory or null)."""
    root = _prepare_root(keep)
    try:
        demo = _Demo(root, err if as_json and err is not None else out)
        code = demo.run()
        if as_json:
            out.write(
                json.dumps(
                    {
                        "passed": code == ExitCode.OK,
                        "checks": [{"ok": ok, "what": what} for ok, what in demo.checks],
                        "outcome": demo.outcome.to_json() if demo.outcome is not None else None,
                        "kept": root if keep is not None else None,
                    },
                    indent=2,
                    sort_keys=True,
                )
                + "\n"
            )
        return code
    finally:
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)


class _Demo:
    def __init__(self, root: str, out: TextIO):
        self.root = root
        self.out = out
        self.store_root, self.outbox = _paths(root)
        contract, steps = build_plan()
        self.steps = steps
        self.keys = [step.effect_key(TASK_ID) for step in steps]
        self.killed_key = f"{TASK_ID}/{KILLED_STEP}"
        self.digest = plan_digest(contract, steps)
        self.checks: list[tuple[bool, str]] = []
        self.outcome: RunOutcome | None = None

    def say(self, line: str = "") -> None:
        self.out.write(line + "\n")
        self.out.flush()

    def check(self, ok: bool, what: str) -> bool:
        self.checks.append((ok, what))
        return ok

    def run(self) -> int:
        self.say("longrun demo: publish a fictional newsletter, kill the worker mid-run, resume")
        self.say(f"  store   {self.store_root}")
        self.say(f"  outbox  {self.outbox}  (the fictional target: one JSON line per applied effect)")
        self.say(f"  plan    {' -> '.join(step.step_id for step in self.steps)}  ({short_digest(self.digest)})")
        if self.crash() and self.inspect():
            self.resume()
        return self.verdict()

    # 1. the crash -----------------------------------------------------------------------------

    def crash(self) -> bool:
        self.say()
        self.say(f"1. worker subprocess runs the plan; its outbox SIGKILLs it right after {KILLED_STEP}'s line is durable")
        package_parent = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = package_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        command = [sys.executable, "-m", "longrun", "demo", "--worker", self.root]
        try:
            worker = subprocess.run(command, env=env, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.check(False, f"worker finished within {WORKER_TIMEOUT_S:.0f}s")
            return False
        killed = worker.returncode == -signal.SIGKILL
        if killed:
            self.say(f"   worker died by SIGKILL (returncode {worker.returncode})")
        else:
            self.say(f"   worker was NOT killed: returncode {worker.returncode} (expected {-signal.SIGKILL})")
        if not killed:
            for line in (worker.stdout + worker.stderr).strip().splitlines()[-10:]:
                self.say(f"   | {line}")
        return self.check(killed, "the worker died by SIGKILL")

    # 2. what the durable state says -------------------------------------------------------------

    def inspect(self) -> bool:
        store = JsonFileStore(self.store_root, create=True)
        state = store.load(TASK_ID).state  # read-only: no lease
        if state is None:
            return self.check(False, "the worker committed state before it died")
        self.say()
        self.say(f"2. state file after the kill (read-only, revision {state.revision}): status {state.status.value}")
        for record in state.effects.values():
            mark = "   <- applied in the outbox, not recorded" if record.step_id == KILLED_STEP else ""
            self.say(f"     {record.step_id:<12} {record.state.value:<9} attempts {record.attempts}{mark}")
        self.say(f"   next action recorded: {state.next_action}")
        in_outbox = sum(1 for line in read_outbox(self.outbox) if line.get("key") == self.killed_key)
        self.say(f"   outbox lines for {self.killed_key}: {in_outbox}")
        killed = state.effects.get(KILLED_STEP)
        ok = self.check(
            killed is not None and killed.state is EffectState.STARTED and in_outbox == 1,
            f"before the resume, {KILLED_STEP} was 'started' in the state and already once in the outbox",
        )
        lease = store.read_lease(TASK_ID)
        if lease is not None:
            wait = min(lease.expires_at - time.time(), 10 * WORKER_LEASE_TTL_S)
            self.say(f"   the dead worker's lease (epoch {lease.epoch}) " + (f"expires in {wait:.1f}s; waiting for it" if wait > 0 else "has expired"))
            if wait > 0:
                time.sleep(wait + 0.05)
        return ok

    # 3. the resume ------------------------------------------------------------------------------

    def resume(self) -> None:
        self.say()
        self.say("3. resume in this process with a normal outbox (same plan, same store)")
        adapter = OutboxAdapter(self.outbox)
        outcome = self.outcome = _runner(self.root, adapter).run()
        self.say(f"   outcome: {outcome.status.value} (revision {outcome.revision}, lease epoch {outcome.epoch})")
        applied, observed = adapter.calls[self.killed_key], adapter.observe_calls[self.killed_key]
        self.say(f"   {KILLED_STEP} on resume: apply calls {applied}, observe calls {observed}")
        self.check(applied == 0 and observed >= 1, f"the resume observed {KILLED_STEP} and did not apply it again")

        state = JsonFileStore(self.store_root).load(TASK_ID).state
        assert state is not None
        self.say()
        self.say("ledger:")
        self.say(f"  {'STEP':<12} {'KEY':<32} {'STATE':<9} {'ATTEMPTS':<8} PAYLOAD")
        for record in state.effects.values():
            self.say(f"  {record.step_id:<12} {record.key:<32} {record.state.value:<9} {record.attempts:<8} {short_digest(record.payload_digest)}")
        archive = state.effects.get("archive")
        if archive is not None:
            self.say(f"  archive payload (computed from the sends' results): {json.dumps(archive.payload, sort_keys=True)}")

        counts = adapter.counts()
        self.say()
        self.say("outbox lines per key:")
        for key in self.keys + sorted(set(counts) - set(self.keys)):
            self.say(f"  {key:<32} x{counts.get(key, 0)}")
        self.check(
            all(counts.get(key, 0) == 1 for key in self.keys) and set(counts) == set(self.keys),
            f"every one of the {len(self.keys)} keys is in the outbox exactly once ({sum(counts.values())} lines)",
        )

        self.say()
        self.say("evidence from the resumed run:")
        self._evidence("observations", outcome.observations)
        self._evidence("inferences", outcome.inferences)
        self._evidence("unknowns", outcome.unknowns)
        self.say(f"next action: {outcome.next_action}")
        self.check(outcome.status is Status.DONE, f"the run is done (status {outcome.status.value})")

    def _evidence(self, title: str, items: tuple[Evidence, ...]) -> None:
        self.say(f"  {title} ({len(items)}){':' if items else ''}")
        for item in items:
            self.say(f"    - {evidence_line(item)}")

    def verdict(self) -> int:
        self.say()
        self.say("checks:")
        for ok, what in self.checks:
            self.say(f"  {'PASS' if ok else 'FAIL'}  {what}")
        passed = bool(self.checks) and all(ok for ok, _ in self.checks) and len(self.checks) == 5
        self.say("demo passed" if passed else "demo FAILED")
        return ExitCode.OK if passed else ExitCode.NOT_AS_ASKED
