"""What a fault group reports: the cases it ran, the faults it injected, and what broke.

Four counters must stay zero whatever was injected: ``duplicates`` (an effect applied twice, or a
call run again after its value was committed), ``lost`` (a verified effect or a committed state
that a later load no longer shows), ``resets`` (a task that silently started afresh) and
``changed`` (a recorded call or answer that a later run returns differently).
"""

from __future__ import annotations

import dataclasses
import os

__all__ = ["HEADER", "GroupResult", "full_scale", "merge"]


def full_scale() -> bool:
    """Whether the unit tests run the full counts (``LONGRUN_FAULTS_FULL=1``)."""
    return os.environ.get("LONGRUN_FAULTS_FULL", "") not in ("", "0")


@dataclasses.dataclass
class GroupResult:
    """One group's figures. ``failures`` says what broke; the last four counters must stay zero."""

    group: int
    name: str
    face: str = ""
    """``runner`` or ``durable`` for a group run once per face; empty for the store groups."""
    cases: int = 0
    faults: int = 0
    duplicates: int = 0
    lost: int = 0
    resets: int = 0
    changed: int = 0
    """Recorded calls or answers that a later run returned differently."""
    failures: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    def fail(self, message: str) -> None:
        if len(self.failures) < 50:
            self.failures.append(message)

    @property
    def ok(self) -> bool:
        return not self.failures and not self.duplicates and not self.lost and not self.resets and not self.changed

    @property
    def label(self) -> str:
        return f"{self.name} ({self.face})" if self.face else self.name

    def line(self) -> str:
        return (
            f"{self.group:>2}  {self.label:<34} {self.cases:>7} {self.faults:>8} {self.duplicates:>10} {self.lost:>8} "
            f"{self.resets:>7} {self.changed:>7}  {'ok' if self.ok else 'FAILED'}"
        )


HEADER = f"{'#':>2}  {'group':<34} {'cases':>7} {'faults':>8} {'duplicates':>10} {'lost':>8} {'resets':>7} {'changed':>7}  result"


def merge(into: GroupResult, part: GroupResult) -> None:
    """Add ``part``'s figures, failures and notes to ``into`` (a group's cases run apart, then summed)."""
    into.cases += part.cases
    into.faults += part.faults
    into.duplicates += part.duplicates
    into.lost += part.lost
    into.resets += part.resets
    into.changed += part.changed
    for failure in part.failures:
        into.fail(failure)
    into.notes.extend(part.notes)
