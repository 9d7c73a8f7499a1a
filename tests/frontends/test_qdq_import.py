"""QDQ and QOperator ONNX (onnxruntime's quantize_static, hand-built opset 10/13/21 files) as given quantization:
the traced graph's float run and dabuild's integer reference agree with onnxruntime on the original file within
one output step; what dabuild cannot represent is refused naming the node, the parameter and the nearest choice."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from dabuild.capability import discover_capabilities
from dabuild.errors import BuildError, UsageError
from dabuild.ir.interpreter import run
from dabuild.ir.passes import optimize
from dabuild.progress import Progress
from dabuild.qir.reference import run_quantized
from dabuild.quant.calibrate import calibrate
from dabuild.quant.quantize import quantize
from dabuild.targets.onnx.isa import detect, saturates
from dabuild.targets.onnx.saturation import run_original
from dabuild.trace.onnx_frontend import OnnxTracer
from dabuild.tune.space import build_space

REPO = Path(__file__).resolve().parents[2]
DIGITS = np.load(REPO / "recipes" / "digits-cnn" / "data.npz")
X = DIGITS["x_test"][:120].astype(np.float32)
CAPABILITIES = discover_capabilities()


class Batches(CalibrationDataReader):
    def __init__(self, x: np.ndarray, name: str = "x"):
        self.batches = iter([{name: x[i:i + 16]} for i in range(0, len(x), 16)])

    def get_next(self) -> dict | None:
        return next(self.batches, None)


VARIANTS = {
    "qdq-uint8": dict(quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8),
    "qdq-int8-per-channel": dict(quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8, per_channel=True),
    "qoperator-uint8": dict(quant_format=QuantFormat.QOperator, activation_type=QuantType.QUInt8),
    "qdq-int16-contrib": dict(quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt16,
                              extra_options={"UseQDQContribOps": True}),
    "qdq-int4-weights": dict(quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
                             weight_type=QuantType.QInt4, per_channel=True),
}


def quantized_digits_cnn(folder: Path, variant: str) -> Path:
    path = folder / f"{variant}.onnx"
    kwargs = {"weight_type": QuantType.QInt8, **VARIANTS[variant]}
    quantize_static(str(REPO / "recipes" / "digits-cnn" / "model.onnx"), str(path),
                    Batches(DIGITS["x_train"][:64].astype(np.float32)), **kwargs)
    return path


def output_steps(got: np.ndarray, expected: np.ndarray, scale: float) -> int:
    return int(np.round(np.abs(got.astype(np.float64) - expected).max() / scale))


def onnxruntime_outputs(path: Path, x: np.ndarray, step: float) -> np.ndarray:
    """onnxruntime's outputs for the file's arithmetic. Its default session is that, within a step, unless its u8s8
    kernels saturate here (x86-64 without VNNI): then the layers that can are named, and its exact x64
    precision mode's outputs are the ones dabuild is held to."""
    original = run_original(path, x)
    if output_steps(original.outputs, original.exact, step) > 1:
        assert saturates(original.isa) and original.saturated, "the default run departs only where u8s8 saturates"
        assert "can saturate on this CPU" in original.describe() and original.saturated[0] in original.describe()
        assert original.unchecked is None, original.describe()
    return original.exact


def given_qgraph(path: Path, capability: str = "onnxruntime"):
    graph = optimize(OnnxTracer(str(path)).trace())
    stats = calibrate(graph, [{"x": X}], Progress.silent())
    return graph, quantize(graph, stats, build_space(graph, CAPABILITIES[capability]).default())


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_quantize_static_models_agree_with_onnxruntime(variant, tmp_path):
    path = quantized_digits_cnn(tmp_path, variant)
    graph, qgraph = given_qgraph(path)
    assert graph.given, "the weights' quantization is kept"
    step = qgraph.output_params.scale
    expected = onnxruntime_outputs(path, X, step)
    convs_and_gemm = [node.name for node in onnx.load(str(path)).graph.node if node.op_type in
                      ("Conv", "Gemm", "QLinearConv", "QGemm", "QLinearMatMul", "MatMulInteger")]
    int8_weights = variant not in ("qdq-int4-weights", "qdq-int16-contrib")  # int4 pairs fit; int16 is unfused
    assert run_original(path, X).saturated == (convs_and_gemm if int8_weights and saturates(detect()) else [])
    assert output_steps(run(graph, {"x": X})[graph.outputs[0]], expected, step) <= 1
    assert output_steps(run_quantized(qgraph, X), expected, step) <= 1
    if variant == "qdq-int4-weights":
        assert {given.dtype for given in graph.given.values()} == {"int4"}
        assert {layer.weight.dtype.name for layer in qgraph.layers if hasattr(layer, "weight")} == {"int8"}
    if variant == "qdq-uint8":  # onnxruntime's uint8 activations run on the C target's int8 kernels, shifted
        _, on_c = given_qgraph(path, "c")
        assert on_c.input_params.dtype == "int8"
        assert np.array_equal(run_quantized(on_c, X), run_quantized(qgraph, X))


