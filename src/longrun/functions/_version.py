"""Code versions: what a durable function's tasks record of the code that started them.

``durable(version=...)`` gives one (1-64 printable ASCII characters without spaces); without it,
the version is ``source-`` and 12 hex digits of the SHA-256 of the function's module file, so any
change to that file is a new version. Not guaranteed: that a change elsewhere (another module the
function calls) changes the default version; give ``version=`` when that matters.
"""

from __future__ import annotations

import hashlib
import inspect
from typing import Any, Callable

from ..errors import InvalidInputError

__all__ = ["MAX_VERSION_CHARS", "check_version", "source_version"]

MAX_VERSION_CHARS = 64


def check_version(version: object) -> str:
    """``version`` if it is 1-64 printable ASCII characters without spaces, else ``InvalidInputError``."""
    if not isinstance(version, str) or not 1 <= len(version) <= MAX_VERSION_CHARS or not version.isascii() or not version.isprintable() or " " in version:
        raise InvalidInputError(f"a code version is 1-{MAX_VERSION_CHARS} printable ASCII characters without spaces, got {version!r}")
    return version


def source_version(fn: Callable[..., Any]) -> str:
    """``source-`` and 12 hex digits of the SHA-256 of the module that defines ``fn`` (its file's
    bytes); ``source-unknown`` when Python cannot find that file (a REPL, a zip without sources)."""
    target = inspect.unwrap(fn)
    try:
        path = inspect.getsourcefile(target)
        if path is None:
            return "source-unknown"
        with open(path, "rb") as handle:
            return "source-" + hashlib.sha256(handle.read()).hexdigest()[:12]
    except (OSError, TypeError):
        return "source-unknown"


