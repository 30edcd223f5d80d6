"""A basic resumable task: render three report files, crash half way, run again, nothing repeats.

Run it from a checkout (no install needed):

    python examples/resumable_task.py            # crashes itself after the 2nd file, then resumes
    python examples/resumable_task.py --dir D    # keep the store and output in D

It shows how to write an adapter for your own target. ``FileAdapter`` writes one file per effect
(atomically) and observes by reading the file back, checking the payload digest it recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

try:
    import longrun
except ImportError:  # running from a checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
    import longrun

from longrun import EffectRequest, JsonFileStore, Observation, Receipt, RunContract, Runner, Step


class FileAdapter:
    """Writes ``<dir>/<step id>.json`` for each effect. Not deduplicating: observe decides."""

    deduplicates = False

    def __init__(self, directory: str, crash_after: str | None = None):
        self.directory = directory
        self.crash_after = crash_after

    def _path(self, request: EffectRequest) -> str:
        return os.path.join(self.directory, f"{request.step_id}.json")

    def apply(self, request: EffectRequest) -> Receipt:
        body = {"key": request.key, "payload_digest": request.payload_digest, "payload": request.payload}
        temp = self._path(request) + ".tmp"
        with open(temp, "w") as handle:
            json.dump(body, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, self._path(request))
        if request.step_id == self.crash_after:
            print(f"  [worker] wrote {request.step_id}.json, now dying before the runner records it")
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return Receipt(result={"file": self._path(request)}, evidence=f"wrote {self._path(request)}")

    def observe(self, request: EffectRequest) -> Observation:
        try:
            with open(self._path(request)) as handle:
                body = json.load(handle)
        except FileNotFoundError:
            return Observation.absent(f"{self._path(request)} does not exist")
        except (OSError, ValueError) as exc:
            return Observation.unknown(f"cannot read {self._path(request)}: {exc}")
        if body.get("payload_digest") != request.payload_digest:
            return Observation.unknown(f"{self._path(request)} holds another payload")
        return Observation.applied(f"{self._path(request)} holds {request.key}", {"file": self._path(request)})


LEASE_TTL_S = 1.0


def build(directory: str, crash_after: str | None) -> Runner:
    out = os.path.join(directory, "reports")
    os.makedirs(out, exist_ok=True)
    contract = RunContract(
        task_id="quarterly-reports",
        goal="render one summary file per region",
        non_goals=("emailing the reports",),
        allowed_actions=("render",),
    )
    steps = [
        Step("emea", "render", {"region": "EMEA", "quarter": "2026-Q4"}),
        Step("apac", "render", {"region": "APAC", "quarter": "2026-Q4"}),
        Step("index", "render", lambda results: {"files": sorted(r["file"] for r in results.values())}),
    ]
    store = JsonFileStore(os.path.join(directory, "store"), create=True)
    # A short lease so that a crashed run can be taken over quickly; a live runner renews it.
    return Runner(contract, steps, store=store, adapters={"render": FileAdapter(out, crash_after)}, lease_ttl_s=LEASE_TTL_S)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dir", help="where to keep the store and the reports (default: a temporary directory)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--crash-after", help=argparse.SUPPRESS)
    args = parser.parse_args()
    directory = args.dir or tempfile.mkdtemp(prefix="longrun-example-")
    if args.worker:
        outcome = build(directory, args.crash_after).run()
        print(f"  [worker] {outcome.status.value}")
        return 0
    print(f"1. first run in a child process, which crashes after writing apac.json ({directory})")
    child = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--worker", "--dir", directory, "--crash-after", "apac"],
        env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(longrun.__file__))},
    )
    print(f"   child exit status {child.returncode} (SIGKILL is {-signal.SIGKILL})")
    print(f"2. wait {LEASE_TTL_S:g} s for the dead worker's lease to expire, then run again:")
    print("   the runner observes apac.json, verifies it without rewriting it, and goes on")
    time.sleep(LEASE_TTL_S)
    outcome = build(directory, None).run()
    print(f"   status: {outcome.status.value}; next action: {outcome.next_action}")
    for item in outcome.inferences:
        print(f"   inferred: {item.detail}")
    print("3. run once more: a finished task applies nothing")
    print(f"   status: {build(directory, None).run().status.value}")
    files = sorted(os.listdir(os.path.join(directory, "reports")))
    print(f"   files: {files}")
    return 0 if outcome.status.value == "done" and files == ["apac.json", "emea.json", "index.json"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
