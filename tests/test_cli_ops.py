"""The operator CLI as a cron job or an operator uses it: history, verify, resume, --json on every
command, and --store specs, driven through subprocesses, including every wrong-argument path."""

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
import unittest
from unittest import mock

from helpers.cli_case import OpsCase, cli
from helpers.support import HELPERS, child_env

from longrun.stores.jsonfile import INDEX_FILE
from longrun import JsonFileStore, Limits, Status, Step
from longrun.testing import OutboxAdapter, read_outbox


try:
    from longrun.stores.sqlite import SqliteStore
except ImportError as exc:  # the SQL stores are being added alongside this CLI
    SqliteStore = None
    SQLITE_MISSING = f"longrun.stores.sqlite.SqliteStore is not importable: {exc}"
else:
    SQLITE_MISSING = ""


def resume(target: str, *args: str):
    """``longrun resume`` of a target in tests/helpers/cli_tasks.py."""
    return cli("resume", "--path", HELPERS, f"cli_tasks:{target}", *args)


class ListTest(OpsCase):
    def test_ls_json_lists_every_task_with_status_and_next_action(self) -> None:
        self.finished_task("finished")
        self.awaiting_task("gated")
        self.finished_task("broken")
        self.corrupt_state("broken")
        entries = self.json_of(cli("ls", self.store_dir, "--json"))
        by_task = {entry["task_id"]: entry for entry in entries}
        self.assertEqual(sorted(by_task), ["broken", "finished", "gated"])
        self.assertEqual(by_task["finished"]["status"], "done")
        self.assertGreater(by_task["finished"]["revision"], 0)
        self.assertEqual(by_task["finished"]["source"], "primary")
        self.assertEqual(by_task["gated"]["status"], "awaiting-approval")
        self.assertIn("approve step 'publish'", by_task["gated"]["next_action"])
        self.assertEqual(by_task["broken"]["status"], "DAMAGED")
        self.assertTrue(by_task["broken"]["error"])
        self.assertEqual(self.json_of(cli("ls", "--store", self.store_dir, "--json")), entries)

    def test_ls_json_of_an_empty_store_is_an_empty_list(self) -> None:
        os.mkdir(self.store_dir)
        self.assertEqual(self.json_of(cli("ls", "--json", self.store_dir)), [])


