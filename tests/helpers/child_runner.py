"""A runner in its own process, for tests that kill, stop or race real processes.

Usage: python child_runner.py ROOT OUTBOX [options]; prints the outcome as one JSON line. ROOT is a
JSON-file store directory, or with ``--sqlite`` a SQLite database file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src"))  # run by path: longrun from src
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests: for helpers

from longrun import JsonFileStore, Limits, SqliteStore, RetryPolicy, RunContract, Runner, Step  # noqa: E402
from longrun.adapters import EffectRequest, Observation, Receipt  # noqa: E402
from longrun.testing import OutboxAdapter  # noqa: E402

from helpers.clocks import LaterClock  # noqa: E402


class SlowAdapter:
    """Wraps an adapter: before applying ``step``, touches ``signal_path`` and sleeps ``seconds``, or
    less if ``release_path`` is given: until that file exists (the test says when to go on, however
    slowly the machine runs), ``seconds`` being then a liveness guard."""

    def __init__(self, inner: OutboxAdapter, step: str, seconds: float, signal_path: str, release_path: str = ""):
        self.inner = inner
        self.step = step
        self.seconds = seconds
        self.signal_path = signal_path
        self.release_path = release_path
        self.deduplicates = inner.deduplicates

    def apply(self, request: EffectRequest) -> Receipt:
        if request.step_id == self.step:
            with open(self.signal_path, "w") as handle:
                handle.write(str(os.getpid()))
            if not self.release_path:
                time.sleep(self.seconds)
            deadline = time.monotonic() + self.seconds
            while self.release_path and not os.path.exists(self.release_path) and time.monotonic() < deadline:
                time.sleep(0.01)
        return self.inner.apply(request)

    def observe(self, request: EffectRequest) -> Observation:
        return self.inner.observe(request)


def build(args: argparse.Namespace) -> Runner:
    contract = RunContract(args.task, "a test task that writes numbered lines to an outbox")
    steps = [Step(f"step-{i:03d}", "write", {"n": i}) for i in range(args.steps)]
    adapter: object = OutboxAdapter(
        args.outbox,
        fail_transient=args.fail_transient,
        kill_after_apply=set(args.kill_after),
        deduplicates=args.dedup,
        unobservable=set(args.unobservable),
    )
    if args.slow:
        step, seconds = args.slow.split(":")
        adapter = SlowAdapter(adapter, step, float(seconds), args.signal, args.release)  # type: ignore[arg-type]
    return Runner(
        contract,
        steps,
        store=SqliteStore(args.root, create=True) if args.sqlite else JsonFileStore(args.root, create=True),
        adapters={"write": adapter},  # type: ignore[dict-item]
        owner=args.owner,
        clock=LaterClock(args.later),
        limits=Limits(max_attempts=args.max_attempts, max_block_s=args.max_block),
        retry=RetryPolicy(base_delay_s=args.base_delay, max_delay_s=1.0, jitter=0.0),
        lease_ttl_s=args.ttl,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("outbox")
    parser.add_argument("--task", default="crash-task")
    parser.add_argument("--sqlite", action="store_true", help="ROOT is a SQLite database file")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--kill-after", action="append", default=[])
    parser.add_argument("--fail-transient", type=int, default=0)
    parser.add_argument("--dedup", action="store_true")
    parser.add_argument("--unobservable", action="append", default=[])
    parser.add_argument("--slow", default="")
    parser.add_argument("--signal", default="")
    parser.add_argument("--release", default="", help="with --slow: go on once this file exists")
    parser.add_argument("--owner", default=None)
    parser.add_argument("--ttl", type=float, default=30.0)
    parser.add_argument("--max-attempts", type=int, default=3)
    parser.add_argument("--max-block", type=float, default=0.0)
    parser.add_argument("--base-delay", type=float, default=0.0)
    parser.add_argument("--later", type=float, default=0.0, help="seconds to shift this child's clock forward")
    args = parser.parse_args()
    outcome = build(args).run()
    print(json.dumps(outcome.to_json()))


if __name__ == "__main__":
    main()
