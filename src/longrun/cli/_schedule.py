"""``longrun schedule add|ls|pause|resume|rm|trigger|backfill STORE ...``: the schedules of a store.

``add`` imports the durable function (``--function MODULE:FUNCTION``) to check it can take a slot,
and stores the schedule in the store's fleet tables; workers serving the function start its slots
(``longrun.schedules``). ``trigger`` and ``backfill`` record slot tasks here, as a worker would,
under the same task ids, so a slot already started is not started again.
"""

from __future__ import annotations

import datetime
from typing import Any, Sequence, TextIO

from ..cron import zone
from ..protocols import Store
from ._common import CliError, ExitCode, write_json
from ._resume import load_target

__all__ = ["cmd_schedule", "parse_time"]


def parse_time(text: str) -> float:
    """An ISO 8601 time (a naive one is UTC) as epoch seconds; exit 2 for anything else."""
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise CliError(f"{text!r} is not an ISO 8601 time such as 2026-12-01T09:00 or 2026-12-01T09:00+01:00", ExitCode.USAGE) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return moment.timestamp()


def _function(target: str, paths: Sequence[str], err: TextIO, verbose: bool) -> Any:
    from ..functions import DurableFunction

    function = load_target(target, paths, err, verbose, runner_factory=False)
    if not isinstance(function, DurableFunction):
        raise CliError(f"{target} is not a @longrun.durable function", ExitCode.USAGE)
    return function


def _iso(moment: float | None) -> str:
    if moment is None:
        return "-"
    return datetime.datetime.fromtimestamp(moment, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")


def cmd_schedule(store: Store, args: Any, out: TextIO, err: TextIO) -> int:
    from ..functions import start_slot
    from ..schedules import Schedule, takes_slot, trigger_task_id
    from ..stores.queue import open_queue

    action, verbose = args.schedule_action, args.verbose > 0
    queue = open_queue(store)
    try:
        if action == "add":
            function = _function(args.function, args.path, err, verbose)
            takes_slot(function.fn)
            schedule = Schedule(args.name, function.name, args.cron, args.timezone, args.catchup)
            since = parse_time(args.since) if args.since is not None else None
            state = queue.add_schedule(schedule, replace=args.replace, since=since)
            return _show(out, args.json, [state], verb="added")
        if action == "ls":
            states = queue.schedules()
            if args.json:
                write_json(out, [state.to_json() for state in states])
                return ExitCode.OK
            if not states:
                out.write("no schedule in this store\n")
            for state in states:
                _line(out, state)
            return ExitCode.OK
        if action in ("pause", "resume"):
            return _show(out, args.json, [queue.pause_schedule(args.name, action == "pause")], verb=f"{action}d")
        if action == "rm":
            queue.remove_schedule(args.name)
            if args.json:
                write_json(out, {"name": args.name, "removed": True})
            else:
                out.write(f"schedule {args.name}: removed (the tasks it started stay)\n")
            return ExitCode.OK
        state = queue.schedule(args.name)
        function = _function(state.schedule.function, args.path, err, verbose)
        if action == "trigger":
            now = queue.clock()
            started = [start_slot(function, store, state.schedule.name, now, task_id=trigger_task_id(state.schedule.name, now))]
        else:  # backfill
            since = parse_time(args.since)
            until = parse_time(args.until) if args.until is not None else queue.clock()
            if until < since:
                raise CliError(f"--until {args.until} is before --since {args.since}", ExitCode.USAGE)
            slots = state.schedule.parsed.slots(since - 1.0, until, zone(state.schedule.timezone), limit=args.max)
            started = [start_slot(function, store, state.schedule.name, slot) for slot in slots]
        if args.json:
            write_json(out, [{"task_id": task_id, "created": created} for task_id, created in started])
        else:
            if not started:
                out.write(f"schedule {args.name}: no slot in that time\n")
            for task_id, created in started:
                out.write(f"task {task_id}: {'recorded; a worker runs it' if created else 'already recorded (started before)'}\n")
        return ExitCode.OK
    finally:
        queue.close()


def _show(out: TextIO, as_json: bool, states: list[Any], *, verb: str) -> int:
    for state in states:
        if as_json:
            write_json(out, state.to_json())
        else:
            out.write(f"schedule {state.schedule.name}: {verb}\n")
            _line(out, state)
    return ExitCode.OK


def _line(out: TextIO, state: Any) -> None:
    schedule = state.schedule
    out.write(
        f"{schedule.name}  {schedule.function}  {schedule.cron!r} {schedule.timezone}  catchup={schedule.catchup}  "
        f"{'paused' if schedule.paused else 'next ' + _iso(state.next_slot)}  last {_iso(state.last_slot)} {state.last_task or ''}\n"
    )
