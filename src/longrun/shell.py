"""Commands as effects: the adapters a checkpointed session (``longrun exec``, ``longrun checkpoint``) runs through.

``CommandAdapter`` makes one shell command an effect. Its payload is ``{"command": [argv...],
"cwd": DIR, "timeout_s": S, "observe": CMD or null, ...}``; ``apply`` runs the command there (in a
process group of its own, stdin closed, with ``LONGRUN_TASK``, ``LONGRUN_STEP``, ``LONGRUN_KEY``,
``LONGRUN_ATTEMPT``, ``LONGRUN_EPOCH`` and ``LONGRUN_PAYLOAD_DIGEST`` in its environment, so a
target can deduplicate by key and fence by epoch) and returns the exit status and the SHA-256 of
its stdout and stderr as the receipt. ``observe`` runs the observe command (``sh -c CMD``): exit 0
means applied, 1 absent, anything else unknown.

How an outcome is classified:

- exit 0: a receipt; the engine then observes. With no observe command, the exit status seen by
  this process is the only evidence, and it is what the observation reports (``applied``, saying
  the target itself was not checked).
- a non-zero exit with an observe command: outcome unknown until observed (applied is verified,
  absent may be tried again, unknown stops ``unsafe-to-continue``). Without one: the command's word
  that it did not take effect (``TransientError``): the step may be tried again after the retry
  delay, within the attempt budget.
- the command could not be started: ``TransientError``.
- a timeout: the whole process group is killed and the outcome is unknown (observed, never guessed).
- an interruption (the runner killed, Ctrl-C): the ledger still says ``started``; the next run
  observes. With no observe command that is ``unknown``, and the task stops ``unsafe-to-continue``.

Every process a command starts carries ``LONGRUN_COMMAND_OF=<key>#<attempt>`` in its environment.
Before it runs the observe command, ``observe`` looks for live processes carrying the effect's key
(Linux, ``/proc``): a command of an earlier attempt that outlived the runner that started it (its
runner was killed alone) makes the observation ``unknown`` while it runs, never ``absent``.

``CheckpointAdapter`` records a checkpoint's evidence (a file's digest or a note); it has no
target, so what it observes is only what this process recorded.

Not guaranteed: that a command stops when its runner dies (it runs in its own process group so that
a timeout can kill all of it; a kill of the runner alone leaves it running, and the process scan
that notices it needs ``/proc`` and an environment the command did not clear), or that an observe
command tells the truth: it is the only evidence the ledger has.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import subprocess
import threading
import time
from typing import IO, Callable, Mapping

from .adapters import EffectRequest, Observation, Receipt
from .canonical import JSONValue
from .errors import TransientError

__all__ = [
    "COMMAND_MARKER",
    "CheckpointAdapter",
    "CommandAdapter",
    "CommandFailed",
    "CommandInterrupted",
    "OutputSink",
    "describe_evidence",
    "running_commands",
]

log = logging.getLogger("longrun")

COMMAND_MARKER = "LONGRUN_COMMAND_OF"
"""The environment variable every process of a command carries: ``<effect key>#<attempt>``."""

OutputSink = Callable[[bytes], None]
"""Where a command's output goes as it arrives (the terminal, for ``longrun exec``)."""

_CHUNK = 64 * 1024
_DRAIN_S = 5.0
"""How long to read a command's output after it exited (a background process may hold it open)."""


class CommandFailed(Exception):
    """The command exited non-zero and an observe command will say whether it took effect."""


class CommandInterrupted(Exception):
    """The command did not end by itself (a timeout): what it did is unknown until observed."""


def running_commands(key: str, *, attempt: int | None = None) -> list[int]:
    """Pids of live processes started for effect ``key`` (of one ``attempt``, or of any), via ``/proc``.

    Empty where there is no ``/proc``. Zombies (their environment is gone) are not counted.
    """
    needle = f"{COMMAND_MARKER}={key}#{'' if attempt is None else attempt}".encode()
    exact = attempt is not None
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    me = os.getpid()
    found: list[int] = []
    for name in entries:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                environment = handle.read()
        except OSError:
            continue
        for item in environment.split(b"\0"):
            if item == needle if exact else item.startswith(needle):
                found.append(int(name))
                break
    return found


def _payload(request: EffectRequest) -> Mapping[str, JSONValue]:
    payload = request.payload
    return payload if isinstance(payload, dict) else {}


