"""The Keras recipes end to end: model files written by Keras, built to every target they list, each checked."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import copy_recipes

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
    graph = trace_model(load_model(str(recipe / "model.keras"), None))
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


def _same_logic_as_da4ml(model: keras.Model, build: Path) -> None:
    """The hdl target's logic costs what da4ml's own conversion of the HGQ2 model costs, in LUTs and latency."""
    from da4ml.converter import trace_model as da4ml_trace
    from da4ml.trace import HWConfig, comb_trace

    from dabuild.qir.qgraph import QGraph
    from dabuild.targets.hdl.program import trace

    hwconf = HWConfig(1, -1, -1)
    ours = trace(QGraph.load(build / "tune-da4ml" / "qgraph"), hwconf)
    theirs = comb_trace(*da4ml_trace(model, hwconf))
    assert (ours.cost, tuple(ours.latency)) == (theirs.cost, tuple(theirs.latency))


@pytest.mark.parametrize("name, data", [("digits-hgq-cnn", "digits-hgq-cnn/data.npz"),
                                        ("jet-mlp-hgq", "jet-mlp/data.npz")])
def test_hgq2_recipes_build_their_own_fixed_point_types_to_the_logic_da4ml_makes(
        name: str, data: str, tmp_path: Path, cache_dir: Path) -> None:
    pytest.importorskip("hgq")
    recipe = copy_recipes(tmp_path, *dict.fromkeys((name, data.split("/")[0]))) / name
    arrays = read_npz(recipe.parent / data)
    model = keras.saving.load_model(recipe / "model.keras")
    predicted = model.predict(arrays["x_test"], verbose=0)
    keras_accuracy = float(np.mean(predicted.argmax(axis=1) == arrays["y_test"]))
    assert main(["build", str(recipe), "--build-dir", str(tmp_path / "build"), "-q"]) == 0
    build = tmp_path / "build" / name
    check = json.loads((build / "check-fpga" / "report.json").read_text())
    assert check["ok"] and check["tolerance"] == "exact" and check["mismatches"] == 0
    metrics = json.loads((build / "tune-da4ml" / "metrics.json").read_text())
    assert metrics["strategy"] == "given" and metrics["trials"] == 1
    assert metrics["fp32"] == pytest.approx(keras_accuracy, abs=1e-9), "the traced graph computes what HGQ2 computes"
    assert metrics["quantized"] == pytest.approx(keras_accuracy, abs=1e-9), "so does the integer one, bit for bit"
    _same_logic_as_da4ml(model, build)
