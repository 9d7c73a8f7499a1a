"""The hdl target: fixed-point QGraphs through da4ml to Verilog/VHDL, checked bit for bit."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from test_da4ml_plugin import C, fixed_point_mlp
from test_quantize import lower, mlp_graph

from dabuild.errors import BuildError
from dabuild.progress import Progress
from dabuild.qir.reference import run_integer
from dabuild.targets.check import check_stage
from dabuild.targets.hdl import HdlTarget
from dabuild.targets.hdl.simulators import simulator

pytest.importorskip("da4ml")


def export(target: HdlTarget, folder: Path, granularity: str = "per_tensor") -> Path:
    folder.mkdir()
    target.export(fixed_point_mlp(granularity), folder)
    return folder


def full_range_int8(samples: int, features: int = 6) -> np.ndarray:
    return np.random.default_rng(9).integers(-128, 128, (samples, features)).astype(np.int8)


def test_pot_scales_are_powers_of_two_and_requantization_a_shift() -> None:
    qgraph = fixed_point_mlp("per_channel")
    for tensor in qgraph.tensors.values():
        assert tensor.params.zero_point == 0 and np.log2(tensor.params.scale).is_integer()
    for layer in qgraph.layers:
        assert np.all(np.log2(layer.weight_scale) == np.round(np.log2(layer.weight_scale)))
        assert np.all(layer.multiplier == 2**30)  # a Q31 multiplier of exactly one half: the shift alone


def test_dais_program_matches_the_integer_reference(tmp_path: Path) -> None:
    qgraph = fixed_point_mlp("per_channel")
    target = HdlTarget(HdlTarget.Options(simulate="never"))
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    target.export(qgraph, artifact)
    manifest = json.loads((artifact / "hdl.json").read_text())
    assert manifest["cost"] > 0 and manifest["latency"] > 0 and manifest["stages"] == 0
    assert (artifact / "model.dais").stat().st_size > 0 and (artifact / "rtl/src/model.v").is_file()
    x_q = full_range_int8(4000)
    actual = target.run(artifact, x_q, tmp_path)
    assert actual.dtype == np.int8 and np.array_equal(actual, run_integer(qgraph, x_q))


@pytest.mark.skipif(simulator() is None, reason="needs verilator or iverilog")
def test_check_simulates_the_pipelined_verilog_and_passes_exact(tmp_path: Path) -> None:
    qgraph = fixed_point_mlp()
    target = HdlTarget(HdlTarget.Options(latency_cutoff=3, simulate="always"))
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    target.export(qgraph, artifact)
    assert json.loads((artifact / "hdl.json").read_text())["stages"] > 1
    x = np.random.default_rng(10).normal(0, 2, (300, 6)).astype(np.float32)
    report = check_stage(target, qgraph, artifact, x, None, tmp_path, tmp_path / "bundles", Progress.silent())
    assert report["ok"] and report["tolerance"] == "exact" and report["mismatches"] == 0
    assert "verilator" in report["runtime"] or simulator() == "iverilog"


def test_vhdl_sources_on_request(tmp_path: Path) -> None:
    artifact = export(HdlTarget(HdlTarget.Options(language="vhdl", simulate="never")), tmp_path / "artifact")
    assert (artifact / "rtl/src/model.vhd").is_file() and not (artifact / "rtl/src/model.v").exists()


def test_options_are_validated() -> None:
    with pytest.raises(ValueError):
        HdlTarget.Options(language="systemc")
    with pytest.raises(ValueError):
        HdlTarget.Options(latency_cutof=3)


def test_a_graph_with_arbitrary_scales_is_refused(tmp_path: Path) -> None:
    graph = mlp_graph([6, 4], ["relu"], seed=5)
    qgraph = lower(graph, np.random.default_rng(6).normal(size=(64, 6)).astype(np.float32), capability=C)
    with pytest.raises(BuildError, match="graph input 'x'.*power-of-two"):
        HdlTarget().export(qgraph, tmp_path)


def test_missing_da4ml_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "da4ml" or m.startswith(("da4ml.", "dabuild.targets.hdl."))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "da4ml", None)  # import da4ml now raises ImportError
    with pytest.raises(BuildError, match=r"pip install dabuild\[hdl\]"):
        HdlTarget().export(fixed_point_mlp(), tmp_path)


@pytest.mark.parametrize("simulate", ["auto", "never"])
def test_check_without_the_simulation_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, simulate: str) -> None:
    """No verilator or iverilog on PATH (an empty one): the check still passes on DAIS, and says what it did not
    run in its report and as a warning, instead of a bare "exact passed"."""
    from dabuild import notices

    artifact = export(HdlTarget(HdlTarget.Options(simulate=simulate)), tmp_path / "artifact")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    target = HdlTarget(HdlTarget.Options(simulate=simulate))
    x = np.random.default_rng(11).normal(0, 2, (20, 6)).astype(np.float32)
    with notices.collect() as warned:
        report = check_stage(target, fixed_point_mlp(), artifact, x, None, tmp_path, tmp_path / "b", Progress.silent())
    assert report["ok"] and len(report["not_run"]) == 1 and "RTL simulation" in report["not_run"][0]
    assert len(warned) == 1 and "not run: RTL simulation" in warned[0] and f"simulate: {simulate}" in warned[0]
    if simulate == "auto":
        assert "neither verilator nor iverilog" in report["not_run"][0]
