"""Large payloads and results as blobs (``longrun.stores.blobs``): the reference shape and its
validation, the row codec's round trip, and the JSON-file store's blob files: written once, durable
before the journal line that names them, never copied by a compaction, checked on load, and
orphans removed at compaction. The store contract (``test_store_contract``) holds every store to
the round trip, the damage report and the no-copy rule."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import unittest
from typing import Any
from unittest import mock

from helpers import support
from longrun import JsonFileStore
from longrun.canonical import LARGE_VALUE_BYTES, canonical_bytes, digest_of, parse_json
from longrun.errors import CorruptStateError, StateUnrecoverableError
from longrun.lease import Lease
from longrun.ledger import EffectRecord, EffectState
from longrun.stores import _journal, jsonfile
from longrun.stores.blobs import BLOB_MIN_BYTES, BlobCodec, BlobRef, decode_blob, refs_from_json
from longrun.stores._fileio import FileIO
from longrun.testing.faults.power_loss import check_power_loss
from longrun.testing.faults.power_loss_model import RecordingIO
from longrun.testing.faults.store_history import TASK, compact_early, content, scratch_base
from longrun.testing.store_contract import sample_state
from longrun.testing.store_contract._blobs import large_payload

TTL = 30.0


def big_record(step_id: str, payload: dict[str, Any], epoch: int, *, result: Any = None) -> EffectRecord:
    return EffectRecord(
        f"t/{step_id}", step_id, "write", payload, digest_of(payload, checked=True), EffectState.STARTED, 1, epoch,
        result=result, updated_at=1.0,
    )  # fmt: skip


class ReferenceTests(unittest.TestCase):
    def test_a_reference_round_trips_and_a_bad_one_is_refused_typed(self) -> None:
        ref = BlobRef("ab" * 32, BLOB_MIN_BYTES)
        self.assertEqual(BlobRef.from_json(ref.to_json()), ref)
        bad: list[object] = [
            None, [], {"sha256": "ab" * 32}, {"sha256": "AB" * 32, "bytes": BLOB_MIN_BYTES},
            {"sha256": "ab" * 31, "bytes": BLOB_MIN_BYTES}, {"sha256": "ab" * 32, "bytes": 10},
            {"sha256": "ab" * 32, "bytes": True}, {"sha256": "ab" * 32, "bytes": BLOB_MIN_BYTES, "more": 1},
        ]  # fmt: skip
        for value in bad:
            with self.subTest(value=value), self.assertRaises(CorruptStateError):
                BlobRef.from_json(value)
        for value in ({}, {"cost": ref.to_json()}, [ref.to_json()], {"payload": None}):
            with self.subTest(value=value), self.assertRaises(CorruptStateError):
                refs_from_json(value, "record")
        self.assertEqual(refs_from_json(None, "record"), {})

    def test_a_blob_is_checked_against_its_reference(self) -> None:
        data = canonical_bytes(large_payload("a", LARGE_VALUE_BYTES))
        ref = BlobRef(hashlib.sha256(data).hexdigest(), len(data))
        self.assertEqual(decode_blob(ref, data, "x"), large_payload("a", LARGE_VALUE_BYTES))
        flipped = bytearray(data)
        flipped[50] ^= 1
        for damaged, pattern in ((None, "missing"), (data[:-1], "bytes"), (bytes(flipped), "SHA-256")):
            with self.subTest(pattern=pattern), self.assertRaisesRegex(CorruptStateError, pattern):
                decode_blob(ref, damaged, "x")


class RowCodecTests(unittest.TestCase):
    """One schema both ways: a row written with blob references reads back as the record written."""

    def test_rows_and_changes_round_trip_through_the_replay(self) -> None:
        codec = BlobCodec()
        blobs: dict[str, bytes] = {}

        def fetch(ref: BlobRef, what: str) -> Any:
            return decode_blob(ref, blobs.get(ref.sha256), what)

        record = big_record("big", large_payload("p"), 1, result=[large_payload("r", LARGE_VALUE_BYTES)])
        introduced: list[BlobRef] = []
        row = _journal.row_of(record, codec, introduced)
        self.assertEqual(len(row), len(_journal.BLOB_ROW_FIELDS))
        self.assertIsNone(row[_journal.EFFECT_FIELDS.index("payload")])
        self.assertEqual(len(introduced), 2)
        self.assertEqual(introduced[0].sha256, record.payload_digest.removeprefix("sha256:"), "the engine's digest is the blob's name")
        for blob in codec.to_write(introduced):
            blobs[blob.ref.sha256] = blob.data
        self.assertEqual(_journal.record_from_row(row, fetch), record)
        with self.assertRaisesRegex(CorruptStateError, "no blob store"):
            _journal.record_from_row(row)
        both = list(row)
        both[_journal.EFFECT_FIELDS.index("payload")] = {"inline": True}
        with self.assertRaisesRegex(CorruptStateError, "both inline and a blob"):
            _journal.record_from_row(both, fetch)
        # A small row is written as before (17 values): older readers read it.
        small = big_record("small", {"n": 1}, 1)
        self.assertEqual(len(_journal.row_of(small, codec)), len(_journal.EFFECT_FIELDS))

        state = sample_state("t", effects=1)
        state.revision, state.lease_epoch = 1, 1
        state.effects["big"] = record
        lines = _journal.encode_snapshot(state, codec)
        self.assertLess(sum(map(len, lines)), 8 * 1024, "the snapshot holds references, not bytes")
        replay = _journal.Replay(_journal.decode_snapshot(b"".join(lines), task_id="t"))
        self.assertEqual(replay.build(fetch).to_json(), state.to_json())
        shadow = _journal.Shadow(state, codec)
        state.revision += 1
        state.effects["big"] = record.with_changes(result={"small": 1}, state=EffectState.ACKNOWLEDGED)
        change = shadow.record_for(state, {"big"})
        assert change is not None
        self.assertEqual(change["effects"]["big"]["blobs"], {"payload": row[-1]["payload"]}, "the map is written whole")
        replay.apply_record(parse_json(_journal.frame(change)[17:], what="line", max_bytes=1 << 20))
        self.assertEqual(replay.build(fetch).to_json(), state.to_json())


class SmallValueTests(unittest.TestCase):
    def test_a_few_fields_are_told_inline_without_being_encoded(self) -> None:
        codec = BlobCodec()
        with mock.patch("longrun.stores.blobs.canonical_bytes", side_effect=AssertionError("encoded")) as encode:
            self.assertIsNone(codec.ref_of({"item": 7, "label": "cat", "scores": [0.5, 1.25], "ok": True, "note": None}))
        self.assertEqual(encode.call_count, 0)

    def test_every_value_that_encodes_large_gets_a_reference_whatever_its_shape(self) -> None:
        rng = random.Random(7)

        def value(depth: int = 0) -> Any:
            roll = rng.random()
            if depth > 2 or roll < 0.3:
                return rng.choice([
                    None, True, rng.randint(-(2**70), 2**70), rng.random() * 1e300, "x" * rng.randint(0, 20_000),
                    "\u00e9\U0001F600\x01\"\\" * rng.randint(0, 5_000),
                ])  # fmt: skip
            if roll < 0.65:
                return {"k" * rng.randint(0, 3_000) + str(i): value(depth + 1) for i in range(rng.randint(0, 8))}
            return [value(depth + 1) for _ in range(rng.randint(0, 8))]

        large = small = 0
        for _ in range(300):
            sample = value()
            if type(sample) not in (dict, list):
                continue
            size = len(canonical_bytes(sample))
            ref = BlobCodec().ref_of(sample)
            if size >= BLOB_MIN_BYTES:
                large += 1
                self.assertIsNotNone(ref, f"a {size}-byte value was told small")
            else:
                small += 1
                self.assertIsNone(ref)
        self.assertGreater(large, 10)
        self.assertGreater(small, 10)


class JsonFileBlobTests(support.TempDirTest):
    def setUp(self) -> None:
        super().setUp()
        self.root = self.path("root")

    def blob_dir(self) -> str:
        return os.path.join(self.root, "t", "blobs")

    def committed(self, store: JsonFileStore) -> tuple[Lease, Any]:
        lease = store.acquire_lease("t", "a", TTL, 1.0)
        store.load("t", lease=lease)
        state = sample_state("t", effects=1)
        state.effects["big"] = big_record("big", large_payload("p"), lease.epoch)
        store.commit(lease, state, set(state.effects))
        return lease, state

    def test_a_blob_is_a_file_named_by_its_digest_durable_before_the_line_that_names_it(self) -> None:
        calls: list[tuple[str, str]] = []

        class Recording(FileIO):
            def __init__(self) -> None:
                self.paths: dict[int, str] = {}

            def open(self, path: str, flags: int, mode: int = 0o600) -> int:
                fd = super().open(path, flags, mode)
                self.paths[fd] = path
                return fd

            def fdatasync(self, fd: int) -> None:
                calls.append(("fdatasync", os.path.basename(self.paths.get(fd, "?"))))
                super().fdatasync(fd)

            def fsync_dir(self, path: str) -> None:
                calls.append(("fsync_dir", os.path.basename(path)))
                super().fsync_dir(path)

        store = JsonFileStore(self.root, create=True, io=Recording())
        lease, state = self.committed(store)  # the first commit: a snapshot
        calls.clear()
        state.effects["later"] = big_record("later", large_payload("q"), lease.epoch)
        store.commit(lease, state, {"later"})
        digest = state.effects["later"].payload_digest.removeprefix("sha256:")
        self.assertTrue(os.path.isfile(os.path.join(self.blob_dir(), digest)))
        blob_synced = calls.index(("fsync_dir", "blobs"))
        line_synced = next(index for index, call in enumerate(calls) if call[0] == "fdatasync" and call[1].startswith("journal."))
        self.assertTrue(any(call == "fdatasync" and name.startswith(digest) for call, name in calls[:blob_synced]), calls)
        self.assertLess(blob_synced, line_synced, calls)
        with open(os.path.join(self.blob_dir(), digest), "rb") as handle:
            self.assertEqual(hashlib.sha256(handle.read()).hexdigest(), digest)

    def test_compaction_writes_references_and_never_rewrites_a_blob(self) -> None:
        original = jsonfile.COMPACT_MIN_BYTES
        jsonfile.COMPACT_MIN_BYTES = 0
        self.addCleanup(setattr, jsonfile, "COMPACT_MIN_BYTES", original)
        store = JsonFileStore(self.root, create=True)
        lease, state = self.committed(store)
        [name] = os.listdir(self.blob_dir())
        inode = os.stat(os.path.join(self.blob_dir(), name)).st_ino
        for index in range(6):
            state.effects["big"] = state.effects["big"].with_changes(attempts=2 + index, updated_at=5.0 + index)
            store.commit(lease, state, {"big"})
        self.assertEqual(os.listdir(self.blob_dir()), [name])
        self.assertEqual(os.stat(os.path.join(self.blob_dir(), name)).st_ino, inode, "the blob was not written again")
        for snapshot in ("state.json", "state.json.bak"):
            self.assertLess(os.path.getsize(os.path.join(self.root, "t", snapshot)), 8 * 1024, snapshot)
        self.assertEqual(JsonFileStore(self.root).load("t").state.to_json(), state.to_json())

    def test_compaction_removes_orphans_and_keeps_what_the_backup_needs(self) -> None:
        original = jsonfile.COMPACT_MIN_BYTES
        jsonfile.COMPACT_MIN_BYTES = 0
        self.addCleanup(setattr, jsonfile, "COMPACT_MIN_BYTES", original)
        store = JsonFileStore(self.root, create=True)
        lease, state = self.committed(store)
        orphan = os.path.join(self.blob_dir(), "0" * 64)  # as a crash before its commit leaves one
        with open(orphan, "wb") as handle:
            handle.write(b"left by a crash")
        first = state.effects["big"].payload_digest.removeprefix("sha256:")
        # The payload replaced: the old blob is still needed by the backup's chain, then no more.
        state.effects["big"] = big_record("big", large_payload("p2"), lease.epoch)
        second = state.effects["big"].payload_digest.removeprefix("sha256:")
        generations = []
        for index in range(40):
            state.effects["big"] = state.effects["big"].with_changes(attempts=2 + index, updated_at=5.0 + index)
            store.commit(lease, state, {"big"})
            names = set(os.listdir(self.blob_dir()))
            self.assertIn(second, names)
            generations.append(store._writers["t"].snapshot_revision)
            if len(set(generations)) <= 1:  # the snapshot that named the first payload is still the backup
                self.assertIn(first, names, "the backup's chain still names it")
        self.assertGreater(len(set(generations)), 3, "compactions happened")
        self.assertEqual(set(os.listdir(self.blob_dir())), {second})
        self.assertEqual(JsonFileStore(self.root).load("t").state.to_json(), state.to_json())

    def test_a_missing_blob_is_damage_and_the_backup_serves_if_it_can(self) -> None:
        store = JsonFileStore(self.root, create=True)
        lease, state = self.committed(store)
        for name in os.listdir(self.blob_dir()):
            os.unlink(os.path.join(self.blob_dir(), name))
        with self.assertRaisesRegex(StateUnrecoverableError, "missing"):
            JsonFileStore(self.root).load("t")
        # A later record whose blob is lost: the state before it is recovered, never a fresh start.
        store = JsonFileStore(self.root)
        self.tmp_restore_blob(state)
        store.load("t", lease=lease)
        state.effects["later"] = big_record("later", large_payload("q"), lease.epoch)
        store.commit(lease, state, {"later"})
        digest = state.effects["later"].payload_digest.removeprefix("sha256:")
        os.unlink(os.path.join(self.blob_dir(), digest))
        with self.assertLogs("longrun", "WARNING"):
            result = JsonFileStore(self.root).load("t")
        self.assertEqual(result.source, "backup")
        self.assertNotIn("later", result.state.effects)
        self.assertTrue(any("missing" in note.detail for note in result.observations), result.observations)

    def tmp_restore_blob(self, state: Any) -> None:
        record = state.effects["big"]
        data = canonical_bytes(record.payload)
        with open(os.path.join(self.blob_dir(), record.payload_digest.removeprefix("sha256:")), "wb") as handle:
            handle.write(data)


if __name__ == "__main__":
    unittest.main()


class PowerLossTests(support.TempDirTest):
    """Under the power-loss model (``longrun.testing.faults.power_loss_model``), every crash state of
    a recorded history whose commits write blobs loads as the state before or after the commit in
    flight: never a reference to a blob that is missing or torn. Without the blob's own flush, or
    the flush of its directory, some crash state breaks that."""

    def record(self) -> tuple[RecordingIO, str]:
        root = self.path("recorded")
        io = RecordingIO()
        with compact_early():
            store = JsonFileStore(root, io=io, create=True)
            lease = store.acquire_lease(TASK, "holder", 3600.0, 1_700_000_000.0)
            store.load(TASK, lease=lease)
            state = sample_state(TASK, effects=2)
            state.revision = 0
            before = None
            for number in range(1, 9):
                changed: set[str] = set(state.effects) if number == 1 else set()
                if number % 2 == 0:  # a new record with a large payload: a blob written in this commit
                    step_id = f"big-{number}"
                    state.effects[step_id] = big_record(step_id, large_payload(f"p{number}", LARGE_VALUE_BYTES), lease.epoch)
                    changed.add(step_id)
                elif number > 1:  # the latest one acknowledged with a large result: another blob
                    step_id = f"big-{number - 1}"
                    state.effects[step_id] = state.effects[step_id].with_changes(
                        state=EffectState.ACKNOWLEDGED, result=large_payload(f"r{number}", LARGE_VALUE_BYTES), updated_at=2e9 + number
                    )
                    changed.add(step_id)
                state.next_action = f"commit {number}"
                io.mark("begin", number, before)
                store.commit(lease, state, changed)
                before = content(state.to_json())
                io.mark("end", number, before)
            store.release_lease(lease, 1_700_000_100.0)
            store.close()
        return io, root

    def test_every_crash_state_of_commits_that_write_blobs_is_the_before_or_the_after_state(self) -> None:
        support.ExpectedWarnings(self, r"dropped an incomplete last record", r"state recovered from", at_least_one=False).start()
        io, root = self.record()
        blob_syncs = {op[2] for op in io.ops if op[0] in ("sync", "dirsync") and "blobs" in op[1]}
        self.assertEqual(len(blob_syncs), 2, f"a blob's fdatasync and its directory's fsync: {blob_syncs}")
        scratch = scratch_base(self.tmp)
        self.addCleanup(shutil.rmtree, scratch, ignore_errors=True)
        cases, problems, figures = check_power_loss(io.ops, root, scratch)
        self.assertGreater(cases, 100)
        self.assertEqual(problems[:5], [])
        self.assertEqual(figures, {"resets": 0, "lost": 0})
        for site in sorted(blob_syncs):  # the mutation check: each flush of the blob protocol is needed
            with self.subTest(without=site):
                _, broken, _ = check_power_loss(io.ops, root, scratch, ignore=frozenset({site}), stop_at_first=True)
                self.assertTrue(broken, f"without the flush at {site} no crash state breaks")
