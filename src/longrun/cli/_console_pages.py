"""What the local web console shows and does, apart from HTTP: its pages, its stylesheet and its actions.

``Console`` holds one store, one approver and the session's token and CSRF token; it renders the
task list with its summary band, a task's page, the fleet's page and a page per worker and per
queue (every value read from the store HTML-escaped with ``e``), and carries out an approve,
answer, cancel, resolve or reopen form as the CLI's own commands, and "run once" (where no live
worker runs the task's function) as ``longrun resume STORE TASK`` does. ``SCRIPT`` is the one
script the pages load: it reloads the page every few seconds unless a form is being filled.
``_console`` serves it over HTTP and holds the security around it; the module docstring there
says what each page shows; what the list and the band are made of is ``_console_listing``.

One concept, what the console shows and does; it is long because every page and every form is
here, each escaping what it shows in the same way, which a reviewer checks in one place.
"""

from __future__ import annotations

import hmac
import html
import io
import json
import secrets
import threading
import time
import urllib.parse
import weakref
from typing import Any, Callable, Mapping, Sequence

from ..contract import ASK_ACTION
from ..envelope import RunState
from ..errors import LongrunError
from ..events import kind_of
from ..intervention import REOPENABLE
from ..lease import Lease
from ..ledger import EffectState
from ..outcome import TERMINAL
from ..progress import progress_of
from ..protocols import LoadResult, Store
from ..stores.queue import QueueEntry, TaskQueue, WorkerRecord, open_queue
from ..task_events import events_of
from ._common import format_time, lease_summary, relative, short_digest
from ._console_listing import (
    DUE_COUNT_CAP,
    FAILED_STATUSES, PAGE_SIZE, Fleet, Listing, RowCache, Summary, TaskRow, complete, indexed_page, read_fleet, read_rows, short_action,
)  # fmt: skip
from ._control import cmd_approve, cmd_cancel, parse_answer, payload_view
from ._filters import function_of
from ._intervene import cmd_resolve, write_reopen
from ._history import timeline
from ._deadline import deadline_words
from ._inspect import LS_STATUSES, progress_line, reported_line
from ._payload import payload_lines, safe_text
from ._resume import run_recorded_once
from ._verify import verify
from ._what_ran import failure_lines, shown_value, what_ran

__all__ = ["NOTICES", "SCRIPT", "STYLE", "Console", "ConsoleError", "e", "queue_url", "task_url", "worker_url"]

NOTICES = {
    "approved": "Approved: the approval is written; it authorizes this one effect, once. A live worker runs the task within a second.",
    "answered": "Answered: the answer is written; it is used once, for this question. A live worker runs the task within a second.",
    "cancelled": "Cancellation written: the run starts no new effect; a live worker ends it cancelled within a second.",
    "resolved": "Resolution written: the task's next run takes the effect as you said, once. A live worker runs it within a second.",
    "reopened": "Reopen written: the task's next run takes it out of the status it ended in and goes on. A live worker runs it within a second.",
    "ran": "Ran the task once here; it stopped as shown below.",
}
"""The only messages a redirect may ask a page to show (by key: nothing from the URL is echoed)."""

