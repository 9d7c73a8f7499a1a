"""Integer lowering of the whole quantizable op set, against the float ops of dabuild.ir.

Each op: dabuild's integer reference vs the float op on the dequantized
input, within a few output scale steps, and bit-exact where an identity holds
(clamps, layout ops, equal-params concat, lookup tables). Then a small digits
CNN end to end, the fp32 fallback, per-channel conv weights and files.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from test_quantize import C_CAPABILITY

from dabuild.errors import BuildError
from dabuild.ir import Graph, Node, TensorSpec
from dabuild.ir.interpreter import run
from dabuild.ir.ops import OPS
from dabuild.progress import Progress
from dabuild.qir.layers.fallback import QFloat, QFloatWeighted
from dabuild.qir.qgraph import QGraph
from dabuild.qir.reference import dequantize_output, quantize_input, run_integer, run_quantized
from dabuild.quant.calibrate import calibrate
from dabuild.quant.config import NodeConfig, QuantChoice, QuantConfig
from dabuild.quant.defaults import default_config
from dabuild.quant.lowering import LOWERINGS, WeightCache, quantizable_roles
from dabuild.quant.quantize import quantize
from dabuild.targets.c import CTarget

RNG = np.random.default_rng(0)
INT8_WEIGHT = QuantChoice("int8", "sym", "per_tensor", "minmax")
INT8_ACTIVATION = QuantChoice("int8", "asym", "per_tensor", "minmax")


def graph_of(nodes: list[Node], input_shape: tuple[int, ...], constants: dict[str, np.ndarray] | None = None,
             output: str = "y") -> Graph:
    return Graph([TensorSpec("x", (None, *input_shape))], [output], nodes,
                 {name: np.asarray(value, np.float32) for name, value in (constants or {}).items()})


def lower(graph: Graph, x: np.ndarray, config: QuantConfig | None = None) -> QGraph:
    stats = calibrate(graph, ({"x": x[i:i + 50]} for i in range(0, len(x), 50)), Progress.silent())
    return quantize(graph, stats, config or default_config(graph, C_CAPABILITY))


def with_weights(config: QuantConfig, **changes: str) -> QuantConfig:
    return QuantConfig({name: node if node.weight is None else
                        dataclasses.replace(node, weight=dataclasses.replace(node.weight, **changes))
                        for name, node in config.nodes.items()})


def with_dequantized_weights(graph: Graph, qgraph: QGraph) -> Graph:
    """The float graph with each dense/conv weight and bias replaced by its int8/int32 value times its scale,
    so comparing with it measures the integer arithmetic, not the (tuner's) choice of weight precision."""
    constants = dict(graph.constants)
    layers = {layer.name: layer for layer in qgraph.layers}
    for node in graph.nodes:
        if node.op not in ("dense", "conv"):
            continue
        layer = layers[node.name]
        channel = [1] * layer.weight.ndim
        channel[1 if node.op == "dense" else 0] = -1
        constants[node.inputs[1]] = (layer.weight * layer.weight_scale.reshape(channel)).astype(np.float32)
        if len(node.inputs) > 2:
            accumulator_scale = qgraph.tensors[node.inputs[0]].params.scale * layer.weight_scale
            constants[node.inputs[2]] = (layer.bias * accumulator_scale).astype(np.float32)
    return Graph(graph.inputs, graph.outputs, graph.nodes, constants)


def error_in_steps(graph: Graph, qgraph: QGraph, x: np.ndarray) -> float:
    """max |integer - float| / output scale, the float graph fed the dequantized int8 input and using the
    dequantized weights."""
    x_q = quantize_input(qgraph, x)
    reference = with_dequantized_weights(graph, qgraph)
    expected = run(reference, {"x": qgraph.input_params.dequantize(x_q)})[graph.outputs[0]]
    got = dequantize_output(qgraph, run_integer(qgraph, x_q))
    assert got.shape == expected.shape
    return float(np.max(np.abs(got - expected)) / qgraph.output_params.scale)


def image(n: int = 64, shape: tuple[int, ...] = (4, 7, 7), seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, *shape)).astype(np.float32)


def test_quantized_roles_follow_the_lowerings() -> None:
    weighted = {op for op in LOWERINGS if quantizable_roles(op) == ("weight", "activation")}
    assert weighted == {"conv", "conv_transpose", "dense", "embedding"}
    assert all(quantizable_roles(op) == ("activation",) for op in set(LOWERINGS) - weighted)
    assert quantizable_roles("no_such_op") is None


