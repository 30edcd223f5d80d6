"""Log formatters for the ``longrun`` logger: ``JsonFormatter`` (one JSON object a line, for a log
system) and ``TextFormatter`` (one line for a person), both with ISO-8601 UTC timestamps.

The ``longrun`` logger's records carry the fields of the run they concern (``events.LOG_FIELDS``:
``task``, ``step``, ``key``, ``action``, ``state``, ``attempt``, ``epoch``, ``revision``,
``function``, ``worker``), filled in from the run under way where the caller gave none. Both
formatters write those that are set and leave out those that are not (a field that does not apply
is absent, never ``null``)::

    import logging, sys
    from longrun.logging import JsonFormatter

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    logging.getLogger("longrun").addHandler(handler)

A JSON line: ``{"time": "2026-12-01T18:20:00.123Z", "level": "INFO", "logger": "longrun",
"message": "...", "task": "t-1", "step": "send", ...}``; with an exception, ``"exception"`` holds its
traceback as text. ``configure`` is what the command line does with ``--log-format`` and
``--log-level``.

This module is named after the standard library's ``logging`` and imports it absolutely (as every
module of the package does), so it shadows nothing.

Not guaranteed: a field's type across releases beyond JSON's (``epoch`` is a number today).
"""

from __future__ import annotations

import datetime
import json
import logging
from typing import Any, Mapping, TextIO

from .errors import InvalidInputError
from .events import LOG_FIELDS

__all__ = ["JsonFormatter", "LOG_FORMATS", "LOG_LEVELS", "TextFormatter", "configure", "iso_utc"]

LOG_FORMATS = ("text", "json")
LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def iso_utc(created: float) -> str:
    """``2026-12-01T18:20:00.123Z``: a record's time, ISO 8601 in UTC, to the millisecond."""
    moment = datetime.datetime.fromtimestamp(created, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _fields(record: logging.LogRecord, names: tuple[str, ...]) -> dict[str, Any]:
    values = record.__dict__
    return {name: values[name] for name in names if values.get(name) is not None}


class JsonFormatter(logging.Formatter):
    """Each record as one JSON object on one line: ``time`` (ISO 8601, UTC), ``level``, ``logger``,
    ``message``, the run's fields that are set (``events.LOG_FIELDS``), ``exception`` if the record
    carries one, and ``static`` (say, ``{"service": "billing"}``) on every line.

    A value JSON cannot hold is written as its ``str()``; the line is always valid JSON."""

    def __init__(self, *, static: Mapping[str, Any] | None = None, fields: tuple[str, ...] = LOG_FIELDS):
        super().__init__()
        self.static = dict(static or {})
        self.fields = tuple(fields)

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": iso_utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        document.update(_fields(record, self.fields))
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            document["exception"] = record.exc_text
        if record.stack_info:
            document["stack"] = self.formatStack(record.stack_info)
        for key, value in self.static.items():
            document.setdefault(key, value)
        return json.dumps(document, ensure_ascii=False, default=str, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """``2026-12-01T18:20:00.123Z INFO longrun: message [task=t-1 step=send ...]``: one line a
    record (its traceback, if any, on the lines after), the run's fields that are set at the end."""

    def __init__(self, *, fields: tuple[str, ...] = LOG_FIELDS):
        super().__init__()
        self.fields = tuple(fields)

    def format(self, record: logging.LogRecord) -> str:
        fields = _fields(record, self.fields)
        shown = " [" + " ".join(f"{name}={value}" for name, value in fields.items()) + "]" if fields else ""
        line = f"{iso_utc(record.created)} {record.levelname} {record.name}: {record.getMessage()}{shown}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


def configure(stream: TextIO, *, log_format: str = "text", level: str | int = "warning") -> logging.Handler:
    """Send the ``longrun`` logger's records to ``stream`` in ``log_format`` from ``level`` up; return
    the handler (remove it with ``logging.getLogger("longrun").removeHandler``). ``InvalidInputError`` for
    a format or level this module does not know."""
    if log_format not in LOG_FORMATS:
        raise InvalidInputError(f"log format {log_format!r} is not one of {LOG_FORMATS}")
    number = LOG_LEVELS.get(level) if isinstance(level, str) else level
    if not isinstance(number, int):
        raise InvalidInputError(f"log level {level!r} is not one of {sorted(LOG_LEVELS)}")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    logger = logging.getLogger("longrun")
    logger.addHandler(handler)
    logger.setLevel(number)
    return handler
