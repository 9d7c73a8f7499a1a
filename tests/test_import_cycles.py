"""Import cycles among dabuild's modules, found from the source (every import, a function's lazy ones included;
those under `if TYPE_CHECKING:` left out, as they never run). A lazy import only hides a cycle: the modules
still need each other, so the layering is not what the package tree says.

Run as a script to print every cycle: `python tests/test_import_cycles.py`.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dabuild"


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imported(tree: ast.AST, modules: set[str]) -> set[str]:
    """The dabuild modules an AST imports: `from a.b import c` is a.b.c where that is a module, else a.b."""
    found: set[str] = set()
    skipped = {id(n) for node in ast.walk(tree) if _type_checking_only(node) for n in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                      for alias in node.names}
    return {name for name in found if name in modules}


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the dabuild modules it imports."""
    files = {_module_name(path, package.parent): path for path in sorted(package.rglob("*.py"))}
    return {name: _imported(ast.parse(path.read_text(encoding="utf-8")), set(files)) - {name}
            for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: strongly connected sets of two or more modules (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in sorted(graph.get(module, ())):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def cycles_within(prefix: str) -> list[list[str]]:
    """The cycles among the modules of one package (its own imports only)."""
    graph = {name: {other for other in edges if other.startswith(prefix)}
             for name, edges in import_graph().items() if name.startswith(prefix)}
    return cycles(graph)


def test_the_finder_sees_a_cycle_a_lazy_import_hides(tmp_path: Path) -> None:
    package = tmp_path / "dabuild"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from dabuild.b import thing\n")
    (package / "b.py").write_text("def thing():\n    from dabuild import a\n    return a\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dabuild import a\n")
    (package / "d.py").write_text("import dabuild.c\n")
    assert cycles(import_graph(package)) == [["dabuild.a", "dabuild.b"]]


@pytest.mark.parametrize("package", ["dabuild.quant.", "dabuild.qir.", "dabuild.ir.", "dabuild.targets.",
                                     "dabuild.pipeline.", "dabuild.tune."])
def test_no_import_cycle_inside(package: str) -> None:
    assert cycles_within(package) == []


def test_no_import_cycle_anywhere() -> None:
    """`python tests/test_import_cycles.py` prints them, should one come back."""
    assert cycles(import_graph()) == []


def reached(graph: dict[str, set[str]], roots: list[str]) -> set[str]:
    """Every module `roots` import, at any depth (lazy imports too)."""
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        module = stack.pop()
        if module not in seen:
            seen.add(module)
            stack.extend(graph.get(module, ()))
    return seen


def imports_from_above(package: str, above: tuple[str, ...]) -> dict[str, list[str]]:
    """Module of `package` -> the modules under `above` it reaches (every module with none left out)."""
    graph = import_graph()
    found = {module: sorted(other for other in reached(graph, [module]) if other.startswith(above))
             for module in graph if module == package or module.startswith(package + ".")}
    return {module: others for module, others in found.items() if others}


def test_the_layering_sees_an_import_from_above(tmp_path: Path) -> None:
    package = tmp_path / "dabuild"
    (package / "qir").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "qir" / "__init__.py").write_text("")
    (package / "qir" / "layer.py").write_text("def f():\n    from dabuild import lowering\n")
    (package / "lowering.py").write_text("")
    assert reached(import_graph(package), ["dabuild.qir.layer"]) == {"dabuild.qir.layer", "dabuild.lowering"}


def test_the_integer_ir_sits_below_lowering_calibration_tuning_and_targets() -> None:
    """dabuild.qir holds the data and integer semantics every target reads; how its numbers were chosen
    (quant/: calibration, lowering, bias correction) and what reads it (tune, targets, pipeline) stay above."""
    above = ("dabuild.quant", "dabuild.tune", "dabuild.targets", "dabuild.pipeline", "dabuild.trace")
    assert imports_from_above("dabuild.qir", above) == {}


def test_targets_depend_on_the_integer_ir_and_not_on_the_quantizer() -> None:
    """A target writes out and checks against dabuild.qir; calibration, lowering and tuning never reach it
    (the ops' integer forms come to `Target.refuse` from the pipeline)."""
    assert imports_from_above("dabuild.targets", ("dabuild.quant", "dabuild.tune", "dabuild.pipeline")) == {}

if __name__ == "__main__":
    every = cycles(import_graph())
    for cycle in every:
        print(f"{len(cycle)} modules: {' '.join(cycle)}")
    print(f"{len(every)} import cycles, {sum(map(len, every))} modules in them")
