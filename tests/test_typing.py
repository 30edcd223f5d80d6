"""The package, the examples and the README's code type-check: ``mypy --strict`` and ``pyright``.

Both checkers read their settings from pyproject.toml (``[tool.mypy]``, ``[tool.pyright]``: strict;
named explicitly, so that no configuration file elsewhere is picked up) and check ``src/longrun``, ``examples`` and ``tests/helpers/typing_public_api.py``, which holds the README's
code as written. The tests skip when a checker is not installed, unless
``LONGRUN_REQUIRE_TYPECHECK=1`` (CI sets it, and ``.ci/run`` installs the pinned versions), which
makes them fail instead: CI must never pass by skipping them.

pyright's PyPI package runs the pyright it bundles on the ``node`` found on ``PATH``; the test
refuses to run it without one (the wrapper would otherwise download Node.js) and turns off the
wrapper's check for a newer release, so nothing but the checkers runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import unittest

from helpers import support
from helpers.optional import installed
from helpers.optional import skip_or_fail as _skip_or_fail

REQUIRE_VARIABLE = "LONGRUN_REQUIRE_TYPECHECK"
TARGETS = ["src/longrun", "examples", "tests/helpers/typing_public_api.py"]
TIMEOUT_S = 600.0


def skip_or_fail(reason: str) -> None:
    _skip_or_fail(REQUIRE_VARIABLE, reason)


def run_checker(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=support.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )


class TypeCheckTests(unittest.TestCase):
    def test_mypy_strict_finds_no_error(self) -> None:
        if not installed("mypy"):
            skip_or_fail("mypy is not installed (pip install mypy)")
        with tempfile.TemporaryDirectory(prefix="longrun-mypy-") as cache:  # no cache left in the checkout
            result = run_checker(["mypy", "--config-file", "pyproject.toml", "--strict", "--cache-dir", cache, *TARGETS])
        self.assertEqual(result.returncode, 0, f"mypy --strict failed:\n{result.stdout}{result.stderr}")
        self.assertIn("Success: no issues found", result.stdout)

    def test_pyright_strict_finds_no_error(self) -> None:
        if not installed("pyright"):
            skip_or_fail("pyright is not installed (pip install pyright)")
        if shutil.which("node") is None:
            skip_or_fail("pyright needs Node.js: no 'node' on PATH")
        env = dict(os.environ, PYRIGHT_PYTHON_GLOBAL_NODE="1", PYRIGHT_PYTHON_IGNORE_WARNINGS="1")
        env.pop("PYRIGHT_PYTHON_FORCE_VERSION", None)  # the bundled pyright: nothing to download
        result = run_checker(["pyright", "--project", "pyproject.toml", *TARGETS], env)
        self.assertEqual(result.returncode, 0, f"pyright failed:\n{result.stdout}{result.stderr}")
        self.assertIn("0 errors", result.stdout)

    def test_the_engine_options_every_face_takes_are_checked_by_name_and_type(self) -> None:
        if not installed("mypy"):
            skip_or_fail("mypy is not installed (pip install mypy)")
        wrong = (
            "import longrun\n"
            "from longrun.testing import OutboxAdapter\n"
            "store = longrun.JsonFileStore('/tmp/x')\n"
            "adapters = {'a': OutboxAdapter('/tmp/o')}\n"
            "longrun.Runner(longrun.RunContract('t', 'g'), [], store=store, adapters=adapters, lease_ttl_s='30')\n"
            "longrun.durable(store=store, adapters=adapters, max_parallel='4')\n"
            "longrun.Runner(longrun.RunContract('t', 'g'), [], store=store, adapters=adapters, colour=1)\n"
        )
        with tempfile.TemporaryDirectory(prefix="longrun-mypy-") as scratch:
            path = os.path.join(scratch, "wrong.py")
            with open(path, "w") as handle:
                handle.write(wrong)
            env = dict(os.environ, MYPYPATH=os.path.join(support.ROOT, "src"))
            result = subprocess.run(
                [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir", os.path.join(scratch, "cache"), "wrong.py"],
                cwd=scratch, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        lines = {int(line.split(":")[1]) for line in result.stdout.splitlines() if line.startswith("wrong.py:") and ": error:" in line}
        self.assertEqual(lines, {5, 6, 7}, result.stdout)

    def test_pyright_runs_strict(self) -> None:
        with open(os.path.join(support.ROOT, "pyproject.toml"), "rb") as handle:
            config = tomllib.load(handle)["tool"]
        self.assertEqual(config["pyright"]["typeCheckingMode"], "strict")
        self.assertIs(config["mypy"]["strict"], True)
        self.assertEqual(config["pyright"]["include"], TARGETS)
        self.assertEqual(config["mypy"]["files"], TARGETS)


if __name__ == "__main__":
    unittest.main()
