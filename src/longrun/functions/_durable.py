"""``@durable`` and ``DurableFunction``: a function made durable, started, resumed or recorded for a worker.

One concept, the face a durable function shows its callers, so one module, longer than most: each
way in (``run``/``arun`` with or without waiting, ``start``/``enqueue``/``start_many``, ``fork``,
``reopen``/``resume``, ``send``/``get_event``) is a short method that hands its work to the module
that owns it (the engine, ``_waiting``, ``_fork``, the fleet's queue, ``intervention``)."""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import threading
import time
import weakref
from datetime import datetime
from types import MappingProxyType
from typing import Any, Callable, Generic, Iterable, Mapping, Sequence, TypeVar, Unpack

from ..canonical import JSONValue, ensure_json
from ..clock import SystemClock
from ..contract import RunContract, check_task_id
from ..deadline import deadline_timestamp
from ..engine import Engine, EngineOptions
from ..envelope import RunState
from ..errors import ForkRefusedError, InvalidInputError, TaskExistsError, UnknownTaskError
from ..intervention import ApprovalWriter, Signer, reopen
from ..outcome import TERMINAL, RunOutcome, Status
from ..queues import Queue, check_dedup_id, check_queue_name
from ..names import store_spec_of
from ..outside_messages import Posted, post_message, requires_signature
from ..protocols import AnyEffectAdapter, Clock, RecordingStore, Store
from ..schedules import Schedule
from ..stores.queue import TaskQueue, open_queue
from ..task_events import read_event
from ._plan import FunctionPlan, Recording, run_coroutine
from ._family import cancelled_down
from ._fork import Forking, check_new_task, holding_origin, record_fork_in_origin, records_to_copy
from ._lineage import FUNCTION_STEP, ChildLink, qualified_name
from ._version import check_version, source_version
from ._waiting import Waiting, check_wait

__all__ = ["DurableFunction", "durable"]


def _ended(store: Store, task_id: str) -> bool:
    """Whether ``task_id`` has ended (a dedup id it holds is free again); a task never recorded has."""
    try:
        state = store.load(task_id).state
    except UnknownTaskError:
        return True
    return state is None or state.status in TERMINAL


R = TypeVar("R")

