"""Inbox triage as a durable function: fetch the day's mail, label each message, report.

    python examples/inbox_triage.py [--dir D]

``run.call`` records what was fetched and what the model answered, so a resumed run labels the
same messages the same way, even if new mail has arrived or the model would now answer otherwise.
``run.effect`` posts each label through the effect ledger (observed at the target before any
retry), and the report waits for an approval. The steps are whatever the inbox holds: one
``label/<id>`` call and one ``post/<id>`` effect per message, decided as the function runs.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
from typing import Any

try:
    import longrun
except ImportError:  # running from a checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
    import longrun

from longrun import Approval, EffectRequest, JsonFileStore, Observation, Receipt

INBOX = {  # a stand-in for the mail server
    "2026-11-30": [
        {"id": "m1", "from": "billing@acme.example", "subject": "Invoice 1142 overdue"},
        {"id": "m2", "from": "ana@example.com", "subject": "Lunch on Friday?"},
        {"id": "m3", "from": "alerts@ci.example", "subject": "Build failed on main"},
    ]
}


def fetch_inbox(day: str) -> list[dict[str, str]]:
    return [dict(item) for item in INBOX.get(day, [])]


def ask_model(item: dict[str, str]) -> str:
    """A stand-in for a model that labels one message."""
    subject = item["subject"].lower()
    return "finance" if "invoice" in subject else "urgent" if "failed" in subject else "personal"


class JsonFiles:
    """A target that keeps one JSON file per effect, named by a payload field. The file holds the
    payload digest, so ``observe`` can tell this effect from another one of the same name."""

    deduplicates = False

    def __init__(self, directory: str, field: str):
        self.directory, self.field = directory, field
        os.makedirs(directory, exist_ok=True)

    def apply(self, request: EffectRequest) -> Receipt:
        path = os.path.join(self.directory, f"{request.payload[self.field]}.json")
        with open(path + ".tmp", "w") as handle:
            json.dump({"digest": request.payload_digest, **request.payload}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(path + ".tmp", path)
        return Receipt(evidence=f"wrote {path}")

    def observe(self, request: EffectRequest) -> Observation:
        path = os.path.join(self.directory, f"{request.payload[self.field]}.json")
        try:
            with open(path) as handle:
                digest = json.load(handle)["digest"]
        except FileNotFoundError:
            return Observation.absent(f"{path} does not exist")
        if digest != request.payload_digest:
            return Observation.unknown(f"{path} holds another payload")
        return Observation.applied(f"{path} holds this payload")


class Poster(JsonFiles):
    """Posts a label on a message (here: ``labels/<id>.json``)."""

    def __init__(self, directory: str):
        super().__init__(os.path.join(directory, "labels"), "id")


class Reporter(JsonFiles):
    """Files the day's report (here: ``reports/<day>.json``)."""

    def __init__(self, directory: str):
        super().__init__(os.path.join(directory, "reports"), "day")


def make_triage(directory: str) -> longrun.DurableFunction[dict[str, Any]]:
    store = JsonFileStore(os.path.join(directory, "store"), create=True)

    @longrun.durable(
        store=store,
        adapters={"label.post": Poster(directory), "report.write": Reporter(directory)},
        allowed_actions=("label.post", "report.write"),
    )
    def triage(run: longrun.Run, day: str) -> dict[str, Any]:
        items = run.call("inbox", fetch_inbox, day)
        for item in items:
            label = run.call(f"label/{item['id']}", ask_model, item)
            run.effect(f"post/{item['id']}", "label.post", {"id": item["id"], "label": label})
        run.effect("report", "report.write", {"day": day, "n": len(items)}, approval=True)
        return {"labelled": len(items)}

    return triage


def approve(store: JsonFileStore, task_id: str) -> None:
    """What ``longrun approve`` does: an approval bound to the pending request's exact scope."""
    state = store.load(task_id).state
    assert state is not None
    request = state.approval_requests["report"]
    store.write_approval(
        Approval.for_request(
            request, approval_id=secrets.token_hex(8), approver="team-lead", granted_at=request.requested_at,
            expires_at=request.expires_at,
        )
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dir", help="where to keep the store, the labels and the report (default: a temporary directory)")
    directory = parser.parse_args().dir or tempfile.mkdtemp(prefix="longrun-triage-")
    triage, day = make_triage(directory), "2026-11-30"

    print(f"1. triage {day}: labels are posted, the report waits for approval ({directory})")
    outcome = triage.run(f"triage-{day}", day)
    print(f"   status: {outcome.status.value}; labels: {sorted(os.listdir(os.path.join(directory, 'labels')))}")

    print("2. new mail arrives; the resumed run still works on the inbox it fetched")
    INBOX[day].append({"id": "m4", "from": "bob@example.com", "subject": "Invoice 1143"})
    print(f"   status: {triage.run(f'triage-{day}', day).status.value}")

    print("3. the team lead approves the report; the run finishes")
    approve(JsonFileStore(os.path.join(directory, "store")), f"triage-{day}")
    outcome = triage.run(f"triage-{day}", day)
    with open(os.path.join(directory, "reports", f"{day}.json")) as handle:
        report = json.load(handle)
    print(f"   status: {outcome.status.value}; result: {outcome.result}; report: n={report['n']}")
    labels = {}
    for name in sorted(os.listdir(os.path.join(directory, "labels"))):
        with open(os.path.join(directory, "labels", name)) as handle:
            item = json.load(handle)
        labels[item["id"]] = item["label"]
    print(f"   labels: {labels}")
    return 0 if outcome.status.value == "done" and outcome.result == {"labelled": 3} and len(labels) == 3 else 1


if __name__ == "__main__":
    raise SystemExit(main())
