"""Every loader fed generated malformed documents: only typed errors, and read-only loads change nothing.

Fixed seeds, so a failure names a case that fails again. The default run feeds ``DEFAULT_CASES``
documents spread over the loaders (``SHARES``): ``FULL_CASES`` (10,000) under ``LONGRUN_TEST_SCALE=full``,
a quarter of that otherwise; ``LONGRUN_FUZZ_CASES=N`` feeds N instead (more for a
long run, fewer for a quick one), and ``LONGRUN_FUZZ_SEED=K`` another fixed set. Documents are mutations of valid ones (``fuzzgen``): fields
deleted, duplicated, renamed, added or retyped, edge-case values (NaN, 1e999, 5000-digit and 2**63
integers, NUL, lone surrogates, huge strings, deep nesting), wrong schema versions, and byte-level
damage (truncation, bit flips, invalid UTF-8, a BOM, UTF-16, random bytes). Half of the structural
mutations of checksummed documents get a valid checksum, so they reach the field checks.

The assertions:

- a loader returns, or raises a ``LongrunError`` of the hardened-input kinds (``TYPED``); any other
  exception fails the test with the loader, the case number and the document;
- whatever a loader accepts can be written back (encoded) and read again: accepting a value the
  writer then chokes on (NaN, a lone surrogate, a huge integer) is a bug too;
- store-level reads (``JsonFileStore.load`` without a lease, ``read_lease``, ``read_cancellation``,
  ``read_approvals``, ``list_tasks``, ``FileControlSource``, the SQLite store, the read-only CLI
  commands) leave every path, mode and byte as they were.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import logging
import os
import random
import shutil
import sqlite3
import stat
import sys
import unittest
from typing import Any, Callable

from helpers import scale, support
from helpers.fuzzgen import dumps, mutate_bytes, mutate_value

from longrun.stores.jsonfile import INDEX_FILE
from longrun import envelope
from longrun.approval import Approval, ApprovalRequest, evaluate_gate
from longrun.authority import FileControlSource, SignedApprovals, SignedCancellations, load_key
from longrun.budget import BudgetCounters
from longrun.cancellation import Cancellation
from longrun.canonical import canonical_bytes, parse_json, sha256_hex
from longrun.cli import main as cli_main
from longrun.control import ControlRecord
from longrun.errors import (
    CorruptStateError,
    ForeignStateError,
    InvalidInputError,
    SchemaVersionError,
    StateUnrecoverableError,
    StorageError,
)
from longrun.lease import Lease
from longrun.ledger import EffectRecord
from longrun.outcome import Evidence, Status
from longrun.stores import _journal
from longrun.stores.jsonfile import JsonFileStore
from longrun.stores.sqlite import SqliteStore
from longrun.testing.store_contract import sample_state

TYPED = (CorruptStateError, SchemaVersionError, ForeignStateError, StateUnrecoverableError, InvalidInputError, StorageError)
"""What a loader may raise. ``CorruptStateError`` covers its three subclasses; they are named for the reader."""

FULL_CASES = 10_000
DEFAULT_CASES = scale.scaled(FULL_CASES // 4, FULL_CASES)
CASES = int(os.environ.get("LONGRUN_FUZZ_CASES", DEFAULT_CASES))
SEED_OFFSET = 1000 * int(os.environ.get("LONGRUN_FUZZ_SEED", 0))
"""``LONGRUN_FUZZ_SEED=K`` runs another fixed set of documents (K = 0, the default, is CI's set)."""
SHARES = {
    "envelope": 0.15,
    "snapshot": 0.15,
    "journal": 0.15,
    "records": 0.20,
    "jsonfile_store": 0.16,
    "control_source": 0.08,
    "sqlite_store": 0.05,
    "cli_arguments": 0.03,
    "key_files": 0.03,
}
TASK = "fuzz-task"
KEY = b"k" * 40


def cases_for(loader: str) -> int:
    return max(1, round(CASES * SHARES[loader]))


FED: dict[str, int] = {}
"""Documents fed per loader in this run (read by the count test and by anyone debugging)."""


def frame_text(text: str) -> bytes:
    """A framed line for JSON text as is (which may hold NaN or duplicate keys): a valid checksum."""
    body = text.encode("utf-8", "surrogatepass")
    return _journal.checksum(body) + b" " + body + b"\n"


def lenient_checksum(text: str, rng: random.Random) -> str:
    """The checksum a writer would put beside the value ``text`` parses to, if it has one."""
    try:
        return "sha256:" + sha256_hex(canonical_bytes(json.loads(text)))
    except (ValueError, RecursionError, TypeError):
        return "sha256:" + "%064x" % rng.getrandbits(256)


class FuzzCase(support.TempDirTest):

    def setUp(self) -> None:
        super().setUp()
        logger = logging.getLogger("longrun")
        previous = logger.level
        logger.setLevel(logging.CRITICAL)  # recoveries log warnings: thousands of them
        self.addCleanup(logger.setLevel, previous)

    def typed(self, loader: str, case: int, document: object, call: Callable[[], Any]) -> Any:
        """``call()``'s result, or None if it raised a typed error; anything else fails the test."""
        try:
            return call()
        except TYPED:
            return None
        except Exception as exc:  # the point of the test: nothing else may escape
            self.fail(f"{loader} case {case}: {type(exc).__name__}: {str(exc)[:300]}\n  document: {document!r:.600}")

    def fed(self, loader: str, count: int) -> None:
        FED[loader] = FED.get(loader, 0) + count


# -- pure decoders ------------------------------------------------------------------------------


class DecoderFuzzTests(FuzzCase):
    def test_envelope_decode(self) -> None:
        rng = random.Random(1001 + SEED_OFFSET)
        state = sample_state(TASK, effects=4)
        state.revision = 3
        base = envelope.encode(state)
        document = json.loads(base)
        count = cases_for("envelope")
        for case in range(count):
            mode = rng.randrange(4)
            if mode == 0:
                data = mutate_bytes(base, rng)
            elif mode == 1:
                data = dumps(mutate_value(document, rng)).encode("utf-8", "surrogatepass")
            else:
                body_text = dumps(mutate_value(document["state"], rng, rounds=rng.randint(1, 2)))
                checksum = lenient_checksum(body_text, rng) if mode == 2 else document["checksum"]
                data = (
                    '{"checksum":%s,"format":"longrun.state","schema_version":%s,"state":%s}'
                    % (json.dumps(checksum), rng.choice(["1", "1", "1", "2", "1.0", "true", '"1"']), body_text)
                ).encode("utf-8", "surrogatepass")
            decoded = self.typed("envelope", case, data, lambda: envelope.decode(data, expected_task=TASK))
            if decoded is not None:
                again = self.typed("envelope (re-encoded)", case, data, lambda: envelope.decode(envelope.encode(decoded)))
                self.assertIsNotNone(again, f"envelope case {case}: accepted state does not load again once written")
        self.fed("envelope", count)

    def snapshot_lines(self) -> list[bytes]:
        state = sample_state(TASK, effects=5)
        state.revision = 4
        return _journal.encode_snapshot(state)

    def load_snapshot(self, data: bytes) -> Any:
        raw = _journal.decode_snapshot(data, task_id=TASK)
        state = _journal.Replay(raw).build()
        state.revision = raw.revision
        return state

    def test_snapshot_decode(self) -> None:
        rng = random.Random(1002 + SEED_OFFSET)
        lines = self.snapshot_lines()
        base = b"".join(lines)
        meta = json.loads(lines[0])
        count = cases_for("snapshot")
        for case in range(count):
            mode = rng.randrange(4)
            if mode == 0:
                data = mutate_bytes(base, rng)
            elif mode == 1:  # the meta, with a checksum that matches what it says
                fields = mutate_value({key: value for key, value in meta.items() if key != "checksum"}, rng)
                text = dumps(fields)
                if isinstance(fields, dict) and rng.random() < 0.8:
                    text = text[:-1] + (',' if fields else '') + '"checksum":%s}' % json.dumps(lenient_checksum(text, rng))
                data = text.encode("utf-8", "surrogatepass") + b"\n" + b"".join(lines[1:])
            else:  # the header or a row line, re-framed with a valid checksum
                index = 1 if mode == 2 else rng.randrange(1, len(lines))
                value = json.loads(lines[index][_journal.CHECKSUM_HEX + 1 :])
                changed = frame_text(dumps(mutate_value(value, rng, rounds=rng.randint(1, 2))))
                data = b"".join(lines[:index]) + changed + b"".join(lines[index + 1 :])
            state = self.typed("snapshot", case, data, lambda: self.load_snapshot(data))
            if state is not None:
                written = self.typed("snapshot (re-encoded)", case, data, lambda: b"".join(_journal.encode_snapshot(state)))
                self.assertIsNotNone(written, f"snapshot case {case}: an accepted state cannot be written")
                self.assertIsNotNone(self.typed("snapshot (reloaded)", case, written, lambda: self.load_snapshot(written)))
        self.fed("snapshot", count)

    def journal_records(self) -> tuple[bytes, list[bytes]]:
        """A snapshot and the framed records of a few commits after it."""
        state = sample_state(TASK, effects=4)
        state.revision = 1
        snapshot = b"".join(_journal.encode_snapshot(state))
        shadow = _journal.Shadow(state)
        frames = []
        for revision in range(2, 7):
            state.revision = revision
            step_id = f"step-{revision % 4:03d}"
            state.effects[step_id] = dataclasses.replace(
                state.effects[step_id], attempts=revision, result={"r": revision}, updated_at=float(revision)
            )
            if revision == 3:
                state.effects["step-new"] = EffectRecord(f"{TASK}/step-new", "step-new", "write", {"n": 1}, "sha256:" + "1" * 64)
            state.note_control(Evidence("control", f"read {revision}", float(revision)))
            state.next_action = f"next {revision}"
            state.status = Status.RUNNING if revision % 2 else Status.AWAITING_APPROVAL
            record = shadow.record_for(state, {step_id, "step-new"})
            assert record is not None
            frames.append(_journal.frame(record))
        return snapshot, frames

    def replay(self, snapshot: bytes, data: bytes) -> Any:
        found = _journal.scan(data, padded=True)
        if found.meta is None:
            return None
        base = _journal.journal_base(found.meta, task_id=TASK)
        replay = _journal.Replay(_journal.decode_snapshot(snapshot, task_id=TASK))
        if base != replay.revision:
            return None
        replay.apply_all(found.bodies)
        state = replay.build()
        state.revision = replay.revision
        return state

    def test_journal_replay(self) -> None:
        rng = random.Random(1003 + SEED_OFFSET)
        snapshot, frames = self.journal_records()
        meta = _journal.encode_journal_meta(TASK, 1)
        base = meta + b"".join(frames) + bytes(64)
        count = cases_for("journal")
        for case in range(count):
            mode = rng.randrange(4)
            if mode == 0:
                data = mutate_bytes(base, rng)
            elif mode == 1:
                fields = mutate_value({k: v for k, v in json.loads(meta).items() if k != "checksum"}, rng)
                text = dumps(fields)
                if isinstance(fields, dict):
                    text = text[:-1] + (',' if fields else '') + '"checksum":%s}' % json.dumps(lenient_checksum(text, rng))
                data = text.encode("utf-8", "surrogatepass") + b"\n" + b"".join(frames)
            else:
                index = rng.randrange(len(frames))
                value = json.loads(frames[index][_journal.CHECKSUM_HEX + 1 :])
                changed = frame_text(dumps(mutate_value(value, rng, rounds=rng.randint(1, 3))))
                data = meta + b"".join(frames[:index]) + changed + b"".join(frames[index + 1 :]) + bytes(rng.choice([0, 64]))
            state = self.typed("journal", case, data, lambda: self.replay(snapshot, data))
            if state is not None:
                written = self.typed("journal (re-encoded)", case, data, lambda: b"".join(_journal.encode_snapshot(state)))
                self.assertIsNotNone(written, f"journal case {case}: an accepted state cannot be written")
                self.assertIsNotNone(
                    self.typed("journal (reloaded)", case, written, lambda: self.load_snapshot(written)),
                    f"journal case {case}: an accepted state does not load again once written",
                )
        self.fed("journal", count)

    def test_records_and_the_gate(self) -> None:
        rng = random.Random(1004 + SEED_OFFSET)
        state = sample_state(TASK, effects=2)
        request = ApprovalRequest(TASK, state.plan_digest, "step-001", "sha256:" + "2" * 64, "write", 10.0, 9e9)
        approval = Approval.for_request(request, approval_id="ap-1", approver="op", granted_at=11.0, expires_at=9e9)
        cancellation = Cancellation(TASK, 12.0, "op", "stop")
        kinds: list[tuple[str, dict[str, Any], Callable[[Any], Any]]] = [
            ("lease", Lease(TASK, "me", 3, 1.0, 2.0, token="ab" * 16, holder_lock="boot:x/1/2").to_json(), Lease.from_json),
            ("approval", approval.to_json(), Approval.from_json),
            ("approval request", request.to_json(), ApprovalRequest.from_json),
            ("cancellation", cancellation.to_json(), Cancellation.from_json),
            ("effect record", state.effects["step-001"].to_json(), EffectRecord.from_json),
            ("evidence", Evidence("s", "d", 1.0).to_json(), Evidence.from_json),
            ("budget", state.budget.to_json(), BudgetCounters.from_json),
            ("state", state.to_json(), envelope.RunState.from_json),
        ]
        signed_approvals = SignedApprovals(_Records(), KEY)
        signed_cancellations = SignedCancellations(_Records(), KEY)
        count = cases_for("records")
        for case in range(count):
            name, base, from_json = kinds[case % len(kinds)]
            if rng.random() < 0.25:
                data = mutate_bytes(canonical_bytes(base), rng)
            else:
                data = dumps(mutate_value(base, rng, rounds=rng.randint(1, 2))).encode("utf-8", "surrogatepass")
            body = self.typed(name, case, data, lambda: parse_json(data, what=name, max_bytes=64 * 1024, unique_keys=True))
            record = None if body is None else self.typed(name, case, data, lambda: from_json(body))
            if record is not None:
                written = self.typed(name + " (re-encoded)", case, data, lambda: canonical_bytes(record.to_json()))
                self.assertIsNotNone(written, f"{name} case {case}: an accepted record cannot be written")
                self.assertEqual(from_json(json.loads(written)), record)
            raw = ControlRecord(name=f"{name}.json", body=body, error=None if body is not None else "damaged")
            # The gate and the signature checks judge records; they never raise, typed or not.
            try:
                evaluate_gate(request, [raw], set(), 100.0)
                signed_approvals._judge(raw)
                _Records.cancellation = raw
                signed_cancellations.read_cancellation(TASK)
            except Exception as exc:
                self.fail(f"{name} case {case}: judging raised {type(exc).__name__}: {exc}\n  document: {data!r:.600}")
        self.fed("records", count)


class _Records:
    """An approval and cancellation source that hands over what the test put in."""

    cancellation: ControlRecord | None = None

    def read_approvals(self, task_id: str) -> tuple[ControlRecord, ...]:
        return ()

    def read_cancellation(self, task_id: str) -> ControlRecord | None:
        return self.cancellation


# -- store-level loads: files planted, nothing changed ----------------------------------------------


def fingerprint(root: str) -> dict[str, tuple]:
    """Every path under ``root`` with its type, mode and content (bytes digest or link target);
    the JSON-file store's summary index aside: a cache of the task files that a listing refreshes
    (``ls`` reads a damaged task's files and records it as unreadable there), never a task file."""
    found = {}
    for directory, names, files in os.walk(root, followlinks=False):
        for name in names + files:
            if name.startswith(INDEX_FILE):
                continue
            path = os.path.join(directory, name)
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode):
                with open(path, "rb") as handle:
                    content: object = hashlib.sha256(handle.read()).hexdigest()
            elif stat.S_ISLNK(info.st_mode):
                content = os.readlink(path)
            else:
                content = None
            found[os.path.relpath(path, root)] = (stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode), content)
    return found


