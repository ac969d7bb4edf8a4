"""The package's shape, checked from its source: dependencies point down the layers, no import
cycles (function-level imports included), lazy imports only at the boundary that keeps the CLI
torch-free, no method name compared outside ``methods/``, no attribute probing in the engine, no
module over 600 lines.

The layers, lowest first (a module may import from its own layer and those below)::

    0 types, config, files, progress, machine, suites, detokenize, agreement, data (the package root)
    1 tree, cache
    2 models, retrieval
    3 verify, drafters
    4 composers, budget
    5 engine
    6 batch
    7 methods
    8 api, calibration, integrations
    9 serve, bench
    10 cli
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import specgraft
from specgraft.methods import METHODS

ROOT = Path(specgraft.__file__).parent
LAYER = {
    **dict.fromkeys(["", "types", "config", "files", "progress", "machine", "suites", "detokenize", "agreement", "data"], 0),
    **dict.fromkeys(["tree", "cache"], 1),
    **dict.fromkeys(["models", "retrieval"], 2),
    **dict.fromkeys(["verify", "drafters"], 3),
    **dict.fromkeys(["composers", "budget"], 4),
    "engine": 5,
    "batch": 6,
    "methods": 7,
    **dict.fromkeys(["api", "calibration", "integrations"], 8),
    **dict.fromkeys(["serve", "bench"], 9),
    "cli": 10,
}
#: Where function-level imports of the package are allowed: the CLI and the method specs import
#: their torch side on use (``specgraft --help`` loads no torch), and the vLLM probe imports vLLM's
#: worker only in vLLM's venv.
LAZY_OK = ("specgraft.cli", "specgraft.methods", "specgraft.integrations.vllm_probe")


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        name = ".".join(("specgraft", *path.relative_to(ROOT).with_suffix("").parts))
        out[name.removesuffix(".__init__")] = path
    return out


def unit(module: str) -> str:
    """The top-level part of the package a module belongs to: ``specgraft.models.hf`` -> ``models``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def imports(module: str, path: Path) -> list[tuple[str, bool]]:
    """``(imported specgraft module, inside a function)`` for every import but ``TYPE_CHECKING`` ones."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: list[tuple[str, bool]] = []

    class Visitor(ast.NodeVisitor):
        depth = 0

        def visit_FunctionDef(self, node):
            self.depth += 1
            self.generic_visit(node)
            self.depth -= 1

        visit_AsyncFunctionDef = visit_FunctionDef

        def visit_If(self, node):
            if "TYPE_CHECKING" not in ast.unparse(node.test):
                self.generic_visit(node)

        def visit_Import(self, node):
            found.extend((a.name, self.depth > 0) for a in node.names if a.name.split(".")[0] == "specgraft")

        def visit_ImportFrom(self, node):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "specgraft":
                found.append((target, self.depth > 0))

    Visitor().visit(ast.parse(path.read_text()))
    return found


GRAPH = {name: imports(name, path) for name, path in modules().items()}


def test_every_part_of_the_package_has_a_layer():
    assert {unit(m) for m in GRAPH} <= set(LAYER), sorted({unit(m) for m in GRAPH} - set(LAYER))


def test_dependencies_point_down():
    upward = [
        f"{a} -> {b}" for a, targets in GRAPH.items() for b, _ in targets
        if unit(a) != unit(b) and LAYER[unit(b)] > LAYER[unit(a)]
    ]
    assert not upward, upward


def test_no_import_cycles_between_parts():
    edges = defaultdict(set)
    for a, targets in GRAPH.items():
        edges[unit(a)].update(unit(b) for b, _ in targets if unit(b) != unit(a))

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(n == goal or (n not in seen and not seen.add(n) and reaches(n, goal, seen)) for n in edges[start])

    cycles = sorted(p for p in edges if reaches(p, p, set()))
    assert not cycles, f"parts of the package in an import cycle: {cycles}"


def test_lazy_imports_only_at_the_torch_free_boundary():
    lazy = sorted(f"{a} -> {b}" for a, targets in GRAPH.items() for b, inside in targets if inside and not a.startswith(LAZY_OK))
    assert not lazy, lazy


def test_no_method_name_compared_outside_methods():
    """Behaviour hangs on ``MethodSpec`` fields, not on names; ``ar`` is exempt: it is the
    benchmark's baseline row (``bench/``), which every report compares against by name."""
    names = "|".join(re.escape(m) for m in sorted(set(METHODS) - {"ar"}, key=len, reverse=True))
    compare = re.compile(rf"""(==|!=|startswith\(|\bin\s*\(?)\s*["']({names})["']|["']({names})["']\s*(==|!=)""")
    found = [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
        for name, path in modules().items() if unit(name) != "methods"
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if compare.search(line) and not line.lstrip().startswith(("#", ">>>"))
    ]
    assert not found, found


def test_the_engine_probes_no_attributes():
    source = (ROOT / "engine.py").read_text()
    assert not re.search(r"\b(hasattr|getattr)\(", source)


def test_no_module_over_600_lines():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > 600}
    assert not long, long
