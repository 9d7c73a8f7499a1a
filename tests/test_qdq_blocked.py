"""Blocked QDQ weights (DequantizeLinear opset 21 with block_size) as given quantization: a small MLP with
blocked int4 and int8 MatMul/Gemm weights, hand-built with onnx's helper. dabuild's integer reference agrees
with onnxruntime running the original file within one output step; the c target equals the reference bit for
bit, the onnx target (the weights written back as blocked DequantizeLinear) and the nnef target agree with it in
their runtimes; the hdl target builds it exactly where its scales are powers of two."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from dabuild.capability import discover_capabilities
from dabuild.errors import BuildError
from dabuild.ir.interpreter import run
from dabuild.ir.passes import optimize
from dabuild.progress import Progress
from dabuild.qir.qgraph import QGraph
from dabuild.qir.reference import run_integer, run_quantized
from dabuild.quant.calibrate import calibrate
from dabuild.quant.quantize import quantize
from dabuild.trace.onnx_frontend import OnnxTracer
from dabuild.tune.space import build_space

CAPABILITIES = discover_capabilities()
FEATURES, HIDDEN, SECOND, CLASSES = 40, 24, 16, 10
OUTPUT_SCALE = 2.0**-5


def _scales(rng: np.random.Generator, shape: tuple[int, ...], pot: bool, bits: int) -> np.ndarray:
    """Weight scales that keep each layer's gain per input step below one output step (int8 ones 32x finer),
    so one step of rounding difference upstream (ties) stays within one step downstream."""
    finer = 0 if bits == 4 else 5
    if pot:
        return (2.0 ** rng.integers(-7 - finer, -3 - finer, shape)).astype(np.float32)
    return (rng.uniform(0.004, 0.05, shape) / 2**finer).astype(np.float32)


def blocked_mlp(pot: bool = False, seed: int = 0) -> onnx.ModelProto:
    """x -> Q/DQ -> MatMul(int4 weight, blocks of 16 inputs, the last one shorter) + b -> Relu -> Q/DQ
    -> Gemm(transB, int8 weight blocked by 8 along its inputs) -> Q/DQ
    -> MatMul(int8 weight blocked by 5 along its outputs, scales changing from row to row) -> Q/DQ."""
    rng = np.random.default_rng(seed)
    w1 = rng.integers(-8, 8, (FEATURES, HIDDEN))
    w2 = rng.integers(-127, 128, (SECOND, HIDDEN))     # Gemm transB: (out, in)
    w3 = rng.integers(-127, 128, (SECOND, CLASSES))
    s1 = _scales(rng, (-(-FEATURES // 16), HIDDEN), pot, 4)
    s2 = _scales(rng, (SECOND, HIDDEN // 8), pot, 8)
    s3 = _scales(rng, (SECOND, CLASSES // 5), pot, 8)
    zero = 0 if pot else 5

    def tensor(name: str, dtype: int, values: np.ndarray) -> onnx.TensorProto:
        return helper.make_tensor(name, dtype, values.shape, np.ravel(values).tolist())

    initializers = [
        tensor("w1", TensorProto.INT4, w1), tensor("s1", TensorProto.FLOAT, s1),
        tensor("w2", TensorProto.INT8, w2), tensor("s2", TensorProto.FLOAT, s2),
        tensor("w3", TensorProto.INT8, w3), tensor("s3", TensorProto.FLOAT, s3),
        tensor("b1", TensorProto.FLOAT, rng.normal(0, 0.5, HIDDEN).astype(np.float32)),
        tensor("b2", TensorProto.FLOAT, rng.normal(0, 0.5, SECOND).astype(np.float32)),
        tensor("xs", TensorProto.FLOAT, np.float32(2.0 ** -5)), tensor("xz", TensorProto.INT8, np.int8(zero)),
        tensor("hs", TensorProto.FLOAT, np.float32(2.0 ** -3)), tensor("hz", TensorProto.INT8, np.int8(-128 if not pot else 0)),
        tensor("gs", TensorProto.FLOAT, np.float32(2.0 ** -4)), tensor("gz", TensorProto.INT8, np.int8(-zero)),
        tensor("ys", TensorProto.FLOAT, np.float32(OUTPUT_SCALE)), tensor("yz", TensorProto.INT8, np.int8(zero)),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w1", "s1"], ["w1d"], axis=0, block_size=16),
        helper.make_node("MatMul", ["xd", "w1d"], ["m1"]),
        helper.make_node("Add", ["m1", "b1"], ["a1"]),
        helper.make_node("Relu", ["a1"], ["r1"]),
        helper.make_node("QuantizeLinear", ["r1", "hs", "hz"], ["hq"]),
        helper.make_node("DequantizeLinear", ["hq", "hs", "hz"], ["hd"]),
        helper.make_node("DequantizeLinear", ["w2", "s2"], ["w2d"], axis=1, block_size=8),
        helper.make_node("Gemm", ["hd", "w2d", "b2"], ["g"], transB=1),
        helper.make_node("QuantizeLinear", ["g", "gs", "gz"], ["gq"]),
        helper.make_node("DequantizeLinear", ["gq", "gs", "gz"], ["gd"]),
        helper.make_node("DequantizeLinear", ["w3", "s3"], ["w3d"], axis=1, block_size=5),
        helper.make_node("MatMul", ["gd", "w3d"], ["y"]),
        helper.make_node("QuantizeLinear", ["y", "ys", "yz"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["out"]),
    ]
    graph = helper.make_graph(nodes, "blocked_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", FEATURES])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["n", CLASSES])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10  # opset 21's
    onnx.checker.check_model(model, full_check=True)
    return model


def inputs(samples: int = 300, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1.5, (samples, FEATURES)).astype(np.float32)


def steps(got: np.ndarray, expected: np.ndarray) -> int:
    return int(np.round(np.abs(got.astype(np.float64) - expected).max() / OUTPUT_SCALE))


def given_qgraph(path: Path, capability: str = "c") -> QGraph:
    graph = optimize(OnnxTracer(str(path)).trace())
    stats = calibrate(graph, [{"x": inputs()}], Progress.silent())
    return quantize(graph, stats, build_space(graph, CAPABILITIES[capability]).default())


@pytest.fixture
def mlp_file(tmp_path: Path) -> Path:
    path = tmp_path / "blocked.onnx"
    onnx.save(blocked_mlp(), path)
    return path


def test_blocked_weights_are_kept_and_the_reference_agrees_with_onnxruntime(mlp_file: Path) -> None:
    x = inputs()
    expected = ort.InferenceSession(str(mlp_file)).run(None, {"x": x})[0]
    graph = optimize(OnnxTracer(str(mlp_file)).trace())
    assert sorted((g.dtype, g.block_size) for g in graph.given.values()) == [("int4", 16), ("int8", 5), ("int8", 8)]
    assert steps(run(graph, {"x": x})[graph.outputs[0]], expected) == 0  # the float run dequantizes as onnxruntime
    qgraph = given_qgraph(mlp_file)
    blocked = [layer for layer in qgraph.layers if layer.op == "blocked_dense"]
    # blocks of 16 and 8 along the inputs; blocks along the outputs whose scales change by row: blocks of 1 input
    assert [(layer.block_size, layer.blocks) for layer in blocked] == [(16, 3), (8, 3), (1, SECOND)]
    assert steps(run_quantized(qgraph, x), expected) <= 1


def test_the_accumulator_is_the_exact_sum_of_the_rescaled_block_sums(mlp_file: Path) -> None:
    """The trace's int64 accumulator equals sum over blocks of P * m + bias, computed here in Python integers."""
    qgraph = given_qgraph(mlp_file)
    layer = next(layer for layer in qgraph.layers if layer.op == "blocked_dense")
    x_q = np.random.default_rng(3).integers(-128, 128, (20, FEATURES)).astype(np.int8)
    trace = run_integer(qgraph, x_q, keep_intermediates=True)
    centred = x_q.astype(object) - qgraph.input_params.zero_point
    weight = layer.weight.astype(object)
    expected = np.array([[int(layer.bias[o]) + sum(
        int(layer.block_multiplier[b, o]) * int(centred[r, b * 16:(b + 1) * 16] @ weight[b * 16:(b + 1) * 16, o])
        for b in range(layer.blocks)) for o in range(HIDDEN)] for r in range(20)])
    assert np.array_equal(trace[f"{layer.name}:accumulator"].astype(object), expected)
    assert layer.block_multiplier.max() < 2**30 and layer.shift.min() >= 1


