"""The durable-function face: agent code whose steps are decided as it runs, replayed by step id.

::

    @longrun.durable(store=store, adapters={"mail.send": Mailer()}, allowed_actions=("mail.send",))
    def agent(run: longrun.Run, goal: str) -> dict:
        plan = run.call("plan", ask_model, goal)              # recorded once, replayed after a crash
        for i, tool in enumerate(plan["tools"]):
            run.effect(f"tool/{i}", "mail.send", tool)         # the effect ledger, observed before retry
        return {"tools": len(plan["tools"])}

    outcome = agent.run("agent-1", "tidy the inbox")          # starts, or resumes with the recorded arguments

Every ``run()`` executes the function from the top. Each ``run.*`` step whose id is recorded returns
its recorded outcome without doing anything; the first step whose id is not recorded proceeds, so a
loop or a newly inserted step extends the run. Replay is by step id, not by position: the order of
steps may change between versions of the code, their ids may not be reused within one run.

Divergence: a recorded effect whose action or payload digest differs from what the code now asks
for, or a recorded call whose function or argument digest differs (unless the call says
``replay="by-id"``), stops the run ``plan-mismatch`` naming the step and both digests; nothing is
applied. The arguments and the function's name are recorded with the task when it first starts; its
plan digest (what approvals bind to) is the digest of the contract, the function name and those
arguments. Running the task with other arguments stops ``plan-mismatch``.

What the function must keep deterministic between ``run.*`` steps: which step ids it asks for and
with which payloads, given the values the steps returned. Anything nondeterministic (a model's
answer, the time, a random choice, a read) belongs inside ``run.call`` so that it is recorded once.

An exception the function raises (other than a stop, which the engine handles) is committed with
what was settled before it and recorded as the task's ``last_failure`` in the same commit, which
makes the task ``retry-scheduled`` (or ``failed`` after ``Limits.max_failures`` in a row, a process
dying inside a step counting the same); it is re-raised to the caller of ``run()``. See
``longrun.failures``.

Children (``run.child``): a task that ends ``cancelled`` cancels the children it started and has
not seen finish, unless they were started with ``detached=True`` (``cancel_children``, which
``longrun cancel`` uses too); a child that is the task itself or an ancestor is refused with
``ChildCycleError``.
"""

from ..contract import ASK_ACTION
from ._durable import DurableFunction, durable
from ._family import cancel_children
from ._run import AsyncRun, Run
from ._lineage import (
    CALL_ACTION,
    CHILD_ACTION,
    FUNCTION_STEP,
    SLEEP_ACTION,
    qualified_name,
)

__all__ = ["ASK_ACTION", "CALL_ACTION", "CHILD_ACTION", "FUNCTION_STEP", "SLEEP_ACTION", "AsyncRun", "DurableFunction", "Run", "cancel_children", "durable", "qualified_name"]
