"""Patch-based execution (dabuild/targets/c/patch.py): chains of convs run a row band at a time, bit-exact with the
integer reference and the layer-by-layer build; the schedule proven row by row; the planner's choice; the budget.

Each chain is built for the host's kernels and for the Cortex-M profiles' (their portable paths, compiled for
this machine: `runner: host`); tests/mcu/test_mlperf_tiny.py runs VWW's patched stage in qemu on the DSP and
Helium paths.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_c_kernels import STRICT, conv_node, weights
from test_lowering import graph_of, image, lower

from dabuild.errors import BuildError
from dabuild.ir import Node
from dabuild.qir.qgraph import QGraph
from dabuild.qir.reference import run_integer
from dabuild.targets.c import Budget, CTarget
from dabuild.targets.c.patch import Rows, chains, schedule
from dabuild.targets.c.program import build_program

# name: (convs as (name, out channels, attrs), input shape (C, H, W)); each conv reads the one before it
CHAINS: dict[str, tuple[list[tuple[str, int, dict[str, object]]], tuple[int, int, int]]] = {
    "mobilenet stem, odd height": ([
        ("stem", 8, {"strides": [2, 2], "pads": [0, 0, 1, 1], "activation": "relu"}),
        ("dw1", 8, {"groups": 8, "pads": [1, 1, 1, 1], "activation": "relu6"}),
        ("pw1", 16, {"activation": "relu"}),
        ("dw2", 16, {"groups": 16, "strides": [2, 2], "pads": [1, 1, 1, 1], "activation": "relu"}),
        ("pw2", 8, {})], (3, 15, 13)),
    "5x5 valid, dilated, 1x1 stride 2 skipping rows, asymmetric pads": ([
        ("c5", 6, {"activation": "relu"}),
        ("dil", 6, {"dilations": [2, 2], "pads": [2, 2, 2, 2]}),
        ("skip", 5, {"strides": [2, 2]}),
        ("tail", 4, {"pads": [2, 0, 0, 1]})], (4, 17, 9)),
    "groups, depth multiplier, tall kernel": ([
        ("grouped", 4, {"groups": 2, "pads": [1, 1, 1, 1], "activation": "relu"}),
        ("multiplier", 8, {"groups": 4, "strides": [2, 1], "pads": [1, 1, 1, 1]}),
        ("tall", 6, {"pads": [1, 0, 2, 0]})], (4, 11, 7)),
    "depthwise dilated stride past the band": ([
        ("expand", 8, {"activation": "relu"}),
        ("dws", 8, {"groups": 8, "dilations": [2, 1], "strides": [4, 2], "pads": [1, 1, 2, 0]}),
        ("project", 16, {})], (3, 21, 11)),
}
KERNELS = {"stem": (3, 3), "dw1": (3, 3), "pw1": (1, 1), "dw2": (3, 3), "pw2": (1, 1), "c5": (5, 5), "dil": (3, 3),
           "skip": (1, 1), "tail": (3, 3), "grouped": (3, 3), "multiplier": (3, 3), "tall": (4, 1), "expand": (1, 1),
           "dws": (2, 3), "project": (1, 1)}
CPUS = ("host", "cortex-m4", "cortex-m55")


def chain_graph(case: str) -> QGraph:
    convs, shape = CHAINS[case]
    nodes, constants, source, channels = [], {}, "x", shape[0]
    for number, (name, out, attrs) in enumerate(convs):
        groups = int(attrs.get("groups", 1))   # type: ignore[call-overload]
        output = "y" if number == len(convs) - 1 else f"{name}_out"
        nodes.append(conv_node(name, source, output, **attrs))
        constants[f"{name}_w"] = weights(out, channels // groups, *KERNELS[name])
        constants[f"{name}_b"] = weights(out)
        source, channels = output, out
    return lower(graph_of(nodes, shape, constants), image(128, shape, seed=4) * 2)


def export(qgraph: QGraph, folder: Path, cpu: str, patch: str | int) -> tuple[CTarget, Path, dict]:
    target = CTarget(CTarget.Options(cpu=cpu, runner=None if cpu == "host" else "host", cflags=STRICT, patch=patch))
    artifact = folder / f"{cpu}-{patch}"
    artifact.mkdir(parents=True)
    target.export(qgraph, artifact)
    return target, artifact, json.loads((artifact / "model.json").read_text())


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("case", sorted(CHAINS))
def test_a_patched_chain_equals_the_reference_and_the_layer_by_layer_build(case: str, cpu: str,
                                                                         tmp_path: Path) -> None:
    qgraph = chain_graph(case)
    x_q = np.random.default_rng(5).integers(-128, 128, (40, *qgraph.tensors[qgraph.input].shape)).astype(np.int8)
    expected = np.asarray(run_integer(qgraph, x_q))
    convs = [name for name, _, _ in CHAINS[case][0]]
    outputs = {}
    for patch in (len(convs), "off"):
        target, artifact, manifest = export(qgraph, tmp_path, cpu, patch)
        run = tmp_path / f"run-{patch}"
        run.mkdir()
        outputs[patch] = target.run(artifact, x_q, run)
        stage = manifest["arena"]["patch"]
        if patch == "off":
            assert stage is None
            continue
        assert stage["layers"] == convs and stage["recompute_macs"] == 0
        assert "p_patch_" in (artifact / "model.c").read_text()
    assert np.array_equal(outputs[len(convs)], expected), \
        f"{np.sum(outputs[len(convs)] != expected)} of {expected.size} outputs differ"
    assert np.array_equal(outputs["off"], expected)
    assert len(np.unique(expected)) > 3


def _simulate(rows: list[Rows]) -> list[list[int]]:
    """Run the schedule on row numbers: each window as the list of rows it holds, each call checked against the
    rows its output rows read. Returns the rows each layer computed, in order."""
    bands, windows = schedule(rows)
    held: list[list[int]] = [[] for _ in rows[:-1]]
    computed: list[list[int]] = [[] for _ in rows]
    for band in bands:
        for index, call in enumerate(band):
            if call.end <= call.begin:
                continue
            low, high = rows[index].inputs(call.begin, call.end)
            if index:
                source = held[index - 1]
                assert source and source[0] == call.in_first, (index, call, source)
                assert set(range(low, high)) <= set(source), (index, call, source)
            if index < len(held):
                size = rows[index].out_row_bytes
                assert call.drop % size == 0 and call.keep % size == 0
                if call.drop:
                    held[index] = held[index][call.drop // size:]
                assert len(held[index]) >= call.keep // size
                held[index] = held[index][:call.keep // size] + list(range(call.begin, call.end))
                assert len(held[index]) * size <= windows[index]
            computed[index] += range(call.begin, call.end)
    return computed


@pytest.mark.parametrize("seed", range(40))
def test_the_schedule_computes_each_row_once_and_holds_every_row_read(seed: int) -> None:
    rng = np.random.default_rng(seed)
    height, rows = int(rng.integers(5, 40)), []
    for _ in range(int(rng.integers(2, 6))):
        kernel, stride, dilation = int(rng.integers(1, 6)), int(rng.integers(1, 4)), int(rng.integers(1, 3))
        top, bottom = int(rng.integers(0, kernel)), int(rng.integers(0, kernel))
        out = (height + top + bottom - dilation * (kernel - 1) - 1) // stride + 1
        if out < 1:
            break
        rows.append(Rows(kernel, stride, dilation, top, height, out, 4 * height, 3 * out, 9 * out))
        height = out
    if len(rows) < 2:
        pytest.skip("the random chain shrank to nothing")
    computed = _simulate(rows)
    assert computed[-1] == list(range(rows[-1].out_height))
    for index, done in enumerate(computed):
        assert done == sorted(set(done)), f"layer {index} computes a row twice or out of order"


def test_vww_shaped_rows_are_a_few_per_window() -> None:
    """A 3x3 stride-2 depthwise after a pointwise of 48 rows: its window holds the rows of one band, not 48."""
    rows = [Rows(1, 1, 1, 0, 48, 48, 384, 768, 1), Rows(3, 2, 1, 0, 48, 24, 768, 384, 1),
            Rows(1, 1, 1, 0, 24, 24, 384, 768, 1)]
    _, windows = schedule(rows)
    assert windows[0] <= 3 * 768 and windows[1] <= 384


def stem_then_dense(features: int) -> QGraph:
    """A chain of two 3x3 convs on 12x12, then dense layers of `features` and 10 outputs."""
    nodes = [conv_node("a", "x", "h", pads=[1, 1, 1, 1], activation="relu"),
             conv_node("b", "h", "g", pads=[1, 1, 1, 1]),
             Node("flat", "flatten", ["g"], ["f"], {}),
             Node("fc", "dense", ["f", "fc_w", "fc_b"], ["d"], {}),
             Node("out", "dense", ["d", "out_w", "out_b"], ["y"], {})]
    constants = {"a_w": weights(8, 3, 3, 3), "a_b": weights(8), "b_w": weights(4, 8, 3, 3), "b_b": weights(4),
                 "fc_w": weights(4 * 144, features, scale=0.05), "fc_b": weights(features),
                 "out_w": weights(features, 10, scale=0.05), "out_b": weights(10)}
    return lower(graph_of(nodes, (3, 12, 12), constants), image(64, (3, 12, 12), seed=6))


def test_the_planner_patches_only_where_the_peak_drops(tmp_path: Path) -> None:
    """Two convs whose 8x12x12 tensor is the peak: patched, lower. The same convs before a dense layer whose output
    outweighs them: the peak is the dense layer's either way, so nothing is patched."""
    target, artifact, manifest = export(stem_then_dense(10), tmp_path / "small", "host", "auto")
    arena = manifest["arena"]
    assert arena["patch"]["layers"] == ["a", "b"]
    assert arena["peak_bytes"] < arena["layer_by_layer"]["peak_bytes"]
    reported = target.measurements(artifact, np.zeros((1, 3, 12, 12), np.int8), tmp_path)["patch"]  # the check's
    assert reported["layers"] == ["a", "b"] and reported["peak_bytes"] == arena["peak_bytes"]
    assert reported["layer_by_layer_peak_bytes"] == arena["layer_by_layer"]["peak_bytes"]
    _, _, manifest = export(stem_then_dense(4000), tmp_path / "large", "host", "auto")
    arena = manifest["arena"]
    assert arena["patch"] is None and arena["peak_bytes"] == arena["layer_by_layer"]["peak_bytes"]


