"""longrun's tests: ``python -m unittest discover -s tests`` runs them all, from the repository root.

A single file runs by path too (``python -m unittest tests/test_runner.py``): importing this
package first puts ``tests`` on ``sys.path``, so that the test files find ``helpers`` (the shared
test code, which puts ``src`` there) whichever way they were loaded.
"""

import os
import sys

_TESTS = os.path.dirname(os.path.abspath(__file__))
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
