"""The OpenTelemetry recipe for ``on_event`` (docs/observability.md), run as written against the OpenTelemetry SDK.

Skips when ``opentelemetry-sdk`` is not installed, unless ``LONGRUN_REQUIRE_OTEL=1`` (``.ci/run`` sets it
and installs the SDK), which makes it fail instead; longrun itself never imports OpenTelemetry. The code
block is taken from docs/observability.md, so the recipe cannot rot: it is run as a program, as written,
and loaded as a module whose ``to_otel`` traces runs here (one trace per run, a span per step parented on
the run's span, a resumed run linked to the earlier ones).
"""

from __future__ import annotations

from helpers import support

import os
import re
import subprocess
import sys
import tempfile
from typing import Any

from helpers.optional import installed, skip_or_fail
from helpers.support import TempDirTest

import longrun
from longrun import Approval, JsonFileStore, Limits, RunContract, Runner, Status, Step
from longrun.testing import FakeClock, OutboxAdapter

WAIT_S = 300.0


def recipe() -> str:
    with open(os.path.join(support.ROOT, "docs", "observability.md"), encoding="utf-8") as handle:
        text = handle.read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    matching = [block for block in blocks if "from opentelemetry import" in block]
    assert len(matching) == 1, "docs/observability.md holds one OpenTelemetry recipe"
    return matching[0]


