"""The operator CLI, driven through subprocesses as a user would: status, approve, cancel, ls, errors."""

import contextlib
import io
import json
import os
import time
import unittest
from dataclasses import replace

from helpers.cli_case import CliCase, cli

import longrun
from longrun.stores.jsonfile import INDEX_FILE
from longrun import JsonFileStore, Limits, Runner, Status, Step
from longrun.cli import main
from longrun.testing import OutboxAdapter, read_outbox


def run_in_process(args: list[str]) -> tuple[int, str, str]:
    """``main(args)`` in this process: (exit code, stdout, stderr)."""
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
        code = main(args)
    return code, out.getvalue(), err.getvalue()


def _without_times(document: object) -> object:
    """A JSON document without the moment it was produced (two runs differ only there)."""
    if isinstance(document, dict):
        return {key: _without_times(value) for key, value in document.items() if key not in ("checked_at", "now", "at")}
    if isinstance(document, list):
        return [_without_times(item) for item in document]
    return document


class HelpTest(unittest.TestCase):
    def test_help_documents_the_exit_codes(self) -> None:
        result = cli("--help")
        self.assertEqual(result.returncode, 0)
        self.assertIn("exit codes:", result.stdout)
        for line in ("0  ok", "1  the run is not done", "2  usage or bad input", "3  storage error"):
            self.assertIn(line, result.stdout)

    def test_version_names_the_package_version(self) -> None:
        result = cli("--version")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.strip(), f"longrun {longrun.__version__}")
        with contextlib.redirect_stdout(io.StringIO()) as out:
            self.assertEqual(main(["--version"]), 0)
        self.assertEqual(out.getvalue().strip(), f"longrun {longrun.__version__}")

    def test_main_returns_codes_instead_of_raising(self) -> None:
        with contextlib.redirect_stderr(io.StringIO()) as err:
            self.assertEqual(main(["status"]), 2)
        self.assertIn("required", err.getvalue())
        with contextlib.redirect_stdout(io.StringIO()):
            self.assertEqual(main(["--help"]), 0)


class NotAStoreTest(CliCase):
    def test_every_command_refuses_a_directory_that_is_not_a_store_naming_it(self) -> None:
        checkout = os.path.join(self.tmp, "checkout")
        for name in ("docs", "src", "tests"):
            os.makedirs(os.path.join(checkout, name))
        for command in (("ls", checkout), ("status", checkout, "src"), ("verify", checkout, "src"), ("history", checkout, "src")):
            with self.subTest(command=command[0]):
                result = cli(*command)
                self.assert_fails(result, 2, f"{checkout} is not a longrun store")
                self.assertNotIn("docs  ", result.stdout)
        self.assertEqual(sorted(os.listdir(checkout)), ["docs", "src", "tests"], "nothing was written")

    def test_init_create_store_writes_the_store_marker(self) -> None:
        from longrun.cli._session import create_store

        where = os.path.join(self.tmp, "new", "store")
        create_store(where)
        self.assertEqual(os.listdir(where), [".longrun-store"])
        self.assertEqual(cli("ls", where).returncode, 0)


