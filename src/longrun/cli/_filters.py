"""Which tasks a command acts on when it is given a filter instead of a task: ``TaskFilter``.

A filter is the conjunction of what was given: ``--status`` (any of these statuses), ``--function``
(a durable function's ``module:qualname``, or a glob of it, as the task's own record names it; a
task that is not a durable function's never matches), ``--since`` and ``--until`` (last update at
or after, at or before: a duration back from now or a time, as ``ls --since``), ``--match`` (a glob
on the task id, ``fnmatch`` rules, case-sensitive). ``ls``, the bulk forms of ``cancel``,
``approve`` (and ``resume --reopen``), and ``prune`` read them the same way.

A task whose state cannot be read matches only a filter by id (``--match``) alone: nothing else
about it can be known, so no bulk action picks it up by status, function or time.
"""

from __future__ import annotations

import dataclasses
import datetime
import fnmatch
import re
import time
from typing import Iterator, Sequence

from ..contract import INTERNAL_PREFIX
from ..envelope import RunState
from ..errors import InvalidInputError, LongrunError
from ..protocols import Store

__all__ = ["FUNCTION_ACTION", "Candidate", "TaskFilter", "candidates", "function_of", "parent_of", "parse_moment", "parse_statuses"]

FUNCTION_ACTION = INTERNAL_PREFIX + "function"
"""The action of a durable function's own record, which names the function, its arguments and its parent."""


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_moment(text: str, now: float, *, option: str = "--since") -> float:
    """A moment as ``--since``, ``--until`` and ``--before`` take it: a duration back from now
    (``90s``, ``15m``, ``2h``, ``3d``, ``1w``, or several: ``1h30m``) or a time (ISO 8601,
    ``2026-11-30`` or ``2026-11-30T14:00``; UTC unless it says). Returns seconds since the epoch;
    ``InvalidInputError`` naming ``option`` otherwise."""
    text = text.strip()
    parts = _DURATION.findall(text)
    if parts and "".join(number + unit for number, unit in parts) == text.replace(" ", ""):
        return now - sum(float(number) * _UNITS[unit] for number, unit in parts)
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInputError(
            f"{option} {text[:40]!r} is neither a duration (90s, 15m, 2h, 3d, 1w) nor a time (2026-11-30T14:00Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return moment.timestamp()


def _record_payload(state: RunState) -> dict[str, object] | None:
    for record in state.effects.values():
        if record.action == FUNCTION_ACTION and isinstance(record.payload, dict):
            return dict(record.payload)
    return None


def function_of(state: RunState | None) -> str | None:
    """The durable function (``module:qualname``) the task runs, as its own record names it; None for
    another kind of task (a declared plan, a session) or no state."""
    payload = _record_payload(state) if state is not None else None
    function = payload.get("function") if payload is not None else None
    return function if isinstance(function, str) else None


def parent_of(state: RunState | None) -> str | None:
    """The task that started this one as its child, as its own record names it (None: none)."""
    payload = _record_payload(state) if state is not None else None
    parent = payload.get("parent") if payload is not None else None
    return parent if isinstance(parent, str) else None


def parse_statuses(values: Sequence[str], known: Sequence[str]) -> tuple[str, ...]:
    """``--status`` values, each one status or several separated by commas; ``InvalidInputError``
    naming the choices for one that is not in ``known``."""
    statuses: list[str] = []
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if not part:
                continue
            if part not in known:
                raise InvalidInputError(f"--status {part!r} is not a status; choose from {', '.join(known)}")
            if part not in statuses:
                statuses.append(part)
    return tuple(statuses)


@dataclasses.dataclass(frozen=True, slots=True)
class TaskFilter:
    """What a task must be to be chosen (every field given must hold; see the module docstring)."""

    statuses: tuple[str, ...] = ()
    functions: tuple[str, ...] = ()
    since: float | None = None
    """Updated at or after (seconds since the epoch)."""
    until: float | None = None
    """Updated at or before."""
    match: str | None = None
    """A glob on the task id."""

    @property
    def empty(self) -> bool:
        return not (self.statuses or self.functions or self.match is not None or self.since is not None or self.until is not None)

    def __post_init__(self) -> None:
        if self.since is not None and self.until is not None and self.since > self.until:
            raise InvalidInputError("--since is later than --until: no task can match both")
        if self.match is not None and (not self.match or "\0" in self.match):
            raise InvalidInputError("--match needs a glob on the task id, such as 'nightly-*'")

    def id_matches(self, task_id: str) -> bool:
        return self.match is None or fnmatch.fnmatchcase(task_id, self.match)

    def matches(self, task_id: str, state: RunState | None) -> bool:
        """Whether a task with this id and state (None: no committed revision, status ``new``) is chosen."""
        if not self.id_matches(task_id):
            return False
        status = state.status.value if state is not None else "new"
        if self.statuses and status not in self.statuses:
            return False
        if self.functions:
            function = function_of(state)
            if function is None or not any(fnmatch.fnmatchcase(function, pattern) for pattern in self.functions):
                return False
        if self.since is not None or self.until is not None:
            updated = state.updated_at if state is not None else None
            if updated is None:
                return False
            if self.since is not None and updated < self.since:
                return False
            if self.until is not None and updated > self.until:
                return False
        return True

    def describe(self) -> str:
        """The filter in words, for messages ("status awaiting-approval, function app:pay")."""
        parts = []
        if self.statuses:
            parts.append("status " + " or ".join(self.statuses))
        if self.functions:
            parts.append("function " + " or ".join(self.functions))
        if self.since is not None:
            parts.append("updated since " + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.since)))
        if self.until is not None:
            parts.append("updated until " + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.until)))
        if self.match is not None:
            parts.append(f"id matching {self.match!r}")
        return ", ".join(parts) or "every task"


@dataclasses.dataclass(frozen=True, slots=True)
class Candidate:
    """A task the filter chose, with the state it was chosen on."""

    task_id: str
    state: RunState | None


def candidates(store: Store, chosen: TaskFilter, *, skipped: list[str] | None = None) -> Iterator[Candidate]:
    """The store's tasks the filter chooses, in task id order, each loaded once. A task whose state
    cannot be read is left out, and named with the reason in ``skipped`` if given."""
    for task_id in store.list_tasks():
        if not chosen.id_matches(task_id):
            continue
        try:
            state = store.load(task_id).state
        except LongrunError as exc:
            if skipped is not None:
                skipped.append(f"{task_id}: its state cannot be read ({exc})")
            continue
        if chosen.matches(task_id, state):
            yield Candidate(task_id, state)
