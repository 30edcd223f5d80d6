"""The seams in ``longrun.protocols``: the optional capabilities of a store are declared Protocols,
which the stores longrun ships satisfy and the CLI asks for by name, not by probing attributes."""

from __future__ import annotations

import io
import unittest
from typing import Any

from helpers import support
from longrun import JsonFileStore, SqliteStore
from longrun.cli._common import close_store
from longrun.cli._history import timeline
from longrun.protocols import ClosableStore, HistoryStore, RepairableStore, Store
from longrun.testing.store_contract import sample_state


class ShippedStoresTests(support.TempDirTest):
    def test_the_json_file_store_has_every_optional_capability(self) -> None:
        store = JsonFileStore(self.path("root"), create=True)
        for capability in (HistoryStore, ClosableStore, RepairableStore):
            with self.subTest(capability=capability.__name__):
                self.assertIsInstance(store, capability)

    def test_the_sqlite_store_closes_and_repairs_but_keeps_no_history(self) -> None:
        store = SqliteStore(self.path("db.sqlite"), create=True)
        self.addCleanup(store.close)
        self.assertIsInstance(store, ClosableStore)
        self.assertIsInstance(store, RepairableStore)
        self.assertNotIsInstance(store, HistoryStore)


class Recording:
    """A store wrapper that exposes only what it declares, and counts the calls it forwards."""

    def __init__(self, inner: JsonFileStore):
        self.inner = inner
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name in ("history", "close", "repair_lease"):
            raise AttributeError(name)
        return getattr(self.inner, name)


class WithHistory(Recording):
    def history(self, task_id: str) -> list[dict[str, object]]:
        self.calls.append("history")
        return [{"revision": 1, "epoch": 1, "at": 1.0, "changes": ["declared"], "description": "from the declared history"}]

    def close(self) -> None:
        self.calls.append("close")


class CliUsesTheDeclaredCapabilitiesTests(support.TempDirTest):
    def committed_store(self) -> JsonFileStore:
        store = JsonFileStore(self.path("root"), create=True)
        lease = store.acquire_lease("t", "me", 3600.0, 1.0)
        store.load("t", lease=lease)
        state = sample_state("t", effects=1)
        store.commit(lease, state, set(state.effects))
        return store

    def test_a_store_that_declares_history_and_close_is_asked_for_them(self) -> None:
        store = WithHistory(self.committed_store())
        self.assertIsInstance(store, HistoryStore)
        _, entries = timeline(store, "t", 2.0)  # type: ignore[arg-type]
        self.assertIn("from the declared history", [entry["detail"] for entry in entries])
        close_store(store)
        self.assertEqual(store.calls, ["history", "close"])

    def test_a_store_without_them_still_has_a_timeline_and_nothing_to_close(self) -> None:
        store = Recording(self.committed_store())
        self.assertNotIsInstance(store, HistoryStore)
        self.assertNotIsInstance(store, ClosableStore)
        _, entries = timeline(store, "t", 2.0)  # type: ignore[arg-type]
        self.assertTrue(entries)
        close_store(store)
        self.assertEqual(store.calls, [])

    def test_repair_refuses_a_store_that_cannot_repair_a_lease(self) -> None:
        from longrun.cli._common import CliError
        from longrun.cli._control import cmd_repair

        with self.assertRaisesRegex(CliError, "cannot repair a lease record"):
            cmd_repair(Recording(self.committed_store()), "t", repaired_by="op", out=io.StringIO())  # type: ignore[arg-type]

    def test_the_store_protocol_and_the_capabilities_are_apart(self) -> None:
        store = self.committed_store()
        self.assertFalse(hasattr(Store, "history") or hasattr(Store, "close"), "capabilities stay optional")
        self.assertIsInstance(store, HistoryStore)


if __name__ == "__main__":
    unittest.main()


class ClockCapabilityTests(unittest.TestCase):
    """The optional capabilities of a clock are Protocols the engine looks up once, not attributes
    it probes; what it hands the store follows from them."""

    def lease_calls(self, clock: Any) -> list[Any]:
        import tempfile

        from longrun import Runner, Step
        from longrun.contract import RunContract
        from longrun.testing import OutboxAdapter

        seen: list[Any] = []
        root = tempfile.mkdtemp()
        self.addCleanup(__import__("shutil").rmtree, root, True)

        class Spy(JsonFileStore):
            def acquire_lease(self, *args: Any, monotonic: Any = None, **kwargs: Any) -> Any:
                seen.append(monotonic)
                return super().acquire_lease(*args, monotonic=monotonic, **kwargs)

        store = Spy(root, create=True)
        adapter = OutboxAdapter(root + "/outbox")
        contract = RunContract("t", "one step", allowed_actions=("send",))
        outcome = Runner(contract, [Step("a", "send", {})], store=store, adapters={"send": adapter}, clock=clock).run()
        self.assertEqual(outcome.status.value, "done")
        return seen

    def test_a_clock_that_names_its_timeline_gives_the_store_a_reading_on_it(self) -> None:
        from longrun import SystemClock
        from longrun.lease import MonotonicReading
        from longrun.protocols import MonotonicClock, TimelineClock

        self.assertIsInstance(SystemClock(), TimelineClock)
        (reading,) = self.lease_calls(SystemClock())
        self.assertIsInstance(reading, MonotonicReading)
        self.assertEqual(reading.timeline, SystemClock().monotonic_id())
        self.assertIsInstance(SystemClock(), MonotonicClock)

    def test_a_wall_clock_alone_or_a_monotonic_one_without_a_timeline_gives_none(self) -> None:
        import time

        from longrun.protocols import MonotonicClock, TimelineClock

        class Wall:
            def now(self) -> float:
                return time.time()

            def sleep(self, seconds: float) -> None:
                time.sleep(seconds)

        class Monotonic(Wall):
            def monotonic(self) -> float:
                return time.monotonic()

        self.assertNotIsInstance(Wall(), MonotonicClock)
        self.assertIsInstance(Monotonic(), MonotonicClock)
        self.assertNotIsInstance(Monotonic(), TimelineClock)
        self.assertEqual(self.lease_calls(Wall()), [None])
        self.assertEqual(self.lease_calls(Monotonic()), [None])

    def test_a_reading_is_a_checked_record(self) -> None:
        from longrun import InvalidInputError
        from longrun.lease import MonotonicReading

        for timeline, seconds in (("", 1.0), (None, 1.0), ("boot:x", float("nan")), ("boot:x", True), ("boot:x", "1")):
            with self.subTest(timeline=timeline, seconds=seconds), self.assertRaises(InvalidInputError):
                MonotonicReading(timeline, seconds)  # type: ignore[arg-type]
        self.assertEqual(MonotonicReading("boot:x", 2), MonotonicReading("boot:x", 2.0))


class SourceCapabilityTests(unittest.TestCase):
    def test_signing_and_pausing_sources_declare_themselves(self) -> None:
        from longrun.protocols import PausingSource, SigningSource
        from longrun.signing import SignedApprovals, SignedCancellations

        for source in (SignedApprovals, SignedCancellations):
            with self.subTest(source.__name__):
                self.assertIsInstance(source.__new__(source), SigningSource)

        class Draining:
            def read_cancellation(self, task_id: str) -> None:
                return None

            def pause_requested(self, task_id: str) -> bool:
                return True

        self.assertIsInstance(Draining(), PausingSource)
        self.assertNotIsInstance(JsonFileStore.__new__(JsonFileStore), PausingSource)
        self.assertNotIsInstance(JsonFileStore.__new__(JsonFileStore), SigningSource)