class HistoryTest(OpsCase):
    def test_history_of_a_finished_task(self) -> None:
        self.finished_task()
        result = cli("history", self.store_dir, "finished")
        self.assert_exit(result, 0)
        state = JsonFileStore(self.store_dir).load("finished").state
        lines = result.stdout.splitlines()
        self.assertEqual(lines[0].split(",")[0], f"history of task finished (revision {state.revision}")
        self.assertIn("status done", lines[0])
        self.assertEqual(lines[1].split(), ["TIME", "(UTC)", "REV", "EPOCH", "WHAT", "DETAIL"])
        out = result.stdout
        self.assertRegex(out, r"\s1\s+-\s+created\s+first revision committed")
        self.assertRegex(out, r"effect-verified one\s+finished/one is verified after 1 attempt; payload sha256:")
        self.assertIn("receipt: outbox line 0", out)
        self.assertIn("observed: outbox line 0 holds finished/one", out)
        # The JSON-file store keeps a journal, so every later revision is listed with what it changed.
        self.assertRegex(out, rf"\s{state.revision}\s+1\s+revision\s+two: state -> verified.*status -> done")
        self.assertRegex(out, r"\s2\s+1\s+revision\s+one: started \(attempt 1")
        self.assertIn("lease-acquired", out)
        self.assertEqual(result.stderr, "")

    def test_history_json_is_sorted_and_shows_approvals_and_the_control_records_read(self) -> None:
        self.awaiting_task()
        approved = cli("approve", self.store_dir, "gated", "--yes", "--approver", "alice")
        self.assert_exit(approved, 0)
        approval_id = next(line.split()[-1] for line in approved.stdout.splitlines() if "approval id" in line)
        self.clock.advance(60)
        self.assertIs(self.runner("gated", self.approval_steps()).run().status, Status.DONE)

        entries = self.json_of(cli("history", self.store_dir, "gated", "--json"))
        times = [entry["at"] for entry in entries if entry["at"] is not None]
        self.assertEqual(times, sorted(times))
        for entry in entries:
            self.assertEqual(set(entry), {"at", "kind", "detail", "source", "revision", "epoch", "step", "digest"})
        kinds = [entry["kind"] for entry in entries]
        self.assertEqual(kinds[0], "created")
        revisions = [entry for entry in entries if entry["kind"] == "revision"]
        self.assertTrue(any("approval consumed: " + approval_id in entry["detail"] for entry in revisions))
        self.assertTrue(any("status -> done" in entry["detail"] for entry in revisions))
        consumed = next(entry for entry in entries if entry["kind"] == "approval-consumed")
        self.assertEqual((consumed["step"], consumed["at"]), ("publish", self.clock.now()))
        self.assertIn(approval_id, consumed["detail"])
        record = next(raw for raw in JsonFileStore(self.store_dir).read_approvals("gated"))
        read = [entry for entry in entries if entry["kind"] == "control-read"]
        self.assertEqual([entry["digest"] for entry in read], [record.digest])
        self.assertIn(approval_id, read[0]["detail"])
        publish = next(entry for entry in entries if entry["step"] == "publish" and entry["kind"].startswith("effect-"))
        self.assertEqual(publish["kind"], "effect-verified")
        self.assertEqual(publish["epoch"], 2, "the publish effect started under the second run's lease")
        self.assertIn(f"approval {approval_id}", publish["detail"])
        draft = next(entry for entry in entries if entry["step"] == "draft")
        self.assertEqual(draft["epoch"], 1)
        self.assertLess(draft["at"], publish["at"])

    def test_history_shows_errors_backoff_and_unknowns(self) -> None:
        flaky = OutboxAdapter(self.outbox, fail_transient=1)
        self.assertIs(self.runner("flaky", [Step("one", "send", {"n": 1})], flaky, limits=Limits(max_block_s=0)).run().status,
                      Status.RETRY_SCHEDULED)
        out = cli("history", self.store_dir, "flaky").stdout
        self.assertIn("effect-planned one", out)
        self.assertIn("last error: transient: outbox busy for flaky/one", out)
        self.assertIn("next attempt not before", out)

        self.unsafe_task()
        entries = self.json_of(cli("history", self.store_dir, "blind", "--json"))
        self.assertIn("effect-uncertain", [entry["kind"] for entry in entries])
        unknowns = [entry for entry in entries if entry["kind"] == "unknown"]
        self.assertTrue(unknowns and all("recorded at the last stop" in entry["detail"] for entry in unknowns))

    def test_history_of_a_task_with_no_committed_revision(self) -> None:
        JsonFileStore(self.store_dir, create=True).acquire_lease("fresh", "someone", 30, self.clock.now())
        result = cli("history", self.store_dir, "fresh")
        self.assert_exit(result, 0)
        self.assertIn("history of task fresh: no revision committed yet", result.stdout)
        self.assertIn("lease taken by someone", result.stdout)

    def test_a_store_history_method_is_the_timeline_of_commits(self) -> None:
        from longrun.cli._history import timeline

        self.finished_task()
        inner = JsonFileStore(self.store_dir)

        class JournalStore:
            def __getattr__(self, name):
                return getattr(inner, name)

            def history(self, task_id):
                return [
                    {"revision": 2, "at": 1_700_000_000.5, "epoch": 1, "description": "one started"},
                    {"revision": 1, "at": 1_700_000_000.0, "epoch": 1, "description": "created"},
                ]

        _, entries = timeline(JournalStore(), "finished", time.time())
        journal = [entry for entry in entries if entry["source"] == "journal"]
        self.assertEqual([(entry["revision"], entry["detail"]) for entry in journal], [(1, "created"), (2, "one started")])
        kinds = {entry["kind"] for entry in entries}
        self.assertNotIn("commit", kinds, "with a journal the state's own commit entry is left out")
        self.assertIn("created", kinds, "revision 1 is in a snapshot, not a journal: it always comes from the state")
        self.assertIn("effect-verified", kinds)


