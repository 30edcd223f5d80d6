"""Every ```python block in README.md, docs/*.md and templates/*.md runs as written.

Each block is a complete program: it is written to a file in a fresh temporary directory and run
there in a process of its own (``python PROGRAM``, forked from the tests' fork server,
``helpers.cli_process.run_script``), with ``src`` on ``PYTHONPATH`` (as from a checkout), and must exit 0;
the line numbers of a traceback are the document's.
A block whose first line is a comment starting ``# fragment:`` (followed by what it is a part of)
is a part of a larger program and is not run. A block that imports a package that is not
installed (OpenTelemetry, say) is skipped, naming it; nothing else is skipped. A failure names the
document and the line of the block's opening fence.
"""

from __future__ import annotations

from helpers import support
from helpers.cli_process import run_script

import ast
import glob
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import unittest
from dataclasses import dataclass

ROOT = support.ROOT
FRAGMENT = "# fragment:"
RUN_TIMEOUT_S = 300.0
"""Generous: a block runs in a few seconds, but the machine running the suite may be busy."""

_OPENING = re.compile(r"^```python\s*$")
_CLOSING = re.compile(r"^```\s*$")


@dataclass(frozen=True)
class Block:
    document: str
    """The document's path relative to the repository root."""
    line: int
    """The line of the opening fence, counted from 1."""
    code: str

    @property
    def where(self) -> str:
        return f"{self.document}:{self.line}"

    @property
    def is_fragment(self) -> bool:
        return self.code.lstrip().startswith(FRAGMENT)


def documents() -> list[str]:
    """README.md and the Markdown files of docs/ and templates/, relative to the repository root."""
    found = ["README.md"]
    for folder in ("docs", "templates"):
        found += sorted(os.path.relpath(path, ROOT) for path in glob.glob(os.path.join(ROOT, folder, "*.md")))
    return found


def blocks(document: str) -> list[Block]:
    """The ```python blocks of one document, in order."""
    with open(os.path.join(ROOT, document), encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    found: list[Block] = []
    opened: int | None = None
    body: list[str] = []
    for number, line in enumerate(lines, start=1):
        if opened is None:
            if _OPENING.match(line):
                opened, body = number, []
        elif _CLOSING.match(line):
            found.append(Block(document, opened, "\n".join(body) + "\n"))
            opened = None
        else:
            body.append(line)
    if opened is not None:
        raise AssertionError(f"{document}:{opened}: a ```python block is never closed")
    return found


def missing_packages(code: str) -> list[str]:
    """The top-level packages the block imports that are neither the standard library, longrun,
    nor installed."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            names.add(node.module.partition(".")[0])
    names -= set(sys.stdlib_module_names) | {"longrun"}
    return sorted(name for name in names if importlib.util.find_spec(name) is None)


def run_block(block: Block) -> subprocess.CompletedProcess[str]:
    """Run one block as a program of its own in a fresh temporary directory."""
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.join(ROOT, "src"), environment.get("PYTHONPATH")]))
    if support.MEMORY_TMP is not None:  # the blocks' own tempfile.mkdtemp() too: no disk flushes to wait for
        environment["TMPDIR"] = support.MEMORY_TMP
    with tempfile.TemporaryDirectory(prefix="longrun-docs-block-", dir=support.MEMORY_TMP) as directory:
        # A name a module could be imported by (docs_fleet_md.py): a durable function in the block
        # is defined in a script, whose module name must be one Python can import again.
        program = os.path.join(directory, re.sub(r"\W", "_", block.document) + ".py")
        with open(program, "w", encoding="utf-8") as handle:
            handle.write("\n" * block.line + block.code)  # a traceback's line numbers are the document's
        # ``python PROGRAM``, forked from the fork server (``cli_process.run_script``): the process a
        # start would make, without paying an interpreter start and ``import longrun`` per block.
        return run_script(program, [], env=environment, cwd=directory, timeout=RUN_TIMEOUT_S)


class ExtractionTests(unittest.TestCase):
    def test_blocks_are_found_with_the_line_of_their_fence_and_fragments_are_told_apart(self) -> None:
        readme = blocks("README.md")
        self.assertGreaterEqual(len(readme), 3)
        with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as handle:
            lines = handle.read().splitlines()
        for block in readme:
            self.assertEqual(lines[block.line - 1].strip(), "```python", block.where)
            self.assertEqual(lines[block.line], block.code.splitlines()[0], block.where)
        self.assertTrue(Block("x.md", 1, "# fragment: part of the plan above\nrunner.run()\n").is_fragment)
        self.assertFalse(Block("x.md", 1, "import longrun  # fragment: not a first-line comment\n").is_fragment)

    def test_an_import_of_a_package_that_is_not_installed_is_named(self) -> None:
        code = "import os\nimport longrun\nfrom no_such_package_here.sub import thing\nimport unittest.mock\n"
        self.assertEqual(missing_packages(code), ["no_such_package_here"])

    def test_a_failing_block_reports_the_line_of_the_document_that_raised(self) -> None:
        result = run_block(Block("docs/x.md", 7, "import sys\nraise RuntimeError('broken on purpose')\n"))
        self.assertEqual(result.returncode, 1)
        self.assertIn("docs_x_md.py\", line 9, in <module>", result.stderr)  # the document's line 9: the fence is line 7
        self.assertIn("RuntimeError: broken on purpose", result.stderr)

    def test_the_first_example_of_the_readme_is_a_short_program_before_the_guarantees(self) -> None:
        with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as handle:
            text = handle.read()
        first = blocks("README.md")[0]
        guarantees = text[: text.index("\n## What it guarantees")].count("\n") + 1
        self.assertLess(first.line, guarantees)
        self.assertFalse(first.is_fragment)
        self.assertLessEqual(len(first.code.strip().splitlines()), 20)


class DocumentBlockTests(unittest.TestCase):
    def test_every_python_block_runs_as_written_or_says_it_is_a_fragment(self) -> None:
        found = [block for document in documents() for block in blocks(document)]
        self.assertGreater(len(found), 10)
        for block in found:
            with self.subTest(block=block.where):
                if block.is_fragment:
                    what = block.code.lstrip()[len(FRAGMENT) :].partition("\n")[0].strip()
                    self.assertTrue(what, f"{block.where}: a fragment says what it is a part of")
                    continue
                missing = missing_packages(block.code)
                if missing:
                    self.skipTest(f"{block.where} needs {', '.join(missing)}, which is not installed")
                result = run_block(block)
                self.assertEqual(
                    result.returncode, 0,
                    f"the ```python block at {block.where} failed (exit {result.returncode}):\n{result.stderr[-3000:]}",
                )  # fmt: skip

    def test_the_readme_main_examples_are_programs_not_fragments(self) -> None:
        fragments = [block.where for block in blocks("README.md") if block.is_fragment]
        self.assertEqual(fragments, [])


if __name__ == "__main__":
    unittest.main()
