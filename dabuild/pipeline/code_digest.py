"""A stage's version is a digest of the code it runs: nothing to bump, nothing to forget.

Each stage's cache key holds `stage_code_digest(kind, plugins)` instead of a
hand-kept integer, as DVC keys a stage by its own entry. The digest covers the
stage's adapter in pipeline/stages.py, the dabuild modules that adapter imports,
the plugins the stage runs (a target's, tracer's or cost model's package, so
`export:c` is not rebuilt when the nnef target changes), every module those
import at any depth (inside functions too, and modules named in string literals,
which is how registries and plugins load lazily), and the non-Python files
(templates, C sources) of every package in that closure. The wiring (the rest
of pipeline/, cli, progress) is left out: it decides where outputs go, not what
they hold.

Files are hashed as bytes and imports found by a regular expression rather than
by parsing, so the digest of a whole stage costs milliseconds, not the seconds an
AST walk of ~200 modules takes. Both err on the safe side: an edited comment or
docstring reruns the stage (a needless rebuild), an import the expression
over-reads adds a module (also a needless rebuild); neither can let a changed
module keep an old key.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import re
import textwrap
from functools import cache
from pathlib import Path

WIRING = ("dabuild.pipeline", "dabuild.cli", "dabuild.progress")
PACKAGE_DIR = Path(__file__).resolve().parent.parent

_FROM_IMPORT = re.compile(r"^[ \t]*from[ \t]+([\w.]+)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]*)", re.MULTILINE)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([\w.][\w. \t,]*)", re.MULTILINE)
_NAMED = re.compile(r"""["']([A-Za-z_]\w*(?:\.\w+)+)["']""")


@cache
def _package_root(top: str) -> Path | None:
    """The folder (or single file) of top-level package `top`, found without importing it."""
    if top == "dabuild":
        return PACKAGE_DIR
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    origin = Path(spec.origin)
    return origin.parent if spec.submodule_search_locations else origin


@cache  # thousands of lookups per build, of a few hundred names: each costs file-system calls
def _module_file(name: str) -> Path | None:
    parts = name.split(".")
    root = _package_root(parts[0])
    if root is None or root.suffix == ".so":
        return None
    if root.is_file():
        return root if len(parts) == 1 else None
    base = root.joinpath(*parts[1:])
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _is_package(name: str) -> bool:
    file = _module_file(name)
    return file is not None and file.name == "__init__.py"


def _submodules(package: str) -> list[str]:
    """Every module inside `package`, at any depth."""
    file = _module_file(package)
    assert file is not None and file.name == "__init__.py", package
    return [package + "." + ".".join(path.relative_to(file.parent).with_suffix("").parts).removesuffix(".__init__")
            for path in sorted(file.parent.rglob("*.py")) if path != file]


def imported_names(source: str) -> set[str]:
    """Every dotted name `source` imports or names in a string literal, with the packages above it.

    `from a.b import c` yields a.b and a.b.c (c may be a module); names that are not modules of a known
    package are dropped later, so over-reading costs nothing but a needless rebuild.
    """
    found: set[str] = set()
    for module, names in _FROM_IMPORT.findall(source):
        found.add(module)
        for name in names.strip("()").replace("\n", " ").split(","):
            name = name.split(" as ")[0].strip()
            if name and name != "*":
                found.add(f"{module}.{name}")
    for names in _IMPORT.findall(source):
        found.update(name.split(" as ")[0].strip() for name in names.split(","))
    found.update(_NAMED.findall(source))
    expanded: set[str] = set()
    for name in found:
        parts = name.split(".")
        expanded.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return expanded


def _tops(roots: tuple[str, ...]) -> frozenset[str]:
    """The top-level packages whose modules count: dabuild's and the plugins'."""
    return frozenset({"dabuild", *(root.split(".")[0] for root in roots)})


@cache  # each module is read once per process, whichever stages' closures hold it
def _module_imports(name: str) -> tuple[str, ...]:
    file = _module_file(name)
    assert file is not None, name
    names = imported_names(file.read_text(encoding="utf-8", errors="replace"))
    return tuple(sorted(m for m in names if _module_file(m) is not None))


def _imports(name: str, tops: frozenset[str]) -> list[str]:
    return [m for m in _module_imports(name) if m.split(".")[0] in tops]


def closure(roots: tuple[str, ...]) -> list[str]:
    """The modules whose code runs from `roots` (a package root brings all its modules), wiring left out."""
    tops = _tops(roots)
    pending: list[str] = []
    for root in roots:
        if _module_file(root) is None:
            continue
        pending += [root, *(_submodules(root) if _is_package(root) else [])]
    seen: set[str] = set()
    while pending:
        module = pending.pop()
        if module in seen or module.startswith(WIRING):
            continue
        seen.add(module)
        pending += _imports(module, tops)
    return sorted(seen)


def _data_files(modules: list[str]) -> list[Path]:
    """Non-Python files (templates, C sources) whose nearest package is one of `modules`."""
    packages = {_module_file(m).parent for m in modules if _is_package(m)}  # type: ignore[union-attr]
    files = []
    for folder in sorted(packages):
        for path in sorted(folder.iterdir()):
            if path.is_file() and path.suffix not in (".py", ".pyc"):
                files.append(path)
            elif path.is_dir() and path.name != "__pycache__" and not (path / "__init__.py").is_file():
                files += sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                                and p.suffix != ".pyc")
    return files


def adapter_roots(kind: str) -> tuple[str, ...]:
    """The modules stage `kind`'s adapter in pipeline/stages.py imports: where its code starts."""
    from dabuild.pipeline import stages

    source = textwrap.dedent(inspect.getsource(stages.stage_functions()[kind]))
    return tuple(sorted(m for m in imported_names(source) if m.startswith("dabuild.") and _module_file(m)))


@cache
def stage_code_digest(kind: str, plugins: tuple[str, ...] = ()) -> str:
    """sha256 over stage `kind`'s adapter and the closure of its code and `plugins`' modules."""
    from dabuild.pipeline import stages

    digest = hashlib.sha256(kind.encode())
    digest.update(textwrap.dedent(inspect.getsource(stages.stage_functions()[kind])).encode())
    modules = closure((*adapter_roots(kind), *plugins))
    for module in modules:
        file = _module_file(module)
        assert file is not None
        digest.update(f"\0{module}\0".encode() + file.read_bytes())
    for path in _data_files(modules):
        name = path.relative_to(PACKAGE_DIR).as_posix() if path.is_relative_to(PACKAGE_DIR) else path.name
        digest.update(f"\0{name}\0".encode() + path.read_bytes())
    return digest.hexdigest()
