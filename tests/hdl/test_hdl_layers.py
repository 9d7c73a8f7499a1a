"""Every integer layer kind through da4ml: the traced program equals dabuild's integer reference, bit for bit.

Each test builds a small float graph, calibrates and quantizes it for capability da4ml (power-of-two scales),
traces it through da4ml's public `trace_model` (dabuild.targets.hdl.program.trace) and runs the program in
da4ml's DAIS interpreter on integer inputs spanning the input type's whole range (ties and saturation too).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_da4ml_plugin import DA4ML

from dabuild import notices
from dabuild.errors import BuildError
from dabuild.ir import Graph, Node, TensorSpec
from dabuild.progress import Progress
from dabuild.qir.qgraph import QGraph
from dabuild.qir.reference import run_integer
from dabuild.quant.calibrate import calibrate
from dabuild.quant.defaults import default_config
from dabuild.quant.quantize import quantize
from dabuild.targets.check import check_stage

pytest.importorskip("da4ml")
from da4ml.trace import HWConfig

from dabuild.targets.hdl import HdlTarget
from dabuild.targets.hdl.cost import Da4mlCost
from dabuild.targets.hdl.program import trace
from dabuild.targets.hdl.simulators import simulator
from dabuild.targets.hdl.symbolic import CONVERTERS

Spec = tuple[str, str, list[str], dict[str, Any]]  # (name, op, inputs, attrs); the output is the name


def fixed_point_graph(shape: tuple[int, ...], nodes: list[Spec], constants: dict[str, np.ndarray] | None = None,
                      dtypes: dict[str, str] | None = None, granularity: str = "per_tensor", seed: int = 0) -> QGraph:
    """The float graph of `nodes` (each node's output named after it, the last is the graph's output),
    calibrated on normal samples and quantized with capability da4ml's defaults, activation dtypes per node
    from `dtypes`, weights per tensor or per channel."""
    graph = Graph([TensorSpec("x", (None, *shape))], [nodes[-1][0]],
                  [Node(name, op, list(inputs), [name], attrs) for name, op, inputs, attrs in nodes],
                  {key: value.astype(np.float32) for key, value in (constants or {}).items()})
    x = np.random.default_rng(seed).normal(size=(256, *shape)).astype(np.float32)
    stats = calibrate(graph, [{"x": x}], Progress.silent())
    config = default_config(graph, DA4ML)
    for name, node in config.nodes.items():
        activation = dataclasses.replace(node.activation, dtype=(dtypes or {}).get(name, node.activation.dtype))
        weight = node.weight and dataclasses.replace(node.weight, granularity=granularity)
        config.nodes[name] = dataclasses.replace(node, weight=weight, activation=activation)
    return quantize(graph, stats, config)


def full_range_inputs(qgraph: QGraph, samples: int, seed: int = 1) -> np.ndarray:
    params = qgraph.input_params
    shape = (samples, *qgraph.tensors[qgraph.input].shape)
    return np.random.default_rng(seed).integers(params.qmin, params.qmax + 1, shape).astype(params.storage)


def assert_exact(qgraph: QGraph, samples: int = 400) -> np.ndarray:
    """The DAIS program's integer outputs equal run_integer's on full-range inputs; returns them."""
    comb = trace(qgraph, HWConfig(1, -1, -1))
    x_q = full_range_inputs(qgraph, samples)
    expected = run_integer(qgraph, x_q)
    real = x_q.reshape(samples, -1).astype(np.float64) * qgraph.input_params.scale
    actual = np.asarray(comb.predict(real, n_threads=1)).reshape(expected.shape) / qgraph.output_params.scale
    mismatches = np.flatnonzero(actual != expected)
    assert mismatches.size == 0, (f"{mismatches.size} of {expected.size} outputs differ, first at "
                                  f"{mismatches[0]}: da4ml {actual.flat[mismatches[0]]}, "
                                  f"dabuild {expected.flat[mismatches[0]]}")
    assert len(np.unique(expected)) > 3  # not a constant: the test can see a difference
    return expected


def conv_weights(out_channels: int, in_channels: int, kernel: tuple[int, ...], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    fan_in = in_channels * int(np.prod(kernel))
    return {"w": rng.normal(0, 1 / np.sqrt(fan_in), (out_channels, in_channels, *kernel)),
            "b": rng.normal(0, 0.2, out_channels)}


@pytest.mark.parametrize(("shape", "attrs", "out_channels", "granularity"), [
    ((2, 6, 5), {"pads": [1, 1, 1, 1]}, 3, "per_tensor"),
    ((2, 7, 7), {"strides": [2, 2], "pads": [0, 1, 2, 1], "dilations": [1, 2]}, 4, "per_channel"),
    ((4, 5, 5), {"groups": 2, "pads": [1, 0, 0, 1]}, 4, "per_channel"),
    ((3, 5, 4), {"groups": 3, "pads": [1, 1, 1, 1], "activation": "relu"}, 3, "per_channel"),  # depthwise
    ((3, 9), {"strides": [2], "pads": [2, 1], "dilations": [2]}, 2, "per_tensor"),               # 1-D
    ((2, 3, 4, 4), {"pads": [1, 0, 1, 1, 1, 0]}, 2, "per_channel"),                              # 3-D
])
def test_conv(shape: tuple[int, ...], attrs: dict[str, Any], out_channels: int, granularity: str) -> None:
    kernel = (3,) * (len(shape) - 1)
    weights = conv_weights(out_channels, shape[0] // attrs.get("groups", 1), kernel, seed=len(shape))
    qgraph = fixed_point_graph(shape, [("y", "conv", ["x", "w", "b"], attrs)], weights, granularity=granularity,
                               dtypes={"y": "int6"})
    expected = assert_exact(qgraph)
    assert expected.min() < 0 or attrs.get("activation") == "relu"


def test_dense_over_a_sequence_and_a_conv_without_bias() -> None:
    weights = conv_weights(2, 3, (2, 2), seed=3)
    qgraph = fixed_point_graph((3, 4, 4), [("c", "conv", ["x", "w"], {}), ("y", "dense", ["c", "d"], {})],
                               {"w": weights["w"], "d": np.random.default_rng(4).normal(size=(3, 5))})
    assert_exact(qgraph)


@pytest.mark.parametrize("op", ["add", "sub"])
def test_add_and_sub_of_two_scales_and_a_constant(op: str) -> None:
    """a is about 8x wider than b, so their scales differ; the constant broadcasts as the batch-first graph's."""
    nodes: list[Spec] = [("a", "dense", ["x", "wa"], {}), ("b", "dense", ["x", "wb"], {}),
                         ("s", op, ["a", "b"], {}), ("y", op, ["s", "k"], {})]
    rng = np.random.default_rng(5)
    qgraph = fixed_point_graph((6,), nodes, {"wa": rng.normal(0, 3, (6, 4)), "wb": rng.normal(0, 0.3, (6, 4)),
                                             "k": rng.normal(0, 1, (1, 4))}, dtypes={"a": "int6", "y": "int7"})
    assert len({qgraph.tensors[name].params.scale for name in "ab"}) == 2
    assert_exact(qgraph)


