"""Stage keys follow the code each stage runs, per plugin, with no hand-kept versions."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from dabuild.pipeline import code_digest


@pytest.fixture
def fresh_digests() -> Iterator[None]:
    """The digests are memoised per process; a test that edits code starts and ends with empty memos."""
    def clear() -> None:
        code_digest.stage_code_digest.cache_clear()
        code_digest._module_imports.cache_clear()
        code_digest._module_file.cache_clear()
        code_digest._package_root.cache_clear()
    clear()
    yield
    clear()


def _plugin(root: Path, name: str, modules: dict[str, str]) -> None:
    for relative, source in modules.items():
        path = root / name / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))


def test_a_target_plugins_code_changes_its_own_export_key_only(tmp_path: Path, fresh_digests: None,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    _plugin(tmp_path, "toy_alpha", {"__init__.py": "from toy_alpha.kernels import run\n",
                                    "kernels.py": "def run():\n    return 1\n", "kernel.c": "int f(void);\n"})
    _plugin(tmp_path, "toy_beta", {"__init__.py": "import importlib\nLAZY = importlib.import_module('toy_beta.lazy')\n",
                                   "lazy.py": "X = 1\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    alpha, beta = (code_digest.stage_code_digest("export", (name,)) for name in ("toy_alpha", "toy_beta"))
    assert alpha != beta

    (tmp_path / "toy_beta" / "lazy.py").write_text("X = 2\n")
    code_digest.stage_code_digest.cache_clear()
    assert code_digest.stage_code_digest("export", ("toy_alpha",)) == alpha
    assert code_digest.stage_code_digest("export", ("toy_beta",)) != beta

    (tmp_path / "toy_alpha" / "kernel.c").write_text("int f(void) { return 2; }\n")  # a C source, not Python
    code_digest.stage_code_digest.cache_clear()
    assert code_digest.stage_code_digest("export", ("toy_alpha",)) != alpha
    assert "toy_alpha" not in sys.modules, "the digest reads the plugin's files without importing it"


def test_the_built_in_targets_do_not_share_code_they_do_not_run() -> None:
    c_code = code_digest.closure((*code_digest.adapter_roots("export"), "dabuild.targets.c"))
    nnef_code = code_digest.closure((*code_digest.adapter_roots("export"), "dabuild.targets.nnef"))
    assert "dabuild.targets.c.codegen" in c_code and "dabuild.targets.nnef.emitter" in nnef_code
    assert not any(m.startswith("dabuild.targets.nnef") for m in c_code)
    assert not any(m.startswith("dabuild.targets.c.") for m in nnef_code)
    assert code_digest.stage_code_digest("export", ("dabuild.targets.c",)) != \
        code_digest.stage_code_digest("export", ("dabuild.targets.nnef",))


def test_each_stage_closes_over_what_it_runs_and_not_the_wiring() -> None:
    assert "dabuild.ir.interpreter" in code_digest.closure(code_digest.adapter_roots("calibrate"))
    assert "dabuild.tune.search" not in code_digest.closure((*code_digest.adapter_roots("export"),
                                                             "dabuild.targets.c"))
    for kind in ("trace", "calibrate", "tune", "export", "check"):
        assert not any(m.startswith(code_digest.WIRING) for m in code_digest.closure(code_digest.adapter_roots(kind)))


def test_imports_are_read_wherever_they_are_written() -> None:
    names = code_digest.imported_names(textwrap.dedent('''
        import os, dabuild.ir.graph as g
        def f():
            from dabuild.quant import (
                calibrate,
                lowering as low,
            )
            return importlib.import_module("dabuild.ir.ops.activation")
    '''))
    assert {"dabuild.ir.graph", "dabuild.quant.calibrate", "dabuild.quant.lowering",
            "dabuild.ir.ops.activation", "dabuild.ir", "os"} <= names


def test_every_stage_key_holds_its_code_digest() -> None:
    from dabuild.pipeline.build import stages_for
    from dabuild.recipe import load_recipe

    recipe = load_recipe(Path(__file__).resolve().parent.parent / "recipes" / "digits" / "recipe.yaml")
    stages = {stage.name: stage for stage in stages_for(recipe, None)[0]}
    assert stages["export:mcu"].plugins == ("dabuild.targets.c",)
    assert stages["trace"].plugins == ("dabuild.trace.numpy_tracer",)
    for stage in stages.values():
        assert stage.static_parts["code"] == code_digest.stage_code_digest(stage.kind, stage.plugins)
