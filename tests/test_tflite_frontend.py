"""The tflite frontend on the committed .tflite files (tests/tflite_models, made by TensorFlow's converter),
each checked against LiteRT's reference kernels, and its errors on bad files."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tflite_micro", reason="needs the tflite extra: pip install 'dabuild[tflite]'")
pytest.importorskip("ai_edge_litert", reason="needs the tflite extra: pip install 'dabuild[tflite]'")

from tflite_runtime import MODELS, given_qgraph, imported, inputs_for, model, run_litert, trace_of_operator

from dabuild.errors import UsageError
from dabuild.ir.interpreter import run
from dabuild.qir.reference import run_quantized
from dabuild.trace.base import choose_framework
from dabuild.trace.tflite_frontend.model_file import read_model, schema

FLOAT = [path for path in MODELS if path.stem.endswith("_float")]
QUANTIZED = [path for path in MODELS if not path.stem.endswith("_float")]
PERMUTATIONS = {"conv_2d": [0, 3, 1, 2], "depthwise_conv_2d": [3, 0, 1, 2], "fully_connected": [1, 0]}


def test_the_committed_models_cover_the_issues_list() -> None:
    names = {path.stem for path in MODELS}
    for stem in ("ds_cnn", "resnet_block"):
        assert {f"{stem}_float", f"{stem}_int8", f"{stem}_16x8"} <= names
    assert choose_framework(str(MODELS[0])) == "tflite"


@pytest.mark.parametrize("path", FLOAT, ids=lambda path: path.stem)
def test_float_model_equals_litert(path: Path) -> None:
    x = inputs_for(path)
    graph = imported(path)
    ours = run(graph, {graph.inputs[0].name: x})[graph.outputs[0]]
    expected = run_litert(path, x)
    assert ours.shape == expected.shape
    np.testing.assert_allclose(ours, expected, atol=1e-5 * max(1.0, float(np.abs(expected).max())))


@pytest.mark.parametrize("path", QUANTIZED, ids=lambda path: path.stem)
def test_quantized_model_rebuilt_as_given_agrees_with_litert(path: Path) -> None:
    """Strategy given's QGraph against LiteRT's integer kernels, in output steps. int8: at most 4 steps (TFLite's
    add, mean and tables compute otherwise than dabuild's). 16x8: within twice what the file's own float
    fake-quant graph is from LiteRT plus 8 steps (LiteRT's int16 softmax is an approximation of its own)."""
    x = inputs_for(path)
    graph, qgraph = given_qgraph(path)
    expected = run_litert(path, x)
    step = qgraph.output_params.scale
    steps = np.abs(run_quantized(qgraph, x) - expected).max() / step
    if qgraph.output_params.dtype == "int8":
        assert steps <= 4
    else:
        fake_quant = run(graph, {graph.inputs[0].name: x})[graph.outputs[0]]
        assert qgraph.output_params.dtype == "int16"
        assert steps <= 2 * np.abs(fake_quant - expected).max() / step + 8


@pytest.mark.parametrize("path", [model("ds_cnn_int8"), model("resnet_block_16x8")], ids=lambda path: path.stem)
def test_given_weights_and_biases_are_the_files_integers(path: Path) -> None:
    flatbuffer = read_model(path)
    graph = flatbuffer.subgraphs[0]
    _, qgraph = given_qgraph(path)
    checked = 0
    for layer in qgraph.layers:
        index, _, kind = layer.name.split(":")[0].partition("_")
        if kind not in PERMUTATIONS or not hasattr(layer, "weight"):
            continue
        op = graph.operators[int(index.removeprefix("op"))]
        weight = graph.tensors[op.inputs[1]]
        stored = np.frombuffer(bytes(flatbuffer.buffers[weight.buffer].data), np.int8).reshape(weight.shape)
        assert np.array_equal(layer.weight, stored.transpose(PERMUTATIONS[kind])), layer.name
        bias_type = np.int64 if qgraph.tensors[layer.inputs[0]].params.dtype == "int16" else np.int32
        stored_bias = np.zeros(len(layer.bias), bias_type) if op.inputs[2] < 0 else \
            np.frombuffer(bytes(flatbuffer.buffers[graph.tensors[op.inputs[2]].buffer].data), bias_type)
        assert np.array_equal(layer.bias, stored_bias), layer.name
        checked += 1
    assert checked >= 3


def _rewritten(path: Path, folder: Path, change) -> Path:
    """A copy of a committed model with `change` applied to its object tree."""
    generated = schema()
    tree = read_model(path)
    change(tree, generated)
    import flatbuffers

    builder = flatbuffers.Builder(0)
    builder.Finish(tree.Pack(builder), file_identifier=b"TFL3")
    out = folder / f"changed_{path.name}"
    out.write_bytes(bytes(builder.Output()))
    return out


def _opcode(name: str, custom: bytes | None = None):
    def change(tree, generated) -> None:
        code = generated.OperatorCodeT()
        code.builtinCode = getattr(generated.BuiltinOperator, name)
        code.deprecatedBuiltinCode = min(code.builtinCode, 127)
        code.customCode = custom
        code.version = 1
        tree.operatorCodes.append(code)
        for index in (1, 3):  # two operators now use it
            tree.subgraphs[0].operators[index].opcodeIndex = len(tree.operatorCodes) - 1
    return change


def test_unsupported_builtins_and_custom_ops_are_listed_with_every_operator(tmp_path: Path) -> None:
    bad = _rewritten(model("ds_cnn_float"), tmp_path, _opcode("SQUARE"))
    with pytest.raises(UsageError, match=r"changed_ds_cnn_float.tflite: operators dabuild cannot read.*\n"
                                         r"  SQUARE: operators 1, 3") as caught:
        imported(bad)
    assert caught.value.exit_code == 2
    custom = _rewritten(model("ds_cnn_float"), tmp_path, _opcode("CUSTOM", b"MyOp"))
    with pytest.raises(UsageError, match=r"CUSTOM 'MyOp': operators 1, 3"):
        imported(custom)


def test_per_axis_weights_on_another_axis_are_refused_naming_the_operator(tmp_path: Path) -> None:
    def change(tree, generated) -> None:
        op = tree.subgraphs[0].operators[0]
        quantization = tree.subgraphs[0].tensors[op.inputs[1]].quantization
        quantization.quantizedDimension = 1   # a conv weight quantized along its kernel height

    bad = _rewritten(model("ds_cnn_int8"), tmp_path, change)
    with pytest.raises(UsageError, match=r"operator 0 \(CONV_2D\): weight .* quantized per axis 1; dabuild quantizes "
                                         r"this weight per axis 0"):
        imported(bad)


def test_schema_version_truncation_and_other_files_are_refused_naming_the_file(tmp_path: Path) -> None:
    def newer(tree, generated) -> None:
        tree.version = 4

    with pytest.raises(UsageError, match=r"schema version 4; dabuild reads version 3"):
        imported(_rewritten(model("ds_cnn_float"), tmp_path, newer))
    data = model("ds_cnn_float").read_bytes()
    truncated = tmp_path / "truncated.tflite"
    truncated.write_bytes(data[: len(data) // 3])
    with pytest.raises(UsageError, match=r"truncated.tflite: the flatbuffer is truncated or corrupt"):
        imported(truncated)
    other = tmp_path / "other.tflite"
    other.write_bytes(b"PK\x03\x04 not a flatbuffer at all")
    with pytest.raises(UsageError, match=r"other.tflite: not a TFLite flatbuffer"):
        imported(other)


def test_a_model_over_the_node_limit_is_refused_before_unpacking(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DABUILD_MAX_NODES", "3")
    with pytest.raises(UsageError, match=r"ds_cnn_int8.tflite: the model holds \d+ operators, over the limit of 3 "
                                         r"\(DABUILD_MAX_NODES\)"):
        imported(model("ds_cnn_int8"))


def test_ds_cnn_in_tflm_rounding_equals_tflm_byte_for_byte_in_reference_and_c(tmp_path: Path) -> None:
    """The int8 DS-CNN rebuilt as given, requantized as TFLM does: every tensor TFLM's interpreter writes (convs,
    depthwise convs, average pool, fully connected, softmax), from dabuild's integer reference, and every output
    byte from the C target (host) built with rounding tflm."""
    from tflite_runtime import run_tflm

    from dabuild.qir.reference import quantize_input, run_integer
    from dabuild.targets.c import CTarget

    path = model("ds_cnn_int8")
    operators = read_model(path).subgraphs[0].operators
    _, qgraph = given_qgraph(path)
    x = inputs_for(path, 24, seed=11)
    theirs = run_tflm(path, qgraph, x, tuple(int(op.outputs[0]) for op in operators))
    expected = theirs["output"]
    target = CTarget(CTarget.Options(rounding="tflm"))
    tflm_graph = target.integer_graph(qgraph)
    x_q = quantize_input(qgraph, x)
    trace = run_integer(tflm_graph, x_q, keep_intermediates=True)
    for index, op in enumerate(operators):
        assert np.array_equal(trace_of_operator(trace, index).reshape(theirs[int(op.outputs[0])].shape),
                              theirs[int(op.outputs[0])]), index
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    target.export(tflm_graph, artifact)
    assert np.array_equal(target.run(artifact, x_q, tmp_path).reshape(expected.shape), expected)


@pytest.mark.parametrize("name", ["resnet_block_int8", "resnet_block_16x8"])
def test_resnet_block_in_tflm_rounding_equals_tflm_in_reference_and_c(name: str, tmp_path: Path) -> None:
    """Every tensor of the ResNet block (quantize, convs, add, max pool, mean over height and width, fully
    connected) equals TFLM's in the integer reference, int8 and 16x8 (int64 sums requantized by TFLite's
    reduced multiplier), and so do the C target's outputs (16x8: its portable int16 kernels)."""
    import dataclasses

    from tflite_runtime import run_tflm

    from dabuild.qir.reference import quantize_input, run_integer
    from dabuild.targets.c import CTarget

    path = model(name)
    operators = read_model(path).subgraphs[0].operators
    _, qgraph = given_qgraph(path)
    x = inputs_for(path, 8, seed=11)
    exact = range(7)   # QUANTIZE, 3 x CONV_2D, ADD, MAX_POOL_2D, MEAN (then FULLY_CONNECTED, whose tensor is the output)
    theirs = run_tflm(path, qgraph, x, tuple(int(operators[i].outputs[0]) for i in exact))
    tflm_graph = dataclasses.replace(qgraph, rounding="tflm")
    trace = run_integer(tflm_graph, quantize_input(qgraph, x), keep_intermediates=True)
    for index in exact:
        assert np.array_equal(trace_of_operator(trace, index), theirs[int(operators[index].outputs[0])]), index
    expected = theirs["output"]
    assert np.array_equal(run_integer(tflm_graph, quantize_input(qgraph, x)).reshape(expected.shape), expected)
    target = CTarget(CTarget.Options(rounding="tflm"))
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    target.export(tflm_graph, artifact)
    assert np.array_equal(target.run(artifact, quantize_input(qgraph, x), tmp_path).reshape(expected.shape), expected)


def test_corrupted_files_fail_with_a_usage_error_or_import(tmp_path: Path) -> None:
    """Bytes flipped all over a model: each variant imports or stops with one UsageError naming the file."""
    from dabuild.errors import DabuildError

    data = bytearray(model("resnet_block_int8").read_bytes())
    rng = np.random.default_rng(8)
    outcomes = {"imported": 0, "refused": 0}
    for attempt in range(40):
        changed = bytearray(data)
        for position in rng.integers(8, len(data), 4):
            changed[position] = int(rng.integers(0, 256))
        path = tmp_path / f"corrupt{attempt}.tflite"
        path.write_bytes(bytes(changed))
        try:
            imported(path)
            outcomes["imported"] += 1
        except DabuildError as error:
            assert str(path) in str(error)
            outcomes["refused"] += 1
    assert outcomes["refused"] > 0


@pytest.mark.skipif(shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
                    reason="needs gcc-arm-none-eabi, libnewlib-arm-none-eabi and qemu-system-arm")
@pytest.mark.parametrize("cpu", ["cortex-m4", "cortex-m55"])
@pytest.mark.parametrize("name", ["ds_cnn_int8", "resnet_block_int8", "assorted_int8"])
def test_cortex_m_build_in_tflm_rounding_equals_tflm(name: str, cpu: str, tmp_path: Path) -> None:
    """The C target for a Cortex-M4 (its DSP kernels) and an M55 (Helium, whose four-lane requantization
    rounds as dabuild does and so gives way to the scalar one), run in qemu: TFLM's output bytes."""
    from tflite_runtime import run_tflm

    from dabuild.qir.reference import quantize_input
    from dabuild.targets.c import CTarget

    path = model(name)
    _, qgraph = given_qgraph(path)
    x = inputs_for(path, 8, seed=13)
    expected = run_tflm(path, qgraph, x)["output"]
    target = CTarget(CTarget.Options(cpu=cpu, rounding="tflm"))
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    target.export(target.integer_graph(qgraph), artifact)
    actual = target.run(artifact, quantize_input(qgraph, x), tmp_path)
    assert np.array_equal(actual.reshape(expected.shape), expected)


def test_assorted_model_in_c_with_tflm_rounding_equals_tflm(tmp_path: Path) -> None:
    """The C target (host) with rounding tflm runs the assorted int8 file (PAD, CONV_2D, TRANSPOSE_CONV,
    STRIDED_SLICE, TANH, QUANTIZE, LOGISTIC, MUL, CONCATENATION, HARD_SWISH, RESHAPE, FULLY_CONNECTED) to TFLM's
    output bytes: with a TFLM rounding its sigmoid, tanh and hard_swish tables are TFLM's own."""
    from tflite_runtime import run_tflm

    from dabuild.qir.reference import quantize_input
    from dabuild.targets.c import CTarget

    path = model("assorted_int8")
    _, qgraph = given_qgraph(path)
    x = inputs_for(path, 24, seed=11)
    expected = run_tflm(path, qgraph, x)["output"]
    target = CTarget(CTarget.Options(rounding="tflm"))
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    target.export(target.integer_graph(qgraph), artifact)
    assert np.array_equal(target.run(artifact, quantize_input(qgraph, x), tmp_path).reshape(expected.shape), expected)
