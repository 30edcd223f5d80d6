"""The fork server behind ``helpers.cli_process.run_longrun``: ``python -m longrun ARGS`` without
paying an interpreter start and ``import longrun`` for every command a test runs; and behind
``run_script``: ``python SCRIPT ARGS`` for the test programs in ``helpers`` (``child_runner.py``), the
same way (a request with a ``script``: ``sys.path`` then starts with the script's directory, as a
start by path has it, and the script runs with ``runpy.run_path`` as ``__main__``).

    python cli_child.py

imports longrun and the modules its commands import, then reads one JSON request a line on stdin
(``args``, ``env``, ``cwd``, ``python_path``, ``input``: the bytes of standard input as Latin-1
text, ``io``: how the interpreter would set up its standard streams) and forks a child per request.
Before it runs a command, the child becomes what ``python -m longrun ARGS`` started in ``cwd`` with
``env`` would be: standard input from a file holding ``input``, stdout and stderr to files, the
environment replaced (the crash points re-armed from it, as a start would arm them), ``sys.path``
that of a ``-m`` start (``cwd``, then ``python_path``, then the interpreter's own) and
``sys.argv`` the command's; then it runs ``longrun.__main__`` with ``runpy`` as ``-m`` does and
exits as an interpreter exits (uncaught exceptions print a traceback and exit 1, non-daemon threads
are joined, ``atexit`` runs, the streams are flushed). It is a separate process: it holds its own
file locks, may be SIGKILLed (by a crash point, or by the test), and nothing it does reaches the
server or the test.

The server answers each request with two JSON lines: ``{"pid": N}`` once the child is forked (so
that the test can kill it when a timeout passes), then ``{"exit": CODE, "stdout": ..., "stderr":
...}`` once it has ended (the output bytes as Latin-1 text; a child ended by a signal exits
``-signal``, as ``subprocess`` reports it). It exits when its stdin closes.
"""

from __future__ import annotations

import gc
import importlib
import io
import json
import os
import runpy
import sys
import tempfile
from typing import Any, BinaryIO

del sys.path[0]  # this script's directory: nothing is imported from it

import longrun  # noqa: E402, F401  (imported once here: every child starts with it)
import longrun.cli  # noqa: E402, F401
from longrun import _crashpoints  # noqa: E402

for _name in (
    "longrun.cli._console", "longrun.cli._control", "longrun.cli._demo", "longrun.cli._history", "longrun.cli._inspect",
    "longrun.cli._mcp", "longrun.cli._resume", "longrun.cli._session", "longrun.cli._verify", "longrun.cli._watch",
    "longrun.cli._worker", "longrun.contractfile", "longrun.functions", "longrun.runner", "longrun.session",
    "longrun.stores", "longrun.stores.queue", "longrun.worker",
):  # fmt: skip
    importlib.import_module(_name)  # what the commands import when they run: loaded once, here

_STARTED_WITH = os.environ.get("PYTHONPATH", "").split(os.pathsep)
_BASE_PATH = [entry for entry in sys.path if entry not in _STARTED_WITH]
"""The interpreter's own part of ``sys.path`` (the standard library, site-packages): all but the
``PYTHONPATH`` entries the server was started with."""


def _stream(fd: int, like: io.TextIOWrapper, *, write: bool) -> io.TextIOWrapper:
    """A standard stream on ``fd`` set up as the interpreter set up ``like`` (the server's own, which
    is a pipe or a file as the child's will be): encoding, errors, buffering."""
    raw = io.FileIO(fd, "w" if write else "r", closefd=False)
    buffer: Any
    if write and not isinstance(like.buffer, io.BufferedWriter):  # -u or PYTHONUNBUFFERED: no buffer
        buffer = raw
    else:
        buffer = io.BufferedWriter(raw) if write else io.BufferedReader(raw)
    return io.TextIOWrapper(
        buffer, encoding=like.encoding, errors=like.errors, newline="\n", line_buffering=like.line_buffering,
        write_through=like.write_through,
    )  # fmt: skip


def _become(request: dict[str, Any], stdin: BinaryIO, stdout: BinaryIO, stderr: BinaryIO) -> None:
    """In the forked child: the process ``python -m longrun ARGS`` would be, up to running the module."""
    for target, source in ((0, stdin), (1, stdout), (2, stderr)):
        os.dup2(source.fileno(), target)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    first = os.path.dirname(request["script"]) if request.get("script") else os.getcwd()
    # As a start leaves it: site drops the duplicates among PYTHONPATH's entries and its own, and
    # then the interpreter puts the script's directory (or the cwd, for -m) in front of them.
    sys.path[:] = [first, *dict.fromkeys([*request["python_path"], *_BASE_PATH])]
    importlib.reload(_crashpoints)  # armed (or not) from the command's environment, as at a start
    streams = (_stream(0, sys.stdin, write=False), _stream(1, sys.stdout, write=True), _stream(2, sys.stderr, write=True))
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams
    if request.get("script"):
        sys.argv = [request["script"], *request["args"]]
    else:
        sys.argv = ["-m", *request["args"]]  # runpy puts the module's path in argv[0], as -m does


def serve() -> dict[str, Any] | None:
    """Answer requests until stdin closes (None); in a forked child, return its request instead."""
    requests = io.open(0, "rb", closefd=False)
    gc.freeze()  # what was imported stays shared with the children: their collections do not copy it
    for line in requests:
        if not line.strip():
            continue
        request = json.loads(line)
        with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
            stdin.write(request["input"].encode("latin-1"))
            stdin.seek(0)
            pid = os.fork()
            if pid == 0:
                _become(request, stdin, stdout, stderr)
                return request
            os.write(1, json.dumps({"pid": pid}).encode() + b"\n")
            _, status = os.waitpid(pid, 0)
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            output = []
            for handle in (stdout, stderr):
                handle.seek(0)
                output.append(handle.read().decode("latin-1"))
        reply = json.dumps({"exit": code, "stdout": output[0], "stderr": output[1]}).encode() + b"\n"
        while reply:
            reply = reply[os.write(1, reply) :]
    return None


if __name__ == "__main__":
    request = serve()
    if request is None:
        raise SystemExit(0)
    if request.get("script"):
        runpy.run_path(request["script"], run_name="__main__")
    else:
        runpy.run_module("longrun", run_name="__main__", alter_sys=True)
