"""The package's public names: each one importable, visible to a type checker, and the central ones
documented; every error the library raises drawn in its one exception tree; the layers (the engine depends
on the source Protocols, not on where records come from)."""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import os
import pkgutil
import re
import unittest
from typing import Iterator

from helpers import support
import longrun
from longrun import errors


@functools.lru_cache(maxsize=None)
def parsed(path: str) -> ast.Module:
    """The syntax tree of a source file, parsed once for all the tests here (they only read it)."""
    with open(path) as handle:
        return ast.parse(handle.read())


class PublicNameTests(unittest.TestCase):
    def test_every_name_in_all_is_importable(self) -> None:
        for name in longrun.__all__:
            with self.subTest(name):
                self.assertTrue(hasattr(longrun, name))

    def test_every_name_in_all_is_bound_by_an_import_a_type_checker_reads(self) -> None:
        # Names that __getattr__ imports lazily are untyped for mypy and pyright (a decorated
        # durable function would lose its type) unless they are also imported under TYPE_CHECKING.
        tree = parsed(os.path.join(support.SRC, "longrun", "__init__.py"))
        bound = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
        self.assertEqual(sorted(set(longrun.__all__) - bound), [])


def public_modules() -> list[str]:
    """Every module of the package that is not private (no part of its name starts with ``_``)."""
    names = []
    for module in pkgutil.walk_packages(longrun.__path__, "longrun."):
        if not any(part.startswith("_") for part in module.name.split(".")[1:]):
            names.append(module.name)
    return names


class DocumentationTests(unittest.TestCase):
    CENTRAL = ("Runner", "durable", "DurableFunction", "Run", "JsonFileStore", "RunState", "EffectRecord", "Lease",
               "EffectRequest", "RunOutcome")  # fmt: skip

    def test_the_central_names_say_what_they_are_in_their_own_docstring(self) -> None:
        for name in self.CENTRAL:
            with self.subTest(name):
                value = getattr(longrun, name)
                doc = value.__dict__.get("__doc__") if inspect.isclass(value) else value.__doc__
                self.assertTrue(doc and doc.strip(), f"{name} has no docstring")
                # A dataclass without one gets its signature as its docstring: that says nothing.
                self.assertFalse(doc.startswith(f"{name}("), f"{name}'s docstring is the generated signature")


class ExceptionTreeTests(unittest.TestCase):
    OUTSIDE = {
        "longrun.engine.Stop": "a BaseException that unwinds a face to the engine, never an error a caller sees",
        "longrun.shell.CommandFailed": "raised inside the shell adapter to mean outcome unknown, like any other exception",
        "longrun.shell.CommandInterrupted": "likewise",
    }

    def test_an_illegal_ledger_move_is_in_the_one_tree_and_still_where_it_was(self) -> None:
        from longrun import errors, ledger

        self.assertIn("IllegalTransitionError", errors.__all__)
        self.assertIs(ledger.IllegalTransitionError, errors.IllegalTransitionError)
        self.assertIs(longrun.IllegalTransitionError, errors.IllegalTransitionError)
        self.assertEqual(errors.IllegalTransitionError.__module__, "longrun.errors")
        self.assertTrue(issubclass(errors.IllegalTransitionError, errors.LongrunError))
        self.assertIn("IllegalTransitionError", errors.__doc__ or "", "drawn in the tree")

    def test_every_error_a_public_module_defines_is_drawn_in_the_tree_of_longrun_errors(self) -> None:
        drawn = set(re.findall(r"\+-- (\w+)", errors.__doc__ or ""))
        found = []
        for module_name in public_modules():
            module = importlib.import_module(module_name)
            for name, value in vars(module).items():
                if (inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module_name
                        and not name.startswith("_")):  # fmt: skip
                    found.append(value)
        self.assertIn(errors.LongrunError, found)
        for error in found:
            qualified = f"{error.__module__}.{error.__name__}"
            if qualified in self.OUTSIDE:
                continue
            with self.subTest(qualified):
                self.assertTrue(issubclass(error, errors.LongrunError), "every error longrun raises is a LongrunError")
                self.assertTrue(error is errors.LongrunError or error.__name__ in drawn, "drawn in longrun.errors' tree")
                self.assertIs(getattr(errors, error.__name__, None), error, "importable from longrun.errors")


