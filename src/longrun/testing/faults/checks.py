"""The checks the engine-driving fault groups make after their faults: what the outbox, the call
log, the crash-point traces and the final state must show.

An effect is applied at most once (``outbox_counts``), a verified effect stays verified, revisions
follow one another across processes without a gap (``check_revisions``), a durable function's call
never runs again once its value is committed (``check_calls``), and racing processes write leases
and states in an order the fencing allows (``check_race_log``).
"""

from __future__ import annotations

from typing import Any

from ...functions import FUNCTION_STEP
from ...stores.jsonfile import JsonFileStore
from .. import read_outbox
from .children import Workdir
from .results import GroupResult
from .task import computed_value, function_result

__all__ = [
    "call_counts", "check_calls", "check_final", "check_race_log", "check_revisions", "outbox_counts", "revisions_of",
    "settled_calls",
]  # fmt: skip


def outbox_counts(path: str) -> dict[str, int]:
    """Lines per effect key in an outbox: a count above 1 is an effect applied twice."""
    counts: dict[str, int] = {}
    for line in read_outbox(path):
        counts[line["key"]] = counts.get(line["key"], 0) + 1
    return counts



def call_counts(path: str) -> dict[str, int]:
    """Invocations per call id in a durable face's call log (a line cut by a kill is skipped)."""
    counts: dict[str, int] = {}
    try:
        with open(path) as handle:
            text = handle.read()
    except FileNotFoundError:
        return counts
    for line in text.split("\n")[:-1]:
        call_id = line.split(" ", 1)[0]
        counts[call_id] = counts.get(call_id, 0) + 1
    return counts


def settled_calls(state: Any, counts: dict[str, int], into: dict[str, int]) -> None:
    """Note, for each call whose value a committed state records, how often it had run by then:
    it must never run again (``check_calls``)."""
    if state is None:
        return
    for step_id, record in state.effects.items():
        if step_id.startswith("call-") and record.state.value in ("verified", "failed") and step_id not in into:
            into[step_id] = counts.get(step_id, 0)


def revisions_of(trace: list[tuple[str, int, str]]) -> tuple[int | None, list[int]]:
    loaded = next((int(detail) for name, _, detail in trace if name == "recovery.loaded" and detail.isdigit()), None)
    commits = [int(detail) for name, _, detail in trace if name == "state.committed" and detail.isdigit()]
    return loaded, commits


def check_revisions(traces: list[list[tuple[str, int, str]]]) -> list[str]:
    """Across processes run one after another: each loads the revision the previous one last
    committed (or the one in flight when it died), and commits the next ones without a gap."""
    problems = []
    last: int | None = 0
    for index, trace in enumerate(traces):
        loaded, commits = revisions_of(trace)
        if loaded is None:
            continue  # died before it loaded anything
        if last is not None and loaded not in (last, last + 1):
            problems.append(f"process {index} loaded revision {loaded}, the previous one last committed {last}")
        expected = loaded
        for revision in commits:
            if revision != expected + 1:
                problems.append(f"process {index} committed revision {revision} after {expected}")
            expected = revision
        last = expected
    return problems


def check_calls(
    result: GroupResult, counts: dict[str, int], state: Any, steps: int, where: str, *, settled: dict[str, int], interruptions: int
) -> None:
    """The durable face's calls: each ran, each recorded value is the computed one, none ran again
    once its record was committed (``settled``), and no more than one extra run per interruption
    (a kill, or a takeover) of the process that held the task."""
    again = 0
    for call_id, before in sorted(settled.items()):
        if counts.get(call_id, 0) != before:
            again += counts.get(call_id, 0) - before
            result.fail(f"{where}: {call_id} ran again after its value was committed ({before} -> {counts.get(call_id, 0)} runs)")
    expected = {f"call-{n:03d}" for n in range(steps)}
    never = sorted(expected - set(counts))
    if never:
        result.fail(f"{where}: calls that never ran: {never[:5]}")
    total = sum(counts.values())
    result.duplicates += max(again, total - steps - interruptions)
    if total > steps + interruptions:
        result.fail(f"{where}: {total} call runs for {steps} calls and {interruptions} interruptions: "
                    f"{sorted(call_id for call_id, count in counts.items() if count > 1)[:5]} ran more than once")  # fmt: skip
    if state is None:
        return
    for n in range(steps):
        record = state.effects.get(f"call-{n:03d}")
        if record is not None and record.state.value == "verified" and record.result != computed_value(n):
            result.changed += 1
            result.fail(f"{where}: call-{n:03d} recorded {record.result!r}, it returned {computed_value(n)}")


