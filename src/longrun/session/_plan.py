"""The engine ``Plan`` of one session command, and the rule that a recorded stop is settled first."""

from __future__ import annotations

from typing import Callable

from ..canonical import JSONValue
from ..contract import ASK_ACTION, Step
from ..contractfile import SessionContract
from ..engine import Engine, procedures
from ..envelope import RunState
from ..ledger import EffectState
from ._records import CONTRACT_STEP, session_digest

__all__ = ["SessionPlan", "contract_difference", "settle_decisions"]


def contract_difference(state: RunState, contract: SessionContract) -> str:
    """What differs between ``contract`` and the one ``state`` was started with: its fields by name."""
    recorded = state.effects.get(CONTRACT_STEP)
    before = recorded.payload.get("contract") if recorded is not None else None
    after = contract.to_json()
    if not isinstance(before, dict):
        return "the run contract is not the one the task was started with"
    changed = sorted(key for key in {*before, *after} if before.get(key) != after.get(key))
    return f"the run contract differs from the one the task was started with in: {', '.join(changed) or 'its digest'}"


class SessionPlan:
    """The engine ``Plan`` of one session command: the digest pins the contract; ``drive`` is the command."""

    def __init__(self, contract: SessionContract, drive: Callable[[Engine], None], *, create: bool = False, source: str | None = None):
        self.digest = session_digest(contract)
        self.created = False
        self._contract = contract
        self._drive = drive
        self._create = create
        self._source = source

    def initial(self, engine: Engine, state: RunState) -> None:
        if not self._create:
            raise engine.record(procedures.mismatch, "the task has no state", f"start the task with `longrun init {engine.config.store_spec} {engine.config.task_id} --contract FILE`")
        payload: dict[str, JSONValue] = {"contract": self._contract.to_json(), "file": self._source}
        engine.record(procedures.plan, Step(CONTRACT_STEP, CONTRACT_STEP, payload))
        engine.record(procedures.complete, CONTRACT_STEP, {"contract_digest": self._contract.digest})
        self.created = True

    def accept(self, engine: Engine, state: RunState) -> None:
        if state.plan_digest != self.digest:
            raise engine.record(
                procedures.mismatch,
                f"{contract_difference(state, self._contract)}: recorded plan digest {state.plan_digest}, "
                f"this contract's {self.digest}",
                "the task was started with another run contract: a changed contract needs a new task id",
            )

    def drive(self, engine: Engine) -> None:
        self._drive(engine)

    def progress(self, state: RunState) -> str:
        steps = [step.step_id for step in self._contract.steps]
        done = sum(1 for sid in steps if (record := state.effects.get(sid)) is not None and record.state is EffectState.VERIFIED)
        return f"{done} of {len(steps)} contract steps recorded"

    def result(self, state: RunState) -> JSONValue:
        return None


def settle_decisions(engine: Engine) -> None:
    """Every recorded stop must be answered before anything else: an unanswered one stops ``awaiting-input``."""
    for record in list(engine.invocation.state.effects.values()):
        if record.action == ASK_ACTION and record.state is not EffectState.VERIFIED:
            payload = record.payload if isinstance(record.payload, dict) else {}
            engine.drive(procedures.ask, Step(record.step_id, ASK_ACTION, payload), None)
