"""longrun's tests: ``python -m tests`` runs them all, from the repository root, in one worker
process per core (``__main__.py``); ``python -m unittest discover -s tests`` runs the same in one.

A single file runs by path too (``python -m unittest tests/test_runner.py``): importing this
package first puts ``tests`` on ``sys.path``, so that the test files find ``helpers`` (the shared
test code, which puts ``src`` there) whichever way they were loaded.

Nothing needs installing: a test that needs an optional, test-only component (PostgreSQL, the type
checkers, a headless browser, the OpenTelemetry SDK, setuptools) skips and says what to install,
unless its ``LONGRUN_REQUIRE_*`` variable is set (``.ci/run`` sets them all): then it fails
(``helpers/optional.py``).

The scale: the long kill, fault, fuzz, race and fleet runs assert their properties over fewer
iterations by default, so that the whole suite takes a few minutes on 2 cores.
``LONGRUN_TEST_SCALE=full`` runs them at the counts the guarantees were checked with (``.ci/run``
sets it; ``helpers/scale.py``). Longer runs still: ``LONGRUN_FAULTS_FULL=1`` (every fault group at
the report's counts), ``LONGRUN_FLEET_FULL=1``, ``LONGRUN_FUZZ_CASES=N``, ``LONGRUN_ASYNC_KILLS=N``,
``LONGRUN_BLOB_KILLS=N``.
"""

import os
import sys

_TESTS = os.path.dirname(os.path.abspath(__file__))
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
