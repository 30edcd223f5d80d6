"""A durable function that fails in its own process, for tests that count failures (tests/test_functions_failures.py).

::

    python failing_child.py SPEC TASK MODE LATER MAX_FAILURES CALLS

runs task ``TASK`` of ``looping`` once against the store ``SPEC`` (a JSON-file store directory, a
``sqlite:`` path or a ``postgresql:`` URL) with ``Limits(max_failures=MAX_FAILURES)`` and a clock
``LATER`` seconds ahead (so a killed run's lease has expired for the next), and prints the outcome
as one JSON line. ``MODE`` is what step ``work/N`` does, N being how many times it ran before (each
call appends a line to the file ``CALLS``):

- ``kill``: the process SIGKILLs itself inside the step, every time;
- ``kill-then-progress``: as ``kill`` for the first two calls of each step, then the step returns
  (so the run makes progress to the next step, which is killed twice too), up to three steps;
- ``raise``: the step returns, and the function raises ``ValueError`` after it.
"""

from __future__ import annotations

import json
import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src"))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import longrun  # noqa: E402
from longrun import Limits, RetryPolicy  # noqa: E402
from longrun.stores import open_store  # noqa: E402

from helpers import failing_child  # noqa: E402
from helpers.clocks import LaterClock  # noqa: E402


def work(calls: str, mode: str, step: int) -> int:
    try:
        with open(calls, encoding="ascii") as handle:
            before = sum(1 for line in handle if line.strip() == str(step))
    except FileNotFoundError:
        before = 0
    with open(calls, "a", encoding="ascii") as handle:
        handle.write(f"{step}\n")
    if mode == "kill" or (mode == "kill-then-progress" and before < 2):
        os.kill(os.getpid(), signal.SIGKILL)
    return step


def looping(run: longrun.Run, calls: str, mode: str) -> int:
    steps = 3 if mode == "kill-then-progress" else 1
    total = 0
    for step in range(steps):
        total += run.call(f"work/{step}", work, calls, mode, step)
    if mode == "raise":
        raise ValueError("the function's own bug")
    return total


def main() -> int:
    spec, task, mode, later, max_failures, calls = sys.argv[1:7]
    store = open_store(spec)
    function = longrun.durable(
        store=store,
        clock=LaterClock(float(later)),
        limits=Limits(max_failures=int(max_failures)),
        retry=RetryPolicy(base_delay_s=0.0, max_delay_s=0.0, jitter=0.0),
        lease_ttl_s=30.0,
    )(failing_child.looping)  # by its module's name: a function of __main__ cannot be durable
    try:
        outcome = function.run(task, calls, mode)
    except ValueError as exc:
        print(json.dumps({"raised": str(exc)}))
        return 0
    print(json.dumps({"status": outcome.status.value, "next_action": outcome.next_action}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
