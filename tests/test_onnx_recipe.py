"""The digits-onnx example recipe builds end to end: trace (ONNX), calibrate, tune, export:c, check:c."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from conftest import copy_recipes  # noqa: E402

from dabuild.cli import main  # noqa: E402
from dabuild.ir import Graph  # noqa: E402
from dabuild.ir.passes import optimize  # noqa: E402
from dabuild.pipeline.build import stages_for  # noqa: E402
from dabuild.pipeline.plan import key_parts  # noqa: E402
from dabuild.recipe import load_recipe  # noqa: E402
from dabuild.trace import load_model, trace_model  # noqa: E402

RECIPES = Path(__file__).resolve().parent.parent / "recipes"
ALL_STAGES = {"trace", "calibrate", "tune:c", "export:mcu", "check:mcu"}


@pytest.fixture
def recipes(tmp_path: Path) -> Path:
    """Copies of digits-onnx and of the digits folder whose data it reads, side by side as in the repo."""
    return copy_recipes(tmp_path, "digits", "digits-onnx")


def test_digits_onnx_builds_and_checks_exactly(recipes: Path, tmp_path: Path, cache_dir: Path) -> None:
    build_root = tmp_path / "build"
    assert main(["build", str(recipes / "digits-onnx"), "--build-dir", str(build_root), "-q"]) == 0
    summary = json.loads((build_root / "digits-onnx" / "build.json").read_text())
    assert {stage for stage, outcome in summary["outcomes"].items() if outcome == "executed"} == ALL_STAGES
    check = summary["checks"]["mcu"]
    assert check["ok"] and check["tolerance"] == "exact"
    metrics = summary["metrics"]["tune:c"]
    assert metrics["fp32"] > 0.9 and metrics["quantized"] > 0.9

    # The ONNX export of the digits MLP is the same graph as the numpy model it came from.
    traced = Graph.load(build_root / "digits-onnx" / "trace")
    numpy_model = load_model(f"{recipes / 'digits' / 'model.py'}:build", recipes / "digits" / "weights.npz")
    assert traced.content_hash() == optimize(trace_model(numpy_model, inputs={"x": (1, 64)})).content_hash()


def test_trace_key_holds_the_onnx_version_when_the_suffix_chooses_the_framework(recipes: Path) -> None:
    recipe = load_recipe(recipes / "digits-onnx" / "recipe.yaml")
    assert recipe.model.framework is None
    stages, _ = stages_for(recipe, None)
    trace = next(stage for stage in stages if stage.name == "trace")
    assert key_parts(trace, {})["packages"] == {"onnx": onnx.__version__}


def test_committed_model_is_what_make_model_writes() -> None:
    spec = importlib.util.spec_from_file_location("make_digits_onnx", RECIPES / "digits-onnx" / "make_model.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    with np.load(RECIPES / "digits" / "weights.npz") as archive:
        weights = {name: archive[name] for name in archive.files}
    assert script.build(weights).SerializeToString() == (RECIPES / "digits-onnx" / "model.onnx").read_bytes()
