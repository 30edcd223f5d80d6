"""The checkpointed session (Level A): an agent with only a terminal keeps a run contract, checkpoints and exact-once commands.

An agent (often a model with a shell, not a program of its own) works through the bounded steps
of a run contract (``longrun.contractfile``), one command at a time, and keeps its progress in the
store rather than in its context. Its continuation rule is ``Session.next()`` (``longrun next``):
from the store alone, with no chat history, exactly one safe next action, or the legal stop and
what would unblock it.

Each command is one engine invocation (``Engine.run``) on the same ``RunState`` and ledger the other
faces keep, so ``status``, ``history``, ``verify``, ``approve``, ``answer`` and ``cancel`` work on a
session's task unchanged:

- ``init`` records the contract with the task's first revision: an internal step
  ``longrun.contract`` holds its normalized JSON, and the plan digest (what approvals bind to) is a
  digest over it. Running ``init`` again with the same contract changes nothing; with another it is
  refused.
- ``exec`` makes one step's command an effect (``procedures.effect`` with ``shell.CommandAdapter``):
  the step's action must be allowed by the contract, cancellation and approval are read fresh, the
  lease is held (a second ``exec`` on the task is ``already-running``), ``started`` is durable
  before the command runs, and after a crash the next ``exec`` observes (the observe command)
  instead of running it again. A command that fails comes back to the agent: the step may be tried
  again after ``retry_delay_s``, within ``max_attempts``.
- ``checkpoint`` records work that is not an external effect with its evidence (a file's SHA-256 or
  a note), as a verified internal step (``longrun.checkpoint``) committed in one write; a step that
  needs approval goes through the approval gate first, bound to that evidence.
- ``done`` ends the run ``done`` when the contract's completion evidence is recorded (and no step
  that was begun is left unrecorded), and refuses, naming what is missing, otherwise.
- ``stop`` records a legal stop: a question for a person (a ``longrun.ask`` step ``decision-N``),
  answered with ``longrun answer``. Until it is answered every command stops ``awaiting-input``.

Steps are taken in the contract's order. A task's recorded status between commands is ``running``
with the next action in words, so ``longrun ls`` and ``longrun status`` show it.

Not guaranteed: that the agent runs what ``next`` says (a checkpoint records what the agent says it
did, with the evidence's digest: it is not proof that the work is right), or anything about commands
run outside ``longrun exec``. Only effects made through ``exec`` are in the ledger.
"""

from __future__ import annotations

from ._commands import Session
from ._holder import holder_gone
from ._records import (
    CHECKPOINT_ACTION,
    CONTRACT_STEP,
    MAX_TEXT_CHARS,
    NextAction,
    SessionResult,
    file_evidence as file_evidence,
    recorded_contract,
    session_digest,
)

__all__ = [
    "CHECKPOINT_ACTION",
    "CONTRACT_STEP",
    "MAX_TEXT_CHARS",
    "NextAction",
    "Session",
    "SessionResult",
    "holder_gone",
    "recorded_contract",
    "session_digest",
]