def qdq_matmul_model(opset: int, dtype: int, weight: np.ndarray, weight_scale: np.ndarray, axis: int | None) -> onnx.ModelProto:
    """x -> Q -> DQ -> MatMul(DQ(integer weight)) -> Q -> DQ, hand-built at `opset`."""
    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    zero = np.zeros((), np_type)
    initializers = [
        helper.make_tensor("w", dtype, weight.shape, weight.ravel().tolist()),
        helper.make_tensor("ws", TensorProto.FLOAT, weight_scale.shape, weight_scale.ravel().tolist()),
        helper.make_tensor("wz", dtype, weight_scale.shape, np.zeros(weight_scale.shape, np_type).ravel().tolist()),
        helper.make_tensor("s", TensorProto.FLOAT, [], [0.02]),
        helper.make_tensor("z", dtype, [], [int(zero)]),
        helper.make_tensor("s2", TensorProto.FLOAT, [], [0.1]),
    ]
    dq_w = {"axis": axis} if axis is not None else {}
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], **dq_w),
        helper.make_node("MatMul", ["xd", "wd"], ["y"]),
        helper.make_node("QuantizeLinear", ["y", "s2", "z"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "s2", "z"], ["out"]),
    ]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["n", 10])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=7 if opset < 21 else 10)


@pytest.mark.parametrize("opset, dtype, per_axis", [
    (10, TensorProto.INT8, False), (13, TensorProto.INT8, True), (13, TensorProto.UINT8, False),
    (21, TensorProto.INT4, True), (21, TensorProto.INT16, False),
])
def test_hand_built_qdq_across_opsets_and_types(opset, dtype, per_axis, tmp_path):
    rng = np.random.default_rng(opset)
    kind = np.dtype(helper.tensor_dtype_to_np_dtype(dtype))
    high = 7 if kind.name == "int4" else 127
    low = 0 if kind.name.startswith("u") else -high
    weight = rng.integers(low, high + 1, (64, 10))
    scale = rng.uniform(0.001, 0.01, 10).astype(np.float32) if per_axis else np.array(0.004, np.float32)
    path = tmp_path / "model.onnx"
    onnx.save(qdq_matmul_model(opset, dtype, weight, scale, 1 if per_axis else None), path)
    x = rng.uniform(0, 2, (100, 64)).astype(np.float32)
    expected = onnxruntime_outputs(path, x, 0.1)
    graph = optimize(OnnxTracer(str(path)).trace())
    [given] = graph.given.values()
    assert given.bits == int(kind.name.lstrip("uint")) and given.per_channel == per_axis
    stats = calibrate(graph, [{"x": x}], Progress.silent())
    qgraph = quantize(graph, stats, build_space(graph, CAPABILITIES["onnxruntime"]).default())
    assert qgraph.input_params.scale == pytest.approx(0.02) and qgraph.output_params.scale == pytest.approx(0.1)
    assert output_steps(run_quantized(qgraph, x), expected, 0.1) <= 1


