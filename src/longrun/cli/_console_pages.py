"""What the local web console shows and does, apart from HTTP: its pages, its stylesheet and its actions.

``Console`` holds one store, one approver and the session's token and CSRF token; it renders the
task list and a task's page (every value read from the store HTML-escaped with ``e``) and carries
out an approve, answer or cancel form as the CLI's own commands, and "run once" (where no live
worker runs the task's function) as ``longrun resume STORE TASK`` does. ``_console`` serves it over HTTP
and holds the security around it; the module docstring there says what each page shows.

One concept, the console's pages and their forms; it is long because each page is its HTML, kept
beside the action its forms carry out, so that what a page offers and what it does read together.
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
from typing import Any, Callable, Mapping, Sequence

from ..contract import ASK_ACTION
from ..envelope import RunState
from ..errors import InvalidInputError, LongrunError
from ..events import kind_of
from ..lease import Lease
from ..outcome import TERMINAL
from ..progress import progress_of
from ..protocols import LoadResult, Store
from ..task_events import events_of
from ._common import format_time, lease_summary, relative, short_digest
from ..stores.queue import open_queue
from ._control import cmd_approve, cmd_cancel, parse_answer, payload_view
from ._filters import function_of
from ._history import timeline
from ._inspect import LS_STATUSES, list_entries, parse_since, progress_line, reported_line
from ._payload import payload_lines, safe_text
from ._resume import run_recorded_once
from ._verify import verify
from ._what_ran import failure_lines, shown_value, what_ran

__all__ = ["NOTICES", "STYLE", "Console", "ConsoleError", "e", "task_url"]

NOTICES = {
    "approved": "Approved: the approval is written; it authorizes this one effect, once. A live worker runs the task within a second.",
    "answered": "Answered: the answer is written; it is used once, for this question. A live worker runs the task within a second.",
    "cancelled": "Cancellation written: the run starts no new effect; a live worker ends it cancelled within a second.",
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
.status-queued { background: #e8ecf2; color: #3b4a5e; }
.error-text { color: #8e1b12; }
.status-cancelled, .status-limits-exhausted { background: #eadff7; color: #5a2d8a; }
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
"""


def e(value: object) -> str:
    """HTML-escape anything shown (quotes too: values also land in attributes)."""
    return html.escape(str(value), quote=True)


def task_url(task_id: str) -> str:
    return "/task/" + urllib.parse.quote(task_id, safe="")


