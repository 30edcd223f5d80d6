"""A resume replays the verified steps at the head of a plan in bulk (``verified_prefix``): the
count must be exactly the steps ``effect`` would return at once for, whatever order the ledger's
records were written in, and whichever steps lack a record."""

from __future__ import annotations

import types
import unittest

from longrun.engine.procedures import verified_prefix
from longrun.ledger import EffectRecord, EffectState
from longrun.contract import Step


def record(step_id: str, state: EffectState) -> EffectRecord:
    return EffectRecord(
        key=f"t/{step_id}", step_id=step_id, action="noop", payload={}, payload_digest="sha256:" + "0" * 64,
        state=state, attempts=1, epoch=1, updated_at=1.0,
    )  # fmt: skip


def prefix(steps: list[Step], records: list[EffectRecord]) -> int:
    state = types.SimpleNamespace(effects={item.step_id: item for item in records})
    return verified_prefix(types.SimpleNamespace(state=state), steps)  # type: ignore[arg-type]


class VerifiedPrefixTests(unittest.TestCase):
    steps = [Step(f"s{index}", "noop", {"i": index}) for index in range(6)]
    V, S = EffectState.VERIFIED, EffectState.STARTED

    def verified(self, *indexes: int) -> list[EffectRecord]:
        return [record(f"s{index}", self.V) for index in indexes]

    def test_a_ledger_in_plan_order(self) -> None:
        self.assertEqual(prefix(self.steps, self.verified(0, 1, 2)), 3)
        self.assertEqual(prefix(self.steps, self.verified(*range(6))), 6)
        self.assertEqual(prefix(self.steps, []), 0)
        self.assertEqual(prefix([], self.verified(0)), 0)
        self.assertEqual(prefix(self.steps[:2], self.verified(0, 1, 2, 3)), 2)

    def test_a_step_not_verified_ends_the_prefix_even_with_verified_ones_after_it(self) -> None:
        ledger = [*self.verified(0), record("s1", self.S), *self.verified(2, 3)]
        self.assertEqual(prefix(self.steps, ledger), 1)
        self.assertEqual(prefix(self.steps, [record("s0", self.S), *self.verified(1)]), 0)

    def test_a_step_without_a_record_ends_the_prefix(self) -> None:
        self.assertEqual(prefix(self.steps, self.verified(0, 1, 3, 4)), 2)
        self.assertEqual(prefix(self.steps, self.verified(1, 2)), 0)

    def test_a_ledger_in_another_order_or_with_other_steps(self) -> None:
        self.assertEqual(prefix(self.steps, self.verified(2, 0, 1, 4)), 3)
        extra = [record("elsewhere", self.V)]
        self.assertEqual(prefix(self.steps, [*self.verified(0), *extra, *self.verified(1)]), 2)
        self.assertEqual(prefix(self.steps, [*self.verified(*range(6)), record("later", self.S)]), 6)
        self.assertEqual(prefix(self.steps, [*extra, *self.verified(0, 1)]), 2)


if __name__ == "__main__":
    unittest.main()