class StatusTest(CliCase):
    def test_status_of_a_finished_task(self) -> None:
        self.finished_task()
        result = cli("status", self.store_dir, "finished")
        self.assertEqual(result.returncode, 0, result.stderr)
        out = result.stdout
        self.assertIn("status       done", out)
        state = JsonFileStore(self.store_dir).load("finished").state
        self.assertIn(f"revision     {state.revision} ", out)
        self.assertIn(state.plan_digest, out)
        self.assertIn("lease        expired: owner", out)
        self.assertRegex(out, r"one\s+verified\s+1\s+sha256:")
        self.assertRegex(out, r"two\s+verified\s+1\s+sha256:")
        self.assertIn("approvals    none pending", out)
        self.assertIn("next action  nothing: every required effect is verified", out)
        self.assertEqual(result.stderr, "")

    def test_status_json_is_one_parsable_object(self) -> None:
        self.finished_task()
        result = cli("status", self.store_dir, "finished", "--json")
        self.assertEqual(result.returncode, 0, result.stderr)
        data = json.loads(result.stdout)
        state = JsonFileStore(self.store_dir).load("finished").state
        self.assertEqual(data["status"], "done")
        self.assertEqual(data["revision"], state.revision)
        self.assertEqual(data["plan_digest"], state.plan_digest)
        self.assertEqual([e["state"] for e in data["effects"]], ["verified", "verified"])
        self.assertEqual(data["store_lease"]["epoch"], 1)
        self.assertTrue(data["store_lease"]["expired"])
        self.assertEqual(data["load"]["source"], "primary")
        self.assertTrue(data["load"]["digest"].startswith("sha256:"))
        self.assertEqual(data["next_action"], state.next_action)

    def test_json_before_the_command_is_the_same_as_after_it(self) -> None:
        self.finished_task()
        for args in (["status", self.store_dir, "finished"], ["ls", self.store_dir],
                     ["history", self.store_dir, "finished"], ["verify", self.store_dir, "finished"]):
            with self.subTest(command=args[0]):
                before = run_in_process(["--json", *args])
                after = run_in_process([*args, "--json"])
                self.assertEqual(before[0], after[0])
                self.assertEqual(before[2], "")
                self.assertEqual(_without_times(json.loads(before[1])), _without_times(json.loads(after[1])))
        # Every command that takes --json takes it first: the parser hands the same flag on.
        from longrun.cli._main import _parse, build_parser

        for args in (["approve", self.store_dir, "t"], ["cancel", self.store_dir, "t"], ["resume", "m:f"], ["demo"]):
            with self.subTest(command=args[0]):
                self.assertTrue(_parse(build_parser(), ["--json", *args]).json)
                self.assertTrue(_parse(build_parser(), [*args, "--json"]).json)
                self.assertFalse(_parse(build_parser(), args).json)

    def test_status_is_read_only_on_damaged_state(self) -> None:
        self.finished_task()
        for name in ("state.json", "state.json.bak"):
            with open(self.task_file("finished", name), "r+b") as handle:
                handle.write(b"{garbage")
        result = cli("status", self.store_dir, "finished")
        self.assert_fails(result, 3, "damaged state", "neither")
        self.assertEqual(result.stdout, "")
        self.assertTrue(os.path.exists(self.task_file("finished", "state.json")), "a read-only status moved a file")
        self.assertEqual(os.listdir(self.task_file("finished", "quarantine")), [])
        self.assert_fails(cli("status", self.store_dir, "finished", "--json"), 3, "damaged state")

    def test_status_shows_a_state_recovered_from_the_backup(self) -> None:
        self.finished_task()
        with open(self.task_file("finished", "state.json"), "r+b") as handle:
            handle.write(b"{garbage")
        result = cli("status", self.store_dir, "finished")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("state.json.bak", result.stdout)
        self.assertIn("store notes", result.stdout)
        data = json.loads(cli("status", self.store_dir, "finished", "--json").stdout)
        self.assertEqual(data["load"]["source"], "backup")

    def test_damaged_lease_record_exits_3(self) -> None:
        self.finished_task()
        with open(self.task_file("finished", "lease.json"), "wb") as handle:
            handle.write(b"not json")
        self.assert_fails(cli("status", self.store_dir, "finished"), 3, "lease")


