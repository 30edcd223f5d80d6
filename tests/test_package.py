"""The package's public names: each one importable, visible to a type checker, and documented; one
exception tree; the layers (the engine depends on the source Protocols, not on where records come
from)."""

from __future__ import annotations

import ast
import os
import unittest

import support
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


class DocumentedTests(unittest.TestCase):
    def test_the_store_and_the_central_records_say_what_they_are(self) -> None:
        from longrun import EffectRecord, JsonFileStore, Lease, RunState

        for cls in (JsonFileStore, RunState, EffectRecord, Lease):
            with self.subTest(cls.__name__):
                doc = cls.__doc__ or ""
                self.assertFalse(doc.startswith(f"{cls.__name__}("), "only the signature a dataclass makes up")
                self.assertGreater(len(doc.split()), 25, doc)


class ExceptionTreeTests(unittest.TestCase):
    def test_an_illegal_ledger_move_is_in_the_one_tree_and_still_where_it_was(self) -> None:
        from longrun import errors, ledger

        self.assertIn("IllegalTransitionError", errors.__all__)
        self.assertIs(ledger.IllegalTransitionError, errors.IllegalTransitionError)
        self.assertIs(longrun.IllegalTransitionError, errors.IllegalTransitionError)
        self.assertEqual(errors.IllegalTransitionError.__module__, "longrun.errors")
        self.assertTrue(issubclass(errors.IllegalTransitionError, errors.LongrunError))
        self.assertIn("IllegalTransitionError", errors.__doc__ or "", "drawn in the tree")


class LayerTests(unittest.TestCase):
    def imports_of(self, module: str) -> set[str]:
        with open(os.path.join(support.SRC, "longrun", module)) as handle:
            tree = ast.parse(handle.read())
        names = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        names |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        return {name.lstrip(".") for name in names}

    def test_the_engine_reads_control_records_only_through_the_source_protocols(self) -> None:
        for module in ("engine.py", "runner.py", "functions.py"):
            with self.subTest(module):
                imported = self.imports_of(module)
                self.assertFalse(imported & {"authority", "signing", "stores.controlfiles"}, sorted(imported))

    def test_signing_and_the_control_files_reach_no_private_module_of_another_package(self) -> None:
        self.assertEqual({name for name in self.imports_of("signing.py") if name.startswith("stores")}, set())
        private = {name for name in self.imports_of("authority.py") if "._" in name or name.startswith("_")}
        self.assertEqual(private - {"__future__"}, set())


if __name__ == "__main__":
    unittest.main()
