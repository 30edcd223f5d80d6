"""Control records as files (``longrun.stores.controlfiles``): one reader and writer for the
JSON-file store and ``FileControlSource``, strict mode a parameter. ``test_authority`` breaks
strict mode; this file holds the two users to one behaviour."""

from __future__ import annotations

import os
import stat
import unittest
from typing import Any

from helpers import support
from longrun import Approval, Cancellation, JsonFileStore
from longrun.authority import FileControlSource
from longrun.control import ControlRecord, RefusedRecord
from longrun.stores import controlfiles, jsonfile
from longrun.stores._fileio import FileIO

TASK = "t"
NOW = 1_800_000_000.0


def approval(approval_id: str) -> Approval:
    return Approval(approval_id, TASK, "sha256:p", "step-001", "sha256:d", "write", NOW + 3600, "op", NOW)


def seen(record: ControlRecord | None) -> Any:
    return None if record is None else (type(record).__name__, record.name, record.body, record.error, record.digest)


class OneReaderTests(support.TempDirTest):
    def setUp(self) -> None:
        super().setUp()
        self.store = JsonFileStore(self.path("root"), create=True)
        self.store.acquire_lease(TASK, "me", 3600.0, NOW)
        self.control = os.path.join(self.store.task_dir(TASK), "control")
        self.approvals = os.path.join(self.control, "approvals")

    def assert_read_alike(self) -> None:
        """The store and a non-strict source on its root hand over the very same records."""
        source = FileControlSource(self.store.root, strict=False)
        self.assertEqual(seen(self.store.read_cancellation(TASK)), seen(source.read_cancellation(TASK)))
        self.assertEqual([seen(item) for item in self.store.read_approvals(TASK)], [seen(item) for item in source.read_approvals(TASK)])

    def test_whole_records_are_read_alike(self) -> None:
        self.store.write_approval(approval("ap-1"))
        self.store.write_cancellation(Cancellation(TASK, NOW, "op", "stop"))
        self.assert_read_alike()
        self.assertIsNone(self.store.read_cancellation(TASK).error)  # type: ignore[union-attr]

    def test_damaged_and_planted_records_are_read_alike(self) -> None:
        outside = self.path("outside.json")
        with open(outside, "w") as handle:
            handle.write("{}")
        plants = {
            "malformed": lambda: self.plant(os.path.join(self.control, "cancel.json"), b'{"task_id": '),
            "oversized": lambda: self.plant(os.path.join(self.approvals, "big.json"), b" " * (controlfiles.MAX_RECORD_BYTES + 1)),
            "linked file": lambda: os.symlink(outside, os.path.join(self.control, "cancel.json")),
            "fifo": lambda: os.mkfifo(os.path.join(self.approvals, "fifo.json")),
            "directory": lambda: os.mkdir(os.path.join(self.approvals, "dir.json")),
        }
        for what, plant in plants.items():
            with self.subTest(plant=what):
                plant()
                self.assert_read_alike()
                self.clear()

    def test_a_linked_control_directory_is_refused_by_both(self) -> None:
        real = self.path("real-approvals")
        os.rename(self.approvals, real)
        os.symlink(real, self.approvals)
        self.assert_read_alike()
        (record,) = self.store.read_approvals(TASK)
        self.assertIn("symbolic links are refused", record.error or "")

    def plant(self, path: str, data: bytes) -> None:
        with open(path, "wb") as handle:
            handle.write(data)

    def clear(self) -> None:
        for directory in (self.approvals, self.control):
            for name in os.listdir(directory):
                path = os.path.join(directory, name)
                if path == self.approvals:
                    continue
                if os.path.isdir(path) and not os.path.islink(path):
                    os.rmdir(path)
                else:
                    os.unlink(path)


class StrictModeIsAParameterTests(support.TempDirTest):
    def test_the_same_reader_refuses_in_strict_mode_what_it_reads_as_unreadable_otherwise(self) -> None:
        root = self.path("control-root")
        os.mkdir(root, 0o755)
        writer = controlfiles.ControlFiles(root, io=FileIO(), dir_mode=0o755, file_mode=0o644)
        path = writer.write_approval(approval("ap-1"))
        os.chmod(path, 0o666)
        strict = controlfiles.ControlFiles(root, io=FileIO(), strict=True, approver_uid=os.geteuid())
        (refused,) = strict.read_approvals(TASK)
        self.assertIsInstance(refused, RefusedRecord)
        self.assertIn("writable by group and others", refused.error or "")
        (read,) = controlfiles.ControlFiles(root, io=FileIO()).read_approvals(TASK)
        self.assertNotIsInstance(read, RefusedRecord)
        self.assertEqual(read.body, approval("ap-1").to_json())
        os.symlink(path, os.path.join(os.path.dirname(path), "ap-2.json"))
        reasons = {type(item).__name__: item.error for item in strict.read_approvals(TASK)}
        self.assertIn("is a symbolic link", reasons["RefusedRecord"] or "")
        linked = [item for item in controlfiles.ControlFiles(root, io=FileIO()).read_approvals(TASK) if item.name.endswith("ap-2.json")]
        self.assertEqual([item.error for item in linked], [f"unreadable: {TASK}/control/approvals/ap-2.json is a symbolic link (symbolic links are refused)"])

    def test_the_store_and_the_source_share_one_layout_and_its_limits(self) -> None:
        for name in ("CONTROL", "APPROVALS", "CANCEL", "MAX_RECORD_BYTES", "MAX_APPROVAL_FILES"):
            with self.subTest(name=name):
                self.assertEqual(getattr(jsonfile, name), getattr(controlfiles, name))

    def test_writes_make_owner_only_files_in_a_store_and_readable_ones_in_a_control_area(self) -> None:
        store = JsonFileStore(self.path("store"), create=True)
        store.acquire_lease(TASK, "me", 3600.0, NOW)
        store.write_approval(approval("ap-1"))
        area = self.path("area")
        os.mkdir(area)
        written = FileControlSource(area, strict=False).write_approval(approval("ap-1"))
        in_store = os.path.join(store.task_dir(TASK), "control", "approvals", "ap-1.json")
        self.assertEqual(stat.S_IMODE(os.stat(in_store).st_mode), 0o600)
        self.assertEqual(stat.S_IMODE(os.stat(written).st_mode), 0o644)
        self.assertEqual(stat.S_IMODE(os.stat(os.path.dirname(written)).st_mode), 0o755)


if __name__ == "__main__":
    unittest.main()
