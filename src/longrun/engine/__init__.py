"""The engine: the recovery procedure and the rules of one step, shared by every face.

A face (``Runner`` for a plan declared up front, ``durable`` for a function whose steps are decided
as it runs) hands ``Engine.run`` a ``Plan``: the digest that pins it, how a recorded state is
checked against it, and how to drive it. The engine takes the task's lease, recovers, lets the plan
drive one step at a time through ``Engine.effect`` / ``Engine.call`` / ``Engine.timer``, and returns
the legal stop as a ``RunOutcome`` with one safe next action. Call it again (after a crash, an
approval, a backoff) and it continues where the durable state says, never repeating a verified
effect.

Durability rules the loop keeps:

- ``started`` (attempt, payload digest, epoch) is committed before ``apply`` is called, always in
  its own commit that precedes the call.
- The verification of effect i is committed together with the start of effect i+1 (or with the
  run's stop), so a sequential run costs one commit per effect. If the process dies in between,
  recovery observes effect i again, finds it applied, and verifies it without re-applying.
- A transient failure's backoff time is committed at once, so a restart honours it.
- Cancellation and approvals are read before every new effect, never cached, through the runner's
  cancellation and approval sources (by default the store; ``longrun.authority`` has strict and
  signed ones). A refused approval record authorizes nothing and its reason is recorded; a refused
  or unreadable cancellation record stops the run ``unsafe-to-continue``, which starts nothing but,
  unlike a cancellation, does not end the run for good on a record nobody can vouch for.
- The lease is renewed in the background while the run holds it; if a renewal fails the runner
  makes no further write and returns ``lease-lost``.

Not guaranteed: that a synchronous adapter call stops when the lease is lost, its timeout passes
or the task is cancelled (threads cannot be killed: the run stops waiting, keeps the lease until the
thread ends, and the call can check ``EffectRequest.cancelled()``; targets should check
``EffectRequest.epoch`` and ``deadline``). Async applies are cancelled.

The engine is one class built in layers, each a module that adds one concern to the one below it
(a method may call only what its own layer or a lower one defines):

- ``_base``: configuration, the working state, the lease, evidence, and the commit path;
- ``_driving``: what the synchronous and async drivers call;
- ``_reconcile``: settling an effect by observation, requests, backoffs;
- ``_gate``: cancellation and the approval gate, read fresh;
- ``_steps``: calls, timers, questions, stops, and the rules every step keeps before it starts;
- ``_effects``: one effect from planned to verified;
- ``_engine``: ``Engine`` itself: one invocation (``run``, ``arun``) and the recovery procedure.

``_plans`` holds what a face hands the engine (``Plan``) and the ``Stop`` that unwinds it;
``_evidence`` the bounded trails of evidence an outcome carries.
"""

from ..contract import INTERNAL_PREFIX, is_internal

from ._base import EngineOptions
from ._engine import Engine
from ._plans import AsyncPlan, Plan, Stop, check_parallel, check_timeout, default_owner, utc


__all__ = ["INTERNAL_PREFIX", "AsyncPlan", "Engine", "EngineOptions", "Plan", "Stop", "check_parallel", "check_timeout", "default_owner", "is_internal", "utc"]
