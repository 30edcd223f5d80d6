"""The release number is written once (``longrun.__version__``) and pyproject.toml reads it from there."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import tomllib
import unittest
import warnings

from helpers import support

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
        if importlib.util.find_spec("setuptools") is None:
            self.skipTest("setuptools is not installed")
        from setuptools.config.pyprojecttoml import read_configuration

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # setuptools calls its [tool.setuptools] support beta
            config = read_configuration(PYPROJECT)
        self.assertEqual(config["project"]["version"], longrun.__version__)


if __name__ == "__main__":
    unittest.main()
