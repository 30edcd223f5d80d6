"""The store contract, listings: the summary of each task follows its commits exactly (a refused
commit changes none), filters and pages, counts by status, ``record_new``'s first revisions and
``load_many``.

Drives ``SummaryStore`` and ``RecordingStore`` (``longrun.protocols``); a store that offers
neither skips these tests."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from ...errors import FencedError, InvalidInputError, UnknownTaskError
from ...ledger import EffectRecord
from ...outcome import Status
from ...protocols import LoadManyStore, LoadResult, RecordingStore, SummaryStore
from ...summary import FUNCTION_STEP, TaskSummary, summarize
from ._base import TTL, ContractBase, sample_state

__all__ = ["SummaryContract"]


def _function_record(task_id: str, function: str, parent: str | None) -> EffectRecord:
    payload: dict[str, Any] = {"function": function, "args": [], "kwargs": {}}
    if parent is not None:
        payload.update(parent=parent, ancestors=[parent], cancelled_with=[parent])
    return EffectRecord(
        key=f"{task_id}/{FUNCTION_STEP}", step_id=FUNCTION_STEP, action=FUNCTION_STEP, payload=payload,
        payload_digest="sha256:" + "cd" * 32, updated_at=1_700_000_000.0,
    )  # fmt: skip


class SummaryContract(ContractBase):
    def summary_store(self) -> Any:
        store = self.store()
        if not isinstance(store, SummaryStore):
            self._case.skipTest("the store lists no summaries (SummaryStore)")
        return store

    def recording_store(self) -> Any:
        store = self.summary_store()
        if not isinstance(store, RecordingStore):
            self._case.skipTest("the store records no first revisions (RecordingStore)")
        return store

    def commit_at(self, store: Any, task_id: str, updated_at: float, status: Status = Status.RUNNING, **extra: Any) -> Any:
        lease = self.leased(store, task_id)
        state = sample_state(task_id)
        state.updated_at, state.status = updated_at, status
        if "function" in extra:
            state.effects[FUNCTION_STEP] = _function_record(task_id, extra["function"], extra.get("parent"))
        store.commit(lease, state, set(state.effects))
        return state

    def test_contract_a_summary_is_the_committed_state_s_and_listings_are_newest_first(self) -> None:
        case, store = self._case, self.summary_store()
        first = self.commit_at(store, "a", 1_700_000_010.0)
        second = self.commit_at(store, "b", 1_700_000_030.0, Status.RETRY_SCHEDULED, function="jobs:work")
        store.acquire_lease("c", "owner-a", TTL, self.now())  # a task row, no revision yet
        with self.reader() as reader:
            listed = reader.list_summaries()
        case.assertEqual([summary.task_id for summary in listed], ["b", "a", "c"], "newest first; a task never committed last")
        expected_b = summarize(second)
        case.assertEqual(dataclasses.replace(listed[0], created_at=expected_b.created_at), expected_b)
        case.assertEqual((listed[0].status, listed[0].revision, listed[0].function), ("retry-scheduled", 1, "jobs:work"))
        case.assertEqual((listed[0].wake_at, listed[0].error), (1_700_000_100.5, "transient: busy"), "from the waiting step")
        case.assertEqual((listed[1].status, listed[1].updated_at, listed[1].next_action), ("running", first.updated_at, first.next_action))
        case.assertIsNone(listed[1].wake_at, "a running task has no wake time")
        case.assertEqual((listed[2].status, listed[2].revision, listed[2].updated_at), ("new", 0, None))
        case.assertEqual(TaskSummary.from_json(listed[0].to_json()), listed[0])

    def test_contract_the_summary_follows_every_commit_and_a_refused_one_changes_nothing(self) -> None:
        case, store = self._case, self.summary_store()
        lease = self.leased(store, "t")
        state = sample_state("t")
        store.commit(lease, state, set(state.effects))
        state.status, state.updated_at, state.next_action = Status.DONE, 1_700_000_500.0, ""
        store.commit(lease, state, ())
        with self.reader() as reader:
            case.assertEqual([(s.status, s.revision, s.updated_at) for s in reader.list_summaries()], [("done", 2, 1_700_000_500.0)])
        other = self.make_store()
        try:
            newer = other.acquire_lease("t", "owner-b", TTL, self.expire(store, lease))
            case.assertGreater(newer.epoch, lease.epoch)
        finally:
            close = getattr(other, "close", None)
            if callable(close):
                close()
        state.status = Status.RUNNING
        with case.assertRaises(FencedError):
            store.commit(lease, state, ())
        with self.reader() as reader:
            case.assertEqual([(s.status, s.revision) for s in reader.list_summaries()], [("done", 2)], "a refused commit writes no summary")

    def test_contract_summaries_filter_and_page(self) -> None:
        case, store = self._case, self.summary_store()
        self.commit_at(store, "job-1", 1_700_000_001.0, function="jobs:work")
        self.commit_at(store, "job-2", 1_700_000_002.0, Status.DONE, function="jobs:work", parent="job-1")
        self.commit_at(store, "job-3", 1_700_000_003.0, Status.DONE, function="jobs:other")
        self.commit_at(store, "misc.4", 1_700_000_004.0)

        def ids(**filters: Any) -> list[str]:
            return [summary.task_id for summary in store.list_summaries(**filters)]

        case.assertEqual(ids(), ["misc.4", "job-3", "job-2", "job-1"])
        case.assertEqual(ids(statuses=["done"]), ["job-3", "job-2"])
        case.assertEqual(ids(statuses=("done", "running")), ["misc.4", "job-3", "job-2", "job-1"])
        case.assertEqual(ids(functions=["jobs:work"]), ["job-2", "job-1"])
        case.assertEqual(ids(parent="job-1"), ["job-2"])
        case.assertEqual(ids(match="job-*"), ["job-3", "job-2", "job-1"])
        case.assertEqual(ids(match="job-[!2]"), ["job-3", "job-1"])
        case.assertEqual(ids(match="misc?4"), ["misc.4"])
        case.assertEqual(ids(match="misc*."), [], "a dot is a dot, not any character")
        case.assertEqual(ids(since=1_700_000_002.0), ["misc.4", "job-3", "job-2"])
        case.assertEqual(ids(until=1_700_000_002.0), ["job-1"])
        case.assertEqual(ids(limit=2), ["misc.4", "job-3"])
        case.assertEqual(ids(limit=2, offset=2), ["job-2", "job-1"])
        case.assertEqual(ids(offset=3), ["job-1"])
        case.assertEqual(ids(limit=0), [])
        case.assertEqual(ids(statuses=["done"], functions=["jobs:work"], limit=5), ["job-2"])
        case.assertEqual(store.status_counts(), {"running": 2, "done": 2})
        case.assertEqual(store.count_summaries(), 4)
        case.assertEqual(store.count_summaries(statuses=["done"], match="job-*"), 2)
        case.assertEqual(store.count_summaries(functions=["jobs:work"], since=1_700_000_002.0), 1)
        case.assertEqual(store.count_summaries(match="misc*."), 0)
        case.assertEqual(store.function_names(), ["jobs:other", "jobs:work"])
        with case.assertRaises(InvalidInputError):
            store.count_summaries(statuses=["finished"])

    def test_contract_bad_listing_filters_are_refused(self) -> None:
        case, store = self._case, self.summary_store()
        for filters in (
            {"statuses": ["finished"]}, {"statuses": "done"}, {"functions": [""]}, {"match": ""}, {"since": "yesterday"},
            {"until": float("nan")}, {"limit": -1}, {"limit": 2.5}, {"offset": -3}, {"parent": 7},
        ):  # fmt: skip
            with case.assertRaises(InvalidInputError, msg=repr(filters)):
                store.list_summaries(**filters)

    def test_contract_record_new_writes_first_revisions_and_leaves_existing_tasks_alone(self) -> None:
        case, store = self._case, self.recording_store()
        _, existing = self.committed(store, "old")
        fresh = [sample_state_at_zero(f"new-{index}") for index in range(3)]
        before = self.snapshot("old")
        case.assertEqual(store.record_new([fresh[0], sample_state_at_zero("old"), fresh[1], fresh[2]], self.now()), [True, False, True, True])
        case.assertEqual(self.snapshot("old"), before, "an existing task is left as it is")
        with self.reader() as reader:
            for state in fresh:
                loaded = reader.load(state.task_id).state
                case.assertEqual(loaded.revision, 1)
                case.assertEqual(loaded.to_json(), state.to_json(), "the state as given, at revision 1")
            case.assertEqual({s.task_id: s.revision for s in reader.list_summaries()}, {"old": 1, "new-0": 1, "new-1": 1, "new-2": 1})
        lease = store.acquire_lease("new-1", "owner-a", TTL, self.now())
        case.assertGreater(lease.epoch, fresh[1].lease_epoch, "the first acquisition is above the recorder's epoch")
        state = store.load("new-1", lease=lease).state
        case.assertEqual(store.commit(lease, state), 2)
        del existing

    def test_contract_record_new_and_load_many_over_many_tasks(self) -> None:
        case, store = self._case, self.recording_store()
        if not isinstance(cast(object, store), LoadManyStore):
            case.skipTest("the store loads no tasks together (LoadManyStore)")
        fresh = [sample_state_at_zero(f"many-{index:03d}") for index in range(230)]  # more than one batch of rows
        case.assertEqual(store.record_new(fresh, self.now()), [True] * len(fresh))
        ids = [state.task_id for state in fresh[::-1]] + ["missing"]
        with self.reader() as reader:
            loaded = reader.load_many(ids)
            case.assertEqual(len(loaded), len(ids))
            for task_id, result in zip(ids[:-1], loaded):
                case.assertIsInstance(result, LoadResult, task_id)
                assert isinstance(result, LoadResult) and result.state is not None
                case.assertEqual(result.state.to_json(), reader.load(task_id).state.to_json(), "as load reads it")
            case.assertIsInstance(loaded[-1], UnknownTaskError)
            case.assertEqual(reader.load_many([]), [])
            with case.assertRaises(InvalidInputError):
                reader.load_many(["../x"])
            case.assertEqual(reader.status_counts(), {fresh[0].status.value: len(fresh)})

    def test_contract_record_new_refuses_bad_input_and_writes_nothing(self) -> None:
        case, store = self._case, self.recording_store()
        twice = [sample_state_at_zero("x"), sample_state_at_zero("x")]
        bad_header = sample_state_at_zero("y")
        bad_header.next_action = 7
        states: Any
        for states in (twice, [sample_state_at_zero("z"), bad_header], [sample_state_at_zero("w", revision=3)], "state", [object()]):
            with case.assertRaises(InvalidInputError, msg=repr(states)[:80]):
                store.record_new(states, self.now())
        case.assertEqual(store.list_tasks(), [], "nothing was written")


def sample_state_at_zero(task_id: str, *, revision: int = 0) -> Any:
    """``sample_state`` as ``record_new`` takes it: never committed (revision 0, unless told)."""
    state = sample_state(task_id, effects=2)
    state.revision = revision
    return state