def test_blocks_that_are_per_channel_scales_lower_to_the_ordinary_dense(tmp_path: Path) -> None:
    """Blocks along the outputs whose every row shares its scales, and one block over all inputs: per channel."""
    model = blocked_mlp()
    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    shared = np.tile(np.linspace(0.001, 0.002, CLASSES // 5, dtype=np.float32), (SECOND, 1))
    initializers["s3"].CopyFrom(helper.make_tensor("s3", TensorProto.FLOAT, shared.shape, shared.ravel().tolist()))
    one_block = np.linspace(0.01, 0.02, HIDDEN, dtype=np.float32).reshape(1, HIDDEN)
    initializers["s1"].CopyFrom(helper.make_tensor("s1", TensorProto.FLOAT, one_block.shape, one_block.ravel().tolist()))
    next(node for node in model.graph.node if node.output[0] == "w1d").attribute[1].i = FEATURES
    onnx.save(model, tmp_path / "per_channel.onnx")
    qgraph = given_qgraph(tmp_path / "per_channel.onnx")
    ops = [layer.op for layer in qgraph.layers if "dense" in layer.op]
    assert ops == ["dense", "blocked_dense", "dense"]
    assert [len(layer.weight_scale) for layer in qgraph.layers if layer.op == "dense"] == [HIDDEN, CLASSES]
    x = inputs()
    expected = ort.InferenceSession(str(tmp_path / "per_channel.onnx")).run(None, {"x": x})[0]
    assert steps(run_quantized(qgraph, x), expected) <= 1


def test_c_target_runs_the_blocks_bit_exactly(mlp_file: Path, tmp_path: Path) -> None:
    from dabuild.targets.c import CTarget

    qgraph = given_qgraph(mlp_file)
    target = CTarget(CTarget.Options(cflags=["-O2", "-std=c99", "-Wall", "-Wextra", "-Werror"]))
    artifact = tmp_path / "c"
    artifact.mkdir()
    target.export(qgraph, artifact)
    x_q = np.random.default_rng(5).integers(-128, 128, (300, FEATURES)).astype(np.int8)  # far past calibration
    actual = target.run(artifact, x_q, tmp_path)
    expected = run_integer(qgraph, x_q)
    assert np.array_equal(actual, expected) and len(np.unique(expected)) > 20


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
                    reason="needs gcc-arm-none-eabi, libnewlib-arm-none-eabi and qemu-system-arm")
@pytest.mark.parametrize("cpu", ["cortex-m0", "cortex-m4"])
def test_c_target_runs_the_blocks_bit_exactly_in_qemu(cpu: str, mlp_file: Path, tmp_path: Path) -> None:
    from test_c_mcu import run_in_qemu

    actual, expected, _, _ = run_in_qemu(given_qgraph(mlp_file), tmp_path, cpu)
    assert np.array_equal(actual, expected)


def test_onnx_target_writes_blocked_dequantize_linear_and_agrees_in_onnxruntime(mlp_file: Path, tmp_path: Path) -> None:
    from dabuild.targets.onnx.qdq import to_qdq_onnx

    qgraph = given_qgraph(mlp_file, "onnxruntime")
    model = to_qdq_onnx(qgraph)
    assert model.opset_import[0].version == 21
    blocked = [node for node in model.graph.node if any(a.name == "block_size" for a in node.attribute)]
    assert sorted(helper.get_attribute_value(node.attribute[1]) for node in blocked) == [1, 8, 16]
    packed = {tensor.data_type for tensor in model.graph.initializer if tensor.name.endswith("/weight")}
    assert TensorProto.INT4 in packed  # the int4 weight is stored as int4 again
    onnx.save(model, tmp_path / "artifact.onnx")
    x = inputs(seed=7)
    got = ort.InferenceSession(str(tmp_path / "artifact.onnx")).run(None, {"x": x})[0]
    assert steps(got, run_quantized(qgraph, x)) <= 1
    assert steps(got, ort.InferenceSession(str(mlp_file)).run(None, {"x": x})[0]) <= 1
    with pytest.raises(BuildError, match="layer .* \\(blocked_dense\\) has blocked weight scales, .* options.opset 21"):
        to_qdq_onnx(qgraph, opset=17)


def test_nnef_target_runs_the_blocks_in_tract(mlp_file: Path, tmp_path: Path) -> None:
    pytest.importorskip("tract")
    from dabuild.targets.nnef import NnefTarget

    qgraph = given_qgraph(mlp_file, "tract")
    target = NnefTarget(NnefTarget.Options())
    target.export(qgraph, tmp_path)
    x = inputs(seed=9)
    got = target.run(tmp_path, x, tmp_path)
    assert steps(got, run_quantized(qgraph, x)) <= 1


def test_hdl_target_builds_power_of_two_blocks_exactly_and_refuses_others(tmp_path: Path) -> None:
    """da4ml's logic equals the integer reference on full-range inputs (ties included: power-of-two scales make
    them common); scales that are not powers of two are refused naming the node and the nearest one."""
    pytest.importorskip("da4ml")
    from da4ml.trace import HWConfig

    from dabuild.targets.hdl.program import trace

    onnx.save(blocked_mlp(pot=True), tmp_path / "pot.onnx")
    qgraph = given_qgraph(tmp_path / "pot.onnx", "da4ml")
    assert [layer.op for layer in qgraph.layers if "dense" in layer.op] == ["blocked_dense"] * 3
    comb = trace(qgraph, HWConfig(1, -1, -1))
    x_q = np.random.default_rng(2).integers(-128, 128, (2000, FEATURES)).astype(np.int8)
    expected = run_integer(qgraph, x_q)
    real = x_q.astype(np.float64) * qgraph.input_params.scale
    actual = np.asarray(comb.predict(real, n_threads=1)).reshape(expected.shape) / qgraph.output_params.scale
    assert np.array_equal(actual, expected) and len(np.unique(expected)) > 10
    model = blocked_mlp(pot=True)
    scales = next(tensor for tensor in model.graph.initializer if tensor.name == "s1")
    scales.CopyFrom(helper.make_tensor("s1", TensorProto.FLOAT, scales.dims, [0.01] * len(scales.float_data)))
    onnx.save(model, tmp_path / "not_pot.onnx")
    graph = optimize(OnnxTracer(str(tmp_path / "not_pot.onnx")).trace())
    with pytest.raises(BuildError, match="node .* \\(dense\\), weight: parameter scale: 0.01 is not a power of "
                                         "two.* nearest representable: 2\\*\\*-7"):
        build_space(graph, CAPABILITIES["da4ml"])


def test_a_blocked_conv_weight_is_refused_naming_node_and_nearest(tmp_path: Path) -> None:
    weight = helper.make_tensor("w", TensorProto.INT8, [4, 8, 1, 1], [1] * 32)
    scale = helper.make_tensor("s", TensorProto.FLOAT, [4, 2, 1, 1], [0.01] * 4 + [0.02] * 4)
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "s"], ["wd"], axis=1, block_size=4),
             helper.make_node("Conv", ["xd", "wd"], ["y"]),
             helper.make_node("QuantizeLinear", ["y", "xs"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "xs"], ["out"])]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8, 3, 3])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["n", 4, 3, 3])],
                              [weight, scale, helper.make_tensor("xs", TensorProto.FLOAT, [], [0.05])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.save(model, tmp_path / "conv.onnx")
    traced = optimize(OnnxTracer(str(tmp_path / "conv.onnx")).trace())
    stats = calibrate(traced, [{"x": np.ones((2, 8, 3, 3), np.float32)}], Progress.silent())
    with pytest.raises(BuildError, match="node .* \\(conv\\): parameter block_size: .* nearest representable: one "
                                         "scale per output channel"):
        quantize(traced, stats, build_space(traced, CAPABILITIES["c"]).default())


RECIPE = """\
name: blocked-mlp
model:
  framework: onnx
  source: model.onnx
data:
  calibration: {source: data.npz, x: x_train}
  evaluation: {source: data.npz, x: x_test, y: y_test}
  metric: accuracy
tuning:
  strategy: given
targets:
  - name: mcu
    kind: c
    check_io: {tolerance: exact}
  - name: ort
    kind: onnx
  - name: tract
    kind: nnef
"""


@pytest.mark.slow
def test_blocked_mlp_builds_end_to_end_and_every_artifact_agrees_with_onnxruntime(tmp_path: Path, cache_dir) -> None:
    """strategy given, c/onnx/nnef checked by the build; then each artifact in its runtime against onnxruntime
    running the original file (labels: the original's own predictions)."""
    pytest.importorskip("tract")
    from imported_models import target_figures

    from dabuild.cli import main
    from dabuild.recipe import load_recipe

    folder = tmp_path / "blocked-mlp"
    folder.mkdir()
    onnx.save(blocked_mlp(), folder / "model.onnx")
    x_train, x_test = inputs(200, seed=11), inputs(200, seed=12)
    labels = ort.InferenceSession(str(folder / "model.onnx")).run(None, {"x": x_test})[0].argmax(axis=1)
    np.savez(folder / "data.npz", x_train=x_train, x_test=x_test, y_test=labels)
    (folder / "recipe.yaml").write_text(RECIPE)
    assert main(["build", str(folder), "--build-dir", str(tmp_path / "build"), "-q"]) == 0
    rows = target_figures(load_recipe(folder / "recipe.yaml"), tmp_path / "build" / "blocked-mlp",
                          folder / "model.onnx", "onnxruntime")
    assert {row.kind for row in rows} == {"c", "onnx", "nnef"}
    for row in rows:
        assert row.steps_vs_reference <= (0 if row.kind == "c" else 1)
        assert row.steps_vs_original <= 1 and row.accuracy >= 0.95


def matmul_nbits_mlp(symmetric: bool) -> onnx.ModelProto:
    """A float MLP 64 -> 32 -> 10 whose activations carry QDQ pairs, its MatMul weights then quantized to 4 bits
    by onnxruntime's MatMulNBitsQuantizer in QDQ format (blocks of 32 and 16 inputs; asymmetric: uint4 with
    a zero point per block)."""
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    rng = np.random.default_rng(4)

    def constant(name: str, values: np.ndarray) -> onnx.TensorProto:
        return onnx.numpy_helper.from_array(values, name)

    initializers = [constant("w1", rng.normal(0, 0.08, (64, 32)).astype(np.float32)),
                    constant("b1", rng.normal(0, 0.3, 32).astype(np.float32)),
                    constant("w2", rng.normal(0, 0.03, (32, 10)).astype(np.float32)),
                    constant("xs", np.float32(2.0 ** -5)), constant("xz", np.int8(0)),
                    constant("hs", np.float32(2.0 ** -4)), constant("hz", np.int8(-128)),
                    constant("ys", np.float32(OUTPUT_SCALE)), constant("yz", np.int8(0))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("MatMul", ["xd", "w1"], ["m1"]),
             helper.make_node("Add", ["m1", "b1"], ["a1"]),
             helper.make_node("Relu", ["a1"], ["r1"]),
             helper.make_node("QuantizeLinear", ["r1", "hs", "hz"], ["hq"]),
             helper.make_node("DequantizeLinear", ["hq", "hs", "hz"], ["hd"]),
             helper.make_node("MatMul", ["hd", "w2"], ["y"]),
             helper.make_node("QuantizeLinear", ["y", "ys", "yz"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["out"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["n", 10])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    quantizer = MatMulNBitsQuantizer(model, block_size=16, is_symmetric=symmetric, quant_format=QuantFormat.QDQ)
    quantizer.process()
    return quantizer.model.model


@pytest.mark.parametrize("symmetric", [True, False])
def test_onnxruntimes_matmul_nbits_qdq_output_runs_block_by_block(symmetric: bool, tmp_path: Path) -> None:
    from dabuild.targets.c import CTarget

    model = matmul_nbits_mlp(symmetric)
    blocked = [node for node in model.graph.node if node.op_type == "DequantizeLinear" and len(node.attribute) == 2]
    assert len(blocked) == 2 and (len(blocked[0].input) == 3) != symmetric  # asymmetric: zero points per block
    onnx.save(model, tmp_path / "nbits.onnx")
    x = np.random.default_rng(6).normal(0, 1.5, (300, 64)).astype(np.float32)
    expected = ort.InferenceSession(str(tmp_path / "nbits.onnx")).run(None, {"x": x})[0]
    graph = optimize(OnnxTracer(str(tmp_path / "nbits.onnx")).trace())
    assert {(given.dtype, given.block_size) for given in graph.given.values()} == {("int4" if symmetric else "uint4", 16)}
    stats = calibrate(graph, [{"x": x}], Progress.silent())
    qgraph = quantize(graph, stats, build_space(graph, CAPABILITIES["c"]).default())
    assert [layer.op for layer in qgraph.layers] == ["blocked_dense", "blocked_dense"]
    assert steps(run_quantized(qgraph, x), expected) <= 1
    target = CTarget(CTarget.Options())
    (tmp_path / "c").mkdir()
    target.export(qgraph, tmp_path / "c")
    x_q = np.random.default_rng(8).integers(-128, 128, (200, 64)).astype(np.int8)
    assert np.array_equal(target.run(tmp_path / "c", x_q, tmp_path), run_integer(qgraph, x_q))
