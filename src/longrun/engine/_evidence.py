"""A run's evidence: what it observed, inferred and could not know, in bounded trails."""

from __future__ import annotations

import collections

from ..outcome import Evidence
from ..protocols import Clock


__all__ = ["EvidenceLog", "Trail"]


class Trail:
    """One kind of evidence of a run: every item, up to ``head + tail`` of them; past that the
    first ``head`` and the last ``tail``, with a note of how many between were left out. A run of
    100,000 effects keeps a bounded trail in memory and in its outcome, never the first items'
    context nor the latest."""

    HEAD = 200
    TAIL = 800

    def __init__(self) -> None:
        self._head: list[Evidence] = []
        self._tail: collections.deque[Evidence] = collections.deque(maxlen=self.TAIL)
        self._omitted = 0

    def append(self, item: Evidence) -> None:
        if len(self._head) < self.HEAD:
            self._head.append(item)
            return
        if len(self._tail) == self.TAIL:
            self._omitted += 1
        self._tail.append(item)

    def items(self) -> tuple[Evidence, ...]:
        if not self._omitted:
            return (*self._head, *self._tail)
        gap = Evidence("runner", f"{self._omitted} more items of this kind are left out here", self._tail[0].at)
        return (*self._head, gap, *self._tail)


class EvidenceLog:
    """Collects one run's observations, inferences and unknowns, stamped by the clock. The first
    two are bounded trails (``Trail``); unknowns are kept whole, since each may need a person."""

    def __init__(self, clock: Clock):
        self._clock = clock
        self.observations = Trail()
        self.inferences = Trail()
        self.unknowns: list[Evidence] = []

    def observed(self, source: str, detail: str) -> Evidence:
        item = Evidence(source, detail, self._clock.now())
        self.observations.append(item)
        return item

    def inferred(self, detail: str) -> None:
        self.inferences.append(Evidence("runner", detail, self._clock.now()))

    def unknown(self, source: str, detail: str) -> Evidence:
        item = Evidence(source, detail, self._clock.now())
        self.unknowns.append(item)
        return item