class ApprovalTest(CliCase):
    def test_status_approve_then_run_applies_the_gated_effect_once(self) -> None:
        self.awaiting_task()
        status = cli("status", self.store_dir, "gated")
        self.assertEqual(status.returncode, 0, status.stderr)
        self.assertIn("status       awaiting-approval", status.stdout)
        self.assertIn("approvals    1 pending", status.stdout)
        self.assertIn("step publish (action send)", status.stdout)
        request = JsonFileStore(self.store_dir).load("gated").state.approval_requests["publish"]
        self.assertIn(request.payload_digest, status.stdout)
        self.assertIn(f"plan digest    {request.plan_digest}", status.stdout)
        self.assertIn("approve step 'publish'", status.stdout)
        data = json.loads(cli("status", self.store_dir, "gated", "--json").stdout)
        self.assertEqual([r["step_id"] for r in data["approval_requests"]], ["publish"])

        approved = cli("approve", self.store_dir, "gated", "--yes", "--approver", "alice", "--ttl", "600")
        self.assertEqual(approved.returncode, 0, approved.stderr)
        self.assertIn("approved step publish of task gated", approved.stdout)
        self.assertIn("approver     alice", approved.stdout)
        approval_id = next(line.split()[-1] for line in approved.stdout.splitlines() if "approval id" in line)

        adapter = OutboxAdapter(self.outbox)
        outcome = self.runner("gated", self.approval_steps(), adapter).run()
        self.assertIs(outcome.status, Status.DONE)
        self.assertEqual(adapter.calls["gated/publish"], 1)
        self.assertEqual(adapter.counts(), {"gated/draft": 1, "gated/publish": 1})
        state = JsonFileStore(self.store_dir).load("gated").state
        self.assertEqual(state.consumed_approvals, [approval_id])
        self.assertEqual(state.effects["publish"].approval_id, approval_id)

    def test_approve_asks_for_confirmation_without_yes(self) -> None:
        self.awaiting_task()
        approvals = os.path.join(self.store_dir, "gated", "control", "approvals")
        declined = cli("approve", self.store_dir, "gated", input="n\n")
        self.assert_fails(declined, 1, "not approved")
        self.assertEqual(os.listdir(approvals), [])
        no_answer = cli("approve", self.store_dir, "gated", input="")
        self.assert_fails(no_answer, 1, "not approved")
        accepted = cli("approve", self.store_dir, "gated", input="y\n")
        self.assertEqual(accepted.returncode, 0, accepted.stderr)
        self.assertEqual(len(os.listdir(approvals)), 1)

    def test_approve_with_no_pending_request_exits_1(self) -> None:
        steps = [Step("flaky", "send", {"n": 1})]
        outcome = self.runner("flaky", steps, OutboxAdapter(self.outbox, fail_transient=1), limits=Limits(max_block_s=0)).run()
        self.assertIs(outcome.status, Status.RETRY_SCHEDULED)
        self.assert_fails(cli("approve", self.store_dir, "flaky", "--yes"), 1, "no pending approval request")

    def test_approve_on_a_finished_task_exits_1(self) -> None:
        self.finished_task()
        self.assert_fails(cli("approve", self.store_dir, "finished", "--yes"), 1, "already ended done")

    def test_ambiguous_pending_requests_need_step(self) -> None:
        self.awaiting_task()
        store = JsonFileStore(self.store_dir)
        lease = store.acquire_lease("gated", "test-editor", 30, self.clock.now())
        state = store.load("gated", lease=lease).state
        request = state.approval_requests["publish"]
        state.approval_requests["announce"] = replace(request, step_id="announce", payload_digest="sha256:" + "0" * 64)
        store.commit(lease, state)
        store.release_lease(lease, self.clock.now())

        result = cli("approve", self.store_dir, "gated", "--yes")
        self.assert_fails(result, 2, "--step", "publish", "announce")
        self.assertEqual(os.listdir(os.path.join(self.store_dir, "gated", "control", "approvals")), [])
        self.assert_fails(cli("approve", self.store_dir, "gated", "--yes", "--step", "nosuch"), 2, "nosuch", "publish")
        chosen = cli("approve", self.store_dir, "gated", "--yes", "--step", "announce")
        self.assertEqual(chosen.returncode, 0, chosen.stderr)
        self.assertIn("approved step announce", chosen.stdout)

    def test_an_approval_lasts_until_its_request_expires_unless_ttl_says_otherwise(self) -> None:
        # The tasks ran on a fake clock years ago, so their requests have expired: the approval gets an hour.
        self.awaiting_task("expired")
        expired = json.loads(cli("approve", self.store_dir, "expired", "--yes", "--json").stdout)
        self.assertAlmostEqual(expired["approval"]["expires_at"] - expired["approval"]["granted_at"], 3600.0)
        # A second approval of one request is refused while the first waits, so each case has its own task.
        requests = {}
        for task_id in ("lasting", "shorter"):
            self.awaiting_task(task_id)
            store = JsonFileStore(self.store_dir)
            lease = store.acquire_lease(task_id, "test-editor", 30, self.clock.now())
            state = store.load(task_id, lease=lease).state
            requests[task_id] = replace(state.approval_requests["publish"], expires_at=time.time() + 5 * 86400)
            state.approval_requests["publish"] = requests[task_id]
            store.commit(lease, state)
            store.release_lease(lease, self.clock.now())
        approved = json.loads(cli("approve", self.store_dir, "lasting", "--yes", "--json").stdout)
        self.assertEqual(approved["approval"]["expires_at"], requests["lasting"].expires_at)
        shorter = json.loads(cli("approve", self.store_dir, "shorter", "--yes", "--json", "--ttl", "60").stdout)
        self.assertLess(shorter["approval"]["expires_at"], requests["shorter"].expires_at)
        self.assertAlmostEqual(shorter["approval"]["expires_at"] - shorter["approval"]["granted_at"], 60.0)

    def test_approve_rejects_bad_ttl(self) -> None:
        self.awaiting_task()
        self.assert_fails(cli("approve", self.store_dir, "gated", "--yes", "--ttl", "0"), 2, "positive")
        self.assert_fails(cli("approve", self.store_dir, "gated", "--yes", "--ttl", "soon"), 2, "not a number")