CONV_CASES = {
    "3x3 pad 1": ({"pads": [1, 1, 1, 1]}, (6, 4, 3, 3)),
    "stride 2 asymmetric pads": ({"strides": [2, 2], "pads": [0, 1, 1, 0]}, (6, 4, 3, 3)),
    "dilation 2": ({"dilations": [2, 2], "pads": [2, 2, 2, 2]}, (5, 4, 3, 3)),
    "groups 2": ({"groups": 2, "pads": [1, 1, 1, 1]}, (6, 2, 3, 3)),
    "depthwise": ({"groups": 4, "pads": [1, 1, 1, 1]}, (4, 1, 3, 3)),
    "depthwise multiplier 2": ({"groups": 4, "strides": [2, 1]}, (8, 1, 3, 3)),
    "fused relu": ({"pads": [1, 1, 1, 1], "activation": "relu"}, (6, 4, 3, 3)),
    "fused relu6": ({"activation": "relu6"}, (6, 4, 3, 3)),
    "fused clip": ({"activation": "clip", "activation_attrs": {"min": -0.5, "max": 1.0}}, (6, 4, 3, 3)),
    "fused tanh": ({"activation": "tanh"}, (6, 4, 3, 3)),
    "fused gelu": ({"activation": "gelu", "pads": [1, 1, 1, 1]}, (6, 4, 3, 3)),
}


@pytest.mark.parametrize("granularity", ["per_tensor", "per_channel"])
@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv_matches_float_within_two_steps(case: str, granularity: str) -> None:
    attrs, weight_shape = CONV_CASES[case]
    rng = np.random.default_rng(2)
    constants = {"w": rng.normal(0, 0.3, weight_shape), "b": rng.normal(0, 0.2, weight_shape[0])}
    graph = graph_of([Node("conv", "conv", ["x", "w", "b"], ["y"], attrs)], (4, 7, 7), constants)
    x = image()
    qgraph = lower(graph, x, with_weights(default_config(graph, C_CAPABILITY), granularity=granularity))
    conv = qgraph.layers[0]
    assert len(conv.multiplier) == (weight_shape[0] if granularity == "per_channel" else 1)
    steps = 2.0
    if attrs.get("activation") in ("tanh", "gelu"):  # the table activation follows as a lookup layer
        assert [layer.op for layer in qgraph.layers] == ["conv", "lookup"]
        assert conv.outputs == ["y:pre_activation"]
        # the pre-activation's rounding (half its step, slope <= 1.13) passes through the table
        steps = 1.0 + 0.6 * qgraph.tensors["y:pre_activation"].params.scale / qgraph.output_params.scale
    assert error_in_steps(graph, qgraph, x) <= steps


def test_conv_pads_with_the_input_zero_point() -> None:
    """An input that is all real zeros but for one pixel: padding must add exactly nothing."""
    weight = np.ones((1, 1, 3, 3))
    graph = graph_of([Node("conv", "conv", ["x", "w"], ["y"], {"pads": [1, 1, 1, 1]})], (1, 5, 5), {"w": weight})
    x = np.abs(image(32, (1, 5, 5))) + 0.5  # all positive: the zero point sits at -128
    qgraph = lower(graph, x)
    assert qgraph.input_params.zero_point == -128
    assert error_in_steps(graph, qgraph, x) <= 1.0


def test_conv1d_matches_float() -> None:
    constants = {"w": RNG.normal(0, 0.3, (5, 3, 4)), "b": RNG.normal(0, 0.1, 5)}
    graph = graph_of([Node("conv", "conv", ["x", "w", "b"], ["y"], {"strides": [2], "pads": [1, 2]})], (3, 20),
                     constants)
    x = image(64, (3, 20))
    assert error_in_steps(graph, lower(graph, x), x) <= 2.0


@pytest.mark.parametrize("activation", ["none", "relu", "leaky_relu", "sigmoid", "hard_swish"])
def test_dense_with_fused_activation_matches_float(activation: str) -> None:
    constants = {"w": RNG.normal(0, 0.3, (12, 7)), "b": RNG.normal(0, 0.1, 7)}
    graph = graph_of([Node("fc", "dense", ["x", "w", "b"], ["y"], {"activation": activation})], (12,), constants)
    x = image(200, (12,))
    assert error_in_steps(graph, lower(graph, x), x) <= 2.0


def test_dense_over_the_last_axis_of_a_3d_input() -> None:
    constants = {"w": RNG.normal(0, 0.3, (6, 4))}
    graph = graph_of([Node("fc", "dense", ["x", "w"], ["y"], {})], (5, 6), constants)
    x = image(50, (5, 6))
    assert error_in_steps(graph, lower(graph, x), x) <= 2.0