class Planter:
    """Puts a damaged version of one file in place (or plants a new one), and takes it away again."""

    def __init__(self, directory: str, outside: str, rng: random.Random):
        self.directory, self.outside, self.rng = directory, outside, rng
        self.originals: dict[str, bytes] = {}
        self.modes: dict[str, int] = {}
        for directory_path, _, files in os.walk(directory):
            for name in files:
                path = os.path.join(directory_path, name)
                with open(path, "rb") as handle:
                    self.originals[os.path.relpath(path, directory)] = handle.read()
                self.modes[os.path.relpath(path, directory)] = stat.S_IMODE(os.lstat(path).st_mode)
        self.planted: list[str] = []
        self.replaced: list[str] = []
        self.linked: list[tuple[str, str]] = []

    def write(self, relative: str, data: bytes) -> None:
        path = os.path.join(self.directory, relative)
        if os.path.lexists(path):
            self._remove(path)
        with open(path, "wb") as handle:
            handle.write(data)
        os.chmod(path, self.modes.get(relative, 0o600))

    def link_directory(self, relative: str) -> None:
        """Move a directory out and put a link to a copy of it in its place."""
        path = os.path.join(self.directory, relative)
        aside = os.path.join(self.outside, f"aside-{self.rng.randrange(10**9)}")
        shutil.copytree(path, aside + "-copy", symlinks=True)
        os.rename(path, aside)
        os.symlink(aside + "-copy", path)
        self.linked.append((relative, aside))

    def plant(self, relative: str, kind: str, data: bytes) -> None:
        """Put ``kind`` ("file", "symlink", "fifo", "dir", "empty-dir") at ``relative``."""
        path = os.path.join(self.directory, relative)
        (self.replaced if relative in self.originals else self.planted).append(relative)
        if os.path.lexists(path):
            self._remove(path)
        if kind == "file":
            self.write(relative, data)
        elif kind == "symlink":
            target = os.path.join(self.outside, f"target-{len(self.planted)}-{self.rng.randrange(10**9)}")
            with open(target, "wb") as handle:
                handle.write(data)
            os.symlink(target, path)
        elif kind == "fifo":
            os.mkfifo(path, 0o600)
        else:
            os.mkdir(path, 0o700)
            if kind == "dir":
                with open(os.path.join(path, "inside.json"), "wb") as handle:
                    handle.write(data)

    def _remove(self, path: str) -> None:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)

    def restore(self) -> None:
        for relative, aside in reversed(self.linked):
            path = os.path.join(self.directory, relative)
            os.unlink(path)
            os.rename(aside, path)
        self.linked = []
        for relative in self.planted:
            path = os.path.join(self.directory, relative)
            if os.path.lexists(path):
                self._remove(path)
        for relative in self.replaced:
            self.write(relative, self.originals[relative])
        self.planted, self.replaced = [], []


