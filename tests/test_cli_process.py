"""The CLI tests' commands run in the process a shell would start: ``helpers.cli_process.run_longrun``
(a fork server) against ``subprocess.run([python, "-m", "longrun", ...])``, compared from inside; and
the kill tests' child programs: ``run_script`` against ``subprocess.run([python, SCRIPT, ...])``.

``longrun start probe:f`` imports a module ``probe`` before it finds that ``f`` is no durable
function; the module writes down what the process looks like (``sys.path``, ``sys.argv``, the
working directory, the environment, the standard streams and what stdin holds, the crash points, the
``__main__`` module), and may kill itself or hang. Both ways of starting the command must see the
same.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import unittest

from helpers import SRC, cli_process
from helpers.support import TempDirTest, child_env

PROBE = textwrap.dedent(
    """\
    import json, os, signal, sys, time
    from longrun import _crashpoints

    def stream(handle):
        return {"type": type(handle).__name__, "encoding": handle.encoding, "errors": handle.errors,
                "line_buffering": handle.line_buffering, "write_through": handle.write_through,
                "buffer": type(handle.buffer).__name__, "fileno": handle.fileno(), "isatty": handle.isatty()}

    main = sys.modules["__main__"]
    seen = {
        "path": sys.path, "argv": sys.argv, "cwd": os.getcwd(), "stdin": sys.stdin.read(),
        "env": {key: os.environ.get(key) for key in ("PROBE_OUT", "PYTHONPATH", "LONGRUN_CRASH_AT")},
        "streams": [stream(sys.stdin), stream(sys.stdout), stream(sys.stderr)],
        "dunder_streams": [sys.__stdin__ is sys.stdin, sys.__stdout__ is sys.stdout, sys.__stderr__ is sys.stderr],
        "armed": _crashpoints.ARMED, "target": _crashpoints._TARGET,
        "main": [getattr(main.__spec__, "name", None), main.__file__], "flags": list(sys.flags), "executable": sys.executable,
        "parent": os.getppid(),
    }
    with open(os.environ["PROBE_OUT"], "w") as handle:
        json.dump(seen, handle)
    print("probe: é ✓")
    print("probe: on stderr", file=sys.stderr)
    if os.environ.get("PROBE_KILL"):
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("PROBE_HANG"):
        time.sleep(60)
    """
)


class ForkServerTests(TempDirTest):
    def setUp(self) -> None:
        super().setUp()
        self.code = self.path("code")
        os.makedirs(self.code)
        with open(os.path.join(self.code, "probe.py"), "w") as handle:
            handle.write(PROBE)
        self.work = self.path("work")
        os.makedirs(self.work)
        self.store = self.path("store")

    def env(self, **extra: str) -> dict[str, str]:
        env = {key: value for key, value in child_env().items() if not key.startswith("LONGRUN_CRASH")}
        env["PYTHONPATH"] = os.pathsep.join([SRC, self.code, "relative"])  # a relative entry is taken from the cwd
        env["PROBE_OUT"] = self.path("probe.json")
        return {**env, **extra}

    def both(self, env: dict[str, str], input: str | None) -> list[tuple[subprocess.CompletedProcess[str], dict]]:
        """The command run the two ways, each with what its probe saw."""
        args = ["start", "probe:f", "t1"]
        results = []
        for run in (
            lambda: cli_process.run_longrun(args, env=env, cwd=self.work, input=input),
            lambda: subprocess.run([sys.executable, "-m", "longrun", *args], env=env, cwd=self.work, input=input,
                                   capture_output=True, text=True, timeout=60),
        ):  # fmt: skip
            result = run()
            with open(env["PROBE_OUT"]) as handle:
                results.append((result, json.load(handle)))
            os.remove(env["PROBE_OUT"])
        return results

    def assert_same(self, forked: dict, started: dict) -> None:
        server = cli_process._server
        self.assertIsNotNone(server, "the fork server was used")
        assert server is not None
        self.assertEqual(forked.pop("parent"), server._process.pid, "the command was forked by the server")
        self.assertEqual(started.pop("parent"), os.getpid())
        self.assertEqual(forked, started)

    def test_a_forked_command_sees_the_process_a_start_would_make(self) -> None:
        for input in ("yes é\n", None):
            with self.subTest(input=input):
                (forked, seen_forked), (started, seen_started) = self.both(self.env(), input)
                self.assert_same(seen_forked, seen_started)
                self.assertEqual(seen_started["stdin"], input or "")
                self.assertIn(os.path.join(self.work, "relative"), seen_started["path"])
                self.assertEqual((forked.returncode, forked.stdout, forked.stderr), (started.returncode, started.stdout, started.stderr))
                self.assertEqual(started.returncode, 2, started.stderr)
                self.assertIn("probe: é ✓\n", started.stdout)
                self.assertIn("probe: on stderr\n", started.stderr)

    def test_crash_points_are_armed_from_the_command_s_environment(self) -> None:
        (_, seen_forked), (_, seen_started) = self.both(self.env(LONGRUN_CRASH_AT="state.committed:2"), None)
        self.assert_same(seen_forked, seen_started)
        self.assertEqual((seen_started["armed"], seen_started["target"]), (True, ["state.committed", 2]))
        (_, seen_forked), _ = self.both(self.env(), None)  # and disarmed again for the next command
        self.assertEqual((seen_forked["armed"], seen_forked["target"]), (False, None))

    def test_a_command_that_kills_itself_exits_minus_sigkill(self) -> None:
        (forked, seen_forked), (started, seen_started) = self.both(self.env(PROBE_KILL="1"), None)
        self.assert_same(seen_forked, seen_started)
        self.assertEqual((forked.returncode, started.returncode), (-signal.SIGKILL, -signal.SIGKILL))
        self.assertEqual(forked.stdout, started.stdout)

    def test_a_command_past_its_timeout_is_killed_and_the_next_one_runs(self) -> None:
        with self.assertRaises(subprocess.TimeoutExpired):
            cli_process.run_longrun(["start", "probe:f", "t1"], env=self.env(PROBE_HANG="1"), cwd=self.work, timeout=1.0)
        self.assertEqual(cli_process.run_longrun(["--version"]).returncode, 0)

    def test_a_script_run_by_path_sees_the_process_a_start_would_make(self) -> None:
        """``run_script`` (the kill tests' child programs) against ``python SCRIPT ARGS``."""
        script = os.path.join(self.code, "probe.py")
        env = self.env(LONGRUN_CRASH_AT="effect.applied:3")
        results = []
        for run in (
            lambda: cli_process.run_script(script, ["one", "two"], env=env, cwd=self.work, input="in\n"),
            lambda: subprocess.run([sys.executable, script, "one", "two"], env=env, cwd=self.work, input="in\n",
                                   capture_output=True, text=True, timeout=60),
        ):  # fmt: skip
            result = run()
            with open(env["PROBE_OUT"]) as handle:
                results.append((result, json.load(handle)))
            os.remove(env["PROBE_OUT"])
        (forked, seen_forked), (started, seen_started) = results
        self.assert_same(seen_forked, seen_started)
        self.assertEqual((seen_started["argv"], seen_started["path"][0]), ([script, "one", "two"], self.code))
        self.assertEqual((seen_started["main"], seen_started["stdin"], seen_started["target"]), ([None, script], "in\n", ["effect.applied", 3]))
        self.assertEqual((forked.returncode, forked.stdout, forked.stderr), (started.returncode, started.stdout, started.stderr))
        self.assertEqual(started.returncode, 0, started.stderr)

    def test_a_start_the_server_cannot_reproduce_is_started_as_a_process(self) -> None:
        env = self.env(PYTHONPATH=self.code)  # longrun would not come from src: a real start (and no longrun at all)
        result = cli_process.run_longrun(["--version"], env=env, cwd=self.work)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("No module named longrun", result.stderr)


if __name__ == "__main__":
    unittest.main()
