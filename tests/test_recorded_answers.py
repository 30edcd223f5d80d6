"""A recorded answer stays recorded: damage that would lose a durable function's call, answer, timer
or link stops ``state-unrecoverable``; it never lets a finished task run again and change its answer.

A durable task records a model's answer of 64 KiB or more (kept as a blob), finishes, and then the
blob is damaged (a bit flipped, or deleted). Every later ``run()`` must stop ``state-unrecoverable``
without calling the model again, ``longrun verify`` must say the same, and nothing may be
committed. On the JSON-file store the damaged blob is moved to quarantine and named in the
evidence, a later write of the same content makes a fresh file, a declared plan (whose records are
all effects, observed again) is still rebuilt, and a rebuild counts only the revisions a journal can
hold, not its zero padding. The cases that depend on the store run on every store (PostgreSQL when
``LONGRUN_TEST_POSTGRES_DSN`` is set).
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import time
import unittest
from typing import Any

from helpers import pg_support
from helpers import support
import longrun
from longrun import Approval, JsonFileStore, PostgresStore, RunContract, Runner, SqliteStore, Status, Step, Store
from longrun.canonical import canonical_bytes
from longrun.cli._common import ExitCode
from longrun.cli._verify import verify
from longrun.errors import StateUnrecoverableError
from longrun.functions._lineage import CALL_ACTION
from longrun.protocols import LoadResult
from longrun.stores import _journal
from longrun.stores.base import BaseStore, Witness
from longrun.testing import FakeClock, OutboxAdapter
from longrun.testing.store_contract import sample_state

PADDING = "x" * (70 * 1024)
"""Enough to make the answer a blob (64 KiB or more, ``stores.blobs.BLOB_MIN_BYTES``)."""


class Model:
    """A model whose answer changes on every call: a call made again shows as a changed answer."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> dict[str, str]:
        self.calls += 1
        return {"recipient": f"recipient-{self.calls}", "padding": PADDING}


class RecordedAnswerCases(support.TempDirTest):
    """The durable task of the module docstring, its blob damaged, on one store."""

    def make_store(self) -> Store:
        raise NotImplementedError

    def damage_blob(self, task_id: str, how: str) -> None:
        """Flip a bit in (``how="flip"``) or delete (``"delete"``) the task's only blob."""
        raise NotImplementedError

    def setUp(self) -> None:
        super().setUp()
        # The damage is on purpose; a database store reports the rows it moved aside.
        support.ExpectedWarnings(self, r"moved damaged rows to the quarantine", at_least_one=False).start()
        self.clock = FakeClock()
        self.store = self.make_store()
        self.outbox = OutboxAdapter(self.path("outbox.jsonl"))
        self.model = Model()
        model = self.model

        @longrun.durable(store=self.store, adapters={"mail.send": self.outbox}, allowed_actions=("mail.send",), clock=self.clock)
        def mail(run: longrun.Run) -> str:
            answer = run.call("model", model)
            run.effect("send", "mail.send", {"to": answer["recipient"]})
            return str(answer["recipient"])

        self.mail = mail

    def finished(self, task_id: str) -> int:
        """Run the task to done; the revision it ended at."""
        outcome = self.mail.run(task_id)
        self.assertEqual((outcome.status, outcome.result), (Status.DONE, "recipient-1"))
        lease = self.store.read_lease(task_id)
        assert lease is not None
        return lease.committed_revision

    def test_a_damaged_blob_of_a_recorded_call_stops_and_the_answer_never_changes(self) -> None:
        for how in ("flip", "delete"):
            with self.subTest(how=how):
                task_id = f"mail-{how}"
                self.model.calls = 0
                committed = self.finished(task_id)
                self.damage_blob(task_id, how)
                for _ in range(3):
                    outcome = self.mail.run(task_id)
                    self.assertEqual(outcome.status, Status.STATE_UNRECOVERABLE, outcome.next_action)
                    self.assertIsNone(outcome.result)
                    self.assertIn("do not restart this task from scratch", outcome.next_action)
                self.assertEqual(self.model.calls, 1, "the recorded call was made again")
                sent = [line["payload"] for line in longrun.testing.read_outbox(self.outbox.path) if line["task_id"] == task_id]
                self.assertEqual(sent, [{"to": "recipient-1"}])
                lease = self.store.read_lease(task_id)
                assert lease is not None
                self.assertEqual(lease.committed_revision, committed, "a run that cannot proceed committed revisions")
                report, code = verify(self.store, task_id, self.clock.now())
                self.assertEqual(code, ExitCode.STORAGE, report)
                self.assertIn("cannot be recovered by the runner", str(report))


