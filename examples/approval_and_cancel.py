"""An approval point and a cancellation: the two ways an operator steers a run.

    python examples/approval_and_cancel.py [--dir D]

Part 1: a payout task stops ``awaiting-approval`` before the payout. An approval for a different
amount (another payload digest) does not authorize it; the operator then approves the exact
pending request, the way ``longrun approve`` does, and the run finishes. The approval is consumed:
it cannot authorize anything again.

Part 2: a mailing task is cancelled while its second message is being sent. The in-flight message
is still reconciled (observed and verified), but no new message starts: the run ends ``cancelled``.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import tempfile

try:
    import longrun  # noqa: F401  # pyright: ignore[reportUnusedImport]  # a probe: is it importable?
except ImportError:  # running from a checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from longrun import Approval, Cancellation, EffectRequest, JsonFileStore, Observation, Receipt, RunContract, Runner, Step
from longrun.testing import OutboxAdapter


def payout_runner(store: JsonFileStore, outbox: str) -> Runner:
    contract = RunContract(
        "payout-2026-11",
        "pay the November contractor invoice once",
        allowed_actions=("invoice", "pay"),
        forbidden_actions=("refund",),
    )
    steps = [
        Step("invoice", "invoice", {"contractor": "ACME", "amount_eur": 1200}),
        Step("pay", "pay", lambda results: {"invoice": results["invoice"]["line"], "amount_eur": 1200}, approval=True),
    ]
    adapter = OutboxAdapter(outbox)
    return Runner(contract, steps, store=store, adapters={"invoice": adapter, "pay": adapter})


def approve_pending(store: JsonFileStore, task_id: str, *, tamper: bool = False) -> Approval:
    """What an operator's ``longrun approve`` does: bind an approval to the pending request's digests."""
    state = store.load(task_id).state
    assert state is not None
    (request,) = state.approval_requests.values()
    now = request.requested_at
    approval = Approval.for_request(
        request, approval_id=secrets.token_hex(8), approver="finance-lead", granted_at=now, expires_at=now + 3600
    )
    if tamper:  # an approval for another amount has another payload digest
        approval = Approval.from_json({**approval.to_json(), "payload_digest": "sha256:" + "0" * 64})
    store.write_approval(approval)
    return approval


class CancelWhileSending:
    """An outbox adapter whose operator cancels the run while the second message is in flight."""

    deduplicates = False

    def __init__(self, store: JsonFileStore, outbox: str):
        self.inner = OutboxAdapter(outbox)
        self.store = store

    def apply(self, request: EffectRequest) -> Receipt:
        if request.step_id == "mail-2":
            self.store.write_cancellation(Cancellation(request.task_id, 0.0, "ops-on-call", "wrong recipient list"))
        return self.inner.apply(request)

    def observe(self, request: EffectRequest) -> Observation:
        return self.inner.observe(request)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dir", help="where to keep the store (default: a temporary directory)")
    directory = parser.parse_args().dir or tempfile.mkdtemp(prefix="longrun-example-")
    store = JsonFileStore(os.path.join(directory, "store"), create=True)
    outbox = os.path.join(directory, "outbox.jsonl")
    ok = True

    print("Part 1: approval")
    first = payout_runner(store, outbox).run()
    print(f"  run 1: {first.status.value}; next: {first.next_action}")
    approve_pending(store, "payout-2026-11", tamper=True)
    second = payout_runner(store, outbox).run()
    print(f"  run 2 with an approval for another payload: {second.status.value}")
    for item in second.unknowns:
        print(f"    unknown: {item.detail}")
    approval = approve_pending(store, "payout-2026-11")
    third = payout_runner(store, outbox).run()
    print(f"  run 3 with the exact approval {approval.approval_id}: {third.status.value}")
    ok &= (first.status.value, second.status.value, third.status.value) == ("awaiting-approval", "awaiting-approval", "done")

    print("Part 2: cancellation")
    contract = RunContract("newsletter-48", "send the week 48 newsletter to three lists")
    steps = [Step(f"mail-{i}", "mail", {"list": i}) for i in range(1, 4)]
    adapter = CancelWhileSending(store, outbox)
    outcome = Runner(contract, steps, store=store, adapters={"mail": adapter}).run()
    print(f"  run: {outcome.status.value}; next: {outcome.next_action}")
    print(f"  verified despite the cancellation (it was in flight): {sorted(outcome.results)}")
    sent = sorted(key for key in adapter.inner.counts() if key.startswith("newsletter-48/"))
    print(f"  outbox holds: {sent}")
    ok &= outcome.status.value == "cancelled" and sent == ["newsletter-48/mail-1", "newsletter-48/mail-2"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