def damaged_copy(original: bytes, relative: str, rng: random.Random) -> bytes:
    """A damaged version of a store file: bytes damage, or a structural change that keeps checksums valid."""
    if rng.random() < 0.35 or not original:
        return mutate_bytes(original, rng)
    lines = original.split(b"\n")
    name = os.path.basename(relative)
    if name.startswith(("state.json", "journal.")) and len(lines) > 1:
        index = rng.randrange(len(lines) - 1)
        if index == 0:
            meta = json.loads(lines[0]) if lines[0].startswith(b"{") else {}
            fields = mutate_value({key: value for key, value in meta.items() if key != "checksum"}, rng)
            text = dumps(fields)
            if isinstance(fields, dict):
                text = text[:-1] + (',' if fields else '') + '"checksum":%s}' % json.dumps(lenient_checksum(text, rng))
            lines[0] = text.encode("utf-8", "surrogatepass")
        else:
            body = lines[index][_journal.CHECKSUM_HEX + 1 :].split(b"\0")[0]
            try:
                value = json.loads(body)
            except ValueError:
                return mutate_bytes(original, rng)
            lines[index] = frame_text(dumps(mutate_value(value, rng, rounds=rng.randint(1, 2))))[:-1]
        return b"\n".join(lines)
    try:
        value = json.loads(original)
    except ValueError:
        return mutate_bytes(original, rng)
    return dumps(mutate_value(value, rng, rounds=rng.randint(1, 2))).encode("utf-8", "surrogatepass")


