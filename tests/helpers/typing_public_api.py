"""The public API as README.md and docs/ write it, for the type checkers only (never imported or run).

``tests/test_typing.py`` checks this file with ``mypy --strict`` and ``pyright`` (strict, as
configured in pyproject.toml), so that a user's code written like the documents' type-checks against
the package as shipped. Its name does not match ``test*.py``, so unittest does not collect it. The
documents' code is copied unchanged into the functions below, with stand-ins for what it leaves to
the reader ("your code"); the ``assert_type`` lines pin the types a user gets.
"""

from __future__ import annotations

import datetime
from typing import Any, assert_type

import longrun
from longrun import EffectAdapter, PendingRequest, RunOutcome, Status, Store
from longrun.canonical import JSONValue
from longrun.failures import RunFailure
from longrun.runner import Runner as RunnerClass
from longrun.runner import SystemClock as SystemClockClass
from longrun.stores import PostgresStore, SqliteStore, open_store
from longrun.testing import FakeClock, OutboxAdapter, read_outbox

# -- stand-ins for the reader's own code --------------------------------------------------------


class Renderer:
    deduplicates = True

    def apply(self, request: longrun.EffectRequest) -> longrun.Receipt:
        return longrun.Receipt(result={"html": "<p>week 48</p>"}, evidence="rendered")

    def observe(self, request: longrun.EffectRequest) -> longrun.Observation:
        return longrun.Observation.applied("recomputed", {"html": "<p>week 48</p>"})


# -- README.md, "A first example" ---------------------------------------------------------------


def first_example() -> None:
    import tempfile
    from longrun import JsonFileStore, RunContract, Runner, Step
    from longrun.testing import OutboxAdapter, read_outbox

    directory = tempfile.mkdtemp()
    store = JsonFileStore(f"{directory}/store", create=True)      # the ledger: state, leases, approvals
    outbox = OutboxAdapter(f"{directory}/outbox.jsonl")           # a local target: one line per effect applied
    contract = RunContract("hello-1", "greet two people", allowed_actions=("send",))
    steps = [Step("ana", "send", {"to": "ana", "text": "hello"}), Step("bob", "send", {"to": "bob", "text": "hello"})]

    outcome = Runner(contract, steps, store=store, adapters={"send": outbox}).run()
    print(outcome.status.value, "-", outcome.next_action)         # done - nothing: every required effect is verified
    again = Runner(contract, steps, store=store, adapters={"send": outbox}).run()
    print(again.status.value, len(read_outbox(outbox.path)))      # done 2: running it again sent nothing twice


# -- README.md, "Declared plans: `Runner`" (docs/plans.md, "A plan") ----------------------------


def api_tour() -> longrun.Runner:
    import os
    import tempfile
    from longrun import (RunContract, Step, Runner, Limits, RetryPolicy, JsonFileStore,
                         EffectRequest, Receipt, Observation, PermanentError)

    class Renderer:                     # a step with nothing to observe: observe recomputes it
        deduplicates = True             # rendering again changes nothing anywhere

        def apply(self, request: EffectRequest) -> Receipt:
            return Receipt(result={"html": f"<h1>Week {request.payload['week']}</h1>"}, evidence="rendered")

        def observe(self, request: EffectRequest) -> Observation:
            return Observation.applied("recomputed", {"html": f"<h1>Week {request.payload['week']}</h1>"})

    class Mailer:                       # an EffectAdapter: apply, observe, deduplicates
        deduplicates = False            # True only if the target ignores a repeated key

        def __init__(self, outbox: str) -> None:
            self.outbox = outbox        # stands for a mail server: one file per message, named by its key

        def path(self, request: EffectRequest) -> str:
            return os.path.join(self.outbox, request.key.replace("/", "_") + ".eml")

        def apply(self, request: EffectRequest) -> Receipt:
            address, body = str(request.payload["to"]), str(request.payload["body"])
            if "@" not in address:
                raise PermanentError(f"not an address: {address}")   # the run stops blocked
            with open(self.path(request) + ".tmp", "w") as handle:
                handle.write(body)
            os.replace(self.path(request) + ".tmp", self.path(request))           # whole or absent, never half
            return Receipt(result={"message_id": request.key}, evidence=f"queued {self.path(request)}")

        def observe(self, request: EffectRequest) -> Observation:   # must confirm an apply that succeeded
            if os.path.exists(self.path(request)):
                return Observation.applied(f"{self.path(request)} exists", {"message_id": request.key})
            return Observation.absent("no message with that key")

    directory = tempfile.mkdtemp()      # in production, a directory of its own: /var/lib/longrun, say
    contract = RunContract(
        task_id="newsletter-48",                   # a safe single path component
        goal="send the week 48 newsletter",
        allowed_actions=("render", "mail"),
        forbidden_actions=("delete",),
    )
    steps = [
        Step("render", "render", {"week": 48}),
        Step("mail", "mail", lambda results: {"to": "team@example.org", "body": results["render"]["html"]}, approval=True),
    ]
    runner = Runner(contract, steps, store=JsonFileStore(os.path.join(directory, "store"), create=True),
                    adapters={"render": Renderer(), "mail": Mailer(directory)},
                    limits=Limits(max_attempts=3, max_elapsed_s=3600, max_cost=5.0),
                    retry=RetryPolicy(base_delay_s=1.0, max_delay_s=60.0, jitter=0.2))
    outcome = runner.run()
    print(outcome.status.value, "-", outcome.next_action)    # awaiting-approval - approve step 'mail' ...

    # What docs/plans.md's prose promises about these names.
    assert_type(runner, RunnerClass)
    assert_type(outcome, RunOutcome)
    assert_type(outcome.status, Status)
    assert_type(outcome.next_action, str)
    # docs/agents.md, "What a run returns, and what it waits for".
    assert_type(outcome.pending, tuple[PendingRequest, ...])
    for request in outcome.pending:
        assert_type(request.choices, tuple[JSONValue, ...] | None)
        assert_type(request.expires_at, float)
    # docs/agents.md, "When the function keeps failing".
    assert_type(outcome.last_failure, RunFailure | None)
    if outcome.last_failure is not None:
        assert_type(outcome.last_failure.retry_at, float | None)
        assert_type(outcome.last_failure.summary(), str)
    assert_type(Limits(max_failures=2).max_failures, int)
    print(Status.FAILED.value, Status.QUEUED.value)
    mailer: EffectAdapter = Mailer(directory)
    renderer: EffectAdapter = Renderer()
    print(mailer, renderer, longrun.TransientError("busy"))
    return runner


