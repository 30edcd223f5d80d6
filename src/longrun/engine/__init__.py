"""The engine: the recovery procedure and the rules of one step, shared by every face.

A face (``Runner`` for a plan declared up front, ``durable`` for a function whose steps are decided
as it runs) hands ``Engine.run`` a ``Plan``: the digest that pins it, how a recorded state is
checked against it, and how to drive it. The engine takes the task's lease, recovers, lets the plan
drive one step at a time through ``Engine.drive(procedures.effect, ...)`` (and ``call``, ``timer``, ...), and returns
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

The engine is composed of plain parts, none derived from another:

- ``_config``: ``EngineConfig``, the options checked once (and ``EngineOptions``, their keywords);
- ``_invocation``: ``Invocation``, the working state of one run (no store handle), its evidence in
  bounded trails, and ``Stop``;
- ``_ops``: every request a step yields (adapter calls, sleeps, loads, commits, control reads, the lease);
- ``_steps``: the rules every step keeps, cancellation and the approval gate, calls, timers, questions, stops;
- ``_effects``: one effect from planned to verified, settling by observation, the recovery procedure;
- ``_talk``: the steps by which tasks talk: a message sent, a message received, an event set;
- ``procedures``: the step procedures a face names (``Engine.steps``, ``Engine.drive``, ``Engine.record``);
- ``_drivers``: ``RunIO`` (the store, the sources, the lease keeper) and the two drivers that
  perform the requests, ``SyncDriver`` and ``AsyncDriver``;
- ``_engine``: ``Engine``, the facade the faces drive, and ``Plan``, what a face hands it.
"""

from ..contract import INTERNAL_PREFIX, is_internal

from ._config import EngineConfig, EngineOptions, check_parallel, check_timeout, default_owner, utc
from ._engine import AsyncPlan, Engine, Plan
from ._invocation import Invocation, Stop
from ._ops import Steps, is_async_callable
from ._talk import RECEIVE_POLL_S, receive, send, set_event
from . import procedures


__all__ = [
    "INTERNAL_PREFIX",
    "AsyncPlan",
    "Engine",
    "EngineConfig",
    "EngineOptions",
    "Invocation",
    "Plan",
    "RECEIVE_POLL_S",
    "Stop",
    "Steps",
    "check_parallel",
    "check_timeout",
    "default_owner",
    "is_async_callable",
    "is_internal",
    "procedures",
    "receive",
    "send",
    "set_event",
    "utc",
]
