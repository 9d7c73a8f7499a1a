"""Given quantization: fake_quant nodes and Graph.given records become the QGraph's params, and what the integer
path cannot represent is refused naming node, parameter and nearest choice."""

from __future__ import annotations

import numpy as np
import pytest

from dabuild.errors import BuildError
from dabuild.ir import Graph, Node, TensorSpec
from dabuild.ir.given_quant import GivenQuant
from dabuild.ir.interpreter import run
from dabuild.ir.passes import optimize
from dabuild.progress import Progress
from dabuild.qir.reference import quantize_input, run_integer
from dabuild.quant.calibrate import calibrate
from dabuild.quant.quantize import quantize
from dabuild.tune.space import build_space
from tests.test_quantize import C_CAPABILITY

RNG = np.random.default_rng(0)
X = RNG.normal(size=(200, 12)).astype(np.float32)


def fq(name: str, source: str, output: str, given: GivenQuant) -> Node:
    return Node(name, "fake_quant", [source], [output], given.attrs())


def given_mlp(act_in: GivenQuant, act_hidden: GivenQuant, weight_bits: int = 8, *, out_given: bool = True) -> Graph:
    """x -> fq -> dense(fq(w1)) -> fq -> relu -> dense(fq(w2), per channel) [-> fq]."""
    w1 = RNG.normal(0, 0.3, (12, 16)).astype(np.float32)
    w2 = RNG.normal(0, 0.3, (16, 4)).astype(np.float32)
    qmax = 2 ** (weight_bits - 1) - 1
    s1 = GivenQuant((float(np.abs(w1).max() / qmax),), (0,), weight_bits, True, narrow=True)
    s2 = GivenQuant(tuple(float(v) for v in np.abs(w2).max(axis=0) / qmax), (0,) * 4, weight_bits, True, axis=1,
                    narrow=True)
    nodes = [fq("qx", "x", "xq", act_in), fq("qw1", "w1", "w1q", s1),
             Node("fc1", "dense", ["xq", "w1q", "b1"], ["h"], {"activation": "none"}),
             fq("qh", "h", "hq", act_hidden), Node("act", "relu", ["hq"], ["r"]),
             fq("qw2", "w2", "w2q", s2), Node("fc2", "dense", ["r", "w2q", "b2"], ["y" if out_given else "out"], {})]
    if out_given:
        nodes.append(fq("qy", "y", "out", GivenQuant((0.05,), (0,), 8, True)))
    return Graph([TensorSpec("x", (None, 12))], ["out"], nodes,
                 {"w1": w1, "w2": w2, "b1": RNG.normal(0, .1, 16).astype(np.float32),
                  "b2": RNG.normal(0, .1, 4).astype(np.float32)})


def lowered(graph: Graph):
    graph = optimize(graph)
    stats = calibrate(graph, [{"x": X}], Progress.silent())
    config = build_space(graph, C_CAPABILITY).default()
    return graph, quantize(graph, stats, config)


def test_weights_become_records_and_activations_keep_their_quantizers(tmp_path):
    graph = optimize(given_mlp(GivenQuant((0.03,), (-5,), 8, True), GivenQuant((0.04,), (0,), 8, True)))
    assert sorted(graph.given) == ["w1q", "w2q"]
    assert graph.given["w2q"].axis == 1
    assert [n.op for n in graph.nodes].count("fake_quant") == 3  # x, h, y: activations stay nodes
    graph.save(tmp_path)
    again = Graph.load(tmp_path)
    assert again.given == graph.given and again.content_hash() == graph.content_hash()
    plain = optimize(given_mlp(GivenQuant((0.03,), (-5,), 8, True), GivenQuant((0.04,), (0,), 8, True)))
    plain.given = {}
    assert plain.content_hash() != graph.content_hash()


def test_qgraph_takes_the_given_params_and_matches_the_fake_quant_float_run():
    graph, qgraph = lowered(given_mlp(GivenQuant((0.03,), (-5,), 8, True), GivenQuant((0.04,), (0,), 8, True)))
    assert qgraph.input_params.scale == 0.03 and qgraph.input_params.zero_point == -5
    assert qgraph.tensors["hq"].params.scale == 0.04
    assert qgraph.output == "out" and qgraph.output_params.scale == 0.05
    fc1 = next(layer for layer in qgraph.layers if layer.name == "fc1")
    assert np.array_equal(fc1.weight, np.round(graph.constants["w1q"] / graph.given["w1q"].scale[0]))
    fc2 = next(layer for layer in qgraph.layers if layer.name == "fc2")
    assert np.allclose(fc2.weight_scale, graph.given["w2q"].scale)
    assert [layer.op for layer in qgraph.layers] == ["dense", "relu", "dense"]  # the quantizers cost nothing
    expected = run(graph, {"x": X})["out"]
    integers = run_integer(qgraph, quantize_input(qgraph, X))
    steps = np.abs(qgraph.output_params.dequantize(integers) - expected) / 0.05
    assert steps.max() <= 1.0 + 1e-6


