"""``longrun mcp``'s protocol, spoken in raw JSON lines to a real server process.

Malformed input of every kind gets a JSON-RPC error and the server keeps serving; the version is
negotiated; ``ping`` is answered while a command runs; stdout carries nothing but protocol messages;
an agent cannot approve through the server, and with ``--control-root`` an approval written where the
agent can write is not one.
"""

from __future__ import annotations

import json
import os
import sys
import time
import unittest
from typing import Any

from helpers.mcp_support import PROTOCOL, McpCase, RawClient, ServerGone, follow


class ProtocolTests(McpCase):
    def start(self, *extra: str, create: bool = True) -> RawClient:
        argv = self.server_argv(*(("--create-store",) if create else ()), *extra)
        client = RawClient(argv, env=self.env(), cwd=self.work, stderr=self.stderr_file())
        self.addCleanup(client.close)
        return client

    def test_malformed_requests_get_json_rpc_errors_and_the_server_keeps_serving(self) -> None:
        client = self.start()
        client.initialize()
        cases: list[tuple[bytes, int | None, Any]] = [
            (b"this is not json\n", -32700, None),
            (b"\xff\xfe{}\n", -32700, None),
            (b'{"jsonrpc": "2.0", "id": 1, "method": "ping"\n', -32700, None),
            (b"[]\n", -32600, None),
            (b'[{"jsonrpc": "2.0", "id": 2, "method": "ping"}]\n', -32600, None),
            (b'"a string"\n', -32600, None),
            (b"[" * 100_000 + b"]" * 100_000 + b"\n", -32700, None),
            (b'{"jsonrpc": "2.0", "id": 20, "method": "tools/call", "params": {"name": "longrun_exec", "arguments": {"step": "a", "timeout_s": 1' + b"0" * 400 + b'}}}\n', None, 20),
            (b'{"id": 3, "method": "ping"}\n', -32600, 3),
            (b'{"jsonrpc": "1.0", "id": 4, "method": "ping"}\n', -32600, 4),
            (b'{"jsonrpc": "2.0", "id": 5}\n', -32600, 5),
            (b'{"jsonrpc": "2.0", "id": 6, "method": 7}\n', -32600, 6),
            (b'{"jsonrpc": "2.0", "id": {"no": 1}, "method": "ping"}\n', -32600, None),
            (b'{"jsonrpc": "2.0", "id": true, "method": "ping"}\n', -32600, None),
            (b'{"jsonrpc": "2.0", "id": 8, "method": "no/such/method"}\n', -32601, 8),
            (b'{"jsonrpc": "2.0", "id": 9, "method": "server/discover", "params": {}}\n', -32601, 9),
            (b'{"jsonrpc": "2.0", "id": 10, "method": "tools/call", "params": []}\n', -32602, 10),
            (b'{"jsonrpc": "2.0", "id": 11, "method": "tools/call", "params": {"name": "rm_rf"}}\n', -32602, 11),
            (b'{"jsonrpc": "2.0", "id": 12, "method": "tools/call", "params": {"arguments": {}}}\n', -32602, 12),
            (b'{"jsonrpc": "2.0", "id": 13, "method": "resources/read", "params": {"uri": "file:///etc/passwd"}}\n', -32002, 13),
            (b'{"jsonrpc": "2.0", "id": 14, "method": "resources/read", "params": {"uri": "longrun://../status"}}\n', -32002, 14),
            (b'{"jsonrpc": "2.0", "id": 15, "method": "resources/read", "params": {"uri": "longrun://other/status"}}\n', -32002, 15),
            (b'{"jsonrpc": "2.0", "id": 16, "method": "resources/read", "params": {}}\n', -32602, 16),
            (b'{"jsonrpc": "2.0", "id": 17, "method": "resources/subscribe", "params": {"uri": "longrun://t1/secrets"}}\n', -32602, 17),
            (b'{"jsonrpc": "2.0", "id": 18, "method": "prompts/get", "params": {"name": "other"}}\n', -32602, 18),
            (b'{"jsonrpc": "2.0", "id": 19, "method": "initialize", "params": {}}\n', -32602, 19),
        ]
        for line, code, request_id in cases:
            with self.subTest(line=line[:100]):
                client.send_line(line)
                answer = client.receive()
                if code is None:  # a tool error, not a JSON-RPC one
                    self.assertTrue(answer["result"]["isError"], answer)
                    self.assertIn("longrun exec: error: argument timeout_s: ", answer["result"]["content"][0]["text"])
                else:
                    self.assertEqual((answer["id"], answer["error"]["code"]), (request_id, code), answer)
                    self.assertNotIn("Traceback", answer["error"]["message"])
                self.assertEqual(client.request("ping")["result"], {}, "still serving")
        client.send_line(b"\n   \n")  # blank lines are skipped
        client.send({"jsonrpc": "2.0", "method": "notifications/whatever", "params": {"x": 1}})  # a notification: no answer
        client.send({"jsonrpc": "2.0", "id": 99, "result": {}})  # a response to nothing: no answer
        self.assertEqual(client.request("ping")["id"], client._next_id)
        self.assertEqual(client.close(), 0)
        self.assertEqual(client.notifications, [])

    def test_a_line_longer_than_the_limit_is_refused_and_skipped(self) -> None:
        from longrun.cli._mcp import MAX_MESSAGE_BYTES

        client = self.start()
        client.initialize()
        client.send_line(b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": "' + b"y" * (MAX_MESSAGE_BYTES + 10) + b'"}}\n')
        answer = client.receive()
        self.assertEqual((answer["id"], answer["error"]["code"]), (None, -32600))
        self.assertIn("longer than", answer["error"]["message"])
        self.assertEqual(client.request("ping")["result"], {})

    def test_the_version_is_negotiated_and_capabilities_declared(self) -> None:
        for requested, answered in (("2025-11-25", "2025-11-25"), ("2025-06-18", "2025-06-18"), ("2024-11-05", "2024-11-05"),
                                    ("2026-07-28", PROTOCOL), ("1999-01-01", PROTOCOL)):  # fmt: skip
            with self.subTest(requested=requested):
                client = self.start()
                answer = client.request("initialize", {"protocolVersion": requested, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}})
                result = answer["result"]
                self.assertEqual(result["protocolVersion"], answered)
                self.assertEqual(result["serverInfo"]["name"], "longrun")
                self.assertEqual(result["capabilities"]["resources"], {"subscribe": True, "listChanged": False})
                self.assertIn("tools", result["capabilities"])
                self.assertIn("prompts", result["capabilities"])
                tools = client.request("tools/list")["result"]["tools"]
                structured = answered >= "2025-06-18"
                self.assertEqual(all("outputSchema" in tool for tool in tools), structured)
                next_ = client.call("longrun_next")
                self.assertEqual("structuredContent" in next_, structured)
                self.assertTrue(next_["isError"])
                self.assertEqual(client.close(), 0)

    def test_every_tool_has_an_input_schema_that_refuses_what_it_does_not_know(self) -> None:
        client = self.start()
        client.initialize()
        tools = client.request("tools/list")["result"]["tools"]
        self.assertEqual(len(tools), 7)
        for tool in tools:
            schema = tool["inputSchema"]
            self.assertEqual((schema["type"], schema["additionalProperties"]), ("object", False), tool["name"])
            self.assertIn("task", schema["properties"])
            self.assertNotIn("task", schema["required"], "the server is pinned to t1")
        wrong = [
            ("longrun_exec", {}, "longrun exec: error: the following arguments are required: step"),
            ("longrun_exec", {"step": "a", "shell": True}, "longrun exec: error: unrecognized arguments: shell"),
            ("longrun_exec", {"step": "a", "argv": "echo hi"}, "longrun exec: error: argument argv: must be an array of text"),
            ("longrun_exec", {"step": "a", "timeout_s": -1}, "longrun exec: error: argument timeout_s: '-1.0' must be a positive number of seconds"),
            ("longrun_exec", {"step": "../x"}, "longrun exec: error: argument STEP: "),
            ("longrun_checkpoint", {"step": "notes"}, "longrun checkpoint: error: give exactly one of: evidence_file, note"),
            ("longrun_checkpoint", {"step": "notes", "note": "x", "evidence_file": "y"}, "longrun checkpoint: error: give exactly one of"),
            ("longrun_stop", {"reason": "   "}, "longrun stop: error: argument reason: must not be empty"),
            ("longrun_init", {}, "longrun init: error: give exactly one of: contract, contract_path"),
            ("longrun_next", {"task": "t1/../x"}, "longrun next: error: this server serves task 't1' only"),
            ("longrun_answer", {"step": "decision-1", "value": "yes"}, "longrun answer: error: refused: an agent cannot answer its own stops"),
            ("longrun_cancel", {}, "longrun cancel: error: refused: an agent cannot cancel or resolve its own task"),
        ]
        for name, arguments, words in wrong:
            with self.subTest(name=name, arguments=arguments):
                result = client.call(name, arguments)
                self.assertTrue(result["isError"], result)
                self.assertTrue(result["content"][0]["text"].startswith(words), result["content"][0]["text"])
                self.assertEqual(result["structuredContent"]["exit_code"], 2)
        client.send({"jsonrpc": "2.0", "id": 500, "method": "tools/call", "params": {"name": "longrun_exec", "arguments": [1]}})
        self.assertTrue(client.receive()["result"]["isError"])

    def test_ping_is_answered_while_a_command_runs_and_stdout_holds_only_protocol_messages(self) -> None:
        self.contract_text = self.contract_text.replace(
            'command = "echo a >> target.txt"',
            'command = "echo printed-by-the-command; echo to-stderr >&2; touch started; while [ ! -f go ]; do sleep 0.01; done; echo a >> target.txt"',
        )
        self.write("run-contract.toml", self.contract_text)
        client = self.start()
        client.initialize()
        self.assertFalse(client.call("longrun_init", {"contract_path": self.contract})["isError"])
        self.write("notes.txt", "plan\n")
        self.assertFalse(client.call("longrun_checkpoint", {"step": "notes", "evidence_file": "notes.txt"})["isError"])
        self.addCleanup(self.write, "go", "")  # a failing test must not leave the command waiting
        client.send({"jsonrpc": "2.0", "id": 1000, "method": "tools/call", "params": {"name": "longrun_exec", "arguments": {"step": "append-a"}}})
        for _ in range(6000):  # the bound only keeps a broken test from hanging
            if os.path.exists(os.path.join(self.work, "started")):
                break
            time.sleep(0.01)
        for request_id in (1001, 1002):  # the command waits for "go": these are answered first
            client.send({"jsonrpc": "2.0", "id": request_id, "method": "ping"})
            self.assertEqual(client.receive(), {"jsonrpc": "2.0", "id": request_id, "result": {}})
        status = client.request("resources/read", {"uri": "longrun://t1/status"})["result"]["contents"][0]
        effects = {record["step_id"]: record for record in json.loads(status["text"])["effects"]}
        self.assertEqual(effects["append-a"]["state"], "started", "the intent is durable while it runs")
        self.write("go", "")
        answer = client.receive()
        self.assertEqual(answer["id"], 1000)
        result = answer["result"]
        self.assertFalse(result["isError"], result)
        self.assertEqual(result["structuredContent"]["record"]["state"], "verified")
        self.assertIn("printed-by-the-command", result["structuredContent"]["output"])
        self.assertIn("to-stderr", result["structuredContent"]["output"])
        self.assertEqual(self.lines(), ["a"])
        self.assertEqual(client.close(), 0)
        for line in client.lines:  # every line on stdout is a JSON-RPC message
            self.assertEqual(json.loads(line)["jsonrpc"], "2.0")
        self.assertIn("printed-by-the-command", self.server_log(), "the command's output went to stderr")

    def test_next_names_the_call_to_make_and_what_the_contract_leaves_to_the_agent(self) -> None:
        self.contract_text = self.contract_text.replace('command = "echo a >> target.txt"\n', "", 1).replace('path = "notes.txt"\n', "", 1)
        self.write("run-contract.toml", self.contract_text)
        client = self.start()
        client.initialize()
        client.call("longrun_init", {"contract_path": self.contract})
        first = client.call("longrun_next")["structuredContent"]["tool"]
        self.assertEqual(first, {"name": "longrun_checkpoint", "arguments": {"task": "t1", "step": "notes"}, "missing": ["evidence_file"]})
        without = client.call("longrun_checkpoint", first["arguments"])
        self.assertEqual(without["content"][0]["text"], "longrun checkpoint: error: give exactly one of: evidence_file, note")
        self.write("notes.txt", "plan\n")
        self.assertFalse(client.call("longrun_checkpoint", {"step": "notes", "evidence_file": "notes.txt"})["isError"])
        second = client.call("longrun_next")["structuredContent"]["tool"]
        self.assertEqual(second, {"name": "longrun_exec", "arguments": {"task": "t1", "step": "append-a"}, "missing": ["argv"]})
        refused = client.call("longrun_exec", second["arguments"])
        self.assertTrue(refused["content"][0]["text"].startswith("longrun exec: error: step 'append-a' needs its command: "))
        ran = client.call("longrun_exec", {**second["arguments"], "argv": ["sh", "-c", "echo a >> target.txt"]})
        self.assertEqual(ran["structuredContent"]["record"]["state"], "verified")
        third = client.call("longrun_next")["structuredContent"]["tool"]
        self.assertEqual(third["name"], "longrun_checkpoint")
        self.assertEqual(third["arguments"]["step"], "check-a")
        self.assertIn("note", third["arguments"])
        self.assertEqual(self.lines(), ["a"])

    def test_at_the_end_of_stdin_the_calls_read_are_answered_and_the_server_exits_0(self) -> None:
        client = self.start()
        client.initialize()
        client.send({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "longrun_init", "arguments": {"contract_path": self.contract}}})
        client.send({"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": "longrun_next", "arguments": {}}})
        assert client.process.stdin is not None
        client.process.stdin.close()
        self.assertEqual([client.receive()["id"], client.receive()["id"]], [7, 8])
        self.assertEqual(client.close(), 0)
        self.assertEqual(self.next(code=0)["step"], "notes")

    def test_a_server_for_a_store_that_does_not_exist_exits_2_before_serving(self) -> None:
        client = self.start(create=False)
        self.assertEqual(client.close(), 2)
        self.assertEqual(client.lines, [])
        self.assertIn("longrun mcp: error: store directory", self.server_log())
        client = self.start("--control-root", self.path("no-such-area"))
        self.assertEqual(client.close(), 2)
        self.assertIn("longrun mcp: error: control root", self.server_log())

    def test_a_sqlite_store_serves_the_same_contract(self) -> None:
        spec = "sqlite:" + self.path("runs.db")
        client = RawClient([sys.executable, "-m", "longrun", "mcp", spec, "--task", "t1", "--create-store"], env=self.env(),
                           cwd=self.work, stderr=self.stderr_file())  # fmt: skip
        self.addCleanup(client.close)
        client.initialize()
        self.assertFalse(client.call("longrun_init", {"contract_path": self.contract})["isError"])
        client.request("resources/subscribe", {"uri": "longrun://t1/history"})  # its poller reads while the tools write

        def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
            result = client.call(name, arguments)
            self.assertFalse(result["isError"], result)
            structured: dict[str, Any] = result["structuredContent"]
            return structured

        self.assertEqual(follow(call, "t1", self.env())["step"], "append-b")
        self.cli_json("approve", spec, "t1", "--step", "append-b", "--yes")
        self.assertEqual(follow(call, "t1", self.env())["kind"], "finished")
        self.assertEqual(self.lines(), ["a", "b"])
        self.assertEqual(client.close(), 0)

    def test_an_agent_follows_next_through_the_tools_and_the_resources_and_prompt_say_the_same(self) -> None:
        client = self.start()
        client.initialize()
        client.request("resources/subscribe", {"uri": "longrun://t1/status"})  # before the task exists
        client.call("longrun_init", {"contract_path": self.contract})
        updated = {"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": "longrun://t1/status"}}
        self.assertEqual(client.notifications, [updated], "what a call changed is announced before its result")
        client.call("longrun_next")
        self.assertEqual(len(client.notifications), 1, "a read changes nothing")

        def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
            result = client.call(name, arguments)
            self.assertFalse(result["isError"], result)
            structured: dict[str, Any] = result["structuredContent"]
            return structured

        waiting = follow(call, "t1", self.env())
        self.assertEqual((waiting["who"], waiting["step"]), ("operator", "append-b"))
        self.assertGreater(len(client.notifications), 2)
        self.cli_json("approve", self.store, "t1", "--step", "append-b", "--yes")
        self.assertEqual(follow(call, "t1", self.env())["kind"], "finished")
        self.assertEqual(self.lines(), ["a", "b"])
        prompt = client.request("prompts/get", {"name": "longrun_continue", "arguments": {"task": "t1"}})["result"]
        self.assertIn("Your task is t1", prompt["messages"][0]["content"]["text"])
        templates = client.request("resources/templates/list")["result"]["resourceTemplates"]
        self.assertEqual({item["uriTemplate"] for item in templates}, {"longrun://{task}/contract", "longrun://{task}/status", "longrun://{task}/history"})

    def test_a_server_for_the_whole_store_needs_the_task_and_lists_only_sessions(self) -> None:
        client = RawClient([sys.executable, "-m", "longrun", "mcp", self.store, "--create-store"], env=self.env(), cwd=self.work,
                           stderr=self.stderr_file())  # fmt: skip
        self.addCleanup(client.close)
        client.initialize()
        tools = client.request("tools/list")["result"]["tools"]
        self.assertTrue(all(tool["inputSchema"]["required"][:1] == ["task"] for tool in tools))
        missing = client.call("longrun_next")
        self.assertEqual(missing["content"][0]["text"], "longrun next: error: the following arguments are required: task")
        for task in ("one", "two"):
            self.assertFalse(client.call("longrun_init", {"task": task, "contract_path": self.contract})["isError"])
        uris = {item["uri"] for item in client.request("resources/list")["result"]["resources"]}
        self.assertEqual(uris, {f"longrun://{task}/{kind}" for task in ("one", "two") for kind in ("contract", "status", "history")})