def _environment(request: EffectRequest, *, marked: bool) -> dict[str, str]:
    environment = dict(os.environ)
    environment.update(
        LONGRUN_TASK=request.task_id,
        LONGRUN_STEP=request.step_id,
        LONGRUN_KEY=request.key,
        LONGRUN_ATTEMPT=str(request.attempt),
        LONGRUN_EPOCH=str(request.epoch),
        LONGRUN_PAYLOAD_DIGEST=request.payload_digest,
    )
    if marked:
        environment[COMMAND_MARKER] = f"{request.key}#{request.attempt}"
    else:
        environment.pop(COMMAND_MARKER, None)
    return environment


class _Stream:
    """Reads one of a command's pipes to its end: hashes and counts it, and passes it on."""

    def __init__(self, pipe: IO[bytes], sink: OutputSink | None):
        self.digest = hashlib.sha256()
        self.size = 0
        self._pipe = pipe
        self._sink = sink
        self._thread = threading.Thread(target=self._read, name="longrun-output", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while True:
            chunk = os.read(self._pipe.fileno(), _CHUNK)
            if not chunk:
                self._pipe.close()
                return
            self.digest.update(chunk)
            self.size += len(chunk)
            if self._sink is not None:
                try:
                    self._sink(chunk)
                except (OSError, ValueError):  # the terminal went away: keep hashing, stop passing on
                    self._sink = None

    def finish(self, deadline: float) -> bool:
        """Wait for the end of the output until ``deadline`` (monotonic); False if it is still open."""
        self._thread.join(max(0.0, deadline - time.monotonic()))
        return not self._thread.is_alive()

    def summary(self) -> dict[str, JSONValue]:
        return {"sha256": "sha256:" + self.digest.hexdigest(), "bytes": self.size}


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError:  # not our group after all (it exited and the id was reused): the child only
        process.kill()


class CommandAdapter:
    """Runs an exec step's command (``apply``) and its observe command (``observe``); see the module docstring.

    ``observe`` and ``timeouts`` override, for this process, the observe command and timeout a step's
    payload recorded (``longrun exec --observe`` given after a crash, say). ``stdout`` and ``stderr``
    receive the command's output as it arrives.
    """

    deduplicates = False

    def __init__(
        self,
        *,
        stdout: OutputSink | None = None,
        stderr: OutputSink | None = None,
        observe: Mapping[str, str] | None = None,
        timeouts: Mapping[str, float] | None = None,
        observe_timeout_s: float = 60.0,
    ):
        self._stdout = stdout
        self._stderr = stderr
        self._observe = dict(observe or {})
        self._timeouts = dict(timeouts or {})
        self._observe_timeout_s = observe_timeout_s
        self._exited: dict[tuple[str, int], dict[str, JSONValue]] = {}
        """Results of commands that exited 0 in this process, by (effect key, attempt)."""

    def observe_command(self, request: EffectRequest) -> str | None:
        command = self._observe.get(request.step_id, _payload(request).get("observe"))
        return command if isinstance(command, str) and command else None

    def apply(self, request: EffectRequest) -> Receipt:
        payload = _payload(request)
        argv = payload.get("command")
        cwd = payload.get("cwd")
        if not isinstance(argv, list) or not argv or not all(isinstance(item, str) for item in argv):
            raise TransientError(f"the recorded command of {request.key!r} is not an argv: {argv!r}")
        command = [str(item) for item in argv]
        recorded_timeout = payload.get("timeout_s")
        timeout = self._timeouts.get(request.step_id, recorded_timeout if isinstance(recorded_timeout, (int, float)) else None)
        started = time.monotonic()
        try:
            process = subprocess.Popen(
                command,
                cwd=cwd if isinstance(cwd, str) else None,
                env=_environment(request, marked=True),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                process_group=0,
            )
        except (OSError, ValueError) as exc:  # refused before anything was started (ValueError: a NUL byte), so nothing took effect
            raise TransientError(f"could not start {command[0]!r}: {getattr(exc, 'strerror', None) or exc}") from exc
        assert process.stdout is not None and process.stderr is not None
        out, err = _Stream(process.stdout, self._stdout), _Stream(process.stderr, self._stderr)
        try:
            status = process.wait(timeout=float(timeout) if timeout is not None else None)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            process.wait()
            for pid in running_commands(request.key, attempt=request.attempt):  # those that left the group
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            raise CommandInterrupted(f"the command ran longer than its timeout of {timeout:g}s and was killed") from None
        except BaseException:
            _kill_group(process)  # interrupted here (Ctrl-C): the ledger says started; the next run observes
            process.wait()
            raise
        deadline = time.monotonic() + _DRAIN_S
        complete = out.finish(deadline)
        complete = err.finish(deadline) and complete
        result: dict[str, JSONValue] = {
            "exit_status": status,
            "stdout": out.summary(),
            "stderr": err.summary(),
            "seconds": round(time.monotonic() - started, 3),
        }
        if not complete:
            result["output_open"] = True  # a background process holds the output: digests cover what came so far
        evidence = _describe(result)
        if status == 0:
            self._exited[(request.key, request.attempt)] = result
            return Receipt(result=result, evidence=evidence)
        if self.observe_command(request) is not None:
            raise CommandFailed(f"{evidence}; the observe command decides whether it took effect")
        raise TransientError(f"{evidence}; with no observe command its exit status says it did not take effect")

    def observe(self, request: EffectRequest) -> Observation:
        command = self.observe_command(request)
        if command is None:
            result = self._exited.get((request.key, request.attempt))
            if result is not None:
                return Observation.applied(
                    f"the command exited 0 in this process ({_describe(result)}); no observe command, so the target itself was not checked",
                    result,
                )
            return Observation.unknown("no observe command: nothing can say whether the command took effect")
        running = running_commands(request.key)
        if running:
            return Observation.unknown(
                f"a command started for {request.key} is still running (pid {', '.join(map(str, running))}); "
                "observe again once it has ended"
            )
        payload = _payload(request)
        cwd = payload.get("cwd")
        try:
            process = subprocess.Popen(
                ["sh", "-c", command],
                cwd=cwd if isinstance(cwd, str) else None,
                env=_environment(request, marked=False),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                process_group=0,
            )
        except (OSError, ValueError) as exc:
            return Observation.unknown(f"could not start the observe command: {getattr(exc, 'strerror', None) or exc}")
        assert process.stderr is not None
        err = _Stream(process.stderr, self._stderr)
        try:
            status = process.wait(timeout=self._observe_timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            process.wait()
            return Observation.unknown(f"the observe command `{command}` ran longer than {self._observe_timeout_s:g}s and was killed")
        except BaseException:
            _kill_group(process)
            process.wait()
            raise
        err.finish(time.monotonic() + _DRAIN_S)
        if status == 0:
            return Observation.applied(f"the observe command `{command}` exited 0")
        if status == 1:
            return Observation.absent(f"the observe command `{command}` exited 1")
        return Observation.unknown(f"the observe command `{command}` exited {status} (0 means applied, 1 absent)")


def _describe(result: Mapping[str, JSONValue]) -> str:
    status = result.get("exit_status")
    said = f"killed by signal {-status}" if isinstance(status, int) and status < 0 else f"exit status {status}"
    parts = [said]
    for name in ("stdout", "stderr"):
        stream = result.get(name)
        if isinstance(stream, dict):
            parts.append(f"{name} {stream.get('sha256')} ({stream.get('bytes')} bytes)")
    return "; ".join(parts)


class CheckpointAdapter:
    """Records a checkpoint's evidence. There is no target: ``observe`` reports what this process recorded."""

    deduplicates = False

    def __init__(self) -> None:
        self._recorded: dict[str, JSONValue] = {}

    def apply(self, request: EffectRequest) -> Receipt:
        evidence = _payload(request).get("evidence")
        self._recorded[request.key] = evidence
        return Receipt(result=evidence, evidence=f"checkpoint recorded: {describe_evidence(evidence)}")

    def observe(self, request: EffectRequest) -> Observation:
        if request.key in self._recorded:
            return Observation.applied("recorded by this process", self._recorded[request.key])
        return Observation.absent("not recorded by this process (a checkpoint has no target to look at)")


def describe_evidence(evidence: JSONValue) -> str:
    """A checkpoint's evidence in a few words: the file and its digest, or the note."""
    if isinstance(evidence, dict):
        if evidence.get("kind") == "file":
            return f"file {evidence.get('path')} {evidence.get('sha256')} ({evidence.get('bytes')} bytes)"
        note = str(evidence.get("text", ""))
        return f"note {note[:117] + '...' if len(note) > 120 else note!r}"
    return repr(evidence)
