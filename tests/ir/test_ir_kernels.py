"""The interpreter's fast paths against its plain ones: a fused residual step (conv -> add -> activation in one
kernel) must give what the nodes run one by one give (up to float rounding: a conv's summation order follows
its input's memory order, which the plans may leave differently), and batch slices run on threads exactly
what the serial run gives."""

from __future__ import annotations

import numpy as np
import pytest

from dabuild.ir import Graph, Node, TensorSpec
from dabuild.ir.interpreter import Interpreter, _fusions
from dabuild.ir.ops import OPS

RNG = np.random.default_rng(7)


def _graph(nodes: list[Node], outputs: list[str], constants: dict[str, np.ndarray], channels: int = 8) -> Graph:
    return Graph([TensorSpec("x", (None, channels, 10, 12))], outputs, nodes, constants)


def _weights(out_channels: int, in_channels: int, kernel: int) -> np.ndarray:
    return RNG.standard_normal((out_channels, in_channels, kernel, kernel)).astype(np.float32) / kernel


def _residual_net() -> Graph:
    """Two residual blocks: an identity shortcut (conv without bias, relu after the add) and a projection
    shortcut whose conv runs after the main path (so it is the fused one), a depthwise conv, no activation."""
    constants = {
        "w1": _weights(8, 8, 3), "b1": RNG.standard_normal(8).astype(np.float32),
        "w2": _weights(8, 8, 3),
        "w3": _weights(16, 8, 3), "b3": RNG.standard_normal(16).astype(np.float32),
        "wp": _weights(16, 8, 1), "bp": RNG.standard_normal(16).astype(np.float32),
        "wd": _weights(16, 1, 3), "bd": RNG.standard_normal(16).astype(np.float32),
        "wl": RNG.standard_normal((16, 4)).astype(np.float32),
    }
    same = {"pads": [1, 1, 1, 1]}
    nodes = [
        Node("c1", "conv", ["x", "w1", "b1"], ["h1"], {**same, "activation": "relu"}),
        Node("c2", "conv", ["h1", "w2"], ["h2"], same),
        Node("a1", "add", ["x", "h2"], ["s1"]),
        Node("r1", "relu", ["s1"], ["y1"]),
        Node("c3", "conv", ["y1", "w3", "b3"], ["h3"], {**same, "strides": [2, 2]}),
        Node("cp", "conv", ["y1", "wp", "bp"], ["hp"], {"strides": [2, 2]}),
        Node("a2", "add", ["h3", "hp"], ["s2"]),
        Node("cd", "conv", ["s2", "wd", "bd"], ["h4"], {**same, "groups": 16}),
        Node("a3", "add", ["h4", "s2"], ["s3"]),
        Node("g", "global_avg_pool", ["s3"], ["p"]),
        Node("f", "flatten", ["p"], ["q"]),
        Node("d", "dense", ["q", "wl"], ["out"]),
    ]
    return _graph(nodes, ["out"], constants)


def _separately(graph: Graph, x: np.ndarray) -> np.ndarray:
    """Every node on its own (the per-layer trace's plan)."""
    return Interpreter(graph).run({"x": x}, keep_intermediates=True)[graph.outputs[0]]


def test_residual_blocks_fuse_where_the_add_is_a_convs_only_reader() -> None:
    graph = _residual_net()
    fused = {graph.nodes[index].name: (fusion.residual, fusion.then[0], [graph.nodes[i].name for i in fusion.absorbed])
             for index, fusion in _fusions(graph).items()}
    assert fused == {"c2": ("x", "relu", ["a1", "r1"]), "cp": ("h3", "none", ["a2"]), "cd": ("s2", "none", ["a3"])}
    assert len(Interpreter(graph).steps) == len(graph.nodes) - 4