STYLE = """\
:root { --ink: #1d2430; --muted: #5b6577; --line: #d9dee7; --bg: #f6f7f9; --card: #fff; --accent: #2457c5; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--ink); background: var(--bg); }
header { background: #1d2430; color: #fff; padding: 10px 24px; display: flex; gap: 16px; align-items: baseline; }
header a { color: #fff; text-decoration: none; font-weight: 600; }
header .store { color: #aab3c5; font-size: 13px; }
header .mode { margin-left: auto; font-size: 13px; color: #ffd479; }
main { padding: 20px 24px; max-width: 1200px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 24px 0 8px; }
section.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 14px 16px; margin: 12px 0; }
table { border-collapse: collapse; width: 100%; background: var(--card); }
th, td { text-align: left; padding: 6px 10px; border-bottom: 1px solid var(--line); vertical-align: top; font-size: 14px; }
th { color: var(--muted); font-weight: 600; font-size: 12px; text-transform: uppercase; letter-spacing: .03em; }
td.mono, .mono { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: 13px; }
pre.payload { background: #0f1724; color: #e6edf7; padding: 12px 14px; border-radius: 6px; overflow-x: auto; font-size: 13px; margin: 8px 0; white-space: pre-wrap; word-break: break-word; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 4px 16px; margin: 8px 0; }
dl.facts dt { color: var(--muted); }
dl.facts dd { margin: 0; }
.status { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 13px; font-weight: 600; background: #e4e8ef; }
.status-done { background: #d7f2df; color: #17633a; }
.status-running { background: #dbe7ff; color: #1f4fb8; }
.status-awaiting-approval, .status-awaiting-input, .status-retry-scheduled, .status-sleeping, .status-waiting-on-child { background: #fff1c9; color: #7a5400; }
.status-unsafe-to-continue, .status-state-unrecoverable, .status-plan-mismatch, .status-blocked, .status-DAMAGED, .status-UNREADABLE, .status-lease-lost, .status-failed { background: #ffd9d6; color: #8e1b12; }
.status-alive { background: #d7f2df; color: #17633a; }
.status-silent { background: #ffd9d6; color: #8e1b12; }
.status-queued { background: #e8ecf2; color: #3b4a5e; }
.error-text { color: #8e1b12; }
.status-cancelled, .status-limits-exhausted, .status-deadline-exceeded { background: #eadff7; color: #5a2d8a; }
progress { width: 140px; height: 12px; vertical-align: middle; }
.pending { border-left: 4px solid #e0a800; }
.notice { background: #d7f2df; border: 1px solid #9fd8b2; padding: 8px 12px; border-radius: 6px; }
.error { background: #ffe3e0; border: 1px solid #f2a39a; padding: 8px 12px; border-radius: 6px; }
form.inline { display: flex; gap: 8px; align-items: center; flex-wrap: wrap; margin-top: 8px; }
input[type=text] { padding: 6px 8px; border: 1px solid var(--line); border-radius: 6px; min-width: 260px; font: inherit; }
button { font: inherit; padding: 6px 14px; border-radius: 6px; border: 1px solid var(--accent); background: var(--accent); color: #fff; cursor: pointer; }
button.danger { background: #fff; color: #a1271c; border-color: #a1271c; }
.muted { color: var(--muted); }
ul.evidence { margin: 4px 0 0; padding-left: 18px; }
ul.evidence li { margin: 2px 0; overflow-wrap: anywhere; }
td { overflow-wrap: anywhere; }
h1.mono { font-size: 22px; }
.columns { display: grid; grid-template-columns: repeat(3, 1fr); gap: 12px; }
.columns h3 { font-size: 14px; margin: 0 0 4px; }
form.filters { display: flex; gap: 12px; align-items: end; flex-wrap: wrap; margin: 8px 0 12px; }
form.filters label { display: flex; flex-direction: column; font-size: 12px; color: var(--muted); }
select[multiple] { min-width: 200px; height: 92px; }
td.task, .task-id { white-space: nowrap; overflow-wrap: normal; }
td.task { max-width: 360px; overflow: hidden; text-overflow: ellipsis; }
header .updated { font-size: 13px; color: #aab3c5; }
header nav a { font-weight: 400; margin-right: 12px; }
.band { display: flex; gap: 12px; flex-wrap: wrap; margin: 8px 0 16px; }
.band .tile { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 8px 14px; min-width: 150px; }
.band .tile .figure { font-size: 22px; font-weight: 600; display: block; }
.band .tile .label { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .03em; }
.band .tile.alert { border-color: #f2a39a; background: #fff4f2; }
.band .statuses a { margin-right: 8px; text-decoration: none; }
nav.pages { display: flex; gap: 16px; align-items: center; margin: 10px 0; }
td.action { max-width: 420px; }
"""

SCRIPT = """\
(function () {
  "use strict";
  var seconds = Number(document.body.getAttribute("data-refresh") || "0");
  var shown = document.getElementById("refresh-state");
  if (!(seconds > 0)) { return; }
  function busy() {
    var active = document.activeElement;
    if (active && active.form) { return true; }
    var fields = document.querySelectorAll("input, textarea, select");
    for (var i = 0; i < fields.length; i++) {
      var field = fields[i];
      if (field.type === "hidden" || field.type === "submit") { continue; }
      if (field.tagName === "SELECT") {
        var anyDefault = false;
        for (var k = 0; k < field.options.length; k++) { anyDefault = anyDefault || field.options[k].defaultSelected; }
        for (var j = 0; j < field.options.length; j++) {
          // A single select with no option marked shows its first one: that is its default.
          var byDefault = anyDefault || field.multiple ? field.options[j].defaultSelected : j === 0;
          if (field.options[j].selected !== byDefault) { return true; }
        }
      } else if (field.type === "checkbox" || field.type === "radio") {
        if (field.checked !== field.defaultChecked) { return true; }
      } else if (field.value !== field.defaultValue) {
        return true;
      }
    }
    return false;
  }
  var left = seconds;
  window.setInterval(function () {
    if (busy()) {
      left = seconds;
      if (shown) { shown.textContent = "refresh paused while a form is filled"; }
      return;
    }
    left -= 1;
    if (shown) { shown.textContent = "refreshes in " + Math.max(left, 0) + " s"; }
    if (left <= 0) {
      var url = new URL(window.location.href);
      url.searchParams.delete("notice");
      window.location.replace(url.toString());
    }
  }, 1000);
}());
"""


def e(value: object) -> str:
    """HTML-escape anything shown (quotes too: values also land in attributes)."""
    return html.escape(str(value), quote=True)


def task_url(task_id: str) -> str:
    return "/task/" + urllib.parse.quote(task_id, safe="")


IN_FLIGHT = (EffectState.STARTED, EffectState.ACKNOWLEDGED, EffectState.UNCERTAIN)
"""The effect states a resolution applies to (``longrun.intervention.resolve``)."""


def worker_url(name: str) -> str:
    return "/worker/" + urllib.parse.quote(name, safe="")


def queue_url(function: str) -> str:
    return "/queue/" + urllib.parse.quote(function, safe="")


def _due(due_in_s: float | None) -> bool:
    return due_in_s is not None and due_in_s <= 0


def _status_badge(status: object) -> str:
    text = str(status)
    css = text if text in LS_STATUSES or text in ("alive", "silent") else "other"
    return f'<span class="status status-{e(css)}">{e(text)}</span>'


