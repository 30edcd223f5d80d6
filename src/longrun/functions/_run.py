"""``Run`` and ``AsyncRun``: the handle a durable function gets, synchronous or awaited."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping, Sequence

from ..engine import is_async_callable, procedures
from ..budget import RetryPolicy
from ..canonical import JSONValue
from ..errors import InvalidInputError
from ..ledger import EffectState
from ._lineage import ChildFunction, qualified_name
from ._steps import RunSteps, check_on_exhausted


__all__ = ["AsyncRun", "Run"]


class Run(RunSteps):
    """What a durable function receives as its first argument: the steps it may take.

    ``effect`` makes a side effect through the ledger; ``map`` makes several at once; ``call``
    records a read, a computation or a model's answer; ``sleep`` waits durably; ``ask`` waits for a
    person's answer; ``child`` runs another durable task to completion; ``send`` and ``recv``
    pass messages between tasks; ``set_event`` publishes a value others read.
    Each takes a step id first (``send``, ``recv`` and ``set_event`` derive one unless given
    ``step_id=``): unique within one run of the function, stable across runs.
    """

    def effect(
        self,
        step_id: str,
        action: str,
        payload: Mapping[str, Any],
        *,
        approval: bool = False,
        observe_first: bool = False,
        retry: RetryPolicy | None = None,
        timeout_s: float | None = None,
        on_exhausted: str = "stop",
    ) -> JSONValue:
        """Make a side effect through the ledger, exactly as a declared step; return its result.

        ``started`` is durable before the adapter is called; an interrupted effect is observed
        before any retry; ``approval=True`` gates it on a scoped approval; ``observe_first=True``
        observes before the first apply (for effects an earlier system or task may have made).
        ``retry`` and ``timeout_s`` override the run's for this effect: past ``timeout_s`` the
        effect is uncertain and observed (``apply`` then runs in a worker thread).
        ``on_exhausted="raise"``: once the effect has used all its attempts (``Limits.max_attempts``),
        each certainly not applied, ``EffectFailed`` is raised into the function (recorded, and
        raised again on every replay) so that it can compensate, instead of the run stopping
        ``limits-exhausted``.
        """
        if on_exhausted != "stop":  # the default needs no check (nor a call on every effect)
            check_on_exhausted(on_exhausted)
        step = self._effect_step(step_id, action, payload, approval, observe_first)
        return self._effect_result(self._engine.drive(procedures.effect, step, retry=retry, timeout_s=timeout_s, on_exhausted=on_exhausted))

    def map(
        self,
        step_prefix: str,
        action: str,
        payloads: Sequence[Mapping[str, Any]],
        *,
        approval: bool = False,
        retry: RetryPolicy | None = None,
        timeout_s: float | None = None,
        max_parallel: int | None = None,
    ) -> list[JSONValue]:
        """Make one effect per payload at once (step ids ``<step_prefix>/0``, ``/1``, ...), at most
        ``max_parallel`` at a time (else the function's); return their results in order.

        Each is an ``effect`` with its own key, digest, approval and attempts; the adapters run in
        worker threads, and the starts that become ready together share one commit. If one stops
        the run (say, it awaits approval), the others in flight settle and nothing new starts."""
        if not isinstance(step_prefix, str) or not step_prefix:
            raise InvalidInputError("map needs a non-empty step prefix")
        made = [
            self._effect_step(f"{step_prefix}/{index}", action, payload, approval, False) for index, payload in enumerate(payloads)
        ]
        engine = self._engine
        records = engine.run_parallel(
            [engine.steps(procedures.effect, step, retry=retry, timeout_s=timeout_s) for step in made],
            max_parallel if max_parallel is not None else engine.config.max_parallel,
        )
        return [record.result for record in records]

    def call(
        self,
        step_id: str,
        fn: Callable[..., Any],
        *args: Any,
        retry: RetryPolicy | None = None,
        replay: str = "strict",
        timeout_s: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """Call ``fn(*args, **kwargs)`` once and record its JSON result; replay it afterwards.

        ``TransientError`` (and running past ``timeout_s``) is retried with backoff under the
        persistent attempt counter; ``PermanentError`` stops the run ``blocked``; any other
        exception is recorded and raised into the function as ``CallFailed``, identically on every
        replay. ``replay="by-id"`` accepts a recorded result even if the arguments changed (say, a
        timestamp among them).
        """
        if inspect.iscoroutinefunction(fn):
            raise InvalidInputError(f"step {step_id!r}: {qualified_name(fn)} is async; call it from an async durable function")
        step = self._call_step(step_id, fn, args, kwargs, replay)
        record = self._engine.drive(procedures.call, step, lambda: fn(*args, **kwargs), retry=retry, timeout_s=timeout_s)
        return self._call_result(step_id, record)

    def sleep(self, step_id: str, seconds: float) -> None:
        """Wait ``seconds`` durably: the wake time is recorded when the step is first reached.

        A wait longer than ``Limits.max_block_s`` stops the run ``sleeping`` with ``wake_at``; run
        the task again at or after that time (a worker does it by itself)."""
        self._engine.drive(procedures.timer, self._sleep_step(step_id, seconds), float(seconds))

    def ask(self, step_id: str, question: str, *, choices: Sequence[JSONValue] | None = None) -> JSONValue:
        """A person's answer, as a value. Until it is given the run stops ``awaiting-input``.

        ``longrun answer STORE TASK STEP VALUE`` records it, bound to the task, the plan, the step and
        the question's digest, single use, through the same sources as approvals (the store, strict
        files, signed records). With ``choices``, an answer outside them is refused and asked again."""
        return self._ask(step_id, question, choices)

    def child(self, task_id: str, function: ChildFunction, *args: Any, detached: bool = False, **kwargs: Any) -> Any:
        """Start or resume another durable task (its own lease and ledger) and return its result.

        While the child is not done, this run stops ``waiting-on-child`` with the child's next
        action; run it again once the child has moved on. A child that ended without finishing is
        raised into the function as ``CallFailed``. The parent's record names the child task, and
        the child's names its parent and lineage. Cancelling this task cancels the child while it is
        unfinished, unless ``detached=True`` (then it runs on by itself). A child that is this task
        or one of its ancestors is refused with ``ChildCycleError``."""
        step_id, record = self._engine.drive(self._child_record, task_id, function, args, kwargs, detached)
        if record.state is EffectState.PLANNED:
            outcome = function.run_child(task_id, self.task_id, args, kwargs, link=self._link(detached))
            record = self._engine.drive(self._child_settled, step_id, task_id, outcome)
        return self._child_result(step_id, record)

    def send(self, to_task: str, topic: str, value: JSONValue, *, key: str | None = None, step_id: str | None = None) -> int:
        """Send ``value`` (JSON, at most ``messages.MAX_MESSAGE_BYTES``) to task ``to_task`` on
        ``topic``, once; return its number in the receiver's mailbox.

        Recorded once: replay sends nothing. ``key`` deduplicates at the receiver (a second message
        with a key already there is not stored); without one, the key is this task and the step id,
        so a send repeated after a crash is one message. The step id is ``step_id``, else derived:
        ``longrun.send:<to_task>/<topic>@<n>`` for the n-th such send of this run. A receiver the
        store does not hold raises ``UnknownTaskError`` (recorded: raised again on replay)."""
        engine = self._engine
        return self._sent(engine.drive(procedures.send, self._send_step(to_task, topic, value, key, step_id)))

    def recv(self, topic: str, *, timeout_s: float | None = None, step_id: str | None = None) -> JSONValue:
        """The value of the oldest message on ``topic`` that this task has not received yet
        (messages sent before the receive are kept), recorded once: consumed exactly once.

        Without one the run stops ``awaiting-input`` until a message is sent (``longrun send``,
        ``fn.send``, or ``run.send`` from another task; a worker is woken by it). With
        ``timeout_s`` it returns ``None`` once that time has passed since the step was first
        reached (the end is recorded: replay returns ``None`` again); a timeout within
        ``Limits.max_block_s`` is waited for in the process. Step id: ``step_id``, else
        ``longrun.recv:<topic>@<n>`` for the n-th receive on that topic of this run."""
        engine = self._engine
        step = self._recv_step(topic, timeout_s, step_id)
        return self._received(engine.drive(procedures.receive, step, timeout_s))

    def set_event(self, key: str, value: JSONValue, *, step_id: str | None = None) -> None:
        """Publish ``value`` (JSON, at most ``messages.MAX_MESSAGE_BYTES``) as this task's event
        ``key``: the latest set wins. Committed at once, recorded once (replay sets nothing).
        Read it with ``fn.get_event``, ``longrun event`` or ``longrun status``. Step id:
        ``step_id``, else ``longrun.event:<key>@<n>`` for the n-th set of that key in this run."""
        engine = self._engine
        engine.drive(procedures.set_event, self._event_step(key, value, step_id))

    def progress(self, done: float, total: float | None = None, note: str | None = None) -> None:
        """Record how far the function has come: ``done`` units of ``total`` (if known), with a note.

        Kept in the task's state, not as a step: it changes no replay, and a function may report as
        often as it likes. It goes out with the next commit, or commits by itself at most once a
        second. ``watch``, ``ls``, ``status``, the console and ``longrun metrics`` show it, with the
        rate between two reported points and the time left at that rate."""
        self._engine.drive(procedures.report_progress, done, total, note)


class AsyncRun(RunSteps):
    """What an ``async`` durable function receives: ``Run``'s steps, awaited.

    Steps awaited together run at once (``asyncio.gather(*(run.effect(...) for ...))``), at most
    ``max_parallel`` at a time, each with its own key, digest, approval and attempts; the starts
    that become ready together share one commit. Adapters may be async (``apply`` and ``observe``
    coroutines) or synchronous (run in worker threads). If one step stops the run, the others in
    flight settle, and nothing new starts.
    """

    async def effect(
        self,
        step_id: str,
        action: str,
        payload: Mapping[str, Any],
        *,
        approval: bool = False,
        observe_first: bool = False,
        retry: RetryPolicy | None = None,
        timeout_s: float | None = None,
        on_exhausted: str = "stop",
    ) -> JSONValue:
        """``Run.effect``, awaited. Past ``timeout_s`` (else the run's, else the retry policy's
        ``deadline_s``) the apply is cancelled, and the effect is uncertain and observed."""
        if on_exhausted != "stop":  # the default needs no check (nor a call on every effect)
            check_on_exhausted(on_exhausted)
        step = self._effect_step(step_id, action, payload, approval, observe_first)
        engine = self._engine
        record = await engine.driver.step(engine.steps(procedures.effect, step, retry=retry, timeout_s=timeout_s, on_exhausted=on_exhausted))
        return self._effect_result(record)

    async def call(
        self,
        step_id: str,
        fn: Callable[..., Any],
        *args: Any,
        retry: RetryPolicy | None = None,
        replay: str = "strict",
        timeout_s: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """``Run.call``, awaited; ``fn`` may be a coroutine function (awaited) or a plain one (run in
        a worker thread, so that it does not block the other steps)."""
        step = self._call_step(step_id, fn, args, kwargs, replay)
        engine = self._engine
        steps = engine.steps(procedures.call, step, lambda: fn(*args, **kwargs), retry=retry, timeout_s=timeout_s, awaitable=is_async_callable(fn))
        return self._call_result(step_id, await engine.driver.step(steps))

    async def sleep(self, step_id: str, seconds: float) -> None:
        """``Run.sleep``, awaited."""
        step = self._sleep_step(step_id, seconds)
        engine = self._engine
        await engine.driver.step(engine.steps(procedures.timer, step, float(seconds)))

    async def ask(self, step_id: str, question: str, *, choices: Sequence[JSONValue] | None = None) -> JSONValue:
        """``Run.ask``: reads the answer (it never waits for a person; without one the run stops)."""
        step, choice_list = self._question(step_id, question, choices)
        engine = self._engine
        return (await engine.driver.step(engine.steps(procedures.ask, step, choice_list))).result

    async def child(
        self, task_id: str, function: ChildFunction, *args: Any, detached: bool = False, **kwargs: Any
    ) -> Any:
        """``Run.child``, awaited: an async child runs on this event loop, a synchronous one in a thread."""
        engine = self._engine  # the store reads, the cancellation read and the commit: off this loop
        step_id, record = await engine.driver.step(engine.steps(self._child_record, task_id, function, args, kwargs, detached))
        if record.state is EffectState.PLANNED:
            outcome = await function.arun_child(task_id, self.task_id, args, kwargs, link=self._link(detached))
            record = await engine.driver.step(engine.steps(self._child_settled, step_id, task_id, outcome))
        return self._child_result(step_id, record)

    async def send(self, to_task: str, topic: str, value: JSONValue, *, key: str | None = None, step_id: str | None = None) -> int:
        """``Run.send``, awaited."""
        engine = self._engine
        step = self._send_step(to_task, topic, value, key, step_id)
        return self._sent(await engine.driver.step(engine.steps(procedures.send, step)))

    async def recv(self, topic: str, *, timeout_s: float | None = None, step_id: str | None = None) -> JSONValue:
        """``Run.recv``, awaited (a wait within ``Limits.max_block_s`` does not block the event loop)."""
        engine = self._engine
        step = self._recv_step(topic, timeout_s, step_id)
        return self._received(await engine.driver.step(engine.steps(procedures.receive, step, timeout_s)))

    async def set_event(self, key: str, value: JSONValue, *, step_id: str | None = None) -> None:
        """``Run.set_event``, awaited."""
        engine = self._engine
        step = self._event_step(key, value, step_id)
        await engine.driver.step(engine.steps(procedures.set_event, step))

    async def progress(self, done: float, total: float | None = None, note: str | None = None) -> None:
        """``Run.progress``, awaited (a commit it makes runs off the event loop)."""
        engine = self._engine
        await engine.driver.run(engine.steps(procedures.report_progress, done, total, note))