@pytest.mark.parametrize("batch", [1, 3, 6])
def test_fused_plan_equals_separate_nodes(batch: int) -> None:
    graph = _residual_net()
    x = RNG.standard_normal((batch, 8, 10, 12)).astype(np.float32)
    expected = _separately(graph, x)
    copy = x.copy()
    np.testing.assert_allclose(Interpreter(graph).run({"x": x})["out"], expected, rtol=1e-5, atol=1e-5)
    assert np.array_equal(x, copy)  # the feed, the first block's residual, is not written into


def test_no_fusion_when_the_conv_output_is_read_elsewhere_or_a_graph_output() -> None:
    constants = {"w": _weights(8, 8, 3)}
    nodes = [Node("c", "conv", ["x", "w"], ["h"], {"pads": [1, 1, 1, 1]}),
             Node("a", "add", ["h", "x"], ["s"]),
             Node("m", "mul", ["h", "s"], ["out"])]
    assert _fusions(_graph(nodes, ["out"], constants)) == {}
    assert _fusions(_graph(nodes[:2], ["s", "h"], constants)) == {}


def test_a_broadcasting_add_after_a_conv_still_computes_the_add() -> None:
    constants = {"w": _weights(8, 8, 3), "row": RNG.standard_normal((1, 8, 1, 1)).astype(np.float32)}
    nodes = [Node("c", "conv", ["x", "w"], ["h"], {"pads": [1, 1, 1, 1]}),
             Node("a", "add", ["h", "row"], ["s"]),
             Node("r", "relu", ["s"], ["out"])]
    graph = _graph(nodes, ["out"], constants)
    assert list(_fusions(graph)) == [0]
    x = RNG.standard_normal((2, 8, 10, 12)).astype(np.float32)
    np.testing.assert_allclose(Interpreter(graph).run({"x": x})["out"], _separately(graph, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch", [4, 5, 9])
@pytest.mark.parametrize("threads", [2, 3])
def test_batch_slices_on_threads_equal_the_serial_run(batch: int, threads: int) -> None:
    graph = _residual_net()
    x = RNG.standard_normal((batch, 8, 10, 12)).astype(np.float32)
    threaded, serial = Interpreter(graph, threads=threads), Interpreter(graph)
    assert threaded.splits
    assert np.array_equal(threaded.run({"x": x})["out"], serial.run({"x": x})["out"])
    assert np.array_equal(threaded.run({"x": x[:1]})["out"], serial.run({"x": x[:1]})["out"])  # too small to split


def test_graphs_that_mix_samples_or_have_no_conv_run_serially() -> None:
    mixing = _graph([Node("c", "conv", ["x", "w"], ["h"]), Node("r", "reduce_mean", ["h"], ["out"], {"axes": [0]})],
                    ["out"], {"w": _weights(4, 8, 1)})
    dense_only = Graph([TensorSpec("x", (None, 6))], ["out"], [Node("d", "dense", ["x", "w"], ["out"])],
                       {"w": RNG.standard_normal((6, 3)).astype(np.float32)})
    assert not Interpreter(mixing, threads=2).splits
    assert not Interpreter(dense_only, threads=2).splits
    x = RNG.standard_normal((4, 8, 10, 12)).astype(np.float32)
    assert np.array_equal(Interpreter(mixing, threads=2).run({"x": x})["out"], _separately(mixing, x))


@pytest.mark.parametrize("op, attrs", [("max_pool", {"kernel": [3, 3], "strides": [2, 2], "ceil_mode": True}),
                                       ("avg_pool", {"kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]})])
def test_pooling_a_channels_last_tensor_keeps_its_memory_order(op: str, attrs: dict) -> None:
    """A conv's output is channels-last memory: pooling it gives the same values, still channels-last."""
    x = np.random.default_rng(6).standard_normal((2, 7, 11, 11)).astype(np.float32)
    last = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    kernel = OPS[op].prepare(attrs)
    y = kernel([last], None)[0]
    np.testing.assert_array_equal(y, kernel([x], None)[0])
    assert y.transpose(0, 2, 3, 1).flags.c_contiguous