class VerifyTest(OpsCase):
    def test_a_finished_run_verifies_0(self) -> None:
        self.finished_task()
        result = cli("verify", self.store_dir, "finished")
        self.assert_exit(result, 0)
        self.assertIn("result: finished cleanly", result.stdout)
        self.assertRegex(result.stdout, r"ok\s+state\s+revision \d+ validates \(checksum, schema, task identity\)")
        self.assertRegex(result.stdout, r"ok\s+ledger\s+2 effect records \(2 verified\); completed_steps agrees")
        self.assertEqual(result.stderr, "")
        report = self.json_of(cli("verify", self.store_dir, "finished", "--json"))
        self.assertEqual((report["verdict"], report["exit_code"], report["status"]), ("finished", 0, "done"))
        self.assertEqual(report["in_flight"], [])
        self.assertEqual({check["result"] for check in report["checks"]}, {"ok"})
        names = [check["name"] for check in report["checks"]]
        for name in ("state", "plan", "revision", "ledger", "lease", "status"):
            self.assertIn(name, names)

    def test_awaiting_approval_verifies_1_until_an_approval_is_in_the_store(self) -> None:
        self.awaiting_task()
        result = cli("verify", self.store_dir, "gated")
        self.assert_exit(result, 1)
        self.assertIn("ACTION", result.stdout)
        self.assertIn("awaiting approval of step publish", result.stdout)
        self.assertIn("result: resumable only after an operator acts (exit 1)", result.stdout)
        self.assertEqual(self.json_of(cli("verify", self.store_dir, "gated", "--json"), 1)["verdict"], "needs-operator")
        self.assert_exit(cli("approve", self.store_dir, "gated", "--yes"), 0)
        approved = cli("verify", self.store_dir, "gated")
        self.assert_exit(approved, 0)
        self.assertRegex(approved.stdout, r"ok\s+approval\s+step publish awaits approval and the store holds unused approval")

    def test_unsafe_to_continue_verifies_1_and_ended_runs_verify_4(self) -> None:
        self.unsafe_task()
        report = self.json_of(cli("verify", self.store_dir, "blind", "--json"), 1)
        self.assertEqual(report["in_flight"], ["blind/one (uncertain, attempt 1)"])
        self.assertIn("unknowns:", next(c["detail"] for c in report["checks"] if c["name"] == "status"))

        refused = OutboxAdapter(self.outbox, fail_permanent=True)
        self.assertIs(self.runner("refused", [Step("one", "send", {"n": 1})], refused).run().status, Status.BLOCKED)
        result = cli("verify", self.store_dir, "refused")
        self.assert_exit(result, 4)
        self.assertIn("ENDED", result.stdout)
        self.assertIn("the run ended blocked", result.stdout)

        self.awaiting_task()
        self.assert_exit(cli("cancel", self.store_dir, "gated"), 0)
        pending = self.json_of(cli("verify", self.store_dir, "gated", "--json"), 1)
        self.assertIn("the next run starts no new effect and ends cancelled",
                      next(c["detail"] for c in pending["checks"] if c["name"] == "control"))
        self.assertIs(self.runner("gated", self.approval_steps()).run().status, Status.CANCELLED)
        self.assertEqual(self.json_of(cli("verify", self.store_dir, "gated", "--json"), 4)["verdict"], "ended")

    def test_damaged_state_verifies_3_and_nothing_is_moved(self) -> None:
        self.finished_task()
        self.corrupt_state("finished")
        before = self.listing("finished")
        result = cli("verify", self.store_dir, "finished")
        self.assert_exit(result, 3)
        self.assertRegex(result.stdout, r"DAMAGED\s+state\s+the state does not validate")
        self.assertIn("result: damaged", result.stdout)
        report = self.json_of(cli("verify", self.store_dir, "finished", "--json"), 3)
        self.assertEqual((report["verdict"], report["exit_code"], report["status"]), ("damaged", 3, None))
        self.assertEqual(self.listing("finished"), before, "verify moved or created a file in the task")

    def test_a_damaged_primary_with_a_valid_backup_verifies_3_and_says_recovery_is_possible(self) -> None:
        self.finished_task()
        primary = os.path.join(self.store_dir, "finished", "state.json")
        if not (os.path.exists(primary) and os.path.exists(primary + ".bak")):
            self.skipTest("the JSON-file store keeps no state.json/state.json.bak pair any more")
        with open(primary, "r+b") as handle:
            handle.write(b"{garbage")
        result = cli("verify", self.store_dir, "finished")
        self.assert_exit(result, 3)
        self.assertIn("Recovery from the backup is possible", result.stdout)
        self.assertEqual(cli("status", self.store_dir, "finished").returncode, 0, "status still shows the backup")

    def test_an_interrupted_run_verifies_0_and_lists_its_in_flight_effect(self) -> None:
        first = resume("crash_once")
        self.assertEqual(first.returncode, -signal.SIGKILL, first.stderr)
        report = self.json_of(cli("verify", self.store_dir, "crashy", "--json"))
        self.assertEqual((report["verdict"], report["status"]), ("resumable", "running"))
        self.assertEqual(report["in_flight"], ["crashy/two (started, attempt 1)"])
        in_flight = next(c for c in report["checks"] if c["name"] == "in-flight")
        self.assertIn("will be observed before anything else on resume", in_flight["detail"])

    def test_a_live_lease_is_noted_and_a_new_task_verifies_0(self) -> None:
        JsonFileStore(self.store_dir, create=True).acquire_lease("busy", "worker-7", 300, time.time())
        result = cli("verify", self.store_dir, "busy")
        self.assert_exit(result, 0)
        self.assertIn("no revision committed yet", result.stdout)
        self.assertRegex(result.stdout, r"note\s+lease\s+held: owner worker-7, epoch 1")
        self.assertIn("a resume before the expiry returns already-running", result.stdout)

    def test_a_damaged_cancellation_record_verifies_1(self) -> None:
        self.awaiting_task()
        self.assert_exit(cli("cancel", self.store_dir, "gated"), 0)
        record = os.path.join(self.store_dir, "gated", "control", "cancel.json")
        if not os.path.exists(record):
            self.skipTest("the JSON-file store keeps its cancellation record elsewhere now")
        with open(record, "wb") as handle:
            handle.write(b"{not json")
        result = cli("verify", self.store_dir, "gated")
        self.assert_exit(result, 1)
        self.assertRegex(result.stdout, r"ACTION\s+control\s+cancellation record .* is unusable")


