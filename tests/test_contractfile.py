"""The machine-readable run contract: what it accepts, and the line it names for what it refuses."""

from __future__ import annotations

import os
import unittest

import helpers  # noqa: F401  (puts src on sys.path)
from longrun.contractfile import ContractFileError, SessionContract, load_contract, parse_contract
from longrun.errors import CorruptStateError, InvalidInputError

GOOD = """\
version = 1

[task]
goal = "append two lines"
non_goals = ["anything else"]

[actions]
allowed = ["append", "write"]
forbidden = ["delete"]

[[steps]]
id = "notes"
kind = "checkpoint"
action = "write"
next = "write notes.txt"
produces = "notes.txt"
evidence = "file"
path = "notes.txt"

[[steps]]
id = "append"
kind = "exec"
action = "append"
next = "append a line"
produces = "a line in target.txt"
command = "echo a >> target.txt"
observe = "grep -qx a target.txt"

[limits]
max_attempts = 5
lease_ttl_s = 2.5
"""


def line_of(text: str, fragment: str, occurrence: int = 1) -> int:
    """The 1-based line holding the ``occurrence``-th ``fragment``."""
    seen = 0
    for number, line in enumerate(text.splitlines(), 1):
        if fragment in line:
            seen += 1
            if seen == occurrence:
                return number
    raise AssertionError(f"{fragment!r} not in the text")