@unittest.skipUnless(hasattr(os, "getuid") and os.getuid() == 0, "a strict control area owned by another account needs root to set up")
class ControlRootTests(McpCase):
    def test_with_a_control_root_an_approval_written_into_the_store_is_not_one(self) -> None:
        control = self.path("control")
        os.makedirs(control, mode=0o755)
        client = RawClient(self.server_argv("--create-store", "--control-root", control), env=self.env(), cwd=self.work,
                           stderr=self.stderr_file())  # fmt: skip
        self.addCleanup(client.close)
        client.initialize()
        client.call("longrun_init", {"contract_path": self.contract})

        def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
            structured: dict[str, Any] = client.call(name, arguments)["structuredContent"]
            return structured

        self.assertEqual(follow(call, "t1", self.env())["step"], "append-b")
        self.cli_json("approve", self.store, "t1", "--step", "append-b", "--yes")  # into the store, which the agent can write
        still = client.call("longrun_exec", {"step": "append-b"})
        self.assertEqual(still["structuredContent"]["status"], "awaiting-approval")
        self.assertEqual(self.lines(), ["a"])
        self.cli_json("approve", self.store, "t1", "--step", "append-b", "--yes", "--control-root", control)  # the approver's area
        self.assertEqual(follow(call, "t1", self.env())["kind"], "finished")
        self.assertEqual(self.lines(), ["a", "b"])


