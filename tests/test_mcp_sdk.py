"""``longrun mcp`` driven by the official MCP Python SDK (``mcp``, test-only) over stdio, through a whole contract.

The SDK connects as a host does: in its default ``auto`` mode it probes ``server/discover`` and speaks
the stateless revision 2026-07-28 (the test checks that it did), and pinned to ``legacy`` it speaks
the initialize handshake, which negotiates 2025-11-25. Either way it lists the tools, resources and
the prompt, and a scripted agent that only follows ``longrun_next`` takes the six-step contract to
``done``: init, checkpoints, an exec, an exec that waits for an approval given from outside
(``longrun approve``, which the client hears of: through a ``subscriptions/listen`` stream on
2026-07-28, through ``resources/subscribe`` on 2025-11-25), done. The tests skip when ``mcp`` is not installed,
unless ``LONGRUN_REQUIRE_MCP=1`` (``.ci/run`` installs the pinned SDK and sets it), which makes them
fail instead: CI must never pass by skipping them.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import unittest
from typing import Any

from helpers.mcp_support import McpCase, run_work

REQUIRE_VARIABLE = "LONGRUN_REQUIRE_MCP"

try:
    import mcp_types
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.client.subscriptions import ResourceUpdated
    from mcp.shared.exceptions import MCPDeprecationWarning
except ImportError as exc:  # pragma: no cover - depends on the machine
    MISSING: str | None = f"the MCP Python SDK is not installed ({exc}); pip install mcp"
else:
    MISSING = None


def setUpModule() -> None:
    if MISSING is not None:
        if os.environ.get(REQUIRE_VARIABLE, "") not in ("", "0"):
            raise AssertionError(f"{REQUIRE_VARIABLE} is set but {MISSING}")
        raise unittest.SkipTest(MISSING)


class SdkClientTests(McpCase):
    def client(self, *extra: str, mode: str = "auto") -> Any:
        errlog = self.stderr_file()
        params = StdioServerParameters(command=sys.executable, args=self.server_argv("--create-store", *extra)[1:], env=self.env(), cwd=self.work)
        self.updates: list[str] = []
        self.updated = asyncio.Event()

        async def on_message(message: Any) -> None:
            if isinstance(message, mcp_types.ResourceUpdatedNotification):
                self.updates.append(str(message.params.uri))
                self.updated.set()

        return Client(stdio_client(params, errlog=errlog), message_handler=on_message, read_timeout_seconds=120, mode=mode)

    async def call(self, client: Any, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        result = await client.call_tool(name, arguments)
        self.assertFalse(result.is_error, f"{name} {arguments}: {result.content}")
        structured = result.structured_content
        self.assertIsInstance(structured, dict)
        text = result.content[-1].text
        self.assertEqual(json.loads(text), structured, "the text content is the structured result, serialized")
        return dict(structured)

    async def agent(self, client: Any) -> dict[str, Any]:
        """Follow ``longrun_next`` through the tools until it is not the agent's turn; the last advice."""
        for _ in range(50):
            advice = await self.call(client, "longrun_next", {})
            if advice["who"] != "agent":
                return advice
            suggested = advice["tool"]
            if suggested["name"] == "longrun_checkpoint":
                for command in advice["commands"]:
                    if command[:2] != ["longrun", "checkpoint"]:
                        run_work(command, advice["cwd"], self.env())
            await self.call(client, suggested["name"], suggested["arguments"])
        raise AssertionError("the agent never stopped")

    async def whole_contract(self, mode: str, revision: str) -> None:
        async with self.client(mode=mode) as client:
            self.assertEqual(client.protocol_version, revision)
            stateless = revision == "2026-07-28"
            self.assertEqual(client.server_info.name, "longrun")
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            self.assertEqual(
                set(tools),
                {"longrun_init", "longrun_next", "longrun_exec", "longrun_checkpoint", "longrun_done", "longrun_stop", "longrun_status"},
            )
            self.assertEqual(tools["longrun_exec"].input_schema["required"], ["step"])
            self.assertIn("argv", tools["longrun_exec"].input_schema["properties"])
            self.assertTrue(tools["longrun_next"].annotations.read_only_hint)

            with open(self.contract) as handle:
                started = await self.call(client, "longrun_init", {"contract": handle.read()})
            self.assertTrue(started["created"])
            status_uri = "longrun://t1/status"
            self.assertEqual({str(r.uri) for r in (await client.list_resources()).resources},
                             {"longrun://t1/contract", status_uri, "longrun://t1/history"})  # fmt: skip
            if not stateless:
                with self.assertWarns(MCPDeprecationWarning):  # the SDK's note that the 2026 revision drops it
                    await client.subscribe_resource(status_uri)

            waiting = await self.agent(client)
            self.assertEqual((waiting["who"], waiting["step"]), ("operator", "append-b"), waiting)
            self.assertIn("longrun approve", waiting["unblock"])
            self.assertEqual(self.lines(), ["a"], "the step that needs approval did not run")
            refused = await client.call_tool("longrun_approve", {"task": "t1"})
            self.assertTrue(refused.is_error)
            self.assertIn("an agent cannot approve its own requests", refused.content[0].text)

            if stateless:
                # Opened now, the stream's first event can only be the approval: the server compares with
                # what the task was when the stream was acknowledged.
                async with client.listen(resource_subscriptions=[status_uri]) as subscription:
                    self.assertEqual(subscription.honored.resource_subscriptions, [status_uri])
                    self.cli_json("approve", self.store, "t1", "--step", "append-b", "--yes")  # a person, from outside
                    event = await asyncio.wait_for(anext(aiter(subscription)), timeout=60)
                self.assertEqual(event, ResourceUpdated(uri=status_uri))
                self.assertEqual(self.updates, [status_uri], "the stream's notification, and nothing unasked for")
            else:
                self.updated.clear()
                self.cli_json("approve", self.store, "t1", "--step", "append-b", "--yes")  # a person, from outside
                await asyncio.wait_for(self.updated.wait(), timeout=60)
                self.assertIn(status_uri, self.updates)

            finished = await self.agent(client)
            self.assertEqual(finished["kind"], "finished", finished)
            self.assertEqual(self.lines(), ["a", "b"], "every command ran once")

            contents = (await client.read_resource(status_uri)).contents[0]
            status = json.loads(contents.text)
            self.assertEqual((status["status"], status["next"]["kind"]), ("done", "finished"))
            contract = json.loads((await client.read_resource("longrun://t1/contract")).contents[0].text)
            self.assertEqual([step["id"] for step in contract["contract"]["steps"]][:2], ["notes", "append-a"])
            history = json.loads((await client.read_resource("longrun://t1/history")).contents[0].text)
            self.assertIn("approval-consumed", {entry["kind"] for entry in history})

            prompts = (await client.list_prompts()).prompts
            self.assertEqual([prompt.name for prompt in prompts], ["longrun_continue"])
            rule = (await client.get_prompt("longrun_continue", {})).messages[0].content.text
            self.assertIn("call `longrun_next`", rule)
            self.assertIn("Never approve your own steps", rule)
            if not stateless:
                with self.assertWarns(MCPDeprecationWarning):
                    await client.send_ping()

    def test_a_whole_contract_through_the_sdk_on_the_current_revision(self) -> None:
        asyncio.run(self.whole_contract("auto", "2026-07-28"))
        status = self.cli_json("status", self.store, "t1")
        self.assertEqual(status["status"], "done")
        self.assertEqual(self.cli_json("verify", self.store, "t1")["verdict"], "finished")

    def test_a_whole_contract_through_the_sdk_on_the_handshake_revision(self) -> None:
        asyncio.run(self.whole_contract("legacy", "2025-11-25"))
        status = self.cli_json("status", self.store, "t1")
        self.assertEqual(status["status"], "done")
        self.assertEqual(self.cli_json("verify", self.store, "t1")["verdict"], "finished")

    async def errors(self) -> None:
        async with self.client() as client:
            missing = await client.call_tool("longrun_next", {})
            self.assertTrue(missing.is_error)
            self.assertEqual(
                missing.content[0].text,
                f"longrun next: error: no task 't1' in the store: start it with `longrun init {self.store} t1 --contract FILE`",
            )
            bad = await client.call_tool("longrun_init", {"contract": "version = 1\n[task]\ngoal = 3\n"})
            self.assertTrue(bad.is_error)
            self.assertRegex(bad.content[0].text, r"^longrun init: error: <contract>, line 3: ")
            await self.call(client, "longrun_init", {"contract_path": self.contract})
            other = await client.call_tool("longrun_exec", {"task": "t2", "step": "append-a"})
            self.assertTrue(other.is_error)
            self.assertIn("this server serves task 't1' only", other.content[0].text)
            early = await client.call_tool("longrun_exec", {"step": "append-a"})
            self.assertTrue(early.is_error)
            self.assertIn("step 'append-a' comes after notes, not recorded yet", early.content[0].text)
            self.assertEqual(self.lines(), [])

    def test_errors_are_tool_errors_with_the_cli_words(self) -> None:
        asyncio.run(self.errors())


if __name__ == "__main__":
    unittest.main()
