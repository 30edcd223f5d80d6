"""Helpers for the checkpointed-session tests: contracts, a `longrun` on PATH, the CLI in-process."""

from __future__ import annotations

import contextlib
import io
import json
import os
import stat
import sys
from typing import Any

from .support import SRC, TempDirTest
from longrun.cli import main

CONTRACT = """\
version = 1

[task]
goal = "two lines land in target.txt exactly once each, with notes and a report"
non_goals = ["touching any other file"]

[actions]
allowed = ["append", "write", "review"]
forbidden = ["delete"]

[completion]
evidence = ["notes", "append-a", "report", "append-b"]

[[steps]]
id = "notes"
kind = "checkpoint"
action = "write"
next = "write the plan to notes.txt"
produces = "notes.txt"
command = "echo plan > notes.txt"
evidence = "file"
path = "notes.txt"

[[steps]]
id = "append-a"
kind = "exec"
action = "append"
next = "append line a to target.txt"
produces = "the line 'a' in target.txt"
command = "echo a >> target.txt"
observe = "test -f target.txt && grep -qx a target.txt"

[[steps]]
id = "check-a"
kind = "checkpoint"
action = "review"
next = "check that target.txt holds line a"
produces = "a note"
command = "grep -qx a target.txt"
evidence = "note"

[[steps]]
id = "report"
kind = "checkpoint"
action = "write"
next = "count the lines of target.txt into report.txt"
produces = "report.txt"
command = ["sh", "-c", "wc -l < target.txt > report.txt"]
evidence = "file"
path = "report.txt"

[[steps]]
id = "append-b"
kind = "exec"
action = "append"
next = "append line b to target.txt"
produces = "the line 'b' in target.txt"
command = "echo b >> target.txt"
observe = "test -f target.txt && grep -qx b target.txt"
approval = true

[[steps]]
id = "wrap-up"
kind = "checkpoint"
action = "review"
next = "check that target.txt holds a then b"
produces = "a note"
command = "test $(wc -l < target.txt) -eq 2 && grep -qx b target.txt"
evidence = "note"

[limits]
max_attempts = 30
lease_ttl_s = 1
retry_delay_s = 0.2

[stop]
when = ["target.txt holds a line this task did not write"]
"""
"""Six steps: two exec effects against target.txt (the second needs approval) and four checkpoints
(two with file evidence, two with notes), each with the work to do before it is recorded."""


class SessionCase(TempDirTest):
    """A temporary work directory with a store (``runs``), a contract file and ``longrun`` on PATH."""

    contract_text = CONTRACT

    def setUp(self) -> None:
        super().setUp()
        self.work = self.path("work")
        os.makedirs(self.work)
        self.store = os.path.join(self.work, "runs")
        self.contract = self.write("run-contract.toml", self.contract_text)
        self.bin = self.path("bin")
        os.makedirs(self.bin)
        wrapper = os.path.join(self.bin, "longrun")
        with open(wrapper, "w") as handle:
            handle.write(f'#!/bin/sh\nexec "{sys.executable}" -m longrun "$@"\n')
        os.chmod(wrapper, os.stat(wrapper).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)

    def write(self, name: str, text: str) -> str:
        path = os.path.join(self.work, name)
        with open(path, "w") as handle:
            handle.write(text)
        return path

    def read(self, name: str) -> str:
        with open(os.path.join(self.work, name)) as handle:
            return handle.read()

    def lines(self, name: str = "target.txt") -> list[str]:
        path = os.path.join(self.work, name)
        return self.read(name).splitlines() if os.path.exists(path) else []

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = SRC + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PATH"] = self.bin + os.pathsep + env.get("PATH", "")
        env.pop("LONGRUN_CRASH_AT", None)
        return env

    def cli(self, *args: str, stdin: str = "") -> tuple[int, str, str]:
        """``longrun ARGS`` in this process: (exit code, stdout, stderr)."""
        out, err = io.StringIO(), io.StringIO()
        previous = sys.stdin
        sys.stdin = io.StringIO(stdin)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(list(args))
        finally:
            sys.stdin = previous
        return code, out.getvalue(), err.getvalue()

    def cli_json(self, *args: str, code: int | None = 0) -> dict[str, Any]:
        words = list(args)
        words.insert(words.index("--") if "--" in words else len(words), "--json")  # after --, it would be the command's
        result, out, err = self.cli(*words)
        if code is not None:
            self.assertEqual(result, code, f"longrun {' '.join(args)}: stdout={out!r} stderr={err!r}")
        body = json.loads(out)
        assert isinstance(body, dict)
        return body

    def init(self, task: str = "t1") -> None:
        self.cli_json("init", self.store, task, "--contract", self.contract, "--create-store")

    def next(self, task: str = "t1", code: int | None = None) -> dict[str, Any]:
        return self.cli_json("next", self.store, task, code=code)

    def revision(self, task: str = "t1") -> int:
        status = self.cli_json("status", self.store, task)
        return int(status["revision"])