class DocumentedTests(unittest.TestCase):
    def test_the_store_and_the_central_records_say_what_they_are(self) -> None:
        from longrun import EffectRecord, JsonFileStore, Lease, RunState

        for cls in (JsonFileStore, RunState, EffectRecord, Lease):
            with self.subTest(cls.__name__):
                doc = cls.__doc__ or ""
                self.assertFalse(doc.startswith(f"{cls.__name__}("), "only the signature a dataclass makes up")
                self.assertGreater(len(doc.split()), 25, doc)


class LayerTests(unittest.TestCase):
    def imports_of(self, module: str) -> set[str]:
        """What ``module`` (a file, or every file of a package) imports, with leading dots dropped."""
        path = os.path.join(support.SRC, "longrun", module)
        files = [os.path.join(path, name) for name in sorted(os.listdir(path)) if name.endswith(".py")] if os.path.isdir(path) else [path]
        names: set[str] = set()
        for file in files:
            tree = parsed(file)
            names |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
            names |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        return {name.lstrip(".") for name in names}

    def test_the_engine_reads_control_records_only_through_the_source_protocols(self) -> None:
        for module in ("engine", "runner.py", "functions"):
            with self.subTest(module):
                imported = self.imports_of(module)
                self.assertFalse(imported & {"authority", "signing", "stores.controlfiles"}, sorted(imported))

    ENGINE_ORDER = ["_ops", "_config", "_invocation", "_steps", "_failures", "_effects", "_talk", "_drivers", "_engine"]
    """The engine's modules, each importing only those before it (counting every import)."""

    def engine_tree(self, name: str) -> ast.Module:
        return parsed(os.path.join(support.SRC, "longrun", "engine", name + ".py"))

    def test_each_module_of_the_engine_imports_only_the_modules_before_it(self) -> None:
        order = self.ENGINE_ORDER
        package = os.path.join(support.SRC, "longrun", "engine")
        self.assertEqual(sorted(name[:-3] for name in os.listdir(package) if name.startswith("_") and name.endswith(".py")),
                         sorted(order + ["__init__"]))  # fmt: skip
        for index, name in enumerate(order):
            with self.subTest(name):
                # Every import counts: inside a function and under TYPE_CHECKING too.
                imports = [node for node in ast.walk(self.engine_tree(name)) if isinstance(node, ast.ImportFrom) and node.level == 1]
                siblings = {node.module for node in imports if node.module} | {alias.name for node in imports if not node.module for alias in node.names}
                self.assertLessEqual(siblings, set(order[:index]), "a module imports only the modules before it")

    def test_no_engine_class_derives_from_another_engine_class(self) -> None:
        classes = {node.name: name for name in self.ENGINE_ORDER for node in ast.walk(self.engine_tree(name)) if isinstance(node, ast.ClassDef)}
        derived = []
        for name in self.ENGINE_ORDER:
            for node in ast.walk(self.engine_tree(name)):
                if isinstance(node, ast.ClassDef):
                    bases = {base.id for base in node.bases if isinstance(base, ast.Name)}
                    # A Protocol that extends a Protocol (AsyncPlan of Plan) adds a method to a seam; no state is shared.
                    if "Protocol" not in bases:
                        derived += [f"{node.name} ({name}) derives from {base} ({classes[base]})" for base in sorted(bases & set(classes))]
        self.assertEqual(derived, [])

    STEP_MODULES = ("_steps", "_effects", "_talk", "_invocation")
    """Where the rules are: they reach the store, the control sources and the lease only by yielding requests."""
    OUTSIDE = {
        "store", "load", "commit", "acquire_lease", "renew_lease", "release_lease", "read_lease",
        "read_cancellation", "read_approvals", "pause_requested", "cancellations", "approvals",
        "keeper", "current_lease", "renew", "apply", "observe", "sleep", "flush", "io",
    }  # fmt: skip

    def test_no_step_module_touches_a_store_a_control_source_or_the_lease_keeper(self) -> None:
        touched = []
        for name in self.STEP_MODULES:
            tree = self.engine_tree(name)
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and node.attr in self.OUTSIDE:
                    touched.append(f"{name}.py:{node.lineno} .{node.attr}")
                if isinstance(node, ast.ImportFrom):
                    names = {alias.name for alias in node.names}
                    if names & {"Store", "LeaseKeeper", "CancellationSource", "ApprovalSource", "RunIO", "SyncDriver", "AsyncDriver"}:
                        touched.append(f"{name}.py:{node.lineno} imports {sorted(names)}")
        self.assertEqual(touched, [])

    def test_the_step_module_rule_sees_a_store_call(self) -> None:
        # The check above must be able to fail: a store reached directly is what it looks for.
        tree = ast.parse("def step(inv, store):\n    store.commit(inv.lease, inv.state, frozenset())\n")
        self.assertIn("commit", {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)} & self.OUTSIDE)

    ENGINE_API = {"arun", "concurrently", "config", "drive", "driver", "invocation", "record", "refuse", "run", "run_parallel", "steps"}
    """What the faces may read off an engine: the steps API (a procedure of ``engine.procedures`` bound,
    driven or recorded), the options, the working state and the invocation's entry points. A new
    kind of step is a new procedure, not a new member; the set stays at most 15 names."""

    @staticmethod
    def engine_members_read(tree: ast.AST) -> set[str]:
        """The attribute names read off an engine object (``engine``, ``self._engine``, ``runner.engine``, ...)."""
        names = {"engine", "_engine"}
        return {
            node.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and ((isinstance(node.value, ast.Name) and node.value.id in names) or (isinstance(node.value, ast.Attribute) and node.value.attr in names))
        }

    def test_the_faces_use_the_engine_only_through_its_narrow_steps_api(self) -> None:
        used: dict[str, set[str]] = {}
        root = os.path.join(support.SRC, "longrun")
        for folder, _, files in os.walk(root):
            if os.path.relpath(folder, root).split(os.sep)[0] == "engine":
                continue
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    for member in self.engine_members_read(parsed(path)):
                        used.setdefault(member, set()).add(os.path.relpath(path, root))
        self.assertLessEqual(len(self.ENGINE_API), 15)
        self.assertEqual({member: sorted(where) for member, where in used.items() if member not in self.ENGINE_API}, {})

    def test_the_engine_api_rule_sees_a_member_read_off_an_engine(self) -> None:
        tree = ast.parse("def f(self, runner, engine):\n    engine.effect(s)\n    self._engine.state\n    runner.engine.clock.now()\n")
        self.assertEqual(self.engine_members_read(tree), {"effect", "state", "clock"})

    @staticmethod
    def relative_imports(*, at_load_only: bool = False) -> Iterator[tuple[str, str, str, str]]:
        """Every relative import in the package: (importing module, its package, the module or
        package imported from, the name imported). ``at_load_only``: only the imports a module runs
        when it is loaded (none under TYPE_CHECKING or inside a function)."""
        for folder, _, files in os.walk(os.path.join(support.SRC, "longrun")):
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(folder, name)
                module = os.path.relpath(path, support.SRC)[:-3].replace(os.sep, ".").removesuffix(".__init__")
                package = module if name == "__init__.py" else module.rsplit(".", 1)[0]
                tree = parsed(path)
                for node in tree.body if at_load_only else ast.walk(tree):
                    if isinstance(node, ast.ImportFrom) and node.level > 0:
                        parts = package.split(".")
                        target = ".".join(parts[: len(parts) - (node.level - 1)] + ([node.module] if node.module else []))
                        for alias in node.names:
                            yield module, package, target, alias.name

    @staticmethod
    def is_module(dotted: str) -> bool:
        where = os.path.join(support.SRC, *dotted.split("."))
        return os.path.exists(where + ".py") or os.path.isdir(where)

    def test_no_module_reaches_into_another_modules_private_names_or_another_packages_private_modules(self) -> None:
        # A private module (``_x``) belongs to its package: code of that package (and below it) may
        # import it, code elsewhere imports what the package exports. A private name belongs to its module.
        reaches = []
        for module, package, target, name in self.relative_imports():
            parts = target.split(".")
            for index, part in enumerate(parts):
                owner = ".".join(parts[:index])
                if part.startswith("_") and not part.startswith("__") and not (package + ".").startswith(owner + "."):
                    reaches.append(f"{module} imports {target}")
                    break
            if not name.startswith("_") or name.startswith("__"):
                continue
            if self.is_module(f"{target}.{name}"):  # a private module, imported as one
                if not (package + ".").startswith(target + "."):
                    reaches.append(f"{module} imports {target}.{name}")
            else:
                reaches.append(f"{module} imports {name} from {target}")
        self.assertEqual(sorted(set(reaches)), [])

    @classmethod
    def import_graph(cls) -> dict[str, set[str]]:
        """Every module of the package and the modules of the package it imports: every import
        counts, at load, under TYPE_CHECKING or inside a function, relative or absolute."""
        graph: dict[str, set[str]] = {}
        for folder, _, files in os.walk(os.path.join(support.SRC, "longrun")):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.relpath(os.path.join(folder, name), support.SRC)
                    graph[path[:-3].replace(os.sep, ".").removesuffix(".__init__")] = set()
        for module, _, target, name in cls.relative_imports():
            graph[module].add(f"{target}.{name}" if cls.is_module(f"{target}.{name}") else target)
        for module in graph:
            path = os.path.join(support.SRC, *module.split("."))
            tree = parsed(path + ".py" if os.path.exists(path + ".py") else os.path.join(path, "__init__.py"))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("longrun"):
                    graph[module] |= {f"{node.module}.{alias.name}" if cls.is_module(f"{node.module}.{alias.name}")
                                      else node.module or "" for alias in node.names}  # fmt: skip
                elif isinstance(node, ast.Import):
                    graph[module] |= {alias.name for alias in node.names if alias.name.split(".")[0] == "longrun"}
        for module, imported in graph.items():
            imported.discard(module)
        return graph

    @staticmethod
    def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
        """The strongly connected parts of ``graph`` with more than one module (each holds a
        cycle; a part is every module one can leave and come back to), each sorted."""
        index: dict[str, int] = {}
        lowest: dict[str, int] = {}
        stack: list[str] = []
        parts: list[list[str]] = []

        def visit(module: str) -> None:
            index[module] = lowest[module] = len(index)
            stack.append(module)
            for other in sorted(graph[module] & graph.keys()):
                if other not in index:
                    visit(other)
                    lowest[module] = min(lowest[module], lowest[other])
                elif other in stack:
                    lowest[module] = min(lowest[module], index[other])
            if lowest[module] == index[module]:
                part = stack[stack.index(module) :]
                del stack[stack.index(module) :]
                if len(part) > 1:
                    parts.append(sorted(part))

        for module in sorted(graph):
            if module not in index:
                visit(module)
        return sorted(parts)

    def test_the_modules_import_one_another_without_a_cycle(self) -> None:
        graph = self.import_graph()
        self.assertTrue(any(name.startswith("longrun.engine") for name in graph["longrun.runner"]), "imports are read")
        self.assertIn("longrun.testing.faults.report", graph["longrun.testing.faults.__main__"], "absolute ones too")
        self.assertEqual(self.cycles(graph), [])

    def test_the_cycle_finder_finds_a_cycle_through_an_import_inside_a_function(self) -> None:
        graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
        self.assertEqual(self.cycles(graph), [["a", "b", "c"]])
        self.assertEqual(self.cycles({"a": {"b"}, "b": set()}), [])

    LAYERS = {
        "engine": ("engine", "recovery", "clock"),
        "stores": ("stores",),
        "faces": ("runner", "functions", "session", "contractfile", "shell"),
        "applications": ("cli", "worker", "testing", "__main__", "authority", "signing", ""),
    }
    """Every other module is a record or a protocol (the layer under the engine and the stores)."""
    RANK = {"records": 0, "stores": 1, "engine": 1, "faces": 2, "applications": 3}

    def layer_of(self, module: str) -> str:
        top = module.split(".")[1] if "." in module else ""
        return next((layer for layer, tops in self.LAYERS.items() if top in tops), "records")

    def test_nothing_imports_upward_and_the_engine_and_the_stores_never_import_each_other(self) -> None:
        # faces -> engine -> records and protocols <- stores; applications above all of them. Every
        # import counts here, even one under TYPE_CHECKING or inside a function.
        upward = []
        for module, imported in self.import_graph().items():
            for other in imported:
                low, high = self.layer_of(module), self.layer_of(other)
                if self.RANK[high] > self.RANK[low] or {low, high} == {"engine", "stores"}:
                    upward.append(f"{module} ({low}) imports {other} ({high})")
        self.assertEqual(sorted(set(upward)), [])

    LONG = 500
    """Lines past which a module is long: a smell to explain, not a number to split at."""

    def test_a_long_module_is_one_concept_and_says_why_it_is_long(self) -> None:
        # One concept per module: a long one says in its docstring that it is one concept and why
        # it is long, so a split by size alone (a class spread over files) has no excuse.
        unexplained = []
        for folder, _, files in os.walk(os.path.join(support.SRC, "longrun")):
            for name in files:
                if name.endswith(".py"):
                    with open(os.path.join(folder, name)) as handle:
                        text = handle.read()
                    docstring = (ast.get_docstring(ast.parse(text)) or "").lower()
                    if text.count("\n") > self.LONG and not ("one concept" in docstring and "long" in docstring):
                        unexplained.append(f"{os.path.relpath(os.path.join(folder, name), support.SRC)}: {text.count(chr(10))} lines")
        self.assertEqual(unexplained, [])

    def test_a_base_class_is_a_real_variation_not_one_class_spread_over_modules(self) -> None:
        # Inheritance for real variation (BaseStore and a store per backend), composition for
        # structure: a class of the package that a class of another module derives from has at
        # least two subclasses. One with a single subclass elsewhere is that class spread over
        # modules: compose it. Not counted: Protocols, exceptions, test suites (unittest finds a
        # test only in a class's bases, so a suite is composed of mixins of test_ methods), and
        # the engine (held to its own rule).
        classes: dict[type, str] = {}
        for module_name in sorted(self.import_graph()):
            if module_name.endswith("__main__") or module_name.startswith("longrun.engine"):
                continue
            for value in vars(importlib.import_module(module_name)).values():
                if inspect.isclass(value) and value.__module__ == module_name:
                    classes[value] = f"{module_name}.{value.__qualname__}"
        subclasses: dict[type, list[str]] = {}
        for cls, name in classes.items():
            if issubclass(cls, (BaseException, unittest.TestCase)) or getattr(cls, "_is_protocol", False):
                continue
            for base in cls.__bases__:
                tests = any(member.startswith("test_") for member in vars(base))
                if base in classes and base.__module__ != cls.__module__ and not tests and not getattr(base, "_is_protocol", False):
                    subclasses.setdefault(base, []).append(name)
        single = sorted(f"{classes[base]} <- {names[0]}" for base, names in subclasses.items() if len(names) < 2)
        self.assertEqual(single, [])

    def test_signing_and_the_control_files_reach_no_private_module_of_another_package(self) -> None:
        self.assertEqual({name for name in self.imports_of("signing.py") if name.startswith("stores")}, set())
        private = {name for name in self.imports_of("authority.py") if "._" in name or name.startswith("_")}
        self.assertEqual(private - {"__future__"}, set())


if __name__ == "__main__":
    unittest.main()
