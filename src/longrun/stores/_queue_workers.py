"""The fleet tables' workers and action slots: heartbeats, the list of workers, K slots per limited
action, and the ``NOTIFY`` that wakes idle workers. ``TaskQueue`` (``_queue``) extends ``WorkerTables``."""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
from typing import Callable, Sequence

from ..canonical import JSONValue, canonical_bytes, parse_json
from ..errors import CorruptStateError, InvalidInputError
from ._fleet_sql import NOTIFY_CHANNEL, PostgresDialect
from ._queue_records import SlotHold, WorkerRecord
from ._queue_tables import MAX_ROW_BYTES, QueueConnection

__all__ = ["WorkerTables"]

log = logging.getLogger("longrun")


class WorkerTables(QueueConnection):
    """The workers, action slots and ``LISTEN`` of one store's fleet tables."""

    # -- workers ------------------------------------------------------------------------------

    def heartbeat(
        self, name: str, *, host: str, pid: int, state: str, concurrency: int, running: int, functions: Sequence[str], heartbeat_s: float
    ) -> None:
        """Record that worker ``name`` is alive (by the database's clock), with what it runs."""
        names: list[JSONValue] = [str(name) for name in sorted(functions)]
        listed = canonical_bytes(names).decode("utf-8")
        with self._session("record a worker's heartbeat"):
            self._run(
                "INSERT INTO longrun_workers (name, host, pid, started_at, heartbeat_at, heartbeat_s, state, concurrency, running, functions) "
                "VALUES (?, ?, ?, {now}, {now}, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET host = excluded.host, "
                "pid = excluded.pid, heartbeat_at = excluded.heartbeat_at, heartbeat_s = excluded.heartbeat_s, "
                "state = excluded.state, concurrency = excluded.concurrency, running = excluded.running, functions = excluded.functions, "
                "started_at = CASE WHEN longrun_workers.pid = excluded.pid AND longrun_workers.host = excluded.host "
                "THEN longrun_workers.started_at ELSE excluded.started_at END",
                (name, host, pid, heartbeat_s, state, concurrency, running, listed),
            )

    def workers(self) -> list[WorkerRecord]:
        """Every worker that has recorded a heartbeat, alive or not, ordered by name."""
        with self._session("list workers", write=False):
            rows = self._all(
                "SELECT name, host, pid, state, concurrency, running, {now} - heartbeat_at, heartbeat_s, functions, started_at "
                "FROM longrun_workers ORDER BY name"
            )
            claims = dict(
                (str(r[0]), int(r[1]))
                for r in self._all(
                    "SELECT claimed_by, COUNT(*) FROM longrun_queue WHERE claim_token IS NOT NULL AND wake_at > {now} GROUP BY claimed_by"
                )
            )
        records = []
        for name, host, pid, state, concurrency, running, age, interval, functions, started_at in rows:
            try:
                listed = parse_json(str(functions).encode("utf-8"), what="a worker's functions", max_bytes=MAX_ROW_BYTES)
            except CorruptStateError:
                listed = []
            names = tuple(str(item) for item in listed) if isinstance(listed, list) else ()
            alive = state != "stopped" and float(age) < 3 * float(interval)
            records.append(
                WorkerRecord(
                    str(name), str(host), int(pid), str(state), int(concurrency), int(running), claims.get(str(name), 0),
                    float(age), alive, names, float(started_at),
                )  # fmt: skip
            )
        return records

    def forget_workers(self, older_than_s: float) -> int:
        """Delete the rows of workers silent for longer than ``older_than_s``."""
        with self._session("forget old workers"):
            cursor = self._run("DELETE FROM longrun_workers WHERE {now} - heartbeat_at > ?", (older_than_s,))
        return int(cursor.rowcount)

    # -- action slots ---------------------------------------------------------------------------

    def acquire_slot(self, action: str, limit: int, holder: str, ttl_s: float) -> SlotHold | None:
        """One of ``action``'s slots 0..limit-1 that is free or whose holder let it expire, or None."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidInputError(f"a slot limit is an integer >= 1, got {limit!r}")
        token = secrets.token_hex(12)
        with self._session(f"take a slot of {action!r}"):
            if self._slot_rows.get(action, 0) < limit:
                for slot in range(limit):
                    self._run("INSERT INTO longrun_slots (action, slot) VALUES (?, ?) ON CONFLICT (action, slot) DO NOTHING", (action, slot))
                self._slot_rows[action] = limit
            free = "(token IS NULL OR expires_at <= {now})"
            if self._dialect.skip_locked:
                row = self._one(
                    f"SELECT slot FROM longrun_slots WHERE action = ? AND slot < ? AND {free} ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED",
                    (action, limit),
                )
            else:
                row = self._one(f"SELECT slot FROM longrun_slots WHERE action = ? AND slot < ? AND {free} ORDER BY slot LIMIT 1", (action, limit))
            if row is None:
                return None
            self._run(
                "UPDATE longrun_slots SET holder = ?, token = ?, expires_at = {now} + ? WHERE action = ? AND slot = ?",
                (holder, token, ttl_s, action, int(row[0])),
            )
        return SlotHold(action, int(row[0]), token)

    def renew_slot(self, hold: SlotHold, ttl_s: float) -> bool:
        with self._session(f"renew a slot of {hold.action!r}"):
            cursor = self._run(
                "UPDATE longrun_slots SET expires_at = {now} + ? WHERE action = ? AND slot = ? AND token = ?",
                (ttl_s, hold.action, hold.slot, hold.token),
            )
        return bool(cursor.rowcount == 1)

    def release_slot(self, hold: SlotHold) -> None:
        with self._session(f"release a slot of {hold.action!r}"):
            self._run(
                "UPDATE longrun_slots SET holder = NULL, token = NULL, expires_at = NULL WHERE action = ? AND slot = ? AND token = ?",
                (hold.action, hold.slot, hold.token),
            )

    def slots_held(self, action: str) -> int:
        """How many of ``action``'s slots are held and unexpired now."""
        with self._session(f"count the slots of {action!r}", write=False):
            row = self._one("SELECT COUNT(*) FROM longrun_slots WHERE action = ? AND token IS NOT NULL AND expires_at > {now}", (action,))
        return int(row[0])

    # -- LISTEN / NOTIFY ----------------------------------------------------------------------

    def listen(self, woken: Callable[[], None], stop: threading.Event, *, timeout_s: float = 1.0) -> None:
        """Call ``woken()`` whenever a row becomes due at once (PostgreSQL ``NOTIFY``), until ``stop``
        is set. Blocks: run it in a thread of its own. Returns at once where there is no
        ``NOTIFY`` (SQLite): polling is then the only wake-up. A lost connection is made again."""
        if not self._dialect.notify or not isinstance(self._dialect, PostgresDialect):
            return
        while not stop.is_set():
            connection = None
            try:
                connection = self._dialect.listen_connection()
                cursor = connection.cursor()
                cursor.execute(f"LISTEN {NOTIFY_CHANNEL}")
                woken()  # anything sent before LISTEN took effect was missed: look once
                if callable(getattr(connection, "notifies", None)):  # psycopg 3
                    while not stop.is_set():
                        for _ in connection.notifies(timeout=timeout_s, stop_after=1):
                            woken()
                else:  # pg8000 and others: notifications arrive with a statement's reply
                    pending = getattr(connection, "notifications", None)
                    while not stop.is_set():
                        cursor.execute("SELECT 1")
                        cursor.fetchall()
                        if pending:
                            pending.clear()
                            woken()
                        stop.wait(min(timeout_s, 0.1))
            except Exception as exc:  # a dropped connection, a restart: listen again after a pause
                if not stop.is_set():
                    log.warning("%r: LISTEN failed (%s); listening again in 1 s, polling meanwhile", self, exc)
                    stop.wait(1.0)
            finally:
                if connection is not None:
                    with contextlib.suppress(Exception):
                        connection.close()