class JsonFileStoreFuzzTests(FuzzCase):
    def setUp(self) -> None:
        super().setUp()
        self.root = self.path("store")
        self.outside = self.path("outside")
        os.mkdir(self.outside)
        store = JsonFileStore(self.root, create=True)
        lease = store.acquire_lease(TASK, "me", 3600.0, 1000.0)
        store.load(TASK, lease=lease)
        state = sample_state(TASK, effects=4)
        for revision in range(3):
            record = state.effects["step-001"]
            state.effects["step-001"] = dataclasses.replace(record, attempts=record.attempts + 1, updated_at=2000.0 + revision)
            state.next_action = f"next {revision}"
            store.commit(lease, state, {"step-001"})
        request = ApprovalRequest(TASK, state.plan_digest, "step-001", "sha256:" + "2" * 64, "write", 10.0, 9e9)
        store.write_approval(Approval.for_request(request, approval_id="ap-1", approver="op", granted_at=11.0, expires_at=9e9))
        store.write_cancellation(Cancellation(TASK, 12.0, "op", "stop"))
        store.close()
        self.directory = os.path.join(self.root, TASK)
        self.pristine = fingerprint(self.root)
        self.assertIn(os.path.join(TASK, "state.json.bak"), self.pristine)

    def read_everything(self, case: int, document: object) -> None:
        store = JsonFileStore(self.root)
        self.typed("store.load", case, document, lambda: store.load(TASK))
        self.typed("store.read_lease", case, document, lambda: store.read_lease(TASK))
        cancellation = self.typed("store.read_cancellation", case, document, lambda: store.read_cancellation(TASK))
        approvals = self.typed("store.read_approvals", case, document, lambda: store.read_approvals(TASK))
        self.typed("store.list_tasks", case, document, store.list_tasks)
        if cancellation is not None and cancellation.body is not None:
            self.typed("cancellation record", case, document, lambda: Cancellation.from_json(cancellation.body))
        for record in approvals or ():
            if record.body is not None:
                self.typed("approval record", case, document, lambda: Approval.from_json(record.body))

    def test_read_only_loads_of_planted_files_change_nothing(self) -> None:
        rng = random.Random(1005 + SEED_OFFSET)
        planter = Planter(self.directory, self.outside, rng)
        names = sorted(planter.originals)
        names.remove("lock")
        count = cases_for("jsonfile_store")
        for case in range(count):
            relative = rng.choice(names)
            original = planter.originals[relative]
            roll = rng.random()
            if roll < 0.80:
                planter.plant(relative, "file", damaged_copy(original, relative, rng))
            elif roll < 0.86:
                planter.plant(relative, rng.choice(["symlink", "fifo", "dir", "empty-dir"]), original)
            elif roll < 0.92:  # a stray journal, a stray approval file
                stray = rng.choice(["journal.99.log", "journal.0.log", "journal.4.log", os.path.join("control", "approvals", "zz.json")])
                source = planter.originals[rng.choice(names)]
                planter.plant(stray, rng.choice(["file", "file", "symlink", "fifo"]), damaged_copy(source, stray, rng))
            else:  # a directory replaced by a link that leads out of the task directory
                planter.link_directory(rng.choice(["control", os.path.join("control", "approvals"), "quarantine"]))
            before = fingerprint(self.root)
            self.read_everything(case, (relative, roll))
            if case % 25 == 0:
                self.run_cli(case, relative)
            self.assertEqual(fingerprint(self.root), before, f"jsonfile_store case {case} ({relative}): a read-only load changed files")
            planter.restore()
            self.assertEqual(fingerprint(self.root), self.pristine, f"case {case}: the test did not restore the store")
        self.fed("jsonfile_store", count)

    def run_cli(self, case: int, relative: str) -> None:
        for command in (["status"], ["verify"], ["history"], ["ls"]):
            argv = [*command, self.root] + ([TASK] if command != ["ls"] else []) + ["--json"]
            code = run_cli(argv)
            self.assertIn(code, (0, 1, 2, 3, 4), f"jsonfile_store case {case} ({relative}): longrun {' '.join(argv)} exited {code}")


