"""``MODULE:FUNCTION`` targets for ``longrun resume`` in the CLI tests (``tests/test_cli_ops.py``).

Each function builds a ``Runner`` the way a user's cron target would. Where they keep their store
and outbox comes from the environment: ``LONGRUN_CLI_ROOT`` (a directory holding ``store/`` and
``outbox.jsonl``) and, if set, ``LONGRUN_CLI_STORE`` (a store spec for ``open_store``). Times come
from a ``FakeClock``, so nothing here waits.
"""

from __future__ import annotations

import os

from longrun import Limits, RunContract, Runner, Step
from longrun.stores import JsonFileStore, open_store
from longrun.testing import FakeClock, OutboxAdapter

ROOT_ENV = "LONGRUN_CLI_ROOT"
STORE_ENV = "LONGRUN_CLI_STORE"
START = 1_700_000_000.0
LATER = START + 3600.0
"""A resumed run's clock: past every lease the earlier (killed) run can have held."""


def _root() -> str:
    return os.environ[ROOT_ENV]


def outbox_path() -> str:
    return os.path.join(_root(), "outbox.jsonl")


def _store():
    spec = os.environ.get(STORE_ENV)
    return open_store(spec) if spec else JsonFileStore(os.path.join(_root(), "store"), create=True)


def _runner(task_id: str, steps: list[Step], adapter: OutboxAdapter | None = None, *, start: float = START, **options) -> Runner:
    return Runner(
        RunContract(task_id, goal="exercise longrun resume"),
        steps,
        store=_store(),
        adapters={"send": adapter if adapter is not None else OutboxAdapter(outbox_path())},
        clock=FakeClock(start),
        **options,
    )


def three_steps() -> list[Step]:
    return [Step("one", "send", {"n": 1}), Step("two", "send", {"n": 2}), Step("three", "send", {"n": 3})]


def finished() -> Runner:
    """Runs to done."""
    return _runner("nightly", three_steps())


def gated() -> Runner:
    """Stops awaiting approval of 'publish' until someone approves it."""
    steps = [Step("draft", "send", {"text": "hello"}), Step("publish", "send", {"channel": "everyone"}, approval=True)]
    return _runner("gated", steps)


def crash_once() -> Runner:
    """The first call's runner SIGKILLs its own process right after step 'two' reaches the outbox;
    later calls run normally, on a clock an hour later so the dead runner's lease has expired."""
    marker = os.path.join(_root(), "crashed-once")
    if not os.path.exists(marker):
        with open(marker, "w"):
            pass
        return _runner("crashy", three_steps(), OutboxAdapter(outbox_path(), kill_after_apply={"two"}))
    return _runner("crashy", three_steps(), start=LATER)


def retry_later() -> Runner:
    """The target is busy once; the backoff is longer than the runner may block: retry-scheduled."""
    adapter = OutboxAdapter(outbox_path(), fail_transient=1)
    return _runner("flaky", [Step("one", "send", {"n": 1})], adapter, limits=Limits(max_block_s=0))


def blocked() -> Runner:
    """The target refuses for good: blocked, a terminal stop."""
    return _runner("refused", [Step("one", "send", {"n": 1})], OutboxAdapter(outbox_path(), fail_permanent=True))


def bad_payload() -> Runner:
    """A payload factory that returns a list: ``run()`` raises InvalidInputError."""
    return _runner("bad-payload", [Step("one", "send", lambda results: [1, 2])])  # type: ignore[arg-type, return-value]


def surrogate_payload() -> Runner:
    """A payload factory that lists a file name that is not UTF-8 (as ``os.listdir`` gives it):
    ``run()`` raises InvalidInputError naming the step and the path to the name."""
    return _runner("surrogate", [Step("one", "send", lambda results: {"files": ["ok.txt", "caf\udce9.txt"]})])


def payload_bug() -> Runner:
    """A payload factory with a bug: ``run()`` raises ZeroDivisionError, which is not longrun's."""
    return _runner("payload-bug", [Step("one", "send", lambda results: {"ratio": 1 / 0})])


def not_a_runner() -> int:
    return 42


def raises() -> Runner:
    raise RuntimeError("the task's configuration is missing")


def needs_an_argument(name: str) -> Runner:
    return _runner(name, three_steps())


NOT_CALLABLE = "a string, not a function"
