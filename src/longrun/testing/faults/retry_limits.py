"""Group 9, retries across restarts: an effect's attempt limit holds however often its process dies.

With ``max_attempts`` 3, a process is killed during every attempt (after the intent is durable,
inside the adapter, before or after the attempt counter is durable), then one more process runs:
no 4th attempt is ever started, the target is never reached, and the task ends
``limits-exhausted``. The durable face also kills during a call's attempts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

from ...stores.jsonfile import JsonFileStore
from .checks import call_counts, check_calls, outbox_counts, settled_calls
from .children import Workdir, child_command, child_env, fork_servers, spawn
from .points import CALL_POINTS, read_trace
from .results import GroupResult

__all__ = ["run"]


def run(base: str, *, full: bool, face: str = "runner") -> GroupResult:
    """max_attempts 3 and the process killed during every attempt: never a 4th, ends limits-exhausted.

    Each schedule kills one process per attempt at a given moment, then runs one more process:
    after the intent is durable (before the adapter), inside the adapter before the target is
    reached, and alternately before the counter is durable (which must not count: that attempt
    never reached the adapter) and after. The durable face runs the same schedules (its call runs
    first and is replayed), and the same for the call itself: after its attempt is durable, inside
    the call, and after it returned but before its value was committed (each attempt counts)."""
    result = GroupResult(9, "retries across restarts", face)
    schedules = [
        ["effect.intent-persisted"] * 3,
        ["in-adapter"] * 3,
        ["attempt.incremented", "effect.intent-persisted"] * 3,
    ]
    if full:
        schedules += [["effect.intent-persisted", "attempt.incremented", "in-adapter", "attempt.incremented", "in-adapter"]]
    if face == "durable":
        if not full:  # quick: the one effect schedule whose kills also lose a call's value
            schedules = [["attempt.incremented", "effect.intent-persisted"] * 3]
        schedules += [["call.started"] * 3, ["in-call"] * 3]
        if full:
            schedules += [["call.returned"] * 3, ["call.started", "in-call", "call.returned"]]
    with fork_servers(1):  # the children spawn() starts are forked from one server
        for number, schedule in enumerate(schedules):
            task = "fault-task"
            work = Workdir(base, f"retry-{number}")
            signal_path = os.path.join(work.dir, "attempts.txt")
            where = f"schedule {schedule}"
            options = ["--face", face, "--steps", "1", "--max-attempts", "3"]
            calls = any(point in CALL_POINTS or point == "in-call" for point in schedule)
            target, intent = ("call-000", "call.started") if calls else ("step-000", "effect.intent-persisted")
            counted = 0
            settled: dict[str, int] = {}
            for point in [*schedule, ""]:
                if point in ("in-adapter", "in-call"):
                    index = work.children
                    work.children += 1
                    started = _line_count(signal_path)
                    slow = ["--slow", "30", "--signal", signal_path] if point == "in-adapter" else ["--slow-call", "30", "--call-signal", signal_path]
                    child = subprocess.Popen(
                        child_command(work.root, work.outbox, "--offset", str(1e6 * (index + 1)), *options, *slow),
                        env=child_env(LONGRUN_CRASH_TRACE=work.trace(index)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                    )  # fmt: skip
                    deadline = time.monotonic() + 60
                    while child.poll() is None and _line_count(signal_path) == started and time.monotonic() < deadline:
                        time.sleep(0.01)
                    child.kill()
                    _, err = child.communicate()
                    code, outcome = child.returncode, None
                else:
                    code, outcome, err = spawn(work, *options, crash_at=f"{point}:1" if point else "")
                result.cases += 1
                state = JsonFileStore(work.root).load(task).state
                record = state.effects.get(target) if state is not None else None
                attempts = record.attempts if record is not None else 0
                if point:
                    if code != -signal.SIGKILL:
                        result.fail(f"{where}: the child was not killed at {point} (exit {code}): {err[-300:]}")
                        break
                    result.faults += 1
                    counted += point != "attempt.incremented"
                    if attempts != counted:
                        result.fail(f"{where}: after a kill at {point} the state counts {attempts} attempts, expected {counted}")
                    settled_calls(state, call_counts(work.calls), settled)
                elif code != 0 or outcome is None or outcome["status"] != "limits-exhausted":
                    result.fail(f"{where}: the last run ended {outcome and outcome['status']} (exit {code}), not limits-exhausted")
            final = JsonFileStore(work.root).load(task).state
            if final is None or final.status.value != "limits-exhausted":
                result.fail(f"{where}: the state ended {final and final.status.value}")
            elif final.effects[target].attempts != 3:
                result.fail(f"{where}: {final.effects[target].attempts} attempts recorded, not 3")
            intents = sum(1 for index in range(work.children) for name, _, _ in read_trace(work.trace(index)) if name == intent)
            if intents > 3:
                result.duplicates += intents - 3
                result.fail(f"{where}: {intents} attempts were started, more than 3")
            if outbox_counts(work.outbox):
                result.fail(f"{where}: the target was reached although every attempt was killed before it")
            if calls:
                runs = call_counts(work.calls).get(target, 0)
                ran = sum(1 for point in schedule if point in ("in-call", "call.returned"))
                if runs != ran:
                    result.duplicates += max(0, runs - ran)
                    result.fail(f"{where}: the call ran {runs} times, {ran} attempts reached it")
            elif face == "durable":
                check_calls(result, call_counts(work.calls), final, 1, where, settled=settled, interruptions=len(schedule))
    return result


def _line_count(path: str) -> int:
    try:
        with open(path) as handle:
            return sum(1 for line in handle if line.strip())
    except FileNotFoundError:
        return 0
