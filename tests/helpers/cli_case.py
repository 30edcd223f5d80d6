"""The test cases of the CLI tests: a store directory, an outbox and a fake clock, runners over
them, and ``cli``, which runs ``python -m longrun`` in a child process as a user would (forked from
a server that imported longrun once: ``cli_process``)."""

from __future__ import annotations

import json
import os
from unittest import mock

from longrun import JsonFileStore, RunContract, Runner, Status, Step
from longrun.testing import FakeClock, OutboxAdapter

from .cli_process import run_longrun
from .support import TempDirTest


def cli(*args: str, input: str | None = None):
    """``python -m longrun ARGS`` in a child process, its output captured as text."""
    return run_longrun(args, input=input)


class CliCase(TempDirTest):
    """A store directory, an outbox and a fake clock in the test's own directory, and runners over them."""

    def setUp(self) -> None:
        super().setUp()
        self.store_dir = self.path("store")
        self.outbox = self.path("outbox.jsonl")
        self.clock = FakeClock()

    def runner(self, task_id: str, steps: list[Step], adapter: OutboxAdapter | None = None, store=None, **options) -> Runner:
        return Runner(
            RunContract(task_id, goal="test the command line"),
            steps,
            store=store if store is not None else JsonFileStore(self.store_dir, create=True),
            adapters={"send": adapter if adapter is not None else OutboxAdapter(self.outbox)},
            clock=self.clock,
            **options,
        )

    def finished_task(self, task_id: str = "finished", store=None) -> None:
        steps = [Step("one", "send", {"n": 1}), Step("two", "send", {"n": 2})]
        self.assertIs(self.runner(task_id, steps, store=store).run().status, Status.DONE)

    def approval_steps(self) -> list[Step]:
        return [
            Step("draft", "send", {"text": "hello"}),
            Step("publish", "send", {"channel": "everyone"}, approval=True),
        ]

    def awaiting_task(self, task_id: str = "gated", store=None) -> None:
        self.assertIs(self.runner(task_id, self.approval_steps(), store=store).run().status, Status.AWAITING_APPROVAL)

    def assert_exit(self, result, code: int) -> None:
        self.assertEqual(result.returncode, code, f"stdout={result.stdout!r} stderr={result.stderr!r}")

    def assert_fails(self, result, code: int, *fragments: str) -> None:
        self.assert_exit(result, code)
        self.assertTrue(result.stderr.strip(), "an error must say why on stderr")
        for fragment in fragments:
            self.assertIn(fragment, result.stderr)

    def task_file(self, task_id: str, name: str) -> str:
        return os.path.join(self.store_dir, task_id, name)


class OpsCase(CliCase):
    """A ``CliCase`` whose ``longrun resume`` targets (``cli_tasks``) keep their store and outbox in the test's directory."""

    def setUp(self) -> None:
        super().setUp()
        environment = mock.patch.dict(os.environ, {"LONGRUN_CLI_ROOT": self.tmp})  # read by tests/helpers/cli_tasks.py
        environment.start()
        self.addCleanup(environment.stop)
        os.environ.pop("LONGRUN_CLI_STORE", None)

    def unsafe_task(self, task_id: str = "blind") -> None:
        """An effect whose apply raised after sending and whose target cannot be observed."""
        blind = OutboxAdapter(self.outbox, raise_after_apply={"one"}, unobservable={"one"})
        with self.assertLogs("longrun", "WARNING"):
            outcome = self.runner(task_id, [Step("one", "send", {"n": 1})], blind).run()
        self.assertIs(outcome.status, Status.UNSAFE_TO_CONTINUE)

    def assert_fails(self, result, code: int, *fragments: str) -> None:
        """As ``CliCase.assert_fails``, and the error is a message, not a traceback."""
        super().assert_fails(result, code, *fragments)
        self.assertNotIn("Traceback", result.stderr)

    def json_of(self, result, code: int = 0):
        self.assert_exit(result, code)
        return json.loads(result.stdout)

    def corrupt_state(self, task_id: str) -> list[str]:
        """Damage every file of the task but its lease, lock and control records (whatever the format)."""
        damaged = []
        for directory, subdirectories, names in os.walk(os.path.join(self.store_dir, task_id)):
            subdirectories[:] = [name for name in subdirectories if name not in ("control", "quarantine")]
            for name in names:
                if name.startswith(("lease", "lock")):
                    continue
                path = os.path.join(directory, name)
                with open(path, "r+b") as handle:
                    handle.write(b"\x00{garbage\x00")
                damaged.append(path)
        self.assertTrue(damaged, "the task has no state files to damage")
        return damaged

    def listing(self, task_id: str) -> list[str]:
        top = os.path.join(self.store_dir, task_id)
        return sorted(os.path.relpath(os.path.join(d, n), top) for d, _, names in os.walk(top) for n in names)