# -- README.md, "Durable functions: `@longrun.durable`" --------------------------------------------


def durable_function() -> RunOutcome:
    import tempfile
    import longrun
    from longrun.testing import OutboxAdapter

    def fetch_inbox(day: str) -> list[dict[str, str]]:        # your read: a mail server's API, say
        return [{"id": "m1", "subject": "Invoice 1142 overdue"}, {"id": "m2", "subject": "Lunch on Friday?"}]

    def ask_model(item: dict[str, str]) -> str:               # your model call
        return "finance" if "invoice" in item["subject"].lower() else "personal"

    directory = tempfile.mkdtemp()
    store = longrun.JsonFileStore(f"{directory}/store", create=True)
    outbox = OutboxAdapter(f"{directory}/outbox.jsonl")      # a local target; your own adapters are written as above

    @longrun.durable(store=store, adapters={"label.post": outbox, "report.write": outbox},
                     allowed_actions=("label.post", "report.write"))
    def triage(run: longrun.Run, day: str) -> dict[str, int]:
        items = run.call("inbox", fetch_inbox, day)                         # recorded once, replayed after a crash
        for item in items:
            label = run.call(f"label/{item['id']}", ask_model, item)        # a model's answer, frozen once recorded
            run.effect(f"post/{item['id']}", "label.post", {"id": item["id"], "label": label})
        run.effect("report", "report.write", {"day": day, "n": len(items)}, approval=True)
        return {"labelled": len(items)}

    outcome = triage.run("triage-2026-11-30", "2026-11-30")   # starts, or resumes with the recorded arguments
    print(outcome.status.value, outcome.result)                # awaiting-approval None; the return value once done
    assert_type(triage, longrun.DurableFunction[dict[str, int]])
    return outcome


# -- docs/security.md, "Threat model: approvals and cancellation" --------------------------------


def threat_model(contract: longrun.RunContract, steps: list[longrun.Step], store: Store,
                 adapters: dict[str, EffectAdapter]) -> longrun.Runner:
    from longrun import Runner
    from longrun.authority import FileControlSource, SignedApprovals, SignedCancellations, load_key

    control = FileControlSource("/srv/longrun-control", approver_uid=1001)     # strict mode (the default)
    key = load_key("/etc/longrun/runner.key")                                  # 0600, at least 32 bytes
    runner = Runner(contract, steps, store=store, adapters=adapters,
                    approvals=SignedApprovals(control, key), cancellations=SignedCancellations(control, key))
    return runner


# -- docs/stores.md, and longrun.testing --------------------------------------------------------


