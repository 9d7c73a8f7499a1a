"""The CNN HDL recipe end to end: recipes/digits-cnn-hdl (torch) tuned for da4ml's LUTs, exported to Verilog,
checked twice (DAIS interpreter and simulated RTL, both exact), and the artifact classifying the test set."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import copy_recipes

from dabuild.cli import main
from dabuild.ir.npz import read_npz
from dabuild.quant.qgraph import QGraph
from dabuild.quant.reference import quantize_input, run_integer
from dabuild.targets.hdl.simulators import simulator

pytest.importorskip("da4ml")
pytest.importorskip("torch")
from dabuild.targets.hdl.program import run_dais  # noqa: E402


@pytest.mark.slow
@pytest.mark.skipif(simulator() is None, reason="needs verilator or iverilog to simulate the RTL")
def test_the_exported_logic_classifies_the_digits_as_tuned(tmp_path: Path, cache_dir: Path) -> None:
    recipe = copy_recipes(tmp_path, "digits-cnn-hdl") / "digits-cnn-hdl"
    assert main(["build", str(recipe), "--build-dir", str(tmp_path / "build"), "-q"]) == 0
    build = tmp_path / "build" / "digits-cnn-hdl"
    check = json.loads((build / "check-fpga" / "report.json").read_text())
    assert check["ok"] and check["tolerance"] == "exact" and simulator() in check["runtime"]

    qgraph = QGraph.load(build / "tune-da4ml" / "qgraph")
    assert {"conv", "max_pool", "dense"} <= {layer.op for layer in qgraph.layers}
    data = read_npz(recipe / "data.npz")
    x_q = quantize_input(qgraph, data["x_test"])
    logits = run_dais(build / "export-fpga", x_q)  # the artifact's own program, on every test image
    assert np.array_equal(logits, run_integer(qgraph, x_q))
    tuned = json.loads((build / "tune-da4ml" / "metrics.json").read_text())
    assert tuned["goal_met"] and tuned["objective"] == "estimate"
    assert float(np.mean(logits.argmax(axis=1) == data["y_test"])) == tuned["quantized"] >= tuned["threshold"]