def test_float8_and_blocked_activations_are_refused_naming_node_parameter_and_nearest(tmp_path):
    model = qdq_matmul_model(21, TensorProto.INT8, np.ones((64, 10), np.int64), np.array(0.01, np.float32), None)
    model.graph.initializer.append(helper.make_tensor("sb", TensorProto.FLOAT, [1, 2], [0.02, 0.03]))
    model.graph.initializer.append(helper.make_tensor("zb", TensorProto.INT8, [1, 2], [0, 0]))
    model.graph.node[0].CopyFrom(helper.make_node("QuantizeLinear", ["x", "sb", "zb"], ["xq"], axis=1, block_size=32))
    onnx.save(model, tmp_path / "blocked.onnx")
    with pytest.raises(UsageError, match="QuantizeLinear.*parameter block_size: the activation it quantizes is "
                                         "blocked .* nearest representable: one scale for the tensor"):
        OnnxTracer(str(tmp_path / "blocked.onnx")).trace()
    model = qdq_matmul_model(21, TensorProto.INT8, np.ones((64, 10), np.int64), np.array(0.01, np.float32), None)
    model.graph.initializer[4].CopyFrom(helper.make_tensor("z", TensorProto.FLOAT8E4M3FN, [], [0.0]))
    onnx.save(model, tmp_path / "float8.onnx")
    with pytest.raises(UsageError, match="node .*QuantizeLinear.*float8_e4m3fn is no integer type .* nearest "
                                         "representable: int8"):
        OnnxTracer(str(tmp_path / "float8.onnx")).trace()


def test_a_qdq_pair_that_quantizes_twice_is_reported(tmp_path):
    model = qdq_matmul_model(13, TensorProto.INT8, np.ones((64, 10), np.int64), np.array(0.01, np.float32), None)
    nodes = list(model.graph.node)
    model.graph.initializer.append(helper.make_tensor("s3", TensorProto.FLOAT, [], [0.03]))
    nodes[1:1] = [helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd0"]),
                  helper.make_node("QuantizeLinear", ["xd0", "s3", "z"], ["xq2"])]
    nodes[3] = helper.make_node("DequantizeLinear", ["xq2", "s3", "z"], ["xd"])
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, tmp_path / "twice.onnx")
    with pytest.raises(BuildError, match="quantizes tensor .* a second time"):
        optimize(OnnxTracer(str(tmp_path / "twice.onnx")).trace())


@pytest.mark.slow
def test_digits_cnn_qdq_recipe_every_artifact_agrees_with_onnxruntime_on_the_original(tmp_path, cache_dir):
    pytest.importorskip("tract")  # the recipe's nnef target runs in tract
    from imported_models import target_figures
    from support import copy_recipes

    from dabuild.cli import main
    from dabuild.recipe import load_recipe

    recipe = copy_recipes(tmp_path, "digits-cnn", "digits-cnn-qdq") / "digits-cnn-qdq"
    assert main(["build", str(recipe), "--build-dir", str(tmp_path / "build"), "-q"]) == 0
    build = tmp_path / "build" / "digits-cnn-qdq"
    rows = target_figures(load_recipe(recipe / "recipe.yaml"), build, recipe / "model.onnx", "onnxruntime")
    assert {row.kind for row in rows} == {"c", "onnx", "nnef"}
    for row in rows:
        assert row.steps_vs_reference <= (0 if row.kind == "c" else 1)  # what each check proved: exact / approximate
        assert row.steps_vs_original <= 1 and abs(row.accuracy - row.original_accuracy) <= 0.005


def test_layers_the_file_leaves_in_float_are_calibrated_and_tunable(tmp_path):
    """onnxruntime told to leave the Gemm in float: only that node offers choices; strategy given quantizes it
    with the capability's default, calibrated, and the rest exactly as the file says."""
    path = tmp_path / "partly.onnx"
    source = str(REPO / "recipes" / "digits-cnn" / "model.onnx")
    gemm = next(node.name for node in onnx.load(source).graph.node if node.op_type == "Gemm")
    quantize_static(source, str(path), Batches(DIGITS["x_train"][:64].astype(np.float32)),
                    quant_format=QuantFormat.QDQ, nodes_to_exclude=[gemm])
    graph = optimize(OnnxTracer(str(path)).trace())
    space = build_space(graph, CAPABILITIES["onnxruntime"])
    choices = {node.op: len(node.candidates) for node in space.nodes.values()}
    assert choices["dense"] > 1 and choices["conv"] == 1
    stats = calibrate(graph, [{"x": X}], Progress.silent())
    qgraph = quantize(graph, stats, space.default())
    expected = ort.InferenceSession(str(path)).run(None, {"x": X})[0]
    assert np.mean(run_quantized(qgraph, X).argmax(1) == expected.argmax(1)) >= 0.97
    dense = next(config for name, config in space.default().nodes.items() if space.nodes[name].op == "dense")
    assert dense.weight.algorithm != "given" and dense.activation.algorithm != "given"  # calibrated, tunable