class ResumeTest(OpsCase):
    def test_resume_runs_a_task_to_done_and_again_changes_nothing(self) -> None:
        result = resume("finished")
        self.assert_exit(result, 0)
        lines = result.stdout.splitlines()
        self.assertRegex(lines[0], r"^task nightly: done \(revision \d+, lease epoch 1\)$")
        self.assertIn("next action   nothing: every required effect is verified", result.stdout)
        self.assertIn("results       3 verified effects: one, two, three", result.stdout)
        self.assertRegex(result.stdout, r"evidence      \d+ observations, \d+ inferences, 0 unknowns")
        again = self.json_of(resume("finished", "--json"))
        self.assertEqual(again["status"], "done")
        self.assertEqual(again["task_id"], "nightly")
        self.assertEqual(sorted(again["results"]), ["one", "three", "two"])
        self.assertEqual(again["epoch"], 2)
        for key in ("next_action", "observations", "inferences", "unknowns", "revision"):
            self.assertIn(key, again)
        counts = OutboxAdapter(self.outbox).counts()
        self.assertEqual(counts, {"nightly/one": 1, "nightly/two": 1, "nightly/three": 1})

    def test_resume_waits_for_an_approval_then_finishes(self) -> None:
        waiting = resume("gated")
        self.assert_exit(waiting, 1)
        self.assertIn("task gated: awaiting-approval", waiting.stdout)
        self.assertIn("unknown: [approval] no approval yet for step 'publish'", waiting.stdout)
        self.assertEqual(self.json_of(resume("gated", "--json"), 1)["status"], "awaiting-approval")
        self.assert_exit(cli("approve", self.store_dir, "gated", "--yes"), 0)
        self.assert_exit(resume("gated"), 0)
        self.assertEqual(OutboxAdapter(self.outbox).counts(), {"gated/draft": 1, "gated/publish": 1})

    def test_resume_after_a_sigkill_completes_with_each_effect_once(self) -> None:
        first = resume("crash_once")
        self.assertEqual(first.returncode, -signal.SIGKILL, first.stdout + first.stderr)
        self.assertEqual([line["key"] for line in read_outbox(self.outbox)], ["crashy/one", "crashy/two"])
        status = cli("status", self.store_dir, "crashy")
        self.assertRegex(status.stdout, r"two\s+started\s+1")
        second = resume("crash_once")
        self.assert_exit(second, 0)
        self.assertIn("task crashy: done", second.stdout)
        self.assertEqual(OutboxAdapter(self.outbox).counts(), {"crashy/one": 1, "crashy/two": 1, "crashy/three": 1})
        self.assert_exit(cli("verify", self.store_dir, "crashy"), 0)
        two = next(e for e in self.json_of(cli("history", self.store_dir, "crashy", "--json")) if e["step"] == "two")
        self.assertEqual((two["kind"], two["epoch"]), ("effect-verified", 1))
        self.assertNotIn("receipt", two["detail"], "the killed attempt never returned its receipt")
        self.assertIn("observed: outbox line 1 holds crashy/two", two["detail"])

    def test_exit_codes_follow_the_status(self) -> None:
        self.assert_exit(resume("retry_later"), 1)
        blocked = resume("blocked")
        self.assert_exit(blocked, 4)
        self.assertIn("task refused: blocked", blocked.stdout)
        self.assert_exit(resume("gated"), 1)
        self.assert_exit(cli("cancel", self.store_dir, "gated", "--by", "bob"), 0)
        cancelled = resume("gated", "--json")
        self.assertEqual(self.json_of(cancelled, 4)["status"], "cancelled")
        JsonFileStore(self.store_dir, create=True).acquire_lease("nightly", "another-runner", 300, time.time())
        busy = resume("finished")
        self.assert_exit(busy, 1)
        self.assertIn("task nightly: already-running", busy.stdout)

    def test_library_errors_keep_their_codes_and_the_task_code_s_own_exception_exits_70(self) -> None:
        self.assert_fails(resume("bad_payload"), 2, "payload of step 'one' must be a mapping")
        self.assert_fails(resume("surrogate_payload"), 2, "step 'one' payload.files[1] holds a lone surrogate")
        bug = resume("payload_bug")
        self.assert_exit(bug, 70)
        self.assertIn("cli_tasks:payload_bug: run() raised ZeroDivisionError", bug.stderr)
        self.assertIn("Traceback", bug.stderr)

    def test_the_module_is_found_from_the_current_directory(self) -> None:
        result = cli("resume", "tests.helpers.cli_tasks:finished")  # the tests run from the repository root
        self.assert_exit(result, 0)
        self.assert_fails(cli("resume", "cli_tasks:finished"), 2, "no module named 'cli_tasks'")

    @unittest.skipIf(SqliteStore is None, SQLITE_MISSING)
    def test_resume_on_a_sqlite_store(self) -> None:
        database = self.path("tasks.db")
        os.environ["LONGRUN_CLI_STORE"] = f"sqlite:{database}"
        self.assert_exit(resume("finished"), 0)
        entries = self.json_of(cli("ls", f"sqlite:{database}", "--json"))
        self.assertEqual([(e["task_id"], e["status"]) for e in entries], [("nightly", "done")])