def stores_and_testing(connect: Any) -> None:
    sqlite = SqliteStore("/var/lib/longrun/tasks.db")
    postgres = PostgresStore(lambda: connect("postgresql://me@db/longrun"))
    named: Store = open_store("sqlite:/var/lib/longrun/tasks.db")
    tasks: list[str] = sqlite.list_tasks() + postgres.list_tasks()
    clock = FakeClock()
    clock.advance(5.0)
    outbox = OutboxAdapter("/tmp/outbox.jsonl", fail_transient=1)
    lines = read_outbox("/tmp/outbox.jsonl")
    print(named, tasks, clock.now(), outbox.calls, lines[0]["key"] if lines else None)


# -- the lazily loaded names and the version ---------------------------------------------------


def module_attributes() -> None:
    # longrun.Runner is loaded on first use (longrun.__getattr__) yet types as the class itself.
    assert_type(longrun.Runner, type[RunnerClass])
    assert_type(longrun.SystemClock, type[SystemClockClass])
    assert_type(longrun.SystemClock().now(), float)
    assert_type(longrun.__version__, str)


# -- docs/agents.md, "Async agents and parallel tool calls" (and the README) ---------------------


class AsyncPoster:
    deduplicates = False

    async def apply(self, request: longrun.EffectRequest) -> longrun.Receipt:
        return longrun.Receipt(result={"posted": request.key})

    async def observe(self, request: longrun.EffectRequest) -> longrun.Observation:
        return longrun.Observation.absent("not posted")


async def fetch_inbox_async(day: str) -> list[dict[str, str]]:
    return [{"id": "1"}]


def ask_model(item: dict[str, str]) -> str:
    return "label"


async def async_agents(store: Store) -> RunOutcome:
    import asyncio

    @longrun.durable(store=store, adapters={"label.post": AsyncPoster()}, allowed_actions=("label.post",),
                     max_parallel=16, timeout_s=30)
    async def triage(run: longrun.AsyncRun, day: str) -> dict[str, int]:
        items = await run.call("inbox", fetch_inbox_async, day)
        labels = await asyncio.gather(*(run.call(f"label/{i['id']}", ask_model, i) for i in items))
        await asyncio.gather(*(run.effect(f"post/{i['id']}", "label.post", {"id": i["id"], "label": label})
                               for i, label in zip(items, labels)))
        return {"labelled": len(items)}

    @longrun.durable(store=store, adapters={"note": Renderer()}, allowed_actions=("note",))
    def mapped(run: longrun.Run, n: int) -> list[JSONValue]:
        return run.map("note", "note", [{"i": i} for i in range(n)], max_parallel=4)

    adapter: longrun.AsyncEffectAdapter = AsyncPoster()
    step = longrun.Step("b", "note", {}, after=("a",), timeout_s=5.0, retry=longrun.RetryPolicy())
    runner = longrun.Runner(longrun.RunContract("t", "g"), [longrun.Step("a", "note", {}), step],
                            store=store, adapters={"note": Renderer(), "post": adapter}, max_parallel=4)
    assert_type(await runner.arun(), RunOutcome)
    assert_type(mapped.run("m", 3), RunOutcome)
    assert_type(mapped.run("m", 3, wait=True, timeout_s=30.0), RunOutcome)  # waits in the process
    assert_type(await mapped.arun("m", 3, wait=True), RunOutcome)
    outcome = await triage.arun("triage-2026-11-30", "2026-11-30")
    assert_type(outcome, RunOutcome)
    return outcome


# -- docs/observability.md (the hook; the OpenTelemetry recipe itself runs in test_readme_otel.py) ---------


def events_and_logs(contract: longrun.RunContract, steps: list[longrun.Step], store: Store,
                    adapters: dict[str, EffectAdapter]) -> None:
    seen: list[longrun.RunEvent] = []

    def hook(event: longrun.RunEvent) -> None:
        assert_type(event.step, str | None)
        assert_type(event.revision, int)
        assert_type(event.kind, str)  # run-start, run, run-end, or what the record is
        assert_type(event.epoch, int)  # names the invocation: a run-start and its run-end share it
        seen.append(event)

    assert_type(longrun.events.EVENT_KINDS, tuple[str, ...])

    runner = longrun.Runner(contract, steps, store=store, adapters=adapters, on_event=hook)
    durable = longrun.durable(store=store, adapters=adapters, on_event=seen.append)
    print(runner.run().status, durable, [event.to_json() for event in seen])


# -- docs/observability.md, "Metrics" and "Logs"; docs/agents.md, "Reporting progress" --------------------


