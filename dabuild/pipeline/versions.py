"""How stage versions follow their implementation: a recorded digest of each stage's code.

A stage's version is part of its cache key (plan.STAGE_VERSIONS), so a cached
output is reused only while the code that wrote it is unchanged. Remembering to
bump it is not left to people: `implementation_digest(kind)` hashes the code a
stage kind runs (the modules of its roots and every dabuild module they import,
at any depth and inside functions, plus the templates and C sources in those
packages, and the stage's adapter in pipeline/stages.py), and
`stage_versions.json` records, per kind, that digest with the version it was
recorded under. tests/test_stage_versions.py fails when a digest changed while
the version did not ("bump STAGE_VERSIONS[...]"), and when a version changed
but the record did not ("run python -m dabuild.pipeline.versions"). A branch
bumps each stage once: for later changes on the same branch,
`python -m dabuild.pipeline.versions --same-version` re-records the digest under
the version it already bumped (a conscious statement, not a silent default).

Python is hashed as its syntax tree without docstrings, so comments, docstrings
and formatting never ask for a bump; any change to code does, even one that
changes no output: a needless bump costs one rebuild, a missing one ships wrong
cached artifacts. The wiring (the rest of pipeline/, cli) is left out: it
decides where outputs go, not what they hold.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import sys
import textwrap
from functools import cache
from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parent.parent
RECORD = Path(__file__).with_name("stage_versions.json")
WIRING = ("dabuild.pipeline", "dabuild.cli", "dabuild.progress")

# Per stage kind, the packages or modules whose code computes its outputs; built-in plugins included.
STAGE_ROOTS: dict[str, tuple[str, ...]] = {
    "trace": ("dabuild.trace", "dabuild.targets.base"),
    "calibrate": ("dabuild.quant.calibrate", "dabuild.data"),
    "tune": ("dabuild.tune", "dabuild.targets.hdl.cost", "dabuild.data"),
    "export": ("dabuild.targets",),
    "check": ("dabuild.targets", "dabuild.data"),
}


def _module_file(name: str) -> Path | None:
    parts = name.split(".")
    if parts[0] != "dabuild":
        return None
    base = PACKAGE_DIR.joinpath(*parts[1:])
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


@cache
def _imports(name: str) -> tuple[str, ...]:
    """The dabuild modules `name` imports anywhere in its body (and the packages above them)."""
    file = _module_file(name)
    assert file is not None, name
    found: set[str] = set()
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    modules: set[str] = set()
    for module in found:
        parts = module.split(".")
        modules.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return tuple(sorted(m for m in modules if _module_file(m) is not None))


def closure(kind: str) -> list[str]:
    """The dabuild modules whose code stage `kind` runs, wiring left out."""
    pending = []
    for root in STAGE_ROOTS[kind]:
        pending += [root, *(_submodules(root) if _is_package(root) else [])]
    seen: set[str] = set()
    while pending:
        module = pending.pop()
        if module in seen or module.startswith(WIRING):
            continue
        seen.add(module)
        pending += _imports(module)
    return sorted(seen)


def _code(source: str) -> str:
    """The syntax tree of Python `source` without docstrings: what the code does, not how it is written."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def _data_files(modules: list[str]) -> list[Path]:
    """Non-Python files (templates, C sources) whose nearest package is one of `modules`."""
    packages = {PACKAGE_DIR.joinpath(*m.split(".")[1:]) for m in modules if _is_package(m)}
    files = []
    for path in sorted(PACKAGE_DIR.rglob("*")):
        if not path.is_file() or path.suffix in (".py", ".pyc") or "__pycache__" in path.parts:
            continue
        folder = path.parent
        while not (folder / "__init__.py").is_file() and folder != PACKAGE_DIR:
            folder = folder.parent
        if folder in packages:
            files.append(path)
    return files


def implementation_digest(kind: str) -> str:
    """sha256 over stage `kind`'s adapter, modules and data files (see the module docstring)."""
    from dabuild.pipeline import stages

    digest = hashlib.sha256()
    adapter = stages.stage_functions()[kind]
    digest.update(_code(textwrap.dedent(inspect.getsource(adapter))).encode())
    modules = closure(kind)
    for module in modules:
        file = _module_file(module)
        assert file is not None
        digest.update(f"\0{module}\0".encode() + _code(file.read_text()).encode())
    for path in _data_files(modules):
        digest.update(f"\0{path.relative_to(PACKAGE_DIR).as_posix()}\0".encode() + path.read_bytes())
    return digest.hexdigest()


Record = dict[str, dict[str, Any]]  # stage kind -> {"version": int, "digest": str}


def current() -> Record:
    """Per stage kind, its version now and the digest of its code now."""
    from dabuild.pipeline.plan import STAGE_VERSIONS

    return {kind: {"version": version, "digest": implementation_digest(kind)}
            for kind, version in sorted(STAGE_VERSIONS.items())}


def recorded() -> Record:
    return json.loads(RECORD.read_text()) if RECORD.is_file() else {}


def stale() -> list[str]:
    """What keeps the record from matching the code: one sentence per stage kind, empty when all is well."""
    from dabuild.pipeline.plan import STAGE_VERSIONS

    problems = []
    record = recorded()
    for kind, now in current().items():
        then = record.get(kind)
        if then is None or then["version"] != now["version"]:
            problems.append(f"{kind}: version {now['version']} is not recorded; run `python -m "
                            "dabuild.pipeline.versions` to record it with its code digest")
        elif then["digest"] != now["digest"]:
            problems.append(f"{kind}: the code the stage runs changed (digest {now['digest'][:12]}, recorded "
                            f"{str(then['digest'])[:12]}) but its version did not: bump STAGE_VERSIONS["
                            f"{kind!r}] in dabuild/pipeline/plan.py (now {STAGE_VERSIONS[kind]}), then run "
                            "`python -m dabuild.pipeline.versions`")
    return problems


def main(argv: list[str] | None = None) -> int:
    """Record the current versions and digests.

    A changed digest under an unchanged version is refused, unless `--same-version` says that this
    branch has already bumped the stage for an earlier change since main (one bump per branch is enough:
    the versions on main never saw this branch's code).
    """
    same_version = "--same-version" in (sys.argv[1:] if argv is None else argv)
    unbumped = [problem for problem in stale() if "bump" in problem]
    if unbumped and not same_version:
        print("\n".join(unbumped), file=sys.stderr)
        print("(if this branch already bumped these versions since main, run with --same-version)", file=sys.stderr)
        return 1
    RECORD.write_text(json.dumps(current(), indent=2, sort_keys=True) + "\n")
    print(f"recorded {RECORD}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