class NextActionTest(CliCase):
    def test_every_command_names_the_store_it_read_the_next_action_from_and_the_action_works(self) -> None:
        self.awaiting_task()
        command = f"longrun approve {os.path.abspath(self.store_dir)} gated --step publish"
        outputs = {
            " ".join(args): cli(*args)
            for args in (
                ("status", self.store_dir, "gated"), ("status", self.store_dir, "gated", "--json"), ("ls", self.store_dir),
                ("ls", self.store_dir, "--json"), ("verify", self.store_dir, "gated"), ("verify", self.store_dir, "gated", "--json"),
                ("watch", self.store_dir, "gated", "--json"),
            )
        }  # fmt: skip
        for args, result in outputs.items():
            with self.subTest(args):
                self.assertIn(command, result.stdout)
                self.assertNotIn("<store>", result.stdout)
        next_action = json.loads(outputs[f"status {self.store_dir} gated --json"].stdout)["next_action"]
        followed = cli(*next_action.split("`")[1].split()[1:], "--yes")  # the command the next action names, as written
        self.assert_exit(followed, 0)
        self.assertIs(self.runner("gated", self.approval_steps()).run().status, Status.DONE)


class CancelTest(CliCase):
    def test_cancel_then_run_ends_cancelled_without_a_new_effect(self) -> None:
        self.awaiting_task()
        lines_before = len(read_outbox(self.outbox))
        result = cli("cancel", self.store_dir, "gated", "--reason", "wrong audience", "--by", "bob")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("cancellation recorded for task gated", result.stdout)

        adapter = OutboxAdapter(self.outbox)
        outcome = self.runner("gated", self.approval_steps(), adapter).run()
        self.assertIs(outcome.status, Status.CANCELLED)
        self.assertIn("bob", outcome.next_action)
        self.assertEqual(adapter.calls, {})
        self.assertEqual(len(read_outbox(self.outbox)), lines_before)
        status = cli("status", self.store_dir, "gated")
        self.assertIn("status       cancelled", status.stdout)
        self.assertIn("wrong audience", status.stdout)
        self.assertIn("approvals    none pending", status.stdout, "an ended run withdraws its open requests")
        # Approving a cancelled run is refused: it has ended.
        self.assert_fails(cli("approve", self.store_dir, "gated", "--yes"), 1, "cancelled")

    def test_cancel_unknown_task_exits_2(self) -> None:
        self.finished_task()
        self.assert_fails(cli("cancel", self.store_dir, "nosuch"), 2, "no task 'nosuch'")
        self.assertFalse(os.path.exists(os.path.join(self.store_dir, "nosuch")))


