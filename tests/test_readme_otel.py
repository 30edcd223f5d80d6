"""The OpenTelemetry recipe for ``on_event`` (docs/observability.md), run as written against the OpenTelemetry SDK.

Skips when ``opentelemetry-sdk`` is not installed, unless ``LONGRUN_REQUIRE_OTEL=1`` (``.ci/run`` sets it
and installs the SDK), which makes it fail instead; longrun itself never imports OpenTelemetry. The code block is taken from docs/observability.md, where the README links
for events and logs, so the recipe cannot rot.
"""

from __future__ import annotations

from helpers import support

import os
import re
import unittest
from typing import Any

from helpers.optional import installed, skip_or_fail
from helpers.support import TempDirTest

from longrun import JsonFileStore, Limits, RunContract, Runner, Status, Step
from longrun.testing import FakeClock, OutboxAdapter


def recipe() -> str:
    with open(os.path.join(support.ROOT, "docs", "observability.md"), encoding="utf-8") as handle:
        text = handle.read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    matching = [block for block in blocks if "from opentelemetry import trace" in block]
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

    def test_the_recipe_makes_one_span_per_effect_and_one_per_status(self) -> None:
        self.exporter.clear()
        clock = FakeClock()
        steps = [Step("render", "send", {"n": 1}), Step("mail", "send", {"n": 2})]
        adapter = OutboxAdapter(self.path("outbox.jsonl"), fail_transient=1)
        # Loaded as a module, not run as a script: the recipe's own demonstration run is left out.
        namespace: dict[str, Any] = {"__name__": "otel_recipe"}
        exec(compile(recipe(), "docs/observability.md (OpenTelemetry recipe)", "exec"), namespace)
        # A fake clock, so the retry's backoff passes at once.
        runner = Runner(RunContract("otel", "trace a run"), steps, store=JsonFileStore(self.path("store"), create=True),
                        adapters={"send": adapter}, on_event=namespace["to_otel"], clock=clock, limits=Limits(max_block_s=3600.0))
        self.assertIs(runner.run().status, Status.DONE)
        spans = self.exporter.get_finished_spans()
        effects = [span for span in spans if span.name.startswith("longrun effect")]
        self.assertEqual([span.name for span in effects], ["longrun effect render", "longrun effect render", "longrun effect mail"])
        retried, render, mail = effects
        self.assertEqual([event.name for event in retried.events], ["planned"])  # the transient failure, then a retry
        self.assertEqual([event.name for event in render.events], ["verified"])
        self.assertEqual(render.attributes["longrun.step"], "render")
        self.assertEqual(render.attributes["longrun.attempt"], 2)
        self.assertEqual(mail.attributes["longrun.state"], "verified")
        self.assertLessEqual(render.start_time, render.end_time)
        runs = [span.name for span in spans if span.name.startswith("longrun run")]
        self.assertEqual(runs[0], "longrun run running")
        self.assertEqual(runs[-1], "longrun run done")
        self.assertEqual(namespace["open_spans"], {})
