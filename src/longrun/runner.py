"""The declared-plan face: ``Runner(contract, steps, ...)`` walks a plan known up front through the engine.

``Runner(contract, steps, store=..., adapters=...).run()`` takes the task's lease, recovers, and
applies the plan's effects one at a time, in order, until the run is done or reaches a legal stop,
which it returns as a ``RunOutcome`` with one safe next action. Call it again (after a crash, an
approval, a backoff) and it continues where the durable state says, never repeating a verified
effect. Every rule of the run lives in ``longrun.engine``; this module only says what the plan is.

The plan may grow: a task started with steps ``[a, b]`` may be run with ``[a, b, c]`` (the new
plan digest is recorded, and pending approval requests are issued again under it). Any other
change (a step changed, removed or reordered, another contract) stops ``plan-mismatch`` before
anything is written.

The durability rules (intent persisted before ``apply``, observation before any retry, fresh
cancellation and approvals, the fenced lease) are the engine's: see ``longrun.engine``.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from .budget import Limits, RetryPolicy
from .canonical import JSONValue
from .clock import SystemClock
from .contract import RunContract, Step, plan_digest, plan_prefix_digests, validate_plan
from .engine import Engine, default_owner, utc
from .envelope import PlanOutline, RunState
from .events import EventHook
from .errors import UnknownActionError
from .ledger import EffectState
from .outcome import TERMINAL, RunOutcome
from .protocols import ApprovalSource, CancellationSource, Clock, EffectAdapter, Store

__all__ = ["Runner", "SystemClock", "default_owner", "utc"]


class Runner:
    """Runs a plan declared up front: ``Runner(contract, steps, store=..., adapters=...).run()``.

    Each call of ``run()`` is a recovery followed by as much progress as the run may make now. Keyword
    arguments configure the engine: ``owner`` (a label for people), ``clock``, ``limits``, ``retry``,
    ``lease_ttl_s``, the ``approvals`` / ``cancellations`` sources (the store by default), and
    ``on_event``, called with a ``longrun.events.RunEvent`` after each commit that made a transition
    durable (an exception it raises is logged, never breaks the run).
    """

    def __init__(
        self,
        contract: RunContract,
        steps: Sequence[Step],
        *,
        store: Store,
        adapters: Mapping[str, EffectAdapter],
        owner: str | None = None,
        clock: Clock | None = None,
        limits: Limits | None = None,
        retry: RetryPolicy | None = None,
        lease_ttl_s: float = 30.0,
        approvals: ApprovalSource | None = None,
        cancellations: CancellationSource | None = None,
        on_event: EventHook | None = None,
    ):
        self.steps = validate_plan(contract, steps)
        self.engine = Engine(
            contract,
            store=store,
            adapters=adapters,
            owner=owner,
            clock=clock,
            limits=limits,
            retry=retry,
            lease_ttl_s=lease_ttl_s,
            approvals=approvals,
            cancellations=cancellations,
            on_event=on_event,
        )
        for action in dict.fromkeys(step.action for step in self.steps):
            if action not in self.engine.adapters:
                step = next(step for step in self.steps if step.action == action)
                raise UnknownActionError(
                    f"step {step.step_id!r} uses action {action!r}, which has no adapter (have: {sorted(self.engine.adapters)})"
                )
        self.contract = contract
        self.plan_digest = plan_digest(contract, self.steps)
        self.refusals = [reason for reason in map(contract.action_refusal, dict.fromkeys(s.action for s in self.steps)) if reason]

    @property
    def task_id(self) -> str:
        return self.contract.task_id

    @property
    def store(self) -> Store:
        return self.engine.store

    @property
    def owner(self) -> str:
        return self.engine.owner

    @property
    def clock(self) -> Clock:
        return self.engine.clock

    @property
    def limits(self) -> Limits:
        return self.engine.limits

    def run(self) -> RunOutcome:
        """Recover and advance the run as far as it may go now; return why it stopped."""
        if self.refusals:
            return self.engine.refuse(
                self.refusals, "change the plan so every step's action is allowed by the run contract; nothing was run"
            )
        return self.engine.run(_DeclaredPlan(self))


class _DeclaredPlan:
    """The ``Plan`` of a ``Runner``: its steps, in order, then ``done``."""

    def __init__(self, runner: Runner):
        self._runner = runner
        self.digest = runner.plan_digest

    def initial(self, engine: Engine, state: RunState) -> None:
        state.plan_outline = PlanOutline.of(self._runner.steps)  # so a reader knows what remains

    def accept(self, engine: Engine, state: RunState) -> None:
        if state.plan_digest == self.digest:
            if state.plan_outline is None and state.status not in TERMINAL:
                # A state written before outlines were recorded: it goes out with the next commit.
                state.plan_outline = PlanOutline.of(self._runner.steps)
            return
        runner = self._runner
        grown_from = None if state.status in TERMINAL else plan_prefix_digests(runner.contract, runner.steps).get(state.plan_digest)
        if grown_from is None or grown_from == len(runner.steps):
            raise engine.mismatch(
                f"recorded plan digest {state.plan_digest}",
                f"run the task with the plan it was started with (digest {state.plan_digest}), or with that plan followed "
                "by new steps; or, to move to a new task id, mark every step observe_first=True and keep its effect key "
                f"(Step(..., key='{engine.task_id}/<step id>') unless it has one) so effects already made are observed, not repeated",
            )
        engine.record_plan_growth(state, grown_from, len(runner.steps))
        state.plan_outline = PlanOutline.of(runner.steps)

    def drive(self, engine: Engine) -> None:
        for step in self._runner.steps:
            engine.effect(step)
        raise engine.finish(self._runner.contract.completion_evidence or [step.step_id for step in self._runner.steps])

    def result(self, state: RunState) -> JSONValue:
        return None

    def progress(self, state: RunState) -> str:
        verified = sum(1 for record in state.effects.values() if record.state is EffectState.VERIFIED)
        return f"{verified} of {len(self._runner.steps)} effects verified"
