"""Every relative link in README.md and docs/*.md resolves: the file exists and, for ``#anchor``
links, the target holds a heading with that GitHub-style slug.

Links are read outside fenced code blocks and inline code; links to other sites are not followed.
"""

from __future__ import annotations

import glob
import os
import re
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LINK = re.compile(r"\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
_INLINE_CODE = re.compile(r"`+[^`]*`+")


def documents() -> list[str]:
    """README.md and every Markdown file in docs/, as absolute paths."""
    return [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]


def prose_lines(text: str) -> list[str]:
    """The lines of a Markdown text outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: inline markup dropped, lower case, punctuation removed,
    each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: str) -> set[str]:
    """Every heading anchor of a Markdown file, with GitHub's -1, -2 ... for repeated headings."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose_lines(text):
        match = _HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(path: str) -> list[str]:
    """The link targets in a Markdown file that point into this repository."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    targets = []
    for line in prose_lines(text):
        for target in _LINK.findall(_INLINE_CODE.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto: ...
                continue
            targets.append(target)
    return targets


class SlugTests(unittest.TestCase):
    def test_slugs_follow_github(self) -> None:
        self.assertEqual(slug("Level A: a checkpointed session from the shell"), "level-a-a-checkpointed-session-from-the-shell")
        self.assertEqual(slug("`started` is durable before the adapter is called"), "started-is-durable-before-the-adapter-is-called")
        self.assertEqual(slug("Many runners on many machines, one PostgreSQL"), "many-runners-on-many-machines-one-postgresql")
        self.assertEqual(slug("The observe before each run's first apply"), "the-observe-before-each-runs-first-apply")
        self.assertEqual(slug("Declared plans: `Runner`"), "declared-plans-runner")


class LinkTests(unittest.TestCase):
    def test_there_are_documents_and_links_to_check(self) -> None:
        self.assertIn(os.path.join(ROOT, "docs", "architecture.md"), documents())
        self.assertGreater(sum(len(relative_links(path)) for path in documents()), 50)

    def test_every_relative_link_resolves(self) -> None:
        broken = []
        for path in documents():
            for target in relative_links(path):
                file_part, _, anchor = target.partition("#")
                resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
                where = f"{os.path.relpath(path, ROOT)}: ({target})"
                if not os.path.exists(resolved):
                    broken.append(f"{where}: no file {os.path.relpath(resolved, ROOT)}")
                elif anchor and not resolved.endswith(".md"):
                    broken.append(f"{where}: an anchor into a file that is not Markdown")
                elif anchor and anchor not in anchors(resolved):
                    broken.append(f"{where}: no heading #{anchor} in {os.path.relpath(resolved, ROOT)}")
        self.assertEqual(broken, [])


if __name__ == "__main__":
    unittest.main()
