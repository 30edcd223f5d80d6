"""``longrun mcp STORE``: a Model Context Protocol server over stdio, for an agent that reaches its tools
through MCP rather than a shell (Level A).

The transport is MCP's stdio: JSON-RPC 2.0, one message per line, UTF-8, on stdin and stdout; nothing
else is ever written to stdout (the library's log, and a command's output as it runs, go to stderr).
The protocol is MCP's current revision, the stateless 2026-07-28, and the four handshake revisions
before it (``_mcp_revisions``). A connection's first request decides which it speaks: a request that
carries the stateless envelope (its revision in ``params._meta``) makes it a stateless connection,
where every request is checked for its envelope, ``server/discover`` is answered and change
notifications ride ``subscriptions/listen`` streams; ``initialize`` makes it a handshake connection,
answered with the client's revision when it is one of ``HANDSHAKE_VERSIONS``, else with the newest of
them, where ``resources/subscribe`` asks for notifications. What is offered is in ``_mcp_tools`` (the
session's commands as tools; their schemas in ``_mcp_catalog``) and ``_mcp_resources`` (a task's
contract, status and history as ``longrun://TASK/...`` resources, and the continuation rule as a
prompt): the same on both kinds of connection. The module is one concept, the connection, and it is
long because both kinds are served by one reading loop, one tool-call thread and one look for
changes, which the handshake's subscriptions and the listen streams share.

Guarantees:

- A line that is not JSON, or not a JSON-RPC request, is answered with a JSON-RPC error (``id`` null
  when it cannot be known) and the server goes on serving; so is an unknown method, an unknown tool or
  bad parameters. A tool that fails is a tool result with ``isError`` and the CLI's error line. A bug
  in longrun is logged with its traceback on stderr and answered as an internal error, never with the
  traceback.
- Tool calls run one at a time, in the order they came, on a thread of their own: while one runs (an
  ``exec`` may run a long command), ``ping``, listings, resource reads and subscriptions are answered.
- A subscriber (a ``resources/subscribe`` on a handshake connection, an open ``subscriptions/listen``
  on a stateless one) gets ``notifications/resources/updated`` for a task's resources when its
  revision, its status or its next action changes: what a tool call changed before that call's
  result, and otherwise within ``poll_s`` (an approval given from outside, say). A listen stream's
  acknowledgment comes before any of its notifications, and each carries the stream's id.
- At the end of stdin the server stops reading, answers the tool calls it had read (in order, as
  ever; a client that closes its end early still gets what it asked for done), closes every open
  listen stream with its result, and exits 0.

Not guaranteed: that ``notifications/cancelled`` stops a tool call that is running (an ``exec``'s
command runs to its end or its timeout, as from the shell; its answer is still sent); it ends a
listen stream, without an answer. Nothing a change notification announces is replayed: a client that
listens again reads the resources again.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import sys
import threading
from typing import IO, Any, Callable

from ..canonical import JSONValue
from ..protocols import Store
from ._mcp_resources import ResourceError, SessionResources
from ._mcp_revisions import (
    HANDSHAKE_VERSIONS,
    PROTOCOL_VERSIONS,
    SERVER_INFO,
    STATELESS_VERSIONS,
    SUBSCRIPTION_ID_KEY,
    UNSUPPORTED_PROTOCOL_VERSION,
    EnvelopeError,
    has_envelope,
    read_envelope,
    stamp_result,
)
from ._mcp_tools import SessionTools, UnknownToolError

__all__ = ["MAX_MESSAGE_BYTES", "PROTOCOL_VERSIONS", "McpServer", "cmd_mcp"]

log = logging.getLogger("longrun")

_STRUCTURED_SINCE = "2025-06-18"
"""The first revision with ``structuredContent`` and ``outputSchema``."""
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""The longest line read; a longer one is answered with an error and skipped."""
MAX_LISTENS = 64
"""The most ``subscriptions/listen`` streams open at once on one connection."""

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
RESOURCE_NOT_FOUND = -32002

INSTRUCTIONS = (
    "longrun keeps a long task's progress in a store, not in your context. Call longrun_next whenever you start and "
    "after every step: it says the one safe next action (its `tool` field is the call to make). Make every external "
    "effect through longrun_exec, which runs it exactly once; record other work with longrun_checkpoint; finish with "
    "longrun_done. When a person must act, tell them and stop. The prompt longrun_continue has the whole rule."
)


class _RequestError(Exception):
    def __init__(self, code: int, message: str, data: dict[str, JSONValue] | None = None):
        super().__init__(message)
        self.code = code
        self.data = data