def test_mul_of_two_activations() -> None:
    rng = np.random.default_rng(6)
    nodes: list[Spec] = [("a", "dense", ["x", "wa"], {}), ("b", "dense", ["x", "wb"], {}),
                         ("y", "mul", ["a", "b"], {})]
    qgraph = fixed_point_graph((5,), nodes, {"wa": rng.normal(size=(5, 3)), "wb": rng.normal(size=(5, 3))},
                               dtypes={"a": "int5", "y": "int6"})
    assert_exact(qgraph)


@pytest.mark.parametrize("op", ["max", "min", "where"])
def test_max_min_and_where_requantize_then_pick(op: str) -> None:
    rng = np.random.default_rng(11)
    nodes: list[Spec] = [("a", "dense", ["x", "wa"], {}), ("b", "dense", ["x", "wb"], {}),
                         ("y", op, ["c", "a", "b"] if op == "where" else ["a", "b"], {})]
    qgraph = fixed_point_graph((4,), nodes, {"wa": rng.normal(0, 4, (4, 3)), "wb": rng.normal(0, 0.3, (4, 3)),
                                             "c": np.array([True, False, True])}, dtypes={"b": "int5"})
    assert qgraph.layers[-1].op == op
    assert_exact(qgraph)


def test_matmul_of_two_activations() -> None:
    rng = np.random.default_rng(12)
    nodes: list[Spec] = [("a", "dense", ["x", "wa"], {}), ("b", "dense", ["x", "wb"], {}),
                         ("bt", "transpose", ["b"], {"perm": [0, 2, 1]}), ("y", "matmul", ["a", "bt"], {})]
    qgraph = fixed_point_graph((3, 4), nodes, {"wa": rng.normal(size=(4, 3)), "wb": rng.normal(size=(4, 3))},
                               dtypes={"a": "int5", "b": "int5", "y": "int7"})
    assert_exact(qgraph)


