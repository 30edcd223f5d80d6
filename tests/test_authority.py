"""Authority: forged approvals and cancellations never act; genuine ones act exactly once.

Every forgery the issue names is tried against a real runner and a real outbox: unsigned, wrong
key, each signed field tampered, a replayed nonce, a wrong owner, group- and other-writable files
and directories, symlinked files and directories. Each must leave the gated effect unapplied and
put its reason in the outcome's observations and unknowns.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import unittest
from dataclasses import replace
from unittest import mock

from helpers import support
from longrun import (
    Approval,
    Cancellation,
    InvalidInputError,
    JsonFileStore,
    RunContract,
    Runner,
    RunOutcome,
    Status,
    Step,
)
from longrun.approval import ApprovalRequest, GateVerdict, evaluate_gate
from longrun.authority import (
    FileControlSource,
    RefusedRecord,
    SignedApprovals,
    SignedCancellations,
    generate_key_file,
    key_id,
    load_key,
    sign_approval,
    sign_cancellation,
    verify_approval,
    verify_cancellation,
)
from longrun.testing import FakeClock, OutboxAdapter

TASK = "task-1"
OTHER_UID = 65534  # "nobody": an account that is neither the approver nor root
APPROVER_UID = 1000
needs_root = unittest.skipUnless(hasattr(os, "geteuid") and os.geteuid() == 0, "chown to another uid needs root")


def write_json(path: str, body: object, mode: int = 0o644) -> None:
    with open(path, "w") as handle:
        json.dump(body, handle)
    os.chmod(path, mode)


def details(items) -> str:
    return "\n".join(item.detail for item in items)


class AuthorityCase(support.TempDirTest):
    steps = [Step("s0", "write", {"n": 0}), Step("s1", "write", {"n": 1}, approval=True)]

    def setUp(self) -> None:
        super().setUp()
        self.clock = FakeClock()
        self.store = JsonFileStore(self.path("store"), create=True)
        self.outbox = OutboxAdapter(self.path("outbox.jsonl"))
        self.key = secrets.token_bytes(32)
        self.control_root = self.path("control-root")
        os.mkdir(self.control_root, 0o755)
        os.chmod(self.control_root, 0o755)

    def runner(self, *, approvals=None, cancellations=None, steps=None, adapter=None) -> Runner:
        return Runner(
            RunContract(TASK, "write two lines, the second after an approval"),
            steps or self.steps,
            store=self.store,
            adapters={"write": adapter or self.outbox},
            clock=self.clock,
            approvals=approvals,
            cancellations=cancellations,
        )

    def pending(self, **sources) -> ApprovalRequest:
        outcome = self.runner(**sources).run()
        self.assertIs(outcome.status, Status.AWAITING_APPROVAL, outcome.next_action)
        state = self.store.load(TASK).state
        assert state is not None
        return state.approval_requests["s1"]

    def approval(self, request: ApprovalRequest, approval_id: str = "ap-1", **changes) -> Approval:
        now = self.clock.now()
        approval = Approval.for_request(request, approval_id=approval_id, approver="ops", granted_at=now, expires_at=now + 600)
        return replace(approval, **changes)

    def store_approvals_dir(self) -> str:
        return os.path.join(self.store.task_dir(TASK), "control", "approvals")

    def applied(self, step_id: str = "s1") -> int:
        return self.outbox.counts()[f"{TASK}/{step_id}"]

    def assert_not_authorized(self, outcome: RunOutcome, *fragments: str, status: Status = Status.AWAITING_APPROVAL) -> None:
        self.assertIs(outcome.status, status, outcome.next_action)
        self.assertEqual(self.applied(), 0, "a forged approval must never authorize the effect")
        state = self.store.load(TASK).state
        assert state is not None
        self.assertEqual(state.consumed_approvals, [])
        for fragment in fragments:
            self.assertIn(fragment, details(outcome.observations))
            self.assertIn(fragment, details(outcome.unknowns))


class KeyTests(support.TempDirTest):
    def test_generated_key_file_is_owner_only_and_loads(self) -> None:
        path = self.path("key")
        key = generate_key_file(path)
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o600)
        self.assertEqual(load_key(path), key)
        with self.assertRaises(InvalidInputError):
            generate_key_file(path)  # never overwrites a key
        self.assertEqual(load_key(path), key)

    def test_surrounding_whitespace_is_not_part_of_the_key_and_0400_is_accepted(self) -> None:
        path = self.path("key")
        with open(path, "w") as handle:
            handle.write("\n  " + "k" * 40 + "  \n")
        os.chmod(path, 0o400)
        self.assertEqual(load_key(path), b"k" * 40)

    def test_key_files_others_can_reach_or_that_are_odd_are_refused(self) -> None:
        good = self.path("good")
        generate_key_file(good)
        for mode, fragment in ((0o640, "group or others"), (0o604, "group or others"), (0o620, "group or others"), (0o601, "group or others")):
            with self.subTest(mode=oct(mode)):
                os.chmod(good, mode)
                with self.assertRaises(InvalidInputError) as caught:
                    load_key(good)
                self.assertIn(fragment, str(caught.exception))
        os.chmod(good, 0o600)
        os.symlink(good, self.path("link"))
        short = self.path("short")
        with open(short, "w") as handle:
            handle.write("too short")
        os.chmod(short, 0o600)
        for path, fragment in (
            (self.path("link"), "symbolic link"),
            (short, "at least 32"),
            (self.path("missing"), "cannot read"),
            (self.tmp, "not a regular file"),
        ):
            with self.subTest(path=path):
                with self.assertRaises(InvalidInputError) as caught:
                    load_key(path)
                self.assertIn(fragment, str(caught.exception))

    def test_signing_needs_a_real_key(self) -> None:
        request = ApprovalRequest("t", "sha256:p", "s", "sha256:d", "a", 0.0, 1.0)
        approval = Approval.for_request(request, approval_id="a", approver="o", granted_at=0.0, expires_at=1.0)
        for key in (b"", b"short", "a string, not bytes" * 3, None):
            with self.subTest(key=key), self.assertRaises(InvalidInputError):
                sign_approval(approval, key)  # type: ignore[arg-type]


class SignatureTests(unittest.TestCase):
    key = b"k" * 32
    request = ApprovalRequest("t", "sha256:plan", "s1", "sha256:payload", "send", requested_at=0.0, expires_at=100.0)

    def test_a_signature_survives_the_json_round_trip_even_with_integral_times(self) -> None:
        approval = Approval.for_request(self.request, approval_id="ap", approver="ops", granted_at=1, expires_at=50)  # type: ignore[arg-type]
        signed = sign_approval(approval, self.key)
        self.assertTrue(signed.signature.startswith(f"hmac-sha256:{key_id(self.key)}:"))
        back = Approval.from_json(json.loads(json.dumps(signed.to_json())))
        self.assertIsNone(verify_approval(back, self.key))
        self.assertNotIn("signature", approval.to_json(), "an unsigned record is written exactly as before")

    def test_every_signed_field_is_covered(self) -> None:
        signed = sign_approval(
            Approval.for_request(self.request, approval_id="ap", approver="ops", granted_at=1.0, expires_at=50.0), self.key
        )
        fields = signed.signed_fields()
        self.assertEqual(
            set(fields),
            {"approval_id", "task_id", "plan_digest", "step_id", "payload_digest", "action", "expires_at", "approver", "granted_at"},
        )
        for name, value in fields.items():
            with self.subTest(field=name):
                changed = replace(signed, **{name: value + 1.0 if isinstance(value, float) else value + "x"})
                self.assertIn("does not verify", verify_approval(changed, self.key) or "")

    def test_a_cancellation_signature_is_not_an_approval_signature(self) -> None:
        cancel = sign_cancellation(Cancellation("t", 1.0, "ops", "stop"), self.key)
        self.assertIsNone(verify_cancellation(cancel, self.key))
        approval = Approval.for_request(self.request, approval_id="ap", approver="ops", granted_at=1.0, expires_at=50.0)
        self.assertIsNotNone(verify_approval(replace(approval, signature=cancel.signature), self.key))
        for field, value in (("task_id", "u"), ("requested_at", 2.0), ("requested_by", "eve"), ("reason", "go on")):
            with self.subTest(field=field):
                self.assertIn("does not verify", verify_cancellation(replace(cancel, **{field: value}), self.key) or "")

    def test_malformed_signatures_are_refused_not_crashed_on(self) -> None:
        approval = Approval.for_request(self.request, approval_id="ap", approver="ops", granted_at=1.0, expires_at=50.0)
        for signature in ("", "hmac-sha256", "md5:0123456789abcdef:" + "0" * 64, "hmac-sha256:xyz:" + "0" * 64, "hmac-sha256:0123456789abcdef:é" * 2):
            with self.subTest(signature=signature):
                self.assertIn("malformed", verify_approval(replace(approval, signature=signature), self.key) or "")


class SignedApprovalTests(AuthorityCase):
    def signed_source(self, key: bytes | None = None) -> SignedApprovals:
        return SignedApprovals(self.store, key or self.key)

    def test_a_valid_signed_approval_authorizes_exactly_once(self) -> None:
        request = self.pending(approvals=self.signed_source())
        self.store.write_approval(sign_approval(self.approval(request), self.key))
        outcome = self.runner(approvals=self.signed_source()).run()
        self.assertIs(outcome.status, Status.DONE, outcome.next_action)
        self.assertEqual(self.applied(), 1)
        state = self.store.load(TASK).state
        assert state is not None
        self.assertEqual(state.consumed_approvals, ["ap-1"])
        self.assertEqual(state.effects["s1"].approval_id, "ap-1")
        self.assertIs(self.runner(approvals=self.signed_source()).run().status, Status.DONE)
        self.assertEqual(self.applied(), 1)

    def test_unsigned_approval_never_authorizes(self) -> None:
        request = self.pending(approvals=self.signed_source())
        self.store.write_approval(self.approval(request))
        outcome = self.runner(approvals=self.signed_source()).run()
        self.assert_not_authorized(outcome, "not signed", f"key {key_id(self.key)}")
        self.assertIn("--sign-key", outcome.next_action)
        self.assertIn("1 approval record refused", outcome.next_action)
        # The same record authorizes under the default source: the refusal is the signature check.
        self.assertIs(self.runner().run().status, Status.DONE)

    def test_an_approval_signed_with_another_key_never_authorizes(self) -> None:
        request = self.pending(approvals=self.signed_source())
        other = secrets.token_bytes(32)
        self.store.write_approval(sign_approval(self.approval(request), other))
        outcome = self.runner(approvals=self.signed_source()).run()
        self.assert_not_authorized(outcome, f"signed with key {key_id(other)}")

    def test_a_signed_approval_altered_in_any_field_never_authorizes(self) -> None:
        request = self.pending(approvals=self.signed_source())
        now = self.clock.now()
        # Each case: what the operator really signed, and the edit that makes it match the request.
        cases = {
            "task_id": ({"task_id": "task-2"}, {"task_id": TASK}),
            "plan_digest": ({"plan_digest": "sha256:" + "0" * 64}, {"plan_digest": request.plan_digest}),
            "step_id": ({"step_id": "s0"}, {"step_id": "s1"}),
            "payload_digest": ({"payload_digest": "sha256:" + "1" * 64}, {"payload_digest": request.payload_digest}),
            "action": ({"action": "delete"}, {"action": "write"}),
            "expires_at": ({"expires_at": now - 1}, {"expires_at": now + 600}),
            "approver": ({"approver": "ops"}, {"approver": "ceo"}),
            "approval_id (the nonce)": ({}, {"approval_id": "ap-fresh"}),
            "granted_at": ({}, {"granted_at": now + 1}),
        }
        for name, (signed_as, edit) in cases.items():
            with self.subTest(field=name):
                signed = sign_approval(self.approval(request, **signed_as), self.key)
                body = {**signed.to_json(), **edit}
                # Without the signature check this body would authorize the effect: the test bites.
                unsigned = ControlView(body)
                self.assertIs(evaluate_gate(request, [unsigned], set(), now).verdict, GateVerdict.GRANTED)
                path = os.path.join(self.store_approvals_dir(), "ap-forged.json")
                write_json(path, body)
                outcome = self.runner(approvals=self.signed_source()).run()
                self.assert_not_authorized(outcome, "does not verify")
                os.unlink(path)

    def test_a_malformed_signature_never_authorizes(self) -> None:
        request = self.pending(approvals=self.signed_source())
        body = {**self.approval(request).to_json(), "signature": "hmac-sha256:trust-me"}
        write_json(os.path.join(self.store_approvals_dir(), "ap-1.json"), body)
        self.assert_not_authorized(self.runner(approvals=self.signed_source()).run(), "malformed")

    def test_a_damaged_record_cannot_be_authenticated_and_an_unsigned_wildcard_cannot_block(self) -> None:
        request = self.pending(approvals=self.signed_source())
        with open(os.path.join(self.store_approvals_dir(), "junk.json"), "w") as handle:
            handle.write("{not json")
        wide = {**self.approval(request, approval_id="ap-wide").to_json(), "payload_digest": "*"}
        write_json(os.path.join(self.store_approvals_dir(), "ap-wide.json"), wide)
        outcome = self.runner(approvals=self.signed_source()).run()
        self.assert_not_authorized(outcome, "cannot be authenticated", "not signed")
        # A planted record is ignored, not obeyed: it cannot hold up a genuine signed approval.
        self.store.write_approval(sign_approval(self.approval(request), self.key))
        outcome = self.runner(approvals=self.signed_source()).run()
        self.assertIs(outcome.status, Status.DONE, outcome.next_action)
        self.assertEqual(self.applied(), 1)
        self.assertIn("not signed", details(outcome.observations))

    def test_a_consumed_nonce_never_authorizes_again(self) -> None:
        request = self.pending(approvals=self.signed_source())
        # The task's state already consumed ap-1 (as after an earlier authorization of this scope).
        lease = self.store.acquire_lease(TASK, "test-editor", 30, self.clock.now())
        state = self.store.load(TASK, lease=lease).state
        assert state is not None
        state.consumed_approvals.append("ap-1")
        self.store.commit(lease, state)
        self.store.release_lease(lease, self.clock.now())
        self.store.write_approval(sign_approval(self.approval(request), self.key))
        outcome = self.runner(approvals=self.signed_source()).run()
        self.assertIs(outcome.status, Status.AWAITING_APPROVAL)
        self.assertEqual(self.applied(), 0)
        self.assertIn("already consumed", details(outcome.unknowns))

    def test_a_signed_approval_copied_under_another_name_authorizes_once(self) -> None:
        steps = [Step("s1", "write", {"n": 1}, approval=True), Step("s2", "write", {"n": 1}, approval=True)]
        request = self.pending(approvals=self.signed_source(), steps=steps)
        signed = sign_approval(self.approval(request), self.key)
        self.store.write_approval(signed)
        write_json(os.path.join(self.store_approvals_dir(), "a-copy.json"), signed.to_json())
        # s2 has the same payload: a copy relabelled for s2 breaks the signature.
        write_json(os.path.join(self.store_approvals_dir(), "b-relabelled.json"), {**signed.to_json(), "step_id": "s2"})
        outcome = self.runner(approvals=self.signed_source(), steps=steps).run()
        self.assertIs(outcome.status, Status.AWAITING_APPROVAL, outcome.next_action)
        self.assertEqual(self.outbox.counts(), {f"{TASK}/s1": 1})
        state = self.store.load(TASK).state
        assert state is not None
        self.assertEqual(state.consumed_approvals, ["ap-1"])
        self.assertEqual(state.approval_requests["s2"].payload_digest, request.payload_digest)
        self.assertIn("does not verify", details(outcome.unknowns))

    def test_a_valid_signature_does_not_excuse_a_wrong_scope_or_expiry(self) -> None:
        request = self.pending(approvals=self.signed_source())
        now = self.clock.now()
        for name, change, fragment in (
            ("another task", {"task_id": "task-2"}, "task_id"),
            ("expired", {"expires_at": now - 1}, "expired"),
        ):
            with self.subTest(case=name):
                signed = sign_approval(self.approval(request, approval_id=f"ap-{len(name)}", **change), self.key)
                path = os.path.join(self.store_approvals_dir(), f"{signed.approval_id}.json")
                write_json(path, signed.to_json(), 0o600)
                outcome = self.runner(approvals=self.signed_source()).run()
                self.assertIs(outcome.status, Status.AWAITING_APPROVAL)
                self.assertEqual(self.applied(), 0)
                self.assertIn(fragment, details(outcome.unknowns))
                os.unlink(path)

    def test_sources_are_checked_when_the_runner_is_built(self) -> None:
        with self.assertRaises(InvalidInputError):
            self.runner(approvals=object())
        with self.assertRaises(InvalidInputError):
            self.runner(cancellations=object())
        with self.assertRaises(InvalidInputError):
            SignedApprovals(object(), self.key)  # type: ignore[arg-type]


class ControlView:
    """A stand-in ``ControlRecord`` for the gate: a body as it would be read."""

    def __init__(self, body: dict):
        self.name, self.body, self.error, self.digest = "view.json", body, None, ""


class StrictModeCase(AuthorityCase):
    """Approvals in a separate control root, read by a strict ``FileControlSource``."""

    def source(self, **options) -> FileControlSource:
        # The approver is this test process's account (root when the suite runs as root).
        options.setdefault("approver_uid", os.geteuid())
        return FileControlSource(self.control_root, **options)

    def task_dir(self) -> str:
        return os.path.join(self.control_root, TASK)

    def approvals_dir(self) -> str:
        return os.path.join(self.task_dir(), "control", "approvals")

    def approve(self, request: ApprovalRequest, approval_id: str = "ap-1") -> str:
        return self.source().write_approval(self.approval(request, approval_id))

    def assert_refused(self, *fragments: str, source: FileControlSource | None = None) -> None:
        outcome = self.runner(approvals=source or self.source()).run()
        self.assert_not_authorized(outcome, *fragments)


class StrictModeTests(StrictModeCase):
    def test_an_approval_the_approver_wrote_authorizes_once_and_files_are_laid_out_for_a_reader(self) -> None:
        request = self.pending(approvals=self.source())
        path = self.approve(request)
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o644)
        for directory in (self.task_dir(), os.path.dirname(self.approvals_dir()), self.approvals_dir()):
            self.assertEqual(stat.S_IMODE(os.stat(directory).st_mode), 0o755)
        outcome = self.runner(approvals=self.source()).run()
        self.assertIs(outcome.status, Status.DONE, outcome.next_action)
        self.assertEqual(self.applied(), 1)
        self.assertIs(self.runner(approvals=self.source()).run().status, Status.DONE)
        self.assertEqual(self.applied(), 1)

    def test_group_or_other_writable_files_and_directories_never_authorize(self) -> None:
        request = self.pending(approvals=self.source())
        path = self.approve(request)
        targets = {
            "file": path,
            "approvals directory": self.approvals_dir(),
            "control directory": os.path.dirname(self.approvals_dir()),
            "task directory": self.task_dir(),
            "control root": self.control_root,
        }
        for what, target in targets.items():
            original = stat.S_IMODE(os.stat(target).st_mode)
            for bit, who in ((stat.S_IWGRP, "group"), (stat.S_IWOTH, "others")):
                with self.subTest(what=what, writable_by=who):
                    os.chmod(target, original | bit)
                    try:
                        self.assert_refused(f"writable by {who}")
                    finally:
                        os.chmod(target, original)
        self.assertIs(self.runner(approvals=self.source()).run().status, Status.DONE, "restored modes authorize")

    def test_a_symlinked_approval_file_never_authorizes(self) -> None:
        request = self.pending(approvals=self.source())
        path = self.approve(request)
        elsewhere = self.path("elsewhere.json")
        os.replace(path, elsewhere)  # a genuine, approver-owned record, reached through a link
        os.symlink(elsewhere, path)
        self.assert_refused("symbolic link")

    def test_symlinked_directories_never_authorize(self) -> None:
        request = self.pending(approvals=self.source())
        self.approve(request)
        for what, target in (
            ("approvals directory", self.approvals_dir()),
            ("control directory", os.path.dirname(self.approvals_dir())),
            ("task directory", self.task_dir()),
        ):
            with self.subTest(what=what):
                real = self.path("real-" + what.replace(" ", "-"))
                os.replace(target, real)
                os.symlink(real, target)
                try:
                    self.assert_refused("is a symbolic link")
                finally:
                    os.unlink(target)
                    os.replace(real, target)
        linked_root = self.path("linked-root")
        os.symlink(self.control_root, linked_root)
        self.assert_refused("symbolic link", source=FileControlSource(linked_root, approver_uid=os.geteuid()))

    def test_a_missing_control_root_is_refused_rather_than_read_as_empty(self) -> None:
        self.pending(approvals=self.source())
        self.assert_refused("does not exist", source=FileControlSource(self.path("no-such-root"), approver_uid=os.geteuid()))

    def test_a_non_regular_file_is_refused(self) -> None:
        request = self.pending(approvals=self.source())
        self.approve(request, "ap-0")
        os.unlink(os.path.join(self.approvals_dir(), "ap-0.json"))
        os.mkdir(os.path.join(self.approvals_dir(), "ap-0.json"), 0o755)
        self.assert_refused("not a regular file")

    def test_strict_mode_also_guards_the_stores_own_control_area(self) -> None:
        store_source = FileControlSource(self.store.root, approver_uid=os.geteuid())
        request = self.pending(approvals=store_source)
        self.store.write_approval(self.approval(request))
        path = os.path.join(self.store_approvals_dir(), "ap-1.json")
        os.chmod(path, 0o660)
        self.assert_refused("writable by group", source=store_source)
        os.chmod(path, 0o600)
        self.assertIs(self.runner(approvals=store_source).run().status, Status.DONE)
        self.assertEqual(self.applied(), 1)

    def test_signatures_and_strict_mode_compose(self) -> None:
        both = SignedApprovals(self.source(), self.key)
        request = self.pending(approvals=both)
        self.source().write_approval(self.approval(request, "ap-unsigned"))
        outcome = self.runner(approvals=both).run()
        self.assert_not_authorized(outcome, "not signed")
        os.unlink(os.path.join(self.approvals_dir(), "ap-unsigned.json"))
        path = self.source().write_approval(sign_approval(self.approval(request), self.key))
        os.chmod(path, 0o666)
        self.assert_refused("writable by group and others", source=both)
        os.chmod(path, 0o644)
        self.assertIs(self.runner(approvals=both).run().status, Status.DONE)
        self.assertEqual(self.applied(), 1)

    def test_non_strict_mode_does_not_check_owners_or_modes(self) -> None:
        request = self.pending(approvals=self.source())
        path = self.approve(request)
        os.chmod(path, 0o666)
        self.assertIs(self.runner(approvals=self.source(strict=False)).run().status, Status.DONE)


@needs_root
class OwnershipTests(StrictModeCase):
    def chown_tree(self, uid: int) -> None:
        for directory, _, files in os.walk(self.control_root):
            os.chown(directory, uid, -1)
            for name in files:
                os.chown(os.path.join(directory, name), uid, -1)

    def test_a_file_owned_by_another_account_never_authorizes(self) -> None:
        request = self.pending(approvals=self.source())
        path = self.approve(request)
        os.chown(path, OTHER_UID, -1)
        self.assert_refused(f"owned by uid {OTHER_UID}")

    def test_a_directory_owned_by_another_account_never_authorizes(self) -> None:
        request = self.pending(approvals=self.source())
        self.approve(request)
        for target in (self.approvals_dir(), os.path.dirname(self.approvals_dir()), self.task_dir(), self.control_root):
            with self.subTest(directory=target):
                os.chown(target, OTHER_UID, -1)
                try:
                    self.assert_refused(f"owned by uid {OTHER_UID}")
                finally:
                    os.chown(target, 0, -1)

    def test_an_explicit_approver_account_and_root_are_accepted_and_no_one_else(self) -> None:
        source = FileControlSource(self.control_root, approver_uid=APPROVER_UID)
        request = self.pending(approvals=source)
        path = self.approve(request)
        self.chown_tree(APPROVER_UID)
        os.chown(path, OTHER_UID, -1)
        self.assert_refused(f"owned by uid {OTHER_UID}, not by the approver (uid {APPROVER_UID}) or root", source=source)
        os.chown(path, 0, -1)  # root is always trusted
        self.assertIs(self.runner(approvals=source).run().status, Status.DONE)
        self.assertEqual(self.applied(), 1)

    def test_by_default_the_approver_is_the_owner_of_the_control_root(self) -> None:
        source = FileControlSource(self.control_root)
        request = self.pending(approvals=source)
        path = self.approve(request)
        self.chown_tree(APPROVER_UID)
        os.chown(path, OTHER_UID, -1)
        self.assert_refused(f"not by the approver (uid {APPROVER_UID})", source=source)
        os.chown(path, APPROVER_UID, -1)
        self.assertIs(self.runner(approvals=source).run().status, Status.DONE)

    def test_by_default_a_control_root_owned_by_the_runners_own_account_is_refused(self) -> None:
        source = FileControlSource(self.control_root)
        request = self.pending(approvals=source)
        self.approve(request)
        self.chown_tree(APPROVER_UID)
        with mock.patch("longrun.stores.controlfiles.os.geteuid", return_value=APPROVER_UID):
            self.assert_refused("runner's own account", source=source)
            explicit = FileControlSource(self.control_root, approver_uid=APPROVER_UID)
            self.assertIs(self.runner(approvals=explicit).run().status, Status.DONE, "an explicit choice is honoured")


class AuthenticatedCancellationTests(AuthorityCase):
    def signed(self) -> SignedCancellations:
        return SignedCancellations(self.store, self.key)

    def cancel_path(self) -> str:
        return os.path.join(self.store.task_dir(TASK), "control", "cancel.json")

    def started(self) -> None:
        self.pending(cancellations=self.signed())

    def assert_stopped_unsafe_then_resumable(self, fragment: str) -> None:
        outcome = self.runner(cancellations=self.signed()).run()
        self.assertIs(outcome.status, Status.UNSAFE_TO_CONTINUE, outcome.next_action)
        self.assertIn(fragment, details(outcome.observations))
        self.assertIn(fragment, details(outcome.unknowns))
        self.assertIn("cancel.json", outcome.next_action)
        state = self.store.load(TASK).state
        assert state is not None
        self.assertIs(state.status, Status.UNSAFE_TO_CONTINUE, "not recorded as an operator's cancellation")
        self.assertEqual(self.applied("s1"), 0)
        # Not terminal: once the record is gone the run goes on to its approval point.
        os.unlink(self.cancel_path())
        self.assertIs(self.runner(cancellations=self.signed()).run().status, Status.AWAITING_APPROVAL)

    def test_a_signed_cancellation_cancels(self) -> None:
        self.started()
        self.store.write_cancellation(sign_cancellation(Cancellation(TASK, self.clock.now(), "ops", "wrong week"), self.key))
        outcome = self.runner(cancellations=self.signed()).run()
        self.assertIs(outcome.status, Status.CANCELLED)
        self.assertIn("cancelled by ops: wrong week", outcome.next_action)

    def test_a_signed_cancellation_is_read_before_every_new_effect(self) -> None:
        steps = [Step(f"s{i}", "write", {"n": i}) for i in range(3)]
        outbox = OutboxAdapter(self.path("outbox.jsonl"))
        original_apply = outbox.apply

        def apply_then_cancel(request):
            receipt = original_apply(request)
            self.store.write_cancellation(sign_cancellation(Cancellation(TASK, self.clock.now(), "ops", "stop"), self.key))
            return receipt

        outbox.apply = apply_then_cancel  # type: ignore[method-assign]
        outcome = self.runner(cancellations=self.signed(), steps=steps, adapter=outbox).run()
        self.assertIs(outcome.status, Status.CANCELLED)
        self.assertEqual(self.outbox.counts(), {f"{TASK}/s0": 1})

    def test_an_unsigned_cancellation_stops_unsafe_but_does_not_end_the_run(self) -> None:
        self.started()
        self.store.write_cancellation(Cancellation(TASK, self.clock.now(), "agent", "let me approve myself"))
        self.assert_stopped_unsafe_then_resumable("not signed")

    def test_a_cancellation_signed_with_another_key_stops_unsafe(self) -> None:
        self.started()
        other = secrets.token_bytes(32)
        self.store.write_cancellation(sign_cancellation(Cancellation(TASK, self.clock.now(), "ops", "x"), other))
        self.assert_stopped_unsafe_then_resumable(f"signed with key {key_id(other)}")

    def test_a_tampered_cancellation_stops_unsafe(self) -> None:
        self.started()
        signed = sign_cancellation(Cancellation(TASK, self.clock.now(), "ops", "pause"), self.key)
        write_json(self.cancel_path(), {**signed.to_json(), "requested_by": "the-ceo"}, 0o600)
        self.assert_stopped_unsafe_then_resumable("does not verify")

    def test_a_damaged_cancellation_cannot_be_authenticated_and_stops_unsafe(self) -> None:
        self.started()
        with open(self.cancel_path(), "w") as handle:
            handle.write("{not json")
        self.assert_stopped_unsafe_then_resumable("cannot be authenticated")

    def test_a_cancellation_signed_for_another_task_stops_unsafe(self) -> None:
        self.started()
        signed = sign_cancellation(Cancellation("task-2", self.clock.now(), "ops", "stop task 2"), self.key)
        write_json(self.cancel_path(), signed.to_json(), 0o600)
        self.assert_stopped_unsafe_then_resumable("signed for task 'task-2'")


class StrictCancellationTests(StrictModeCase):
    def cancel_path(self) -> str:
        return os.path.join(self.task_dir(), "control", "cancel.json")

    def test_a_cancellation_the_approver_wrote_cancels(self) -> None:
        self.pending(cancellations=self.source())
        path = self.source().write_cancellation(Cancellation(TASK, self.clock.now(), "ops", "stop"))
        self.assertEqual(path, self.cancel_path())
        outcome = self.runner(cancellations=self.source()).run()
        self.assertIs(outcome.status, Status.CANCELLED)

    def test_a_trusted_but_damaged_cancellation_stops_without_ending_the_run(self) -> None:
        self.pending(cancellations=self.source())
        self.source().write_cancellation(Cancellation(TASK, self.clock.now(), "ops", "stop"))
        with open(self.cancel_path(), "w") as handle:
            handle.write("{damaged")
        outcome = self.runner(cancellations=self.source()).run()
        self.assertIs(outcome.status, Status.UNSAFE_TO_CONTINUE)
        self.assertTrue(any("damaged" in item.detail for item in outcome.unknowns))

    def test_a_cancellation_in_an_untrusted_place_stops_unsafe_not_cancelled(self) -> None:
        self.pending(cancellations=self.source())
        self.source().write_cancellation(Cancellation(TASK, self.clock.now(), "ops", "stop"))
        os.chmod(self.cancel_path(), 0o646)
        outcome = self.runner(cancellations=self.source()).run()
        self.assertIs(outcome.status, Status.UNSAFE_TO_CONTINUE)
        self.assertIn("writable by others", details(outcome.unknowns))
        self.assertIn("writable by others", details(outcome.observations))
        os.chmod(self.cancel_path(), 0o644)
        self.assertIs(self.runner(cancellations=self.source()).run().status, Status.CANCELLED)

    def test_a_tampered_control_directory_stops_the_run_before_any_effect(self) -> None:
        os.makedirs(os.path.join(self.task_dir(), "control"))
        os.chmod(self.task_dir(), 0o755)
        real = self.path("real-control")
        os.replace(os.path.join(self.task_dir(), "control"), real)
        os.symlink(real, os.path.join(self.task_dir(), "control"))
        outcome = self.runner(cancellations=self.source()).run()
        self.assertIs(outcome.status, Status.UNSAFE_TO_CONTINUE)
        self.assertEqual(self.outbox.counts(), {})
        self.assertIn("symbolic link", details(outcome.unknowns))

    @needs_root
    def test_a_cancellation_owned_by_another_account_stops_unsafe(self) -> None:
        self.pending(cancellations=self.source())
        self.source().write_cancellation(Cancellation(TASK, self.clock.now(), "ops", "stop"))
        os.chown(self.cancel_path(), OTHER_UID, -1)
        outcome = self.runner(cancellations=self.source()).run()
        self.assertIs(outcome.status, Status.UNSAFE_TO_CONTINUE)
        self.assertIn(f"owned by uid {OTHER_UID}", details(outcome.unknowns))



class GateTests(unittest.TestCase):
    def test_refused_records_reach_the_gate_as_not_used(self) -> None:
        request = ApprovalRequest(TASK, "sha256:p", "s1", "sha256:d", "write", 0.0, 100.0)
        refused = RefusedRecord(name="approvals/x.json", error="file is owned by uid 7")
        decision = evaluate_gate(request, [refused], set(), 1.0)
        self.assertIs(decision.verdict, GateVerdict.AWAITING)
        self.assertIn("owned by uid 7", decision.reasons[0])


if __name__ == "__main__":
    unittest.main()