def run_cli(argv: list[str], stdin: str = "n\n") -> int:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _stdin(stdin):
        return cli_main(argv)


@contextlib.contextmanager
def _stdin(text: str):  # type: ignore[no-untyped-def]
    previous = sys.stdin
    sys.stdin = io.StringIO(text)
    try:
        yield
    finally:
        sys.stdin = previous


class ControlSourceFuzzTests(FuzzCase):
    def test_file_control_source_reads_change_nothing(self) -> None:
        rng = random.Random(1006 + SEED_OFFSET)
        root = self.path("control-root")
        os.mkdir(root, 0o755)
        writer = FileControlSource(root, strict=False)
        request = ApprovalRequest(TASK, "sha256:" + "ab" * 32, "step-001", "sha256:" + "2" * 64, "write", 10.0, 9e9)
        writer.write_approval(Approval.for_request(request, approval_id="ap-1", approver="op", granted_at=11.0, expires_at=9e9))
        writer.write_cancellation(Cancellation(TASK, 12.0, "op", "stop"))
        directory = os.path.join(root, TASK)
        outside = self.path("outside")
        os.mkdir(outside)
        planter = Planter(directory, outside, rng)
        sources = [FileControlSource(root, strict=True, approver_uid=os.geteuid()), FileControlSource(root, strict=False)]
        pristine = fingerprint(root)
        names = sorted(planter.originals)
        count = cases_for("control_source")
        for case in range(count):
            relative = rng.choice(names)
            roll = rng.random()
            if roll < 0.85:
                planter.plant(relative, "file", damaged_copy(planter.originals[relative], relative, rng))
                if rng.random() < 0.1:
                    os.chmod(os.path.join(directory, relative), rng.choice([0o666, 0o000, 0o644]))
            else:
                planter.plant(relative, rng.choice(["symlink", "fifo", "dir"]), planter.originals[relative])
            before = fingerprint(root)
            for source in sources:
                cancellation = self.typed("FileControlSource.read_cancellation", case, relative, lambda: source.read_cancellation(TASK))
                approvals = self.typed("FileControlSource.read_approvals", case, relative, lambda: source.read_approvals(TASK))
                if cancellation is not None and cancellation.body is not None:
                    self.typed("cancellation record", case, relative, lambda: Cancellation.from_json(cancellation.body))
                evaluate_gate(request, approvals or (), set(), 100.0)
            self.assertEqual(fingerprint(root), before, f"control_source case {case}: a read changed files")
            planter.restore()
            self.assertEqual(fingerprint(root), pristine)
        self.fed("control_source", count)


