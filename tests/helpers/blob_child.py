"""A runner whose effects carry large payloads and results, in its own process, for tests that kill it
(tests/test_crash.py, ``LargeValueKillTests``).

Usage: python blob_child.py ROOT OUTBOX [--sqlite] [--steps N] [--later S] [--compact-early]; prints the
outcome as one JSON line. Each step's payload is about 96 KiB (over ``stores.blobs.BLOB_MIN_BYTES``,
so it is kept as a blob), and every odd step's receipt carries a result of about 80 KiB. The JSON-file
store runs over ``CrashPointIO``, so ``LONGRUN_CRASH_AT`` may name a blob's write (``blob.*``) as well
as the points every run reaches; ``--compact-early`` makes it compact (and drop orphans) all the time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src"))  # run by path: longrun from src
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests: for helpers

from longrun import JsonFileStore, RunContract, Runner, SqliteStore, Step  # noqa: E402
from longrun.adapters import EffectRequest, Observation, Receipt  # noqa: E402
from longrun.stores import jsonfile  # noqa: E402
from longrun.testing import OutboxAdapter  # noqa: E402
from longrun.testing.faults import CrashPointIO  # noqa: E402

from helpers.clocks import LaterClock  # noqa: E402

PAYLOAD_CHARS = 96 * 1024
RESULT_CHARS = 80 * 1024


def payload(index: int) -> dict[str, object]:
    return {"n": index, "blob": f"{index:04d}" + "b" * PAYLOAD_CHARS}


def result(line: int) -> dict[str, object]:
    return {"line": line, "echo": f"{line:04d}" + "r" * RESULT_CHARS}


class LargeResults:
    """The outbox, with a large result on every odd step's receipt."""

    def __init__(self, inner: OutboxAdapter):
        self.inner = inner
        self.deduplicates = inner.deduplicates

    def apply(self, request: EffectRequest) -> Receipt:
        receipt = self.inner.apply(request)
        if int(request.step_id.rpartition("-")[2]) % 2:
            assert isinstance(receipt.result, dict)
            return Receipt(result=result(int(receipt.result["line"])), evidence=receipt.evidence)  # type: ignore[arg-type]
        return receipt

    def observe(self, request: EffectRequest) -> Observation:
        return self.inner.observe(request)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("outbox")
    parser.add_argument("--task", default="blob-task")
    parser.add_argument("--sqlite", action="store_true")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--later", type=float, default=0.0)
    parser.add_argument("--compact-early", action="store_true")
    args = parser.parse_args()
    if args.compact_early:
        jsonfile.COMPACT_MIN_BYTES = 0
    store = SqliteStore(args.root, create=True) if args.sqlite else JsonFileStore(args.root, create=True, io=CrashPointIO())
    runner = Runner(
        RunContract(args.task, "a test task whose effects carry large payloads and results"),
        [Step(f"step-{i:03d}", "write", payload(i)) for i in range(args.steps)],
        store=store,
        adapters={"write": LargeResults(OutboxAdapter(args.outbox))},  # type: ignore[dict-item]
        clock=LaterClock(args.later),
    )
    print(json.dumps(runner.run().to_json()))


if __name__ == "__main__":
    main()
