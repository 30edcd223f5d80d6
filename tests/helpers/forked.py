"""One run in a forked child, armed with crash points, for the kill tests' servers (``durable_child``,
``async_child``): the server process imports longrun once and forks per run, which is much cheaper
than starting a Python process each time."""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import time
import traceback
from typing import Any, Callable

from longrun import _crashpoints


def serve_one(request: dict[str, Any], run: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    """Fork; in the child, arm the crash points ``request`` names, call ``run(request)`` and write
    its outcome's JSON back; SIGKILL the child after ``kill_after_s`` if given. The child's exit
    code (negative: the signal that ended it) and outcome (None if it wrote none)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: arm the crash points as the environment would, run once, report
        os.close(read_end)
        code = 0
        try:
            os.environ.pop("LONGRUN_CRASH_AT", None)
            os.environ.pop("LONGRUN_CRASH_TRACE", None)
            if request.get("crash_at"):
                os.environ["LONGRUN_CRASH_AT"] = request["crash_at"]
            if request.get("trace"):
                os.environ["LONGRUN_CRASH_TRACE"] = request["trace"]
            importlib.reload(_crashpoints)
            body = json.dumps(run(request).to_json()).encode()
            while body:
                body = body[os.write(write_end, body) :]
        except BaseException:
            traceback.print_exc()
            code = 70
        finally:
            os._exit(code)
    os.close(write_end)
    if request.get("kill_after_s") is not None:
        time.sleep(request["kill_after_s"])
        os.kill(pid, signal.SIGKILL)  # a zombie that already exited ignores it
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    exit_code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    output = b"".join(chunks)
    return {"exit": exit_code, "outcome": json.loads(output) if output else None}


def serve(run: Callable[[dict[str, Any]], Any]) -> int:
    """Read one JSON request a line from stdin, answer each with ``serve_one``'s result, a line."""
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(serve_one(json.loads(line), run)), flush=True)
    return 0