class JsonFileTests(RecordedAnswerCases):
    def make_store(self) -> Store:
        return JsonFileStore(self.path("store"), create=True)

    def blob_dir(self, task_id: str) -> str:
        return self.path("store", task_id, "blobs")

    def damage_blob(self, task_id: str, how: str) -> None:
        [name] = os.listdir(self.blob_dir(task_id))
        path = os.path.join(self.blob_dir(task_id), name)
        if how == "delete":
            os.unlink(path)
            return
        with open(path, "r+b") as handle:
            handle.seek(100)
            byte = handle.read(1)[0]
            handle.seek(100)
            handle.write(bytes([byte ^ 1]))

    def test_a_damaged_blob_is_quarantined_and_named_in_the_evidence(self) -> None:
        self.finished("mail")
        [name] = os.listdir(self.blob_dir("mail"))
        self.damage_blob("mail", "flip")
        with self.assertRaisesRegex(StateUnrecoverableError, "revision 4 was committed"):
            JsonFileStore(self.path("store")).load("mail")  # read-only: names the damage, moves nothing
        self.assertEqual(os.listdir(self.blob_dir("mail")), [name])
        outcome = self.mail.run("mail")
        self.assertEqual(outcome.status, Status.STATE_UNRECOVERABLE)
        self.assertEqual(os.listdir(self.blob_dir("mail")), [])
        [moved] = [entry for entry in os.listdir(self.path("store", "mail", "quarantine")) if entry.startswith("blob.")]
        self.assertTrue(moved.startswith(f"blob.{name}."), moved)
        details = "\n".join(item.detail for item in outcome.observations)
        self.assertIn(f"quarantine/{moved}", details)
        self.assertIn("a call's answer", details)
        # The bytes are kept: put back as they were recorded, the task loads and its answer stands.
        with open(self.path("store", "mail", "quarantine", moved), "rb") as handle:
            damaged = bytearray(handle.read())
        damaged[100] ^= 1
        self.assertEqual(hashlib.sha256(damaged).hexdigest(), name)
        with open(os.path.join(self.blob_dir("mail"), name), "wb") as handle:
            handle.write(damaged)
        outcome = self.mail.run("mail")
        self.assertEqual((outcome.status, outcome.result, self.model.calls), (Status.DONE, "recipient-1", 1))

    def test_a_lost_answer_in_a_damaged_journal_stops_the_task(self) -> None:
        """Not only calls: a person's answer (``run.ask``) is lost with the journal line that holds it."""

        @longrun.durable(store=self.store, adapters={"mail.send": self.outbox}, allowed_actions=("mail.send",), clock=self.clock)
        def asking(run: longrun.Run) -> str:
            answer = run.ask("who", "whom to mail?")
            run.effect("send", "mail.send", {"to": answer})
            return str(answer)

        self.assertEqual(asking.run("ask").status, Status.AWAITING_INPUT)
        request = self.store.load("ask").state.approval_requests["who"]  # what `longrun answer` writes
        now = self.clock.now()
        self.store.write_approval(
            Approval.for_request(request, approval_id="a1", approver="tester", granted_at=now, expires_at=now + 3600, answer="alice")
        )
        self.assertEqual(asking.run("ask").result, "alice")
        journals = sorted(name for name in os.listdir(self.path("store", "ask")) if name.startswith("journal."))
        path = self.path("store", "ask", journals[-1])
        with open(path, "rb") as handle:
            data = bytearray(handle.read())
        found = _journal.scan(bytes(data), padded=True)
        damaged_at = next(offset for body, offset in zip(found.bodies, found.offsets[:-1]) if b"alice" in body)
        data[damaged_at + 30] ^= 1  # inside the line after the one that recorded the answer, or that line itself
        with open(path, "wb") as handle:
            handle.write(data)
        outcome = asking.run("ask")
        self.assertEqual(outcome.status, Status.STATE_UNRECOVERABLE, outcome.next_action)
        self.assertIn("a person's answer", "\n".join(item.detail for item in outcome.observations))
        self.assertEqual(len(longrun.testing.read_outbox(self.outbox.path)), 1)


