"""Durable functions in one process: replay by step id, divergence, calls, sleeps, children, approvals.

The store-dependent cases run against every store (``JsonFileStore``, ``SqliteStore``, and
``PostgresStore`` when ``LONGRUN_TEST_POSTGRES_DSN`` is set); the argument checks run once.
"""

from __future__ import annotations

import os
import secrets
import unittest
from collections import Counter
from typing import Any

from helpers import pg_support
from helpers import support
import longrun
from longrun import (
    Approval,
    CallFailed,
    Cancellation,
    EffectRequest,
    InvalidInputError,
    JsonFileStore,
    Limits,
    PendingRequest,
    PermanentError,
    PostgresStore,
    RetryPolicy,
    SqliteStore,
    Status,
    Store,
    TransientError,
)
from longrun.authority import FileControlSource
from longrun.canonical import digest_of
from longrun.functions import FUNCTION_STEP, qualified_name
from longrun.ledger import EffectState
from longrun.testing import FakeClock, OutboxAdapter


class Unprintable(Exception):
    """An exception whose ``str()`` and ``repr()`` raise, as some clients' exceptions do."""

    def __str__(self) -> str:
        raise RuntimeError("__str__ failed")

    def __repr__(self) -> str:
        raise RuntimeError("__repr__ failed")


class Model:
    """A fake model: answers from a script and counts every call per prompt."""

    def __init__(self, answers: dict[str, Any] | None = None):
        self.answers = answers or {}
        self.calls: Counter[str] = Counter()

    def __call__(self, prompt: str) -> Any:
        self.calls[prompt] += 1
        return self.answers.get(prompt, f"answer to {prompt}")


class DurableCase(support.TempDirTest):
    """A fresh store, a fake clock, a counting outbox and a counting model for each test."""

    def make_store(self) -> Store:
        return JsonFileStore(self.path("store"), create=True)

    def setUp(self) -> None:
        super().setUp()
        self.clock = FakeClock()
        self.store = self.make_store()
        self.outbox = OutboxAdapter(self.path("outbox.jsonl"))
        self.model = Model()

    def durable(self, **options: Any) -> Any:
        settings: dict[str, Any] = dict(
            store=self.store,
            adapters={"mail.send": self.outbox, "note.write": self.outbox},
            allowed_actions=("mail.send", "note.write"),
            clock=self.clock,
            retry=RetryPolicy(base_delay_s=1.0, max_delay_s=8.0, jitter=0.0),
        )
        settings.update(options)
        return longrun.durable(**settings)

    def state(self, task_id: str) -> longrun.RunState:
        state = self.store.load(task_id).state
        assert state is not None
        return state

    def approve(self, task_id: str, step_id: str) -> Approval:
        """What ``longrun approve`` does: an approval bound to the pending request's digests."""
        request = self.state(task_id).approval_requests[step_id]
        now = self.clock.now()
        approval = Approval.for_request(
            request, approval_id=secrets.token_hex(8), approver="tester", granted_at=now, expires_at=now + 3600
        )
        self.store.write_approval(approval)
        return approval

    def approve_answer(self, task_id: str, step_id: str, answer: Any) -> Approval:
        """What ``longrun answer`` does: an answer bound to the pending question."""
        request = self.state(task_id).approval_requests[step_id]
        now = self.clock.now()
        approval = Approval.for_request(
            request, approval_id=secrets.token_hex(8), approver="tester", granted_at=now, expires_at=now + 3600, answer=answer
        )
        self.store.write_approval(approval)
        return approval

    def details(self, outcome: longrun.RunOutcome) -> str:
        return "\n".join(item.detail for item in (*outcome.observations, *outcome.inferences, *outcome.unknowns))