class OtelRecipeTests(TempDirTest):
    exporter: Any = None

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        if not installed("opentelemetry.sdk"):
            skip_or_fail("LONGRUN_REQUIRE_OTEL", "opentelemetry-sdk is not installed (pip install opentelemetry-sdk)")
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        cls.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(cls.exporter))
        trace.set_tracer_provider(provider)

    def setUp(self) -> None:
        super().setUp()
        self.exporter.clear()
        self.clock = FakeClock()
        # Loaded as a module, not run as a script: the recipe's own demonstration run is left out.
        self.namespace: dict[str, Any] = {"__name__": "otel_recipe"}
        exec(compile(recipe(), "docs/observability.md (OpenTelemetry recipe)", "exec"), self.namespace)

    def spans(self) -> tuple[list[Any], dict[int, list[Any]]]:
        """The runs' root spans, in order, and the spans of each trace by trace id."""
        spans = self.exporter.get_finished_spans()
        roots = [span for span in spans if span.parent is None]
        by_trace: dict[int, list[Any]] = {}
        for span in spans:
            by_trace.setdefault(span.context.trace_id, []).append(span)
        return roots, by_trace

    def assert_parented(self, root: Any, spans: list[Any]) -> list[Any]:
        """Every span of the trace but the root is a child of the root; the children, by start."""
        children = [span for span in spans if span is not root]
        for span in children:
            self.assertIsNotNone(span.parent, span.name)
            self.assertEqual(span.parent.span_id, root.context.span_id, span.name)
            self.assertLessEqual(root.start_time, span.start_time)
            self.assertLessEqual(span.end_time, root.end_time)
        return sorted(children, key=lambda span: span.start_time)

    def test_the_recipe_runs_as_written_and_prints_one_trace_per_run(self) -> None:
        with tempfile.TemporaryDirectory() as directory:
            script = os.path.join(directory, "otel_recipe.py")
            with open(script, "w", encoding="utf-8") as handle:
                handle.write(recipe())
            result = subprocess.run(
                [sys.executable, script], env=support.child_env(), capture_output=True, text=True, timeout=WAIT_S, cwd=directory
            )  # fmt: skip
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = result.stdout.splitlines()
        self.assertEqual(lines[:2], ["retry-scheduled", "done"])
        traces = [re.fullmatch(r"trace ([0-9a-f]{32}): longrun run traced (\S+), (\d) link\(s\), steps (.*)", line) for line in lines[2:]]
        self.assertEqual(len(traces), 2, lines)
        first, second = traces
        assert first is not None and second is not None
        self.assertNotEqual(first.group(1), second.group(1))
        self.assertEqual((first.group(2), first.group(3), first.group(4)), ("retry-scheduled", "0", "['longrun effect render']"))
        self.assertEqual((second.group(2), second.group(3), second.group(4)), ("done", "1", "['longrun effect render', 'longrun effect mail']"))

    def test_one_trace_per_run_with_a_span_per_step_and_the_resumed_run_linked(self) -> None:
        steps = [Step("render", "send", {"n": 1}), Step("mail", "send", {"n": 2})]
        adapter = OutboxAdapter(self.path("outbox.jsonl"), fail_transient=1)
        runner = Runner(RunContract("otel", "trace a run"), steps, store=JsonFileStore(self.path("store"), create=True),
                        adapters={"send": adapter}, on_event=self.namespace["to_otel"], clock=self.clock,
                        limits=Limits(max_block_s=0.0))  # fmt: skip
        self.assertIs(runner.run().status, Status.RETRY_SCHEDULED)
        self.clock.advance(3600)
        self.assertIs(runner.run().status, Status.DONE)
        roots, by_trace = self.spans()
        self.assertEqual([root.name for root in roots], ["longrun run otel", "longrun run otel"])
        self.assertEqual(len(by_trace), 2, "one trace per run")
        first, second = roots
        self.assertEqual((first.attributes["longrun.status"], second.attributes["longrun.status"]), ("retry-scheduled", "done"))
        self.assertLess(first.attributes["longrun.epoch"], second.attributes["longrun.epoch"])
        self.assertEqual([link.context.span_id for link in second.links], [first.context.span_id])
        self.assertEqual([link.context.trace_id for link in second.links], [first.context.trace_id])
        self.assertEqual(list(first.links), [])
        retried = self.assert_parented(first, by_trace[first.context.trace_id])
        self.assertEqual([span.name for span in retried], ["longrun effect render"])
        self.assertEqual([event.name for event in retried[0].events], ["started", "planned"])  # the transient failure
        resumed = self.assert_parented(second, by_trace[second.context.trace_id])
        self.assertEqual([span.name for span in resumed], ["longrun effect render", "longrun effect mail"])
        render, mail = resumed
        self.assertEqual(render.attributes["longrun.attempt"], 2)
        self.assertEqual(render.attributes["longrun.state"], "verified")
        self.assertEqual(mail.attributes["longrun.state"], "verified")
        self.assertIn("status done", [event.name for event in second.events])
        self.assertEqual((self.namespace["runs"], self.namespace["steps"]), ({}, {}))

    def test_a_durable_function_has_a_span_per_call_timer_question_child_and_effect(self) -> None:
        store = JsonFileStore(self.path("store"), create=True)
        options: dict[str, Any] = dict(
            store=store, adapters={"send": OutboxAdapter(self.path("outbox.jsonl"))}, clock=self.clock,
            on_event=self.namespace["to_otel"], limits=Limits(max_block_s=3600.0),
        )  # fmt: skip

        @longrun.durable(**options)
        def helper(run: longrun.Run, n: int) -> int:
            return int(run.call("double", lambda: n * 2))

        @longrun.durable(**options)
        def agent(run: longrun.Run) -> int:
            planned = run.call("plan", lambda: 3)
            run.sleep("pause", 10.0)
            seats = run.ask("seats", "How many seats?")
            doubled = run.child("agent-helper", helper, int(seats))  # type: ignore[arg-type]
            run.effect("book", "send", {"seats": doubled, "plan": planned})
            return int(doubled)

        self.assertIs(agent.run("agent").status, Status.AWAITING_INPUT)
        state = store.load("agent").state
        assert state is not None
        request = state.approval_requests["seats"]
        now = self.clock.now()
        store.write_approval(Approval.for_request(request, approval_id="a1", approver="t", granted_at=now, expires_at=now + 60, answer=4))
        outcome = agent.run("agent")
        self.assertIs(outcome.status, Status.DONE)
        self.assertEqual(outcome.result, 8)
        roots, by_trace = self.spans()
        agents = [root for root in roots if root.name == "longrun run agent"]
        self.assertEqual(len(agents), 2)
        asked, resumed = agents
        self.assertEqual([link.context.span_id for link in resumed.links], [asked.context.span_id])
        first = [span.name for span in self.assert_parented(asked, by_trace[asked.context.trace_id])]
        self.assertIn("longrun call plan", first)
        self.assertIn("longrun timer pause", first)
        self.assertIn("longrun question seats", first)
        question = next(span for span in by_trace[asked.context.trace_id] if span.name == "longrun question seats")
        self.assertEqual(question.end_time, asked.end_time, "a question still waiting ends with its run")
        second = [span.name for span in self.assert_parented(resumed, by_trace[resumed.context.trace_id])]
        self.assertIn("longrun question seats", second)
        self.assertIn("longrun child longrun.child:agent-helper", second)
        self.assertIn("longrun effect book", second)
        self.assertIn("longrun function longrun.function", second)
        children = [root for root in roots if root.name == "longrun run agent-helper"]
        self.assertEqual(len(children), 1, "the child task's run is a trace of its own")
        self.assertIn("longrun call double", [span.name for span in by_trace[children[0].context.trace_id]])