class DurableFunction(Generic[R]):
    """A function made durable by ``@durable(...)``: ``fn.run(task_id, *args)`` starts or resumes it.

    Calling ``run`` on a finished task returns ``done`` with the same ``result`` and calls
    nothing. The engine's keyword arguments (store, adapters, limits, retry, lease, clock,
    authority sources) are fixed at decoration; the contract's task id is the one ``run`` gets.
    """

    def __init__(self, fn: Callable[..., Any], contract: RunContract, engine_options: dict[str, Any], version: str | None = None):
        self.fn = fn
        self.name = qualified_name(fn)
        self.version = check_version(version) if version is not None else source_version(fn)
        """The code version each task of this function records when it starts: ``durable(version=...)``,
        or ``source-`` and the first 12 hex digits of the SHA-256 of the function's module source."""
        self._contract = contract
        self._options = engine_options
        self.__wrapped__ = fn
        self.__doc__ = fn.__doc__
        self.schedule: Schedule | None = None
        """The schedule ``@longrun.scheduled`` gave this function, if any (a worker serving it stores it)."""
        self._queue: TaskQueue | None = None
        """The fleet queue ``start`` and ``enqueue`` write to, kept open between calls (its connection
        and the check of its tables cost more than recording a task)."""
        self._queue_lock = threading.Lock()
        self._signature_read: tuple[inspect.Signature | None] | None = None

    def contract_for(self, task_id: str) -> RunContract:
        """The function's contract for ``task_id`` (checked). The rest of the contract was validated
        when the function was decorated and is frozen: copied as it is, not validated per task."""
        contract = copy.copy(self._contract)
        object.__setattr__(contract, "task_id", check_task_id(task_id))
        return contract

    def _plan(
        self,
        task_id: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        link: ChildLink | None = None,
        deadline_at: float | None = None,
    ) -> tuple[Engine, FunctionPlan]:
        contract = self.contract_for(task_id)
        self.check_arguments(args, kwargs)
        arguments = ensure_json({"args": list(args), "kwargs": dict(kwargs)}, what=f"arguments of {self.name}")
        assert isinstance(arguments, dict)
        plan = FunctionPlan(self, arguments, contract, link, deadline_at)
        return Engine(contract, **self._options), plan

    def check_arguments(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """Refuse arguments the function cannot take (``InvalidInputError`` naming the mismatch), so
        that no task is recorded, started or run that could never call it."""
        signature = self._signature()
        if signature is None:  # a callable whose signature Python cannot tell: it is called as it is
            return
        try:
            signature.bind(None, *args, **kwargs)  # None stands for the Run the function gets first
        except TypeError as exc:
            bare = signature.replace(  # the names and defaults say what it takes; annotations would only crowd them
                parameters=[parameter.replace(annotation=inspect.Parameter.empty) for parameter in signature.parameters.values()],
                return_annotation=inspect.Signature.empty,
            )
            raise InvalidInputError(f"{self.name}{bare} cannot take these arguments: {exc}; nothing was recorded") from None

    def _signature(self) -> inspect.Signature | None:
        """The function's signature, read once (``start_many`` checks thousands of calls with it)."""
        if self._signature_read is None:
            try:
                self._signature_read = (inspect.signature(self.fn),)
            except (TypeError, ValueError):
                self._signature_read = (None,)
        return self._signature_read[0]

    @property
    def is_async(self) -> bool:
        """Whether the function is ``async def`` (its steps are awaited: ``AsyncRun``)."""
        return inspect.iscoroutinefunction(self.fn)

    def run(
        self, task_id: str, *args: Any, wait: bool = False, timeout_s: float | None = None, deadline: datetime | None = None, **kwargs: Any
    ) -> RunOutcome:
        """Start the task with these arguments, or resume it; return why it stopped.

        With ``wait=True`` a wait (an approval, an answer, a message, a sleep, a child) does not
        end the call: the task is run again as soon as what it waits for may have come (see
        ``longrun.functions._waiting``), until it ends; after ``timeout_s`` (if given) the waiting
        outcome is returned. ``deadline`` (a timezone-aware ``datetime``) is a wall-clock deadline
        for the whole task, recorded by its first run (``longrun.deadline``; with
        ``Limits.deadline_s`` the earlier wins; a naive datetime is refused with ``InvalidInputError``).
        ``wait``, ``timeout_s`` and ``deadline`` are this method's, never the function's.

        An async function is run on an event loop of its own (``asyncio.run``); from async code,
        ``await fn.arun(...)`` instead."""
        check_wait(wait, timeout_s)
        deadline_at = deadline_timestamp(deadline) if deadline is not None else None
        if self.is_async:
            return run_coroutine(self.arun(task_id, *args, wait=wait, timeout_s=timeout_s, deadline=deadline, **kwargs), f"{self.name}.run")
        engine, plan = self._plan(task_id, args, kwargs, deadline_at=deadline_at)
        if not wait:
            return cancelled_down(engine, engine.run(plan))

        def once() -> RunOutcome:
            engine, plan = self._plan(task_id, args, kwargs, deadline_at=deadline_at)
            return cancelled_down(engine, engine.run(plan))

        with self._waiting(task_id, timeout_s) as waiting:
            return waiting.run(once)

    async def arun(
        self, task_id: str, *args: Any, wait: bool = False, timeout_s: float | None = None, deadline: datetime | None = None, **kwargs: Any
    ) -> RunOutcome:
        """``run``, awaited: an async function runs on this event loop, a synchronous one in a
        worker thread (so that many tasks can run side by side). With ``wait=True`` the waiting
        happens off the event loop (its looks and pauses in worker threads)."""
        check_wait(wait, timeout_s)
        deadline_at = deadline_timestamp(deadline) if deadline is not None else None
        if not wait:
            return await self._arun(task_id, args, kwargs, None, deadline_at)
        self._plan(task_id, args, kwargs)  # refuses bad arguments before anything waits
        with self._waiting(task_id, timeout_s) as waiting:
            return await waiting.arun(lambda: self._arun(task_id, args, kwargs, None, deadline_at))

    def _waiting(self, task_id: str, timeout_s: float | None) -> Waiting:
        store, clock = self._store_and_clock()
        approvals = self._options.get("approvals") or store
        cancellations = self._options.get("cancellations") or store
        return Waiting(check_task_id(task_id), store, approvals, cancellations, clock, timeout_s)

    async def _arun(
        self,
        task_id: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        link: ChildLink | None,
        deadline_at: float | None = None,
    ) -> RunOutcome:
        engine, plan = self._plan(task_id, args, kwargs, link=link, deadline_at=deadline_at)
        if not self.is_async:
            outcome = await asyncio.to_thread(engine.run, plan)
        else:
            outcome = await engine.arun(plan)
        if outcome.status in (Status.CANCELLED, Status.DEADLINE_EXCEEDED):  # the store's calls block: in a thread, off this loop
            return await asyncio.to_thread(cancelled_down, engine, outcome)
        return outcome

    async def arun_child(
        self,
        task_id: str,
        parent: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        link: ChildLink | None = None,
    ) -> RunOutcome:
        """``run_child``, awaited."""
        return await self._arun(task_id, args, kwargs, link or ChildLink.of(parent))

    def plan_digest(self, task_id: str, *args: Any, **kwargs: Any) -> str:
        """The plan digest a task of this function with these arguments has: what an approval written
        ahead of the first run binds to (the contract, the function's name and the arguments)."""
        return self._plan(task_id, args, kwargs)[1].digest

    def start(self, task_id: str, *args: Any, deadline: datetime | None = None, **kwargs: Any) -> bool:
        """Record the task with these arguments without running it, for a worker to pick up
        (``longrun worker``); ``enqueue`` with priority 0. ``deadline`` is this method's, never the
        function's: see ``enqueue``."""
        return self.enqueue(task_id, args, kwargs, deadline=deadline)

    async def astart(self, task_id: str, *args: Any, deadline: datetime | None = None, **kwargs: Any) -> bool:
        """``start`` from async code: the store's calls block, so they run in a worker thread."""
        checked = _calls([(task_id, args, kwargs)])
        deadline_at = self._queued_deadline(deadline, 0)
        return (await asyncio.to_thread(self._enqueue_many, checked, 0, deadline_at))[0]

    def _queued_deadline(self, deadline: datetime | None, delay_s: float) -> float | None:
        """The epoch seconds of a deadline given to ``start``/``enqueue``; ``InvalidInputError`` for a
        naive datetime, one already past, or one before the delay ends (the task could never run)."""
        if deadline is None:
            return None
        at = deadline_timestamp(deadline)
        now = self._store_and_clock()[1].now()
        if at <= now:
            raise InvalidInputError(f"deadline {deadline.isoformat()} has already passed; nothing was recorded")
        if delay_s and at <= now + delay_s:
            raise InvalidInputError(f"deadline {deadline.isoformat()} comes before delay_s={delay_s:g} ends; nothing was recorded")
        return at

    def start_many(self, calls: Iterable[StartCall], *, priority: int = 0) -> list[bool]:
        """``start`` for many tasks at once: each call is ``(task_id, args)`` or ``(task_id, args,
        kwargs)``, as ``start(task_id, *args, **kwargs)`` would take them. The new tasks' first
        revisions are written in one store transaction (the SQL stores; the JSON-file store writes
        each as a commit) and queued in one more. Returns, in order, True for each task this call
        recorded, False for one recorded before with the same function and arguments. Every call
        is checked before anything is written (``InvalidInputError``; a task id given twice too).
        A task that exists with other arguments or another plan is refused with ``InvalidInputError``
        and left as it is; the others in the call are still recorded and queued."""
        self._refuse_on_a_loop("start_many", "`await fn.astart_many(...)`")
        return self._enqueue_many(_calls(calls), priority)

    def _refuse_on_a_loop(self, what: str, instead: str) -> None:
        """An async function's tasks are started from a running event loop with ``astart``: the
        store's calls block, and would block the loop."""
        if not self.is_async:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        raise InvalidInputError(f"{what}: an event loop is running in this thread; use {instead}")

    async def astart_many(self, calls: Iterable[StartCall], *, priority: int = 0) -> list[bool]:
        """``start_many`` from async code, in a worker thread."""
        checked = _calls(calls)
        return await asyncio.to_thread(self._enqueue_many, checked, priority)

    def enqueue(
        self,
        task_id: str,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        queue: "str | Queue | None" = None,
        delay_s: float = 0,
        dedup_id: str | None = None,
        priority: int = 0,
        deadline: datetime | None = None,
    ) -> bool:
        """Record the task (its first revision, as a first run would commit it, without calling the
        function) and put it in the store's fleet queue with ``priority`` (higher runs first).

        ``queue``: a named queue (``longrun.Queue``, defined in the store; a ``Queue`` given here is
        defined, its limits replacing those stored) whose limits bound when a worker starts it.
        ``delay_s``: not started before that many seconds from now. ``dedup_id``: refused with
        ``DuplicateTaskError`` (naming the holder) while another task enqueued with that id in the
        same queue has not ended. ``deadline``: a timezone-aware ``datetime``, the task's wall-clock
        deadline, recorded with it now (``status`` shows it while it is queued); when its first run
        starts, ``Limits.deadline_s`` from then is recorded instead if it comes first. A naive
        datetime, one already past or one before ``delay_s`` ends is refused with
        ``InvalidInputError``, nothing recorded. Queue, delay, dedup id and deadline apply to a task
        this call records (one recorded before keeps its own).

        True if this call recorded it; False if it was recorded before with the same function and
        arguments (its priority is set, nothing else changes). Other arguments, or another function
        or plan under the same task id, are refused with ``InvalidInputError``, changing nothing."""
        self._refuse_on_a_loop(f"starting task {task_id!r}", "`await fn.astart(...)`")
        calls = _calls([(task_id, args, dict(kwargs or {}))])
        if isinstance(delay_s, bool) or not isinstance(delay_s, (int, float)) or not 0 <= delay_s <= 366 * 86400:
            raise InvalidInputError(f"delay_s is a number of seconds in [0, one year], got {delay_s!r}")
        deadline_at = self._queued_deadline(deadline, delay_s)
        if queue is None and not delay_s and dedup_id is None:
            return self._enqueue_many(calls, priority, deadline_at)[0]
        queue_name = queue.name if isinstance(queue, Queue) else queue
        if queue_name is not None:
            check_queue_name(queue_name)
        if dedup_id is not None:
            check_dedup_id(dedup_id)
        self._plan(task_id, calls[0][1], calls[0][2])  # its arguments are checked before anything is written
        store = self._options["store"]
        fleet = self._fleet_queue(store)
        fleet.ensure()
        if isinstance(queue, Queue):
            fleet.define_queue(queue)
        new = self._unrecorded(store, task_id)
        reserved = dedup_id is not None and new
        if reserved:
            assert dedup_id is not None
            fleet.reserve_dedup(queue_name or "", dedup_id, task_id, functools.partial(_ended, store))
        try:
            if new and queue_name is not None:
                fleet.place(task_id, self.name, queue_name, not_before_s=float(delay_s), priority=priority)
            elif new:
                fleet.delay(task_id, self.name, float(delay_s), priority=priority)
            created = self._enqueue_many(calls, priority, deadline_at)[0]
        except BaseException:
            if reserved:
                assert dedup_id is not None
                fleet.release_dedup(queue_name or "", dedup_id, task_id)
            raise
        if new:
            fleet.make_due(task_id)  # placed parked before its record: due now (not before its delay)
        return created

    @staticmethod
    def _unrecorded(store: Store, task_id: str) -> bool:
        try:
            return store.load(task_id).state is None
        except UnknownTaskError:
            return True

    def _fleet_queue(self, store: Store) -> TaskQueue:
        """The fleet queue of ``store``, kept open between calls (one per store)."""
        with self._queue_lock:
            queue = self._queue
            if queue is None or queue.store is not store:  # one per store: a clone (with_options) may have another
                queue = self._queue = open_queue(store)
                # Closed when this function object goes (or at exit), before its connection is collected.
                weakref.finalize(self, queue.close)
        return queue

    def _enqueue_many(
        self, calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]], priority: int, deadline_at: float | None = None
    ) -> list[bool]:
        plans = [self._recording_plan(task_id, args, kwargs, deadline_at) for task_id, args, kwargs in calls]
        if not plans:
            return []
        store = self._options["store"]
        queue = self._fleet_queue(store)
        queue.ensure()  # the queue's triggers exist before the first record, so nothing is missed
        clock = self._options.get("clock")
        now = clock.now() if clock is not None else time.time()
        if isinstance(store, RecordingStore):
            store_spec = store_spec_of(store)
            created = store.record_new([plan.first_state(task_id, now, store_spec) for (task_id, _, _), plan in zip(calls, plans)], now)
        else:
            created = [False] * len(calls)
        refused: list[InvalidInputError] = []
        outcomes: list[bool | None] = list(created)  # None: refused
        for index, made in enumerate(created):
            if not made:  # it exists (or a store that cannot record): read it, check its plan, or record it as a run
                task_id, args, kwargs = calls[index]
                engine, plan = self._plan(task_id, args, kwargs, deadline_at=deadline_at)
                try:
                    outcomes[index] = self._record(engine, plan)
                except InvalidInputError as exc:
                    refused.append(exc)
                    outcomes[index] = None
        # The tasks recorded are queued even if another was refused: a recorded task is never left out of the queue.
        queue.enqueue_many([task_id for (task_id, _, _), made in zip(calls, outcomes) if made is not None], self.name, priority=priority)
        if refused:
            raise refused[0]
        return [bool(made) for made in outcomes]

    def _recording_plan(self, task_id: str, args: tuple[Any, ...], kwargs: dict[str, Any], deadline_at: float | None = None) -> FunctionPlan:
        """``_plan`` without the engine: what recording a first revision needs."""
        contract = self.contract_for(task_id)
        self.check_arguments(args, kwargs)
        arguments = ensure_json({"args": list(args), "kwargs": dict(kwargs)}, what=f"arguments of {self.name}")
        assert isinstance(arguments, dict)
        return FunctionPlan(self, arguments, contract, deadline_at=deadline_at)

    def _record(self, engine: Engine, plan: FunctionPlan) -> bool:
        """Commit the task's first revision unless it has one; True if this call did. Refuses another plan."""
        config = engine.config
        task_id = config.task_id
        created = False
        for _ in range(100):
            try:
                state = config.store.load(task_id).state
            except UnknownTaskError:
                state = None
            if state is not None:
                break
            outcome = Recording(plan).record(engine)
            if outcome.status is Status.QUEUED:
                created = True
                break
            if outcome.status is not Status.ALREADY_RUNNING:
                raise InvalidInputError(f"task {task_id!r} could not be recorded: {outcome.status.value}: {outcome.next_action}")
            config.clock.sleep(0.05)  # another process is recording it: read what it records
        else:
            raise InvalidInputError(f"task {task_id!r} is held by another process that records nothing; try again")
        if state is not None and state.plan_digest != plan.digest:
            raise InvalidInputError(
                f"task {task_id!r} exists with plan digest {state.plan_digest}, not {plan.digest} ({self.name} with these "
                "arguments): it was started with other arguments or by other code; nothing was changed"
            )
        return created

    @property
    def engine_options(self) -> Mapping[str, Any]:
        """The engine's keyword arguments this function was decorated with (read-only)."""
        return MappingProxyType(self._options)

    def with_options(self, **options: Any) -> "DurableFunction[R]":
        """This function with some engine options replaced (``store``, ``adapters``, ``owner``,
        ``cancellations``, ...): same name, so the same tasks and plan digests. A worker runs each
        thread's tasks through its own store connection this way."""
        known = {"store", "adapters", *EngineOptions.__optional_keys__}
        unknown = sorted(set(options) - known)
        if unknown:
            raise InvalidInputError(f"unknown engine options {unknown}; known: {sorted(known)}")
        merged = {**self._options, **options}
        Engine(self._contract, **merged)  # validates them now, not at the first run
        clone = copy.copy(self)
        clone._options = merged
        clone._queue, clone._queue_lock = None, threading.Lock()
        return clone

    def fork(self, task_id: str, new_task_id: str, *, from_step: str | None = None) -> str:
        """Record ``new_task_id``: a fork of ``task_id`` (a task of this function) that starts with the
        origin's verified effects and recorded calls before ``from_step`` copied as recorded (never
        applied again) and makes ``from_step`` and what follows itself, under its own effect keys
        (default: from the origin's first step not verified). It runs with the origin's recorded
        arguments, as a worker or ``run``/``longrun resume`` runs it; the origin records the fork.
        Returns the step the fork starts at (``""`` if every step was copied). See ``functions._fork``
        for what is refused (``UnknownTaskError``, ``UnknownStepError``, ``TaskExistsError``, ...)."""
        check_task_id(task_id)
        check_task_id(new_task_id)
        store = self._options["store"]
        if store.load(task_id).state is None:  # UnknownTaskError for a task the store does not hold
            raise UnknownTaskError(f"task {task_id!r} has no committed state; nothing was written")
        now = (self._options.get("clock") or SystemClock()).now()
        with holding_origin(store, task_id, now) as (lease, origin):
            args, kwargs = self._recorded_arguments(origin, ForkRefusedError)
            made = check_new_task(store, new_task_id, task_id)
            if made is not None and from_step is not None and made["step"] != from_step:
                raise TaskExistsError(
                    f"task {new_task_id!r} already exists: a fork of {task_id!r} from step {made['step']!r}, not "
                    f"{from_step!r}; nothing was written"
                )
            if made is not None:  # a fork of this origin that stopped before the origin recorded it
                start_at = str(made["step"])
            else:
                start_at, copied = records_to_copy(origin, from_step)
                engine, plan = self._plan(new_task_id, tuple(args), dict(kwargs))
                forking = Forking(plan, copied, {"task": task_id, "step": start_at})
                queue = open_queue(engine.config.store)
                try:
                    queue.ensure()
                    outcome = run_coroutine(engine.arun(forking), f"forking {task_id!r}") if engine.config.asynchronous else engine.run(forking)
                    if outcome.status is not Status.RUNNING:
                        raise InvalidInputError(f"task {new_task_id!r} could not be recorded: {outcome.status.value}: {outcome.next_action}")
                    queue.enqueue(new_task_id, self.name)
                finally:
                    queue.close()
            record_fork_in_origin(store, lease, origin, new_task_id, start_at, now)
        return start_at

    def reopen(
        self,
        task_id: str,
        reason: str,
        *,
        by: str,
        add_attempts: int = 0,
        add_time_s: float = 0.0,
        write_to: ApprovalWriter | None = None,
        sign: Signer | None = None,
    ) -> RunOutcome:
        """Reopen ``task_id`` (ended cancelled, blocked, limits-exhausted, or another ``REOPENABLE``
        status) as ``by``, for ``reason``, with ``add_attempts`` more attempts per unfinished effect
        and ``add_time_s`` more seconds of work, and run it once with its recorded arguments. The
        reopen is a control record (``longrun.intervention.reopen``), written to the store, or to
        ``write_to``, signed by ``sign`` if given (``functools.partial(longrun.authority.sign_approval, key=key)``): it must be where this function's approval
        source reads. ``ReopenRefusedError`` for a task that is done or has not ended."""
        store = self._options["store"]
        reopen(store, task_id, reason, by=by, add_attempts=add_attempts, add_time_s=add_time_s, write_to=write_to, sign=sign)
        return self.resume(task_id)

    def resume(self, task_id: str) -> RunOutcome:
        """Run ``task_id`` once with the arguments it records (as ``longrun resume STORE TASK`` does)."""
        state = self._options["store"].load(task_id).state
        if state is None:
            raise UnknownTaskError(f"task {task_id!r} has no committed state; nothing was run")
        args, kwargs = self._recorded_arguments(state)
        return self.run(task_id, *args, **kwargs)

    def _recorded_arguments(
        self, state: RunState, error: type[InvalidInputError] = InvalidInputError
    ) -> tuple[list[Any], dict[str, Any]]:
        record = state.effects.get(FUNCTION_STEP)
        payload = record.payload if record is not None else None
        if payload is None or payload.get("function") != self.name:
            named = payload.get("function") if payload is not None else None
            what = f"a task of {named}" if isinstance(named, str) else "not a durable function's task"
            raise error(f"task {state.task_id!r} is {what}, not of {self.name}; nothing was done")
        args, kwargs = payload.get("args"), payload.get("kwargs")
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise error(f"task {state.task_id!r}: its function record holds no arguments; nothing was done")
        return args, kwargs

    def run_child(
        self,
        task_id: str,
        parent: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        link: ChildLink | None = None,
    ) -> RunOutcome:
        """``run`` for a child task of ``parent`` (``Run.child``): its first record names the parent
        and the rest of ``link`` (its lineage, whether it is detached, whose cancellation reaches it)."""
        link = link or ChildLink.of(parent)
        if self.is_async:
            return run_coroutine(self.arun_child(task_id, parent, args, kwargs, link=link), f"child {task_id!r}")
        engine, plan = self._plan(task_id, args, kwargs, link=link)
        return cancelled_down(engine, engine.run(plan))

    def _store_and_clock(self) -> tuple[Store, Clock]:
        clock = self._options.get("clock")
        return self._options["store"], clock if clock is not None else SystemClock()

    def send(
        self,
        task_id: str,
        topic: str,
        value: JSONValue,
        *,
        key: str | None = None,
        sender: str = "outside",
        write_to: ApprovalWriter | None = None,
        sign: Signer | None = None,
    ) -> Posted:
        """Send ``value`` to task ``task_id`` on ``topic`` from outside any task: its ``run.recv(topic)``
        returns it, once (a waiting run or a worker running the task is woken, as by an answer).

        The message travels as a control record (``longrun.outside_messages``), like an answer: written
        to the store, or to ``write_to`` (a ``FileControlSource``), signed by ``sign`` if given
        (``functools.partial(longrun.authority.sign_approval, key=key)``); it must be where this
        function's approval source reads. ``key`` deduplicates at the receiver: of the messages
        with one key (sent again, or by a task) one is received; when the task's mailbox already
        holds it, nothing is written (``Posted.duplicate``). Without a key every call is a new
        message. Refused, with nothing written: ``SignatureRequiredError`` without ``sign`` when the
        function's approval source accepts only signed records, ``UnknownTaskError`` for a task the
        store does not hold, ``SizeLimitError`` for a value over ``messages.MAX_MESSAGE_BYTES`` (or
        a record over ``control.MAX_RECORD_BYTES``), ``InvalidInputError`` for a value that is not JSON."""
        check_task_id(task_id)
        store, clock = self._store_and_clock()
        approvals = self._options.get("approvals") or store
        return post_message(
            store, task_id, topic, value, key=key, sender=sender, sent_at=clock.now(),
            write_to=write_to, sign=sign,
            signature_required=requires_signature(approvals),
        )  # fmt: skip

    def get_event(self, task_id: str, key: str, *, timeout_s: float | None = None) -> JSONValue:
        """The latest value task ``task_id`` set for event ``key`` (``run.set_event``), as committed;
        None if it has not set it. With ``timeout_s``, waits up to that long for it to be set
        (reading the state again every ``task_events.EVENT_POLL_S`` on this function's clock)."""
        store, clock = self._store_and_clock()
        return read_event(store, task_id, key, timeout_s=timeout_s, clock=clock)[1]

    def __repr__(self) -> str:
        return f"<durable function {self.name}>"

