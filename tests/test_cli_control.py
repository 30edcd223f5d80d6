"""The operator's writing commands on durable tasks, run in this process on every store: ``cancel``
cancels the children a parent started (not the detached ones) and says how many, through the
writer it used for the parent; ``answer`` and ``approve`` refuse, at write time, a second record for
a request that already has one waiting and an answer outside the question's choices."""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
import unittest
from typing import Any

from helpers import pg_support, support
import longrun
from longrun import Approval, Cancellation, JsonFileStore, SqliteStore, Status, Store
from longrun.authority import FileControlSource
from longrun.cli import main
from longrun.signing import generate_key_file, verify_cancellation
from longrun.stores import PostgresStore
from longrun.testing import FakeClock, OutboxAdapter


def run_cli(*args: str) -> tuple[int, str, str]:
    """``longrun ARGS`` in this process: (exit code, stdout, stderr)."""
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


class ControlCases(support.TempDirTest):
    """The same cases on every store; a subclass makes the store and names its spec for the CLI."""

    def make_store(self) -> tuple[Store, str]:
        raise NotImplementedError

    def setUp(self) -> None:
        super().setUp()
        self.store, self.spec = self.make_store()
        self.clock = FakeClock(time.time())
        self.outbox = OutboxAdapter(self.path("outbox.jsonl"))

    def durable(self) -> Any:
        return longrun.durable(store=self.store, adapters={"send": self.outbox}, allowed_actions=("send",), clock=self.clock)

    def family(self) -> Any:
        """``top`` starts ``kid`` (which starts ``grandkid``, which asks a question) and, if told to,
        a detached ``free`` first, which asks too."""

        @self.durable()
        def asker(run: longrun.Run) -> Any:
            answer = run.ask("who", "to whom?", choices=["ann", "bob"])
            run.effect("send", "send", {"to": answer})
            return answer

        @self.durable()
        def middle(run: longrun.Run) -> Any:
            return run.child("grandkid", asker)

        @self.durable()
        def top(run: longrun.Run, detached: bool) -> Any:
            if detached:
                return run.child("free", asker, detached=True)
            return run.child("kid", middle)

        return top, asker

    def status(self, task_id: str) -> Status:
        state = self.store.load(task_id).state
        assert state is not None
        return state.status

    # -- cancel ------------------------------------------------------------------------------

    def test_cancel_cancels_the_unfinished_children_and_theirs_and_says_how_many(self) -> None:
        top, asker = self.family()
        self.assertEqual(top.run("top", False).status, Status.WAITING_ON_CHILD)
        self.assertEqual(self.status("grandkid"), Status.AWAITING_INPUT)
        code, out, err = run_cli("cancel", self.spec, "top", "--reason", "not wanted", "--by", "ops")
        self.assertEqual(code, 0, err)
        self.assertIn("children  2 cancelled", out)
        for task_id, parent in (("kid", "top"), ("grandkid", "kid")):
            raw = self.store.read_cancellation(task_id)
            assert raw is not None
            record = Cancellation.from_json(raw.body)
            self.assertEqual((record.requested_by, record.reason), ("ops", f"its parent task {parent!r} was cancelled: not wanted"))
        self.assertEqual(top.run("top", False).status, Status.CANCELLED)
        self.assertEqual(asker.run("grandkid").status, Status.CANCELLED, "the grandchild's own run reads its record")
        self.assertEqual(self.outbox.calls, {}, "nothing was applied")
        again = json.loads(run_cli("--json", "cancel", self.spec, "top", "--reason", "again")[1])
        self.assertEqual(again["children_cancelled"], [], "cancelled already: none again")

    def test_cancel_leaves_a_detached_child_running(self) -> None:
        top, asker = self.family()
        self.assertEqual(top.run("top", True).status, Status.WAITING_ON_CHILD)
        code, out, err = run_cli("--json", "cancel", self.spec, "top", "--reason", "not wanted")
        self.assertEqual(code, 0, err)
        self.assertEqual(json.loads(out)["children_cancelled"], [])
        self.assertIsNone(self.store.read_cancellation("free"))
        self.assertEqual(run_cli("answer", self.spec, "free", "who", "ann")[0], 0)
        self.assertEqual(asker.run("free").status, Status.DONE)
        self.assertEqual(self.outbox.calls, {"free/send": 1})


class JsonStoreTests(ControlCases):
    def make_store(self) -> tuple[Store, str]:
        root = self.path("store")
        return JsonFileStore(root, create=True), root

    def test_cancel_through_a_control_root_signs_and_writes_the_childrens_records_there_too(self) -> None:
        key_file = self.path("ops.key")
        key = generate_key_file(key_file)
        control = self.path("control")
        os.makedirs(control)
        top, _ = self.family()
        self.assertEqual(top.run("top", False).status, Status.WAITING_ON_CHILD)
        code, out, err = run_cli("cancel", self.spec, "top", "--control-root", control, "--sign-key", key_file)
        self.assertEqual(code, 0, err)
        self.assertIn("children  2 cancelled", out)
        source = FileControlSource(control)
        for task_id in ("top", "kid", "grandkid"):
            raw = source.read_cancellation(task_id)
            assert raw is not None, task_id
            self.assertIsNone(verify_cancellation(Cancellation.from_json(raw.body), key), f"{task_id}: signed with the key")
            self.assertIsNone(self.store.read_cancellation(task_id), "written to the control root, not the store")


class SqliteStoreTests(ControlCases):
    def make_store(self) -> tuple[Store, str]:
        path = self.path("tasks.sqlite")
        store = SqliteStore(path, create=True)
        self.addCleanup(store.close)
        return store, f"sqlite:{path}"


class PostgresStoreTests(ControlCases):
    def make_store(self) -> tuple[Store, str]:
        pg_support.check("psycopg")  # the URL carries the schema as a libpq option, which pg8000 cannot take
        schema = pg_support.Schema("psycopg", prefix="lr_control")
        self.addCleanup(schema.drop)
        store = PostgresStore(schema.factory())
        self.addCleanup(store.close)
        url = schema.url + ("&" if "?" in schema.url else "?") + f"options=-csearch_path%3D{schema.name}"
        return store, url


del ControlCases  # only its subclasses run

if __name__ == "__main__":
    unittest.main()
