"""Mixed precision: int4 weights in the integer path, and the `mixed-precision` strategy on the digits CNN.

int4 weights are symmetric integers in [-7, 7] (inside int4's [-8, 7]) stored one per int8 byte, so
the integer reference and the C kernels run them unchanged; only activations are refused int4.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_lowering import RNG, graph_of, lower, with_weights
from test_quantize import C_CAPABILITY

from dabuild.errors import BuildError
from dabuild.ir import Graph, Node
from dabuild.ir.interpreter import run
from dabuild.quant.config import NodeConfig, QuantChoice, QuantConfig, default_config
from dabuild.quant.qgraph import QGraph
from dabuild.quant.reference import dequantize_output, quantize_input, run_integer
from dabuild.tune.space import build_space

INT4_CAPABILITY = C_CAPABILITY.model_copy(deep=True)
INT4_CAPABILITY.ops["dense"].weight.dtype = ["int8", "int4"]


def dense_graph() -> Graph:
    return graph_of([Node("fc", "dense", ["x", "w", "b"], ["y"], {})], (24,),
                    {"w": RNG.normal(size=(24, 6)), "b": RNG.normal(size=6)})


def conv_graph() -> Graph:
    attrs = {"pads": [1, 1, 1, 1], "strides": [1, 1]}
    return graph_of([Node("conv", "conv", ["x", "w", "b"], ["y"], attrs)], (3, 6, 6),
                    {"w": RNG.normal(size=(5, 3, 3, 3)), "b": RNG.normal(size=5)})


def weight_error_bound(graph: Graph, qgraph: QGraph, x_hat: np.ndarray) -> np.ndarray:
    """Per output, the most rounding each weight (by at most half its scale) can move it: the node's own op
    applied to |x| with every weight set to half its channel's scale and no bias."""
    node, layer = graph.nodes[0], qgraph.layers[0]
    channel = [1] * layer.weight.ndim
    channel[1 if node.op == "dense" else 0] = -1
    half_steps = np.ones(layer.weight.shape) * (layer.weight_scale / 2).reshape(channel)
    bound_graph = Graph(graph.inputs, graph.outputs, graph.nodes,
                        {**graph.constants, node.inputs[1]: half_steps.astype(np.float32),
                         node.inputs[2]: np.zeros_like(graph.constants[node.inputs[2]])})
    return run(bound_graph, {"x": np.abs(x_hat)})["y"]


@pytest.mark.parametrize("make_graph", [dense_graph, conv_graph], ids=["dense", "conv"])
@pytest.mark.parametrize("granularity", ["per_tensor", "per_channel"])
def test_int4_weights_are_within_their_rounding_error_of_float(make_graph, granularity: str) -> None:  # noqa: ANN001
    graph = make_graph()
    x = RNG.normal(size=(200, *graph.inputs[0].shape[1:])).astype(np.float32)
    qgraph = lower(graph, x, with_weights(default_config(graph, C_CAPABILITY), dtype="int4",
                                          granularity=granularity))
    weight = qgraph.layers[0].weight
    assert weight.dtype == np.int8 and weight.min() >= -8 and weight.max() <= 7
    assert np.abs(weight).max() == 7  # the peak magnitude lands on the top level
    assert len(np.unique(weight)) <= 15

    x_q = quantize_input(qgraph, x)
    x_hat = qgraph.input_params.dequantize(x_q)
    output = qgraph.output_params
    low, high = output.dequantize(np.array([output.qmin, output.qmax]))
    expected = np.clip(run(graph, {"x": x_hat})["y"], low, high)  # float weights, clipped to what int8 holds
    got = dequantize_output(qgraph, run_integer(qgraph, x_q))
    bound = weight_error_bound(graph, qgraph, x_hat) + output.scale  # + output rounding and fixed point
    assert np.all(np.abs(got - expected) <= bound)
    int8 = lower(graph, x)
    int8_error = np.abs(dequantize_output(int8, run_integer(int8, quantize_input(int8, x))) - expected).mean()
    assert np.abs(got - expected).mean() > 2 * int8_error  # 16 levels instead of 256 do show


def test_int4_activations_are_refused_by_name() -> None:
    graph = dense_graph()
    config = default_config(graph, C_CAPABILITY)
    node = config.nodes["fc"]
    int4_output = QuantConfig({"fc": NodeConfig(node.weight, QuantChoice("int4", "asym", "per_tensor", "minmax"))})
    x = RNG.normal(size=(50, 24)).astype(np.float32)
    with pytest.raises(BuildError, match=r"graph input 'x'.*dtype 'int4' for activations \(only for weights\)"):
        lower(graph, x, int4_output)
    activations_int4_first = INT4_CAPABILITY.model_copy(deep=True)
    activations_int4_first.ops["dense"].activation.dtype = ["int4", "int8"]
    assert default_config(graph, activations_int4_first).nodes["fc"].activation.dtype == "int8"


def test_int4_weights_count_four_bits() -> None:
    graph = dense_graph()
    space = build_space(graph, INT4_CAPABILITY)
    assert {c.weight.dtype for c in space.nodes["fc"].candidates} == {"int8", "int4"}
    int4 = QuantConfig({"fc": next(c for c in space.nodes["fc"].candidates if c.weight.dtype == "int4")})
    assert space.size(int4) * 2 == space.size(space.default()) == 8 * graph.constants["w"].size
