"""Durable functions for the operator's commands (``tests/test_operator.py``): resolve, reopen, fork.

They are decorated with a ``MemoryStore`` that holds nothing: a test runs them on its own store
(``fn.with_options(store=...)``), and ``longrun resume STORE TASK`` / ``longrun fork STORE ...``
must run them on the STORE named on the command line. ``TARGET`` is the one target every function
sends to; a test points it at a fresh outbox (``TARGET.reset``) and reads what it received.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import longrun
from longrun import Limits
from longrun.adapters import EffectRequest, Observation, Receipt
from longrun.errors import PermanentError, TransientError
from longrun.testing import FakeClock, MemoryStore, OutboxAdapter


class Target:
    """An outbox that can lose a send's answer and cannot prove a send absent.

    ``lose_before`` (step ids): the first apply raises before anything is sent; ``lose_after``: the
    first apply sends, then raises. ``blind`` (step ids): observe answers unknown for those steps (an outage);
    otherwise it answers applied for a key in the outbox and unknown for one not there (the target
    cannot prove a negative). ``transient`` (step id -> n): the first n applies of that step fail
    transiently; ``broken`` (step ids): every apply fails for good. ``calls`` counts applies per key."""

    deduplicates = False

    def __init__(self) -> None:
        self.reset(os.devnull)

    def reset(self, outbox: str, **options: Any) -> None:
        self.outbox = OutboxAdapter(outbox, check_epoch=False)
        self.lose_before: set[str] = set(options.get("lose_before", ()))
        self.lose_after: set[str] = set(options.get("lose_after", ()))
        self.blind: set[str] = set(options.get("blind", ()))
        self.transient: dict[str, int] = dict(options.get("transient", {}))
        self.broken: set[str] = set(options.get("broken", ()))
        self.calls: Counter[str] = Counter()

    def apply(self, request: EffectRequest) -> Receipt:
        self.calls[request.key] += 1
        step = request.step_id
        if step in self.broken:
            raise PermanentError(f"{step} is broken")
        if self.transient.get(step, 0) > 0:
            self.transient[step] -= 1
            raise TransientError(f"{step} is busy")
        if step in self.lose_before:
            self.lose_before.discard(step)
            raise ConnectionError(f"connection lost before sending {request.key}")
        receipt = self.outbox.apply(request)
        if step in self.lose_after:
            self.lose_after.discard(step)
            raise ConnectionError(f"connection lost after sending {request.key}")
        return receipt

    def observe(self, request: EffectRequest) -> Observation:
        if request.step_id in self.blind:
            return Observation.unknown("the target is unreachable")
        seen = self.outbox.observe(request)
        if seen.state.value == "applied":
            return seen
        return Observation.unknown(f"the target cannot say whether {request.key} was sent")

    def sent(self) -> Counter[str]:
        """Outbox lines per effect key: what the target really received."""
        return self.outbox.counts()


TARGET = Target()
PLACEHOLDER = MemoryStore()


@longrun.durable(store=PLACEHOLDER, adapters={"send": TARGET}, allowed_actions=("send",))
def order(run: longrun.Run, n: int) -> str:
    run.effect("reserve", "send", {"n": n, "what": "reserve"})
    run.effect("charge", "send", {"n": n, "what": "charge"})
    run.effect("ship", "send", {"n": n, "what": "ship"})
    return f"order {n} shipped"


@longrun.durable(store=PLACEHOLDER, adapters={"send": TARGET}, allowed_actions=("send",))
def gated_order(run: longrun.Run, n: int) -> str:
    run.effect("reserve", "send", {"n": n, "what": "reserve"})
    run.effect("ship", "send", {"n": n, "what": "ship"}, approval=True)
    return f"order {n} shipped"


@longrun.durable(store=PLACEHOLDER, adapters={"send": TARGET}, allowed_actions=("send",), limits=Limits(max_attempts=1))
def one_try_order(run: longrun.Run, n: int) -> str:
    run.effect("reserve", "send", {"n": n, "what": "reserve"})
    run.effect("charge", "send", {"n": n, "what": "charge"})
    return f"order {n} charged"


CLOCK = FakeClock()
"""The clock of ``slow_order``: its 'think' call takes 20 s of work on it."""


def _think() -> str:
    CLOCK.advance(20.0)
    return "thought"


@longrun.durable(
    store=PLACEHOLDER, adapters={"send": TARGET}, allowed_actions=("send",), clock=CLOCK, limits=Limits(max_elapsed_s=10.0)
)
def slow_order(run: longrun.Run, n: int) -> str:
    run.call("think", _think)
    run.effect("charge", "send", {"n": n, "what": "charge"})
    return f"order {n} charged"
