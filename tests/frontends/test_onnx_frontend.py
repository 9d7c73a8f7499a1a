"""The ONNX frontend on models built here with onnx.helper, checked against onnxruntime, and its errors."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from dabuild.cli import main  # noqa: E402
from dabuild.errors import UsageError  # noqa: E402
from dabuild.ir import Graph  # noqa: E402
from dabuild.ir.interpreter import run  # noqa: E402
from dabuild.ir.passes import optimize  # noqa: E402
from dabuild.progress import Progress  # noqa: E402
from dabuild.trace import trace_model  # noqa: E402

NEWEST = onnx.defs.onnx_opset_version()
ORT_NEWEST = 21  # opsets above this are compared with onnx's reference evaluator instead
OPSETS = (9, 13, 17, NEWEST)


class Net:
    """A tiny ONNX graph builder that spells opset-dependent ops the way the chosen opset wants."""

    def __init__(self, opset: int, seed: int = 0):
        self.opset = opset
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self.rng = np.random.default_rng(seed)

    def _name(self, base: str) -> str:
        return f"{base}{len(self.nodes) + len(self.initializers)}"

    def const(self, value: Any, dtype: Any = np.float32) -> str:
        name = self._name("c")
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def weight(self, *shape: int, scale: float = 0.3) -> str:
        return self.const(self.rng.normal(scale=scale, size=shape))

    def op(self, op_type: str, *inputs: str, outputs: int = 1, **attrs: Any) -> Any:
        names = [self._name(op_type.lower()) + (f"_{i}" if outputs > 1 else "") for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=names[0], **attrs))
        return names if outputs > 1 else names[0]

    def ints(self, op_type: str, x: str, name: str, values: list[int], since: int, *rest: str, **attrs: Any) -> str:
        """An op whose int list `name` was an attribute before opset `since` and an input after."""
        if self.opset >= since:
            return self.op(op_type, x, *rest, self.const(values, np.int64), **attrs)
        return self.op(op_type, x, *rest, **{name: values}, **attrs)

    def conv_bn_relu(self, x: str, c_in: int, c_out: int, kernel: int = 3, group: int = 1, **attrs: Any) -> str:
        y = self.op("Conv", x, self.weight(c_out, c_in // group, kernel, kernel), self.weight(c_out), group=group, **attrs)
        scale, bias = self.const(self.rng.uniform(0.5, 1.5, c_out)), self.weight(c_out)
        mean, var = self.weight(c_out), self.const(self.rng.uniform(0.5, 2.0, c_out))
        return self.op("Relu", self.op("BatchNormalization", y, scale, bias, mean, var, epsilon=1e-3))

    def model(self, inputs: dict[str, list[Any]], output: str, output_dims: list[Any] | None = None) -> Any:
        graph = helper.make_graph(
            self.nodes,
            "test",
            [helper.make_tensor_value_info(name, TensorProto.FLOAT, dims) for name, dims in inputs.items()],
            [helper.make_tensor_value_info(output, TensorProto.FLOAT, output_dims)],
            self.initializers,
        )
        opsets = [helper.make_operatorsetid("", self.opset)]
        ir_version = max(helper.find_min_ir_version_for(opsets), 8)  # 8: outputs may leave their shape open
        model = onnx.shape_inference.infer_shapes(
            helper.make_model(graph, opset_imports=opsets, ir_version=ir_version), strict_mode=True
        )  # also types the output, which the checker wants
        onnx.checker.check_model(model)
        return model


def expected(model: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    opset = model.opset_import[0].version
    if opset <= ORT_NEWEST:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return session.run(None, feeds)
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model).run(None, feeds)


def assert_matches(model: Any, *batches: dict[str, np.ndarray], tmp_path: Path | None = None) -> Graph:
    """Trace (from a file when `tmp_path` is given), optimise, and compare every batch within 1e-4."""
    source: Any = model
    if tmp_path is not None:
        source = tmp_path / "model.onnx"
        onnx.save(model, source)
    graph = optimize(trace_model(source))
    for feeds in batches:
        (want,) = expected(model, feeds)
        got = run(graph, feeds)[graph.outputs[0]]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    return graph


def images(rng: np.random.Generator, *shape: int) -> dict[str, np.ndarray]:
    return {"x": rng.normal(size=shape).astype(np.float32)}


# ---------------------------------------------------------------- models vs onnxruntime


@pytest.mark.parametrize("opset", OPSETS)
def test_mlp_of_gemms(opset: int, tmp_path: Path) -> None:
    net = Net(opset)
    h = net.op("Relu", net.op("Gemm", "x", net.weight(32, 20), net.weight(32), transB=1))
    h = net.op("Gemm", h, net.weight(32, 16), net.weight(1, 16), alpha=0.5, beta=2.0)
    y = net.op("Gemm", net.op("Sigmoid", h), net.weight(10, 16), net.weight(10), transB=1)
    rng = np.random.default_rng(1)
    graph = assert_matches(net.model({"x": ["batch", 20]}, y), images(rng, 1, 20), images(rng, 7, 20), tmp_path=tmp_path)
    assert graph.inputs[0].shape == (None, 20)
    assert [node.op for node in graph.nodes].count("dense") == 3


@pytest.mark.parametrize("opset", OPSETS)
def test_small_cnn(opset: int) -> None:
    net = Net(opset)
    h = net.conv_bn_relu("x", 3, 8, pads=[1, 1, 1, 1])
    h = net.op("MaxPool", h, kernel_shape=[2, 2], strides=[2, 2])
    h = net.conv_bn_relu(h, 8, 16, strides=[2, 2], auto_pad="SAME_UPPER")
    h = net.op("Flatten", net.op("GlobalAveragePool", h))
    y = net.op("Gemm", h, net.weight(10, 16), net.weight(10), transB=1)
    rng = np.random.default_rng(2)
    graph = assert_matches(net.model({"x": ["N", 3, 15, 15]}, y), images(rng, 2, 3, 15, 15), images(rng, 5, 3, 15, 15))
    assert "batch_norm" not in [node.op for node in graph.nodes]  # folded into the convs


def test_residual_block_and_depthwise_conv() -> None:
    net = Net(17)
    stem = net.conv_bn_relu("x", 4, 8, pads=[1, 1, 1, 1])
    depthwise = net.conv_bn_relu(stem, 8, 8, group=8, pads=[1, 1, 1, 1])
    pointwise = net.op("Conv", depthwise, net.weight(8, 8, 1, 1))
    y = net.op("Relu", net.op("Add", pointwise, stem))
    rng = np.random.default_rng(3)
    graph = assert_matches(net.model({"x": ["N", 4, 9, 9]}, y), images(rng, 3, 4, 9, 9))
    assert any(node.op == "conv" and node.attrs["groups"] == 8 for node in graph.nodes)


def test_shape_subgraph_keeps_the_batch_dynamic() -> None:
    """x.view(x.size(0), -1) as exporters write it: Shape -> Gather -> Unsqueeze -> Concat -> Reshape."""
    net = Net(13)
    h = net.op("Relu", "x")
    batch = net.op("Gather", net.op("Shape", h), net.const(0, np.int64), axis=0)
    target = net.op("Concat", net.ints("Unsqueeze", batch, "axes", [0], 13), net.const([-1], np.int64), axis=0)
    y = net.op("MatMul", net.op("Reshape", h, target), net.weight(24, 5))
    rng = np.random.default_rng(4)
    graph = assert_matches(net.model({"x": ["N", 2, 3, 4]}, y, ["N", 5]), images(rng, 1, 2, 3, 4), images(rng, 6, 2, 3, 4))
    reshape = next(node for node in graph.nodes if node.op == "reshape")
    assert reshape.attrs["shape"] == [0, -1]


def test_constant_of_shape_and_constants_fold_to_constants() -> None:
    net = Net(17)
    ones = net.op("ConstantOfShape", net.op("Constant", value=numpy_helper.from_array(np.array([1, 6], np.int64))),
                  value=numpy_helper.from_array(np.array([0.5], np.float32)))
    y = net.op("Add", "x", ones)
    graph = assert_matches(net.model({"x": ["N", 6]}, y), images(np.random.default_rng(5), 4, 6))
    assert [node.op for node in graph.nodes] == ["add"]


@pytest.mark.parametrize("opset", OPSETS)
def test_ops_whose_spelling_changed_between_opsets(opset: int) -> None:
    """Softmax (2-D coercion before 13), Clip, Pad, Slice, Split, Squeeze/Unsqueeze, ReduceMean across opsets."""
    net = Net(opset)
    h = net.op("Softmax", "x", axis=1)  # before 13: over all of C*H*W; from 13: over C only
    if opset >= 11:
        h = net.op("Clip", h, net.const(0.01), net.const(0.2))
    else:
        h = net.op("Clip", h, min=0.01, max=0.2)
    if opset >= 11:
        h = net.op("Pad", h, net.const([0, 0, 1, 2, 0, 0, 1, 0], np.int64), net.const(0.25), mode="constant")
    else:
        h = net.op("Pad", h, pads=[0, 0, 1, 2, 0, 0, 1, 0], value=0.25)
    if opset >= 10:
        h = net.op("Slice", h, *(net.const(v, np.int64) for v in ([1, -5], [100, -1], [2, 3], [1, 2])))
    else:
        h = net.op("Slice", h, starts=[1, 1], ends=[100, 5], axes=[2, 3])
    if opset >= 13:
        left, right = net.op("Split", h, net.const([2, 1], np.int64), axis=1, outputs=2)
    else:
        left, right = net.op("Split", h, axis=1, split=[2, 1], outputs=2)
    mean = net.ints("ReduceMean", left, "axes", [1], 18, keepdims=0)
    squeezed = net.ints("Squeeze", net.ints("Unsqueeze", mean, "axes", [1], 13), "axes", [1], 13)
    y = net.op("Concat", net.ints("Unsqueeze", squeezed, "axes", [1], 13), right, axis=1)
    y = net.op("Transpose", y, perm=[0, 2, 3, 1])
    rng = np.random.default_rng(6)
    assert_matches(net.model({"x": ["N", 3, 4, 6]}, y), images(rng, 2, 3, 4, 6))


def test_activations_pooling_and_arithmetic() -> None:
    net = Net(NEWEST)
    h = net.op("LeakyRelu", "x", alpha=0.2)
    h = net.op("Add", net.op("HardSigmoid", h, alpha=0.3, beta=0.4), net.op("HardSwish", h))
    h = net.op("Sub", net.op("Gelu", h, approximate="tanh"), net.op("Tanh", h))
    h = net.op("Div", h, net.const(np.full((1, 1, 1, 7), 1.5)))
    h = net.op("AveragePool", h, kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2], count_include_pad=1)
    h = net.op("MaxPool", net.op("Identity", h), kernel_shape=[2, 2], ceil_mode=1, strides=[2, 2])
    h = net.op("Dropout", net.op("Mul", h, net.const(3.0)))
    h = net.op("Gelu", net.op("ReduceSum", h, net.const([2, 3], np.int64), keepdims=1))
    y = net.op("ReduceMax", net.op("Softmax", net.op("Flatten", h), axis=-1), net.const([1], np.int64), keepdims=1)
    assert_matches(net.model({"x": ["N", 2, 6, 7]}, y), images(np.random.default_rng(7), 3, 2, 6, 7))


def test_recipe_inputs_fill_dynamic_sizes() -> None:
    net = Net(17)
    model = net.model({"x": ["N", 3, "H", "W"]}, net.op("GlobalAveragePool", "x"))
    graph = trace_model(model, inputs={"x": (8, 3, 5, 4)})
    assert graph.inputs[0].shape == (None, 3, 5, 4)  # the leading axis stays the dynamic batch


# ---------------------------------------------------------------- errors


def cnn_model() -> Any:
    net = Net(17)
    return net.model({"x": ["N", 3, 8, 8]}, net.op("Relu", net.conv_bn_relu("x", 3, 4)))


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(lambda: np.random.default_rng(0).bytes(3000), id="corrupt"),
        pytest.param(lambda: cnn_model().SerializeToString()[:700], id="truncated"),
        pytest.param(lambda: b"name: digits\nmodel: {source: model.py:build}\n", id="text"),
        pytest.param(lambda: b"", id="empty"),
    ],
)
def test_unreadable_files_name_the_file(content: Any, tmp_path: Path) -> None:
    path = tmp_path / "broken.onnx"
    path.write_bytes(content())
    with pytest.raises(UsageError) as error:
        trace_model(path)
    assert str(path) in str(error.value)
    assert "ONNX" in str(error.value)


def test_unsupported_ops_are_listed_at_once_with_node_names() -> None:
    net = Net(17)
    h = net.op("Round", "x")  # named round0
    h = net.op("Relu", h)  # supported, but fed by an unsupported node: not listed
    h = net.op("Hardmax", h)  # named hardmax...
    model = net.model({"x": ["N", 3, 4, 4]}, net.op("Sigmoid", h))
    with pytest.raises(UsageError) as error:
        trace_model(model)
    message = str(error.value)
    assert "2 node(s) cannot be converted" in message
    assert "'round0' (Round)" in message and f"'{net.nodes[2].name}' (Hardmax)" in message
    assert "Relu" not in message.split("supported ops")[0]


def test_input_shape_contradicting_the_recipe_names_the_input() -> None:
    net = Net(17)
    model = net.model({"pixels": ["N", 64]}, net.op("Relu", "pixels"))
    with pytest.raises(UsageError, match=r"input 'pixels' has shape \[N, 64\] in the model, but model.inputs gives \[1, 32\]"):
        trace_model(model, inputs={"pixels": (1, 32)})
    with pytest.raises(UsageError, match="model.inputs names 'x', which the model does not take"):
        trace_model(model, inputs={"x": (1, 64)})


def flatten_by_shape(net: Net, x: str) -> str:
    """x.view(x.size(0), -1) as exporters write it at this opset: Shape -> Gather -> Unsqueeze -> Concat -> Reshape."""
    batch = net.op("Gather", net.op("Shape", x), net.const(0, np.int64), axis=0)
    target = net.op("Concat", net.ints("Unsqueeze", batch, "axes", [0], 13), net.const([-1], np.int64), axis=0)
    return net.op("Reshape", x, target)


@pytest.mark.parametrize("opset", [7, 8])
def test_opsets_older_than_9_are_upgraded_once_with_a_note(opset: int) -> None:
    net = Net(opset)
    y = flatten_by_shape(net, net.op("Relu", net.op("Conv", "x", net.weight(4, 3, 3, 3), net.weight(4))))
    model = net.model({"x": ["N", 3, 6, 6]}, net.op("Gemm", y, net.weight(64, 5), net.weight(5)), ["N", 5])
    log = io.StringIO()
    graph = optimize(trace_model(model, progress=Progress(log, live=False)))
    assert log.getvalue().count(f"opset {opset} upgraded to 9 with onnx's version converter") == 1
    feeds = images(np.random.default_rng(0), 2, 3, 6, 6)
    np.testing.assert_allclose(run(graph, feeds)[graph.outputs[0]], expected(model, feeds)[0], rtol=1e-4, atol=1e-4)


def test_folding_evaluates_under_the_models_own_opset() -> None:
    """An opset-9 Unsqueeze of a constant keeps `axes` as an attribute; the newest schema would want an input."""
    net = Net(9)
    shape = net.op("Concat", net.op("Unsqueeze", net.const(2, np.int64), axes=[0]), net.const([-1], np.int64), axis=0)
    model = net.model({"x": [2, 6]}, net.op("Reshape", "x", shape), [2, 6])
    graph = trace_model(model)
    assert [node.op for node in graph.nodes] == ["reshape"]


def test_fixed_batch_of_one_is_relaxed_when_every_node_keeps_samples_apart() -> None:
    """Exporters fold x.view(x.size(0), -1) to the constant (1, -1) when the batch is fixed: still per sample."""
    net = Net(13)
    y = net.op("Reshape", net.op("Relu", "x"), net.const([1, -1], np.int64))
    model = net.model({"x": [1, 3, 2, 2]}, net.op("Softmax", y, axis=1))
    log = io.StringIO()
    graph = trace_model(model, progress=Progress(log, live=False))
    assert graph.inputs[0].shape == (None, 3, 2, 2)
    assert "relaxed to any batch" in log.getvalue()
    feeds = images(np.random.default_rng(1), 5, 3, 2, 2)
    want = np.concatenate([expected(model, {"x": feeds["x"][i:i + 1]})[0] for i in range(5)])
    np.testing.assert_allclose(run(graph, feeds)[graph.outputs[0]], want, rtol=1e-5)


def test_fixed_batch_moved_off_axis_0_is_relaxed_by_stacking_samples() -> None:
    """Attention as torch exports it with the batch fixed: (1, L, E) transposed to (L, 1, E), the batch folded
    with the heads into (L, heads, E / heads) and back. The relaxed graph stacks samples; it is checked."""
    net = Net(13)
    tokens = net.op("Transpose", "x", perm=[1, 0, 2])                                   # (4, 1, 6)
    projected = net.op("MatMul", tokens, net.weight(6, 6))
    heads = net.op("Transpose", net.op("Reshape", projected, net.const([4, 2, 3], np.int64)), perm=[1, 0, 2])
    scores = net.op("Softmax", net.op("MatMul", heads, net.op("Transpose", heads, perm=[0, 2, 1])), axis=2)
    mixed = net.op("Transpose", net.op("MatMul", scores, heads), perm=[1, 0, 2])        # (4, 2, 3)
    back = net.op("Transpose", net.op("Reshape", mixed, net.const([4, 1, 6], np.int64)), perm=[1, 0, 2])
    model = net.model({"x": [1, 4, 6]}, net.op("Add", back, "x"))
    log = io.StringIO()
    graph = trace_model(model, progress=Progress(log, live=False))
    assert graph.inputs[0].shape == (None, 4, 6)
    assert "relaxed to any batch by stacking samples" in log.getvalue()
    feeds = images(np.random.default_rng(4), 3, 4, 6)
    want = np.concatenate([expected(model, {"x": feeds["x"][i:i + 1]})[0] for i in range(3)])
    np.testing.assert_allclose(run(optimize(graph), feeds)[graph.outputs[0]], want, rtol=1e-5, atol=1e-6)


def test_fixed_batch_that_cannot_be_relaxed_runs_sample_by_sample() -> None:
    """A sample added to its own flattened copy: the two operands' batch axes cannot be lined up (ranks 2 and 1),
    so the fixed batch stays, the log names the node, and larger batches run one by one."""
    net = Net(13)
    flat = net.op("Reshape", "x", net.const([4], np.int64))
    model = net.model({"x": [1, 4]}, net.op("Add", "x", net.op("Relu", flat)))
    log = io.StringIO()
    graph = trace_model(model, progress=Progress(log, live=False))
    assert graph.inputs[0].shape == (1, 4)
    assert "cannot relax it" in log.getvalue() and "sample by sample" in log.getvalue()
    assert "acts on the batch axis it moved" in log.getvalue()
    x = np.random.default_rng(2).normal(size=(3, 4)).astype(np.float32)
    np.testing.assert_allclose(run(graph, {"x": x})[graph.outputs[0]], x + np.maximum(x, 0), rtol=1e-6)
    with pytest.raises(UsageError, match="model.inputs gives 'x' a free batch \\(null\\), but the graph cannot"):
        trace_model(model, inputs={"x": (None, 4)})


def shape_input_model(read_by_gather: bool = False) -> Any:
    """x (N, 3, 4) reshaped to the shape of an int64 input ids (N, 12), as a model reads a size off a token tensor;
    with `read_by_gather`, ids also indexes an embedding table (a value, not a shape: an embedding)."""
    net = Net(13)
    y = net.op("Relu", net.op("Reshape", "x", net.op("Shape", "ids")))
    if read_by_gather:
        y = net.op("Add", y, net.op("ReduceSum", net.op("Gather", net.weight(20, 12), "ids"), net.const([1], np.int64),
                                    keepdims=0))
    output = net.op("Softmax", y, axis=1)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4]),
              helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 12])]
    graph = helper.make_graph(net.nodes, "test", inputs, [helper.make_tensor_value_info(output, TensorProto.FLOAT,
                                                                                       ["N", 12])], net.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def test_an_integer_input_that_feeds_only_shapes_is_evaluated_at_load_and_left_out() -> None:
    log = io.StringIO()
    graph = trace_model(shape_input_model(), progress=Progress(log, live=False))
    assert [spec.name for spec in graph.inputs] == ["x"] and graph.inputs[0].shape == (None, 3, 4)
    assert "input 'ids' (int64) feeds only shape computations" in log.getvalue()
    feeds = images(np.random.default_rng(3), 5, 3, 4)
    want = expected(shape_input_model(), {**feeds, "ids": np.arange(60).reshape(5, 12)})[0]
    np.testing.assert_allclose(run(graph, feeds)[graph.outputs[0]], want, rtol=1e-5)


def test_a_model_with_a_shape_only_integer_input_builds_end_to_end(tmp_path: Path, cache_dir: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(shape_input_model().SerializeToString())
    rng = np.random.default_rng(5)
    np.savez(tmp_path / "data.npz", x=rng.normal(size=(32, 3, 4)).astype(np.float32), y=rng.integers(0, 12, 32))
    (tmp_path / "recipe.yaml").write_text(
        "name: shape-input\nmodel: {source: model.onnx}\n"
        "data:\n  calibration: {source: data.npz, x: x}\n  evaluation: {source: data.npz, x: x, y: y}\n"
        "  metric: accuracy\ntuning: {allow_miss: true}\n"
        "targets:\n  - {name: mcu, kind: c}\n  - {name: ort, kind: onnx}\n")
    assert main(["build", str(tmp_path), "--build-dir", str(tmp_path / "build"), "-q"]) == 0
    summary = json.loads((tmp_path / "build" / "shape-input" / "build.json").read_text())
    assert all(check["ok"] for check in summary["checks"].values()) and len(summary["checks"]) == 2


def test_an_integer_input_that_also_indexes_a_table_stays_an_integer_input() -> None:
    """ids read as Gather indices into a constant table (an embedding) stay a graph input of dtype int64."""
    graph = trace_model(shape_input_model(read_by_gather=True))
    assert [(spec.name, spec.dtype) for spec in graph.inputs] == [("x", "float32"), ("ids", "int64")]
    assert "embedding" in [node.op for node in graph.nodes]
    feeds = {**images(np.random.default_rng(3), 5, 3, 4), "ids": np.random.default_rng(4).integers(0, 20, (5, 12))}
    want = expected(shape_input_model(read_by_gather=True), feeds)[0]
    np.testing.assert_allclose(run(graph, feeds)[graph.outputs[0]], want, rtol=1e-5)


def test_model_inputs_null_relaxes_and_a_given_size_keeps_the_files_batch() -> None:
    net = Net(13)
    model = net.model({"x": [1, 4]}, net.op("Relu", "x"))
    assert trace_model(model, inputs={"x": (None, 4)}).inputs[0].shape == (None, 4)
    assert trace_model(model, inputs={"x": (1, 4)}).inputs[0].shape == (1, 4)


def test_an_unread_dropout_mask_does_not_block_a_dynamic_batch() -> None:
    net = Net(13)
    kept, _mask = net.op("Dropout", "x", outputs=2)
    model = net.model({"x": ["N", 4]}, net.op("Relu", kept))
    graph = trace_model(model)
    assert graph.inputs[0].shape == (None, 4) and [node.op for node in graph.nodes] == ["identity", "relu"]


def write_recipe(folder: Path, model_bytes: bytes, inputs: str = "") -> Path:
    folder.mkdir()
    (folder / "model.onnx").write_bytes(model_bytes)
    rng = np.random.default_rng(0)
    np.savez(folder / "data.npz", x=rng.normal(size=(16, 3, 8, 8)).astype(np.float32), y=np.zeros(16, np.int64))
    (folder / "recipe.yaml").write_text(
        "name: broken-onnx\n"
        f"model: {{source: model.onnx{inputs}}}\n"
        "data:\n"
        "  calibration: {source: data.npz, x: x}\n"
        "  evaluation: {source: data.npz, x: x, y: y}\n"
        "  metric: accuracy\n"
        "targets:\n"
        "  - {name: mcu, kind: c}\n"
    )
    return folder


@pytest.mark.parametrize(
    "model_bytes, inputs, message",
    [
        pytest.param(lambda: cnn_model().SerializeToString()[:700], "", "not a readable ONNX model", id="truncated"),
        pytest.param(lambda: b"hello, I am text\n", "", "model.onnx", id="text"),
        pytest.param(lambda: cnn_model().SerializeToString(), ", inputs: {x: [1, 3, 9, 9]}", "input 'x'", id="shape"),
    ],
)
def test_cli_exits_2_and_leaves_no_trace_output(
    model_bytes: Any, inputs: str, message: str, tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    recipe = write_recipe(tmp_path / "recipe", model_bytes(), inputs)
    build_root = tmp_path / "build"
    assert main(["build", str(recipe), "--build-dir", str(build_root), "-q"]) == 2
    assert message in capsys.readouterr().err
    assert not (build_root / "broken-onnx" / "trace").exists()
    assert not list(cache_dir.rglob("graph.json"))  # nothing cached either


def test_a_float64_model_is_refused_not_computed_in_float32() -> None:
    net = Net(17)
    net.initializers.append(numpy_helper.from_array(np.full(4, 1e30), "big"))
    graph = helper.make_graph([helper.make_node("Mul", ["x", "big"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["N", 4])], net.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 17)])
    with pytest.raises(UsageError, match="input 'x' is float64: the model computes in float64"):
        trace_model(model)
    cast = Net(17)
    wide = cast.op("Cast", "x", to=TensorProto.DOUBLE)
    narrow = cast.model({"x": ["N", 4]}, cast.op("Cast", cast.op("Mul", wide, cast.const(np.full(4, 1e30), np.float64)),
                                                 to=TensorProto.FLOAT))
    with pytest.raises(UsageError, match="a cast of run-time tensors to float64"):
        trace_model(narrow)


def test_nodes_of_a_torch_export_are_named_by_module_path() -> None:
    """torch.onnx's exporter records each node's module scopes (`pkg.torch.onnx.name_scopes`, with the module
    classes beside them): dabuild names the nodes as the torch frontend would (`features.0`, an nn.Sequential
    child of the root as `linear_2`), not by the exporter's `node_Conv_236`; a node named by no scope keeps its
    own name as it is (no `_1` appended)."""
    rng = np.random.default_rng(0)

    def scoped(node: Any, scopes: list[str], classes: list[str]) -> Any:
        helper.set_metadata_props(node, {"pkg.torch.onnx.name_scopes": repr(scopes),
                                         "pkg.torch.onnx.class_hierarchy": repr(classes)})
        return node

    nodes = [
        scoped(helper.make_node("Gemm", ["x", "w1", "b1"], ["gemm"], name="node_Gemm_236", transB=1),
               ["", "features", "features.0", "linear"], ["Net", "torch.nn.Sequential", "torch.nn.Linear", "aten.linear"]),
        scoped(helper.make_node("Relu", ["gemm"], ["relu"], name="node_Relu_237"),
               ["", "features", "features.1", "relu"], ["Net", "torch.nn.Sequential", "torch.nn.ReLU", "aten.relu"]),
        scoped(helper.make_node("Gemm", ["relu", "w2", "b2"], ["gemm_1"], name="node_Gemm_238", transB=1),
               ["", "2", "linear_1"], ["torch.nn.Sequential", "torch.nn.modules.linear.Linear", "aten.linear"]),
        helper.make_node("Relu", ["gemm_1"], ["y"], name="last_relu"),
    ]
    weights = {"w1": rng.normal(size=(8, 4)), "b1": rng.normal(size=8), "w2": rng.normal(size=(3, 8)),
               "b2": rng.normal(size=3)}
    graph = helper.make_graph(nodes, "scoped", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
                              [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    traced = trace_model(model)
    assert [node.name for node in traced.nodes] == ["features.0", "features.1", "linear_2", "last_relu"]
