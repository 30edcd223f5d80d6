"""templates/SKILL.md: the Agent Skills front matter, and every command, tool and registration it shows exists."""

from __future__ import annotations

import json
import os
import re
import shlex
import unittest

from helpers import support

from longrun.cli import build_parser
from longrun.cli._mcp_tools import SessionTools
from longrun.testing import MemoryStore

SKILL = os.path.join(support.ROOT, "templates", "SKILL.md")


def read() -> str:
    with open(SKILL, encoding="utf-8") as handle:
        return handle.read()


def front_matter(text: str) -> dict[str, str]:
    """The YAML front matter's top-level ``key: value`` lines (the skill uses no nesting or block scalars)."""
    match = re.match(r"---\n(.*?)\n---\n", text, re.S)
    if match is None:
        raise AssertionError("SKILL.md does not open with YAML front matter between --- lines")
    fields: dict[str, str] = {}
    for line in match.group(1).splitlines():
        key, separator, value = line.partition(":")
        if not separator or not re.fullmatch(r"[a-z][a-z-]*", key):
            raise AssertionError(f"not a plain `key: value` line: {line!r}")
        if key in fields:
            raise AssertionError(f"{key} is given twice")
        fields[key] = value.strip()
    return fields


class SkillTests(unittest.TestCase):
    def test_the_front_matter_has_a_valid_name_and_a_description(self) -> None:
        fields = front_matter(read())
        self.assertLessEqual({"name", "description"}, set(fields))
        self.assertLessEqual(set(fields), {"name", "description", "license", "compatibility", "metadata", "allowed-tools"})
        name = fields["name"]
        self.assertEqual(name, "longrun")
        self.assertRegex(name, r"^[a-z0-9]+(-[a-z0-9]+)*$")
        self.assertLessEqual(len(name), 64)
        description = fields["description"]
        self.assertTrue(0 < len(description) <= 1024, len(description))
        self.assertNotRegex(description, r"^[\"'>|]|: ", "a plain YAML scalar: no quotes, block marker or `: ` inside")
        self.assertIn("Use when", description)
        self.assertLessEqual(len(fields["compatibility"]), 500)

    def test_the_body_teaches_the_levels_and_the_continuation_rule(self) -> None:
        text = read()
        for words in ("Level A", "Level B", "Level C", "## The continuation rule", "longrun mcp", "exactly once",
                      "Never approve your own steps"):  # fmt: skip
            self.assertIn(words, text)

    def test_every_command_it_shows_exists_and_parses(self) -> None:
        text = read()
        parser = build_parser()
        known = set(parser._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
        mentioned = set(re.findall(r"`longrun ([a-z]+)\b", text))
        shown = [line for block in re.findall(r"```sh\n(.*?)```", text, re.S) for line in block.splitlines() if line.strip()]
        self.assertGreaterEqual(len(shown), 6)
        for line in shown:
            with self.subTest(line=line):
                words = shlex.split(line, comments=True)
                self.assertEqual(words[0], "longrun")
                mentioned.add(words[1])
                try:
                    parser.parse_known_args(words[1:] if words[1] != "exec" else words[1 : words.index("--")])
                except SystemExit as exc:  # argparse exits on what it cannot parse
                    self.fail(f"{line!r} does not parse: exit {exc.code}")
        self.assertLessEqual(mentioned, known)
        for command in ("init", "next", "exec", "checkpoint", "done", "stop", "mcp", "approve", "answer", "cancel"):
            self.assertIn(command, mentioned)

    def test_every_tool_it_names_exists_and_the_registration_snippet_starts_the_server(self) -> None:
        text = read()
        tools = {str(tool["name"]) for tool in SessionTools(MemoryStore(), "<store>", task="t").tool_list() if isinstance(tool, dict)}
        named = set(re.findall(r"`(longrun_[a-z]+)`", text)) - {"longrun_continue"}
        self.assertEqual(named, tools, "it names every tool, and only tools that exist")
        snippets = re.findall(r"```json\n(.*?)```", text, re.S)
        self.assertEqual(len(snippets), 1)
        server = json.loads(snippets[0])["mcpServers"]["longrun"]
        self.assertEqual(server["command"], "longrun")
        args = build_parser().parse_args(server["args"])
        self.assertEqual((args.command, args.store, args.task, args.create_store), ("mcp", "/srv/agent/runs", "fix-123", True))


if __name__ == "__main__":
    unittest.main()