class SqliteStoreFuzzTests(FuzzCase):
    def test_read_only_loads_of_damaged_rows_change_nothing(self) -> None:
        rng = random.Random(1007 + SEED_OFFSET)
        db = self.path("longrun.db")
        store = SqliteStore(db, create=True)
        self.addCleanup(store.close)
        lease = store.acquire_lease(TASK, "me", 3600.0, 1000.0)
        store.load(TASK, lease=lease)
        state = sample_state(TASK, effects=3)
        store.commit(lease, state, set(state.effects))
        request = ApprovalRequest(TASK, state.plan_digest, "step-001", "sha256:" + "2" * 64, "write", 10.0, 9e9)
        store.write_approval(Approval.for_request(request, approval_id="ap-1", approver="op", granted_at=11.0, expires_at=9e9))
        store.write_cancellation(Cancellation(TASK, 12.0, "op", "stop"))
        store.close()
        connection = sqlite3.connect(db, isolation_level=None)
        self.addCleanup(connection.close)

        def dump() -> list[str]:
            return list(connection.iterdump())

        pristine = dump()
        targets = [
            ("longrun_states", "header", "checksum"),
            ("longrun_effects", "record", "checksum"),
            ("longrun_cancellations", "body", None),
            ("longrun_approvals", "body", None),
            ("longrun_leases", "owner", None),
            ("longrun_leases", "epoch", None),
            ("longrun_leases", "expires_at", None),
            ("longrun_leases", "token", None),
            ("longrun_states", "revision", None),
            ("longrun_effects", "position", None),
        ]
        count = cases_for("sqlite_store")
        for case in range(count):
            table, column, checksum_column = targets[case % len(targets)]
            rowid, original = connection.execute(f"SELECT rowid, {column} FROM {table} ORDER BY rowid LIMIT 1").fetchone()
            if isinstance(original, str) and original.startswith(("{", "[")):
                if rng.random() < 0.3:
                    damaged: object = mutate_bytes(original.encode("utf-8"), rng)
                    with contextlib.suppress(UnicodeDecodeError):
                        damaged = damaged.decode("utf-8")  # type: ignore[union-attr]
                else:
                    damaged = dumps(mutate_value(json.loads(original), rng, rounds=rng.randint(1, 2)))
            else:
                damaged = rng.choice([None, "x", "", -1, 2**63 - 1, 1.5, float("nan"), b"\xff\xfe", "1e999", 10**18, "\x00"])
            old_checksum = None
            if checksum_column is not None:
                old_checksum = connection.execute(f"SELECT {checksum_column} FROM {table} WHERE rowid = ?", (rowid,)).fetchone()[0]
            try:
                if isinstance(damaged, str):
                    damaged.encode("utf-8")
                connection.execute(f"UPDATE {table} SET {column} = ? WHERE rowid = ?", (damaged, rowid))
            except (sqlite3.Error, UnicodeEncodeError):
                # A value the column cannot hold (NULL in NOT NULL, NaN, a surrogate): damage nobody
                # can plant, so put a value of another type there instead.
                damaged = rng.choice(["not a number", b"\x00\x01", 2**62])
                connection.execute(f"UPDATE {table} SET {column} = ? WHERE rowid = ?", (damaged, rowid))
            if checksum_column is not None and isinstance(damaged, str) and rng.random() < 0.6:
                checksum = "sha256:" + sha256_hex(damaged.encode("utf-8"))
                connection.execute(f"UPDATE {table} SET {checksum_column} = ? WHERE rowid = ?", (checksum, rowid))
            before = dump()
            reader = SqliteStore(db)
            try:
                self.typed("sqlite load", case, damaged, lambda: reader.load(TASK))
                self.typed("sqlite read_lease", case, damaged, lambda: reader.read_lease(TASK))
                self.typed("sqlite read_cancellation", case, damaged, lambda: reader.read_cancellation(TASK))
                self.typed("sqlite read_approvals", case, damaged, lambda: reader.read_approvals(TASK))
            finally:
                reader.close()
            self.assertEqual(dump(), before, f"sqlite_store case {case}: a read-only load changed the database")
            connection.execute(f"UPDATE {table} SET {column} = ? WHERE rowid = ?", (original, rowid))
            if checksum_column is not None:
                connection.execute(f"UPDATE {table} SET {checksum_column} = ? WHERE rowid = ?", (old_checksum, rowid))
            self.assertEqual(dump(), pristine)
        self.fed("sqlite_store", count)


# -- the CLI: arguments and the key file it reads -------------------------------------------------


class CliFuzzTests(FuzzCase):
    def setUp(self) -> None:
        super().setUp()
        self.root = self.path("store")
        store = JsonFileStore(self.root, create=True)
        lease = store.acquire_lease(TASK, "me", 3600.0, 1000.0)
        store.load(TASK, lease=lease)
        state = sample_state(TASK, effects=2)
        state.approval_requests["step-001"] = ApprovalRequest(
            TASK, state.plan_digest, "step-001", "sha256:" + "2" * 64, "write", 10.0, 9e9
        )
        state.status = Status.AWAITING_APPROVAL
        store.commit(lease, state, set(state.effects))
        store.close()

    def test_cli_arguments(self) -> None:
        rng = random.Random(1008 + SEED_OFFSET)
        weird = [
            "", "\x00", "a\x00b", "x" * 5000, "../..", "/", "-", "--", "nan", "inf", "-1", "0", "1e400", "1e9", "3600",
            "\udcff", "ünï", "*", TASK, "step-001", "\n", "a\x01b", "--json", "-y",
        ]  # fmt: skip
        commands = ["status", "verify", "history", "ls", "approve", "cancel"]
        options = {
            "approve": ["--step", "--approver", "--ttl", "--sign-key", "--control-root", "--store"],
            "cancel": ["--reason", "--by", "--sign-key", "--control-root", "--store"],
        }
        count = cases_for("cli_arguments")
        for case in range(count):
            command = rng.choice(commands)
            argv = [command]
            if rng.random() < 0.8:
                argv.append(self.root if rng.random() < 0.7 else rng.choice(weird))
            if command != "ls" and rng.random() < 0.9:
                argv.append(TASK if rng.random() < 0.6 else rng.choice(weird))
            for _ in range(rng.randint(0, 3)):
                option = rng.choice(options.get(command, ["--store", "--json"]))
                argv.append(option)
                if option != "--json":
                    argv.append(rng.choice(weird))
            code = self.typed("cli", case, argv, lambda: run_cli(argv))
            self.assertIn(code, (0, 1, 2, 3, 4), f"cli case {case}: longrun {argv!r:.300} exited {code}")
        self.fed("cli_arguments", count)

    def test_key_files(self) -> None:
        rng = random.Random(1009 + SEED_OFFSET)
        good = b"0123456789abcdef" * 4 + b"\n"
        count = cases_for("key_files")
        for case in range(count):
            path = self.path(f"key-{case}")
            kind = rng.random()
            if kind < 0.8:
                with open(path, "wb") as handle:
                    handle.write(mutate_bytes(good, rng) if rng.random() < 0.7 else good)
                os.chmod(path, rng.choice([0o600, 0o400, 0o644, 0o000, 0o700]))
            elif kind < 0.9:
                os.symlink(self.path("key-0"), path)
            else:
                os.mkfifo(path, 0o600) if rng.random() < 0.5 else os.mkdir(path)
            self.typed("load_key", case, path, lambda: load_key(path))
            if case % 10 == 0:
                argv = ["cancel", self.root, TASK, "--sign-key", path, "--control-root", self.path("nowhere")]
                self.assertIn(run_cli(argv), (0, 1, 2, 3, 4))
        self.fed("key_files", count)


