"""``run_longrun``: ``python -m longrun ARGS`` in a child process, as ``subprocess.run`` would run it,
for a fraction of the cost; ``run_script``: ``python SCRIPT ARGS`` the same way, for the test programs
in ``helpers``.

The tests run hundreds of commands. Each in a fresh interpreter pays its start and
``import longrun`` (most of a short command's time); here a fork server (``cli_child.py``),
started on first use and kept for the test run, has imported longrun once and forks one child per
command, which makes itself the process ``python -m longrun ARGS`` would be (its cwd, environment,
``sys.path``, standard streams and crash points) before it runs the command (see ``cli_child.py``).
It is still a process of its own: file locks, exit codes, signals and SIGKILL behave as they do for
a command started from a shell. Two differences from ``subprocess.run``: standard input is empty
when no ``input`` is given (not the test runner's own), and the output is what the command wrote
before it exited (a process it left running does not hold the capture open).

A command whose start the server cannot reproduce is run by ``subprocess.run`` instead: an
environment that changes how the interpreter starts (``PYTHON*`` other than a ``PYTHONPATH`` that
begins with ``src``, locale, ``HOME``), a call from a second thread while one is running, or a
platform without ``fork``.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from typing import IO, Any

from . import SRC
from .support import HELPERS, ROOT, child_env

SERVER = os.path.join(HELPERS, "cli_child.py")

_ENCODING = io.TextIOWrapper(io.BytesIO(), encoding="locale").encoding
"""The encoding ``subprocess.run(..., text=True)`` reads and writes a child's streams with."""


def _startup(env: dict[str, str]) -> dict[str, str]:
    """The variables that change how an interpreter starts (PYTHONPATH apart)."""
    return {
        key: value for key, value in env.items()
        if (key.startswith(("PYTHON", "LC_")) or key in ("LANG", "LANGUAGE", "HOME")) and key != "PYTHONPATH"
    }  # fmt: skip


def _python_path(env: dict[str, str], cwd: str) -> list[str] | None:
    """The entries ``PYTHONPATH`` puts on ``sys.path`` when an interpreter starts in ``cwd`` (``site``
    makes them absolute), if the server can reproduce them: ``src`` comes first (the server's
    longrun is the one from ``src``)."""
    entries = [os.path.normpath(os.path.join(cwd, entry)) for entry in env.get("PYTHONPATH", "").split(os.pathsep)]
    return entries if entries[0] == SRC else None


def _text(data: str) -> str:
    """Output bytes (sent as Latin-1) decoded as ``subprocess.run(..., text=True)`` decodes them."""
    return data.encode("latin-1").decode(_ENCODING).replace("\r\n", "\n").replace("\r", "\n")


class _Server:
    """The test run's side of ``cli_child.py``: one request at a time."""

    def __init__(self) -> None:
        self.env = {key: value for key, value in child_env().items() if not key.startswith("LONGRUN_")}
        self.env["PYTHONPATH"] = SRC
        self._errors = tempfile.TemporaryFile()
        self._process = subprocess.Popen(
            [sys.executable, SERVER], env=self.env, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._errors,
        )  # fmt: skip

    def alive(self) -> bool:
        return self._process.poll() is None

    def kill(self) -> None:
        """After a request that did not end with its reply: the server is out of step, it goes."""
        self._process.kill()
        self._process.wait(timeout=60)
        for handle in (self._process.stdin, self._process.stdout, self._errors):
            if handle is not None:
                handle.close()

    def stop(self) -> None:
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.close()
        self._process.wait(timeout=60)
        self._process.stdout.close()
        self._errors.close()

    def _reply(self, timeout: float | None) -> dict[str, Any] | None:
        stdout: IO[bytes] | None = self._process.stdout
        assert stdout is not None
        if timeout is not None and not select.select([stdout], [], [], timeout)[0]:
            return None
        line = stdout.readline()
        if not line:
            self._process.wait(timeout=60)
            self._errors.seek(0)
            raise RuntimeError(f"the CLI fork server ended ({self._process.returncode}): {self._errors.read().decode(errors='replace')}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def run(
        self, command: list[str], args: list[str], env: dict[str, str], python_path: list[str], cwd: str, input: str | None, timeout: float | None,
        script: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        assert self._process.stdin is not None
        data = (input or "").encode(_ENCODING).decode("latin-1")
        request = {"args": args, "env": env, "python_path": python_path, "cwd": cwd, "input": data, "script": script}
        self._process.stdin.write(json.dumps(request).encode() + b"\n")
        self._process.stdin.flush()
        started = self._reply(None)
        assert started is not None
        ended = self._reply(timeout)
        if ended is None:  # as subprocess.run: kill the command, then report what it wrote
            os.kill(started["pid"], signal.SIGKILL)
            ended = self._reply(None)
            assert ended is not None
            raise subprocess.TimeoutExpired(command, timeout or 0.0, _text(ended["stdout"]), _text(ended["stderr"]))
        return subprocess.CompletedProcess(command, ended["exit"], _text(ended["stdout"]), _text(ended["stderr"]))


_lock = threading.Lock()
_server: _Server | None = None


def _stop() -> None:
    if _server is not None and _server.alive():
        _server.stop()


atexit.register(_stop)


def run_longrun(
    args: list[str] | tuple[str, ...], *, env: dict[str, str] | None = None, cwd: str | None = ROOT, input: str | None = None,
    timeout: float | None = 60.0,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([python, "-m", "longrun", *args], env=env, cwd=cwd, input=input,
    capture_output=True, text=True, timeout=timeout)``, through the fork server when it can
    reproduce that start (see the module's docstring). ``env`` defaults to ``child_env()`` (longrun
    from ``src``); ``cwd=None`` is this process's."""
    return _run(["-m", "longrun"], None, args, env=env, cwd=cwd, input=input, timeout=timeout)


def run_script(
    script: str, args: list[str] | tuple[str, ...], *, env: dict[str, str] | None = None, cwd: str | None = ROOT, input: str | None = None,
    timeout: float | None = 60.0,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([python, SCRIPT, *args], ...)`` as ``run_longrun`` runs ``-m longrun``: through
    the fork server when it can reproduce that start. ``script`` is a path to a program in
    ``helpers`` (one that imports longrun from ``src``)."""
    script = os.path.abspath(script)
    return _run([script], script, args, env=env, cwd=cwd, input=input, timeout=timeout)


def _run(
    start: list[str], script: str | None, args: list[str] | tuple[str, ...], *, env: dict[str, str] | None, cwd: str | None, input: str | None,
    timeout: float | None,
) -> subprocess.CompletedProcess[str]:
    global _server
    env = child_env() if env is None else dict(env)
    cwd = os.path.abspath(cwd if cwd is not None else os.getcwd())
    command = [sys.executable, *start, *args]
    python_path = _python_path(env, cwd)
    if hasattr(os, "fork") and python_path is not None and _lock.acquire(blocking=False):
        try:
            if _server is None or not _server.alive():
                _server = _Server()
            if _startup(env) == _startup(_server.env):
                try:
                    return _server.run(command, list(args), env, python_path, cwd, input, timeout, script)
                except subprocess.TimeoutExpired:
                    raise
                except BaseException:
                    _server.kill()
                    _server = None
                    raise
        finally:
            _lock.release()
    return subprocess.run(command, env=env, cwd=cwd, input=input, capture_output=True, text=True, timeout=timeout, check=False)