class ListTest(CliCase):
    def test_ls_lists_every_task_and_shows_damage(self) -> None:
        self.finished_task("finished")
        self.awaiting_task("gated")
        self.finished_task("broken")
        for name in ("state.json", "state.json.bak"):
            with open(self.task_file("broken", name), "wb") as handle:
                handle.write(b"\x00")
        result = cli("ls", self.store_dir)
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = result.stdout.splitlines()
        self.assertEqual(lines[0].split(), ["TASK", "STATUS", "PROGRESS", "REV", "UPDATED", "NEXT", "ACTION"])
        rows = {line.split()[0]: line for line in lines[1:]}
        self.assertEqual(sorted(rows), ["broken", "finished", "gated"])
        self.assertRegex(rows["finished"], r"done\s+2/2\s+\d+\s+\S+ ago\s+nothing")
        self.assertIn("awaiting-approval", rows["gated"])
        self.assertIn("DAMAGED", rows["broken"])

    def test_ls_on_a_store_with_a_summary_index_loads_only_the_page_and_still_shows_damage(self) -> None:
        import sqlite3

        from longrun.cli._inspect import cmd_ls
        from longrun.testing.store_contract import sample_state

        store = longrun.SqliteStore(os.path.join(self.tmp, "tasks.db"), create=True)
        self.addCleanup(store.close)
        for index in range(12):
            task_id = f"t{index:02d}"
            lease = store.acquire_lease(task_id, "me", 30.0, time.time())
            store.load(task_id, lease=lease)
            state = sample_state(task_id)
            state.updated_at = 1_700_000_000.0 + index
            state.status = Status.DONE if index % 2 else Status.RUNNING
            store.commit(lease, state, set(state.effects))
            store.release_lease(lease, time.time())
        connection = sqlite3.connect(store.path)
        connection.execute("UPDATE longrun_effects SET record = 'damaged' WHERE task_id = 't11'")
        connection.commit()
        connection.close()
        loads: list[str] = []
        load, load_many = store.load, store.load_many
        store.load = lambda task_id, **kwargs: (loads.append(task_id), load(task_id, **kwargs))[1]  # type: ignore[method-assign]
        store.load_many = lambda task_ids: (loads.extend(task_ids), load_many(task_ids))[1]  # type: ignore[method-assign]
        out = io.StringIO()
        self.assertEqual(cmd_ls(store, "sqlite:tasks.db", True, out, limit=3), 0)
        entries = json.loads(out.getvalue())
        self.assertEqual([entry["task_id"] for entry in entries], ["t11", "t10", "t09"])
        self.assertEqual(loads, ["t11", "t10", "t09"], "only the page's tasks are loaded")
        self.assertEqual([entry["status"] for entry in entries], ["DAMAGED", "running", "done"])
        out = io.StringIO()
        cmd_ls(store, "sqlite:tasks.db", True, out, statuses=["running"], limit=2)
        self.assertEqual([entry["task_id"] for entry in json.loads(out.getvalue())], ["t10", "t08"])
        loads.clear()
        out = io.StringIO()
        cmd_ls(store, "sqlite:tasks.db", True, out, statuses=["DAMAGED"])  # only a load tells: every task is loaded
        self.assertEqual([entry["task_id"] for entry in json.loads(out.getvalue())], ["t11"])
        self.assertEqual(len(loads), 12)

    def test_ls_of_an_empty_store(self) -> None:
        os.mkdir(self.store_dir)
        result = cli("ls", self.store_dir)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("no tasks", result.stdout)