def test_uint8_activations_shift_onto_int8_kernels_exactly():
    graph, qgraph = lowered(given_mlp(GivenQuant((0.03,), (120,), 8, False), GivenQuant((0.04,), (0,), 8, False)))
    assert qgraph.input_params.dtype == "int8" and qgraph.input_params.zero_point == 120 - 128
    assert qgraph.tensors["hq"].params.zero_point == -128  # uint8 zero point 0: relu lives in the zero point
    expected = run(graph, {"x": X})["out"]
    got = qgraph.output_params.dequantize(run_integer(qgraph, quantize_input(qgraph, X)))
    assert np.abs(got - expected).max() <= 0.05 + 1e-6


def test_unquantized_layers_are_calibrated_and_tunable():
    graph = optimize(given_mlp(GivenQuant((0.03,), (0,), 8, True), GivenQuant((0.04,), (0,), 8, True),
                               out_given=False))
    space = build_space(graph, C_CAPABILITY)
    assert len(space.nodes["fc1"].candidates) == 1
    assert len(space.nodes["fc2"].candidates) > 1  # its output is the model's float: the capability's choices
    assert all(c.weight.algorithm == "given" for c in space.nodes["fc2"].candidates)


@pytest.mark.parametrize("given, message", [
    (GivenQuant((0.03,), (0,), 20, True), "parameter bit width: int20 .* nearest representable: int16"),
    (GivenQuant((0.03,), (0,), 8, True, rounding="floor"), "parameter rounding: 'floor' .* nearest representable"),
    (GivenQuant((0.03,), (0,), 8, True, narrow=True), "parameter narrow: .* nearest representable: narrow false"),
])
def test_unrepresentable_quantization_is_refused_naming_node_parameter_and_nearest(given, message):
    with pytest.raises(BuildError, match=f"node 'qx' \\(fake_quant\\): {message}"):
        lowered(given_mlp(given, GivenQuant((0.04,), (0,), 8, True)))


def test_quantizing_twice_is_reported_not_merged():
    graph = given_mlp(GivenQuant((0.03,), (0,), 8, True), GivenQuant((0.04,), (0,), 8, True))
    graph.nodes.insert(1, fq("again", "xq", "xq2", GivenQuant((0.02,), (0,), 8, True)))
    graph.nodes[3].inputs[0] = "xq2"
    with pytest.raises(BuildError, match="node 'again' \\(fake_quant\\) quantizes tensor 'xq' a second time.*'qx'"):
        optimize(graph)


def test_narrowing_what_the_model_quantizes_itself_is_an_error():
    graph = optimize(given_mlp(GivenQuant((0.03,), (0,), 8, True), GivenQuant((0.04,), (0,), 8, True),
                               out_given=False))
    with pytest.raises(BuildError, match="tuning.space.op_name.fc1.weight: the model quantizes this weight itself"):
        build_space(graph, C_CAPABILITY, {"op_name": {"fc1": {"weight": {"granularity": ["per_channel"]}}}})
    with pytest.raises(BuildError, match="tuning.space.op_type.dense.weight: the model quantizes the weight of every"):
        build_space(graph, C_CAPABILITY, {"op_type": {"dense": {"weight": {"granularity": ["per_channel"]}}}})
    space = build_space(graph, C_CAPABILITY, {"op_type": {"dense": {"activation": {"scheme": ["sym"]}}}})
    assert {c.activation.scheme for c in space.nodes["fc2"].candidates} == {"sym"}  # fc2's output is the float one


def test_two_quantizers_of_one_tensor_with_equal_params_share_it():
    """onnxruntime may write one QuantizeLinear per reader: both read the same integer tensor."""
    same = GivenQuant((0.04,), (0,), 8, True)
    graph = given_mlp(GivenQuant((0.03,), (0,), 8, True), same)
    graph.nodes[4:5] = [Node("act", "relu", ["hq"], ["r1"]), fq("qh2", "h", "hq2", same),
                        Node("act2", "relu", ["hq2"], ["r2"]), Node("sum", "add", ["r1", "r2"], ["r"])]
    graph, qgraph = lowered(graph)
    assert [layer.op for layer in qgraph.layers] == ["dense", "relu", "relu", "add", "dense"]
    expected = run(graph, {"x": X})["out"]
    got = qgraph.output_params.dequantize(run_integer(qgraph, quantize_input(qgraph, X)))
    assert np.abs(got - expected).max() <= 0.05 * 2 + 1e-6
