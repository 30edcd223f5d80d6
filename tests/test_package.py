"""The package's public names: each one importable, and each one visible to a type checker."""

from __future__ import annotations

import ast
import os
import unittest

from helpers import support
import longrun


class PublicNameTests(unittest.TestCase):
    def test_every_name_in_all_is_importable(self) -> None:
        for name in longrun.__all__:
            with self.subTest(name):
                self.assertTrue(hasattr(longrun, name))

    def test_every_name_in_all_is_bound_by_an_import_a_type_checker_reads(self) -> None:
        # Names that __getattr__ imports lazily are untyped for mypy and pyright (a decorated
        # durable function would lose its type) unless they are also imported under TYPE_CHECKING.
        with open(os.path.join(support.SRC, "longrun", "__init__.py")) as handle:
            tree = ast.parse(handle.read())
        bound = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
        self.assertEqual(sorted(set(longrun.__all__) - bound), [])


if __name__ == "__main__":
    unittest.main()