def metrics_logs_and_progress(store: Store) -> str:
    import logging

    from longrun.logging import JsonFormatter
    from longrun.metrics import MetricsSnapshot, collect, render

    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter(static={"service": "newsletter"}))
    logging.getLogger("longrun").addHandler(handler)

    @longrun.durable(store=store, adapters={"note": Renderer()}, allowed_actions=("note",))
    def sync_rows(run: longrun.Run, n: int) -> int:
        run.progress(0, n, "starting")
        return n

    @longrun.durable(store=store, adapters={"note": Renderer()}, allowed_actions=("note",))
    async def async_rows(run: longrun.AsyncRun, n: int) -> int:
        await run.progress(n, n)
        return n

    assert_type(sync_rows.run("rows-1", 3), RunOutcome)
    print(async_rows)
    snapshot = collect(store)
    assert_type(snapshot, MetricsSnapshot)
    assert_type(snapshot.value("longrun_tasks", status="done", function=""), float | None)
    return render(snapshot)


# -- docs/cli.md, "Resolve, reopen, fork" -------------------------------------------------------------


def interventions(store: Store) -> None:
    import functools

    from longrun.authority import FileControlSource, sign_approval
    from longrun.intervention import reopen, resolve

    @longrun.durable(store=store, adapters={"pay": Renderer()}, allowed_actions=("pay",))
    def order(run: longrun.Run, n: int) -> str:
        run.effect("charge", "pay", {"order": n})
        return "paid"

    sign = functools.partial(sign_approval, key=b"k" * 32)
    record = resolve(store, "order-1", "charge", applied=False, evidence="not charged", by="ann", sign=sign)
    assert_type(record, longrun.Approval)
    written = reopen(store, "order-2", "released", by="ann", add_attempts=1, write_to=FileControlSource("/srv/control"))
    assert_type(written, longrun.Approval)
    assert_type(order.reopen("order-2", "released", by="ann", add_time_s=60.0), RunOutcome)
    assert_type(order.fork("order-1", "order-1b", from_step="charge"), str)
    assert_type(order.resume("order-1b"), RunOutcome)


# -- docs/agents.md, "Tasks that talk: messages, events and compensation" --------------------------


def tasks_that_talk(store: Store) -> None:
    @longrun.durable(store=store)
    def kitchen(run: longrun.Run, dishes: int) -> list[JSONValue]:
        orders = [run.recv("orders") for _ in range(dishes)]
        assert_type(run.recv("orders", timeout_s=0.5, step_id="late"), JSONValue)
        run.set_event("progress", {"cooked": len(orders)})
        assert_type(run.send("waiter-7", "served", orders, key="served-1"), int)
        try:
            run.effect("charge", "card.charge", {"amount": 1}, on_exhausted="raise")
        except longrun.EffectFailed as failed:
            assert_type(failed.step_id, str)
            assert_type(failed.attempts, int)
            assert_type(failed.last_error, str)
        return orders

    @longrun.durable(store=store)
    async def waiter(run: longrun.AsyncRun) -> JSONValue:
        assert_type(await run.send("kitchen-1", "orders", {"dish": "soup"}), int)
        await run.set_event("phase", "sent")
        return await run.recv("served", timeout_s=60)

    posted = kitchen.send("kitchen-1", "orders", {"dish": "tea"}, key="tea-1")
    assert_type(posted, longrun.Posted)
    assert_type(posted.seq, int)
    assert_type(posted.duplicate, bool)
    assert_type(posted.record_id, str | None)
    assert_type(posted.written_to, str | None)
    assert_type(kitchen.start("kitchen-2", 1, deadline=datetime.datetime.now(datetime.timezone.utc)), bool)
    assert_type(waiter.get_event("waiter-7", "phase", timeout_s=5.0), JSONValue)
    assert_type(store.read_messages("kitchen-1", "orders"), tuple[longrun.Message, ...])


# -- docs/fleet.md, "Schedules" and "Code versions" -----------------------------------------------


def schedules_and_versions(store: Store) -> None:
    @longrun.scheduled("*/15 9-17 * * mon-fri", timezone="UTC", catchup="backfill", name="digest")
    @longrun.durable(store=store, version="2026.12")
    def digest(run: longrun.Run, slot: str) -> str:
        return slot

    assert_type(digest, longrun.DurableFunction[str])
    assert_type(digest.version, str)
    assert_type(digest.schedule, longrun.Schedule | None)
    schedule = longrun.Schedule("nightly", digest.name, "0 2 * * *", "Europe/Berlin", "skip")
    assert_type(schedule.next_after(0.0), float)


# -- docs/fleet.md, "Named queues" ----------------------------------------------------------------


def named_queues(store: Store) -> None:
    @longrun.durable(store=store)
    def sync_account(run: longrun.Run, account: str) -> str:
        return account

    api = longrun.Queue("api", concurrency=4, per_worker=2, rate=(100, 60), priority=True)
    assert_type(sync_account.enqueue("sync-1", ("acme",), queue=api, delay_s=5, dedup_id="acme", priority=1), bool)
    assert_type(sync_account.enqueue("sync-2", ("acme",), queue="api"), bool)
    assert_type(api.rate, tuple[int, float] | None)