class ParseTests(unittest.TestCase):
    def parse(self, text: str) -> SessionContract:
        return parse_contract(text, source="c.toml", base_dir="/work/x")

    def refused(self, text: str) -> ContractFileError:
        with self.assertRaises(ContractFileError) as caught:
            self.parse(text)
        self.assertIsInstance(caught.exception, InvalidInputError, "a usage error (exit 2)")
        return caught.exception

    def test_a_good_contract_is_normalized_and_survives_its_recorded_json(self) -> None:
        contract = self.parse(GOOD)
        self.assertEqual([step.step_id for step in contract.steps], ["notes", "append"])
        self.assertEqual(contract.steps[1].command, ("sh", "-c", "echo a >> target.txt"))
        self.assertEqual(contract.steps[0].path, "/work/x/notes.txt", "relative paths start at the file's directory")
        self.assertEqual(contract.workdir, "/work/x")
        self.assertEqual(contract.limits.max_attempts, 5)
        self.assertEqual(contract.limits.lease_ttl_s, 2.5)
        self.assertEqual(contract.limits.retry_delay_s, 1.0, "defaults filled in")
        self.assertEqual(contract.required, ("notes", "append"), "no completion evidence: every step")
        again = SessionContract.from_json(contract.to_json())
        self.assertEqual(again, contract)
        self.assertEqual(again.digest, contract.digest)
        self.assertNotEqual(self.parse(GOOD.replace("append a line", "append one line")).digest, contract.digest)

    def test_bad_contracts_name_the_line_that_holds_the_problem(self) -> None:
        cases = {
            "missing goal": (GOOD.replace('goal = "append two lines"\n', ""), "[task]", "goal is missing"),
            "unknown top-level key": (GOOD.replace("version = 1\n", "version = 1\nname = 'x'\n"), "name = 'x'", "unknown key 'name'"),
            "unknown task key": (GOOD.replace('non_goals = ["anything else"]', 'non_goal = ["x"]'), "non_goal = ", "unknown key 'non_goal'"),
            "unknown step key": (GOOD.replace('observe = "grep', 'observer = "grep'), "observer = ", "unknown key 'observer'"),
            "unknown limit": (GOOD.replace("max_attempts = 5", "max_attempt = 5"), "max_attempt = 5", "unknown key 'max_attempt'"),
            "allowed and forbidden": (
                GOOD.replace('forbidden = ["delete"]', 'forbidden = ["delete", "write"]'),
                "forbidden = ",
                "'write' is both allowed and forbidden",
            ),
            "duplicate step ids": (GOOD.replace('id = "append"', 'id = "notes" '), 'id = "notes" ', "'notes' is used twice"),
            "a forbidden action in a step": (
                GOOD.replace('action = "append"', 'action = "delete"'),
                'action = "delete"',
                "forbids",
            ),
            "an action not allowed": (GOOD.replace('action = "append"', 'action = "push"'), 'action = "push"', "not among"),
            "a bad kind": (GOOD.replace('kind = "exec"', 'kind = "run"'), 'kind = "run"', "kind must be one of"),
            "a string for a number": (GOOD.replace("max_attempts = 5", 'max_attempts = "5"'), "max_attempts = ", "integer"),
            "a negative ttl": (GOOD.replace("lease_ttl_s = 2.5", "lease_ttl_s = -1"), "lease_ttl_s = ", "> 0"),
            "approval not a boolean": (GOOD.replace('produces = "notes.txt"', 'produces = "notes.txt"\napproval = "yes"'), "approval = ", "true or false"),
            "evidence naming no step": (GOOD + '\n[completion]\nevidence = ["nope"]\n', "evidence = [", "'nope', which is not a step id"),
            "observe on a checkpoint": (GOOD.replace('path = "notes.txt"', 'path = "notes.txt"\nobserve = "true"'), 'observe = "true"', "for exec steps"),
            "a reserved step id": (GOOD.replace('id = "append"', 'id = "decision-1"'), 'id = "decision-1"', "reserved"),
            "not TOML": (GOOD.replace("[limits]", "[limits"), "[limits", "not valid TOML"),
        }
        for name, (text, fragment, message) in cases.items():
            with self.subTest(name):
                error = self.refused(text)
                self.assertEqual(error.line, line_of(text, fragment), f"{name}: {error}")
                self.assertIn(message, str(error))
                self.assertIn(f"c.toml, line {error.line}:", str(error))

    def test_steps_in_an_array_of_tables_are_told_apart(self) -> None:
        text = GOOD + '\n[[steps]]\nid = "third"\nkind = "exec"\naction = "append"\nnext = "x"\nproduces = "y"\nbogus = 1\n'
        error = self.refused(text)
        self.assertEqual(error.line, line_of(text, "bogus = 1"))
        self.assertIn("steps[3]", self.refused(text.replace("bogus = 1", "timeout_s = 0")).problem)

    def test_a_key_inside_a_multiline_string_is_not_taken_for_a_key(self) -> None:
        text = GOOD.replace('goal = "append two lines"', 'goal = """append\nnon_goals = 3\ntwo lines"""')
        self.assertEqual(self.parse(text).goal, "append\nnon_goals = 3\ntwo lines")
        bad = text.replace("max_attempts = 5", "max_attempts = 0")
        self.assertEqual(self.refused(bad).line, line_of(bad, "max_attempts = 0"))

    def test_the_recorded_form_is_checked_too(self) -> None:
        body = self.parse(GOOD).to_json()
        body["steps"][0]["kind"] = "run"  # type: ignore[index]
        with self.assertRaises(CorruptStateError):
            SessionContract.from_json(body)
        relative = self.parse(GOOD).to_json()
        relative["task"]["workdir"] = "here"  # type: ignore[index]
        with self.assertRaises(CorruptStateError):
            SessionContract.from_json(relative)

    def test_a_file_that_cannot_be_read_or_decoded_is_refused(self) -> None:
        with self.assertRaises(ContractFileError):
            load_contract("/nonexistent/run-contract.toml")
        import tempfile

        with tempfile.NamedTemporaryFile("wb", suffix=".toml", delete=False) as handle:
            handle.write(b'version = 1\n\n[task]\ngoal = "\xff"\n')
        self.addCleanup(os.unlink, handle.name)
        with self.assertRaises(ContractFileError) as caught:
            load_contract(handle.name)
        self.assertEqual(caught.exception.line, 4)


if __name__ == "__main__":
    unittest.main()