def test_a_patch_depth_the_model_lacks_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="first chain of convs has 2 layers"):
        export(stem_then_dense(10), tmp_path, "host", 3)
    with pytest.raises(ValueError, match="greater than or equal to 2"):
        CTarget.Options(patch=1)


@pytest.mark.skipif(shutil.which("arm-none-eabi-gcc") is None, reason="needs gcc-arm-none-eabi, libnewlib-arm-none-eabi")
def test_the_budget_sees_the_patched_arena(tmp_path: Path) -> None:
    """The RAM the linked Cortex-M image takes (what a budget, and so the tuner, checks) drops by the arena's
    saving, and a budget between the two fits the patched build only."""
    qgraph = stem_then_dense(10)
    ram = {}
    for patch in ("auto", "off"):
        _, _, manifest = export(qgraph, tmp_path, "cortex-m4", patch)
        ram[patch] = manifest["firmware"]["ram_bytes"]
        if patch == "auto":
            saved = manifest["arena"]["layer_by_layer"]["peak_bytes"] - manifest["arena"]["peak_bytes"]
    assert ram["auto"] < ram["off"] and ram["off"] - ram["auto"] >= saved - 16
    limit = (ram["auto"] + ram["off"]) // 2
    for patch, fits in (("auto", True), ("off", False)):
        target = CTarget(CTarget.Options(cpu="cortex-m4", patch=patch, budget=Budget(ram=limit)))
        assert (target.fits(qgraph) is None) == fits


