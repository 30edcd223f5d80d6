"""Two durable tasks that talk, in a process of their own, for tests that SIGKILL it (tests/test_talk_crash.py).

A fork server (``python talk_child.py serve``, see ``helpers.forked``): each request
(``kind root work later ttl``, ``crash_at`` or ``trace``, ``async`` for the async face) runs, in a forked process armed with crash
points, the consumer (it stops awaiting-input until it has messages), then the producer, then the
consumer again, and reports the consumer's last outcome. Run again after a kill, the same three
runs resume both tasks.

- The producer sends ``N`` messages on topic ``orders`` to the consumer (``run.send``, keys derived
  from its task and step ids), then sets its event ``sent``.
- Before the consumer's first run, one message is sent from outside (``fn.send``, a control record
  in the store, key ``outside-1``), again by every request: the key makes it one message.
- The consumer receives ``N + 1`` messages (``run.recv``); for each it ships the order through an
  ``OutboxAdapter`` effect (``WORK/outbox.jsonl``: exactly once per message, payload the value)
  and sets its event ``progress``. It returns the values in the order received.

``KIND`` is ``json``, ``sqlite`` or ``postgres`` (``ROOT`` is then the DSN, the schema in ``work``'s
``schema`` file). ``later`` shifts the clock forward (leases judged on the runner's clock expire
for the next run); ``ttl`` is the lease's life (PostgreSQL judges it by the server's clock).
"""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src"))  # run by path: longrun from src
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests: for helpers

import longrun  # noqa: E402
from longrun import JsonFileStore, Limits, RetryPolicy, SqliteStore  # noqa: E402
from longrun.testing import OutboxAdapter  # noqa: E402

from helpers import forked  # noqa: E402
from helpers.clocks import LaterClock  # noqa: E402

N = 3
CONSUMER, PRODUCER = "consumer", "producer"
OUTSIDE, OUTSIDE_KEY = {"n": "outside"}, "outside-1"


def _recorded(store: longrun.Store) -> bool:
    """Whether the consumer has a state yet (a message is sent only to a task the store holds)."""
    try:
        return store.load(CONSUMER).state is not None
    except longrun.UnknownTaskError:
        return False


def consume(run: longrun.Run, n: int) -> list[Any]:
    got = []
    for i in range(n):
        value = run.recv("orders")
        run.effect(f"ship/{i}", "ship", {"order": value})
        run.set_event("progress", {"received": i + 1})
        got.append(value)
    return got


def produce(run: longrun.Run, to: str, n: int) -> int:
    for i in range(n):
        run.send(to, "orders", {"n": i})
    run.set_event("sent", n)
    return n


async def consume_async(run: longrun.AsyncRun, n: int) -> list[Any]:
    got = []
    for i in range(n):
        value = await run.recv("orders")
        await run.effect(f"ship/{i}", "ship", {"order": value})
        await run.set_event("progress", {"received": i + 1})
        got.append(value)
    return got


async def produce_async(run: longrun.AsyncRun, to: str, n: int) -> int:
    for i in range(n):
        await run.send(to, "orders", {"n": i})
    await run.set_event("sent", n)
    return n


def make_store(kind: str, root: str, work: str) -> longrun.Store:
    if kind == "json":
        return JsonFileStore(root, create=True)
    if kind == "sqlite":
        return SqliteStore(os.path.join(root, "longrun.sqlite"), create=True)
    if kind == "postgres":
        from longrun.stores import PostgresStore
        from longrun.stores._spec import postgres_connector

        with open(os.path.join(work, "schema")) as handle:
            driver, schema = handle.read().split()
        connect = postgres_connector(root, driver=driver)

        def factory() -> Any:
            connection = connect()
            cursor = connection.cursor()
            cursor.execute(f"SET search_path TO {schema}")
            connection.commit()
            return connection

        return PostgresStore(factory)
    raise SystemExit(f"unknown store kind {kind!r}")


def run_request(request: dict[str, Any]) -> longrun.RunOutcome:
    store = make_store(request["kind"], request["root"], request["work"])
    options: dict[str, Any] = dict(
        store=store,
        clock=LaterClock(request["later"]),
        lease_ttl_s=request["ttl"],
        limits=Limits(max_attempts=1000),  # kills may land in one step many times: not what is tested
        retry=RetryPolicy(base_delay_s=0.0, jitter=0.0),
    )
    outbox = OutboxAdapter(os.path.join(request["work"], "outbox.jsonl"))
    asynchronous = bool(request.get("async"))
    consumer = longrun.durable(adapters={"ship": outbox}, allowed_actions=("ship",), **options)(consume_async if asynchronous else consume)
    producer = longrun.durable(**options)(produce_async if asynchronous else produce)
    try:
        consumer.send(CONSUMER, "orders", OUTSIDE, key=OUTSIDE_KEY) if _recorded(store) else None
        consumer.run(CONSUMER, N + 1)
        consumer.send(CONSUMER, "orders", OUTSIDE, key=OUTSIDE_KEY)  # sent again: one message
        producer.run(PRODUCER, CONSUMER, N)
        return consumer.run(CONSUMER, N + 1)
    finally:
        close = getattr(store, "close", None)
        if callable(close):
            close()


if __name__ == "__main__":
    if sys.argv[1:] != ["serve"]:
        print(__doc__, file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(forked.serve(run_request))
