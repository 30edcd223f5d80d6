"""A parent with a deadline and its child, each run in a process of its own, for the kill test of a
deadline reached while a child runs (tests/test_functions_deadline.py).

::

    python deadline_family.py SPEC WHICH LATER DEADLINE_S CALLS

runs task ``parent`` of ``family`` (``WHICH`` = ``parent``) or task ``kid`` of ``kid`` (``WHICH`` =
``kid``, as a worker would run it) once against the store ``SPEC``, the parent with
``Limits(deadline_s=DEADLINE_S)``, on a clock ``LATER`` seconds ahead (so a killed run's leases
have expired for the next), and prints the outcome as one JSON line (``status``, ``inferences``).
The child's step ``work`` appends a line to the file ``CALLS`` and, the first time, SIGKILLs the
process: the child, and the parent that runs it, die while the child runs. The process may also be
armed with ``LONGRUN_CRASH_AT`` (the named points of ``longrun._crashpoints``).
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

from helpers import deadline_family  # noqa: E402
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


def kid(run: longrun.Run, calls: str) -> str:
    run.call("work", work, calls)
    run.call("after", work, calls)
    return "kid done"


def family(run: longrun.Run, calls: str) -> str:
    return str(run.child("kid", KID, calls))


KID: "longrun.DurableFunction[str]"
"""The child's durable function, made by ``main`` (it names the store)."""


def main() -> int:
    spec, which, later, deadline_s, calls = sys.argv[1:6]
    store = open_store(spec)
    clock = LaterClock(float(later))
    deadline_family.KID = longrun.durable(store=store, clock=clock, lease_ttl_s=30.0)(deadline_family.kid)
    KID = deadline_family.KID
    parent = longrun.durable(store=store, clock=clock, limits=Limits(deadline_s=float(deadline_s)), lease_ttl_s=30.0)(deadline_family.family)
    outcome = parent.run("parent", calls) if which == "parent" else KID.run("kid", calls)
    print(json.dumps({"status": outcome.status.value, "inferences": [item.detail for item in outcome.inferences]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