CURRENT = "2026-07-28"
VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
SUBSCRIPTION_KEY = "io.modelcontextprotocol/subscriptionId"
ENVELOPE = {VERSION_KEY: CURRENT, CAPABILITIES_KEY: {}, "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"}}


class StatelessRevisionTests(McpCase):
    """The current revision, 2026-07-28: no handshake, ``server/discover``, an envelope on every request,
    and change notifications on ``subscriptions/listen`` streams."""

    def start(self) -> RawClient:
        client = RawClient(self.server_argv("--create-store"), env=self.env(), cwd=self.work, stderr=self.stderr_file())
        self.addCleanup(client.close)
        return client

    def request(self, client: RawClient, method: str, params: dict[str, Any] | None = None, request_id: int | str | None = None) -> dict[str, Any]:
        if request_id is None:
            client._next_id += 1
            request_id = client._next_id
        client.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": {**(params or {}), "_meta": dict(ENVELOPE)}})
        answer = client.receive()
        self.assertEqual(answer["id"], request_id, answer)
        return answer

    def test_discover_answers_the_current_revision_and_every_result_says_it_is_complete(self) -> None:
        client = self.start()
        discovered = self.request(client, "server/discover")["result"]
        self.assertEqual(discovered["supportedVersions"], [CURRENT])
        self.assertEqual(discovered["capabilities"]["resources"], {"subscribe": True, "listChanged": False})
        self.assertEqual((discovered["resultType"], discovered["ttlMs"], discovered["cacheScope"]), ("complete", 0, "private"))
        self.assertEqual(discovered["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "longrun")
        self.assertIn("longrun_next", discovered["instructions"])
        self.assertNotIn("protocolVersion", discovered)
        tools = self.request(client, "tools/list")["result"]
        self.assertEqual(tools["resultType"], "complete")
        self.assertTrue(all("outputSchema" in tool for tool in tools["tools"]), "structured results, as since 2025-06-18")
        next_ = self.request(client, "tools/call", {"name": "longrun_next", "arguments": {}})["result"]
        self.assertEqual((next_["resultType"], next_["isError"]), ("complete", True))
        self.assertIn("structuredContent", next_)
        prompt = self.request(client, "prompts/get", {"name": "longrun_continue"})["result"]
        self.assertEqual(prompt["resultType"], "complete")
        self.assertNotIn("ttlMs", prompt, "only what a client may cache says for how long")
        self.assertEqual(client.close(), 0)
        self.assertEqual(client.notifications, [])

    def test_malformed_stateless_requests_get_json_rpc_errors_and_the_server_keeps_serving(self) -> None:
        client = self.start()
        self.assertIn("result", self.request(client, "server/discover"))  # the connection is a stateless one
        no_capabilities = {VERSION_KEY: CURRENT}
        cases: list[tuple[dict[str, Any], int]] = [
            ({"method": "tools/list", "params": {}}, -32602),
            ({"method": "tools/list"}, -32602),
            ({"method": "tools/list", "params": {"_meta": "2026-07-28"}}, -32602),
            ({"method": "tools/list", "params": {"_meta": {CAPABILITIES_KEY: {}, "progressToken": 1}}}, -32602),
            ({"method": "tools/list", "params": {"_meta": no_capabilities}}, -32602),
            ({"method": "tools/list", "params": {"_meta": {VERSION_KEY: 20260728, CAPABILITIES_KEY: {}}}}, -32602),
            ({"method": "tools/list", "params": {"_meta": {VERSION_KEY: CURRENT, CAPABILITIES_KEY: []}}}, -32602),
            ({"method": "tools/list", "params": {"_meta": {**ENVELOPE, "io.modelcontextprotocol/clientInfo": "me"}}}, -32602),
            ({"method": "tools/list", "params": {"_meta": {VERSION_KEY: "2099-01-01", CAPABILITIES_KEY: {}}}}, -32022),
            ({"method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}, -32022),
            ({"method": "ping", "params": {"_meta": ENVELOPE}}, -32601),
            ({"method": "resources/subscribe", "params": {"_meta": ENVELOPE, "uri": "longrun://t1/status"}}, -32601),
            ({"method": "no/such/method", "params": {"_meta": ENVELOPE}}, -32601),
            ({"method": "tools/call", "params": {"_meta": ENVELOPE, "name": "rm_rf"}}, -32602),
            ({"method": "resources/read", "params": {"_meta": ENVELOPE, "uri": "file:///etc/passwd"}}, -32002),
            ({"method": "subscriptions/listen", "params": {"_meta": ENVELOPE}}, -32602),
            ({"method": "subscriptions/listen", "params": {"_meta": ENVELOPE, "notifications": []}}, -32602),
            ({"method": "subscriptions/listen", "params": {"_meta": ENVELOPE, "notifications": {"resourceSubscriptions": "longrun://t1/status"}}}, -32602),
            ({"method": "subscriptions/listen", "params": {"_meta": ENVELOPE, "notifications": {"resourceSubscriptions": [7]}}}, -32602),
            ({"method": "subscriptions/listen", "params": {"_meta": ENVELOPE, "notifications": {"resourceSubscriptions": ["longrun://t1/secrets"]}}}, -32602),
            ({"method": "subscriptions/listen", "params": {"_meta": ENVELOPE, "notifications": {"resourceSubscriptions": ["longrun://other/status"]}}}, -32602),
        ]
        for number, (message, code) in enumerate(cases, start=100):
            with self.subTest(message=message):
                client.send({"jsonrpc": "2.0", "id": number, **message})
                answer = client.receive()
                self.assertEqual((answer["id"], answer["error"]["code"]), (number, code), answer)
                self.assertNotIn("Traceback", answer["error"]["message"])
                if code == -32022:
                    self.assertIn(CURRENT, answer["error"]["data"]["supported"])
                self.assertEqual(self.request(client, "server/discover")["result"]["supportedVersions"], [CURRENT], "still serving")
        self.assertEqual(client.notifications, [])
        self.assertEqual(client.close(), 0)

    def test_an_unsupported_revision_names_the_handshake_ones_and_does_not_decide_the_connection(self) -> None:
        client = self.start()
        client.send({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": {VERSION_KEY: "2099-01-01", CAPABILITIES_KEY: {}}}})
        error = client.receive()["error"]
        self.assertEqual(error["code"], -32022)
        self.assertEqual(error["data"], {"supported": [CURRENT, "2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"], "requested": "2099-01-01"})
        client._next_id = 1
        self.assertEqual(client.initialize()["result"]["protocolVersion"], "2025-11-25", "the client falls back to the handshake")
        refused = self.request(client, "tools/list")
        self.assertEqual(refused["error"]["code"], -32600, "a handshake connection does not take the envelope")
        self.assertIn("negotiated 2025-11-25 with initialize", refused["error"]["message"])
        self.assertEqual(client.request("ping")["result"], {})
        self.assertEqual(client.close(), 0)

    def test_a_discover_without_its_envelope_is_told_what_it_lacks(self) -> None:
        client = self.start()
        answer = client.request("server/discover")
        self.assertEqual(answer["error"]["code"], -32602)
        self.assertIn(VERSION_KEY, answer["error"]["message"])
        self.assertEqual(client.close(), 0)

    def test_a_listen_stream_is_acknowledged_then_hears_changes_and_ends_when_cancelled_or_at_the_end(self) -> None:
        client = self.start()
        status = "longrun://t1/status"
        self.assertFalse(self.request(client, "tools/call", {"name": "longrun_init", "arguments": {"contract_path": self.contract}})["result"]["isError"])
        for stream in ("listen-1", "listen-2"):
            client.send({"jsonrpc": "2.0", "id": stream, "method": "subscriptions/listen",
                         "params": {"_meta": ENVELOPE, "notifications": {"resourceSubscriptions": [status], "toolsListChanged": True}}})  # fmt: skip
        self.assertEqual(self.request(client, "server/discover")["result"]["resultType"], "complete")  # both acks come first
        self.assertEqual(
            client.notifications,
            [{"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
              "params": {"notifications": {"resourceSubscriptions": [status]}, "_meta": {SUBSCRIPTION_KEY: stream}}}
             for stream in ("listen-1", "listen-2")],  # fmt: skip
            "the tool list never changes, so only the resource is honored",
        )
        duplicate = self.request(client, "subscriptions/listen", {"notifications": {"resourceSubscriptions": [status]}}, request_id="listen-1")
        self.assertEqual(duplicate["error"]["code"], -32600, "an open stream's id is in use")
        client.notifications.clear()
        client.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "listen-2", "reason": "done"}})
        self.write("notes.txt", "plan\n")
        recorded = self.request(client, "tools/call", {"name": "longrun_checkpoint", "arguments": {"step": "notes", "evidence_file": "notes.txt"}})
        self.assertFalse(recorded["result"]["isError"])
        self.assertEqual(
            client.notifications,
            [{"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": status, "_meta": {SUBSCRIPTION_KEY: "listen-1"}}}],
            "announced before the call's result, on the stream still open only",
        )
        client.notifications.clear()
        self.assertEqual(client.close(), 0)
        end = client.receive()
        self.assertEqual(end["id"], "listen-1", "the open stream is closed gracefully, with its result")
        self.assertEqual(end["result"]["resultType"], "complete")
        self.assertEqual(end["result"]["_meta"][SUBSCRIPTION_KEY], "listen-1")
        with self.assertRaises(ServerGone):
            client.receive()  # nothing for the cancelled stream
        self.assertEqual(client.notifications, [])


if __name__ == "__main__":
    unittest.main()
