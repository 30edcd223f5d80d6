"""Bulk and retention commands, run in this process on every store: ``cancel`` and ``approve`` with a
filter list what they would do and write nothing without ``--yes`` (``approve`` shows every payload
digest it binds), then act with it; ``delete`` and ``prune`` remove ended tasks whole and refuse a
task not ended, a live lease, or a child whose parent is live; bad filters are usage errors."""

from __future__ import annotations

import contextlib
import io
import json
import time
import unittest
from typing import Any

from helpers import pg_support, support
import longrun
from longrun import JsonFileStore, SqliteStore, Store
from longrun.cli import main
from longrun.errors import UnknownTaskError
from longrun.stores import PostgresStore
from longrun.stores.queue import open_queue
from longrun.testing import FakeClock, OutboxAdapter

DAY_S = 86400.0


def run_cli(*args: str) -> tuple[int, str, str]:
    """``longrun ARGS`` in this process: (exit code, stdout, stderr)."""
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


class FleetCommandCases(support.TempDirTest):
    def make_store(self) -> tuple[Store, str]:
        raise NotImplementedError

    def setUp(self) -> None:
        super().setUp()
        self.store, self.spec = self.make_store()
        self.outbox = OutboxAdapter(self.path("outbox.jsonl"))

    def functions(self, clock: Any = None) -> tuple[Any, Any, Any]:
        """``pay`` waits for an approval; ``quick`` ends at once; ``parent`` runs ``quick`` as its child, then waits for an approval."""
        options: dict[str, Any] = {"store": self.store, "adapters": {"send": self.outbox}, "allowed_actions": ("send",)}
        if clock is not None:
            options["clock"] = clock

        @longrun.durable(**options)
        def pay(run: longrun.Run, amount: int) -> int:
            run.effect("pay", "send", {"amount": amount}, approval=True)
            return amount

        @longrun.durable(**options)
        def quick(run: longrun.Run) -> str:
            return "ok"

        @longrun.durable(**options)
        def parent(run: longrun.Run) -> str:
            run.child("parent-kid", quick)
            run.effect("after", "send", {"x": 1}, approval=True)
            return "done"

        return pay, quick, parent

    def status(self, task_id: str) -> str:
        state = self.store.load(task_id).state
        return "new" if state is None else state.status.value

    # -- bulk -----------------------------------------------------------------------------------

    def test_bulk_approve_lists_every_digest_without_yes_and_approves_each_with_it(self) -> None:
        pay, quick, _ = self.functions()
        for i in range(3):
            pay.run(f"pay-{i}", i)
        quick.run("q")
        digests = {f"pay-{i}": self.store.load(f"pay-{i}").state.approval_requests["pay"].payload_digest for i in range(3)}
        code, out, err = run_cli("approve", self.spec, "--function", pay.name, "--match", "pay-[01]")
        self.assertEqual((code, err), (0, ""))
        self.assertIn("2 requests in 2 tasks match", out)
        for task_id in ("pay-0", "pay-1"):
            self.assertIn(digests[task_id], out)
            self.assertEqual(self.store.read_approvals(task_id), (), "nothing is written without --yes")
        self.assertNotIn(digests["pay-2"], out)
        self.assertIn("--yes", out)
        code, out, err = run_cli("approve", self.spec, "--function", pay.name, "--match", "pay-[01]", "--yes", "--approver", "oncall")
        self.assertEqual((code, err), (0, ""))
        for task_id in ("pay-0", "pay-1"):
            self.assertIn(digests[task_id], out)
            (record,) = self.store.read_approvals(task_id)
            self.assertEqual((record.body["payload_digest"], record.body["approver"]), (digests[task_id], "oncall"))
        self.assertEqual(self.store.read_approvals("pay-2"), ())
        self.assertEqual(pay.run("pay-0", 0).status.value, "done")  # the approval binds what the run applies
        code, out, _ = run_cli("approve", self.spec, "--match", "pay-1", "--yes", "--json")  # one already waits: refused, reported
        report = json.loads(out)
        self.assertEqual((code, len(report["failed"]), report["done"]), (1, 1, []))
        self.assertIn("already", report["failed"][0]["error"])

    def test_bulk_cancel_lists_without_yes_cancels_with_it_and_leaves_ended_tasks_alone(self) -> None:
        pay, quick, _ = self.functions()
        for i in range(3):
            pay.run(f"pay-{i}", i)
        quick.run("q")
        code, out, err = run_cli("cancel", self.spec, "--status", "awaiting-approval,done")
        self.assertEqual((code, err), (0, ""))
        self.assertIn("3 tasks match", out)
        self.assertIn("left alone: q: already ended done", out)
        for i in range(3):
            self.assertIn(f"cancel pay-{i}", out)
            self.assertIsNone(self.store.read_cancellation(f"pay-{i}"), "nothing is written without --yes")
        code, out, err = run_cli("cancel", self.spec, "--status", "awaiting-approval", "--yes", "--json")
        self.assertEqual((code, err), (0, ""))
        report = json.loads(out)
        self.assertEqual(sorted(item["task_id"] for item in report["done"]), ["pay-0", "pay-1", "pay-2"])
        for i in range(3):
            self.assertIsNotNone(self.store.read_cancellation(f"pay-{i}"))
            self.assertEqual(pay.run(f"pay-{i}", i).status.value, "cancelled")
        self.assertIsNone(self.store.read_cancellation("q"))
        self.assertEqual(sum(self.outbox.counts().values()), 0)

    def test_bulk_reopen_lists_without_yes_then_reopens_ended_tasks_which_finish(self) -> None:
        pay, quick, _ = self.functions()
        for i in range(3):
            pay.run(f"pay-{i}", i)
        quick.run("q")
        code, _, err = run_cli("cancel", self.spec, "--status", "awaiting-approval", "--yes")
        self.assertEqual((code, err), (0, ""))
        for i in range(3):
            self.assertEqual(pay.run(f"pay-{i}", i).status.value, "cancelled")
        queue = open_queue(self.store)
        self.addCleanup(queue.close)
        for i in range(3):
            queue.enqueue(f"pay-{i}", pay.name)
        for claim in queue.claim("a-worker", [pay.name], 3, 60.0):  # as a worker leaves a cancelled task: parked
            queue.finish(claim, "cancelled")
        self.assertEqual([entry.due_in_s for entry in queue.entries([f"pay-{i}" for i in range(3)])], [None] * 3)
        code, out, err = run_cli("resume", self.spec, "--reopen", "--status", "cancelled,done", "--reason", "card service fixed")
        self.assertEqual((code, err), (0, ""))
        self.assertIn("3 tasks match", out)
        self.assertIn("left alone: q: done: only a task that ended unfinished is reopened", out)
        self.assertEqual([self.status(f"pay-{i}") for i in range(3)], ["cancelled"] * 3, "nothing is written without --yes")
        self.assertEqual(pay.run("pay-0", 0).status.value, "cancelled")
        code, out, err = run_cli(
            "resume", self.spec, "--reopen", "--match", "pay-*", "--reason", "card service fixed", "--by", "oncall", "--yes", "--json"
        )
        self.assertEqual((code, err), (0, ""))
        report = json.loads(out)
        self.assertEqual(sorted(item["task_id"] for item in report["done"]), ["pay-0", "pay-1", "pay-2"])
        self.assertTrue(all(item["queued"] for item in report["done"]), "each is made due for a worker")
        due = {entry.task_id: entry for entry in queue.entries([f"pay-{i}" for i in range(3)])}
        self.assertEqual(len(due), 3)
        for i in range(3):
            due_in_s = due[f"pay-{i}"].due_in_s
            self.assertTrue(due_in_s is not None and due_in_s <= 0, "due now")
            outcome = pay.run(f"pay-{i}", i)
            self.assertEqual(outcome.status.value, "awaiting-approval", "reopened: the run goes on to its approval")
        self.assertEqual(sum(self.outbox.counts().values()), 0)
        code, _, err = run_cli("resume", self.spec, "--match", "pay-*", "--yes")
        self.assertEqual(code, 2)
        self.assertIn("go with --reopen", err)
        code, _, err = run_cli("resume", self.spec, "pay-0", "--reopen", "--match", "pay-*", "--reason", "x")
        self.assertEqual(code, 2)
        self.assertIn("not both", err)

    def test_bad_filters_are_usage_errors_and_nothing_is_written(self) -> None:
        pay, _, _ = self.functions()
        pay.run("pay-0", 0)
        for args, message in (
            (("cancel", self.spec, "--since", "banana"), "--since 'banana'"),
            (("cancel", self.spec, "--until", "yesterday-ish"), "--until"),
            (("approve", self.spec, "--status", "sleepy"), "'sleepy' is not a status"),
            (("cancel", self.spec), "give TASK, or choose tasks"),
            (("cancel", self.spec, "pay-0", "--status", "running"), "not both"),
            (("cancel", self.spec, "--since", "1h", "--until", "2h"), "--since is later than --until"),
            (("prune", self.spec, "--before", "banana"), "--before 'banana'"),
            (("prune", self.spec, "--before", "1d", "--status", "running"), "'running' is not a status"),
            (("prune", self.spec), "--before"),
        ):
            with self.subTest(args=args):
                code, out, err = run_cli(*args)
                self.assertEqual(code, 2, err)
                self.assertIn(message, err)
        self.assertIsNone(self.store.read_cancellation("pay-0"))

    # -- retention ------------------------------------------------------------------------------

    def test_prune_deletes_old_ended_tasks_only_never_a_live_one_nor_a_child_of_a_live_parent(self) -> None:
        old = FakeClock(time.time() - 40 * DAY_S)
        pay, quick, parent = self.functions(old)
        quick.run("old-done")
        quick.run("old-leased")
        pay.run("old-waiting", 1)
        parent.run("parent")  # its child ended long ago; the parent waits for an approval
        self.assertEqual((self.status("parent-kid"), self.status("parent")), ("done", "awaiting-approval"))
        _, recent_quick, _ = self.functions()
        recent_quick.run("recent-done")
        lease = self.store.acquire_lease("old-leased", "someone-else", 600.0, time.time())  # ended, but someone holds it
        code, out, err = run_cli("prune", self.spec, "--before", "30d", "--dry-run")
        self.assertEqual((code, err), (0, ""))
        self.assertIn("would delete old-done", out)
        self.assertIn("would delete 2 tasks", out)  # old-done; old-leased is only found busy when deleting
        self.assertIn("left alone: parent-kid: a child of parent (awaiting-approval)", out)
        self.assertEqual(len(self.store.list_tasks()), 6, "a dry run deletes nothing")
        code, out, err = run_cli("prune", self.spec, "--before", "30d")
        self.assertEqual((code, err), (0, ""))
        self.assertIn("deleted old-done (done at revision", out)
        self.assertIn("removed", out)
        self.assertIn("left alone: old-leased:", out)
        self.assertIn("deleted 1 task", out)
        self.assertCountEqual(self.store.list_tasks(), ["old-leased", "old-waiting", "parent", "parent-kid", "recent-done"])
        with self.assertRaises(UnknownTaskError):
            self.store.load("old-done")
        self.store.release_lease(lease, time.time())
        code, out, _ = run_cli("prune", self.spec, "--before", "30d", "--status", "done", "--json")
        report = json.loads(out)
        self.assertEqual([item["task_id"] for item in report["deleted"]], ["old-leased"])
        self.assertEqual(self.status("old-waiting"), "awaiting-approval")

    def test_delete_removes_an_ended_task_and_refuses_a_live_one_with_a_typed_error(self) -> None:
        pay, quick, parent = self.functions()
        quick.run("q")
        pay.run("waiting", 3)
        parent.run("parent")
        code, out, err = run_cli("delete", self.spec, "waiting")
        self.assertEqual((code, out), (1, ""))
        self.assertIn("is awaiting-approval, not ended", err)
        self.assertEqual(self.status("waiting"), "awaiting-approval")
        code, out, err = run_cli("delete", self.spec, "parent-kid")
        self.assertEqual(code, 1)
        self.assertIn("child of parent (awaiting-approval)", err)
        queue = open_queue(self.store)
        self.addCleanup(queue.close)
        queue.enqueue("q", quick.name)  # its row in the fleet's queue, if it had none yet
        self.assertEqual(len(queue.entries(["q"])), 1)
        code, out, err = run_cli("delete", self.spec, "q")
        self.assertEqual((code, err), (0, ""))
        self.assertIn("deleted q (done at revision", out)
        self.assertNotIn("q", self.store.list_tasks())
        self.assertEqual(queue.entries(["q"]), [], "its queue row went with it")
        code, out, err = run_cli("delete", self.spec, "q")
        self.assertEqual(code, 2)
        self.assertIn("no task 'q'", err)


class JsonFileStoreTests(FleetCommandCases):
    def make_store(self) -> tuple[Store, str]:
        root = self.path("store")
        return JsonFileStore(root, create=True), root


class SqliteStoreTests(FleetCommandCases):
    def make_store(self) -> tuple[Store, str]:
        path = self.path("tasks.sqlite")
        store = SqliteStore(path, create=True)
        self.addCleanup(store.close)
        return store, f"sqlite:{path}"


class PostgresStoreTests(FleetCommandCases):
    def make_store(self) -> tuple[Store, str]:
        pg_support.check("psycopg")  # the URL carries the schema as a libpq option, which pg8000 cannot take
        schema = pg_support.Schema("psycopg", prefix="lr_fleet")
        self.addCleanup(schema.drop)
        store = PostgresStore(schema.factory())
        self.addCleanup(store.close)
        url = schema.spec
        return store, url


del FleetCommandCases  # only its subclasses run

if __name__ == "__main__":
    unittest.main()