class DeclaredPlanTests(support.TempDirTest):
    """A declared plan's records are all effects: after blob damage it is rebuilt (its effects are
    observed again), and the damaged blob never makes a later run rebuild again."""

    def runner(self, store: JsonFileStore) -> Runner:
        return Runner(
            RunContract("plan", "a step with a large payload"),
            [Step("big", "write", {"padding": PADDING}), Step("small", "write", {"n": 1})],
            store=store,
            adapters={"write": OutboxAdapter(self.path("outbox.jsonl"))},
        )

    def test_a_declared_plan_is_rebuilt_its_blob_written_afresh_and_revisions_stay_few(self) -> None:
        support.ExpectedWarnings(self, r"state recovered from", r"written again").start()
        root = self.path("store")
        self.assertEqual(self.runner(JsonFileStore(root, create=True)).run().status, Status.DONE)
        blobs = os.path.join(root, "plan", "blobs")
        [name] = os.listdir(blobs)
        with open(os.path.join(blobs, name), "r+b") as handle:
            handle.seek(100)
            handle.write(b"#")
        revisions = []
        for _ in range(3):
            outcome = self.runner(JsonFileStore(root)).run()
            self.assertEqual(outcome.status, Status.DONE, outcome.next_action)
            state = JsonFileStore(root).load("plan").state
            assert state is not None
            revisions.append(state.revision)
        self.assertEqual(len(longrun.testing.read_outbox(self.path("outbox.jsonl"))), 2, "an effect was applied again")
        self.assertLess(revisions[-1], 20, revisions)
        self.assertEqual(revisions[1], revisions[2], "a clean task committed nothing more")
        self.assertEqual(JsonFileStore(root).load("plan").source, "primary")
        self.assertTrue(any(entry.startswith(f"blob.{name}.") for entry in os.listdir(os.path.join(root, "plan", "quarantine"))))


class BlobFileTests(support.TempDirTest):
    """The JSON-file store's blob files, at the store's level."""

    def test_a_damaged_file_under_a_blobs_name_is_quarantined_and_written_afresh(self) -> None:
        store = JsonFileStore(self.path("store"), create=True)
        lease = store.acquire_lease("t", "a", 30.0, 1.0)
        store.load("t", lease=lease)
        state = sample_state("t", effects=1)
        store.commit(lease, state, set(state.effects))
        payload = {"padding": PADDING}
        data = canonical_bytes(payload)
        digest = hashlib.sha256(data).hexdigest()
        blobs = self.path("store", "t", "blobs")
        os.makedirs(blobs, exist_ok=True)
        with open(os.path.join(blobs, digest), "wb") as handle:  # left damaged by an earlier write, never read since
            handle.write(data[:-1] + b"!")
        record = next(iter(state.effects.values()))
        state.effects["big"] = record.with_changes(step_id="big", key="t/big", payload=payload, payload_digest="sha256:" + digest)
        with self.assertLogs("longrun", "WARNING") as logs:
            store.commit(lease, state, {"big"})
        self.assertIn("written again", "\n".join(logs.output))
        with open(os.path.join(blobs, digest), "rb") as handle:
            self.assertEqual(hashlib.sha256(handle.read()).hexdigest(), digest)
        self.assertEqual([name.split(".")[1] for name in os.listdir(self.path("store", "t", "quarantine"))], [digest])
        loaded = JsonFileStore(self.path("store")).load("t")
        self.assertEqual((loaded.source, loaded.state.effects["big"].payload), ("primary", payload))

    def test_a_rebuild_counts_the_revisions_a_journal_holds_not_its_padding(self) -> None:
        """A journal no chain reaches, zero-padded ahead of its end: its padding holds no revision."""
        support.ExpectedWarnings(self, r"state recovered from").start()
        root = self.path("store")
        store = JsonFileStore(root, create=True)
        lease = store.acquire_lease("t", "a", 30.0, 1.0)
        store.load("t", lease=lease)
        state = sample_state("t", effects=2)
        for _ in range(4):
            state.next_action = f"commit {time.monotonic_ns()}"
            store.commit(lease, state, set(state.effects))
        # An old generation's journal, as a rebuild leaves one behind: no records, then padding.
        with open(os.path.join(root, "t", "journal.0.log"), "wb") as handle:
            handle.write(_journal.encode_journal_meta("t", 0) + bytes(64 * 1024))
        with open(os.path.join(root, "t", "state.json"), "r+b") as handle:  # the snapshot damaged: a rebuild
            handle.seek(40)
            handle.write(b"#")
        loaded = JsonFileStore(root).load("t", lease=lease)
        self.assertEqual(loaded.source, "backup")
        assert loaded.state is not None
        self.assertLess(loaded.state.revision, 20, "the rebuilt revision counted the zero padding as records")


