"""``longrun resume``: the recovery trigger a cron job or systemd timer calls; ``longrun start``.

``longrun resume STORE TASK`` resumes a durable-function task: the task records the function
(``module:qualname``) and its arguments, so nothing else needs saying. ``longrun start
MODULE:FUNCTION TASK --args JSON`` records one for a worker to run (the same arguments again change
nothing; others are refused); with ``--run`` it runs the task once here instead.

Imports ``MODULE`` (with the ``--path`` directories, then the current directory, put in front of
``sys.path``), calls ``FUNCTION()`` with no arguments, which must return a ``longrun.runner.Runner``
(built with its store, adapters, limits, sources: everything the task needs), calls ``run()``
once and prints the ``RunOutcome``. The same call starts a task, resumes it after a crash, and
continues it after an approval or a backoff; a run that another process holds returns
``already-running`` and changes nothing, so an overlapping timer is harmless.

Exit codes (the status decides; a cron wrapper can tell each group apart):

====  =========================================================================================
code  meaning
====  =========================================================================================
0     done: every required effect is verified
1     not finished; a later run, or an operator and then a later run, continues it:
      awaiting-approval, retry-scheduled, already-running, lease-lost, unsafe-to-continue,
      plan-mismatch, state-unrecoverable (the outcome's next action says which)
2     the target is wrong: bad MODULE:FUNCTION syntax, the module cannot be imported (or raised
      while importing), no such function, the function raised or did not return a Runner; or the
      library refused an input (``InvalidInputError``, such as a payload that is not JSON)
3     a storage error or damaged state raised by the store (``StorageError``, ``CorruptStateError``)
4     the run ended without finishing: cancelled, limits-exhausted, deadline-exceeded, blocked, failed (running it
      again changes nothing; stop the timer)
70    ``run()`` raised an exception that is not longrun's (the task's own payload code, or a bug
      in longrun): the traceback is printed. A durable function whose code raised had the error
      recorded in its state instead: ``resume STORE TASK`` and ``start --run`` report that outcome
      (``retry-scheduled``, exit 1, or ``failed``, exit 4, with its ``last_failure``; the recorded
      traceback on stderr)
====  =========================================================================================

Not guaranteed: isolation from the target module. It runs in this process with this process's
privileges; ``resume`` is as trustworthy as the module it is pointed at.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
import sys
import traceback
from typing import Any, Callable, Sequence, TextIO

from ..canonical import parse_json
from ..engine import utc
from ..errors import CorruptStateError, LongrunError, PayloadError, describe_exception
from ..ledger import VerifiedResults
from ..outcome import ENDED_UNFINISHED, RunOutcome, Status
from ._common import (
    CliError, ExitCode, TaskCodeError, checked_task, close_store, evidence_line, name_store, open_store, store_label, write_json,
)  # fmt: skip

__all__ = ["STATUS_EXIT", "cmd_resume", "cmd_resume_task", "cmd_start", "load_target", "recorded_function", "run_recorded_once"]

STATUS_EXIT: dict[Status, ExitCode] = {Status.DONE: ExitCode.OK, **dict.fromkeys(ENDED_UNFINISHED, ExitCode.ENDED)}
"""Every status not listed exits ``ExitCode.NOT_AS_ASKED`` (1): a later run continues it."""

_MODULE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
_TARGET = re.compile(r"(?P<module>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):(?P<function>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")


def _usage(message: str) -> CliError:
    return CliError(message, ExitCode.USAGE)


def _explain(exc: BaseException) -> str:
    return describe_exception(exc)


def load_target(target: str, paths: Sequence[str], err: TextIO, verbose: bool, *, runner_factory: bool = True) -> Any:
    """The function ``target`` names, imported with ``paths`` and the current directory searched first."""
    match = _TARGET.fullmatch(target)
    if match is None:
        raise _usage(f"{target!r} is not MODULE:FUNCTION (for example mytasks.nightly:build_runner)")
    module_name = match.group("module")
    module = import_module(module_name, paths, err, verbose)
    value: object = module
    for part in match.group("function").split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise _usage(f"module {module_name!r} has no attribute {match.group('function')!r}") from None
    if runner_factory and not callable(value):
        raise _usage(f"{target} is a {type(value).__name__}, not a function that returns a Runner")
    return value


def import_module(module_name: str, paths: Sequence[str], err: TextIO, verbose: bool) -> Any:
    """Import ``module_name`` with ``paths`` and the current directory searched first; exit 2 if it fails."""
    if not _MODULE.fullmatch(module_name):
        raise _usage(f"{module_name!r} is not a module name (for example mytasks.agents)")
    for path in paths:
        if not os.path.isdir(path):
            raise _usage(f"--path {path!r} is not an existing directory")
    for entry in reversed([*(os.path.abspath(path) for path in paths), os.getcwd()]):
        if entry in sys.path:
            sys.path.remove(entry)
        sys.path.insert(0, entry)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise _usage(
                f"cannot import module {module_name!r}: no module named {missing!r} "
                "(searched --path, the current directory and sys.path)"
            ) from None
        _trace(err, verbose)
        raise _usage(f"cannot import module {module_name!r}: {_explain(exc)}") from None
    except Exception as exc:  # the module's own code failed while importing (SyntaxError included)
        _trace(err, verbose)
        raise _usage(f"importing module {module_name!r} raised {_explain(exc)}" + ("" if verbose else " (-v shows the traceback)")) from None
    return module


def _trace(err: TextIO, verbose: bool) -> None:
    if verbose:
        traceback.print_exc(file=err)


def _build_runner(function: Callable[[], object], target: str, err: TextIO, verbose: bool) -> object:
    from ..runner import Runner  # the CLI imports the runner only for commands that run tasks

    try:
        runner = function()
    except (LongrunError, OSError):
        raise  # the library's own refusals keep their exit codes (InvalidInputError 2, StorageError 3)
    except TypeError as exc:
        _trace(err, verbose)
        raise _usage(f"calling {target}() failed: {_explain(exc)} (it must take no arguments and return a Runner)") from None
    except Exception as exc:
        _trace(err, verbose)
        raise _usage(f"calling {target}() raised {_explain(exc)}" + ("" if verbose else " (-v shows the traceback)")) from None
    if not isinstance(runner, Runner):
        raise _usage(f"{target}() returned {type(runner).__name__}, not a longrun.runner.Runner")
    return runner


def _render(outcome: RunOutcome, code: ExitCode) -> str:
    lines = [
        f"task {outcome.task_id}: {outcome.status.value} (revision {outcome.revision}, lease epoch {outcome.epoch})",
        f"  next action   {outcome.next_action}",
    ]
    if outcome.results:
        lines.append(f"  results       {len(outcome.results)} verified effects: {', '.join(outcome.results)}")
    else:
        lines.append("  results       no verified effects yet")
    if outcome.result is not None:
        lines.append(f"  result        {json.dumps(outcome.result, sort_keys=True)[:2000]}")
    if outcome.wake_at is not None:
        lines.append(f"  wake at       {utc(outcome.wake_at)}")
    if outcome.last_failure is not None:
        lines.append(f"  last error    {outcome.last_failure.summary()}")
    lines.append(
        f"  evidence      {len(outcome.observations)} observations, {len(outcome.inferences)} inferences, "
        f"{len(outcome.unknowns)} unknowns"
    )
    lines += [f"    unknown: {evidence_line(item)}" for item in outcome.unknowns]
    lines.append(f"  exit {int(code)}")
    return "\n".join(lines) + "\n"


def cmd_resume(target: str, paths: Sequence[str], as_json: bool, out: TextIO, err: TextIO, verbose: bool = False) -> int:
    function = load_target(target, paths, err, verbose)
    runner = _build_runner(function, target, err, verbose)
    try:
        outcome = runner.run()  # type: ignore[attr-defined]
    except PayloadError as exc:  # the task's own payload code raised: its cause is the real error
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        raise TaskCodeError(f"{target}: run() raised {_explain(cause)} in a payload factory") from cause
    except (LongrunError, OSError, KeyboardInterrupt):
        raise
    except Exception as exc:
        raise TaskCodeError(f"{target}: run() raised {_explain(exc)}") from exc
    return _report(outcome, as_json, out)


def _report(outcome: RunOutcome, as_json: bool, out: TextIO, label: str | None = None) -> int:
    """Print the outcome (text or JSON) and return the exit code its status maps to; ``label``, when
    the command line named the store, takes the place of ``<store>`` in the next action."""
    code = STATUS_EXIT.get(outcome.status, ExitCode.NOT_AS_ASKED)
    if label is not None:
        outcome = dataclasses.replace(outcome, next_action=name_store(outcome.next_action, label))
    if as_json:
        write_json(out, outcome.to_json())
    else:
        out.write(_render(outcome, code))
    return code


def _durable_target(target: str, paths: Sequence[str], err: TextIO, verbose: bool) -> Any:
    from ..functions import DurableFunction  # imports the engine: only for commands that run tasks

    function = load_target(target, paths, err, verbose, runner_factory=False)
    if not isinstance(function, DurableFunction):
        raise _usage(f"{target} is a {type(function).__name__}, not a @longrun.durable function")
    return function


def _run_durable(
    function: Any, task_id: str, args: list[Any], kwargs: dict[str, Any], as_json: bool, out: TextIO, label: str | None = None,
    err: TextIO | None = None,
) -> int:
    name = function.name
    try:
        outcome = function.run(task_id, *args, **kwargs)
    except (LongrunError, OSError, KeyboardInterrupt):
        raise
    except Exception as exc:
        recorded = _recorded_failure(function, task_id)
        if recorded is None:
            raise TaskCodeError(f"{name}: the function raised {_explain(exc)}") from exc
        if not as_json and recorded.last_failure is not None and err is not None:
            err.write(recorded.last_failure.traceback)
        outcome = recorded
    return _report(outcome, as_json, out, label)


def _recorded_failure(function: Any, task_id: str) -> RunOutcome | None:
    """The outcome a run whose function raised recorded (``retry-scheduled`` or ``failed`` with its
    ``last_failure``, in its latest commit), read back from the store; None if it recorded none."""
    store = function.engine_options.get("store")
    try:
        state = store.load(task_id).state if store is not None else None
    except LongrunError:
        return None
    failure = state.last_failure if state is not None else None
    if state is None or failure is None or failure.revision != state.revision or state.status not in (Status.RETRY_SCHEDULED, Status.FAILED):
        return None
    return RunOutcome(
        status=state.status, next_action=state.next_action, task_id=task_id, results=VerifiedResults(state.effects).copy(),
        revision=state.revision, epoch=failure.epoch, wake_at=failure.retry_at, last_failure=failure,
    )  # fmt: skip


def _json_argument(text: str, option: str, kind: type) -> Any:
    try:
        value = parse_json(text, what=option, max_bytes=1024 * 1024)
    except CorruptStateError as exc:  # its message names the option and says what is wrong: said once
        raise _usage(str(exc)) from None
    if not isinstance(value, kind):
        raise _usage(f"{option} must be a JSON {'array' if kind is list else 'object'}, got {type(value).__name__}")
    return value


def cmd_start(
    target: str, task_id: str, args_json: str, kwargs_json: str, paths: Sequence[str], as_json: bool,
    out: TextIO, err: TextIO, verbose: bool = False, *, run: bool = False, priority: int = 0,
) -> int:  # fmt: skip
    """``longrun start MODULE:FUNCTION TASK --args JSON``: record a durable function's task for a
    worker to run (``fn.enqueue``); with ``run``, run it once here instead, as ``resume`` would."""
    checked_task(task_id)
    args = _json_argument(args_json, "--args", list)
    kwargs = _json_argument(kwargs_json, "--kwargs", dict)
    function = _durable_target(target, paths, err, verbose)
    if run:
        return _run_durable(function, task_id, args, kwargs, as_json, out, err=err)
    created = function.enqueue(task_id, args, kwargs, priority=priority)
    if as_json:
        write_json(out, {"task_id": task_id, "function": function.name, "created": created, "priority": priority})
    else:
        what = "recorded" if created else "already recorded with these arguments"
        out.write(
            f"task {task_id}: {what} ({function.name}, priority {priority}); a worker runs it "
            "(`longrun worker STORE --import MODULE`), or `longrun resume STORE TASK`\n"
        )
    return ExitCode.OK


def run_recorded_once(store: Any, label: str, task_id: str, paths: Sequence[str], err: TextIO) -> RunOutcome:
    """Run a durable function's task once against ``store`` (not the store the function was decorated
    with), with the arguments it records: the console's "run once". The function's module is imported
    from ``paths`` and the current directory; its own exception is a ``TaskCodeError``."""
    function, args, kwargs = recorded_function(store, label, task_id, paths, err, False)
    try:
        outcome: RunOutcome = function.with_options(store=store).run(task_id, *args, **kwargs)
    except (LongrunError, OSError, KeyboardInterrupt):
        raise
    except Exception as exc:
        raise TaskCodeError(f"{function.name}: the function raised {_explain(exc)}") from exc
    return outcome


def cmd_resume_task(
    spec: str, task_id: str, paths: Sequence[str], as_json: bool, out: TextIO, err: TextIO, verbose: bool = False,
    *, reopen: dict[str, Any] | None = None,
) -> int:  # fmt: skip
    """``longrun resume STORE TASK``: run the durable function the task records, with its arguments,
    on STORE (not on the store the function was decorated with). With ``reopen`` (the keywords of
    ``_intervene.write_reopen``), write the reopen record first: ``resume --reopen``."""
    checked_task(task_id)
    store = open_store(spec)
    try:
        function, args, kwargs = recorded_function(store, spec, task_id, paths, err, verbose)
        if reopen is not None:
            from ._intervene import write_reopen

            write_reopen(store, task_id, err=err, as_json=as_json, **reopen)
        return _run_durable(function.with_options(store=store), task_id, args, kwargs, as_json, out, store_label(spec), err)
    finally:
        close_store(store)


def recorded_function(
    store: Any, spec: str, task_id: str, paths: Sequence[str], err: TextIO, verbose: bool
) -> tuple[Any, list[Any], dict[str, Any]]:
    """The durable function ``task_id`` records (imported), and the arguments it records."""
    from ..functions import FUNCTION_STEP
    from ..session import CONTRACT_STEP

    loaded = store.load(task_id)
    record = loaded.state.effects.get(FUNCTION_STEP) if loaded.state is not None else None
    if loaded.state is not None and record is None and CONTRACT_STEP in loaded.state.effects:
        raise CliError(
            f"task {task_id!r} is a checkpointed session: `longrun next {spec} {task_id}` says what to do next",
            ExitCode.USAGE,
        )
    if loaded.state is None or record is None or not isinstance(record.payload, dict):
        raise CliError(
            f"task {task_id!r} records no durable function (it has no state yet, or runs a declared plan: "
            "resume it with `longrun resume MODULE:FUNCTION`)",
            ExitCode.USAGE,
        )
    name, args, kwargs = record.payload.get("function"), record.payload.get("args"), record.payload.get("kwargs")
    if not isinstance(name, str) or not isinstance(args, list) or not isinstance(kwargs, dict):
        raise CliError(f"task {task_id!r}: its function record is malformed", ExitCode.STORAGE)
    return _durable_target(name, paths, err, verbose), args, kwargs