class StoreCases(DurableCase):
    """Replay and resumption, which depend on what the store keeps: run for every store."""

    def agent(self) -> Any:
        model = self.model

        @self.durable()
        def agent(run: longrun.Run, goal: str) -> dict:
            plan = run.call("plan", model, goal)
            for i in range(3):
                run.effect(f"tool/{i}", "mail.send", {"goal": goal, "i": i, "plan": plan})
            summary = run.call("summary", model, f"summarise {goal}")
            run.effect("send-summary", "mail.send", {"summary": summary}, approval=True)
            return {"plan": plan, "summary": summary}

        return agent

    def test_replay_returns_recorded_values_without_calling_again(self) -> None:
        agent = self.agent()
        outcome = agent.run("agent-1", "tidy")
        self.assertEqual(outcome.status, Status.AWAITING_APPROVAL)
        self.assertEqual(self.model.calls, Counter({"tidy": 1, "summarise tidy": 1}))
        self.model.answers = {"tidy": "another plan", "summarise tidy": "another summary"}  # would diverge if called
        again = agent.run("agent-1", "tidy")
        self.assertEqual(again.status, Status.AWAITING_APPROVAL)
        self.assertEqual(self.model.calls, Counter({"tidy": 1, "summarise tidy": 1}), "replayed, not called")
        self.assertEqual(again.results["plan"], "answer to tidy")
        self.approve("agent-1", "send-summary")
        done = agent.run("agent-1", "tidy")
        self.assertEqual(done.status, Status.DONE, done.next_action)
        self.assertEqual(done.result, {"plan": "answer to tidy", "summary": "answer to summarise tidy"})
        self.assertEqual(self.model.calls, Counter({"tidy": 1, "summarise tidy": 1}))
        self.assertEqual(
            self.outbox.counts(), Counter({f"agent-1/{s}": 1 for s in ("tool/0", "tool/1", "tool/2", "send-summary")})
        )
        self.assertEqual(sum(self.outbox.calls.values()), 4, "no effect was applied twice")

    def test_a_finished_task_run_again_returns_done_with_the_same_result_and_calls_nothing(self) -> None:
        model = self.model

        @self.durable()
        def agent(run: longrun.Run, goal: str) -> dict:
            answer = run.call("ask", model, goal)
            run.effect("tell", "mail.send", {"answer": answer})
            return {"answer": answer}

        first = agent.run("agent-1", "hello")
        self.assertEqual(first.status, Status.DONE)
        revision = self.state("agent-1").revision
        self.model.answers = {"hello": "changed"}
        for _ in range(2):
            again = agent.run("agent-1", "hello")
            self.assertEqual(again.status, Status.DONE)
            self.assertEqual(again.result, {"answer": "answer to hello"})
        self.assertEqual(self.model.calls, Counter({"hello": 1}))
        self.assertEqual(self.outbox.calls, Counter({"agent-1/tell": 1}))
        self.assertEqual(
            sum(self.outbox.observe_calls.values()), 2, "the first run's observe before its first apply, and its verification"
        )
        self.assertEqual(self.state("agent-1").revision, revision, "a finished task is not written again")

    def test_other_arguments_stop_plan_mismatch_and_apply_nothing(self) -> None:
        agent = self.agent()
        self.assertEqual(agent.run("agent-1", "tidy").status, Status.AWAITING_APPROVAL)
        before = self.state("agent-1")
        outcome = agent.run("agent-1", "something else")
        self.assertEqual(outcome.status, Status.PLAN_MISMATCH)
        self.assertIn(before.plan_digest, outcome.next_action)
        self.assertIn("recorded plan digest", self.details(outcome))
        self.assertEqual(self.model.calls["something else"], 0)
        self.assertEqual(sum(self.outbox.calls.values()), 3, "only the first run's three tools")
        self.assertEqual(self.state("agent-1").revision, before.revision, "nothing written")

    def test_a_plan_mismatch_names_the_function_or_the_contract_that_differs(self) -> None:
        def body(run: longrun.Run, goal: str) -> str:
            return goal

        first = self.durable()(body)
        self.assertEqual(first.run("agent-1", "tidy").status, Status.DONE)
        other_contract = self.durable(allowed_actions=("mail.send",))(body)
        outcome = other_contract.run("agent-1", "tidy")
        self.assertEqual(outcome.status, Status.PLAN_MISMATCH)
        self.assertIn("the run contract (goal, allowed or forbidden actions) is not the one it was started with", outcome.next_action)
        self.assertNotIn("argument", outcome.next_action.split("what differs")[1])

        def renamed(run: longrun.Run, goal: str) -> str:
            return goal

        outcome = self.durable()(renamed).run("agent-1", "sweep")
        self.assertEqual(outcome.status, Status.PLAN_MISMATCH)
        self.assertIn(f"the function: recorded {first.name}, this run {qualified_name(renamed)}", outcome.next_action)
        self.assertIn("argument 'goal': recorded 'tidy', this run 'sweep'", outcome.next_action)
        self.assertIn(f"restore the code that started it ({first.name}", outcome.next_action)

    def test_a_changed_payload_stops_plan_mismatch_naming_the_step_and_both_digests(self) -> None:
        version = {"n": 1}

        @self.durable()
        def agent(run: longrun.Run) -> str:
            run.effect("first", "mail.send", {"n": 0})
            run.effect("second", "mail.send", {"n": version["n"]})
            run.effect("third", "mail.send", {"n": 3}, approval=True)
            return "ok"

        self.assertEqual(agent.run("agent-1").status, Status.AWAITING_APPROVAL)
        recorded = self.state("agent-1").effects["second"].payload_digest
        version["n"] = 2
        outcome = agent.run("agent-1")
        self.assertEqual(outcome.status, Status.PLAN_MISMATCH)
        now = digest_of({"n": 2})
        detail = self.details(outcome)
        self.assertIn("'second'", detail)
        self.assertIn(recorded, detail)
        self.assertIn(now, detail)
        self.assertIn("'second'", outcome.next_action)
        self.assertEqual(self.outbox.calls, Counter({"agent-1/first": 1, "agent-1/second": 1}), "nothing applied")

    def test_a_step_inserted_in_the_middle_of_a_half_done_task_runs_and_repeats_nothing(self) -> None:
        inserted = {"yes": False}
        model = self.model

        @self.durable()
        def agent(run: longrun.Run) -> list:
            sent = [run.effect("draft", "note.write", {"text": run.call("write", model, "draft")})]
            if inserted["yes"]:  # a newer version of the code checks the draft first
                verdict = run.call("check", model, "check the draft")
                sent.append(run.effect("review", "note.write", {"verdict": verdict}))
            sent.append(run.effect("send", "mail.send", {"to": "boss"}, approval=True))
            return sent

        self.assertEqual(agent.run("agent-1").status, Status.AWAITING_APPROVAL)
        inserted["yes"] = True
        outcome = agent.run("agent-1")
        self.assertEqual(outcome.status, Status.AWAITING_APPROVAL, "the new step ran; the approval still gates 'send'")
        self.assertEqual(self.outbox.counts(), Counter({"agent-1/draft": 1, "agent-1/review": 1}))
        self.approve("agent-1", "send")
        outcome = agent.run("agent-1")
        self.assertEqual(outcome.status, Status.DONE, outcome.next_action)
        self.assertEqual(self.outbox.calls, Counter({"agent-1/draft": 1, "agent-1/review": 1, "agent-1/send": 1}))
        self.assertEqual(self.model.calls, Counter({"draft": 1, "check the draft": 1}))
        self.assertEqual(len(outcome.result), 3)

    def test_a_transient_call_failure_backs_off_across_runs_and_its_attempts_persist(self) -> None:
        failures = {"left": 2}
        called: list[float] = []

        def flaky() -> str:
            called.append(self.clock.now())
            if failures["left"]:
                failures["left"] -= 1
                raise TransientError("model overloaded")
            return "fine"

        @self.durable(limits=Limits(max_block_s=0.0), retry=RetryPolicy(base_delay_s=10.0, max_delay_s=100.0, jitter=0.0))
        def agent(run: longrun.Run) -> str:
            return str(run.call("ask", flaky))

        start = self.clock.now()
        outcome = agent.run("agent-1")
        self.assertEqual(outcome.status, Status.RETRY_SCHEDULED)
        self.assertEqual(outcome.wake_at, start + 10.0)
        self.assertEqual(self.state("agent-1").effects["ask"].attempts, 1)
        self.clock.advance(9.0)
        self.assertEqual(agent.run("agent-1").status, Status.RETRY_SCHEDULED, "the backoff is honoured by a new run")
        self.assertEqual(len(called), 1)
        self.clock.advance(1.0)
        outcome = agent.run("agent-1")
        self.assertEqual(outcome.status, Status.RETRY_SCHEDULED)
        self.assertEqual(outcome.wake_at, start + 10.0 + 20.0, "the second backoff doubles: the counter persisted")
        self.assertEqual(self.state("agent-1").effects["ask"].attempts, 2)
        self.clock.advance(20.0)
        outcome = agent.run("agent-1")
        self.assertEqual(outcome.status, Status.DONE)
        self.assertEqual(outcome.result, "fine")
        self.assertEqual(called, [start, start + 10.0, start + 30.0])
        self.assertEqual(self.state("agent-1").effects["ask"].attempts, 3)

    def test_a_transient_call_failure_stops_at_the_attempt_limit(self) -> None:
        def always_busy() -> str:
            raise TransientError("busy")

        @self.durable(limits=Limits(max_attempts=2, max_block_s=0.0))
        def agent(run: longrun.Run) -> str:
            return str(run.call("ask", always_busy))

        self.assertEqual(agent.run("agent-1").status, Status.RETRY_SCHEDULED)
        self.clock.advance(100.0)
        outcome = agent.run("agent-1")
        self.assertEqual(outcome.status, Status.LIMITS_EXHAUSTED)
        self.assertEqual(self.state("agent-1").effects["ask"].attempts, 2)

    def test_a_call_that_raises_is_raised_into_the_function_as_call_failed_identically_on_replay(self) -> None:
        calls: list[str] = []
        seen: list[tuple[str, str, str]] = []

        def lookup(name: str) -> str:
            calls.append(name)
            raise KeyError(name)

        @self.durable(limits=Limits(max_block_s=0.0))
        def agent(run: longrun.Run) -> str:
            try:
                found = run.call("lookup", lookup, "alice")
            except CallFailed as exc:
                seen.append((exc.step_id, exc.type_name, exc.message))
                found = "nobody"
            run.effect("mail", "mail.send", {"to": found}, approval=True)
            return str(found)

        self.assertEqual(agent.run("agent-1").status, Status.AWAITING_APPROVAL)
        self.assertEqual(agent.run("agent-1").status, Status.AWAITING_APPROVAL)
        self.assertEqual(calls, ["alice"], "called once; the failure is replayed")
        self.assertEqual(seen, [("lookup", "KeyError", "'alice'")] * 2)
        record = self.state("agent-1").effects["lookup"]
        self.assertEqual(record.state, EffectState.FAILED)
        self.approve("agent-1", "mail")
        self.assertEqual(agent.run("agent-1").result, "nobody")
        self.assertEqual(calls, ["alice"])

    def test_an_uncaught_call_failure_propagates_from_run_and_replays_without_calling(self) -> None:
        calls: list[int] = []

        def divide() -> float:
            calls.append(1)
            return 1 / 0

        @self.durable()
        def agent(run: longrun.Run) -> float:
            run.effect("before", "note.write", {"n": 1})
            return float(run.call("divide", divide))

        for _ in range(2):
            with self.assertRaises(CallFailed) as raised:
                agent.run("agent-1")
            self.assertEqual(raised.exception.type_name, "ZeroDivisionError")
        self.assertEqual(calls, [1])
        self.assertEqual(self.outbox.calls, Counter({"agent-1/before": 1}))

    def test_a_call_whose_exception_cannot_print_itself_is_a_call_failed_recorded_once(self) -> None:
        calls: list[int] = []

        def ask_model() -> str:
            calls.append(1)  # a paid model call: it must not run again on every run
            raise Unprintable("the model's client failed")

        @self.durable()
        def agent(run: longrun.Run) -> str:
            try:
                return str(run.call("answer", ask_model))
            except CallFailed as exc:
                return f"{exc.type_name} / {exc.message}"

        for _ in range(2):
            outcome = agent.run("agent-1")
            self.assertEqual(outcome.status, Status.DONE, outcome.next_action)
            self.assertEqual(outcome.result, "Unprintable / <unprintable Unprintable>")
        self.assertEqual(calls, [1], "recorded as the call's failure, replayed without calling")
        record = self.state("agent-1").effects["answer"]
        self.assertEqual(record.state, EffectState.FAILED)
        self.assertEqual(record.result, {"type": "Unprintable", "message": "<unprintable Unprintable>"})

    def test_an_adapter_whose_exceptions_cannot_print_themselves_leaves_an_uncertain_effect_observed(self) -> None:
        class Broken(OutboxAdapter):
            def apply(self, request: EffectRequest) -> longrun.Receipt:
                super().apply(request)  # it reached the target, then failed to say so
                raise Unprintable("lost the reply")

            def observe(self, request: EffectRequest) -> longrun.Observation:
                self.observe_calls[request.key] += 1
                if self.observe_calls[request.key] == 1:
                    raise Unprintable("target unreachable")
                return super().observe(request)

        broken = Broken(self.path("broken.jsonl"))

        @self.durable(adapters={"mail.send": broken}, retry=RetryPolicy(base_delay_s=0.0, jitter=0.0))
        def agent(run: longrun.Run) -> Any:
            return run.effect("mail", "mail.send", {"to": "a"})

        with self.assertLogs("longrun", "WARNING") as logs:
            outcome = agent.run("agent-1")
        self.assertEqual(outcome.status, Status.DONE, outcome.next_action)
        logged = "\n".join(logs.output)
        self.assertIn("apply of agent-1/mail raised Unprintable: <unprintable Unprintable>; observing", logged)
        self.assertIn("observe of agent-1/mail failed: Unprintable: <unprintable Unprintable>", logged)
        self.assertIn("agent-1/mail attempt 1 raised Unprintable: <unprintable Unprintable>", self.details(outcome))
        self.assertIn("observe raised Unprintable: <unprintable Unprintable>", self.details(outcome))
        self.assertEqual(broken.calls, Counter({"agent-1/mail": 1}), "observed, never applied again")
        self.assertEqual(self.state("agent-1").effects["mail"].state, EffectState.VERIFIED)
        self.assertEqual(broken.calls, Counter({"agent-1/mail": 1}), "observed, never applied again")

    def test_a_call_returning_a_value_that_is_not_json_is_a_call_failed_recorded_once(self) -> None:
        calls: list[int] = []

        def tags() -> set[str]:
            calls.append(1)
            return {"a", "b"}  # a set cannot be recorded

        @self.durable()
        def agent(run: longrun.Run) -> str:
            try:
                return str(run.call("tags", tags))
            except CallFailed as exc:
                return exc.type_name

        for _ in range(2):
            outcome = agent.run("agent-1")
            self.assertEqual((outcome.status, outcome.result), (Status.DONE, "InvalidInputError"), outcome.next_action)
        self.assertEqual(calls, [1], "recorded as the call's failure, not called again")
        self.assertEqual(self.state("agent-1").effects["tags"].state, EffectState.FAILED)

    def test_a_long_sleep_stops_sleeping_with_wake_at_and_completes_after_the_clock_advances(self) -> None:
        @self.durable()
        def agent(run: longrun.Run) -> float:
            run.effect("before", "note.write", {"n": 1})
            run.sleep("nap", 3600)
            run.effect("after", "note.write", {"n": 2})
            return self.clock.now()

        start = self.clock.now()
        outcome = agent.run("agent-1")
        self.assertEqual(outcome.status, Status.SLEEPING)
        self.assertEqual(outcome.wake_at, start + 3600)
        self.assertEqual(self.outbox.counts(), Counter({"agent-1/before": 1}))
        self.clock.advance(1800)
        early = agent.run("agent-1")
        self.assertEqual(early.status, Status.SLEEPING)
        self.assertEqual(early.wake_at, start + 3600, "the wake time was recorded when the step was first reached")
        self.clock.advance(1800)
        outcome = agent.run("agent-1")
        self.assertEqual(outcome.status, Status.DONE)
        self.assertEqual(self.outbox.calls, Counter({"agent-1/before": 1, "agent-1/after": 1}))
        self.assertEqual(self.clock.sleeps, [], "nothing waited in-process")

    def test_an_exception_from_the_function_propagates_and_what_was_settled_is_kept(self) -> None:
        fixed = {"yes": False}
        model = self.model

        @self.durable()
        def agent(run: longrun.Run) -> str:
            draft = run.call("draft", model, "draft")
            run.effect("save", "note.write", {"draft": draft})
            if not fixed["yes"]:
                raise RuntimeError("a bug after the save")
            run.effect("send", "mail.send", {"draft": draft})
            return str(draft)

        with self.assertRaisesRegex(RuntimeError, "a bug after the save"):
            agent.run("agent-1")
        state = self.state("agent-1")
        self.assertEqual(state.effects["save"].state, EffectState.VERIFIED, "settled before the error, and committed")
        self.assertEqual(state.effects["draft"].state, EffectState.VERIFIED)
        with self.assertRaises(RuntimeError):
            agent.run("agent-1")  # still buggy: raises again, repeats nothing
        fixed["yes"] = True
        outcome = agent.run("agent-1")
        self.assertEqual(outcome.status, Status.DONE)
        self.assertEqual(self.outbox.calls, Counter({"agent-1/save": 1, "agent-1/send": 1}))
        self.assertEqual(self.model.calls, Counter({"draft": 1}))
        # Each effect observed after its apply, and each run's first apply observed before it.
        self.assertEqual(sum(self.outbox.observe_calls.values()), 4)

    def test_an_approved_effect_runs_once_and_the_approval_is_consumed(self) -> None:
        @self.durable()
        def agent(run: longrun.Run, amount: int) -> Any:
            return run.effect("pay", "mail.send", {"amount": amount}, approval=True)

        outcome = agent.run("agent-1", 100)
        self.assertEqual(outcome.status, Status.AWAITING_APPROVAL)
        self.assertIn("longrun approve", outcome.next_action)
        request = self.state("agent-1").approval_requests["pay"]
        self.assertEqual(request.plan_digest, self.state("agent-1").plan_digest)
        self.assertEqual(request.payload_digest, digest_of({"amount": 100}))
        self.assertEqual(self.outbox.calls, Counter())
        wrong = Approval.for_request(
            request, approval_id="wrong", approver="tester", granted_at=self.clock.now(), expires_at=self.clock.now() + 60
        )
        self.store.write_approval(Approval.from_json({**wrong.to_json(), "payload_digest": digest_of({"amount": 999})}))
        self.assertEqual(agent.run("agent-1", 100).status, Status.AWAITING_APPROVAL, "another payload authorizes nothing")
        self.assertEqual(self.outbox.calls, Counter())
        approval = self.approve("agent-1", "pay")
        outcome = agent.run("agent-1", 100)
        self.assertEqual(outcome.status, Status.DONE)
        self.assertEqual(self.outbox.calls, Counter({"agent-1/pay": 1}))
        state = self.state("agent-1")
        self.assertEqual(state.effects["pay"].approval_id, approval.approval_id)
        self.assertIn(approval.approval_id, state.consumed_approvals)

    def test_the_outcome_lists_the_approvals_and_questions_the_run_waits_for(self) -> None:
        @self.durable()
        def agent(run: longrun.Run, amount: int) -> Any:
            run.effect("pay", "mail.send", {"amount": amount}, approval=True)
            return run.ask("size", "which size?", choices=["s", "m"])

        outcome = agent.run("agent-1", 100)
        self.assertEqual(outcome.status, Status.AWAITING_APPROVAL)
        [pending] = outcome.pending
        request = self.state("agent-1").approval_requests["pay"]
        self.assertEqual(
            pending,
            PendingRequest(
                kind="approval", step_id="pay", action="mail.send", payload={"amount": 100},
                payload_digest=digest_of({"amount": 100}), plan_digest=request.plan_digest,
                requested_at=request.requested_at, expires_at=request.requested_at + Limits().approval_ttl_s,
            ),
        )  # fmt: skip
        self.assertEqual(outcome.to_json()["pending"], [pending.to_json()])
        approval = Approval.for_request(request, approval_id="a1", approver="tester", granted_at=self.clock.now())
        self.assertEqual(approval.expires_at, request.expires_at, "an approval lasts as long as its request by default")
        self.store.write_approval(approval)
        outcome = agent.run("agent-1", 100)
        self.assertEqual(outcome.status, Status.AWAITING_INPUT)
        [question] = outcome.pending
        self.assertEqual((question.kind, question.step_id, question.question, question.choices), ("question", "size", "which size?", ("s", "m")))
        self.assertEqual(question.payload, {"question": "which size?", "choices": ["s", "m"]})
        self.assertEqual(question.payload_digest, digest_of(question.payload))
        asked = self.state("agent-1").approval_requests["size"]
        self.store.write_approval(
            Approval.for_request(asked, approval_id="a2", approver="tester", granted_at=self.clock.now(), answer="m")
        )
        outcome = agent.run("agent-1", 100)
        self.assertEqual((outcome.status, outcome.result, outcome.pending), (Status.DONE, "m", ()))

    def test_child_tasks_done_waiting_and_ended(self) -> None:
        @self.durable()
        def child(run: longrun.Run, n: int) -> int:
            run.effect("report", "mail.send", {"n": n}, approval=True)
            return n * 2

        outcomes: list[Any] = []

        @self.durable()
        def parent(run: longrun.Run, child_task: str) -> Any:
            try:
                outcomes.append(run.child(child_task, child, 21))
            except CallFailed as exc:
                outcomes.append(exc.type_name)
            run.effect("after", "note.write", {"child": child_task})
            return outcomes[-1]

        waiting = parent.run("parent-1", "child-1")
        self.assertEqual(waiting.status, Status.WAITING_ON_CHILD)
        self.assertIn("child-1", waiting.next_action)
        self.assertIn("awaiting-approval", waiting.next_action)
        self.assertEqual(self.outbox.calls, Counter(), "the parent went no further")
        self.approve("child-1", "report")
        done = parent.run("parent-1", "child-1")
        self.assertEqual(done.status, Status.DONE, done.next_action)
        self.assertEqual(done.result, 42)
        self.assertEqual(child.run("child-1", 21).result, 42, "the child is a task of its own")
        again = parent.run("parent-1", "child-1")
        self.assertEqual(again.result, 42)
        self.assertEqual(outcomes, [42])
        self.assertEqual(self.outbox.calls, Counter({"child-1/report": 1, "parent-1/after": 1}))
        record = self.state("parent-1").effects["longrun.child:child-1"]
        self.assertEqual(record.payload["task"], "child-1")

        self.assertEqual(parent.run("parent-2", "child-2").status, Status.WAITING_ON_CHILD)
        self.store.write_cancellation(Cancellation("child-2", self.clock.now(), "tester", "not needed"))
        ended = parent.run("parent-2", "child-2")
        self.assertEqual(ended.status, Status.DONE)
        self.assertEqual(ended.result, "ChildEnded")
        self.assertEqual(parent.run("parent-2", "child-2").result, "ChildEnded", "the failure is replayed")
        self.assertEqual(self.state("child-2").status, Status.CANCELLED)
        self.assertNotIn("child-2/report", self.outbox.calls)

    def test_a_cancelled_parent_drives_its_child_no_further(self) -> None:
        @self.durable()
        def child(run: longrun.Run) -> int:
            run.sleep("wait", 3600)
            run.effect("report", "mail.send", {})
            return 1

        @self.durable()
        def parent(run: longrun.Run) -> Any:
            return run.child("child-1", child)

        self.assertEqual(parent.run("parent-1").status, Status.WAITING_ON_CHILD)
        self.store.write_cancellation(Cancellation("parent-1", self.clock.now(), "tester", "stop the whole job"))
        self.clock.advance(4000)  # the child could go on now
        outcome = parent.run("parent-1")
        self.assertEqual(outcome.status, Status.CANCELLED)
        self.assertEqual(self.outbox.calls, Counter(), "no effect was started for a cancelled run")
        self.assertEqual(self.state("child-1").status, Status.SLEEPING, "the child was not driven")

    def test_a_task_that_asks_for_itself_as_its_child_is_refused_as_a_cycle(self) -> None:
        @self.durable()
        def selfish(run: longrun.Run) -> Any:
            run.effect("before", "note.write", {})
            return run.child("loop-1", selfish)

        for _ in range(2):
            with self.assertRaises(longrun.ChildCycleError) as raised:
                selfish.run("loop-1")
            self.assertEqual((raised.exception.child, raised.exception.lineage), ("loop-1", ("loop-1",)))
            self.assertIsInstance(raised.exception, InvalidInputError)
        state = self.state("loop-1")
        self.assertNotIn("longrun.child:loop-1", state.effects, "nothing was planned for the child")
        self.assertNotEqual(state.status, Status.WAITING_ON_CHILD)
        self.assertEqual(self.outbox.calls, Counter({"loop-1/before": 1}))

    def test_a_task_that_asks_for_an_ancestor_as_its_child_is_refused_as_a_cycle(self) -> None:
        @self.durable()
        def grandchild(run: longrun.Run) -> Any:
            return run.child("top", top)  # the root of its own lineage

        @self.durable()
        def middle(run: longrun.Run) -> Any:
            return run.child("bottom", grandchild)

        @self.durable()
        def top(run: longrun.Run) -> Any:
            return run.child("mid", middle)

        with self.assertRaises(longrun.ChildCycleError) as raised:
            top.run("top")
        self.assertEqual((raised.exception.child, raised.exception.lineage), ("top", ("bottom", "mid", "top")))
        self.assertIn("'bottom' <- 'mid' <- 'top'", str(raised.exception))
        function_record = self.state("bottom").effects[FUNCTION_STEP]
        self.assertEqual((function_record.payload["parent"], function_record.payload["ancestors"]), ("mid", ["mid", "top"]))
        self.assertNotIn("longrun.child:top", self.state("bottom").effects)

    def test_a_parent_that_ends_cancelled_writes_a_cancellation_naming_it_for_each_unfinished_child(self) -> None:
        @self.durable()
        def asker(run: longrun.Run) -> Any:
            answer = run.ask("who", "to whom?")
            run.effect("send", "mail.send", {"to": answer})
            return answer

        @self.durable()
        def middle(run: longrun.Run) -> Any:
            return run.child("grandchild-1", asker)

        @self.durable()
        def parent(run: longrun.Run) -> Any:
            return run.child("child-1", middle)

        self.assertEqual(parent.run("parent-1").status, Status.WAITING_ON_CHILD)
        self.store.write_cancellation(Cancellation("parent-1", self.clock.now(), "ops", "not wanted"))
        outcome = parent.run("parent-1")
        self.assertEqual(outcome.status, Status.CANCELLED)
        self.assertIn("its unfinished children are cancelled too: ['child-1', 'grandchild-1']", self.details(outcome))
        for task_id, cause in (("child-1", "parent-1"), ("grandchild-1", "child-1")):
            raw = self.store.read_cancellation(task_id)
            assert raw is not None, task_id
            record = Cancellation.from_json(raw.body)
            self.assertEqual((record.requested_by, record.reason), ("ops", f"its parent task {cause!r} was cancelled: not wanted"))
        self.approve_answer("grandchild-1", "who", "ann")
        self.assertEqual(asker.run("grandchild-1").status, Status.CANCELLED)
        self.assertEqual(self.outbox.calls, Counter(), "nothing was applied")
        again = parent.run("parent-1")
        self.assertEqual(again.status, Status.CANCELLED)
        self.assertNotIn("children are cancelled too", self.details(again), "each child once")

    def test_a_child_reads_its_parents_cancellation_through_its_own_control_source(self) -> None:
        # The parent is cancelled in a strictly owned control area, which is also where the child's
        # runner reads cancellations: the record the cancelled parent writes to the store is not
        # seen there, so the child must read its parent's own record.
        control = self.path("control")
        os.makedirs(control)
        source = FileControlSource(control, approver_uid=os.geteuid())

        @self.durable(cancellations=source)
        def asker(run: longrun.Run) -> Any:
            answer = run.ask("who", "to whom?")
            run.effect("send", "mail.send", {"to": answer})
            return answer

        @self.durable(cancellations=source)
        def parent(run: longrun.Run) -> Any:
            return run.child("child-1", asker)

        self.assertEqual(parent.run("parent-1").status, Status.WAITING_ON_CHILD)
        record = self.state("child-1").effects[FUNCTION_STEP]
        self.assertEqual(record.payload["cancelled_with"], ["parent-1"])
        source.write_cancellation(Cancellation("parent-1", self.clock.now(), "ops", "not wanted"))
        self.approve_answer("child-1", "who", "ann")
        outcome = asker.run("child-1")
        self.assertEqual(outcome.status, Status.CANCELLED, outcome.next_action)
        self.assertIn("its ancestor task 'parent-1' was cancelled by ops: not wanted", outcome.next_action)
        self.assertEqual(self.outbox.calls, Counter(), "nothing was applied")

    def test_a_detached_child_does_not_read_its_parents_cancellation(self) -> None:
        @self.durable()
        def asker(run: longrun.Run) -> Any:
            return run.ask("who", "to whom?")

        @self.durable()
        def parent(run: longrun.Run) -> Any:
            return run.child("child-1", asker, detached=True)

        self.assertEqual(parent.run("parent-1").status, Status.WAITING_ON_CHILD)
        self.assertNotIn("cancelled_with", self.state("child-1").effects[FUNCTION_STEP].payload)
        self.store.write_cancellation(Cancellation("parent-1", self.clock.now(), "ops", "not wanted"))
        self.approve_answer("child-1", "who", "ann")
        self.assertEqual(asker.run("child-1").result, "ann")
        self.assertEqual(parent.run("parent-1").status, Status.CANCELLED)
        self.assertIsNone(self.store.read_cancellation("child-1"), "a detached child is left alone")

    def test_a_cycle_through_a_task_started_on_its_own_is_refused_too(self) -> None:
        @self.durable()
        def flex(run: longrun.Run) -> Any:
            return run.child(str(run.ask("next", "which task next?")), flex)

        self.assertEqual(flex.run("t").status, Status.AWAITING_INPUT)  # started on its own: no lineage
        self.assertEqual(flex.run("x").status, Status.AWAITING_INPUT)
        self.approve_answer("x", "next", "t")
        self.assertEqual(flex.run("x").status, Status.WAITING_ON_CHILD, "x waits on t")
        self.approve_answer("t", "next", "x")
        with self.assertRaises(longrun.ChildCycleError) as raised:
            flex.run("t")
        self.assertIn("which waits on it ('t' -> 'x' -> 't')", str(raised.exception))
        self.assertNotIn("longrun.child:x", self.state("t").effects, "nothing was planned")

    def test_the_function_record_names_the_function_and_its_arguments(self) -> None:
        @self.durable()
        def agent(run: longrun.Run, goal: str, *, budget: int) -> str:
            return goal

        self.assertEqual(agent.run("agent-1", "tidy", budget=3).status, Status.DONE)
        record = self.state("agent-1").effects[FUNCTION_STEP]
        self.assertEqual(
            record.payload,
            {
                "function": f"{__name__}:StoreCases.test_the_function_record_names_the_function_and_its_arguments.<locals>.agent",
                "args": ["tidy"],
                "kwargs": {"budget": 3},
                "version": agent.version,  # the function's code version, recorded when the task starts
            },
        )
        self.assertEqual(record.state, EffectState.VERIFIED)
        self.assertEqual(record.result, "tidy")
        self.assertEqual(agent.name, record.payload["function"])