def test_a_patched_trace_shows_every_tensor_but_the_stages_inner_ones(tmp_path: Path) -> None:
    qgraph = chain_graph("mobilenet stem, odd height")
    target, artifact, _ = export(qgraph, tmp_path, "host", 5)
    x_q = np.random.default_rng(6).integers(-128, 128, (8, *qgraph.tensors[qgraph.input].shape)).astype(np.int8)
    (tmp_path / "trace").mkdir()
    traced = target.trace(artifact, x_q, tmp_path / "trace")
    assert traced is not None
    reference = run_integer(qgraph, x_q, keep_intermediates=True)
    inner = {f"{name}_out" for name, _, _ in CHAINS["mobilenet stem, odd height"][0][:-1]}
    assert set(traced) == {qgraph.input, "y"} and not inner & set(traced)
    for name, values in traced.items():
        assert np.array_equal(values, reference[name]), name


def test_a_reshape_between_convs_ends_the_chain() -> None:
    """conv -> reshape (rows of another length: the same bytes, other rows) -> conv: not a chain of rows. One
    channel, so the reshape copies nothing (channels last is the canonical order) and the convs are neighbours."""
    nodes = [conv_node("a", "x", "h", pads=[1, 1, 1, 1]),
             Node("fold", "reshape", ["h"], ["r"], {"shape": [0, 1, 16, 6]}),
             conv_node("b", "r", "y", pads=[1, 1, 1, 1])]
    constants = {"a_w": weights(1, 3, 3, 3), "a_b": weights(1), "b_w": weights(4, 1, 3, 3), "b_b": weights(4)}
    qgraph = lower(graph_of(nodes, (3, 8, 12), constants), image(64, (3, 8, 12), seed=7))
    program = build_program(qgraph)
    assert [step.name for step in program.steps][1:3] == ["a", "b"]   # after the input's conversion
    assert chains(program) == []
