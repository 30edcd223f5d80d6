"""A durable function with a deadline, run in its own process, for the restart test (tests/test_functions_deadline.py).

::

    python deadline_child.py SPEC TASK LATER DEADLINE_S CALLS

runs task ``TASK`` of ``timed`` once against the store ``SPEC`` with ``Limits(deadline_s=DEADLINE_S)``
and a clock ``LATER`` seconds ahead (so a killed run's lease has expired for the next), and prints
the outcome as one JSON line. Step ``work`` appends a line to the file ``CALLS`` and, the first time,
SIGKILLs the process; then the function sleeps far longer than any deadline.
"""

from __future__ import annotations

import json
import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src"))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import longrun  # noqa: E402
from longrun import Limits  # noqa: E402
from longrun.stores import open_store  # noqa: E402

from helpers import deadline_child  # noqa: E402
from helpers.clocks import LaterClock  # noqa: E402


def work(calls: str) -> str:
    try:
        with open(calls, encoding="ascii") as handle:
            before = sum(1 for _ in handle)
    except FileNotFoundError:
        before = 0
    with open(calls, "a", encoding="ascii") as handle:
        handle.write("work\n")
    if before == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    return "worked"


def timed(run: longrun.Run, calls: str) -> str:
    run.call("work", work, calls)
    run.sleep("nap", 1_000_000.0)
    return "done"


def main() -> int:
    spec, task, later, deadline_s, calls = sys.argv[1:6]
    store = open_store(spec)
    function = longrun.durable(
        store=store, clock=LaterClock(float(later)), limits=Limits(deadline_s=float(deadline_s)), lease_ttl_s=30.0
    )(deadline_child.timed)  # by its module's name: a function of __main__ cannot be durable
    outcome = function.run(task, calls)
    print(json.dumps({"status": outcome.status.value, "wake_at": outcome.wake_at}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