StartCall = tuple[str, Sequence[Any]] | tuple[str, Sequence[Any], Mapping[str, Any]]
"""One task for ``start_many``: ``(task_id, args)`` or ``(task_id, args, kwargs)``."""


def _calls(calls: Iterable[StartCall]) -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    """``start_many``'s calls as ``(task_id, args, kwargs)``, each checked; a task id given twice is refused."""
    if isinstance(calls, (str, bytes, Mapping)):
        raise InvalidInputError("start_many takes an iterable of (task_id, args) or (task_id, args, kwargs) tuples")
    checked = []
    seen: set[str] = set()
    for call in calls:
        if not isinstance(call, tuple) or len(call) not in (2, 3):
            raise InvalidInputError(f"a start_many call is (task_id, args) or (task_id, args, kwargs), got {call!r:.80}")
        task_id, args = call[0], call[1]
        kwargs = call[2] if len(call) == 3 else {}
        check_task_id(task_id)
        if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
            raise InvalidInputError(f"task {task_id!r}: args must be a sequence (a tuple or list), got {type(args).__name__}")
        if not isinstance(kwargs, Mapping) or not all(isinstance(name, str) for name in kwargs):
            raise InvalidInputError(f"task {task_id!r}: kwargs must be a mapping of names to values")
        if task_id in seen:
            raise InvalidInputError(f"task {task_id!r} is given twice; nothing was recorded")
        seen.add(task_id)
        checked.append((task_id, tuple(args), dict(kwargs)))
    return checked


