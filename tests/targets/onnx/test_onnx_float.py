"""The float ONNX exporter: every op of the IR, run by dabuild's interpreter and by onnxruntime, agrees."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed")
ort = pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")

from dabuild.errors import BuildError  # noqa: E402
from dabuild.ir import Graph, Node, TensorSpec  # noqa: E402
from dabuild.ir.given_quant import FixedQuant, GivenQuant  # noqa: E402
from dabuild.ir.interpreter import run  # noqa: E402
from dabuild.ir.ops import OPS  # noqa: E402
from dabuild.targets.onnx_float import to_onnx  # noqa: E402

RNG = np.random.default_rng(3)


@dataclass
class Case:
    """One node reading graph input `x` (batch dynamic) and constants."""

    op: str
    x: tuple[int, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    constants: list[np.ndarray] = field(default_factory=list)
    outputs: int = 1
    extra_inputs: list[tuple[int, ...]] = field(default_factory=list)  # more dynamic inputs (concat, add)

    def graph(self) -> Graph:
        names = [f"c{i}" for i in range(len(self.constants))]
        extra = [f"x{i}" for i in range(len(self.extra_inputs))]
        inputs = [TensorSpec("x", (None, *self.x[1:]))]
        inputs += [TensorSpec(name, (None, *shape[1:])) for name, shape in zip(extra, self.extra_inputs)]
        outputs = [f"y{i}" for i in range(self.outputs)]
        node = Node("node", self.op, ["x", *extra, *names], outputs, self.attrs)
        return Graph(inputs, outputs, [node], dict(zip(names, self.constants)))

    def feeds(self) -> dict[str, np.ndarray]:
        feeds = {"x": normal(*self.x)}
        feeds.update({f"x{i}": normal(*shape) for i, shape in enumerate(self.extra_inputs)})
        return feeds


def normal(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def positive(*shape: int) -> np.ndarray:
    return RNG.uniform(0.5, 2.0, shape).astype(np.float32)


CASES: dict[str, Case] = {
    "identity": Case("identity", (2, 3)),
    "add": Case("add", (2, 3, 4), constants=[normal(4)]),
    "add_two_inputs": Case("add", (2, 3), extra_inputs=[(2, 3)]),
    "sub": Case("sub", (2, 3, 4), constants=[normal(3, 1)]),
    "mul": Case("mul", (2, 3), constants=[normal(1, 3)]),
    "div": Case("div", (2, 3), constants=[positive(3)]),
    "matmul": Case("matmul", (2, 3, 4), constants=[normal(4, 5)]),
    "dense": Case("dense", (4, 6), constants=[normal(6, 3), normal(3)]),
    "dense_fused_gelu": Case("dense", (4, 6), {"activation": "gelu", "activation_attrs": {"approximate": "tanh"}},
                             [normal(6, 3)]),
    "conv2d": Case("conv", (2, 3, 9, 8), {"strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [1, 2]},
                   [normal(4, 3, 3, 2), normal(4)]),
    "conv2d_groups_relu6": Case("conv", (2, 4, 6, 6), {"groups": 2, "pads": [1, 1, 1, 1], "activation": "relu6"},
                                [normal(6, 2, 3, 3)]),
    "conv2d_depthwise": Case("conv", (2, 4, 7, 7), {"groups": 4, "strides": [2, 2], "pads": [1, 1, 1, 1]},
                             [normal(8, 1, 3, 3), normal(8)]),
    "conv1d": Case("conv", (2, 3, 10), {"strides": [2], "pads": [2, 1], "dilations": [2],
                                        "activation": "leaky_relu", "activation_attrs": {"alpha": 0.2}},
                   [normal(5, 3, 3), normal(5)]),
    "relu": Case("relu", (2, 5)),
    "relu6": Case("relu6", (2, 5), constants=[]),
    "leaky_relu": Case("leaky_relu", (2, 5), {"alpha": 0.3}),
    "sigmoid": Case("sigmoid", (2, 5)),
    "tanh": Case("tanh", (2, 5)),
    "hard_sigmoid": Case("hard_sigmoid", (2, 5), {"alpha": 1 / 6, "beta": 0.5}),
    "hard_swish": Case("hard_swish", (2, 3, 5)),
    "gelu": Case("gelu", (2, 7)),
    "gelu_tanh": Case("gelu", (2, 7), {"approximate": "tanh"}),
    "softmax": Case("softmax", (2, 3, 4), {"axis": 1}),
    "max_pool": Case("max_pool", (2, 3, 7, 7), {"kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "max_pool_ceil_dilated": Case("max_pool", (2, 3, 8, 8),
                                  {"kernel": [2, 3], "strides": [2, 2], "dilations": [2, 1], "ceil_mode": True}),
    "max_pool1d": Case("max_pool", (2, 3, 9), {"kernel": [2]}),
    "avg_pool": Case("avg_pool", (2, 3, 7, 7), {"kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "avg_pool_include_pad_ceil": Case("avg_pool", (2, 3, 8, 8), {"kernel": [3, 3], "strides": [2, 2],
                                      "pads": [1, 1, 1, 1], "count_include_pad": True, "ceil_mode": True}),
    "global_avg_pool": Case("global_avg_pool", (2, 3, 5, 4)),
    # pads that reach the kernel (torch's old-opset ceil_mode emulation): an explicit Pad before the pool
    "max_pool_padded_past_kernel": Case("max_pool", (2, 3, 8, 8), {"kernel": [3, 2], "strides": [2, 2],
                                                                   "pads": [1, 1, 3, 2]}),
    "avg_pool_padded_past_kernel": Case("avg_pool", (2, 3, 8, 8), {"kernel": [3, 3], "strides": [2, 2],
                                                                   "pads": [1, 1, 3, 3]}),
    "avg_pool_include_pad_past_kernel": Case("avg_pool", (2, 3, 8, 7), {"kernel": [2, 3], "strides": [2, 2],
                                             "pads": [2, 0, 2, 3], "count_include_pad": True}),
    "batch_norm": Case("batch_norm", (2, 3, 4, 4), {"epsilon": 1e-3},
                       [normal(3), normal(3), normal(3), positive(3)]),
    "reshape": Case("reshape", (2, 3, 4), {"shape": [0, -1, 2]}),
    "flatten": Case("flatten", (2, 3, 4, 2), {"axis": 2}),
    "transpose": Case("transpose", (2, 3, 4), {"perm": [0, 2, 1]}),
    "concat": Case("concat", (2, 3), {"axis": 1}, [normal(2, 2)], extra_inputs=[(2, 4)]),
    "split": Case("split", (2, 6), {"axis": 1, "sizes": [1, 2, 3]}, outputs=3),
    "slice": Case("slice", (2, 5, 6), {"starts": [1, -1], "ends": [100, 0], "axes": [1, 2], "steps": [2, -2]}),
    "pad_constant": Case("pad", (2, 3, 4), {"pads": [0, 1, 2, 0, 0, 1], "value": 1.5}),
    "pad_reflect": Case("pad", (2, 3, 4), {"pads": [0, 1, 2, 0, 2, 1], "mode": "reflect"}),
    "pad_edge": Case("pad", (2, 3, 4), {"pads": [0, 0, 2, 0, 1, 1], "mode": "edge"}),
    "squeeze": Case("squeeze", (2, 1, 4, 1), {"axes": [1, -1]}),
    "unsqueeze": Case("unsqueeze", (2, 4), {"axes": [1, -1]}),
    "reduce_mean": Case("reduce_mean", (2, 3, 4), {"axes": [1, 2]}),
    "reduce_sum": Case("reduce_sum", (2, 3, 4), {"axes": [-1], "keepdims": False}),
    "reduce_max": Case("reduce_max", (2, 3, 4), {"axes": [1]}),
    "fake_quant": Case("fake_quant", (2, 5, 3), GivenQuant((0.1,), (3,), 5, True).attrs()),
    "fake_quant_half_away_narrow": Case("fake_quant", (2, 5), GivenQuant((0.25,), (0,), 4, False, narrow=True,
                                                                         rounding="half_away").attrs()),
    "fake_quant_to_zero": Case("fake_quant", (2, 5), GivenQuant((0.125,), (-2,), 6, True, rounding="to_zero").attrs()),
    "fake_quant_per_channel": Case("fake_quant", (2, 3, 4), GivenQuant((0.1, 0.02, 0.5), (0, 5, -3), 8, True,
                                                                      axis=1).attrs()),
    "fixed_quant_wrap": Case("fixed_quant", (2, 2, 3), FixedQuant.of(
        [[1, 0, 1], [1, 1, 0]], [[0, 1, 2], [-1, 0, 1]], [[3, 2, 1], [4, 0, 2]], "half_up", "wrap").attrs()),
    "fixed_quant_saturate_floor": Case("fixed_quant", (2, 5), FixedQuant.of(
        [1, 1, 0, 0, 1], [1, 0, 2, 1, 0], [2, 3, 1, 0, 5], "floor", "saturate_symmetric").attrs()),
    "clip": Case("clip", (2, 5), {"min": -0.5, "max": 0.25}),
    "clip_low_only": Case("clip", (2, 5), {"min": -0.5}),
    "elu": Case("elu", (2, 5), {"alpha": 0.5}),
    "selu": Case("selu", (2, 5)),
    "softplus": Case("softplus", (2, 5)),
    "softsign": Case("softsign", (2, 5)),
    "abs": Case("abs", (2, 5)),
    "neg": Case("neg", (2, 5)),
    "exp": Case("exp", (2, 5)),
    "log": Case("log", (2, 5)),
    "sqrt": Case("sqrt", (2, 5)),
    "reciprocal": Case("reciprocal", (2, 5)),
    "pow": Case("pow", (2, 5), {"exponent": 3.0}),
    "erf": Case("erf", (2, 5)),
    "log_softmax": Case("log_softmax", (2, 3, 4), {"axis": 1}),
    "max": Case("max", (2, 3), extra_inputs=[(2, 3)]),
    "min": Case("min", (2, 3, 4), constants=[normal(4)]),
    "prelu": Case("prelu", (2, 3, 4, 4), constants=[normal(3, 1, 1)]),
    "instance_norm": Case("instance_norm", (2, 3, 4, 5), {"epsilon": 1e-3}, [normal(3), normal(3)]),
    "layer_norm": Case("layer_norm", (2, 3, 8), {"axis": -1}, [normal(8), normal(8)]),
    "layer_norm_two_axes": Case("layer_norm", (2, 3, 4, 5), {"axis": 2}, [normal(4, 5)]),
    "group_norm": Case("group_norm", (2, 6, 3, 3), {"groups": 3}, [normal(6), normal(6)]),
    "lrn": Case("lrn", (2, 6, 3, 3), {"size": 3, "alpha": 0.1, "beta": 0.6, "bias": 2.0}),
    "conv_transpose": Case("conv_transpose", (2, 4, 5, 6), {"strides": [2, 3], "pads": [1, 0, 1, 1],
                                                           "groups": 2, "output_padding": [1, 2]},
                           [normal(4, 3, 3, 4), normal(6)]),
    "conv_transpose1d": Case("conv_transpose", (2, 3, 7), {"dilations": [2]}, [normal(3, 2, 3)]),
    "conv3d": Case("conv", (2, 2, 4, 5, 5), {"pads": [1, 0, 1, 1, 0, 1]}, [normal(3, 2, 3, 2, 3)]),
    "max_pool3d": Case("max_pool", (2, 2, 4, 5, 6), {"kernel": [2, 2, 3], "strides": [1, 2, 2]}),
    "resize_nearest": Case("resize", (2, 3, 4, 5), {"sizes": [2, 3, 8, 15], "scales": [1, 1, 2, 3],
                                                    "coordinate_transformation_mode": "asymmetric",
                                                    "nearest_mode": "floor"}),
    "resize_linear_half_pixel": Case("resize", (2, 3, 4, 5), {"sizes": [2, 3, 7, 11], "scales": [1, 1, 7 / 4, 11 / 5],
                                                              "mode": "linear"}),
    "resize_linear_align_corners": Case("resize", (2, 3, 6), {"sizes": [2, 3, 13], "scales": [1, 1, 13 / 6],
                                                              "mode": "linear",
                                                              "coordinate_transformation_mode": "align_corners"}),
    "gather": Case("gather", (2, 5, 3), {"axis": 1, "indices": [[0, 4], [-1, 2]]}),
    "gather_scalar": Case("gather", (2, 5, 3), {"axis": 1, "indices": -2}),  # drops the axis (attention's q, k, v)
    "tile": Case("tile", (2, 3, 2), {"repeats": [1, 2, 3]}),
    "expand": Case("expand", (2, 3, 1), {"shape": [1, 3, 4]}),
}


def run_onnxruntime(graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(to_onnx(graph).SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(list(graph.outputs), feeds)


def test_every_op_has_a_case() -> None:
    # where (condition first) and embedding (integer ids) have their own tests
    assert set(OPS) - {"where", "embedding"} <= {case.op for case in CASES.values()}


def test_embedding_of_int64_ids_agrees_with_onnxruntime() -> None:
    table = normal(7, 3, 2)
    graph = Graph([TensorSpec("ids", (None, 4), "int64")], ["y0"], [Node("node", "embedding", ["ids", "t"], ["y0"])],
                  {"t": table})
    ids = RNG.integers(0, 7, (2, 4))
    np.testing.assert_array_equal(run(graph, {"ids": ids})["y0"], run_onnxruntime(graph, {"ids": ids})[0])
    np.testing.assert_array_equal(run(graph, {"ids": ids})["y0"], table[ids])


def test_where_with_a_constant_condition_agrees_with_onnxruntime() -> None:
    condition = RNG.uniform(size=(3, 4)) > 0.5
    graph = Graph([TensorSpec("x", (None, 3, 4))], ["y0"], [Node("node", "where", ["c", "x", "other"], ["y0"], {})],
                  {"c": condition, "other": normal(4)})
    x = normal(2, 3, 4)
    np.testing.assert_allclose(run(graph, {"x": x})["y0"], run_onnxruntime(graph, {"x": x})[0], rtol=1e-6)
    np.testing.assert_array_equal(run(graph, {"x": x})["y0"], np.where(condition, x, graph.constants["other"]))


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_interpreter_agrees_with_onnxruntime(case: Case) -> None:
    graph, feeds = case.graph(), case.feeds()
    ours = run(graph, feeds)
    theirs = run_onnxruntime(graph, feeds)
    for name, expected in zip(graph.outputs, theirs):
        assert ours[name].dtype == np.float32
        np.testing.assert_allclose(ours[name], expected, rtol=1e-4, atol=1e-4, err_msg=name)


def test_batch_stays_dynamic() -> None:
    graph = CASES["conv2d"].graph()
    model = to_onnx(graph)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    for batch in (1, 5):
        x = normal(batch, 3, 9, 8)
        np.testing.assert_allclose(run(graph, {"x": x})["y0"], run_onnxruntime(graph, {"x": x})[0], atol=1e-4)


def test_op_without_onnx_spelling_is_named() -> None:
    from dabuild.targets import onnx_float

    graph = CASES["relu"].graph()
    with onnx_float.EXPORTERS.without("relu"), pytest.raises(BuildError, match=r"no ONNX spelling for node \(relu\)"):
        to_onnx(graph)


def test_ceil_mode_pool_padded_past_its_kernel_at_the_end_is_refused_by_name() -> None:
    graph = Case("max_pool", (1, 1, 8, 8), {"kernel": [2, 2], "strides": [2, 2], "pads": [0, 0, 2, 2],
                                            "ceil_mode": True}).graph()
    with pytest.raises(BuildError, match=r"node 'node' \(max_pool\) pads \[0, 0, 2, 2\] reach its kernel"):
        to_onnx(graph)