def check_final(
    result: GroupResult, work: Workdir, task: str, steps: int, where: str, *, verified_before: dict[str, int],
    face: str = "runner", settled: dict[str, int] | None = None, interruptions: int = 0, outcome: dict[str, Any] | None = None,
) -> None:  # fmt: skip
    """The run is done: every effect applied exactly once and verified, none of the verified lost;
    under the durable face also every call replayed (``check_calls``) and the function's result recorded."""
    counts = outbox_counts(work.outbox)
    expected = {f"{task}/step-{i:03d}" for i in range(steps)}
    duplicates = sum(count - 1 for count in counts.values() if count > 1)
    if duplicates:
        result.duplicates += duplicates
        result.fail(f"{where}: applied twice: {sorted(key for key, count in counts.items() if count > 1)}")
    missing = expected - set(counts)
    loaded = JsonFileStore(work.root).load(task)
    state = loaded.state
    if state is None:
        result.resets += 1
        result.fail(f"{where}: no state after the run")
        return
    unverified = sorted(sid for sid, record in state.effects.items() if record.state.value != "verified")
    lost = {key for key in verified_before if key in missing} | {
        f"{task}/{sid}" for sid in verified_before if f"{task}/{sid}" in unverified
    }
    records = 2 * steps + 1 if face == "durable" else steps  # the durable face: a call per step, and the function's own record
    if missing or unverified or len(state.effects) != records:
        result.lost += len(lost) or len(missing)
        result.fail(f"{where}: missing from the outbox {sorted(missing)[:5]}, unverified {unverified[:5]}")
    if state.status.value != "done":
        result.fail(f"{where}: the task ended {state.status.value}, not done")
    if face == "durable":
        check_calls(result, call_counts(work.calls), state, steps, where, settled=settled or {}, interruptions=interruptions)
        record = state.effects.get(FUNCTION_STEP)
        if record is not None and record.state.value == "verified" and record.result != function_result(steps):
            result.changed += 1
        if record is None or record.state.value != "verified" or record.result != function_result(steps):
            result.fail(f"{where}: the function's result is not recorded: {record and (record.state.value, record.result)}")
        if outcome is not None and outcome.get("result") != function_result(steps):
            if outcome.get("result") is not None:  # another answer, not merely none yet
                result.changed += 1
            result.fail(f"{where}: the last run returned {outcome.get('result')!r}, not the function's result")


def check_race_log(entries: list[dict[str, Any]], killed: set[int]) -> tuple[list[str], int]:
    """Check the order of lease and state writes; return the problems and the number of revisions written.

    A line whose process was SIGKILLed right after it (its last line) may announce a write that never
    landed: a lease write did not land if the next lease write issues the same epoch again, a
    state write did not if the next one writes the same revision again."""
    last_of: dict[int, int] = {}
    for index, entry in enumerate(entries):
        last_of[entry["pid"]] = index
    landed = []
    for index, entry in enumerate(entries):
        maybe = entry["pid"] in killed and last_of[entry["pid"]] == index
        if maybe and entry["event"] in ("lease", "commit", "snapshot"):
            key = "epoch" if entry["event"] == "lease" else "rev"
            same = [item for item in entries[index + 1 :] if (item["event"] == "lease") == (entry["event"] == "lease")
                    and item["event"] != "unparsed journal write"][:1]  # fmt: skip
            if same and same[0][key] == entry[key] and not (entry["event"] == "snapshot" and same[0]["event"] == "commit"):
                continue  # it never landed: the next writer reissued it
        landed.append(entry)
    problems = []
    epoch, owner, revision, writes = 0, None, 0, 0
    for entry in landed:
        event = entry["event"]
        if event == "lease":
            if entry["epoch"] != epoch or entry["owner"] != owner:
                if entry["epoch"] <= epoch:
                    problems.append(f"a lease acquisition issued epoch {entry['epoch']}, not above {epoch}")
            epoch, owner = max(epoch, entry["epoch"]), entry["owner"]
        elif event in ("commit", "snapshot"):
            if entry["epoch"] != epoch:
                problems.append(f"revision {entry['rev']} was written with epoch {entry['epoch']}, the highest issued is {epoch}")
            if entry["rev"] == revision + 1:
                revision, writes = revision + 1, writes + 1
            elif not (event == "snapshot" and entry["rev"] == revision):
                problems.append(f"{event} of revision {entry['rev']} after revision {revision}")
        else:
            problems.append(f"a journal write the log could not read: {entry}")
    return problems, writes
