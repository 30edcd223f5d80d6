"""``longrun console``: a local web console over one store, served by the standard library.

Pages (server-rendered HTML, one stylesheet and one small script, all served by the console):

- every page says when it was rendered ("updated") and reloads itself every few seconds
  (``refresh_s``; the script pauses while a form on the page is focused or being filled);
- ``/``: the summary band (tasks by status, pending approvals and questions with the oldest's
  age, failures in the last hour, queue depth and workers alive), then the task list, 50 a page,
  most recently updated first, with status (and the last error of a run that failed), function, progress, last update and
  the next action
  (the real store named, digests abbreviated); searched by task id or function (``q``) and
  filtered by status, function and ``since``; ``page`` pages.
- ``/fleet``: the workers and the queues (one per function); ``/worker/<name>``: a worker's
  heartbeat, what it runs and what it claims; ``/queue/<function>``: the queue's tasks, when each
  is due, and the workers that run it.
- ``/metrics``: the store's metrics in the Prometheus text format (``_metrics``), for a scraper:
  the token as ``?token=`` (served as asked, no cookie traded), the cookie, or an
  ``Authorization: Bearer`` header.
- ``/task/<id>``: the task's status and progress; what ran (a durable function's name, recorded
  arguments, result, parent and children, each linked) and its last error with the traceback; its pending approval requests and questions
  with the payload shown in full (``_payload``: pretty-printed, control characters escaped, long
  values elided with their size) and a form to approve or answer each one; a form to cancel the
  run, to resolve an effect in flight (it took place, or not) and to reopen a task that ended
  unfinished; its effects; its evidence in three parts, observations (what was read: the store's load
  notes, the control records the runner read with their digests, each effect's receipt and
  observed evidence), inferences (the ``verify`` checks drawn from them) and unknowns (what the
  last stop could not establish); and its timeline (``history``).

Writes are exactly the CLI's: an approval is ``cmd_approve`` with the payload digest the page
showed as ``expected_digest`` (a request that changed since is refused, nothing written), an answer
is ``cmd_approve(answer=...)``, a cancellation is ``cmd_cancel``, a resolution ``cmd_resolve``
and a reopen ``write_reopen`` (what ``longrun resolve`` and ``resume --reopen`` write); into ``--control-root`` (a strict
control area, so the console must run as the approver account), signed with ``--sign-key`` when
given. A live worker acts on each record within a second (it watches the control root); where no
live worker runs the task's function, the task's page offers "Run once", which runs the task in
the console's process as ``longrun resume STORE TASK`` does (the function's module must be
importable from the console's directory). Without ``--control-root`` the console is read-only, as
with ``--read-only``: it shows no form and refuses every POST. A page served over HTTP never writes into the store itself, where an
approval is worth no more than the agent's own writes (see the threat model in docs/security.md).

Security, for a console that can approve effects on the machine it runs on:

- It binds to 127.0.0.1 only, and refuses a request whose ``Host`` is not ``127.0.0.1:PORT`` or
  ``localhost:PORT`` (a DNS-rebinding page cannot reach it under another name).
- It prints a URL with a random token (``secrets.token_urlsafe(32)``), as Jupyter does. The first
  request with ``?token=`` sets an ``HttpOnly``, ``SameSite=Strict`` cookie and redirects to the
  same page without the token; any request with neither the token nor the cookie gets 403.
- Every state-changing request is a POST carrying a CSRF token (an HMAC of the session token)
  that must match, and an ``Origin`` header, when sent, must be the console's own.
- Every response sets a strict Content-Security-Policy (``default-src 'none'``; styles and the
  one script from the console itself, no inline script; forms may post only to it; no framing), ``X-Content-Type-Options: nosniff``,
  ``Referrer-Policy: same-origin`` (nothing leaves for another site; the browser's own POSTs keep
  their ``Origin``) and ``Cache-Control: no-store``.
- Every value read from the store (task ids, payloads, errors, evidence: an agent may have written
  any of it) is HTML-escaped; payload text has its control and reordering characters escaped too.

Not guaranteed: protection from other processes of the same user (they can read the token from
the process's output or memory, or write the control records directly), or from someone who can
reach 127.0.0.1 and read the token. It is a local tool for the approver, not a web service.

The pages, the stylesheet and the actions are ``_console_pages.Console``; this module is the HTTP
server and the security around it.
"""

from __future__ import annotations

import contextlib
import hmac
import http.server
import json
import urllib.parse
from typing import Any, Mapping, Sequence, TextIO

from ..contract import check_task_id
from ..errors import InvalidInputError, LongrunError
from ..protocols import Store
from ._common import CliError, TaskCodeError
from ._console_pages import SCRIPT, STYLE, Console, ConsoleError, e, task_url

