"""How long the long tests run: ``LONGRUN_TEST_SCALE`` (see ``tests/__init__.py``).

The kill loops, fault groups, fuzzers, races and fleets assert a property over many iterations.
At the default scale each asserts the same property over fewer of them, so that the whole suite
runs in a few minutes on a small machine; ``LONGRUN_TEST_SCALE=full`` (``.ci/run`` sets it) runs
the counts the guarantees were checked with. A test's own variable (``LONGRUN_ASYNC_KILLS``,
``LONGRUN_FUZZ_CASES``, ...) still overrides either.
"""

from __future__ import annotations

import os

__all__ = ["FULL", "VARIABLE", "scaled"]

VARIABLE = "LONGRUN_TEST_SCALE"
_VALUES = ("", "default", "full")

_value = os.environ.get(VARIABLE, "")
if _value not in _VALUES:
    raise RuntimeError(f"{VARIABLE} must be 'full' or 'default' (or unset), not {_value!r}")
FULL = _value == "full"
"""Whether the long tests run at the full scale."""


def scaled(default: int, full: int) -> int:
    """``full`` at the full scale, ``default`` otherwise."""
    return full if FULL else default