class McpServer:
    """Serve ``tools`` (and their store's resources and prompt) on ``reader`` / ``writer`` (binary streams, one
    JSON-RPC message a line) until the end of ``reader``."""

    def __init__(self, tools: SessionTools, reader: IO[bytes], writer: IO[bytes], *, poll_s: float = 1.0):
        self.tools = tools
        self.resources = SessionResources(tools)
        self._reader = reader
        self._writer = writer
        self._poll_s = poll_s
        self._write_lock = threading.Lock()
        self._closed = False
        self._version = HANDSHAKE_VERSIONS[0]
        self._stateless: bool | None = None  # which kind of revision the connection speaks; None until it is known
        self._calls: queue.Queue[tuple[JSONValue, dict[str, Any], bool] | None] = queue.Queue()
        self._stopping = threading.Event()
        self._subscriptions: set[str] = set()
        self._listens: dict[str | int, frozenset[str]] = {}
        self._subscription_lock = threading.Lock()
        self._seen: dict[str, str] = {}
        self._wake = threading.Event()
        self._check_lock = threading.Lock()

    # -- writing --------------------------------------------------------------------------------

    def _send(self, message: dict[str, JSONValue]) -> None:
        data = (json.dumps(message, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
        with self._write_lock:
            if self._closed:
                return
            try:
                self._writer.write(data)
                self._writer.flush()
            except (BrokenPipeError, ValueError, OSError) as exc:
                log.warning("mcp: the client's end of stdout is gone (%s): nothing more is sent", exc)
                self._closed = True

    def _result(self, request_id: JSONValue, result: dict[str, JSONValue]) -> None:
        self._send({"jsonrpc": "2.0", "id": request_id, "result": result})

    def _error(self, request_id: JSONValue, code: int, message: str, data: dict[str, JSONValue] | None = None) -> None:
        error: dict[str, JSONValue] = {"code": code, "message": message}
        if data is not None:
            error["data"] = data
        self._send({"jsonrpc": "2.0", "id": request_id, "error": error})

    # -- serving --------------------------------------------------------------------------------

    def serve(self) -> int:
        """Serve until the end of the input; return the exit code (0)."""
        worker = threading.Thread(target=self._run_calls, name="longrun-mcp-tools", daemon=True)
        poller = threading.Thread(target=self._watch, name="longrun-mcp-subscriptions", daemon=True)
        worker.start()
        poller.start()
        try:
            while True:
                line = self._reader.readline(MAX_MESSAGE_BYTES + 1)
                if not line:
                    break
                if len(line) > MAX_MESSAGE_BYTES and not line.endswith(b"\n"):
                    self._skip_rest_of_line()
                    self._error(None, INVALID_REQUEST, f"the message is longer than {MAX_MESSAGE_BYTES} bytes")
                    continue
                if line.strip():
                    try:
                        self._handle_line(line)
                    except Exception:  # a bug must not end the session: answered, logged, and serving goes on
                        log.exception("mcp: internal error on a message (a bug in longrun, please report it)")
                        self._error(None, INTERNAL_ERROR, "internal error (a bug in longrun; its traceback is in the server's log)")
        finally:
            self._calls.put(None)
            worker.join()
            self._stopping.set()
            self._wake.set()
            poller.join()
            self._close_listens()
        return 0

    def _skip_rest_of_line(self) -> None:
        while True:
            chunk = self._reader.readline(MAX_MESSAGE_BYTES)
            if not chunk or chunk.endswith(b"\n"):
                return

    def _handle_line(self, line: bytes) -> None:
        try:
            message = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            self._error(None, PARSE_ERROR, f"parse error: the line is not JSON ({exc})")
            return
        except RecursionError:
            self._error(None, PARSE_ERROR, "parse error: the line nests JSON deeper than can be read")
            return
        if isinstance(message, list):
            self._error(None, INVALID_REQUEST, "invalid request: batches are not supported; send one message a line")
            return
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            self._error(_id_of(message), INVALID_REQUEST, 'invalid request: not a JSON-RPC 2.0 message (it needs "jsonrpc": "2.0")')
            return
        method = message.get("method")
        if method is None and ("result" in message or "error" in message):
            return  # an answer to a request this server never sends
        has_id = "id" in message
        request_id = message.get("id")
        if has_id and (isinstance(request_id, bool) or not isinstance(request_id, (str, int))):
            self._error(None, INVALID_REQUEST, "invalid request: the id must be a string or an integer")
            return
        if not isinstance(method, str):
            self._error(request_id if has_id else None, INVALID_REQUEST, "invalid request: the method must be a string")
            return
        params = message.get("params", {})
        if params is None:
            params = {}
        if not isinstance(params, dict):
            if has_id:
                self._error(request_id, INVALID_PARAMS, "invalid params: params must be an object")
            return
        if not has_id:
            if method == "notifications/cancelled":
                self._cancel_listen(params.get("requestId"))
            return  # other notifications (initialized, roots changed) need nothing
        assert isinstance(request_id, (str, int))
        opens_stateless = self._stateless is None and method == "server/discover"  # told what its envelope lacks
        if method != "initialize" and (self._stateless or has_envelope(params) or opens_stateless):
            self._stateless_request(request_id, method, params)
            return
        if method == "tools/call":
            self._calls.put((request_id, params, False))
            return
        self._answer(request_id, method, params, self._handlers())

    def _stateless_request(self, request_id: str | int, method: str, params: dict[str, Any]) -> None:
        """A request on a stateless connection, or one that opens it: its envelope checked, then served."""
        if self._stateless is False:
            self._error(
                request_id,
                INVALID_REQUEST,
                f"invalid request: this connection negotiated {self._version} with initialize; "
                "a request carrying the stateless envelope (params._meta) is not accepted on it",
            )
            return
        try:
            read_envelope(params)
        except EnvelopeError as exc:
            self._error(request_id, exc.code, str(exc), exc.data)
            return
        self._stateless = True
        if method == "tools/call":
            self._calls.put((request_id, params, True))
        elif method == "subscriptions/listen":
            try:
                self._listen(request_id, params)
            except _RequestError as exc:
                self._error(request_id, exc.code, str(exc), exc.data)
            except Exception:
                log.exception("mcp: internal error in subscriptions/listen (a bug in longrun, please report it)")
                self._error(request_id, INTERNAL_ERROR, "internal error in subscriptions/listen (a bug in longrun; its traceback is in the server's log)")
        else:
            self._answer(request_id, method, params, self._stateless_handlers())

    def _answer(
        self, request_id: JSONValue, method: str, params: dict[str, Any], handlers: dict[str, Callable[[dict[str, Any]], dict[str, JSONValue]]]
    ) -> None:
        handler = handlers.get(method)
        if handler is None:
            revision = f"the {STATELESS_VERSIONS[0]} revision" if self._stateless else "the handshake revisions"
            self._error(request_id, METHOD_NOT_FOUND, f"method not found: {method[:100]} (in {revision})")
            return
        try:
            result = handler(params)
            self._result(request_id, stamp_result(method, result) if self._stateless else result)
        except _RequestError as exc:
            self._error(request_id, exc.code, str(exc), exc.data)
        except ResourceError as exc:
            self._error(request_id, RESOURCE_NOT_FOUND if method == "resources/read" else INVALID_PARAMS, str(exc))
        except Exception:
            log.exception("mcp: internal error in %s (a bug in longrun, please report it)", method)
            self._error(request_id, INTERNAL_ERROR, f"internal error in {method} (a bug in longrun; its traceback is in the server's log)")

    def _handlers(self) -> dict[str, Callable[[dict[str, Any]], dict[str, JSONValue]]]:
        return {
            "initialize": self._initialize,
            "ping": lambda params: {},
            "tools/list": lambda params: {"tools": self.tools.tool_list(structured=self._structured())},
            "resources/list": lambda params: {"resources": self.resources.resource_list()},
            "resources/templates/list": lambda params: {"resourceTemplates": self.resources.resource_templates()},
            "resources/read": self._read,
            "resources/subscribe": self._subscribe,
            "resources/unsubscribe": self._unsubscribe,
            "prompts/list": lambda params: {"prompts": self.resources.prompt_list()},
            "prompts/get": lambda params: self.resources.get_prompt(params.get("name"), params.get("arguments")),
        }

    def _stateless_handlers(self) -> dict[str, Callable[[dict[str, Any]], dict[str, JSONValue]]]:
        """The 2026-07-28 methods answered at once (``tools/call`` and ``subscriptions/listen`` are served apart):
        ``initialize``, ``ping`` and ``resources/(un)subscribe`` are not in that revision."""
        handlers = self._handlers()
        for removed in ("initialize", "ping", "resources/subscribe", "resources/unsubscribe"):
            del handlers[removed]
        handlers["server/discover"] = self._discover
        handlers["tools/list"] = lambda params: {"tools": self.tools.tool_list(structured=True)}
        return handlers

    def _structured(self) -> bool:
        return HANDSHAKE_VERSIONS.index(self._version) <= HANDSHAKE_VERSIONS.index(_STRUCTURED_SINCE)

    def _capabilities(self) -> dict[str, JSONValue]:
        return {
            "tools": {"listChanged": False},
            "resources": {"subscribe": True, "listChanged": False},
            "prompts": {"listChanged": False},
        }

    def _initialize(self, params: dict[str, Any]) -> dict[str, JSONValue]:
        requested = params.get("protocolVersion")
        if self._stateless:
            raise _RequestError(
                UNSUPPORTED_PROTOCOL_VERSION,
                f"this connection speaks the stateless revision {STATELESS_VERSIONS[0]}, which has no initialize",
                {"supported": list(STATELESS_VERSIONS), "requested": requested if isinstance(requested, str) else None},
            )
        if not isinstance(requested, str):
            raise _RequestError(INVALID_PARAMS, "invalid params: initialize needs protocolVersion (a string)")
        self._version = requested if requested in HANDSHAKE_VERSIONS else HANDSHAKE_VERSIONS[0]
        self._stateless = False
        return {
            "protocolVersion": self._version,
            "capabilities": self._capabilities(),
            "serverInfo": dict(SERVER_INFO),
            "instructions": INSTRUCTIONS,
        }

    def _discover(self, params: dict[str, Any]) -> dict[str, JSONValue]:
        return {"supportedVersions": list(STATELESS_VERSIONS), "capabilities": self._capabilities(), "instructions": INSTRUCTIONS}

    def _read(self, params: dict[str, Any]) -> dict[str, JSONValue]:
        uri = params.get("uri")
        if not isinstance(uri, str):
            raise _RequestError(INVALID_PARAMS, "invalid params: resources/read needs a uri (a string)")
        return {"contents": [self.resources.read_resource(uri)]}

    def _subscribe(self, params: dict[str, Any]) -> dict[str, JSONValue]:
        uri = params.get("uri")
        task, _ = self.resources.parse_uri(uri)
        assert isinstance(uri, str)
        fingerprint = self.tools.fingerprint(task)
        with self._subscription_lock:
            self._subscriptions.add(uri)
            self._seen.setdefault(task, fingerprint)
        return {}

    def _unsubscribe(self, params: dict[str, Any]) -> dict[str, JSONValue]:
        uri = params.get("uri")
        self.resources.parse_uri(uri)
        with self._subscription_lock:
            self._subscriptions.discard(str(uri))
        return {}

    # -- tool calls, one at a time --------------------------------------------------------------

    def _run_calls(self) -> None:
        while True:
            item = self._calls.get()
            if item is None:
                return
            request_id, params, stateless = item
            name = params.get("name")
            if not isinstance(name, str):
                self._error(request_id, INVALID_PARAMS, "invalid params: tools/call needs the tool's name (a string)")
                continue
            try:
                result = self.tools.call(name, params.get("arguments"))
            except UnknownToolError as exc:
                self._error(request_id, INVALID_PARAMS, str(exc))
                continue
            except Exception:
                log.exception("mcp: internal error in tool %s (a bug in longrun, please report it)", name)
                self._error(request_id, INTERNAL_ERROR, f"internal error in {name[:100]} (a bug in longrun; its traceback is in the server's log)")
                continue
            self._notify_changes()  # what this call changed is announced before its result
            if stateless:
                self._result(request_id, stamp_result("tools/call", result.to_json(structured=True)))
            else:
                self._result(request_id, result.to_json(structured=self._structured()))

    # -- subscriptions --------------------------------------------------------------------------

    def _listen(self, request_id: str | int, params: dict[str, Any]) -> None:
        """Open a ``subscriptions/listen`` stream: acknowledge what it will carry (a task's resource URIs; the
        lists never change, so no list-changed notification is honored), then announce changes on it."""
        wanted = params.get("notifications")
        if not isinstance(wanted, dict):
            raise _RequestError(INVALID_PARAMS, "invalid params: subscriptions/listen needs notifications (an object)")
        uris = wanted.get("resourceSubscriptions", [])
        if uris is None:
            uris = []
        if not isinstance(uris, list) or not all(isinstance(uri, str) for uri in uris):
            raise _RequestError(INVALID_PARAMS, "invalid params: notifications.resourceSubscriptions must be an array of URIs")
        if len(uris) > 200:
            raise _RequestError(INVALID_PARAMS, "invalid params: notifications.resourceSubscriptions names more than 200 URIs")
        try:
            tasks = {self.resources.parse_uri(uri)[0] for uri in uris}
        except ResourceError as exc:
            raise _RequestError(INVALID_PARAMS, str(exc)) from exc
        honored: dict[str, JSONValue] = {"resourceSubscriptions": list(dict.fromkeys(uris))} if uris else {}
        fingerprints = {task: self.tools.fingerprint(task) for task in sorted(tasks)}
        with self._check_lock:  # the acknowledgment goes out before any change is announced on the stream
            with self._subscription_lock:
                if request_id in self._listens:
                    raise _RequestError(INVALID_REQUEST, f"invalid request: a subscriptions/listen with id {request_id!r} is open")
                if len(self._listens) >= MAX_LISTENS:
                    raise _RequestError(INVALID_REQUEST, f"invalid request: {MAX_LISTENS} subscriptions/listen streams are open; end one first")
                self._listens[request_id] = frozenset(uris)
                for task, fingerprint in fingerprints.items():
                    self._seen.setdefault(task, fingerprint)
            self._send(
                {
                    "jsonrpc": "2.0",
                    "method": "notifications/subscriptions/acknowledged",
                    "params": {"notifications": honored, "_meta": {SUBSCRIPTION_ID_KEY: request_id}},
                }
            )

    def _cancel_listen(self, request_id: object) -> None:
        """A client's ``notifications/cancelled`` for a listen stream ends it; no answer is sent (the cancelled
        request's answer is what a client stops waiting for). For any other request it changes nothing."""
        if isinstance(request_id, (str, int)) and not isinstance(request_id, bool):
            with self._subscription_lock:
                self._listens.pop(request_id, None)

    def _close_listens(self) -> None:
        """End every open listen stream gracefully, with its result, when the server stops serving."""
        with self._subscription_lock:
            listens = sorted(self._listens, key=str)
            self._listens.clear()
        for request_id in listens:
            self._result(request_id, stamp_result("subscriptions/listen", {"_meta": {SUBSCRIPTION_ID_KEY: request_id}}))

    def _watch(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self._poll_s)
            self._wake.clear()
            if self._stopping.is_set():
                return
            self._notify_changes()

    def _notify_changes(self) -> None:
        """Tell the subscribers of each task whose revision, status or next action changed since it was last looked at."""
        with self._check_lock:  # one look at a time: a change is announced once
            with self._subscription_lock:
                uris = set(self._subscriptions).union(*self._listens.values())
            for task in sorted({self.resources.parse_uri(uri)[0] for uri in uris}):
                fingerprint = self.tools.fingerprint(task)
                with self._subscription_lock:
                    changed = self._seen.get(task) != fingerprint
                    self._seen[task] = fingerprint
                    targets = [uri for uri in sorted(self._subscriptions) if self.resources.parse_uri(uri)[0] == task]
                    streams = [
                        (request_id, uri)
                        for request_id, listened in sorted(self._listens.items(), key=lambda item: str(item[0]))
                        for uri in sorted(listened)
                        if self.resources.parse_uri(uri)[0] == task
                    ]
                if changed:
                    for uri in targets:
                        self._send({"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": uri}})
                    for request_id, uri in streams:
                        params: dict[str, JSONValue] = {"uri": uri, "_meta": {SUBSCRIPTION_ID_KEY: request_id}}
                        self._send({"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": params})


def _id_of(message: object) -> JSONValue:
    if isinstance(message, dict):
        value = message.get("id")
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            return value
    return None


def cmd_mcp(store: Store, spec: str, *, task: str | None, control_root: str | None) -> int:
    """``longrun mcp``: serve on this process's stdin and stdout until stdin ends.

    The protocol keeps the real stdout to itself: file descriptor 1 is pointed at stderr for as long
    as the server runs, so that nothing else (a stray print, a child that inherited it) can put a
    line into the stream.
    """

    def echo(chunk: bytes) -> None:
        sys.stderr.flush()
        sys.stderr.buffer.write(chunk)
        sys.stderr.buffer.flush()

    tools = SessionTools(store, spec, task=task, control_root=control_root, echo=echo)
    sys.stdout.flush()
    saved_fd = os.dup(1)
    protocol_fd = os.dup(1)
    saved_stdout = sys.stdout
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        with os.fdopen(protocol_fd, "wb", buffering=0) as writer:
            return McpServer(tools, sys.stdin.buffer, writer).serve()
    finally:
        sys.stdout = saved_stdout
        os.dup2(saved_fd, 1)
        os.close(saved_fd)
