"""Objective `size` priced layer by layer equals the whole-graph measure of every config.

The size objective prices each config a search passes over. A c target remembers each kernel step's bytes
(`StepBytes`) and lowering remembers each cached weight's sums of |w|, so a config that shares most layers with
those priced before costs little; these tests hold the cached figures to the ones measured from scratch (a
fresh lowering without a weight cache, a fresh target, and for c the bytes `render` counts in the sources it
writes) over configs that mix int8 and int4 weights, per-tensor and per-channel scales, int8 and int16
activations, calibration algorithms and fp32 islands, priced one after another as a search would.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from dabuild.ir.graph import Graph
from dabuild.qir.qgraph import QGraph
from dabuild.quant.calibrate import Stats
from dabuild.quant.config import NodeConfig, QuantConfig
from dabuild.quant.lowering import WeightCache
from dabuild.quant.node_memo import NodeLowerings
from dabuild.quant.quantize import quantize
from dabuild.tune.space import FP32, build_space, integer_writers

CONFIGS = 8


def mixed_configs(graph: Graph, target: object, count: int, seed: int = 0) -> list[QuantConfig]:
    """The space's default, then `count` seeded configs, each followed by itself with one node at its default
    (a search's next config, lowered mostly from the nodes lowered before): each node one of its candidates (per-tensor or
    per-channel, any calibration, an fp32 island where the capability allows); in every other config, weights
    int4 in a third of the nodes (packed two a byte on a Cortex-M and in ONNX's INT4) and int16 activations
    where offered, in the rest int8 only (the QDQ model at the exporter's own opset)."""
    capability = target.capability_spec  # type: ignore[attr-defined]
    space = build_space(graph, capability, {})
    rng = np.random.default_rng(seed)
    configs = [space.default()]
    for index in range(count):
        nodes: dict[str, NodeConfig] = {}
        for name, node in space.nodes.items():
            wide = index % 2 == 0
            offered = [c for c in node.candidates if wide or c.activation is None or c.activation.dtype == "int8"]
            choice = offered[rng.integers(len(offered))]
            if wide and choice.weight is not None and rng.random() < 1 / 3:
                choice = dataclasses.replace(choice, weight=dataclasses.replace(choice.weight, dtype="int4"))
            nodes[name] = choice
        configs.append(QuantConfig(nodes))
        changed = list(space.nodes)[rng.integers(len(space.nodes))]  # as a search prices: one node changed
        configs.append(space.with_node(configs[-1], changed, space.nodes[changed].default))
    assert any(FP32 in node.candidates for node in space.nodes.values()) == capability.fp32_fallback
    return configs


def assert_same_graph(replayed: QGraph, lowered: QGraph) -> None:
    """The graph lowered from remembered nodes is the one lowered whole: layers, tensors and constants."""
    assert [(type(a), a.name, a.inputs, a.outputs, a.attrs()) for a in replayed.layers] == \
        [(type(b), b.name, b.inputs, b.outputs, b.attrs()) for b in lowered.layers]
    for a, b in zip(replayed.layers, lowered.layers):
        assert a.arrays().keys() == b.arrays().keys()
        assert all(np.array_equal(a.arrays()[k], b.arrays()[k]) and a.arrays()[k].dtype == b.arrays()[k].dtype
                   for k in a.arrays())
    assert replayed.tensors == lowered.tensors and replayed.floats == lowered.floats
    assert replayed.constants.keys() == lowered.constants.keys()
    assert all(np.array_equal(replayed.constants[k], lowered.constants[k]) for k in lowered.constants)


def targets() -> list[tuple[str, object]]:
    from dabuild.targets.c import CTarget
    from dabuild.targets.nnef import NnefTarget
    from dabuild.targets.onnx import OnnxTarget

    made: list[tuple[str, object]] = [(f"c:{cpu}", CTarget(CTarget.Options(cpu=cpu)))
                                      for cpu in ("host", "cortex-m4", "cortex-m55")]
    from dabuild.targets.tflite import TfliteTarget

    made += [("onnx", OnnxTarget()), ("nnef", NnefTarget()), ("tflite", TfliteTarget())]
    return made


@pytest.fixture(scope="module")
def mobilenet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """tests/architectures.py's small MobileNetV3 (hard_swish tables, residual adds, squeeze-excite products) at
    16x16, traced by the torch frontend and calibrated on 16 random images: graph and statistics folders."""
    pytest.importorskip("torch")
    import torch
    from architectures import build as build_model
    from architectures import family

    from dabuild.ir.passes import optimize
    from dabuild.progress import Progress
    from dabuild.quant.calibrate import calibrate
    from dabuild.trace import trace_model

    root = tmp_path_factory.mktemp("mobilenet")
    graph = optimize(trace_model(build_model(family("mobilenet_v3")).eval(), "torch", {"x": [None, 3, 16, 16]}))
    images = np.random.default_rng(0).normal(size=(16, 3, 16, 16)).astype(np.float32)
    with torch.no_grad():
        stats = calibrate(graph, [{"x": images[i:i + 8]} for i in range(0, 16, 8)], Progress.silent())
    graph.save(root / "trace")
    stats.save(root / "calibrate")
    return root / "trace", root / "calibrate"


@pytest.mark.parametrize("name", [name for name, _ in targets()])
def test_cached_pricing_equals_whole_graph_measure(cnn: tuple[Path, tuple[Path, Path]], name: str) -> None:
    """Every config's price, from caches warmed by the configs before it, equals a fresh measure of its graph."""
    _, (graph_dir, stats_dir) = cnn
    assert_priced_as_measured(graph_dir, stats_dir, name)


@pytest.mark.slow  # tracing MobileNetV3 takes tens of seconds on 2 loaded cores
@pytest.mark.parametrize("name", ["c:host", "c:cortex-m4", "onnx"])
def test_cached_pricing_equals_whole_graph_measure_on_mobilenet(mobilenet: tuple[Path, Path], name: str) -> None:
    """The same on a graph with table activations, residual adds and products of two activations."""
    assert_priced_as_measured(*mobilenet, name, CONFIGS // 2)


def assert_priced_as_measured(graph_dir: Path, stats_dir: Path, name: str, count: int = CONFIGS) -> None:
    from dabuild.targets.c import CTarget
    from dabuild.targets.c.codegen import render
    from dabuild.targets.onnx import OnnxTarget, qdq

    graph, stats = Graph.load(graph_dir), Stats.load(stats_dir)
    target = dict(targets())[name]
    writers = integer_writers(graph, target.capability_spec)  # type: ignore[attr-defined]
    cache, memo = WeightCache(), NodeLowerings(1 << 30)
    configs = mixed_configs(graph, target, count)
    lowered = [quantize(graph, stats, config, False, cache, writers, memo) for config in configs]
    priced = [target.stored_bytes(qgraph) for qgraph in lowered]  # type: ignore[attr-defined]
    assert memo.lowered < len(configs) * len(graph.nodes) * 3 / 4  # the one-node variants replay the rest
    fresh = dict(targets())[name]
    measured = []
    for index, (config, replayed) in enumerate(zip(configs, lowered)):
        qgraph = quantize(graph, stats, config, False, None, writers)
        assert_same_graph(replayed, qgraph)
        measured.append(fresh.stored_bytes(qgraph))  # type: ignore[attr-defined]
        if isinstance(fresh, CTarget) and index < 2:  # the sources as written (rendering takes seconds)
            assert render(qgraph, fresh.profile).weight_bytes == measured[-1]
        if isinstance(fresh, OnnxTarget):  # the model as export writes it
            model = qdq.to_qdq_onnx(qgraph, fresh.options.opset, check=False, isa=fresh.isa)
            assert qdq.initializer_bytes(model) == measured[-1]
    assert priced == measured
    assert len(set(priced)) > 2  # the configs differ in what they store


def test_nodes_and_steps_priced_once(cnn: tuple[Path, tuple[Path, Path]]) -> None:
    """Pricing a config again, or one that changes one node, lowers only the nodes and lays out only the steps
    that changed."""
    from dabuild.targets.c import CTarget
    from dabuild.targets.c.codegen import StepBytes, stored_bytes

    _, (graph_dir, stats_dir) = cnn
    graph, stats = Graph.load(graph_dir), Stats.load(stats_dir)
    target = CTarget()
    space = build_space(graph, target.capability_spec, {})
    writers = integer_writers(graph, target.capability_spec)
    steps, memo = StepBytes(), NodeLowerings(1 << 30)
    default = quantize(graph, stats, space.default(), False, None, writers, memo)
    first = stored_bytes(default, target.profile, steps)
    laid_out = len(steps._bytes)
    again = quantize(graph, stats, space.default(), False, None, writers, memo)
    assert stored_bytes(again, target.profile, steps) == first and len(steps._bytes) == laid_out
    assert memo.lowered == len(graph.nodes)
    name, node = next((name, node) for name, node in space.nodes.items() if node.weight_size)
    weight = dataclasses.replace(node.default.weight, dtype="int4")
    changed = QuantConfig({**space.default().nodes, name: dataclasses.replace(node.default, weight=weight)})
    stored_bytes(quantize(graph, stats, changed, False, None, writers, memo), target.profile, steps)
    assert 0 < len(steps._bytes) - laid_out < laid_out
    assert memo.lowered == len(graph.nodes) + 1  # the node's weight changed; its output's quantization did not


def test_a_memo_over_its_budget_forgets_and_lowers_again(cnn: tuple[Path, tuple[Path, Path]]) -> None:
    """Past its budget the memo forgets what it held: the same config is lowered again, to the same graph."""
    _, (graph_dir, stats_dir) = cnn
    graph, stats = Graph.load(graph_dir), Stats.load(stats_dir)
    config = build_space(graph, dict(targets())["c:host"].capability_spec, {}).default()  # type: ignore[attr-defined]
    weights = sum(np.asarray(values).nbytes for values in graph.constants.values())
    held, forgetful = NodeLowerings(weights), NodeLowerings(1)
    first = [quantize(graph, stats, config, False, None, frozenset(), memo) for memo in (held, forgetful)]
    again = [quantize(graph, stats, config, False, None, frozenset(), memo) for memo in (held, forgetful)]
    assert (held.lowered, forgetful.lowered) == (len(graph.nodes), 2 * len(graph.nodes))
    for graphs in (first, again):
        assert_same_graph(*graphs)