class WrongArgumentsTest(CliCase):
    def test_usage_errors_exit_2(self) -> None:
        for args in ([], ["status"], ["status", self.tmp], ["approve", self.tmp], ["cancel"], ["ls"], ["frobnicate"],
                     ["status", self.tmp, "t", "--bogus"]):
            with self.subTest(args=args):
                self.assert_fails(cli(*args), 2, "usage:")

    def test_unknown_task_exits_2(self) -> None:
        self.finished_task()
        for command in ("status", "approve"):
            with self.subTest(command=command):
                self.assert_fails(cli(command, self.store_dir, "nosuch"), 2, "no task 'nosuch'")

    def test_missing_store_directory_exits_2(self) -> None:
        missing = self.path("no-such-dir")
        for args in (["status", missing, "t"], ["approve", missing, "t", "--yes"], ["cancel", missing, "t"], ["ls", missing]):
            with self.subTest(args=args):
                self.assert_fails(cli(*args), 2, "does not exist")
        self.assertFalse(os.path.exists(missing), "a read or a refused write created the store")

    def test_store_path_that_is_a_file_exits_2(self) -> None:
        with open(self.path("file"), "w") as handle:
            handle.write("x")
        self.assert_fails(cli("ls", self.path("file")), 2, "not a directory")

    def test_unsafe_task_ids_exit_2(self) -> None:
        self.finished_task()
        for task_id in ("../etc", "/etc", ".hidden", "a/b", ""):
            for command in ("status", "approve", "cancel"):
                with self.subTest(task_id=task_id, command=command):
                    self.assert_fails(cli(command, self.store_dir, task_id), 2, "not a safe name")
        self.assertEqual(sorted(n for n in os.listdir(self.store_dir) if not n.startswith(INDEX_FILE)), [".longrun-store", "finished"])