def durable(
    *,
    store: Store,
    version: str | None = None,
    adapters: Mapping[str, AnyEffectAdapter] | None = None,
    contract: RunContract | None = None,
    allowed_actions: tuple[str, ...] = (),
    forbidden_actions: tuple[str, ...] = (),
    goal: str | None = None,
    **engine_options: Unpack[EngineOptions],
) -> Callable[[Callable[..., R]], DurableFunction[R]]:
    """Make ``fn(run, *args, **kwargs)`` a durable function (see the module docstring).

    An ``async def`` function gets an ``AsyncRun`` and may use async adapters; a synchronous one
    gets a ``Run`` and refuses them here. ``timeout_s`` bounds every ``apply`` and call (a step's
    own overrides it); ``max_parallel`` bounds the steps in flight at once (``asyncio.gather`` in
    an async function, ``run.map`` in a synchronous one).

    ``contract`` is a ``RunContract`` whose task id is replaced by each run's; without one, a
    contract is built from ``goal``, ``allowed_actions`` and ``forbidden_actions``. ``on_event``
    receives a ``longrun.events.RunEvent`` after each commit that made a transition durable.
    ``version`` is the code version each task records when it starts (default: a digest of the
    function's module source); ``longrun worker --version-policy same`` runs only tasks of its own.
    """
    if contract is not None and (allowed_actions or forbidden_actions or goal is not None):
        raise InvalidInputError("give either contract= or goal/allowed_actions/forbidden_actions, not both")

    def decorate(fn: Callable[..., R]) -> DurableFunction[R]:
        if not callable(fn):
            raise InvalidInputError(f"@durable needs a function, got {fn!r}")
        name = qualified_name(fn)
        if name.startswith("__main__:"):
            raise InvalidInputError(
                f"@durable function {name.partition(':')[2]!r} is defined in __main__, which no other process can import "
                "(python -c, a REPL, a notebook, or a script named like a standard module), so its tasks could not be "
                "resumed by `longrun resume` or a worker: define it in a module file (not named like a standard module) "
                "and import it, or run that file as a script or with `python -m`"
            )
        base = contract or RunContract(
            "durable-function",
            goal or f"run {qualified_name(fn)} to completion",
            allowed_actions=tuple(allowed_actions),
            forbidden_actions=tuple(forbidden_actions),
        )
        options: dict[str, Any] = dict(
            engine_options, store=store, adapters=dict(adapters or {}), asynchronous=inspect.iscoroutinefunction(fn)
        )
        Engine(base, **options)  # validates the options now, not at the first run
        return DurableFunction(fn, base, options, version)

    return decorate
