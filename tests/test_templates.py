"""The templates: the TOML and Markdown run contracts describe the same fields; AGENT.md's commands all run."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import unittest

from helpers import support
from helpers.session_support import SessionCase

from longrun.contractfile import FIELDS, load_contract

TEMPLATES = os.path.join(support.ROOT, "templates")


def read(name: str) -> str:
    with open(os.path.join(TEMPLATES, name), encoding="utf-8") as handle:
        return handle.read()


class ContractTemplateTests(unittest.TestCase):
    def test_the_toml_template_is_a_valid_contract_that_uses_every_field(self) -> None:
        contract = load_contract(os.path.join(TEMPLATES, "run-contract.toml"))
        self.assertEqual(contract.task_id, "changelog-2026-48")
        self.assertEqual({step.kind for step in contract.steps}, {"exec", "checkpoint"})
        text = read("run-contract.toml")
        headers = set(re.findall(r"(?m)^\[\[?([a-z_]+)\]\]?$", text))
        keys = set(re.findall(r"(?m)^#? ?([a-z_]+) = ", text))
        for table, names in FIELDS.items():
            if table:
                self.assertIn(table, headers, f"[{table}] is in the TOML template")
            missing = [name for name in names if name not in keys and name not in FIELDS]
            self.assertEqual(missing, [], f"fields of [{table or 'top level'}] the TOML template does not show")

    def test_the_markdown_template_names_every_toml_field(self) -> None:
        text = read("run-contract.md")
        self.assertIn("run-contract.toml", text)
        for table, names in FIELDS.items():
            if table:
                self.assertIn(f"`[{table}]`" if table != "steps" else "`[[steps]]`", text)
            missing = [name for name in names if f"`{name}`" not in text and name not in FIELDS]
            self.assertEqual(missing, [], f"fields of [{table or 'top level'}] the Markdown template does not describe")


class AgentInstructionsTests(SessionCase):
    """Every ``longrun`` command AGENT.md shows is run, in its order, in a copy of the template's world."""

    def commands(self) -> list[tuple[list[str], int]]:
        text = read("AGENT.md")
        found = []
        for block in re.findall(r"```sh\n(.*?)```", text, re.S):
            for line in block.splitlines():
                if not line.startswith("longrun "):
                    continue
                expected = re.search(r"#.*\bexit (\d+)", line)
                found.append((shlex.split(line, comments=True), int(expected.group(1)) if expected else 0))
        return found

    def test_every_command_in_agent_md_exists_and_runs(self) -> None:
        shutil.copy(os.path.join(TEMPLATES, "run-contract.toml"), os.path.join(self.work, "run-contract.toml"))
        self.write("changelog.md", "# week 48\n- fix the parser (#12)\n")
        commands = self.commands()
        names = [words[1] for words, _ in commands]
        for name in ("init", "next", "exec", "checkpoint", "done", "stop", "approve", "answer", "status"):
            self.assertIn(name, names)
        for words, expected in commands:
            with self.subTest(command=" ".join(words)):
                result = subprocess.run(words, cwd=self.work, env=self.env(), input="y\n", capture_output=True, text=True, timeout=60)
                self.assertEqual(result.returncode, expected, result.stdout + result.stderr)
                self.assertNotIn("usage:", result.stderr)
        self.assertEqual(self.lines("feed.txt"), ["week 48"], "the announcement was made once")
        self.assertEqual(self.cli_json("next", os.path.join(self.work, "runs"), "changelog-2026-48", code=0)["kind"], "finished")

    def test_agent_md_and_the_readme_name_only_commands_that_exist(self) -> None:
        from longrun.cli import build_parser

        known = set(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
        with open(os.path.join(support.ROOT, "README.md"), encoding="utf-8") as handle:
            readme = handle.read()
        with open(os.path.join(support.ROOT, "docs", "cli.md"), encoding="utf-8") as handle:
            cli_doc = handle.read()
        for name, text in (("AGENT.md", read("AGENT.md")), ("README.md", readme), ("docs/cli.md", cli_doc)):
            shell = "\n".join(re.findall(r"```sh\n(.*?)```", text, re.S))
            mentioned = set(re.findall(r"`longrun ([a-z]+)\b", text)) | set(re.findall(r"(?m)^longrun ([a-z]+)\b", shell))
            self.assertTrue(mentioned)
            self.assertLessEqual(mentioned, known, name)
        for command in ("init", "next", "exec", "checkpoint", "done", "stop"):
            # The README's summary is a table (a row starts "| `longrun init ..."); the reference's a shell block.
            self.assertRegex(readme, rf"(?m)^(\| `)?longrun {command} ", f"the README's CLI summary lists {command}")
            self.assertRegex(cli_doc, rf"(?m)^longrun {command} ", f"docs/cli.md's command list has {command}")


if __name__ == "__main__":
    unittest.main()
