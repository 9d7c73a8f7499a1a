"""The HDL recipes end to end: tuned for da4ml's LUTs, exported to Verilog, checked twice (DAIS interpreter and
simulated RTL, both exact). recipes/jet-mlp is the issue's bench MLP; recipes/digits-cnn-hdl a torch CNN."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import copy_recipes, limit_trials

from dabuild.cli import main
from dabuild.ir.npz import read_npz
from dabuild.qir.qgraph import QGraph
from dabuild.qir.reference import quantize_input, run_integer
from dabuild.targets.hdl.simulators import simulator

pytest.importorskip("da4ml")
from dabuild.targets.hdl.program import run_dais

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(simulator() is None, reason="needs verilator or iverilog to simulate the RTL")]


def build_checked(tmp_path: Path, name: str) -> tuple[Path, Path, dict]:
    """Build recipes/<name> (target `fpga`) and assert what every HDL build must show; (recipe, build, metrics)."""
    recipe = copy_recipes(tmp_path, name) / name
    limit_trials(recipe, 6)
    assert main(["build", str(recipe), "--build-dir", str(tmp_path / "build"), "-q"]) == 0
    build = tmp_path / "build" / name
    check = json.loads((build / "check-fpga" / "report.json").read_text())
    assert check["ok"] and check["tolerance"] == "exact" and check["mismatches"] == 0
    assert simulator() in check["runtime"]  # the RTL was simulated, not only interpreted
    metrics = json.loads((build / "tune-da4ml" / "metrics.json").read_text())
    assert metrics["goal_met"] and metrics["objective"] == "estimate" and metrics["cost_unit"] == "LUTs"
    return recipe, build, metrics


def test_jet_mlp_builds_and_both_checks_pass_exact(tmp_path: Path, cache_dir: Path) -> None:
    _, build, _ = build_checked(tmp_path, "jet-mlp")
    manifest = json.loads((build / "export-fpga" / "hdl.json").read_text())
    assert manifest["cost"] > 0 and manifest["latency"] > 0
    assert (build / "export-fpga" / "rtl").is_dir() and (build / "export-fpga" / "model.dais").is_file()


def test_the_exported_cnn_logic_classifies_the_digits_as_tuned(tmp_path: Path, cache_dir: Path) -> None:
    pytest.importorskip("torch")
    recipe, build, tuned = build_checked(tmp_path, "digits-cnn-hdl")
    qgraph = QGraph.load(build / "tune-da4ml" / "qgraph")
    assert {"conv", "max_pool", "dense"} <= {layer.op for layer in qgraph.layers}
    data = read_npz(recipe / "data.npz")
    x_q = quantize_input(qgraph, data["x_test"])
    logits = run_dais(build / "export-fpga", x_q)  # the artifact's own program, on every test image
    assert np.array_equal(logits, run_integer(qgraph, x_q))
    assert float(np.mean(logits.argmax(axis=1) == data["y_test"])) == tuned["quantized"] >= tuned["threshold"]
