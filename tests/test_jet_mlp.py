"""The HDL bench recipe end to end: recipes/jet-mlp tuned for da4ml's LUTs, exported to Verilog, checked twice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import copy_recipes

from dabuild.cli import main
from dabuild.targets.hdl.simulators import simulator

pytest.importorskip("da4ml")


@pytest.mark.slow
@pytest.mark.skipif(simulator() is None, reason="needs verilator or iverilog to simulate the RTL")
def test_jet_mlp_builds_and_both_checks_pass_exact(tmp_path: Path, cache_dir: Path) -> None:
    recipe = copy_recipes(tmp_path, "jet-mlp") / "jet-mlp"
    assert main(["build", str(recipe), "--build-dir", str(tmp_path / "build"), "-q"]) == 0
    build = tmp_path / "build" / "jet-mlp"
    metrics = json.loads((build / "tune-da4ml" / "metrics.json").read_text())
    assert metrics["goal_met"] and metrics["objective"] == "estimate" and metrics["cost_unit"] == "LUTs"
    report = json.loads((build / "check-fpga" / "report.json").read_text())
    assert report["ok"] and report["tolerance"] == "exact" and report["mismatches"] == 0
    assert simulator() in report["runtime"]  # the RTL was simulated, not only interpreted
    manifest = json.loads((build / "export-fpga" / "hdl.json").read_text())
    assert manifest["cost"] > 0 and manifest["latency"] > 0
    assert (build / "export-fpga" / "rtl").is_dir() and (build / "export-fpga" / "model.dais").is_file()