class SignedApprovalCliTest(CliCase):
    """``approve --sign-key`` and ``cancel --sign-key`` against runners that accept only signed records."""

    def setUp(self) -> None:
        super().setUp()
        from longrun.authority import generate_key_file

        self.key_file = self.path("approver.key")
        generate_key_file(self.key_file)

    def signed_runner(self, task_id: str, **sources) -> Runner:
        from longrun.authority import SignedApprovals, SignedCancellations, load_key

        key = load_key(self.key_file)
        store = JsonFileStore(self.store_dir, create=True)
        sources.setdefault("approvals", SignedApprovals(store, key))
        sources.setdefault("cancellations", SignedCancellations(store, key))
        return self.runner(task_id, self.approval_steps(), **sources)

    def approval_files(self, task_id: str = "gated") -> list[str]:
        return sorted(os.listdir(os.path.join(self.store_dir, task_id, "control", "approvals")))

    def test_a_signed_approval_from_the_cli_authorizes_once_and_an_unsigned_one_does_not(self) -> None:
        from longrun.authority import key_id, load_key

        self.assertIs(self.signed_runner("gated").run().status, Status.AWAITING_APPROVAL)
        unsigned = cli("approve", self.store_dir, "gated", "--yes", "--approver", "alice")
        self.assertEqual(unsigned.returncode, 0, unsigned.stderr)
        self.assertNotIn("signed", unsigned.stdout)
        outcome = self.signed_runner("gated").run()
        self.assertIs(outcome.status, Status.AWAITING_APPROVAL)
        self.assertTrue(any("not signed" in item.detail for item in outcome.unknowns))
        self.assertIn("--sign-key", outcome.next_action)
        self.assertEqual(OutboxAdapter(self.outbox).counts()["gated/publish"], 0)

        signed = cli("approve", self.store_dir, "gated", "--yes", "--approver", "alice", "--sign-key", self.key_file)
        self.assertEqual(signed.returncode, 0, signed.stderr)
        self.assertIn(f"signed       hmac-sha256 with key {key_id(load_key(self.key_file))}", signed.stdout)
        approval_id = next(line.split()[-1] for line in signed.stdout.splitlines() if "approval id" in line)
        with open(os.path.join(self.store_dir, "gated", "control", "approvals", f"{approval_id}.json")) as handle:
            self.assertTrue(json.load(handle)["signature"].startswith("hmac-sha256:"))
        adapter = OutboxAdapter(self.outbox)
        outcome = self.signed_runner("gated").run()
        self.assertIs(outcome.status, Status.DONE, outcome.next_action)
        self.assertEqual(adapter.counts(), {"gated/draft": 1, "gated/publish": 1})
        self.assertEqual(JsonFileStore(self.store_dir).load("gated").state.consumed_approvals, [approval_id])

    def test_a_key_file_others_can_read_or_a_missing_one_is_refused_and_nothing_is_written(self) -> None:
        self.awaiting_task()
        os.chmod(self.key_file, 0o644)
        for args, fragment in (
            (["approve", self.store_dir, "gated", "--yes", "--sign-key", self.key_file], "accessible by group or others"),
            (["cancel", self.store_dir, "gated", "--sign-key", self.key_file], "accessible by group or others"),
            (["approve", self.store_dir, "gated", "--yes", "--sign-key", self.path("no-key")], "cannot read key file"),
        ):
            with self.subTest(args=args):
                self.assert_fails(cli(*args), 2, fragment)
        self.assertEqual(self.approval_files(), [])
        self.assertFalse(os.path.exists(self.task_file("gated", os.path.join("control", "cancel.json"))))

    def test_signed_cancel_cancels_and_unsigned_cancel_stops_unsafe_without_ending_the_run(self) -> None:
        self.assertIs(self.signed_runner("gated").run().status, Status.AWAITING_APPROVAL)
        unsigned = cli("cancel", self.store_dir, "gated", "--by", "someone")
        self.assertEqual(unsigned.returncode, 0, unsigned.stderr)
        outcome = self.signed_runner("gated").run()
        self.assertIs(outcome.status, Status.UNSAFE_TO_CONTINUE)
        self.assertTrue(any("not signed" in item.detail for item in outcome.unknowns))
        self.assertIn("longrun cancel --sign-key", outcome.next_action)

        signed = cli("cancel", self.store_dir, "gated", "--by", "bob", "--reason", "wrong audience", "--sign-key", self.key_file)
        self.assertEqual(signed.returncode, 0, signed.stderr)
        self.assertIn("replacing an earlier record", signed.stdout)
        self.assertIn("signed  hmac-sha256 with key", signed.stdout)
        outcome = self.signed_runner("gated").run()
        self.assertIs(outcome.status, Status.CANCELLED)
        self.assertIn("cancelled by bob: wrong audience", outcome.next_action)
        self.assertEqual(OutboxAdapter(self.outbox).counts()["gated/publish"], 0)

    def test_approve_and_cancel_into_a_strict_control_root(self) -> None:
        import stat

        from longrun.authority import FileControlSource, SignedApprovals, SignedCancellations, load_key

        control = self.path("control")
        os.mkdir(control, 0o755)
        os.chmod(control, 0o755)
        key = load_key(self.key_file)
        source = FileControlSource(control, approver_uid=os.geteuid())
        sources = {"approvals": SignedApprovals(source, key), "cancellations": SignedCancellations(source, key)}
        self.assertIs(self.signed_runner("gated", **sources).run().status, Status.AWAITING_APPROVAL)

        approved = cli("approve", self.store_dir, "gated", "--yes", "--sign-key", self.key_file, "--control-root", control)
        self.assertEqual(approved.returncode, 0, approved.stderr)
        written = next(line.split()[-1] for line in approved.stdout.splitlines() if "written to" in line)
        self.assertTrue(written.startswith(os.path.join(control, "gated", "control", "approvals")))
        self.assertEqual(self.approval_files(), [], "nothing was written into the store")
        self.assertEqual(stat.S_IMODE(os.stat(written).st_mode), 0o644)
        self.assertEqual(stat.S_IMODE(os.stat(os.path.dirname(written)).st_mode), 0o755)
        self.assertIs(self.signed_runner("gated", **sources).run().status, Status.DONE)
        self.assertEqual(OutboxAdapter(self.outbox).counts()["gated/publish"], 1)

        self.awaiting_task("second")
        cancelled = cli("cancel", self.store_dir, "second", "--sign-key", self.key_file, "--control-root", control)
        self.assertEqual(cancelled.returncode, 0, cancelled.stderr)
        self.assertTrue(os.path.exists(os.path.join(control, "second", "control", "cancel.json")))
        self.assertIs(self.signed_runner("second", **sources).run().status, Status.CANCELLED)

        self.assert_fails(
            cli("approve", self.store_dir, "gated", "--yes", "--control-root", self.path("nowhere")), 2, "control root"
        )

    def test_help_documents_the_new_options(self) -> None:
        for command in ("approve", "cancel"):
            with self.subTest(command=command):
                result = cli(command, "--help")
                self.assertEqual(result.returncode, 0, result.stderr)
                self.assertIn("--sign-key FILE", result.stdout)
                self.assertIn("--control-root DIR", result.stdout)


if __name__ == "__main__":
    unittest.main()