class CountTests(unittest.TestCase):
    def test_the_full_run_feeds_at_least_10000_documents(self) -> None:
        self.assertGreaterEqual(sum(round(FULL_CASES * share) for share in SHARES.values()), 10_000)
        self.assertEqual(DEFAULT_CASES, FULL_CASES if scale.FULL else FULL_CASES // 4)
        self.assertEqual(set(SHARES), {"envelope", "snapshot", "journal", "records", "jsonfile_store", "control_source",
                                       "sqlite_store", "cli_arguments", "key_files"})  # fmt: skip


if __name__ == "__main__":
    unittest.main()


# -- the rules, one by one ------------------------------------------------------------------------

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "format-v1")


class BackwardCompatibilityTests(support.TempDirTest):
    """Files written by the code before hardened inputs (no ``schema_version`` in control records)."""

    def setUp(self) -> None:
        super().setUp()
        self.root = self.path("store")
        shutil.copytree(DATA, self.root)
        for directory, _, files in os.walk(self.root):
            os.chmod(directory, 0o700)
            for name in files:
                os.chmod(os.path.join(directory, name), 0o600)

    def test_a_v1_task_loads_with_its_lease_and_control_records(self) -> None:
        store = JsonFileStore(self.root)
        before = fingerprint(self.root)
        result = store.load("v1-task")
        self.assertEqual(result.source, "primary")
        self.assertEqual(result.state.revision, 3)
        self.assertEqual(result.state.effects["step-002"].attempts, 5)
        lease = store.read_lease("v1-task")
        self.assertEqual((lease.owner, lease.epoch), ("runner-a", 1))
        with open(os.path.join(DATA, "key"), "rb") as handle:
            key = handle.read()
        approvals = {record.name: record for record in SignedApprovals(store, key).read_approvals("v1-task")}
        self.assertIn("not signed", approvals["approvals/ap-plain.json"].error)
        self.assertIsNone(approvals["approvals/ap-signed.json"].error)  # an old signature still verifies
        self.assertEqual(Approval.from_json(approvals["approvals/ap-signed.json"].body).approval_id, "ap-signed")
        cancellation = SignedCancellations(store, key).read_cancellation("v1-task")
        self.assertIsNone(cancellation.error)
        self.assertEqual(Cancellation.from_json(cancellation.body).reason, "stop")
        self.assertEqual(fingerprint(self.root), before)
        # A writer carries on from it, and the new records carry their schema version.
        lease = store.acquire_lease("v1-task", "runner-b", 60.0, 2_000_000_000.0)
        state = store.load("v1-task", lease=lease).state
        state.next_action = "go on"
        self.assertEqual(store.commit(lease, state), 4)
        with open(os.path.join(self.root, "v1-task", "lease.json"), "rb") as handle:
            self.assertEqual(json.loads(handle.read())["schema_version"], 1)

    def test_a_legacy_envelope_still_decodes(self) -> None:
        with open(os.path.join(DATA, "legacy-envelope.json"), "rb") as handle:
            state = envelope.decode(handle.read(), expected_task="v1-task")
        self.assertEqual(state.revision, 9)


class ControlRecordVersionTests(unittest.TestCase):
    def test_schema_version_is_written_accepted_when_absent_and_refused_when_unknown(self) -> None:
        request = ApprovalRequest(TASK, "sha256:" + "ab" * 32, "s1", "sha256:" + "2" * 64, "write", 1.0, 9.0)
        records = [
            (Lease(TASK, "me", 1, 1.0, 2.0), Lease.from_json),
            (Approval.for_request(request, approval_id="ap-1", approver="op", granted_at=1.0, expires_at=9.0), Approval.from_json),
            (Cancellation(TASK, 1.0, "op", "stop"), Cancellation.from_json),
        ]
        for record, from_json in records:
            with self.subTest(type(record).__name__):
                body = record.to_json()
                self.assertEqual(body["schema_version"], 1)
                self.assertEqual(from_json(body), record)
                self.assertEqual(from_json({k: v for k, v in body.items() if k != "schema_version"}), record)
                for version in (2, 0, "1", 1.0, True, None):
                    with self.assertRaises(SchemaVersionError):
                        from_json({**body, "schema_version": version})

    def test_unknown_fields_bad_ids_and_huge_integers_are_refused_naming_the_field(self) -> None:
        body = Lease(TASK, "me", 1, 1.0, 2.0).to_json()
        for change, fragment in [
            ({"extra": 1}, "unknown field 'extra'"),
            ({"task_id": "a\x00b"}, "task_id"),
            ({"task_id": "../x"}, "task_id"),
            ({"task_id": "x" * 129}, "task_id"),
            ({"epoch": 2**63}, "epoch"),
            ({"epoch": -1}, "epoch"),
            ({"epoch": True}, "epoch"),
            ({"expires_at": 10**400}, "expires_at"),
            ({"token": ""}, "token"),
            ({"token": 5}, "token"),
            ({"token": "t" * 129}, "token"),
            ({"holder_lock": 7}, "holder_lock"),
        ]:
            with self.subTest(change=change), self.assertRaisesRegex(CorruptStateError, fragment):
                Lease.from_json({**body, **change})

    def test_the_strict_parser(self) -> None:
        for text, fragment in [
            (b"NaN", "NaN"), (b"[1e999]", "out of range"), (b"-Infinity", "Infinity"), (b"1" * 5000, "digits"),
            (b'{"a":1,"a":2}', "twice"), (b"[" * 101 + b"]" * 101, "deeper"), (b"[" * 100_000, "deeper"),
            (b'"\\ud800"', "surrogate"), (b"\xef\xbb\xbf{}", "JSON"), (b"\xed\xa0\x80", "UTF-8"), (b"{}" * 10, "JSON"),
        ]:  # fmt: skip
            with self.subTest(text=text[:20]), self.assertRaisesRegex(CorruptStateError, fragment):
                parse_json(text, what="doc", max_bytes=1 << 20, unique_keys=True)
        with self.assertRaisesRegex(CorruptStateError, "limit"):
            parse_json(b"[1]", what="doc", max_bytes=2)
        self.assertEqual(parse_json(b"[" * 100 + b"]" * 100, what="doc", max_bytes=1 << 20), json.loads(b"[" * 100 + b"]" * 100))
        self.assertEqual(parse_json(b'["[[[[\\"[[", "\\\\", "\\ud83d\\ude00"]', what="doc", max_bytes=1 << 20)[2], "\U0001f600")


