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


    # -- answer and approve ------------------------------------------------------------------

    def chooser(self) -> Any:
        @self.durable()
        def chooser(run: longrun.Run) -> Any:
            colour = run.ask("colour", "which colour?", choices=["red", "blue"])
            run.effect("paint", "send", {"colour": colour}, approval=True)
            return colour

        self.assertEqual(chooser.run("c1").status, Status.AWAITING_INPUT)
        return chooser

    def approvals(self, task_id: str) -> list[Approval]:
        return [Approval.from_json(raw.body) for raw in self.store.read_approvals(task_id)]

    def test_a_second_answer_is_refused_naming_the_first_which_the_run_then_reads(self) -> None:
        chooser = self.chooser()
        code, out, err = run_cli("--json", "answer", self.spec, "c1", "colour", "blue")
        self.assertEqual(code, 0, err)
        first = json.loads(out)["approval"]["approval_id"]
        code, out, err = run_cli("answer", self.spec, "c1", "colour", "red")
        self.assertEqual((code, out), (2, ""))
        self.assertIn(f'already has an answer ("blue", by ', err)
        self.assertIn(f"approval {first}) waiting, not yet used: the first answer written is the one the run reads; nothing was written", err)
        self.assertEqual([approval.answer for approval in self.approvals("c1")], ["blue"], "nothing else was written")
        self.assertEqual(chooser.run("c1").status, Status.AWAITING_APPROVAL)
        self.assertEqual(self.store.load("c1").state.effects["colour"].result, "blue")
        # The first approval of the effect is written; a second is refused with a note that one waits.
        self.assertEqual(run_cli("approve", self.spec, "c1", "--yes")[0], 0)
        code, _, err = run_cli("approve", self.spec, "c1", "--yes")
        self.assertEqual(code, 2)
        self.assertIn("step 'paint' of task 'c1' already has an approval (approval ", err)
        self.assertIn("waiting, not yet used: one approval authorizes the effect, once; nothing was written", err)
        self.assertEqual(len(self.approvals("c1")), 2, "the answer and one approval")
        self.assertEqual(chooser.run("c1").result, "blue")
        self.assertEqual(self.outbox.calls, {"c1/paint": 1})

    def test_an_answer_outside_the_choices_is_refused_when_written_listing_them(self) -> None:
        self.chooser()
        code, out, err = run_cli("answer", self.spec, "c1", "colour", "green")
        self.assertEqual((code, out), (2, ""))
        self.assertIn('"green" is not one of the choices of step \'colour\': ["red", "blue"]; nothing was written', err)
        self.assertEqual(self.approvals("c1"), [])

    def test_of_two_answers_that_got_in_anyway_the_run_reads_the_first_granted_on_every_run(self) -> None:
        chooser = self.chooser()
        request = self.store.load("c1").state.approval_requests["colour"]
        now = self.clock.now()
        # Two writers raced past the check. The ids sort the other way round, as random ids may.
        for approval_id, granted_at, answer in (("zz-first", now, "blue"), ("aa-second", now + 1, "red")):
            self.store.write_approval(
                Approval.for_request(request, approval_id=approval_id, approver="ops", granted_at=granted_at, expires_at=now + 600, answer=answer)
            )
        outcome = chooser.run("c1")
        self.assertEqual(outcome.status, Status.AWAITING_APPROVAL)
        self.assertEqual(self.store.load("c1").state.effects["colour"].result, "blue")
        self.assertIn("approval aa-second also matches; zz-first, granted first, is used", "\n".join(item.detail for item in outcome.inferences + outcome.unknowns))


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


    def test_a_second_answer_through_a_control_root_is_refused_there(self) -> None:
        control = self.path("control")
        os.makedirs(control)
        self.chooser()
        self.assertEqual(run_cli("answer", self.spec, "c1", "colour", "blue", "--control-root", control)[0], 0)
        code, _, err = run_cli("answer", self.spec, "c1", "colour", "red", "--control-root", control)
        self.assertEqual(code, 2, err)
        self.assertIn('already has an answer ("blue"', err)
        self.assertEqual(len(FileControlSource(control).read_approvals("c1")), 1)


    def test_a_signed_answer_is_refused_after_a_signed_one_but_not_after_an_unsigned_one(self) -> None:
        key_file = self.path("ops.key")
        generate_key_file(key_file)
        self.chooser()
        self.assertEqual(run_cli("answer", self.spec, "c1", "colour", "red")[0], 0)  # unsigned: a signed source refuses it
        code, _, err = run_cli("answer", self.spec, "c1", "colour", "blue", "--sign-key", key_file)
        self.assertEqual(code, 0, err)
        code, _, err = run_cli("answer", self.spec, "c1", "colour", "red", "--sign-key", key_file)
        self.assertEqual(code, 2, err)
        self.assertIn('already has an answer ("blue"', err)
        self.assertEqual(sorted(str(approval.answer) for approval in self.approvals("c1")), ["blue", "red"])


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
        url = schema.spec
        return store, url


del ControlCases  # only its subclasses run

if __name__ == "__main__":
    unittest.main()
