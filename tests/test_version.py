"""The release number is written once (``longrun.__version__``) and pyproject.toml reads it from there."""

from __future__ import annotations

import ast
import os
import re
import tomllib
import unittest
import warnings

from helpers import support
from helpers.optional import installed, skip_or_fail

import longrun

INIT = os.path.join(support.SRC, "longrun", "__init__.py")
PYPROJECT = os.path.join(support.ROOT, "pyproject.toml")


class VersionTest(unittest.TestCase):
    def test_version_is_a_release_number(self) -> None:
        self.assertRegex(longrun.__version__, r"^\d+\.\d+\.\d+([abc]|rc)?\d*$")

    def test_pyproject_takes_the_version_from_the_package(self) -> None:
        with open(PYPROJECT, "rb") as handle:
            config = tomllib.load(handle)
        self.assertNotIn("version", config["project"], "a second copy of the version in pyproject.toml")
        self.assertIn("version", config["project"]["dynamic"])
        self.assertEqual(config["tool"]["setuptools"]["dynamic"]["version"], {"attr": "longrun.__version__"})

    def test_the_distribution_has_a_name_of_its_own_and_the_readme_installs_it(self) -> None:
        with open(PYPROJECT, "rb") as handle:
            name = tomllib.load(handle)["project"]["name"]
        # "longrun" on the package index is another project; the import name stays longrun.
        self.assertEqual(name, "longrun-durable")
        with open(os.path.join(support.ROOT, "README.md"), encoding="utf-8") as handle:
            readme = handle.read()
        self.assertIn(f"`pip install {name}`", readme)
        self.assertNotRegex(readme, r"pip install longrun\b(?!-)", "an install line that names someone else's package")
        self.assertTrue(os.path.isdir(os.path.join(support.SRC, "longrun")))

    def test_the_version_is_a_literal_that_setuptools_reads_without_importing(self) -> None:
        with open(INIT, encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
        literals = [
            node.value.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            and [getattr(target, "id", None) for target in node.targets] == ["__version__"]
            and isinstance(node.value, ast.Constant)
        ]
        self.assertEqual(literals, [longrun.__version__])

    def test_setuptools_resolves_the_same_version(self) -> None:
        if not installed("setuptools"):
            skip_or_fail("LONGRUN_REQUIRE_SETUPTOOLS", "setuptools is not installed (pip install setuptools)")
        from setuptools.config.pyprojecttoml import read_configuration

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # setuptools calls its [tool.setuptools] support beta
            config = read_configuration(PYPROJECT)
        self.assertEqual(config["project"]["version"], longrun.__version__)


if __name__ == "__main__":
    unittest.main()