@unittest.skipIf(SqliteStore is None, SQLITE_MISSING)
class SqliteStoreTest(OpsCase):
    def setUp(self) -> None:
        super().setUp()
        self.database = self.path("tasks.db")
        self.spec = f"sqlite:{self.database}"
        store = SqliteStore(self.database, create=True)
        self.addCleanup(store.close)
        self.finished_task("finished", store=store)
        self.awaiting_task("gated", store=store)

    def test_ls_status_history_verify_take_a_sqlite_spec_in_either_place(self) -> None:
        for place in ([self.spec], ["--store", self.spec]):
            with self.subTest(place=place):
                listing = cli("ls", *place)
                self.assert_exit(listing, 0)
                rows = {line.split()[0]: line for line in listing.stdout.splitlines()[1:]}
                self.assertIn("done", rows["finished"])
                self.assertIn("awaiting-approval", rows["gated"])
                status = self.json_of(cli("status", *place, "gated", "--json"))
                self.assertEqual(status["status"], "awaiting-approval")
                history = self.json_of(cli("history", *place, "finished", "--json"))
                self.assertIn("effect-verified", [entry["kind"] for entry in history])
                self.assert_exit(cli("verify", *place, "finished"), 0)
                self.assert_exit(cli("verify", *place, "gated"), 1)

    def test_approve_and_cancel_on_a_sqlite_store(self) -> None:
        self.assert_exit(cli("approve", self.spec, "gated", "--yes"), 0)
        self.assert_exit(cli("verify", self.spec, "gated"), 0)
        self.assert_exit(cli("cancel", "--store", self.spec, "gated"), 0)
        report = self.json_of(cli("verify", self.spec, "gated", "--json"))
        self.assertIn("ends cancelled", next(c["detail"] for c in report["checks"] if c["name"] == "control"))

    def test_unknown_task_and_missing_database(self) -> None:
        self.assert_fails(cli("status", self.spec, "nosuch"), 2, "no task 'nosuch'")
        missing = self.path("missing.db")
        spec = f"sqlite:{missing}"
        for args in (["ls", spec], ["status", "--store", spec, "t"], ["verify", spec, "t"], ["history", spec, "t"],
                     ["approve", spec, "t", "--yes"], ["cancel", spec, "t"]):
            with self.subTest(args=args):
                self.assert_fails(cli(*args), 2, "does not exist")
        self.assertFalse(os.path.exists(missing), "a read-only command created a database")

    def test_a_sqlite_file_that_is_not_a_longrun_store_is_refused_unchanged(self) -> None:
        import sqlite3

        other = self.path("other.db")
        with contextlib.closing(sqlite3.connect(other)) as connection:
            connection.execute("CREATE TABLE invoices (id INTEGER)")
            connection.commit()
        for args in (["ls", f"sqlite:{other}"], ["verify", f"sqlite:{other}", "t"], ["cancel", f"sqlite:{other}", "t"]):
            with self.subTest(args=args):
                self.assert_fails(cli(*args), 2, "holds no longrun store")
        with contextlib.closing(sqlite3.connect(other)) as connection:
            tables = [row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        self.assertEqual(tables, ["invoices"])


class PostgresStoreTest(OpsCase):
    """The same commands on a ``postgresql://`` URL (when ``LONGRUN_TEST_POSTGRES_DSN`` names a server)."""

    def setUp(self) -> None:
        super().setUp()
        import urllib.parse

        from helpers import pg_support
        from longrun.stores import PostgresStore

        pg_support.check("psycopg")  # the URL carries the schema as a libpq option, which pg8000 cannot take
        schema = pg_support.Schema("psycopg", prefix="lr_cli")
        self.addCleanup(schema.drop)
        store = PostgresStore(schema.factory())
        self.addCleanup(store.close)
        self.finished_task("finished", store=store)
        self.awaiting_task("gated", store=store)
        self.password = urllib.parse.urlsplit(schema.url).password
        self.url = schema.spec

    def test_ls_status_history_verify_approve_on_a_postgresql_url(self) -> None:
        outputs = []
        for place in ([self.url], ["--store", self.url]):
            with self.subTest(place=place[0][:8]):
                listing = self.json_of(cli("ls", *place, "--json"))
                # Newest first; the two may have been updated in the same moment, so their order is not asserted.
                self.assertCountEqual([(e["task_id"], e["status"]) for e in listing], [("finished", "done"), ("gated", "awaiting-approval")])
                self.assertEqual(self.json_of(cli("status", *place, "finished", "--json"))["status"], "done")
                history = cli("history", *place, "finished")
                self.assert_exit(history, 0)
                self.assertIn("effect-verified one", history.stdout)
                verified = cli("verify", *place, "finished")
                self.assert_exit(verified, 0)
                self.assert_exit(cli("verify", *place, "gated"), 1)
                outputs += [history, verified]
        self.assert_exit(cli("approve", self.url, "gated", "--yes"), 0)
        self.assert_exit(cli("verify", "--store", self.url, "gated"), 0)
        if self.password:
            for result in outputs:
                self.assertNotIn(self.password, result.stdout + result.stderr)
        self.assertIn(":***@", outputs[-1].stdout, "verify names the store with its password masked")


HOLD_LEASE = """
import sys, time
from longrun.stores import open_store
open_store(sys.argv[1]).acquire_lease(sys.argv[2], "worker-7", 3600.0, time.time())
print("held", flush=True)
time.sleep(600)
"""


class RepairTest(OpsCase):
    def damage_lease(self, task_id: str) -> bytes:
        """Flip one bit in the task's lease record (the case of a letter of its token, so the record
        stays JSON and only its checksum can tell); return the damaged bytes."""
        path = os.path.join(self.store_dir, task_id, "lease.json")
        with open(path, "rb") as handle:
            data = bytearray(handle.read())
        start = data.index(b'"token":"') + len(b'"token":"')
        letter = next(index for index in range(start, len(data)) if chr(data[index]) in "abcdef")
        data[letter] ^= 0x20
        with open(path, "wb") as handle:
            handle.write(data)
        return bytes(data)

    def quarantined_leases(self, task_id: str) -> list[str]:
        directory = os.path.join(self.store_dir, task_id, "quarantine")
        return sorted(os.path.join(directory, name) for name in os.listdir(directory) if name.startswith("lease.json"))

    def hold_lease(self, spec: str, task_id: str) -> subprocess.Popen[str]:
        """Another process that holds the task's lease and stays alive (killed at cleanup)."""
        child = subprocess.Popen(
            [sys.executable, "-c", HOLD_LEASE, spec, task_id], env=child_env(), stdout=subprocess.PIPE, text=True
        )
        def reap() -> None:
            if child.poll() is None:
                child.kill()
                child.communicate()

        self.addCleanup(reap)
        self.assertEqual(child.stdout.readline().strip(), "held")
        return child

    def test_a_damaged_lease_stops_the_run_and_repair_lets_the_next_run_continue_at_a_newer_epoch(self) -> None:
        self.assert_exit(resume("gated"), 1)
        damaged = self.damage_lease("gated")
        stuck = self.json_of(resume("gated", "--json"), 1)
        self.assertEqual(stuck["status"], "state-unrecoverable")
        store = os.path.abspath(self.store_dir)
        self.assertIn(f"longrun repair {store} gated --lease", stuck["next_action"], "it names the store")
        verified = cli("verify", self.store_dir, "gated")
        self.assert_exit(verified, 3)
        self.assertIn(f"longrun repair {store} gated --lease", verified.stdout)
        recorded = JsonFileStore(self.store_dir).load("gated").state
        highest = max([recorded.lease_epoch] + [effect.epoch for effect in recorded.effects.values()])
        command = shlex.split(stuck["next_action"].split("`")[1])  # the next action, followed as written
        self.assertEqual(command[:2], ["longrun", "repair"])
        result = cli(*command[1:])
        self.assert_exit(result, 0)
        quarantined = self.quarantined_leases("gated")
        self.assertEqual(len(quarantined), 1)
        with open(quarantined[0], "rb") as handle:
            self.assertEqual(handle.read(), damaged, "the damaged record is moved aside as it was, never deleted")
        self.assertIn(os.path.relpath(quarantined[0], os.path.join(self.store_dir, "gated")), result.stdout)
        self.assertIn(f"epoch {highest}", result.stdout)
        self.assertRegex(result.stdout, rf"next run gets epoch {highest + 1}")
        again = self.json_of(resume("gated", "--json"), 1)
        self.assertEqual(again["status"], "awaiting-approval", again["next_action"])
        self.assertGreater(again["epoch"], highest)
        self.assertEqual(OutboxAdapter(self.outbox).counts(), {"gated/draft": 1})

    def test_repair_json(self) -> None:
        self.assert_exit(resume("gated"), 1)
        self.damage_lease("gated")
        report = self.json_of(cli("repair", self.store_dir, "gated", "--lease", "--json"))
        self.assertEqual(report["task_id"], "gated")
        self.assertEqual(report["next_epoch"], report["epoch"] + 1)
        self.assertEqual(report["lease"]["epoch"], report["epoch"])
        self.assertNotIn("token", report["lease"], "the lease's secret is never printed")
        self.assertIn("checksum", report["damage"])
        self.assertTrue(report["quarantined"].startswith("quarantine"))
        self.assertEqual(len(self.quarantined_leases("gated")), 1)

    def test_repair_refuses_an_intact_lease_a_live_holder_and_a_missing_what(self) -> None:
        self.awaiting_task()
        before = self.listing("gated")
        intact = cli("repair", self.store_dir, "gated", "--lease")
        self.assert_fails(intact, 1, "is not damaged")
        self.assertEqual(self.listing("gated"), before)
        self.assert_fails(cli("repair", self.store_dir, "gated"), 2, "--lease")
        self.assert_fails(cli("repair", self.store_dir, "nosuch", "--lease"), 2, "no task 'nosuch'")
        holder = self.hold_lease(self.store_dir, "gated")
        self.damage_lease("gated")
        busy = cli("repair", self.store_dir, "gated", "--lease", "--json")
        self.assert_fails(busy, 1, "holds the lease")
        self.assertEqual(busy.stdout, "")
        self.assertEqual(self.quarantined_leases("gated"), [], "nothing moved while a holder lives")
        holder.kill()
        holder.communicate()
        self.assert_exit(cli("repair", self.store_dir, "gated", "--lease"), 0)  # its holder is gone now

    @unittest.skipIf(SqliteStore is None, SQLITE_MISSING)
    def test_repair_a_damaged_lease_row_of_a_sqlite_store(self) -> None:
        import sqlite3

        database = self.path("tasks.db")
        os.environ["LONGRUN_CLI_STORE"] = f"sqlite:{database}"
        self.assert_exit(resume("gated"), 1)
        with contextlib.closing(sqlite3.connect(database)) as connection:
            connection.execute("UPDATE longrun_leases SET epoch = -1 WHERE task_id = 'gated'")
            connection.commit()
        self.assertEqual(self.json_of(resume("gated", "--json"), 1)["status"], "state-unrecoverable")
        report = self.json_of(cli("repair", f"sqlite:{database}", "gated", "--lease", "--json"))
        self.assertTrue(report["quarantined"].startswith("longrun_quarantine/"), report)
        again = self.json_of(resume("gated", "--json"), 1)
        self.assertEqual(again["status"], "awaiting-approval")
        self.assertGreater(again["epoch"], report["epoch"])


class JsonEverywhereTest(OpsCase):
    def test_approve_and_cancel_json(self) -> None:
        self.awaiting_task()
        approved = self.json_of(cli("approve", self.store_dir, "gated", "--yes", "--approver", "alice", "--json"))
        self.assertEqual(approved["approval"]["approver"], "alice")
        self.assertEqual(approved["approval"]["payload_digest"], approved["request"]["payload_digest"])
        self.assertEqual(approved["approval"]["step_id"], "publish")
        self.assertIsNone(approved["written_to"])
        second = cli("approve", self.store_dir, "gated", "--json", input="y\n")
        self.assert_fails(second, 2, f"approval {approved['approval']['approval_id']}", "already has an approval", "nothing was written")
        self.assertEqual(second.stdout, "")
        self.awaiting_task("gated-2")
        asked = cli("approve", self.store_dir, "gated-2", "--json", input="y\n")
        self.json_of(asked)
        self.assertIn("pending approval request of task gated-2", asked.stderr, "the request is shown where the prompt is")
        self.awaiting_task("gated-3")
        declined = cli("approve", self.store_dir, "gated-3", "--json", input="n\n")
        self.assert_fails(declined, 1, "not approved")
        self.assertEqual(declined.stdout, "")

        cancelled = self.json_of(cli("cancel", self.store_dir, "gated", "--by", "bob", "--json"))
        self.assertEqual(cancelled["cancellation"]["requested_by"], "bob")
        self.assertFalse(cancelled["replaced_earlier_record"])
        self.assertTrue(self.json_of(cli("cancel", self.store_dir, "gated", "--json"))["replaced_earlier_record"])

    def test_errors_leave_stdout_empty_under_json(self) -> None:
        self.finished_task()
        for args in (["status", self.store_dir, "nosuch", "--json"], ["history", self.store_dir, "nosuch", "--json"],
                     ["verify", self.store_dir, "nosuch", "--json"], ["ls", self.path("nowhere"), "--json"],
                     ["resume", "nosuch_module_xyz:f", "--json"]):
            with self.subTest(args=args):
                result = cli(*args)
                self.assert_fails(result, 2)
                self.assertEqual(result.stdout, "")

    def test_demo_json_prints_a_summary(self) -> None:
        result = cli("demo", "--json")
        summary = self.json_of(result)
        self.assertTrue(summary["passed"])
        self.assertEqual(len(summary["checks"]), 5)
        self.assertTrue(all(check["ok"] for check in summary["checks"]))
        self.assertEqual(summary["outcome"]["status"], "done")
        self.assertIsNone(summary["kept"])
        self.assertIn("demo passed", result.stderr, "the narrative goes to stderr")

    def test_every_command_documents_json_and_its_exit_codes(self) -> None:
        for command in ("ls", "status", "history", "verify", "approve", "cancel", "repair", "resume", "demo"):
            with self.subTest(command=command):
                result = cli(command, "--help")
                self.assert_exit(result, 0)
                self.assertIn("--json", result.stdout)
                self.assertIn("exit codes", result.stdout)
        verify_help = cli("verify", "--help").stdout
        self.assertIn("3  damaged", verify_help)
        self.assertIn("4  the run ended without finishing", verify_help)
        resume_help = cli("resume", "--help").stdout
        for line in ("0   done", "1   not finished", "2   the target is wrong", "4   the run ended", "70  run() raised"):
            self.assertIn(line, resume_help)


class WrongArgumentsTest(OpsCase):
    def test_missing_arguments_exit_2_with_usage(self) -> None:
        os.mkdir(self.store_dir)
        for args in (["history"], ["verify"], ["resume"], ["history", self.store_dir], ["verify", "--store", self.store_dir],
                     ["ls", "--json"], ["resume", "--path"], ["verify", self.store_dir, "t", "extra"]):
            with self.subTest(args=args):
                self.assert_fails(cli(*args), 2, "usage:")

    def test_the_store_given_twice_differently_exits_2(self) -> None:
        self.finished_task()
        self.assert_fails(cli("status", self.tmp, "finished", "--store", self.store_dir), 2, "given twice")
        self.assert_exit(cli("status", self.store_dir, "finished", "--store", self.store_dir), 0)

    def test_an_option_between_store_and_task_still_parses(self) -> None:
        self.finished_task()
        self.assertEqual(self.json_of(cli("status", self.store_dir, "--json", "finished"))["status"], "done")

    def test_bad_module_function_targets_exit_2_without_a_traceback(self) -> None:
        broken = self.path("broken_module.py")
        with open(broken, "w") as handle:
            handle.write("raise RuntimeError('boom at import')\n")
        with open(self.path("needs_dep.py"), "w") as handle:
            handle.write("import not_installed_dependency_xyz\n")
        cases = [
            (["nocolon"], "is not MODULE:FUNCTION"),
            (["mod:"], "is not MODULE:FUNCTION"),
            ([":function"], "is not MODULE:FUNCTION"),
            (["a b:c"], "is not MODULE:FUNCTION"),
            (["mod:1function"], "is not MODULE:FUNCTION"),
            (["no_such_module_xyz:build"], "no module named 'no_such_module_xyz'"),
            (["--path", self.tmp, "broken_module:build"], "raised RuntimeError: boom at import"),
            (["--path", self.tmp, "needs_dep:build"], "No module named 'not_installed_dependency_xyz'"),
            (["--path", self.path("nowhere"), "cli_tasks:finished"], "is not an existing directory"),
            (["--path", HELPERS, "cli_tasks:no_such_function"], "has no attribute 'no_such_function'"),
            (["--path", HELPERS, "cli_tasks:NOT_CALLABLE"], "is a str, not a function"),
            (["--path", HELPERS, "cli_tasks:not_a_runner"], "returned int, not a longrun.runner.Runner"),
            (["--path", HELPERS, "cli_tasks:raises"], "raised RuntimeError: the task's configuration is missing"),
            (["--path", HELPERS, "cli_tasks:needs_an_argument"], "it must take no arguments"),
        ]
        for args, fragment in cases:
            with self.subTest(args=args):
                self.assert_fails(cli("resume", *args), 2, fragment)
        verbose = cli("-v", "resume", "--path", HELPERS, "cli_tasks:raises")
        self.assert_exit(verbose, 2)
        self.assertIn("Traceback", verbose.stderr, "-v shows the target's traceback")

    def test_unknown_task_missing_store_and_unsafe_task_id(self) -> None:
        self.finished_task()
        missing = self.path("no-such-dir")
        for command in ("history", "verify"):
            with self.subTest(command=command):
                self.assert_fails(cli(command, self.store_dir, "nosuch"), 2, "no task 'nosuch'")
                self.assert_fails(cli(command, missing, "finished"), 2, "does not exist")
                self.assert_fails(cli(command, "--store", missing, "finished"), 2, "does not exist")
                for task_id in ("../etc", "/etc", ".hidden", "a/b", ""):
                    self.assert_fails(cli(command, self.store_dir, task_id), 2, "not a safe name")
        self.assertFalse(os.path.exists(missing))
        self.assertEqual(sorted(n for n in os.listdir(self.store_dir) if not n.startswith(INDEX_FILE)), [".longrun-store", "finished"], "the marker and the one task")

    def test_bad_store_specs_exit_2(self) -> None:
        with open(self.path("tasks.db"), "w") as handle:
            handle.write("x")
        cases = [
            ("", "the store is empty"),
            ("sqlite:", "needs a file path"),
            (f"sqlite:{self.path('nowhere', 'tasks.db')}", "does not exist"),
            ("mysql://db.example/tasks", "unknown kind of store 'mysql'"),
            (self.path("tasks.db"), "is not a directory (a SQLite store is named sqlite:"),
        ]
        for spec, fragment in cases:
            for args in (["ls", spec], ["status", "--store", spec, "t"], ["verify", spec, "t"]):
                with self.subTest(args=args):
                    self.assert_fails(cli(*args), 2, fragment)

    def test_a_postgresql_url_without_a_driver_exits_2(self) -> None:
        hidden = self.path("no-drivers")
        os.mkdir(hidden)
        for driver in ("psycopg", "pg8000"):  # shadow any installed driver with one that cannot be imported
            with open(os.path.join(hidden, f"{driver}.py"), "w") as handle:
                handle.write("raise ImportError('hidden from this test')\n")
        with mock.patch.dict(os.environ, {"PYTHONPATH": hidden}):
            result = cli("ls", "postgresql://user:s3cret@localhost/db")
        self.assert_fails(result, 2, "needs a driver")
        self.assertNotIn("s3cret", result.stderr)


class StoreLabelTest(unittest.TestCase):
    def test_a_url_password_is_masked_in_output(self) -> None:
        from longrun.cli._common import store_label

        self.assertEqual(store_label("postgresql://user:s3cret@db.example/tasks"), "postgresql://user:***@db.example/tasks")
        self.assertEqual(store_label("postgresql://db.example/tasks"), "postgresql://db.example/tasks")
        self.assertEqual(store_label("sqlite:/var/lib/longrun/x.db"), "sqlite:/var/lib/longrun/x.db")


if __name__ == "__main__":
    unittest.main()