class ConsoleError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Console:
    """What the console shows and does, apart from HTTP: one store, one approver, one token."""

    def __init__(
        self,
        store: Store,
        label: str,
        *,
        read_only: bool,
        approver: str,
        sign_key: str | None,
        control_root: str | None,
        clock: Callable[[], float] = time.time,
        refresh_s: float = 5.0,
    ):
        self.store = store
        self.label = label
        self.read_only = read_only or control_root is None
        self.read_only_reason = "" if not self.read_only else "read-only" if read_only else "read-only: no --control-root"
        self.approver = approver
        self.sign_key = sign_key
        self.control_root = control_root
        self.clock = clock
        self.refresh_s = refresh_s
        """Pages reload themselves this often (0: never), unless a form is being filled."""
        self.token = secrets.token_urlsafe(32)
        self.csrf = hmac.new(self.token.encode("ascii"), b"longrun console csrf", "sha256").hexdigest()
        self.lock = threading.Lock()
        self.fleet_queue: list[TaskQueue] = []
        """The fleet's queue, opened by the first page that reads it and kept (``read_fleet``'s ``kept``); ``close`` closes it."""
        weakref.finalize(self, _close_all, self.fleet_queue)
        self.row_cache = RowCache()
        """The rows of tasks at rest, between two renders (``_console_listing.RowCache``)."""
        """Serializes store access: one store object serves every request thread."""

    def close(self) -> None:
        """Close the fleet's queue the pages kept open (the next page opens it again)."""
        with self.lock:
            _close_all(self.fleet_queue)

    # -- pages --------------------------------------------------------------------------------

    def layout(self, title: str, body: str, *, refresh: bool = True) -> str:
        """A page: the header (store, mode, when it was rendered, the refresh state), then ``body``.
        With ``refresh``, the script reloads it every ``refresh_s`` seconds unless a form is being filled."""
        mode = (
            e(self.read_only_reason)
            if self.read_only
            else f"approving as {e(self.approver)} into {e(self.control_root)}" + (" (signed)" if self.sign_key else "")
        )
        every = self.refresh_s if refresh and self.refresh_s > 0 else 0
        updated = format_time(self.clock(), precise=False)
        state = f"refreshes every {every:g} s" if every else "no auto-refresh"
        return (
            "<!doctype html><html lang=en><head><meta charset=utf-8>"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{e(title)}</title>"
            '<link rel="stylesheet" href="/static/console.css"><script src="/static/console.js" defer></script></head>'
            f'<body data-refresh="{every:g}">'
            f'<header><a href="/">longrun console</a><nav><a href="/">tasks</a><a href="/fleet">workers and queues</a></nav>'
            f'<span class="store">{e(self.label)}</span>'
            f'<span class="updated">updated <time id="updated">{e(updated)}</time> · <span id="refresh-state">{e(state)}</span></span>'
            f'<span class="mode">{mode}</span></header>'
            f"<main>{body}</main></body></html>"
        )

    def _rows(self) -> list[TaskRow]:
        with self.lock:
            return read_rows(self.store, self.row_cache)

    def _fleet(self) -> Fleet:
        with self.lock:
            return read_fleet(self.store, kept=self.fleet_queue)

    def task_list(self, query: Mapping[str, list[str]]) -> str:
        now = self.clock()
        listing = Listing.from_query(query, now)
        with self.lock:
            band_fleet = read_fleet(self.store, rows=False, kept=self.fleet_queue)  # the band's figures: a count, not every queue row
            indexed = indexed_page(self.store, listing, band_fleet, now)
        fleet = band_fleet
        if indexed is not None:  # O(page): from the store's summary index
            page, matched, summary, functions = indexed.rows, indexed.matched, indexed.summary, indexed.functions
        else:
            rows = self._rows()
            summary = Summary.of(rows, fleet, now)
            page, matched = listing.select(rows)
            functions = sorted({row.function for row in rows if row.function})
            with self.lock:
                page = complete(self.store, page)
        body = ["<h1>Tasks</h1>", self._band(summary, now)]
        body += [f'<p class="error">{e(problem)}</p>' for problem in listing.problems]
        options = "".join(
            f'<option value="{e(value)}"{" selected" if value in listing.statuses else ""}>{e(value)}</option>' for value in LS_STATUSES
        )
        function_options = f'<option value=""{"" if listing.function else " selected"}>any</option>' + "".join(
            f'<option value="{e(name)}"{" selected" if name == listing.function else ""}>{e(name)}</option>' for name in functions
        )
        body.append(
            '<form class="filters" method="get" action="/" role="search">'
            f'<label>search<input type="search" name="q" value="{e(listing.search)}" placeholder="task id or function"></label>'
            f'<label>status<select name="status" multiple>{options}</select></label>'
            f'<label>function<select name="function">{function_options}</select></label>'
            f'<label>updated since<input type="text" name="since" value="{e(listing.since_text)}" placeholder="2h, 3d, 2026-11-30T14:00Z"></label>'
            '<button>Filter</button></form>'
        )
        if not page:
            body.append(f'<p class="muted">No tasks match{" on this page" if matched else ""}.</p>')
        else:
            body.append(self._table(page, now))
        body.append(self._pages(listing, matched))
        return self.layout("longrun tasks", "".join(body))

    def _band(self, summary: Summary, now: float) -> str:
        statuses = "".join(
            f'<a href="/?{e(urllib.parse.urlencode({"status": status}))}">{_status_badge(status)} {count}</a>'
            for status, count in summary.by_status.items()
        ) or '<span class="muted">no tasks</span>'
        oldest = (
            f"oldest requested {relative(summary.oldest_request, now)}" if summary.oldest_request is not None else "none waiting"
        )
        fleet = summary.fleet
        depth = "-" if fleet.note is not None else f"{DUE_COUNT_CAP:,}+" if fleet.due > DUE_COUNT_CAP else str(fleet.due)
        alive = f"{fleet.alive} of {len(fleet.workers)}" if fleet.note is None else "-"
        note = f'<span class="label">{e(fleet.note)}</span>' if fleet.note else ""
        tiles = [
            ("tasks by status", f'<span class="statuses">{statuses}</span>', "statuses", False),
            ("pending approvals and questions", f'<span class="figure">{summary.pending}</span><span class="label">{e(oldest)}</span>',
             "pending", summary.pending > 0),
            ("failures in the last hour", f'<span class="figure">{summary.failures_last_hour}</span>', "failures",
             summary.failures_last_hour > 0),
            ("queue depth (due now)", f'<span class="figure"><a href="/fleet">{e(depth)}</a></span>{note}', "queue-depth", False),
            ("workers alive", f'<span class="figure"><a href="/fleet">{e(alive)}</a></span>', "workers-alive", False),
        ]  # fmt: skip
        shown = "".join(
            f'<div class="tile {name}{" alert" if alert else ""}"><span class="label">{title}</span>{value}</div>'
            for title, value, name, alert in tiles
        )
        return f'<section class="band" aria-label="summary">{shown}</section>'

    def _table(self, rows: Sequence[TaskRow], now: float) -> str:
        lines = []
        for row in rows:
            if row.total:
                shown = f'<progress value="{row.verified}" max="{row.total}"></progress> {e(row.progress)}'
            else:
                shown = e(row.progress) if row.progress else '<span class="muted">-</span>'
            function = (
                f'<a class="mono" href="/?{e(urllib.parse.urlencode({"function": row.function}))}">{e(safe_text(row.function))}</a>'
                if row.function else '<span class="muted">-</span>'
            )  # fmt: skip
            failing = row.status in FAILED_STATUSES or row.status == "retry-scheduled"
            error_cell = f'<div class="error-text">{e(safe_text(row.last_error))}</div>' if failing and row.last_error else ""
            action = safe_text(short_action(row.next_action, self.label, limit=None))
            updated = row.updated_at
            lines.append(
                "<tr>"
                f'<td class="mono task" title="{e(row.task_id)}"><a href="{e(task_url(row.task_id))}">{e(row.task_id)}</a></td>'
                f"<td>{_status_badge(row.status)}{error_cell}</td>"
                f"<td>{function}</td>"
                f"<td>{shown}</td>"
                f'<td title="{e(format_time(updated) if updated is not None else "")}">{e(relative(updated, now)) if updated is not None else "-"}</td>'
                f'<td class="action" title="{e(action)}">{e(short_action(row.next_action, self.label))}</td>'
                "</tr>"
            )
        return (
            '<table class="tasks"><thead><tr><th>Task</th><th>Status</th><th>Function</th><th>Progress</th><th>Updated</th>'
            f"<th>Next action</th></tr></thead><tbody>{''.join(lines)}</tbody></table>"
        )

    def _pages(self, listing: Listing, matched: int) -> str:
        last = max(1, -(-matched // PAGE_SIZE))
        first_shown = min(matched, (listing.page - 1) * PAGE_SIZE + 1)
        last_shown = min(matched, listing.page * PAGE_SIZE)
        links = []
        if listing.page > 1:
            links.append(f'<a rel="prev" href="/?{e(urllib.parse.urlencode(listing.query(page=listing.page - 1)))}">← newer</a>')
        links.append(f'<span class="count">{first_shown}–{last_shown} of {matched} · page {listing.page} of {last}</span>')
        if listing.page < last:
            links.append(f'<a rel="next" href="/?{e(urllib.parse.urlencode(listing.query(page=listing.page + 1)))}">older →</a>')
        return f'<nav class="pages">{"".join(links)}</nav>'

    # -- the fleet ----------------------------------------------------------------------------

    def fleet_page(self) -> str:
        fleet = self._fleet()
        body = ["<h1>Workers and queues</h1>"]
        if fleet.note is not None:
            body.append(f'<p class="muted">{e(fleet.note)}.</p>')
            return self.layout("longrun workers and queues", "".join(body))
        body.append("<h2>Workers</h2>")
        body.append(self._workers_table(fleet.workers) if fleet.workers else '<p class="muted">No worker has recorded a heartbeat.</p>')
        body.append("<h2>Queues</h2>")
        queues = fleet.queues()
        if not queues:
            body.append('<p class="muted">The queue is empty.</p>')
        else:
            rows = "".join(
                f'<tr><td class="mono task"><a href="{e(queue_url(function))}">{e(safe_text(function))}</a></td>'
                f"<td>{len(entries)}</td><td>{sum(1 for entry in entries if _due(entry.due_in_s) and entry.claimed_by is None)}</td>"
                f"<td>{sum(1 for entry in entries if entry.claimed_by)}</td><td>{sum(1 for entry in entries if entry.failures)}</td></tr>"
                for function, entries in queues.items()
            )
            body.append(
                "<table><thead><tr><th>Queue (function)</th><th>Tasks</th><th>Due now</th><th>Claimed</th><th>Failing</th></tr></thead>"
                f"<tbody>{rows}</tbody></table>"
            )
        return self.layout("longrun workers and queues", "".join(body))

    def _workers_table(self, workers: Sequence[WorkerRecord]) -> str:
        rows = "".join(
            f'<tr><td class="mono task"><a href="{e(worker_url(worker.name))}">{e(safe_text(worker.name))}</a></td>'
            f'<td>{_status_badge("alive" if worker.alive else "silent")} {e(worker.state)}</td>'
            f"<td>{worker.running} of {worker.concurrency}</td><td>{e(f'{worker.heartbeat_age_s:.0f} s ago')}</td>"
            f"<td>{e(safe_text(worker.host))} pid {worker.pid}</td></tr>"
            for worker in workers
        )
        return (
            "<table><thead><tr><th>Worker</th><th>State</th><th>Tasks held</th><th>Last heartbeat</th><th>Where</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>"
        )

    def worker_page(self, name: str) -> str:
        fleet = self._fleet()
        worker = next((worker for worker in fleet.workers if worker.name == name), None)
        if worker is None:
            raise ConsoleError(404, f"no worker named {safe_text(name)[:200]!r} has recorded a heartbeat")
        now = self.clock()
        facts = [
            ("state", f'{_status_badge("alive" if worker.alive else "silent")} {e(worker.state)}'),
            ("host", e(f"{safe_text(worker.host)}, pid {worker.pid}")),
            ("started", e(f"{format_time(worker.started_at)} ({relative(worker.started_at, now)})")),
            ("last heartbeat", e(f"{worker.heartbeat_age_s:.1f} s ago")),
            ("tasks held", e(f"{worker.running} running (at its last heartbeat), {worker.claimed} claimed now, of {worker.concurrency}")),
            ("functions", " ".join(f'<a class="mono" href="{e(queue_url(item))}">{e(safe_text(item))}</a>' for item in worker.functions)
             or '<span class="muted">none</span>'),
        ]  # fmt: skip
        items = "".join(f"<dt>{label}</dt><dd>{value}</dd>" for label, value in facts)
        claimed = [entry for entry in fleet.entries if entry.claimed_by == name]
        body = [f'<h1 class="mono task-id">worker {e(safe_text(name))}</h1>', f'<section class="card"><dl class="facts">{items}</dl></section>']
        body.append("<h2>Tasks it claims</h2>")
        body.append(self._entries_table(claimed) if claimed else '<p class="muted">None.</p>')
        return self.layout(f"worker {name}", "".join(body))

    def queue_page(self, function: str) -> str:
        fleet = self._fleet()
        entries = [entry for entry in fleet.entries if entry.function == function]
        workers = [worker for worker in fleet.workers if function in worker.functions]
        if not entries and not workers:
            raise ConsoleError(404, f"no queued task and no worker for function {safe_text(function)[:200]!r}")
        due = sum(1 for entry in entries if _due(entry.due_in_s) and entry.claimed_by is None)
        body = [
            f'<h1 class="mono task-id">queue {e(safe_text(function))}</h1>',
            f'<p>{len(entries)} tasks, {due} due now, {sum(1 for w in workers if w.alive)} of {len(workers)} workers alive run it.</p>',
            "<h2>Tasks</h2>",
            self._entries_table(sorted(entries, key=lambda entry: (entry.due_in_s is None, entry.due_in_s or 0.0)))
            if entries else '<p class="muted">None.</p>',
            "<h2>Workers</h2>",
            self._workers_table(workers) if workers else '<p class="muted">No worker runs it.</p>',
        ]  # fmt: skip
        return self.layout(f"queue {function}", "".join(body))

    def _entries_table(self, entries: Sequence[QueueEntry]) -> str:
        def due(entry: QueueEntry) -> str:
            if entry.due_in_s is None:
                return "parked"
            return "due now" if entry.due_in_s <= 0 else f"in {entry.due_in_s:.0f} s"

        rows = "".join(
            f'<tr><td class="mono task"><a href="{e(task_url(entry.task_id))}">{e(entry.task_id)}</a></td>'
            f"<td>{_status_badge(entry.status)}</td><td>{e(due(entry))}</td>"
            f'<td>{e(safe_text(entry.claimed_by)) if entry.claimed_by else "-"}</td><td>{entry.runs}</td><td>{entry.failures}</td>'
            f'<td>{e(safe_text(entry.last_error or ""))}</td></tr>'
            for entry in entries
        )
        return (
            '<table class="tasks"><thead><tr><th>Task</th><th>Last status</th><th>Due</th><th>Claimed by</th><th>Runs</th><th>Failures in a row</th>'
            f"<th>Last error</th></tr></thead><tbody>{rows}</tbody></table>"
        )

    def task_page(self, task_id: str, query: Mapping[str, list[str]]) -> str:
        now = self.clock()
        with self.lock:
            loaded = self.store.load(task_id)  # read-only: no lease, moves nothing
            lease = self.store.read_lease(task_id)
            _, entries = timeline(self.store, task_id, now)
            report, _ = verify(self.store, task_id, now)
        state = loaded.state
        notice = NOTICES.get((query.get("notice") or [""])[0])
        body = [f'<h1 class="mono task-id">{e(task_id)}</h1>']
        if notice:
            body.append(f'<p class="notice">{e(notice)}</p>')
        if state is None:
            body.append('<p class="muted">No revision committed yet.</p>')
            return self.layout(task_id, "".join(body))
        body.append(self._summary(state, lease, now))
        body.append(self._run_once(task_id, state))
        body.append(self._pending(task_id, state, now))
        body.append(self._resolve(state))
        body.append(self._effects(state))
        body.append(self._events(state))
        body.append(self._evidence(loaded, state, report))
        body.append(self._timeline(entries))
        return self.layout(f"{task_id}: {state.status.value}", "".join(body))

    def _summary(self, state: RunState, lease: Lease | None, now: float) -> str:
        progress = progress_of(state)
        bar = f'<progress value="{progress.verified}" max="{progress.total}"></progress> ' if progress.total else ""
        current = progress.current
        facts = [
            ("status", _status_badge(state.status.value)),
            ("progress", bar + e(progress_line(progress))),
            *([("reported", e(reported_line(state.progress)))] if state.progress is not None else []),
            ("revision", e(state.revision)),
            ("updated", e(f"{format_time(state.updated_at)} ({relative(state.updated_at, now)})")),
            ("plan digest", f'<span class="mono">{e(state.plan_digest)}</span>'),
            ("lease", e(lease_summary(lease, now))),
        ]
        words = deadline_words(state, now)
        if words is not None:
            facts.append(("deadline", e(words)))
        if current is not None:
            facts.append(
                ("current", e(f"{kind_of(current.action)} {safe_text(current.step_id)} ({safe_text(current.action)}): "
                              f"{current.state.value}, attempt {current.attempts}, for {relative(current.updated_at, now).removesuffix(' ago')}"))
            )  # fmt: skip
        facts += self._what_ran(state, now)
        action = short_action(state.next_action, self.label, limit=None) if state.next_action else "(none recorded)"
        facts.append(("next action", f'<span class="next-action">{e(safe_text(action))}</span>'))
        items = "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in facts)
        cancel = ""
        if not self.read_only and state.status not in TERMINAL:
            cancel = (
                f'<form class="inline" method="post" action="{e(task_url(state.task_id))}/cancel">'
                f'<input type="hidden" name="csrf" value="{e(self.csrf)}">'
                '<input type="text" name="reason" value="cancelled by an operator from the console" aria-label="reason">'
                '<button class="danger" name="action" value="cancel">Cancel the run</button></form>'
            )
        return f'<section class="card"><dl class="facts">{items}</dl>{cancel}{self._reopen(state)}</section>'

    def _hidden(self, **fields: str) -> str:
        shown = "".join(f'<input type="hidden" name="{e(name)}" value="{e(value)}">' for name, value in fields.items())
        return f'<input type="hidden" name="csrf" value="{e(self.csrf)}">' + shown

    def _reopen(self, state: RunState) -> str:
        """A task that ended unfinished (``REOPENABLE``) can be reopened: its next run goes on."""
        if self.read_only or state.status not in REOPENABLE:
            return ""
        return (
            f'<form class="inline" method="post" action="{e(task_url(state.task_id))}/reopen">{self._hidden()}'
            '<input type="text" name="reason" required aria-label="why it goes on" placeholder="why it goes on">'
            '<label>more attempts <input type="number" name="add_attempts" value="0" min="0" max="1000" aria-label="more attempts"></label>'
            '<button name="action" value="reopen">Reopen</button></form>'
        )

    def _resolve(self, state: RunState) -> str:
        """An effect in flight (started, acknowledged, uncertain): say whether it took place."""
        if self.read_only:
            return ""
        cards = []
        for record in state.effects.values():
            if record.state not in IN_FLIGHT or kind_of(record.action) != "effect":
                continue
            hidden = self._hidden(step=record.step_id, key=record.key, payload_digest=record.payload_digest)
            cards.append(
                f'<section class="card pending resolve"><h3>Effect <span class="mono">{e(safe_text(record.step_id))}</span> is '
                f"{e(record.state.value)}: did it take place?</h3>"
                f'<form class="inline" method="post" action="{e(task_url(state.task_id))}/resolve">{hidden}'
                '<input type="text" name="evidence" required aria-label="evidence" placeholder="what you saw, where">'
                '<button name="outcome" value="applied">It took place</button>'
                '<button class="danger" name="outcome" value="absent">It did not</button></form></section>'
            )
        return "".join(cards)

    def _run_once(self, task_id: str, state: RunState) -> str:
        """Where no live worker runs the task's function, a form to run it once here (a worker, when
        there is one, runs it within a second of an approval, an answer or a cancellation)."""
        function = function_of(state)
        if self.read_only or function is None or state.status in TERMINAL:
            return ""
        with self.lock:
            queue = None
            try:
                queue = open_queue(self.store)
                if queue.live_workers(function):
                    return ""
                note = f"No live worker runs {function}."
            except LongrunError as exc:
                note = f"Whether a worker runs {function} cannot be told ({exc})."
            finally:
                if queue is not None:
                    queue.close()
        return (
            f'<section class="card"><p class="muted">{e(note)} Run the task once here, as `longrun resume` would: '
            "its module is imported into this console's process.</p>"
            f'<form class="inline" method="post" action="{e(task_url(task_id))}/run">'
            f'<input type="hidden" name="csrf" value="{e(self.csrf)}">'
            '<button name="action" value="run">Run once</button></form></section>'
        )
    def _what_ran(self, state: RunState, now: float) -> list[tuple[str, str]]:
        """A durable task's function, arguments, result, parent, children and last error (``_what_ran``)."""
        view = what_ran(state)
        facts: list[tuple[str, str]] = []
        function = view["function"]
        if isinstance(function, str):
            facts.append(("function", f'<span class="mono">{e(safe_text(function))}</span>'))
            facts.append(("arguments", f'<pre class="payload">args {e(shown_value(view["args"]))}\nkwargs {e(shown_value(view["kwargs"]))}</pre>'))
            result = f'<pre class="payload">{e(shown_value(view["result"]))}</pre>' if view["done"] else '<span class="muted">not returned yet</span>'
            facts.append(("result", result))
            parent = view["parent"]
            if isinstance(parent, str):
                facts.append(("parent", f'<a class="mono" href="{e(task_url(parent))}">{e(parent)}</a>'))
            children = view["children"]
            if isinstance(children, list) and children:
                links = [
                    f'<a class="mono" href="{e(task_url(str(child.get("task"))))}">{e(child.get("task"))}</a> ({e(child.get("state"))})'
                    for child in children
                    if isinstance(child, dict)
                ]
                facts.append(("children", ", ".join(links)))
        failure = state.last_failure
        if failure is not None:
            lines = failure_lines(failure, now, indent="")
            text = "\n".join(line.strip() for line in lines).removeprefix("last error").strip()
            trace = f'<pre class="payload">{e(safe_text(failure.traceback))}</pre>' if failure.traceback else ""
            facts.append(("last error", f'<div class="error-text">{e(safe_text(text))}</div>{trace}'))
        return facts

    def _pending(self, task_id: str, state: RunState, now: float) -> str:
        if not state.approval_requests:
            return '<h2>Pending approvals and questions</h2><p class="muted">None.</p>'
        cards = ["<h2>Pending approvals and questions</h2>"]
        for request in state.approval_requests.values():
            payload, notes = payload_view(state, request)
            question = request.action == ASK_ACTION
            expiry = "expired" if request.expired(now) else "expires"
            facts = [
                ("step", f'<span class="mono">{e(safe_text(request.step_id))}</span>'),
                ("action", f'<span class="mono">{e(safe_text(request.action))}</span>'),
                ("payload digest", f'<span class="mono payload-digest">{e(request.payload_digest)}</span>'),
                ("plan digest", f'<span class="mono">{e(request.plan_digest)}</span>'),
                ("requested", e(f"{format_time(request.requested_at)}, {expiry} {format_time(request.expires_at)} ({relative(request.expires_at, now)})")),
            ]
            items = "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in facts)
            if question and isinstance(payload, dict):
                shown = f'<p class="question">{e(safe_text(str(payload.get("question"))))}</p>'
                if payload.get("choices") is not None:
                    shown += f'<p class="muted">choices: <span class="mono">{e(safe_text(json.dumps(payload.get("choices"), ensure_ascii=False)))}</span></p>'
            else:
                text = "\n".join(payload_lines(payload)) if payload is not None else "(the payload is not recorded)"
                shown = f'<pre class="payload" id="payload-{e(request.step_id)}">{e(text)}</pre>'
            shown += "".join(f'<p class="error">{e(note)}</p>' for note in notes)
            form = ""
            if not self.read_only:
                hidden = (
                    f'<input type="hidden" name="csrf" value="{e(self.csrf)}">'
                    f'<input type="hidden" name="step" value="{e(request.step_id)}">'
                    f'<input type="hidden" name="payload_digest" value="{e(request.payload_digest)}">'
                )
                if question:
                    form = (
                        f'<form class="inline" method="post" action="{e(task_url(task_id))}/answer">{hidden}'
                        '<input type="text" name="answer" required aria-label="answer" placeholder="JSON, or plain text">'
                        '<button name="action" value="answer">Answer</button></form>'
                    )
                else:
                    form = (
                        f'<form class="inline" method="post" action="{e(task_url(task_id))}/approve">{hidden}'
                        '<button name="action" value="approve">Approve exactly this payload</button>'
                        '<span class="muted">once, bound to the task, plan, step, payload digest and action</span></form>'
                    )
            kind = "Question" if question else "Approval request"
            cards.append(f'<section class="card pending"><h3>{kind}</h3><dl class="facts">{items}</dl>{shown}{form}</section>')
        return "".join(cards)

    def _effects(self, state: RunState) -> str:
        if not state.effects:
            return '<h2>Effects</h2><p class="muted">None planned yet.</p>'
        rows = []
        for record in state.effects.values():
            detail = record.last_error or record.evidence or record.receipt or ""
            rows.append(
                "<tr>"
                f'<td class="mono">{e(safe_text(record.step_id))}</td><td>{e(kind_of(record.action))}</td>'
                f"<td>{e(record.state.value)}</td><td>{e(record.attempts)}</td>"
                f'<td class="mono">{e(short_digest(record.payload_digest))}</td>'
                f"<td>{e(format_time(record.updated_at))}</td><td>{e(safe_text(detail))}</td>"
                "</tr>"
            )
        return (
            "<h2>Effects</h2><table><thead><tr><th>Step</th><th>Kind</th><th>State</th><th>Attempts</th><th>Payload</th>"
            f"<th>Updated</th><th>Receipt, evidence or error</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
        )

    @staticmethod
    def _events(state: RunState) -> str:
        """The task's events (``run.set_event``): each key's latest value; nothing if it set none."""
        events = events_of(state)
        if not events:
            return ""
        rows = "".join(
            f'<tr><td class="mono">{e(key)}</td><td class="mono">{e(safe_text(json.dumps(value, ensure_ascii=False, sort_keys=True)[:2000]))}</td></tr>'
            for key, value in events.items()
        )
        return f"<h2>Events</h2><table><thead><tr><th>Key</th><th>Latest value</th></tr></thead><tbody>{rows}</tbody></table>"

    def _evidence(self, loaded: LoadResult, state: RunState, report: Mapping[str, Any]) -> str:
        observations = [f"[store] {item.detail}" for item in loaded.observations]
        observations += [f"[{item.source} @ {format_time(item.at)}] {item.detail}" for item in state.control_observations]
        for record in state.effects.values():
            if record.receipt:
                observations.append(f"[adapter:{record.action}] {record.key}: receipt {record.receipt}")
            if record.evidence:
                observations.append(f"[target:{record.action}] {record.key}: {record.evidence}")
        inferences = [f"{check['result']}: {check['name']}: {check['detail']}" for check in report.get("checks", [])]
        inferences.append(f"verdict: {report.get('verdict')}")
        unknowns = [f"[{item.source} @ {format_time(item.at)}] {item.detail}" for item in state.unknowns]

        def column(title: str, items: Sequence[str], css: str) -> str:
            listed = "".join(f"<li>{e(safe_text(item))}</li>" for item in items) or '<li class="muted">none</li>'
            return f'<div class="{css}"><h3>{title} ({len(items)})</h3><ul class="evidence">{listed}</ul></div>'

        return (
            '<h2>Evidence</h2><section class="card columns">'
            + column("Observations", observations, "observations")
            + column("Inferences", inferences, "inferences")
            + column("Unknowns", unknowns, "unknowns")
            + "</section>"
        )

    def _timeline(self, entries: Sequence[Mapping[str, Any]]) -> str:
        rows = []
        for entry in entries:
            at = entry.get("at")
            rows.append(
                "<tr>"
                f"<td>{e(format_time(at, precise=True) if isinstance(at, float) else '-')}</td>"
                f"<td>{e(entry.get('revision') if entry.get('revision') is not None else '-')}</td>"
                f"<td>{e(entry.get('epoch') if entry.get('epoch') is not None else '-')}</td>"
                f"<td>{e(entry.get('kind'))}{(' ' + e(safe_text(str(entry['step'])))) if entry.get('step') else ''}</td>"
                f"<td>{e(safe_text(str(entry.get('detail'))))}</td>"
                "</tr>"
            )
        return (
            "<h2>Timeline</h2><table><thead><tr><th>Time (UTC)</th><th>Rev</th><th>Epoch</th><th>What</th><th>Detail</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>"
        )

    # -- actions ------------------------------------------------------------------------------

    def act(self, task_id: str, action: str, form: Mapping[str, list[str]]) -> str:
        """Carry out a POST (the CSRF token already checked); return the notice key for the redirect."""
        if self.read_only:
            raise ConsoleError(403, f"this console is {self.read_only_reason}")

        def field(name: str) -> str:
            values = form.get(name) or [""]
            return values[0]

        out, err = io.StringIO(), io.StringIO()
        with self.lock:
            if action in ("approve", "answer"):
                step, digest = field("step"), field("payload_digest")
                if not step or not digest:
                    raise ConsoleError(400, "the form names no step or payload digest")
                answer = None
                if action == "answer":
                    text = field("answer")
                    if not text.strip():
                        raise ConsoleError(400, "the answer is empty")
                    answer = parse_answer(text)
                    if answer is None:
                        raise ConsoleError(400, "null is not an answer")
                cmd_approve(
                    self.store, task_id, step=step, approver=self.approver, ttl_s=None, assume_yes=True, out=out, err=err,
                    sign_key=self.sign_key, control_root=self.control_root, as_json=True, answer=answer, expected_digest=digest,
                )  # fmt: skip
                return "answered" if action == "answer" else "approved"
            if action == "resolve":
                outcome = field("outcome")
                if outcome not in ("applied", "absent"):
                    raise ConsoleError(400, "say whether the effect took place (applied) or not (absent)")
                evidence = field("evidence").strip()
                if not evidence:
                    raise ConsoleError(400, "the evidence is empty: say what you saw")
                step, key, digest = field("step"), field("key"), field("payload_digest")
                if not step or not key or not digest:
                    raise ConsoleError(400, "the form names no step, key or payload digest")
                cmd_resolve(
                    self.store, task_id, step, applied=outcome == "applied", evidence=safe_text(evidence)[:4096], by=self.approver,
                    result=None, key=key, payload_digest=digest, out=out, sign_key=self.sign_key, control_root=self.control_root,
                    as_json=True,
                )  # fmt: skip
                return "resolved"
            if action == "reopen":
                reason = field("reason").strip()
                if not reason:
                    raise ConsoleError(400, "say why the task goes on")
                attempts_text = field("add_attempts").strip() or "0"
                if not attempts_text.isdigit() or int(attempts_text) > 1000:
                    raise ConsoleError(400, f"more attempts {attempts_text[:20]!r} is not a whole number from 0 to 1000")
                write_reopen(
                    self.store, task_id, reason=safe_text(reason)[:4096], by=self.approver, add_attempts=int(attempts_text),
                    add_time_s=0.0, err=err, sign_key=self.sign_key, control_root=self.control_root, as_json=True,
                )  # fmt: skip
                return "reopened"
            if action == "run":
                run_recorded_once(self.store, self.label, task_id, [], err)
                return "ran"
            if action == "cancel":
                reason = field("reason").strip() or "cancelled by an operator from the console"
                cmd_cancel(
                    self.store, task_id, reason=safe_text(reason)[:4096], requested_by=self.approver, out=out, err=err,
                    sign_key=self.sign_key, control_root=self.control_root, as_json=True,
                )  # fmt: skip
                return "cancelled"
        raise ConsoleError(404, "no such action")


def _close_all(queues: list[TaskQueue]) -> None:
    while queues:
        queues.pop().close()