__all__ = ["ConsoleServer", "cmd_console", "start_console"]

CSP = "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
MAX_FORM_BYTES = 256 * 1024


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "longrun-console"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        pass  # the console prints nothing per request

    # -- plumbing -----------------------------------------------------------------------------

    @property
    def console_server(self) -> "ConsoleServer":
        server = self.server  # the base class's attribute
        assert isinstance(server, ConsoleServer)
        return server

    def _send(self, status: int, body: str | bytes, *, content_type: str = "text/html; charset=utf-8", headers: Sequence[tuple[str, str]] = ()) -> None:
        data = body.encode("utf-8") if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Referrer-Policy", "same-origin")  # "no-referrer" would make the browser send Origin: null
        self.send_header("Cache-Control", "no-store")
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        console = self.console_server.console
        body = console.layout(f"{status}", f'<h1>{status}</h1><p class="error">{e(message)}</p><p><a href="/">Back to the tasks</a></p>')
        self._send(status, body)

    def _redirect(self, location: str, headers: Sequence[tuple[str, str]] = ()) -> None:
        self._send(303, "", headers=[("Location", location), *headers])

    def _host_ok(self) -> bool:
        port = self.console_server.server_address[1]
        return self.headers.get("Host", "") in (f"127.0.0.1:{port}", f"localhost:{port}")

    def _authorized(self, query: Mapping[str, list[str]]) -> tuple[bool, bool]:
        """(authorized, by the URL's token rather than the cookie)."""
        token = self.console_server.console.token
        given = (query.get("token") or [""])[0]
        if given and hmac.compare_digest(given.encode("utf-8", "replace"), token.encode("ascii")):
            return True, True
        bearer = self.headers.get("Authorization", "")
        if bearer.startswith("Bearer ") and hmac.compare_digest(bearer[len("Bearer ") :].encode("utf-8", "replace"), token.encode("ascii")):
            return True, False
        cookies = self.headers.get("Cookie", "")
        name = self.console_server.cookie_name
        for part in cookies.split(";"):
            key, _, value = part.strip().partition("=")
            if key == name and hmac.compare_digest(value.encode("utf-8", "replace"), token.encode("ascii")):
                return True, False
        return False, False

    def _gate(self) -> tuple[urllib.parse.SplitResult, dict[str, list[str]]] | None:
        """Refuse a request with a foreign Host or without the token; else the parsed URL and query."""
        if not self._host_ok():
            self._error(403, "this console answers only to 127.0.0.1 and localhost")
            return None
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        allowed, by_url = self._authorized(query)
        if not allowed:
            self._error(403, "open the URL with the token that `longrun console` printed")
            return None
        if by_url and url.path != "/metrics":  # a scraper keeps no cookie: /metrics is served as asked
            # Trade the token in the URL for a cookie, and drop it from the address bar (and history).
            rest = urllib.parse.urlencode([(k, v) for k, values in query.items() if k != "token" for v in values], doseq=True)
            cookie = f"{self.console_server.cookie_name}={self.console_server.console.token}; HttpOnly; SameSite=Strict; Path=/"
            self._redirect(url.path + ("?" + rest if rest else ""), [("Set-Cookie", cookie)])
            return None
        return url, query

    def _task_id(self, raw: str) -> str:
        try:
            return check_task_id(urllib.parse.unquote(raw))
        except InvalidInputError as exc:
            raise ConsoleError(404, str(exc)) from None

    def _name(self, raw: str) -> str:
        name = urllib.parse.unquote(raw)
        if not name or len(name) > 1024:
            raise ConsoleError(404, "no such page")
        return name

    # -- methods ------------------------------------------------------------------------------

    def do_HEAD(self) -> None:  # noqa: N802 (the base class's naming)
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802
        gated = self._gate()
        if gated is None:
            return
        url, query = gated
        console = self.console_server.console
        try:
            if url.path == "/":
                self._send(200, console.task_list(query))
            elif url.path == "/metrics":  # for a scraper: the token as ?token=, a cookie or a bearer token
                from ._metrics import CONTENT_TYPE, metrics_text

                self._send(200, metrics_text(console.store), content_type=CONTENT_TYPE)
            elif url.path == "/static/console.css":
                self._send(200, STYLE, content_type="text/css; charset=utf-8")
            elif url.path == "/static/console.js":
                self._send(200, SCRIPT, content_type="text/javascript; charset=utf-8")
            elif url.path == "/fleet":
                self._send(200, console.fleet_page())
            elif url.path.startswith("/worker/") and url.path.count("/") == 2:
                self._send(200, console.worker_page(self._name(url.path[len("/worker/") :])))
            elif url.path.startswith("/queue/") and url.path.count("/") == 2:
                self._send(200, console.queue_page(self._name(url.path[len("/queue/") :])))
            elif url.path.startswith("/task/") and url.path.count("/") == 2:
                self._send(200, console.task_page(self._task_id(url.path[len("/task/") :]), query))
            else:
                self._error(404, "no such page")
        except ConsoleError as exc:
            self._error(exc.status, str(exc))
        except (CliError, LongrunError, OSError) as exc:
            self._error(409 if isinstance(exc, CliError) else 404 if isinstance(exc, InvalidInputError) else 500, str(exc))

    def do_POST(self) -> None:  # noqa: N802
        gated = self._gate()
        if gated is None:
            return
        url, _ = gated
        console = self.console_server.console
        origin = self.headers.get("Origin")
        port = self.console_server.server_address[1]
        if origin is not None and origin not in (f"http://127.0.0.1:{port}", f"http://localhost:{port}"):
            self._error(403, "a form from another origin: refused")
            return
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_FORM_BYTES:
            self._error(400, "the form is missing its length or is too long")
            return
        if self.headers.get("Content-Type", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
            self._error(400, "not a form")
            return
        try:
            form = urllib.parse.parse_qs(self.rfile.read(length).decode("utf-8"), keep_blank_values=True, strict_parsing=False)
        except UnicodeDecodeError:
            self._error(400, "the form is not UTF-8")
            return
        given = (form.get("csrf") or [""])[0]
        if not hmac.compare_digest(given.encode("utf-8", "replace"), console.csrf.encode("ascii")):
            self._error(403, "the form's CSRF token is missing or wrong: reload the page and try again")
            return
        parts = url.path.split("/")
        try:
            if len(parts) != 4 or parts[1] != "task":
                raise ConsoleError(404, "no such action")
            task_id = self._task_id(parts[2])
            notice = console.act(task_id, parts[3], form)
        except ConsoleError as exc:
            self._error(exc.status, str(exc))
            return
        except TaskCodeError as exc:  # "run once": the task's own code raised; what was settled is committed
            self._error(500, f"{exc}: {exc.__cause__}" if exc.__cause__ is not None else str(exc))
            return
        except (CliError, LongrunError, OSError) as exc:
            self._error(409 if isinstance(exc, CliError) else 400 if isinstance(exc, InvalidInputError) else 500, str(exc))
            return
        self._redirect(f"{task_url(task_id)}?notice={notice}")


class ConsoleServer(http.server.ThreadingHTTPServer):
    """The console's HTTP server on 127.0.0.1; ``url`` carries the token."""

    daemon_threads = True

    def __init__(self, console: Console, port: int):
        self.console = console
        super().__init__(("127.0.0.1", port), _Handler)
        self.cookie_name = f"longrun_console_{self.server_address[1]}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/?token={self.console.token}"

    def server_close(self) -> None:
        super().server_close()
        self.console.close()


def start_console(
    store: Store,
    label: str,
    *,
    port: int = 0,
    read_only: bool = False,
    approver: str,
    sign_key: str | None = None,
    control_root: str | None = None,
    refresh_s: float = 5.0,
) -> ConsoleServer:
    """A console server, bound and ready; call ``serve_forever()`` (and ``shutdown()`` to stop)."""
    if sign_key is not None:
        from ..authority import load_key

        load_key(sign_key)  # a bad key file fails now, not at the first approval
    if control_root is not None:
        from ._control import open_control_root

        open_control_root(control_root)
    console = Console(
        store, label, read_only=read_only, approver=approver, sign_key=sign_key, control_root=control_root, refresh_s=refresh_s
    )
    return ConsoleServer(console, port)


def cmd_console(
    store: Store,
    label: str,
    *,
    port: int,
    read_only: bool,
    approver: str,
    sign_key: str | None,
    control_root: str | None,
    out: TextIO,
    as_json: bool = False,
) -> int:
    server = start_console(
        store, label, port=port, read_only=read_only, approver=approver, sign_key=sign_key, control_root=control_root
    )
    console = server.console
    # Ctrl-C stops the console at any moment once it is bound, the first line printed or not.
    with server, contextlib.suppress(KeyboardInterrupt):
        if as_json:  # one line, so that a program can read the URL before the server runs
            settings = {
                "url": server.url, "store": label, "read_only": console.read_only,
                "approver": None if console.read_only else approver, "control_root": control_root,
                "signed": bool(sign_key) and not console.read_only,
            }  # fmt: skip
            out.write(json.dumps(settings, sort_keys=True) + "\n")
        else:
            where = (
                console.read_only_reason if console.read_only
                else f"approvals by {approver} go to {control_root}" + (" (signed)" if sign_key else "")
            )  # fmt: skip
            out.write(f"longrun console for {label} ({where})\n  open {server.url}\n  stop with Ctrl-C\n")
        out.flush()
        server.serve_forever()
    return 0
