"""Every file tracing reads is in the trace key: ONNX external data, the modules a model's .py file imports.

Changing one such file (which the recipe does not name) traces again instead of restoring a stale trace.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support import copy_recipes

from dabuild.ir import Graph
from dabuild.pipeline.build import stages_for, workspace_for
from dabuild.pipeline.doit_tasks import run_stages
from dabuild.pipeline.execute import Outcome, Session
from dabuild.pipeline.stages import stage_functions
from dabuild.pipeline.store import Store
from dabuild.progress import Progress
from dabuild.recipe import load_recipe
from dabuild.trace.base import python_imports


def trace(recipe_dir: Path, build_root: Path) -> Outcome:
    """Run the recipe's trace stage alone, through doit and the run cache, as a build does."""
    recipe = load_recipe(recipe_dir / "recipe.yaml")
    stages, _ = stages_for(recipe, None)
    workspace = workspace_for(recipe, build_root)
    workspace.build_dir.mkdir(parents=True, exist_ok=True)
    session = Session(workspace, Store(), stage_functions(), Progress.silent())
    result = run_stages([stage for stage in stages if stage.kind == "trace"], session, 1)
    assert not result.failures, result.failures
    return session.outcomes["trace"][0]


def test_halved_onnx_external_data_traces_again(tmp_path: Path, cache_dir: Path) -> None:
    onnx = pytest.importorskip("onnx")
    recipes = copy_recipes(tmp_path, "digits", "digits-onnx")
    model_file = recipes / "digits-onnx" / "model.onnx"
    onnx.save(onnx.load(str(model_file)), str(model_file), save_as_external_data=True,
              all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=0)
    data_file = model_file.parent / "model.onnx.data"
    build_root = tmp_path / "build"
    assert trace(recipes / "digits-onnx", build_root) == Outcome.EXECUTED
    before = Graph.load(build_root / "digits-onnx" / "trace")
    assert trace(recipes / "digits-onnx", build_root) == Outcome.UP_TO_DATE

    weights = np.frombuffer(data_file.read_bytes(), dtype=np.float32)  # every tensor of this MLP is float32
    data_file.write_bytes((weights / 2).astype(np.float32).tobytes())
    assert trace(recipes / "digits-onnx", build_root) == Outcome.EXECUTED
    after = Graph.load(build_root / "digits-onnx" / "trace")
    name = next(iter(before.constants))
    np.testing.assert_array_equal(after.constants[name], before.constants[name] / 2)

    data_file.write_bytes(weights.tobytes())  # reverted: the first trace comes back from the cache
    assert trace(recipes / "digits-onnx", build_root) == Outcome.RESTORED


def test_changed_module_imported_by_a_torch_model_traces_again(tmp_path: Path, cache_dir: Path) -> None:
    pytest.importorskip("torch")
    recipes = copy_recipes(tmp_path, "digits", "digits-torch")
    folder = recipes / "digits-torch"
    (folder / "blocks").mkdir()
    (folder / "blocks" / "__init__.py").write_text("")
    (folder / "blocks" / "widths.py").write_text("HIDDEN = (32, 16)\n")
    model = folder / "model.py"
    model.write_text(model.read_text().replace("from torch import nn\n",
                                               "from torch import nn\n\nfrom blocks.widths import HIDDEN  # noqa\n"))
    assert python_imports(model) == [folder / "blocks" / "__init__.py", folder / "blocks" / "widths.py"]
    build_root = tmp_path / "build"
    assert trace(folder, build_root) == Outcome.EXECUTED
    assert trace(folder, build_root) == Outcome.UP_TO_DATE
    (folder / "blocks" / "widths.py").write_text("HIDDEN = (32, 16)  # the same widths, written again\n")
    assert trace(folder, build_root) == Outcome.EXECUTED
    (folder / "blocks" / "__init__.py").write_text("# a package\n")
    assert trace(folder, build_root) == Outcome.EXECUTED


def test_python_imports_follow_local_modules_only(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text("import numpy as np\nimport layers\nfrom . import helpers\n")
    (tmp_path / "layers.py").write_text("from ops import relu\n")
    (tmp_path / "ops.py").write_text("import os\n")
    (tmp_path / "helpers.py").write_text("this is not python (\n")  # importing reports it; reading skips it
    assert python_imports(tmp_path / "model.py") == [tmp_path / name for name in ("helpers.py", "layers.py", "ops.py")]
