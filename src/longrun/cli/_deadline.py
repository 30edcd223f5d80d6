"""How ``status``, its ``--json`` and the console word a task's wall-clock deadline
(``longrun.deadline``): when it is, where it came from, and how long is left, or that it passed
(the task stops ``deadline-exceeded`` when it next runs) or was exceeded (it stopped so).

Read-only: it judges the recorded deadline against the caller's ``now`` and changes nothing.
"""

from __future__ import annotations

from ..envelope import RunState
from ..outcome import TERMINAL, Status
from ._common import format_duration, format_time

__all__ = ["deadline_view", "deadline_words"]

_DEADLINE_SOURCES = {
    "limits": "from Limits.deadline_s", "caller": "asked by the caller", "parent": "inherited from its parent",
    "reopen": "moved on by a reopen",
}  # fmt: skip


def deadline_view(state: RunState | None, now: float) -> dict[str, object] | None:
    """The task's deadline as ``status --json`` shows it: the recorded one (``at``, ``source``,
    ``recorded_at``), ``left_s`` (negative once passed), ``passed``, ``exceeded`` (the task stopped
    ``deadline-exceeded``) and ``words`` (``deadline_words``); None without one."""
    deadline = state.deadline if state is not None else None
    if state is None or deadline is None:
        return None
    return {
        **deadline.to_json(), "left_s": deadline.at - now, "passed": now >= deadline.at,
        "exceeded": state.status is Status.DEADLINE_EXCEEDED, "words": deadline_words(state, now),
    }  # fmt: skip


def deadline_words(state: RunState, now: float) -> str | None:
    """The task's deadline for people: when it is, how long is left or that it passed, and where it
    came from; None without one."""
    deadline = state.deadline
    if deadline is None:
        return None
    source = _DEADLINE_SOURCES.get(deadline.source, deadline.source)
    when = f"{format_time(deadline.at)} ({source})"
    if state.status is Status.DEADLINE_EXCEEDED:
        return f"{when}: exceeded {format_duration(now - deadline.at)} ago; the task stopped deadline-exceeded"
    if state.status in TERMINAL:
        return f"{when}: the task ended {state.status.value} before it"
    if now >= deadline.at:
        return f"{when}: passed {format_duration(now - deadline.at)} ago; the task stops deadline-exceeded when it next runs"
    return f"{when}: {format_duration(deadline.at - now)} left"
