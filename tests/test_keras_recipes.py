"""The Keras recipes end to end: model files written by Keras, built to every target they list, each checked."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import copy_recipes

from dabuild import plugins
from dabuild.cli import main
from dabuild.ir.interpreter import run
from dabuild.ir.npz import read_npz
from dabuild.targets.hdl.simulators import simulator
from dabuild.trace import load_model, trace_model

os.environ.setdefault("KERAS_BACKEND", "torch")
keras = pytest.importorskip("keras")
pytest.importorskip("da4ml")
pytest.importorskip("onnxruntime")

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(simulator() is None, reason="needs verilator or iverilog to simulate the RTL")]


def test_jet_mlp_keras_traces_as_keras_computes_and_builds_c_onnx_hdl(tmp_path: Path, cache_dir: Path) -> None:
    recipe = copy_recipes(tmp_path, "jet-mlp", "jet-mlp-keras") / "jet-mlp-keras"
    data = read_npz(recipe.parent / "jet-mlp" / "data.npz")
    model = keras.saving.load_model(recipe / "model.keras")
    graph = trace_model(load_model("model.keras", recipe, None))
    np.testing.assert_allclose(run(graph, {"x": data["x_test"]})[graph.outputs[0]],
                               model.predict(data["x_test"], verbose=0), rtol=1e-4, atol=1e-4)

    assert main(["build", str(recipe), "--build-dir", str(tmp_path / "build"), "-q"]) == 0
    build = tmp_path / "build" / "jet-mlp-keras"
    for target, tolerance in (("mcu", "exact"), ("ort", "approximate"), ("fpga", "exact")):
        check = json.loads((build / f"check-{target}" / "report.json").read_text())
        assert check["ok"] and check["tolerance"] == tolerance and check["mismatches"] == 0, target
    keras_accuracy = float(np.mean(model.predict(data["x_test"], verbose=0).argmax(axis=1) == data["y_test"]))
    for capability in ("c", "onnxruntime", "da4ml"):
        metrics = json.loads((build / f"tune-{capability}" / "metrics.json").read_text())
        assert metrics["goal_met"] and metrics["fp32"] == pytest.approx(keras_accuracy, abs=1e-9), capability


@pytest.mark.skipif("given" not in plugins.available(plugins.STRATEGIES),
                    reason="needs dabuild's given quantization (tuning strategy given)")
def test_digits_hgq_cnn_builds_its_own_fixed_point_types_to_logic(tmp_path: Path, cache_dir: Path) -> None:
    pytest.importorskip("hgq")
    recipe = copy_recipes(tmp_path, "digits-hgq-cnn") / "digits-hgq-cnn"
    data = read_npz(recipe / "data.npz")
    model = keras.saving.load_model(recipe / "model.keras")
    keras_accuracy = float(np.mean(model.predict(data["x_test"], verbose=0).argmax(axis=1) == data["y_test"]))
    assert main(["build", str(recipe), "--build-dir", str(tmp_path / "build"), "-q"]) == 0
    build = tmp_path / "build" / "digits-hgq-cnn"
    check = json.loads((build / "check-fpga" / "report.json").read_text())
    assert check["ok"] and check["tolerance"] == "exact" and check["mismatches"] == 0
    metrics = json.loads((build / "tune-da4ml" / "metrics.json").read_text())
    assert metrics["strategy"] == "given" and metrics["trials"] == 1
    assert metrics["fp32"] == pytest.approx(keras_accuracy, abs=1e-9), "the traced graph computes what HGQ2 computes"
