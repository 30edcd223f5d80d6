"""What a task id, a name and a step id may be, checked in one place for every record and face; and how
a next action names a store."""

from __future__ import annotations

import re
import shlex
from typing import Sequence

from .errors import InvalidInputError

__all__ = ["SAFE_NAME", "STEP_ID_PATTERN", "are_step_ids", "check_step_id", "check_task_id", "store_spec_of"]

SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""What a task id or a name may be: a letter or digit, then up to 127 of letters, digits, ``.``, ``_``, ``-``."""
STEP_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+=-]{0,255}")
_STEP_ID_LINES = re.compile(rf"(?:{STEP_ID_PATTERN.pattern}\n)*{STEP_ID_PATTERN.pattern}")


def check_task_id(task_id: object, *, what: str = "task id") -> str:
    """Return ``task_id`` if it is a safe single path component, else raise ``InvalidInputError``.

    Safe: 1-128 characters of ASCII letters, digits, '.', '_' and '-', not starting with '.' or '-'.
    So it can never name a parent directory, an absolute path or a hidden file.
    """
    if not isinstance(task_id, str) or not SAFE_NAME.fullmatch(task_id):
        raise InvalidInputError(
            f"{what} {task_id!r} is not a safe name: use 1-128 of [A-Za-z0-9._-], starting with a letter or digit"
        )
    return task_id


def check_step_id(step_id: object) -> str:
    """Return ``step_id`` if it is a valid step id, else raise ``InvalidInputError``.

    1-256 characters of ASCII letters, digits and ``. _ : / @ + = -``, starting with a letter or
    digit: room for semantic ids such as ``label/42`` or ``post:inbox@2026-11-30``. A step id is
    never used as a file name.
    """
    if not isinstance(step_id, str) or not STEP_ID_PATTERN.fullmatch(step_id):
        raise InvalidInputError(
            f"step id {step_id!r} is not valid: use 1-256 of [A-Za-z0-9._:/@+=-], starting with a letter or digit"
        )
    return step_id


def are_step_ids(values: Sequence[str]) -> bool:
    """Whether every one of ``values`` (strings) is a valid step id (``check_step_id``'s rule).

    For the many ids of a loaded ledger or plan outline: one match over the ids joined by newlines,
    which costs a third of one match per id. No step id holds a newline, and none is empty, so the
    joined text matches only if each id does, and holds as many newlines as there are separators."""
    if not values:
        return True
    joined = "\n".join(values)
    return joined.count("\n") == len(values) - 1 and _STEP_ID_LINES.fullmatch(joined) is not None


def store_spec_of(store: object) -> str:
    """How a command names ``store`` in a next action: its ``spec``, quoted for a shell, or
    ``<store>`` if it has none."""
    spec = getattr(store, "spec", None)
    return shlex.quote(spec) if isinstance(spec, str) and spec else "<store>"