class WitnessRuleTests(unittest.TestCase):
    """``stores.base`` invariant 7 for any store: a state rebuilt from damage below the witnessed
    revision loads only if every record its task can make is an effect observed again."""

    def rebuilt(self, *, declared: bool) -> LoadResult:
        state = sample_state("t", effects=2)
        state.revision = 2
        if not declared:
            state.plan_outline = None
            first = next(iter(state.effects))
            state.effects[first] = state.effects[first].with_changes(action=CALL_ACTION)
        return LoadResult(state, "backup", "sha256:" + "0" * 64)

    def test_a_rebuilt_state_below_the_witness_loads_only_for_a_declared_plan(self) -> None:
        witness = Witness(1, 5, "the lease record")
        BaseStore._check_witness("t", self.rebuilt(declared=True), witness)  # its effects are observed again
        with self.assertRaisesRegex(StateUnrecoverableError, "rebuilt at revision 2, but the lease record shows that revision 5"):
            BaseStore._check_witness("t", self.rebuilt(declared=False), witness)
        BaseStore._check_witness("t", self.rebuilt(declared=False), Witness(1, 2, "the lease record"))  # nothing lost


class SqliteTests(RecordedAnswerCases):
    def make_store(self) -> Store:
        store = SqliteStore(self.path("longrun.sqlite"), create=True)
        self.addCleanup(store.close)
        return store

    def damage_blob(self, task_id: str, how: str) -> None:
        connection = sqlite3.connect(self.path("longrun.sqlite"))
        try:
            damage_blob_rows(connection.execute, task_id, how, "?")
            connection.commit()
        finally:
            connection.close()


class PostgresTests(RecordedAnswerCases):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        pg_support.check()

    def make_store(self) -> Store:
        self.schema = pg_support.Schema()
        self.addCleanup(self.schema.drop)
        store = PostgresStore(self.schema.factory())
        self.addCleanup(store.close)
        return store

    def damage_blob(self, task_id: str, how: str) -> None:
        rows = self.schema.execute("SELECT digest, data FROM longrun_blobs WHERE task_id = %s", (task_id,))
        self.assertEqual(len(rows), 1)
        digest, data = rows[0]
        if how == "delete":
            self.schema.execute("DELETE FROM longrun_blobs WHERE task_id = %s", (task_id,))
            return
        data = bytearray(data)
        data[100] ^= 1
        self.schema.execute("UPDATE longrun_blobs SET data = %s WHERE task_id = %s AND digest = %s", (bytes(data), task_id, digest))


def damage_blob_rows(execute: Any, task_id: str, how: str, mark: str) -> None:
    rows = list(execute(f"SELECT digest, data FROM longrun_blobs WHERE task_id = {mark}", (task_id,)))
    assert len(rows) == 1, rows
    digest, data = rows[0]
    if how == "delete":
        execute(f"DELETE FROM longrun_blobs WHERE task_id = {mark}", (task_id,))
        return
    data = bytearray(data)
    data[100] ^= 1
    execute(f"UPDATE longrun_blobs SET data = {mark} WHERE task_id = {mark} AND digest = {mark}", (bytes(data), task_id, digest))


del RecordedAnswerCases  # only its subclasses run


if __name__ == "__main__":
    unittest.main()
