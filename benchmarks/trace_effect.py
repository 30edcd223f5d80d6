"""How much of longrun one effect walks through: ``python benchmarks/trace_effect.py [--list]``.

Runs a durable function of three effects on a ``JsonFileStore`` in a temporary directory with a
small in-memory adapter, synchronously, and traces the second effect's ``run.effect(...)`` call
only (the first apply of every run observes the target first, which is not the ordinary path;
the third keeps the second's verification from being a stop's commit). With ``sys.setprofile``
active around that one call it counts the distinct source files, functions and classes of
``src/longrun`` that the call enters, and how many calls it makes into them.

It also counts, statically, the engine members used from outside ``engine/``: the attribute
names read off an engine object (a name bound to an ``Engine``, ``engine``, ``self._engine``,
``self.engine``, ``runner.engine``) in the faces and applications (every module of
``src/longrun`` outside ``engine/``). ``--list`` prints the names behind every count.

Standard library only; a measurement, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import tempfile
from types import FrameType
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SOURCE = os.path.join(ROOT, "src", "longrun")
sys.path.insert(0, os.path.join(ROOT, "src"))

import longrun  # noqa: E402
from longrun.adapters import Observation, Receipt  # noqa: E402


class Adapter:
    """A target in memory: remembers what was applied by key; observes it from there."""

    deduplicates = True

    def __init__(self) -> None:
        self.applied: dict[str, Any] = {}

    def apply(self, request: Any) -> Receipt:
        self.applied[request.key] = request.payload
        return Receipt(evidence=f"stored {request.key}")

    def observe(self, request: Any) -> Observation:
        if request.key in self.applied:
            return Observation.applied("found")
        return Observation.absent("not found")


def trace_one_effect() -> tuple[dict[str, int], int]:
    """Run the function; return the (file, qualified name, class) entered by the traced effect and the call count."""
    entered: dict[tuple[str, str, str], int] = {}
    calls = 0

    def profile(frame: FrameType, event: str, arg: object) -> None:
        nonlocal calls
        if event != "call":
            return
        filename = frame.f_code.co_filename
        if not filename.startswith(SOURCE):
            return
        calls += 1
        qualname = frame.f_code.co_qualname
        owner = qualname.rsplit(".", 1)[0] if "." in qualname else ""
        owner = "" if owner.endswith("<locals>") or owner == "" else owner.split(".<locals>")[0]
        key = (os.path.relpath(filename, SOURCE), qualname, owner)
        entered[key] = entered.get(key, 0) + 1

    with tempfile.TemporaryDirectory(prefix="longrun-trace-") as directory:
        store = longrun.JsonFileStore(directory)
        adapter = Adapter()

        @longrun.durable(store=store, adapters={"write": adapter})
        def job(run: longrun.Run) -> None:
            run.effect("first", "write", {"n": 1})
            sys.setprofile(profile)
            try:
                run.effect("second", "write", {"n": 2})
            finally:
                sys.setprofile(None)
            run.effect("third", "write", {"n": 3})

        outcome = job.run(task_id="traced")
        if outcome.status is not longrun.Status.DONE:
            raise SystemExit(f"the traced run ended {outcome.status.value}: {outcome.next_action}")
    counts = {"|".join(key): count for key, count in entered.items()}
    return counts, calls


_ENGINE_NAMES = {"engine", "_engine"}


def _is_engine(node: ast.expr) -> bool:
    """Whether ``node`` names an engine object by the faces' conventions."""
    if isinstance(node, ast.Name):
        return node.id in _ENGINE_NAMES
    if isinstance(node, ast.Attribute):
        return node.attr in _ENGINE_NAMES
    return False


def engine_members_used_outside() -> dict[str, list[str]]:
    """Engine attribute name -> the modules (outside ``engine/``) that read it off an engine object."""
    used: dict[str, set[str]] = {}
    for folder, _, files in os.walk(SOURCE):
        relative = os.path.relpath(folder, SOURCE)
        if relative == "engine" or relative.startswith("engine" + os.sep):
            continue
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as handle:
                tree = ast.parse(handle.read(), path)
            module = os.path.relpath(path, SOURCE)
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and _is_engine(node.value):
                    used.setdefault(node.attr, set()).add(module)
    return {member: sorted(modules) for member, modules in sorted(used.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--list", action="store_true", help="print the files, functions, classes and members counted")
    options = parser.parse_args()
    counts, calls = trace_one_effect()
    keys = [key.split("|") for key in counts]
    files = sorted({file for file, _, _ in keys})
    functions = sorted({f"{file}:{qualname}" for file, qualname, _ in keys})
    classes = sorted({f"{file}:{owner}" for file, _, owner in keys if owner})
    members = engine_members_used_outside()
    print(f"one run.effect (sync, JsonFileStore): {calls} calls into {len(functions)} functions, {len(files)} files, {len(classes)} classes")
    print(f"engine members used from outside engine/: {len(members)}")
    if options.list:
        print("\nfiles:")
        for file in files:
            print(f"  {file}")
        print("\nfunctions (calls):")
        for key, count in sorted(counts.items()):
            file, qualname, _ = key.split("|")
            print(f"  {file}:{qualname}  {count}")
        print("\nclasses:")
        for owner in classes:
            print(f"  {owner}")
        print("\nengine members used from outside engine/:")
        for member, modules in members.items():
            print(f"  {member}: {', '.join(modules)}")


if __name__ == "__main__":
    main()
