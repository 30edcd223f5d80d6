"""What the tests share, and the programs they start; none of it is a test.

Importing this package puts ``src`` on ``sys.path``: the suite runs from a clean checkout with
``python -m tests``, no install step. The test files import the modules
here as ``helpers.<name>``. The programs that tests run as child processes (``child_runner.py``,
``durable_child.py``, ``race_runner.py``, ``scripted_agent.sh``, ``cli_tasks.py`` as a
``longrun resume`` target, and ``fleet_tasks.py``, which fleet workers import by that name) are started by their path and set up their own ``sys.path``.
"""

import os
import sys

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)