@pytest.mark.parametrize(("op", "attrs"), [
    ("gather", {"axis": 2, "indices": [[3, 0], [1, -1]]}),
    ("tile", {"repeats": [1, 2, 1]}),
    ("expand", {"shape": [1, 2, 3, 4]}),
    ("resize", {"sizes": [1, 3, 9], "scales": [1, 1, 2.25], "coordinate_transformation_mode": "half_pixel"}),
])
def test_value_moves(op: str, attrs: dict[str, Any]) -> None:
    shape = (1, 3, 4) if op == "expand" else (3, 4)
    qgraph = fixed_point_graph(shape, [("y", op, ["x"], attrs)])
    assert_exact(qgraph)


@pytest.mark.parametrize("groups", [1, 2])
def test_transposed_conv_as_a_constant_linear_map(groups: int) -> None:
    rng = np.random.default_rng(13)
    attrs = {"strides": [2, 2], "pads": [1, 0, 1, 1], "groups": groups, "output_padding": [1, 0]}
    qgraph = fixed_point_graph((2, 3, 3), [("y", "conv_transpose", ["x", "w", "b"], attrs)],
                               {"w": rng.normal(0, 0.5, (2, 4 // groups, 3, 2)), "b": rng.normal(0, 0.2, 4)},
                               granularity="per_channel", dtypes={"y": "int6"})
    assert_exact(qgraph)


@pytest.mark.parametrize("mode", ["half_pixel", "align_corners"])
def test_linear_resize_as_a_constant_linear_map(mode: str) -> None:
    attrs = {"sizes": [1, 2, 5, 7], "scales": [1, 1, 5 / 3, 7 / 4], "mode": "linear",
             "coordinate_transformation_mode": mode}
    qgraph = fixed_point_graph((2, 3, 4), [("y", "resize", ["x"], attrs)])
    assert qgraph.layers[-1].op == "resize_linear"
    assert_exact(qgraph)


def test_concat_requantizes_each_part() -> None:
    rng = np.random.default_rng(7)
    nodes: list[Spec] = [("a", "dense", ["x", "wa"], {}), ("b", "dense", ["x", "wb"], {}),
                         ("y", "concat", ["a", "b"], {"axis": -1})]
    qgraph = fixed_point_graph((4,), nodes, {"wa": rng.normal(0, 4, (4, 3)), "wb": rng.normal(0, 0.2, (4, 2))},
                               dtypes={"b": "int4"})
    assert_exact(qgraph)


@pytest.mark.parametrize(("op", "attrs"), [
    ("max_pool", {"kernel": [2, 2]}),
    ("max_pool", {"kernel": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1], "ceil_mode": True}),
    ("reduce_max", {"axes": [2, 3], "keepdims": False}),
    ("avg_pool", {"kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("avg_pool", {"kernel": [3, 2], "pads": [1, 0, 0, 1], "count_include_pad": True, "ceil_mode": True}),
    ("global_avg_pool", {}),
    ("reduce_mean", {"axes": [1], "keepdims": True}),
    ("reduce_sum", {"axes": [3], "keepdims": False}),
])
def test_pooling_and_reductions(op: str, attrs: dict[str, Any]) -> None:
    """After a conv (a signed input with ties to round); averages over non-power-of-two counts included."""
    nodes: list[Spec] = [("c", "conv", ["x", "w", "b"], {}), ("y", op, ["c"], attrs)]
    qgraph = fixed_point_graph((2, 7, 6), nodes, conv_weights(3, 2, (1, 1), seed=8), dtypes={"y": "int7"})
    assert_exact(qgraph)


@pytest.mark.parametrize("op", ["sigmoid", "tanh", "gelu", "elu", "softplus", "erf"])
def test_table_activations(op: str) -> None:
    nodes: list[Spec] = [("h", "dense", ["x", "w"], {"activation": "relu"}), ("g", "dense", ["h", "v"], {}),
                         ("y", op, ["g"], {})]
    rng = np.random.default_rng(9)
    qgraph = fixed_point_graph((4,), nodes, {"w": rng.normal(size=(4, 6)), "v": rng.normal(size=(6, 3))},
                               dtypes={"g": "int6", "y": "int7"})
    assert [layer.op for layer in qgraph.layers][-1] == "lookup"
    assert_exact(qgraph)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad(mode: str) -> None:
    nodes: list[Spec] = [("c", "conv", ["x", "w", "b"], {}),
                         ("y", "pad", ["c"], {"pads": [0, 0, 1, 2, 0, 1, 2, 0], "mode": mode, "value": 0.5})]
    assert_exact(fixed_point_graph((2, 4, 4), nodes, conv_weights(2, 2, (1, 1), seed=10)))


def test_a_product_slower_than_a_pipeline_stage_is_refused_clearly() -> None:
    with pytest.raises(BuildError, match=r"layer 'm' \(mul\): da4ml cannot place the product.*latency_cutoff"):
        trace(products_and_tables(), HWConfig(1, -1, 2))


def test_softmax_is_refused_naming_the_layer_and_why() -> None:
    nodes: list[Spec] = [("g", "dense", ["x", "w"], {}), ("y", "softmax", ["g"], {"axis": -1})]
    qgraph = fixed_point_graph((4,), nodes, {"w": np.random.default_rng(11).normal(size=(4, 3))})
    with pytest.raises(BuildError, match=r"layer 'y' \(softmax\).*division by a variable"):
        trace(qgraph, HWConfig(1, -1, -1))


def small_cnn(activations: str | None = None) -> QGraph:
    """conv -> relu -> max_pool -> depthwise conv -> add (residual) -> global average pool -> flatten -> dense,
    every activation of dtype `activations` if given (the input too: it takes its first reader's)."""
    rng = np.random.default_rng(12)
    constants = {"w1": conv_weights(4, 1, (3, 3), seed=13)["w"], "b1": rng.normal(0, 0.1, 4),
                 "w2": conv_weights(4, 1, (3, 3), seed=14)["w"], "b2": rng.normal(0, 0.1, 4),
                 "wd": rng.normal(0, 0.5, (4, 3)), "bd": rng.normal(0, 0.1, 3)}
    nodes: list[Spec] = [
        ("c1", "conv", ["x", "w1", "b1"], {"pads": [1, 1, 1, 1]}),
        ("r1", "relu", ["c1"], {}),
        ("p1", "max_pool", ["r1"], {"kernel": [2, 2]}),
        ("c2", "conv", ["p1", "w2", "b2"], {"pads": [1, 1, 1, 1], "groups": 4}),
        ("s", "add", ["c2", "p1"], {}),
        ("g", "global_avg_pool", ["s"], {}),
        ("f", "flatten", ["g"], {}),
        ("y", "dense", ["f", "wd", "bd"], {}),
    ]
    dtypes = {"c2": "int6"} if activations is None else {name: activations for name, *_ in nodes}
    return fixed_point_graph((1, 6, 6), nodes, constants, granularity="per_channel", dtypes=dtypes)


def small_cnn_16x8() -> QGraph:
    """TFLite's 16x8 where fixed point expresses it: int16 activations, int8 weights, power-of-two scales."""
    return small_cnn("int16")


def conv_mean_16x8() -> QGraph:
    """A small 16x8 conv -> relu -> mean of 9 -> dense: the mean's 31 fractional bits, in little logic."""
    rng = np.random.default_rng(18)
    nodes: list[Spec] = [("c", "conv", ["x", "w", "b"], {"pads": [1, 1, 1, 1], "activation": "relu"}),
                         ("g", "global_avg_pool", ["c"], {}), ("f", "flatten", ["g"], {}),
                         ("y", "dense", ["f", "wd"], {})]
    return fixed_point_graph((1, 3, 3), nodes, {**conv_weights(2, 1, (3, 3), seed=19), "wd": rng.normal(size=(2, 2))},
                             dtypes={name: "int16" for name, *_ in nodes})


def test_small_cnn_is_exact() -> None:
    assert_exact(small_cnn(), samples=300)


def test_16x8_small_cnn_is_exact(tmp_path: Path) -> None:
    """int16 activations, int8 weights: the program equals the reference. Its mean of 9 int16 values has 31
    fractional bits, where da4ml's C++ interpreter miscomputes; the target then says so and takes da4ml's
    Python evaluation of the same program (the Verilog agrees with it: test_exported_rtl_is_exact)."""
    qgraph = small_cnn_16x8()
    assert {tensor.params.dtype for tensor in qgraph.tensors.values()} == {"int16"}
    assert all(np.abs(layer.weight).max() <= 127 for layer in qgraph.layers if hasattr(layer, "weight"))
    target = HdlTarget(HdlTarget.Options(simulate="never"))
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    target.export(qgraph, artifact)
    x_q = full_range_inputs(qgraph, 300)
    with notices.collect() as warned:
        actual = target.run(artifact, x_q, tmp_path)
    expected = run_integer(qgraph, x_q).reshape(actual.shape)
    assert np.array_equal(actual, expected) and np.abs(expected).max() > 127   # the 16-bit range in use
    dais = trace(qgraph, HWConfig(1, -1, -1)).predict(x_q.reshape(300, -1) * qgraph.input_params.scale, n_threads=1)
    if not np.array_equal(np.asarray(dais).reshape(actual.shape) / qgraph.output_params.scale, expected):
        assert any("DAIS interpreter miscomputes" in warning for warning in warned)


def test_every_layer_the_cnn_uses_has_a_converter_and_the_cost_model_prices_them() -> None:
    qgraph = small_cnn()
    assert all(layer.op in CONVERTERS for layer in qgraph.layers)
    model = Da4mlCost()
    total = model(qgraph)
    assert total > 0 and model.traced == len(qgraph.layers)
    assert model(qgraph) == total and model.traced == len(qgraph.layers)  # cached, the add's two inputs too
    full = float(trace(qgraph, HWConfig(1, -1, -1)).cost)
    assert 0.5 * full < total < 1.5 * full


def test_cost_of_a_conv_grows_with_its_channels() -> None:
    def priced(channels: int) -> float:
        graph = fixed_point_graph((2, 5, 5), [("y", "conv", ["x", "w", "b"], {"pads": [1, 1, 1, 1]})],
                                  conv_weights(channels, 2, (3, 3), seed=15))
        return Da4mlCost()(graph)
    assert 0 < priced(2) < priced(4)



def products_and_tables() -> QGraph:
    """A product of two activations, a table activation and a concat: the ops that are not adder graphs."""
    rng = np.random.default_rng(16)
    nodes: list[Spec] = [("a", "dense", ["x", "wa"], {}), ("b", "dense", ["x", "wb"], {}),
                         ("m", "mul", ["a", "b"], {}), ("t", "tanh", ["a"], {}), ("y", "concat", ["m", "t"], {"axis": 1})]
    return fixed_point_graph((4,), nodes, {"wa": rng.normal(size=(4, 3)), "wb": rng.normal(size=(4, 3))},
                             dtypes={"a": "int6", "t": "int5"})


@pytest.mark.skipif(simulator() is None, reason="needs verilator or iverilog")
@pytest.mark.parametrize(("build", "latency_cutoff"), [
    pytest.param(small_cnn, 4, marks=pytest.mark.slow),  # ~60 s, almost all of it verilator compiling ~29 k LUTs
    (products_and_tables, 12),  # tables: da4ml's memory files must end with a newline for verilator
    (conv_mean_16x8, 4),
])
def test_exported_rtl_is_exact(build: Callable[[], QGraph], latency_cutoff: float, tmp_path: Path) -> None:
    """Exported by the hdl target and checked as check:hdl checks: the DAIS program and the simulated Verilog."""
    qgraph = build()
    target = HdlTarget(HdlTarget.Options(latency_cutoff=latency_cutoff, simulate="always"))
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    target.export(qgraph, artifact)
    x = np.random.default_rng(17).normal(0, 2, (200, *qgraph.tensors[qgraph.input].shape)).astype(np.float32)
    report = check_stage(target, qgraph, artifact, x, None, tmp_path, tmp_path / "bundles", Progress.silent())
    assert report["ok"] and report["tolerance"] == "exact" and report["mismatches"] == 0
    assert simulator() in report["runtime"]