def _status_badge(status: object) -> str:
    text = str(status)
    css = text if text in LS_STATUSES else "other"
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
    ):
        self.store = store
        self.label = label
        self.read_only = read_only or control_root is None
        self.read_only_reason = "" if not self.read_only else "read-only" if read_only else "read-only: no --control-root"
        self.approver = approver
        self.sign_key = sign_key
        self.control_root = control_root
        self.clock = clock
        self.token = secrets.token_urlsafe(32)
        self.csrf = hmac.new(self.token.encode("ascii"), b"longrun console csrf", "sha256").hexdigest()
        self.lock = threading.Lock()
        """Serializes store access: one store object serves every request thread."""

    # -- pages --------------------------------------------------------------------------------

    def layout(self, title: str, body: str) -> str:
        mode = (
            e(self.read_only_reason)
            if self.read_only
            else f"approving as {e(self.approver)} into {e(self.control_root)}" + (" (signed)" if self.sign_key else "")
        )
        return (
            "<!doctype html><html lang=en><head><meta charset=utf-8>"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{e(title)}</title>"
            '<link rel="stylesheet" href="/static/console.css"></head><body>'
            f'<header><a href="/">longrun console</a><span class="store">{e(self.label)}</span><span class="mode">{mode}</span></header>'
            f"<main>{body}</main></body></html>"
        )

    def task_list(self, query: Mapping[str, list[str]]) -> str:
        statuses = [value for value in query.get("status", []) if value in LS_STATUSES]
        function_text = (query.get("function") or [""])[0].strip()
        match_text = (query.get("match") or [""])[0].strip()
        since_text = (query.get("since") or [""])[0].strip()
        limit_text = (query.get("limit") or [""])[0].strip()
        now = self.clock()
        problems = []
        since = None
        if since_text:
            try:
                since = parse_since(since_text, now)
            except InvalidInputError as exc:
                problems.append(str(exc))
        limit = None
        if limit_text:
            if limit_text.isdigit() and int(limit_text) > 0:
                limit = int(limit_text)
            else:
                problems.append(f"limit {limit_text[:20]!r} is not a positive whole number")
        with self.lock:
            entries = list_entries(
                self.store, statuses=statuses, since=since, limit=limit,
                functions=[function_text] if function_text else [], match=[match_text] if match_text else [],
            )  # fmt: skip
        options = "".join(
            f'<option value="{e(value)}"{" selected" if value in statuses else ""}>{e(value)}</option>' for value in LS_STATUSES
        )
        body = ["<h1>Tasks</h1>"]
        body += [f'<p class="error">{e(problem)}</p>' for problem in problems]
        body.append(
            '<form class="filters" method="get" action="/">'
            f'<label>status<select name="status" multiple>{options}</select></label>'
            f'<label>function<input type="text" name="function" value="{e(function_text)}" placeholder="module:qualname, or a glob"></label>'
            f'<label>task id<input type="text" name="match" value="{e(match_text)}" placeholder="a glob: invoice-*"></label>'
            f'<label>updated since<input type="text" name="since" value="{e(since_text)}" placeholder="2h, 3d, 2026-11-30T14:00Z"></label>'
            f'<label>limit<input type="text" name="limit" value="{e(limit_text)}" placeholder="all"></label>'
            "<button>Filter</button></form>"
        )
        if not entries:
            body.append('<p class="muted">No tasks match.</p>')
            return self.layout("longrun tasks", "".join(body))
        rows = []
        for entry in entries:
            progress = entry["progress"]
            if isinstance(progress, dict):
                total = progress.get("total")
                bar = (
                    f'<progress value="{e(progress["verified"])}" max="{e(total)}"></progress> '
                    if isinstance(total, int) and total > 0
                    else ""
                )
                shown = bar + e(progress["label"])
            else:
                shown = '<span class="muted">-</span>'
            updated = entry["updated_at"]
            function = entry["function"]
            error = entry["last_error"]
            error_cell = f'<div class="error-text">{e(safe_text(str(error)))}</div>' if entry["last_run_failed"] and error else ""
            rows.append(
                "<tr>"
                f'<td class="mono"><a href="{e(task_url(str(entry["task_id"])))}">{e(entry["task_id"])}</a></td>'
                f"<td>{_status_badge(entry['status'])}{error_cell}</td>"
                f'<td class="mono">{e(safe_text(function)) if isinstance(function, str) else "-"}</td>'
                f"<td>{shown}</td>"
                f'<td>{e(entry["revision"])}</td>'
                f'<td title="{e(format_time(updated) if isinstance(updated, float) else "")}">'
                f"{e(relative(updated, now)) if isinstance(updated, float) else '-'}</td>"
                f'<td>{e(safe_text(str(entry["next_action"])))}</td>'
                "</tr>"
            )
        body.append(
            "<table><thead><tr><th>Task</th><th>Status</th><th>Function</th><th>Progress</th><th>Rev</th><th>Updated</th><th>Next action</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>"
        )
        return self.layout("longrun tasks", "".join(body))

    def task_page(self, task_id: str, query: Mapping[str, list[str]]) -> str:
        now = self.clock()
        with self.lock:
            loaded = self.store.load(task_id)  # read-only: no lease, moves nothing
            lease = self.store.read_lease(task_id)
            _, entries = timeline(self.store, task_id, now)
            report, _ = verify(self.store, task_id, now)
        state = loaded.state
        notice = NOTICES.get((query.get("notice") or [""])[0])
        body = [f'<h1 class="mono">{e(task_id)}</h1>']
        if notice:
            body.append(f'<p class="notice">{e(notice)}</p>')
        if state is None:
            body.append('<p class="muted">No revision committed yet.</p>')
            return self.layout(task_id, "".join(body))
        body.append(self._summary(state, lease, now))
        body.append(self._run_once(task_id, state))
        body.append(self._pending(task_id, state, now))
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
        if current is not None:
            facts.append(
                ("current", e(f"{kind_of(current.action)} {safe_text(current.step_id)} ({safe_text(current.action)}): "
                              f"{current.state.value}, attempt {current.attempts}, for {relative(current.updated_at, now).removesuffix(' ago')}"))
            )  # fmt: skip
        facts += self._what_ran(state, now)
        facts.append(("next action", e(safe_text(state.next_action or "(none recorded)"))))
        items = "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in facts)
        cancel = ""
        if not self.read_only and state.status not in TERMINAL:
            cancel = (
                f'<form class="inline" method="post" action="{e(task_url(state.task_id))}/cancel">'
                f'<input type="hidden" name="csrf" value="{e(self.csrf)}">'
                '<input type="text" name="reason" value="cancelled by an operator from the console" aria-label="reason">'
                '<button class="danger" name="action" value="cancel">Cancel the run</button></form>'
            )
        return f'<section class="card"><dl class="facts">{items}</dl>{cancel}</section>'

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
