"""Helpers for the tests of ``longrun mcp``: a raw JSON-lines client of a server process, and a scripted
agent that follows ``longrun_next`` through the tools."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from typing import IO, Any, Callable

from .session_support import SessionCase

PROTOCOL = "2025-11-25"


class ServerGone(Exception):
    """The server's stdout ended (it exited or was killed) before it answered."""


class RawClient:
    """``longrun mcp`` in a child process, spoken to in JSON lines: what an MCP host does, by hand."""

    def __init__(self, argv: list[str], *, env: dict[str, str], cwd: str, stderr: IO[bytes] | int, new_session: bool = False):
        self.process = subprocess.Popen(
            argv, env=env, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, start_new_session=new_session
        )
        self.messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.notifications: list[dict[str, Any]] = []
        self.lines: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._next_id = 0

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            self.messages.put(json.loads(line))
        self.messages.put(None)

    def send_line(self, line: bytes) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(line)
            self.process.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise ServerGone(str(exc)) from None

    def send(self, message: dict[str, Any]) -> None:
        self.send_line(json.dumps(message).encode() + b"\n")

    def receive(self, timeout: float = 120.0) -> dict[str, Any]:
        """The next message that is not a notification (notifications are kept in ``notifications``)."""
        while True:
            try:
                message = self.messages.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError("the server did not answer") from None
            if message is None:
                self.messages.put(None)
                raise ServerGone("the server's stdout ended")
            if "id" not in message:
                self.notifications.append(message)
                continue
            return message

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self._next_id += 1
        self.send({"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params or {}})
        answer = self.receive()
        assert answer["id"] == self._next_id, answer
        return answer

    def initialize(self) -> dict[str, Any]:
        answer = self.request("initialize", {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return answer

    def call(self, name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        answer = self.request("tools/call", {"name": name, "arguments": arguments or {}})
        assert "result" in answer, answer
        result: dict[str, Any] = answer["result"]
        return result

    def close(self) -> int:
        if self.process.stdin is not None and not self.process.stdin.closed:
            try:
                self.process.stdin.close()
            except OSError:
                pass
        try:
            code = self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise
        self._reader.join(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return code


def run_work(command: list[str], cwd: str, env: dict[str, str]) -> None:
    """A checkpoint's work, done by the agent itself (what ``commands`` shows before the record)."""
    subprocess.run(command, cwd=cwd, env=env, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, timeout=60)


def follow(call: Callable[[str, dict[str, Any]], dict[str, Any]], task: str, env: dict[str, str], *, limit: int = 100) -> dict[str, Any]:
    """A scripted agent with no memory: ask ``longrun_next``, make the call it names, until it is not the agent's turn.

    ``call(name, arguments)`` returns the tool result's structured content. Returns the last advice.
    """
    for _ in range(limit):
        advice = call("longrun_next", {"task": task})
        if advice["who"] != "agent":
            return advice
        suggested = advice["tool"]
        assert suggested is not None, advice
        if suggested["name"] == "longrun_checkpoint":
            for command in advice["commands"]:
                if command[:2] != ["longrun", "checkpoint"]:
                    run_work(command, advice["cwd"], env)
        call(suggested["name"], suggested["arguments"])
    raise AssertionError("the agent never stopped")


class McpCase(SessionCase):
    """A session's world (``SessionCase``) with ``longrun mcp`` to start."""

    def server_argv(self, *extra: str) -> list[str]:
        return [sys.executable, "-m", "longrun", "mcp", self.store, "--task", "t1", *extra]

    def stderr_file(self) -> IO[bytes]:
        handle = open(self.path("server.log"), "ab")
        self.addCleanup(handle.close)
        return handle

    def server_log(self) -> str:
        path = self.path("server.log")
        if not os.path.exists(path):
            return ""
        with open(path, "rb") as handle:
            return handle.read()[-4000:].decode("utf-8", "replace")