def every_op_model() -> onnx.ModelProto:
    """A small float CNN whose quantization uses every QOperator op onnxruntime's quantizer makes here: QLinearConv,
    QLinearAdd, QLinearSigmoid, QLinearLeakyRelu, QLinearMul, QLinearConcat, QLinearAveragePool,
    QLinearGlobalAveragePool, QGemm."""
    rng = np.random.default_rng(0)

    def weight(name: str, *shape: int) -> onnx.TensorProto:
        return onnx.numpy_helper.from_array((rng.normal(size=shape) * 0.3).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "r1"], ["a"]),
             helper.make_node("Sigmoid", ["a"], ["s"]),
             helper.make_node("LeakyRelu", ["c2"], ["l"], alpha=0.1),
             helper.make_node("Mul", ["s", "l"], ["m"]),
             helper.make_node("Concat", ["m", "r1"], ["cat"], axis=1),
             helper.make_node("AveragePool", ["cat"], ["ap"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["ap"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "wd", "bd"], ["y"], transB=1)]
    weights = [weight("w1", 4, 1, 3, 3), weight("b1", 4), weight("w2", 4, 4, 3, 3), weight("b2", 4),
               weight("wd", 10, 8), weight("bd", 10)]
    graph = helper.make_graph(nodes, "every_op", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 10])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)


@pytest.mark.parametrize("quant_format", [QuantFormat.QOperator, QuantFormat.QDQ])
def test_onnxruntimes_quantized_ops_agree_with_onnxruntime(quant_format, tmp_path):
    onnx.save(every_op_model(), tmp_path / "float.onnx")
    path = tmp_path / "quantized.onnx"
    quantize_static(str(tmp_path / "float.onnx"), str(path), Batches(DIGITS["x_train"][:64].astype(np.float32)),
                    quant_format=quant_format)
    kinds = {node.op_type for node in onnx.load(path).graph.node}
    if quant_format == QuantFormat.QOperator:
        assert {"QLinearConv", "QLinearAdd", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearMul", "QLinearConcat",
                "QLinearAveragePool", "QLinearGlobalAveragePool", "QGemm"} <= kinds
    graph, qgraph = given_qgraph(path)
    expected = onnxruntime_outputs(path, X, qgraph.output_params.scale)
    assert output_steps(run(graph, {"x": X})[graph.outputs[0]], expected, qgraph.output_params.scale) <= 1
    assert output_steps(run_quantized(qgraph, X), expected, qgraph.output_params.scale) <= 1


def test_the_saturation_condition_is_a_pair_of_products_leaving_int16():
    """Two weights of one output channel times 255 (a uint8 activation's top): 64 + 64 fits int16, 64 + 65 does
    not; so does -64 - 65; uint8 weights (u8u8) and depthwise convs never saturate."""
    from dabuild.targets.onnx.saturation import saturating_nodes

    def matmul(weight: np.ndarray, dtype: int = TensorProto.INT8) -> onnx.ModelProto:
        return qdq_matmul_model(13, dtype, weight, np.array(0.01, np.float32), None)

    fits = np.full((64, 10), 64)
    fits[::2] = -64
    assert saturating_nodes(matmul(fits)) == []
    for row, value in ((1, 65), (2, -65)):
        over = fits.copy()
        over[row, 3] = value  # column 3 (one output channel) now holds a pair beyond +-128
        assert saturating_nodes(matmul(over)) == ["MatMul#3"]
    assert saturating_nodes(matmul(np.full((64, 10), 200), TensorProto.UINT8)) == []

    def conv(channels_per_group: int, groups: int) -> onnx.ModelProto:
        weight = np.full((4, channels_per_group, 3, 3), 127, np.int8)
        nodes = [helper.make_node("QuantizeLinear", ["x", "s"], ["xq"]),
                 helper.make_node("DequantizeLinear", ["xq", "s"], ["xd"]),
                 helper.make_node("DequantizeLinear", ["w", "s"], ["wd"]),
                 helper.make_node("Conv", ["xd", "wd"], ["y"], name="conv", group=groups)]
        graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])],
                                  [onnx.numpy_helper.from_array(weight, "w"),
                                   onnx.numpy_helper.from_array(np.array(0.1, np.float32), "s")])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)

    assert saturating_nodes(conv(4, 1)) == ["conv"] and saturating_nodes(conv(1, 4)) == []  # depthwise: exact