class PathTests(support.TempDirTest):
    def setUp(self) -> None:
        super().setUp()
        self.root = self.path("store")
        store = JsonFileStore(self.root, create=True)
        self.lease = store.acquire_lease(TASK, "me", 3600.0, 1000.0)
        store.load(TASK, lease=self.lease)
        store.commit(self.lease, sample_state(TASK, effects=2))
        store.write_cancellation(Cancellation(TASK, 12.0, "op", "stop"))
        self.store = store
        self.directory = os.path.join(self.root, TASK)
        self.outside = self.path("outside")
        shutil.copytree(self.directory, self.outside)

    def test_files_and_directories_are_owner_only_even_under_a_permissive_umask(self) -> None:
        previous = os.umask(0)
        try:
            store = JsonFileStore(self.path("other"), create=True)
            lease = store.acquire_lease("t2", "me", 60.0, 1.0)
            store.load("t2", lease=lease)
            store.commit(lease, sample_state("t2", effects=1))
            store.write_approval(Approval("ap-1", "t2", "p", "s", "d", "a", 9.0, "op", 1.0))
        finally:
            os.umask(previous)
        for path, (kind, mode, _) in fingerprint(self.path("other")).items():
            with self.subTest(path=path):
                self.assertEqual(mode, 0o700 if kind == stat.S_IFDIR else 0o600)

    def test_a_linked_state_file_is_refused_not_followed(self) -> None:
        os.unlink(os.path.join(self.directory, "state.json"))
        os.symlink(os.path.join(self.outside, "state.json"), os.path.join(self.directory, "state.json"))
        before = fingerprint(self.root)
        with self.assertRaises(StorageError):
            JsonFileStore(self.root).load(TASK)
        self.assertEqual(fingerprint(self.root), before)

    def test_a_linked_control_directory_is_not_read_through(self) -> None:
        shutil.rmtree(os.path.join(self.directory, "control"))
        os.symlink(os.path.join(self.outside, "control"), os.path.join(self.directory, "control"))
        record = JsonFileStore(self.root).read_cancellation(TASK)
        self.assertIsNone(record.body)
        self.assertIn("symbolic links are refused", record.error)
        approvals = JsonFileStore(self.root).read_approvals(TASK)
        self.assertEqual([item.body for item in approvals], [None])
        with self.assertRaises(StorageError):
            JsonFileStore(self.root).write_approval(Approval("ap-2", TASK, "p", "s", "d", "a", 9.0, "op", 1.0))
        self.assertFalse(os.path.exists(os.path.join(self.outside, "control", "approvals", "ap-2.json")))

    def test_a_repairing_load_never_quarantines_through_a_link(self) -> None:
        with open(os.path.join(self.directory, "state.json"), "r+b") as handle:
            handle.seek(300)
            handle.write(b"#")
        os.rmdir(os.path.join(self.directory, "quarantine"))
        os.symlink(self.outside, os.path.join(self.directory, "quarantine"))
        before = fingerprint(self.outside)
        with self.assertRaises(StorageError):
            JsonFileStore(self.root).load(TASK, lease=self.lease)
        self.assertEqual(fingerprint(self.outside), before)

    def test_a_fifo_in_place_of_a_file_does_not_hang_a_reader(self) -> None:
        for name in ("state.json", "lease.json", os.path.join("control", "cancel.json"), "lock"):
            with self.subTest(name=name):
                path = os.path.join(self.directory, name)
                os.rename(path, path + ".saved")
                os.mkfifo(path, 0o600)
                try:
                    store = JsonFileStore(self.root)
                    for call in (lambda: store.load(TASK), lambda: store.read_lease(TASK), lambda: store.read_cancellation(TASK)):
                        with contextlib.suppress(*TYPED):
                            call()
                finally:
                    os.unlink(path)
                    os.rename(path + ".saved", path)


class CliArgumentTests(support.TempDirTest):
    def test_bad_arguments_exit_2_before_anything_is_opened(self) -> None:
        root = self.path("store")
        os.mkdir(root)
        for argv in [
            ["status", "a\x00b", TASK],
            ["status", "--store", "x\x00", TASK],
            ["approve", root, TASK, "--step", "../x"],
            ["approve", root, TASK, "--ttl", "1e12"],
            ["approve", root, TASK, "--ttl", "nan"],
            ["approve", root, TASK, "--approver", "a\x00"],
            ["approve", root, TASK, "--sign-key", "k\x00"],
            ["cancel", root, TASK, "--reason", "r" * 5000],
            ["cancel", root, TASK, "--by", "\udcff"],
            ["cancel", root, TASK, "--control-root", "c\x00"],
        ]:
            with self.subTest(argv=argv):
                self.assertEqual(run_cli(argv), 2)
        self.assertEqual(os.listdir(root), [])
        with self.assertRaises(InvalidInputError):
            load_key("key\x00")
        with self.assertRaises(InvalidInputError):
            FileControlSource("root\x00")