class JsonFileStoreTests(StoreCases):
    pass


class SqliteStoreTests(StoreCases):
    def make_store(self) -> Store:
        store = SqliteStore(self.path("longrun.sqlite"), create=True)
        self.addCleanup(store.close)
        return store


class PostgresStoreTests(StoreCases):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        pg_support.check()

    def make_store(self) -> Store:
        schema = pg_support.Schema()
        self.addCleanup(schema.drop)
        store = PostgresStore(schema.factory())
        self.addCleanup(store.close)
        return store


del StoreCases  # only its subclasses run


class StepRuleTests(DurableCase):
    """What the function may ask for; these do not depend on the store."""

    def test_arguments_the_function_cannot_take_are_refused_by_run_start_and_enqueue_recording_nothing(self) -> None:
        calls = Counter[str]()

        @self.durable()
        def agent(run: longrun.Run, goal: str, *, depth: int = 1) -> None:
            calls["agent"] += 1

        attempts = {
            "run": lambda: agent.run("a-1", "goal", "extra"),
            "start": lambda: agent.start("a-1"),
            "enqueue": lambda: agent.enqueue("a-1", ["goal"], {"width": 2}),
            "plan_digest": lambda: agent.plan_digest("a-1", "goal", depth=1, width=2),
        }
        for what, attempt in attempts.items():
            with self.subTest(what):
                with self.assertRaisesRegex(InvalidInputError, r"agent\(run, goal, \*, depth=1\) cannot take these arguments"):
                    attempt()
        self.assertEqual(calls, Counter())
        self.assertEqual(self.store.list_tasks(), [], "nothing was recorded")

    def test_a_step_id_used_twice_is_invalid_input(self) -> None:
        model = self.model

        @self.durable()
        def agent(run: longrun.Run) -> None:
            run.call("ask", model, "a")
            run.effect("ask", "mail.send", {})

        with self.assertRaisesRegex(InvalidInputError, "'ask' is used twice"):
            agent.run("agent-1")
        self.assertEqual(self.outbox.calls, Counter())

    def test_reserved_step_ids_and_actions_are_refused(self) -> None:
        attempts = {
            "reserved step id": lambda run: run.effect("longrun.function", "mail.send", {}),
            "reserved call id": lambda run: run.call("longrun.x", self.model, "a"),
            "reserved sleep id": lambda run: run.sleep("longrun.nap", 1),
            "reserved action": lambda run: run.effect("s", "longrun.call", {}),
            "non-string action": lambda run: run.effect("s", 42, {}),
            "bad step id": lambda run: run.effect("../up", "mail.send", {}),
            "bad replay mode": lambda run: run.call("s", self.model, "a", replay="sometimes"),
            "not callable": lambda run: run.call("s", "model"),
            "negative sleep": lambda run: run.sleep("s", -1),
        }
        for number, (what, body) in enumerate(attempts.items()):
            with self.subTest(what):
                agent = self.durable()(body)
                with self.assertRaises(InvalidInputError):
                    agent.run(f"agent-{number}")
        self.assertEqual(self.outbox.calls, Counter())
        self.assertEqual(self.model.calls, Counter())

    def test_an_action_the_contract_does_not_allow_stops_unsafe_and_applies_nothing(self) -> None:
        for number, options in enumerate(
            [dict(allowed_actions=("note.write",)), dict(allowed_actions=(), forbidden_actions=("mail.send",))]
        ):
            with self.subTest(**{k: str(v) for k, v in options.items()}):

                @self.durable(**options)
                def agent(run: longrun.Run) -> None:
                    run.effect("note", "note.write", {"n": 1})
                    run.effect("mail", "mail.send", {"n": 2})

                outcome = agent.run(f"agent-{number}")
                self.assertEqual(outcome.status, Status.UNSAFE_TO_CONTINUE)
                self.assertIn("'mail'", outcome.next_action)
                self.assertIn("mail.send", self.details(outcome))
                self.assertNotIn(f"agent-{number}/mail", self.outbox.calls)
                self.assertEqual(self.state(f"agent-{number}").status, Status.UNSAFE_TO_CONTINUE)
        self.assertEqual(self.outbox.calls, Counter({"agent-0/note": 1, "agent-1/note": 1}))

    def test_a_permanent_call_failure_stops_blocked(self) -> None:
        def refuse() -> None:
            raise PermanentError("the model refuses this account")

        @self.durable()
        def agent(run: longrun.Run) -> None:
            run.call("ask", refuse)
            run.effect("mail", "mail.send", {})

        outcome = agent.run("agent-1")
        self.assertEqual(outcome.status, Status.BLOCKED)
        self.assertIn("'ask'", outcome.next_action)
        self.assertEqual(agent.run("agent-1").status, Status.BLOCKED, "blocked is final")
        self.assertEqual(self.state("agent-1").effects["ask"].state, EffectState.FAILED)
        self.assertEqual(self.outbox.calls, Counter())

    def test_replay_by_id_accepts_changed_arguments_and_strict_replay_does_not(self) -> None:
        stamps = {"now": "09:00"}
        model = self.model

        @self.durable()
        def agent(run: longrun.Run) -> list:
            loose = run.call("loose", model, f"weather at {stamps['now']}", replay="by-id")
            run.effect("note", "note.write", {"weather": loose}, approval=True)
            return [loose]

        @self.durable()
        def strict(run: longrun.Run) -> list:
            answer = run.call("strict", model, f"news at {stamps['now']}")
            run.effect("note", "note.write", {"news": answer}, approval=True)
            return [answer]

        self.assertEqual(agent.run("loose-1").status, Status.AWAITING_APPROVAL)
        self.assertEqual(strict.run("strict-1").status, Status.AWAITING_APPROVAL)
        recorded = self.state("strict-1").effects["strict"].payload_digest
        stamps["now"] = "10:00"
        self.assertEqual(agent.run("loose-1").status, Status.AWAITING_APPROVAL, "by-id: the recorded answer is replayed")
        self.assertEqual(self.model.calls, Counter({"weather at 09:00": 1, "news at 09:00": 1}))
        mismatch = strict.run("strict-1")
        self.assertEqual(mismatch.status, Status.PLAN_MISMATCH)
        self.assertIn(recorded, self.details(mismatch))
        self.assertIn("'strict'", self.details(mismatch))
        self.assertEqual(self.model.calls["news at 10:00"], 0)
        self.approve("loose-1", "note")
        self.assertEqual(agent.run("loose-1").result, ["answer to weather at 09:00"])

    def test_a_short_sleep_waits_on_the_clock_and_is_not_repeated(self) -> None:
        @self.durable()
        def agent(run: longrun.Run) -> None:
            run.sleep("nap", 5)
            run.effect("mail", "mail.send", {}, approval=True)

        start = self.clock.now()
        self.assertEqual(agent.run("agent-1").status, Status.AWAITING_APPROVAL)
        self.assertEqual(self.clock.sleeps, [5.0])
        self.assertEqual(self.clock.now(), start + 5)
        self.assertEqual(self.state("agent-1").effects["nap"].state, EffectState.VERIFIED)
        self.assertEqual(agent.run("agent-1").status, Status.AWAITING_APPROVAL)
        self.assertEqual(self.clock.sleeps, [5.0], "a verified sleep is not slept again")

    def test_a_short_sleep_interrupted_keeps_the_wake_time_it_recorded_first(self) -> None:
        class InterruptedClock(FakeClock):
            interrupt = True

            def sleep(self, seconds: float) -> None:
                if self.interrupt:  # the process stops half way through the wait
                    self.interrupt = False
                    self.advance(seconds / 2)
                    raise KeyboardInterrupt
                super().sleep(seconds)

        clock = InterruptedClock()
        start = clock.now()

        @self.durable(clock=clock)
        def agent(run: longrun.Run) -> float:
            run.sleep("nap", 30)
            return clock.now()

        with self.assertRaises(KeyboardInterrupt):
            agent.run("agent-1")
        outcome = agent.run("agent-1")
        self.assertEqual(outcome.status, Status.DONE)
        self.assertEqual(clock.sleeps, [15.0], "only what was left of the first wait")
        self.assertEqual(outcome.result, start + 30)

    def test_observe_first_verifies_an_effect_already_at_the_target_without_applying(self) -> None:
        # An earlier system already sent this mail: the target holds its line.
        self.outbox.apply(
            EffectRequest(
                task_id="agent-1", step_id="mail", action="mail.send", key="agent-1/mail",
                payload={"to": "x"}, payload_digest=digest_of({"to": "x"}),
                attempt=1, epoch=0, deadline=self.clock.now() + 60,
            )
        )

        @self.durable()
        def agent(run: longrun.Run) -> Any:
            sent = run.effect("mail", "mail.send", {"to": "x"}, observe_first=True)
            fresh = run.effect("other", "mail.send", {"to": "y"}, observe_first=True)
            return [sent, fresh]

        outcome = agent.run("agent-1")
        self.assertEqual(outcome.status, Status.DONE)
        self.assertEqual(self.outbox.calls, Counter({"agent-1/mail": 1, "agent-1/other": 1}), "mail: only the earlier apply")
        self.assertEqual(self.outbox.counts(), Counter({"agent-1/mail": 1, "agent-1/other": 1}))
        self.assertEqual(outcome.result, [{"line": 0}, {"line": 1}])
        state = self.state("agent-1")
        self.assertEqual(state.effects["mail"].attempts, 0, "verified by observation, never applied")
        self.assertEqual(state.effects["other"].attempts, 1)

    def test_an_unknown_action_is_an_error_in_the_function(self) -> None:
        @self.durable()
        def agent(run: longrun.Run) -> None:
            run.effect("s", "fax.send", {})

        with self.assertRaises(longrun.UnknownActionError):
            agent.run("agent-1")

    def test_a_durable_function_must_be_given_to_child(self) -> None:
        @self.durable()
        def agent(run: longrun.Run) -> None:
            run.child("child-1", lambda run: None)  # type: ignore[arg-type]

        with self.assertRaises(InvalidInputError):
            agent.run("agent-1")


if __name__ == "__main__":
    unittest.main()