POOL_CASES = {
    "max_pool 2x2": ("max_pool", {"kernel": [2, 2]}),
    "max_pool 3x3 s2 pads ceil": ("max_pool", {"kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                                               "ceil_mode": True}),
    "avg_pool 2x2": ("avg_pool", {"kernel": [2, 2]}),
    "avg_pool 3x3 pads excluded": ("avg_pool", {"kernel": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]}),
    "avg_pool 3x3 pads counted": ("avg_pool", {"kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                                               "count_include_pad": True}),
    "global_avg_pool": ("global_avg_pool", {}),
    "reduce_mean spatial": ("reduce_mean", {"axes": [2, 3], "keepdims": False}),
    "reduce_sum channels": ("reduce_sum", {"axes": [1]}),
    "reduce_max": ("reduce_max", {"axes": [-1]}),
}


@pytest.mark.parametrize("case", sorted(POOL_CASES))
def test_pooling_and_reductions_match_float(case: str) -> None:
    op, attrs = POOL_CASES[case]
    graph = graph_of([Node("pool", op, ["x"], ["y"], attrs)], (4, 7, 7))
    x = image()
    qgraph = lower(graph, x)
    assert error_in_steps(graph, qgraph, x) <= 1.0
    if op in ("max_pool", "reduce_max"):  # a selection: exact in the input's own params
        assert qgraph.output_params == qgraph.input_params
        x_q = quantize_input(qgraph, x)
        expected = OPS[op].run([x_q.astype(np.float32)], attrs)[0]
        assert np.array_equal(run_integer(qgraph, x_q), expected.astype(np.int8))


def two_branches(op: str, width: int = 6, scale: float = 3.0, **attrs: object) -> Graph:
    """x -> fc_a (range ~1) and fc_b (range ~scale), then `op` of the two: inputs with different params."""
    rng = np.random.default_rng(3)
    constants = {"wa": rng.normal(0, 0.3, (8, width)), "wb": rng.normal(0, 0.3 * scale, (8, width))}
    nodes = [Node("fc_a", "dense", ["x", "wa"], ["a"], {}), Node("fc_b", "dense", ["x", "wb"], ["b"], {}),
             Node("join", op, ["a", "b"], ["y"], dict(attrs))]
    return graph_of(nodes, (8,), constants)


@pytest.mark.parametrize("op,axis", [("add", None), ("sub", None), ("mul", None), ("concat", 1), ("concat", 0),
                                     ("max", None), ("min", None)])
def test_binary_ops_on_inputs_with_different_scales(op: str, axis: int | None) -> None:
    graph = two_branches(op, **({} if axis is None else {"axis": axis}))
    x = image(200, (8,))
    qgraph = lower(graph, x)
    a, b = (qgraph.tensors[name].params for name in ("a", "b"))
    assert a.scale != b.scale
    # add/sub round twice (each input to the common scale, then the sum), mul and concat once; max and min
    # requantize each input to the output's scale, so one input's own half step of rounding comes through too.
    assert error_in_steps(graph, qgraph, x) <= (1.5 if op in ("add", "sub", "max", "min") else 1.0)


def test_add_of_a_broadcast_constant() -> None:
    constants = {"w": RNG.normal(0, 0.3, (4, 4, 1, 1)), "shift": RNG.normal(0, 1.0, (4, 1, 1))}
    nodes = [Node("conv", "conv", ["x", "w"], ["c"], {}), Node("plus", "add", ["c", "shift"], ["y"], {})]
    graph = graph_of(nodes, (4, 7, 7), constants)
    x = image()
    qgraph = lower(graph, x)
    assert "plus:shift" in qgraph.constants and qgraph.constants["plus:shift"].dtype == np.int8
    assert error_in_steps(graph, qgraph, x) <= 2.0


def test_concat_with_equal_params_is_an_exact_copy() -> None:
    """split then concat: both pieces keep the input's params, and so does the output when calibrated alike."""
    nodes = [Node("split", "split", ["x"], ["left", "right"], {"axis": 1, "sizes": [3, 5]}),
             Node("join", "concat", ["right", "left"], ["y"], {"axis": 1})]
    graph = graph_of(nodes, (8,))
    x = image(100, (8,))
    qgraph = lower(graph, x)
    assert qgraph.output_params == qgraph.input_params
    x_q = quantize_input(qgraph, x)
    assert np.array_equal(run_integer(qgraph, x_q), np.concatenate([x_q[:, 3:], x_q[:, :3]], axis=1))


@pytest.mark.parametrize("op,attrs", [("relu", {}), ("relu6", {}), ("clip", {"min": -1.0, "max": 0.5})])
def test_clamps_are_exact_in_the_input_domain(op: str, attrs: dict[str, float]) -> None:
    graph = graph_of([Node("act", op, ["x"], ["y"], attrs)], (10,))
    x = image(100, (10,), seed=4) * 4
    qgraph = lower(graph, x)
    params = qgraph.input_params
    assert qgraph.output_params == params
    low, high = {"relu": (0.0, None), "relu6": (0.0, 6.0), "clip": (-1.0, 0.5)}[op]
    q_low = int(params.quantize(np.float32(low)))
    q_high = params.qmax if high is None else int(params.quantize(np.float32(high)))
    x_q = np.arange(-128, 128, dtype=np.int8).reshape(-1, 1).repeat(10, axis=1)
    assert np.array_equal(run_integer(qgraph, x_q), np.clip(x_q, q_low, q_high))
    assert error_in_steps(graph, qgraph, x) <= 0.5 + 1e-6


@pytest.mark.parametrize("op,attrs", [("leaky_relu", {"alpha": 0.1}), ("sigmoid", {}), ("tanh", {}),
                                      ("hard_sigmoid", {}), ("hard_swish", {}), ("gelu", {}),
                                      ("gelu", {"approximate": "tanh"})])
def test_table_activations_are_the_float_op_quantized(op: str, attrs: dict[str, object]) -> None:
    graph = graph_of([Node("act", op, ["x"], ["y"], attrs)], (10,))
    x = image(100, (10,), seed=5) * 3
    qgraph = lower(graph, x)
    source, target = qgraph.input_params, qgraph.output_params
    every = np.arange(-128, 128, dtype=np.int8).reshape(-1, 1).repeat(10, axis=1)
    exact = target.quantize(OPS[op].run([source.dequantize(every)], attrs)[0])
    assert np.array_equal(run_integer(qgraph, every), exact)
    assert error_in_steps(graph, qgraph, x) <= 0.5 + 1e-6


@pytest.mark.parametrize("op,attrs", [("elu", {"alpha": 0.5}), ("selu", {}), ("softplus", {}), ("softsign", {}),
                                      ("abs", {}), ("neg", {}), ("exp", {}), ("log", {}), ("sqrt", {}),
                                      ("reciprocal", {}), ("pow", {"exponent": 3.0}), ("pow", {"exponent": 0.5}),
                                      ("erf", {})])
def test_elementwise_functions_are_exact_lookup_tables(op: str, attrs: dict[str, object]) -> None:
    """Every elementwise function of one value is a table of its quantized results: exact on all 256 inputs
    (log, sqrt, reciprocal and fractional powers on a positive input range, where they are defined)."""
    graph = graph_of([Node("act", op, ["x"], ["y"], attrs)], (10,))
    x = image(100, (10,), seed=5) * 2
    if op in ("log", "sqrt", "reciprocal") or attrs.get("exponent") == 0.5:
        x = np.abs(x) + 0.3
    qgraph = lower(graph, x)
    assert [layer.op for layer in qgraph.layers] == ["lookup"]
    source, target = qgraph.input_params, qgraph.output_params
    every = np.arange(-128, 128, dtype=np.int8).reshape(-1, 1).repeat(10, axis=1)
    exact = target.quantize(OPS[op].run([source.dequantize(every)], attrs)[0])
    assert np.array_equal(run_integer(qgraph, every), exact)
    if op not in ("log", "reciprocal"):  # steep near 0, where the input's own rounding dominates the error
        assert error_in_steps(graph, qgraph, x) <= 0.5 + 1e-6


def test_matmul_of_two_activations_matches_float() -> None:
    """Attention scores: two projections of the input, one transposed, multiplied."""
    constants = {"wq": RNG.normal(0, 0.5, (6, 5)), "wk": RNG.normal(0, 0.5, (6, 5))}
    nodes = [Node("query", "dense", ["x", "wq"], ["q"], {}), Node("key", "dense", ["x", "wk"], ["k"], {}),
             Node("turn", "transpose", ["k"], ["kt"], {"perm": [0, 2, 1]}),
             Node("scores", "matmul", ["q", "kt"], ["y"], {})]
    graph = graph_of(nodes, (4, 6), constants)
    x = image(100, (4, 6))
    qgraph = lower(graph, x)
    assert qgraph.layers[-1].op == "matmul"
    assert error_in_steps(graph, qgraph, x) <= 2.0  # q and k each carry their own rounding into the products


@pytest.mark.parametrize("slope", [[0.2], [0.25, -0.5, 0.0, 1.5]])
def test_prelu_is_a_table_or_two_requantizations(slope: list[float]) -> None:
    """One slope: the leaky_relu table (exact); one per channel, of any sign: within one step of float."""
    graph = graph_of([Node("act", "prelu", ["x", "slope"], ["y"], {})], (4, 3),
                     {"slope": np.array(slope).reshape(-1, 1)})
    x = image(100, (4, 3)) * 2
    qgraph = lower(graph, x)
    assert qgraph.layers[0].op == ("lookup" if len(slope) == 1 else "prelu")
    assert error_in_steps(graph, qgraph, x) <= 1.0


@pytest.mark.parametrize("granularity", ["per_tensor", "per_channel"])
def test_transposed_conv_matches_float_within_two_steps(granularity: str) -> None:
    constants = {"w": RNG.normal(0, 0.4, (4, 3, 3, 3)), "b": RNG.normal(0, 0.2, 6)}
    graph = graph_of([Node("up", "conv_transpose", ["x", "w", "b"], ["y"],
                           {"strides": [2, 2], "pads": [1, 0, 1, 1], "groups": 2, "output_padding": [1, 0]})],
                     (4, 3, 4), constants)
    x = image(100, (4, 3, 4))
    qgraph = lower(graph, x, with_weights(default_config(graph, C_CAPABILITY), granularity=granularity))
    assert qgraph.layers[0].op == "conv_transpose"
    assert error_in_steps(graph, qgraph, x) <= 2.0


def test_where_with_a_constant_condition_picks_requantized_values() -> None:
    condition = np.arange(8) % 3 == 0
    graph = Graph([TensorSpec("x", (None, 8))], ["y"],
                  [Node("fc", "dense", ["x", "w"], ["h"], {}), Node("pick", "where", ["c", "h", "x"], ["y"], {})],
                  {"w": RNG.normal(0, 0.5, (8, 8)).astype(np.float32), "c": condition})
    x = image(100, (8,))
    qgraph = lower(graph, x)
    assert qgraph.layers[-1].op == "where"
    assert error_in_steps(graph, qgraph, x) <= 1.0


@pytest.mark.parametrize("mode", ["half_pixel", "align_corners"])
def test_linear_resize_is_one_exact_sum_in_fixed_point(mode: str) -> None:
    attrs = {"sizes": [1, 3, 7, 9], "scales": [1, 1, 7 / 4, 9 / 5], "mode": "linear",
             "coordinate_transformation_mode": mode}
    constants = {"w": np.random.default_rng(14).normal(0, 0.5, (3, 3, 1, 1))}
    graph = graph_of([Node("c", "conv", ["x", "w"], ["a"], {}), Node("up", "resize", ["a"], ["y"], attrs)],
                     (3, 4, 5), constants)
    x = image(100, (3, 4, 5))
    qgraph = lower(graph, x)
    assert qgraph.layers[-1].op == "resize_linear"
    # the conv output's own half step (interpolation keeps it: the weights sum to one) and the resize's half step
    assert error_in_steps(graph, qgraph, x) <= 1.0 + 0.5


@pytest.mark.parametrize("op,attrs", [("layer_norm", {}), ("lrn", {"size": 3}), ("log_softmax", {})])
def test_float_only_ops_are_refused_saying_they_must_run_in_float(op: str, attrs: dict[str, object]) -> None:
    graph = graph_of([Node("norm", op, ["x"], ["y"], attrs)], (4, 2))
    stats = calibrate(graph, [{"x": image(10, (4, 2))}], Progress.silent())
    with pytest.raises(BuildError, match=rf"node 'norm'.*{op}.* must run in float .*float island"):
        quantize(graph, stats, QuantConfig({"norm": NodeConfig(weight=None, activation=INT8_ACTIVATION)}))
    with pytest.raises(BuildError, match=rf"node 'norm': op '{op}' must run in float"):
        default_config(graph, C_CAPABILITY)


@pytest.mark.parametrize("shape,axis", [((10,), -1), ((3, 6), 1)])
def test_softmax_in_fixed_point(shape: tuple[int, ...], axis: int) -> None:
    graph = graph_of([Node("probabilities", "softmax", ["x"], ["y"], {"axis": axis})], shape)
    x = image(300, shape) * 3
    qgraph = lower(graph, x)
    assert (qgraph.output_params.scale, qgraph.output_params.zero_point) == (1 / 256, -128)
    x_q = quantize_input(qgraph, x)
    expected = run(graph, {"x": qgraph.input_params.dequantize(x_q)})["y"]
    error = np.abs(dequantize_output(qgraph, run_integer(qgraph, x_q)) - expected) * 256
    # the exp table's rounding (2**-17 of 1.0 per entry) adds little to the final division's half step;
    # probabilities above 255/256 saturate there (the int8 output ends at 127 = 255/256)
    assert error[expected <= 255 / 256].max() <= 0.5 + 0.01
    assert error.max() <= 1.0 + 0.01
    room = x_q.reshape(len(x_q), -1).max(axis=1) <= 122  # samples that shifting by 5 does not saturate
    shifted = (x_q[room].astype(np.int16) + 5).astype(np.int8)  # softmax is shift invariant, and so is max - x
    assert np.array_equal(run_integer(qgraph, shifted), run_integer(qgraph, x_q[room]))


LAYOUT_CASES = {
    "identity": ("identity", {}),
    "reshape": ("reshape", {"shape": [0, 5, -1]}),
    "flatten": ("flatten", {}),
    "transpose": ("transpose", {"perm": [0, 3, 1, 2]}),
    "squeeze": ("squeeze", {"axes": [2]}),
    "unsqueeze": ("unsqueeze", {"axes": [1]}),
    "slice": ("slice", {"starts": [1, 0], "ends": [3, 5], "axes": [1, 3], "steps": [1, 2]}),
    "pad": ("pad", {"pads": [0, 0, 1, 2, 0, 0, 3, 0]}),
    "pad edge": ("pad", {"pads": [0, 0, 1, 1, 0, 0, 1, 1], "mode": "edge"}),
    "gather": ("gather", {"axis": 3, "indices": [[4, 0], [0, -2]]}),
    "tile": ("tile", {"repeats": [1, 2, 3, 1]}),
    "expand": ("expand", {"shape": [1, 3, 4, 5]}),
    "resize nearest": ("resize", {"sizes": [1, 3, 2, 8], "scales": [1, 1, 2, 1.6],
                                  "coordinate_transformation_mode": "half_pixel"}),
}


@pytest.mark.parametrize("case", sorted(LAYOUT_CASES))
def test_layout_ops_are_bit_exact_on_int8(case: str) -> None:
    op, attrs = LAYOUT_CASES[case]
    graph = graph_of([Node("move", op, ["x"], ["y"], attrs)], (3, 1, 5))
    x = image(40, (3, 1, 5))
    qgraph = lower(graph, x)
    assert qgraph.output_params == qgraph.input_params
    x_q = quantize_input(qgraph, x)
    y_q = run_integer(qgraph, x_q)
    if op == "pad" and attrs.get("mode", "constant") == "constant":  # pads hold the zero point: a real 0
        expected = np.pad(x_q, [(0, 0), (0, 0), (1, 3), (2, 0)], constant_values=qgraph.input_params.zero_point)
    else:
        expected = OPS[op].run([x_q], attrs)[0]
    assert y_q.dtype == np.int8 and np.array_equal(y_q, expected)
    assert error_in_steps(graph, qgraph, x) == 0.0


def test_standalone_batch_norm_is_a_per_channel_affine_requantization() -> None:
    channels = 4
    constants = {"scale": [1.5, -0.5, 0.05, 3.0], "bias": [0.1, -1.0, 2.0, 0.0], "mean": RNG.normal(size=channels),
                 "var": RNG.uniform(0.5, 2, channels)}
    graph = graph_of([Node("bn", "batch_norm", ["x", "scale", "bias", "mean", "var"], ["y"], {})], (channels, 5, 5),
                     constants)
    x = image(64, (channels, 5, 5))
    qgraph = lower(graph, x)
    assert qgraph.layers[0].op == "conv" and len(qgraph.layers[0].multiplier) == channels
    assert error_in_steps(graph, qgraph, x) <= 1.0


def test_an_op_without_lowering_names_the_node_and_op() -> None:
    graph = graph_of([Node("ratio", "div", ["x", "x"], ["y"], {})], (4,))
    stats = calibrate(graph, [{"x": image(10, (4,))}], Progress.silent())
    config = QuantConfig({"ratio": NodeConfig(weight=None, activation=INT8_ACTIVATION)})
    with pytest.raises(BuildError, match=r"node 'ratio': op 'div' has no integer lowering"):
        quantize(graph, stats, config)


def fallback_graph() -> tuple[Graph, QuantConfig, np.ndarray]:
    """dense -> div by a constant (no integer lowering) -> dense, with the div left in fp32."""
    rng = np.random.default_rng(6)
    constants = {"w1": rng.normal(0, 0.4, (6, 5)), "d": rng.uniform(0.5, 2.0, 5), "w2": rng.normal(0, 0.4, (5, 3))}
    nodes = [Node("fc1", "dense", ["x", "w1"], ["h"], {"activation": "relu"}),
             Node("scale", "div", ["h", "d"], ["s"], {}),
             Node("fc2", "dense", ["s", "w2"], ["y"], {})]
    graph = graph_of(nodes, (6,), constants)
    dense = NodeConfig(weight=INT8_WEIGHT, activation=INT8_ACTIVATION)
    config = QuantConfig({"fc1": dense, "scale": NodeConfig(weight=None, activation=None), "fc2": dense})
    return graph, config, image(200, (6,))


def test_an_fp32_node_is_a_float_island_quantized_only_at_its_boundary(tmp_path: Path) -> None:
    graph, config, x = fallback_graph()
    qgraph = lower(graph, x, config)
    layers = {layer.name: layer for layer in qgraph.layers}
    assert isinstance(layers["scale"], QFloat) and layers["scale"].float_op == "div"
    # h, read only by the fp32 div, stays float: fc1 hands it its float result (dequantized int8 weights).
    assert qgraph.floats == {"h": (5,)} and "h" not in qgraph.tensors
    assert isinstance(layers["fc1"], QFloatWeighted)
    stats_range = calibrate(graph, [{"x": x}], Progress.silent()).ranges["s"]
    out = qgraph.tensors["s"].params
    assert out.scale == pytest.approx((max(stats_range[1], 0) - min(stats_range[0], 0)) / 255)  # its minmax range
    trace = run_integer(qgraph, quantize_input(qgraph, x), keep_intermediates=True)
    assert trace["h"].dtype == np.float32
    real_input = qgraph.input_params.dequantize(quantize_input(qgraph, x))
    h = np.maximum(real_input @ layers["fc1"].real_weight(), 0)
    np.testing.assert_allclose(trace["h"], h, rtol=1e-5, atol=1e-6)
    float_output = trace["h"] / graph.constants["d"]
    assert np.array_equal(trace["s"], out.quantize(float_output))  # the float op, then its output quantized
    assert error_in_steps(graph, qgraph, x) <= 2.0
    # The C target runs the island on a core with an FPU, exactly (test_c_islands); one without refuses at
    # export, naming the node.
    with pytest.raises(BuildError, match=r"node 'fc1' \(dense\) computes in float.*cpu 'cortex-m0' has no FPU"):
        CTarget(CTarget.Options(cpu="cortex-m0")).export(qgraph, tmp_path)
    CTarget().export(qgraph, tmp_path)
    (tmp_path / "work").mkdir()
    x_q = quantize_input(qgraph, x[:20])
    np.testing.assert_array_equal(CTarget().run(tmp_path, x_q, tmp_path / "work"), run_integer(qgraph, x_q))


def test_c_target_names_layers_it_has_no_kernel_for(tmp_path: Path) -> None:
    graph = graph_of([Node("volume", "conv", ["x", "w"], ["y"], {})], (2, 3, 3, 3), {"w": RNG.normal(size=(2, 2, 2, 2, 2))})
    with pytest.raises(BuildError, match=r"layer 'volume'.*no kernel for op 'conv'"):
        CTarget().export(lower(graph, image(32, (2, 3, 3, 3))), tmp_path)


def digits_cnn(channels: int = 32, seed: int = 0) -> Graph:
    """reshape -> conv 3x3 + relu -> max_pool -> depthwise 3x3 + relu -> conv 1x1 + residual add -> relu
    -> global_avg_pool -> flatten: random-feature convolutions (dense head fitted later)."""
    rng = np.random.default_rng(seed)
    constants = {"w1": rng.normal(0, 1 / 3, (channels, 1, 3, 3)), "b1": rng.normal(0, 0.1, channels),
                 "w2": rng.normal(0, 1 / 3, (channels, 1, 3, 3)), "b2": np.zeros(channels),
                 "w3": rng.normal(0, 1 / np.sqrt(channels), (channels, channels, 1, 1)), "b3": np.zeros(channels)}
    nodes = [
        Node("image", "reshape", ["x"], ["image"], {"shape": [0, 1, 8, 8]}),
        Node("conv1", "conv", ["image", "w1", "b1"], ["c1"], {"pads": [1, 1, 1, 1], "activation": "relu"}),
        Node("pool", "max_pool", ["c1"], ["p1"], {"kernel": [2, 2]}),
        Node("depthwise", "conv", ["p1", "w2", "b2"], ["c2"], {"pads": [1, 1, 1, 1], "groups": channels,
                                                               "activation": "relu"}),
        Node("pointwise", "conv", ["c2", "w3", "b3"], ["c3"], {}),
        Node("residual", "add", ["c3", "p1"], ["r"], {}),
        Node("act", "relu", ["r"], ["a"], {}),
        Node("gap", "global_avg_pool", ["a"], ["g"], {}),
        Node("flat", "flatten", ["g"], ["f"], {}),
    ]
    return graph_of(nodes, (64,), constants, output="f")


@pytest.fixture(scope="module")
def digits_model() -> tuple[Graph, dict[str, np.ndarray]]:
    """The CNN with a dense head fitted by ridge least squares on its float features."""
    data = dict(np.load(Path(__file__).resolve().parent.parent / "recipes" / "digits" / "data.npz"))
    graph = digits_cnn()
    features = run(graph, {"x": data["x_train"]})["f"]
    design = np.c_[features, np.ones(len(features))]
    solution = np.linalg.solve(design.T @ design + 1e-2 * np.eye(design.shape[1]),
                               design.T @ np.eye(10)[data["y_train"]])
    graph.constants.update(w4=solution[:-1].astype(np.float32), b4=solution[-1].astype(np.float32))
    graph.nodes.append(Node("head", "dense", ["f", "w4", "b4"], ["logits"], {}))
    graph.outputs = ["logits"]
    return graph, data


@pytest.mark.parametrize("granularity", ["per_tensor", "per_channel"])
def test_int8_digits_cnn_is_within_two_percent_of_float(digits_model: tuple[Graph, dict[str, np.ndarray]],
                                                        granularity: str) -> None:
    graph, data = digits_model
    config = with_weights(default_config(graph, C_CAPABILITY), granularity=granularity)
    qgraph = lower(graph, data["x_train"][:500], config)
    assert [layer.op for layer in qgraph.layers] == ["reshape", "conv", "max_pool", "conv", "conv", "add", "relu",
                                                     "mean", "flatten", "dense"]
    labels = data["y_test"]
    float_accuracy = np.mean(run(graph, {"x": data["x_test"]})["logits"].argmax(1) == labels)
    int8_accuracy = np.mean(run_quantized(qgraph, data["x_test"]).argmax(1) == labels)
    assert float_accuracy > 0.88
    assert int8_accuracy >= float_accuracy - 0.02, (int8_accuracy, float_accuracy)
    # Per-layer traces line up with the float interpreter's tensors by name.
    x = data["x_test"][:50]
    trace = run_integer(qgraph, quantize_input(qgraph, x), keep_intermediates=True)
    floats = run(graph, {"x": x}, keep_intermediates=True)
    for name in floats:
        real = qgraph.tensors[name].params.dequantize(trace[name])
        assert np.max(np.abs(real - floats[name])) <= 0.25 * max(1.0, float(np.abs(floats[name]).max())), name


def test_per_channel_conv_weights_beat_per_tensor_on_uneven_channels() -> None:
    rng = np.random.default_rng(7)
    weight = rng.normal(0, 0.3, (6, 4, 3, 3))
    weight[0] *= 40  # one loud channel: per-tensor scales would drown the others
    graph = graph_of([Node("conv", "conv", ["x", "w"], ["y"], {"pads": [1, 1, 1, 1]})], (4, 7, 7), {"w": weight})
    x = image()
    config = default_config(graph, C_CAPABILITY)
    errors = {}
    for granularity in ("per_tensor", "per_channel"):
        qgraph = lower(graph, x, with_weights(config, granularity=granularity))
        layer = qgraph.layers[0]
        assert len(layer.weight_scale) == (6 if granularity == "per_channel" else 1)
        x_q = quantize_input(qgraph, x)
        expected = run(graph, {"x": qgraph.input_params.dequantize(x_q)})["y"][:, 1:]  # the quiet channels
        # the int32 accumulators in real units: only the weights' rounding separates them from float
        accumulator = run_integer(qgraph, x_q, keep_intermediates=True)["conv:accumulator"].astype(np.float64)
        real = accumulator * qgraph.input_params.scale * layer.weight_scale.reshape(-1, 1, 1)
        errors[granularity] = np.abs(real[:, 1:] - expected).mean()
    assert errors["per_channel"] < 0.1 * errors["per_tensor"]


def test_a_dag_saves_and_loads_byte_stably(tmp_path: Path, digits_model: tuple[Graph, dict[str, np.ndarray]]) -> None:
    graph, data = digits_model
    graph = Graph(graph.inputs, ["y"], [*graph.nodes,
                                        Node("soft", "softmax", ["logits"], ["p"], {}),
                                        Node("gate", "sigmoid", ["logits"], ["g2"], {}),
                                        Node("both", "concat", ["p", "g2"], ["y"], {"axis": 1})],
                  {**graph.constants})
    x = data["x_train"][:200]
    qgraph = lower(graph, x)
    first, second, third = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    qgraph.save(first)
    qgraph.save(second)
    loaded = QGraph.load(first)
    loaded.save(third)
    for name in ("qgraph.json", "qweights.npz"):
        assert (first / name).read_bytes() == (second / name).read_bytes() == (third / name).read_bytes(), name
    x_q = quantize_input(qgraph, data["x_test"])
    assert np.array_equal(run_integer(loaded, x_q), run_integer(qgraph, x_q))
    assert [type(layer) for layer in loaded.layers] == [type(layer) for layer in qgraph.layers]


def test_a_weight_cache_lowers_configs_as_without_it_and_quantizes_each_weight_once() -> None:
    """A tuning run's cache hands back a node's weights (and their packing) while its choice stays, and lowers
    each config to the same layers as a fresh lowering; a changed choice is quantized anew."""
    rng = np.random.default_rng(3)
    constants = {"w1": rng.normal(0, 0.3, (6, 4, 3, 3)), "w2": rng.normal(0, 0.3, (5, 6, 1, 1))}
    graph = graph_of([Node("a", "conv", ["x", "w1"], ["h"], {"pads": [1, 1, 1, 1], "activation": "relu"}),
                      Node("b", "conv", ["h", "w2"], ["y"], {})], (4, 7, 7), constants)
    x = image()
    stats = calibrate(graph, [{"x": x}], Progress.silent())
    base = default_config(graph, C_CAPABILITY)
    per_channel = QuantConfig({**base.nodes, "b": with_weights(base, granularity="per_channel").nodes["b"]})
    cache = WeightCache()
    first = quantize(graph, stats, base, weight_cache=cache)
    y_first = run_integer(first, quantize_input(first, x))  # packs each weight into the cache's dicts
    for config in (per_channel, base):
        cached, fresh = quantize(graph, stats, config, weight_cache=cache), quantize(graph, stats, config)
        for layer, expected in zip(cached.layers, fresh.layers):
            np.testing.assert_array_equal(layer.weight, expected.weight)
            np.testing.assert_array_equal(layer.multiplier, expected.multiplier)
        np.testing.assert_array_equal(run_integer(cached, quantize_input(cached, x)),
                                      run_integer(fresh, quantize_input(fresh, x)))
    assert cached.layers[0].weight is first.layers[0].weight  # node a's choice never changed
    assert vars(cached.layers[0])["_packs"] is vars(first.layers[0])["_packs"]
    assert cached.layers[1].weight is not first.layers[1].weight  # b went per channel and back: quantized again
    assert not cached.layers[1].weight.flags.writeable
    np.testing.assert_array_equal(run_integer(cached, quantize_input(cached, x)), y_first)
