"""What a test needs beyond Python: is a package installed, and skip without it, or fail in CI.

longrun and its test suite need only the standard library; a few tests also use an optional,
test-only component (PostgreSQL and its drivers, the type checkers, a headless browser, the
OpenTelemetry SDK, setuptools). Without it such a test skips and says what to install, unless the
component's ``LONGRUN_REQUIRE_*`` variable is set (``.ci/run`` sets every one and installs what they
name), which makes it fail instead: CI must never pass by skipping.
"""

from __future__ import annotations

import importlib.util
import os
import unittest

__all__ = ["installed", "required", "skip_or_fail"]


def installed(module: str) -> bool:
    """Whether ``module`` (dotted names too) can be imported. ``importlib.util.find_spec`` raises,
    rather than answer None, when a parent package of a dotted name is missing: that is an answer."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def required(variable: str) -> bool:
    """Whether ``variable`` (a ``LONGRUN_REQUIRE_*`` name) asks for the component: set, and not 0."""
    return os.environ.get(variable, "") not in ("", "0")


def skip_or_fail(variable: str, reason: str) -> None:
    """Skip the test for ``reason``, or fail it when ``variable`` requires what is missing."""
    if required(variable):
        raise AssertionError(f"{variable}=1 but {reason}")
    raise unittest.SkipTest(reason)
