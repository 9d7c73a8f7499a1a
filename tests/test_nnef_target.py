"""The NNEF target: tensor files, export of MLP and CNN QGraphs run by tract against dabuild's reference."""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_quantize import lower, mlp_graph

from dabuild.capability import load_capability
from dabuild.cli import main
from dabuild.errors import BuildError, CheckError
from dabuild.ir import Graph, Node, TensorSpec
from dabuild.progress import Progress
from dabuild.qir.qgraph import QGraph
from dabuild.qir.reference import run_integer, run_quantized
from dabuild.quant.calibrate import calibrate
from dabuild.quant.config import NodeConfig, QuantConfig
from dabuild.quant.defaults import default_config
from dabuild.quant.quantize import quantize
from dabuild.resources import data_dir
from dabuild.targets.check import check_stage
from dabuild.targets.nnef import ARCHIVE, NnefTarget
from dabuild.targets.nnef.tensor_file import HEADER_BYTES, QUANTIZED_SIGNED, SIGNED, decode, encode

tract = pytest.importorskip("tract")
TRACT = load_capability(data_dir("capabilities") / "tract.yaml")


@pytest.mark.parametrize("array,quantized,code", [
    (np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7, False, 0),
    (np.array([[-128, 0, 127]], dtype=np.int8), True, QUANTIZED_SIGNED),
    (np.array([-(2**31), 5, 2**31 - 1], dtype=np.int32), False, SIGNED),
    (np.float32(2.5), False, 0),
])
def test_tensor_file_round_trip(array: np.ndarray, quantized: bool, code: int) -> None:
    blob = encode(array, quantized)
    magic, major, minor, length, rank = struct.unpack_from("<2sBBII", blob)
    dims = struct.unpack_from("<8I", blob, 12)
    bits, item_code, vendor = struct.unpack_from("<IHH", blob, 44)
    assert (magic, major, minor) == (b"\x4e\xef", 1, 0) and len(blob) == HEADER_BYTES + length
    assert rank == np.ndim(array) and dims == (*np.shape(array), *[0] * (8 - np.ndim(array)))
    assert (bits, item_code, vendor) == (8 * np.asarray(array).itemsize, code, 0)
    assert blob[52:HEADER_BYTES] == bytes(HEADER_BYTES - 52)
    back, back_quantized = decode(blob)
    assert back.dtype == np.asarray(array).dtype and back_quantized == quantized
    np.testing.assert_array_equal(back, array)


def test_tensor_file_rejects_damage() -> None:
    blob = encode(np.ones((2, 2), np.float32))
    with pytest.raises(ValueError, match="magic"):
        decode(b"xx" + blob[2:])
    with pytest.raises(ValueError, match="data bytes"):
        decode(blob[:-1])


def small_cnn(channels: int = 6, seed: int = 0) -> Graph:
    """reshape -> conv+relu -> max_pool -> depthwise conv+sigmoid (a table) -> residual add -> avg_pool
    -> tanh -> global_avg_pool -> flatten -> dense -> softmax: every kind of layer the exporter writes."""
    rng = np.random.default_rng(seed)
    constants = {"w1": rng.normal(0, 1 / 3, (channels, 1, 3, 3)), "b1": rng.normal(0, 0.1, channels),
                 "w2": rng.normal(0, 1 / 3, (channels, 1, 3, 3)), "b2": rng.normal(0, 0.1, channels),
                 "w3": rng.normal(0, 1 / np.sqrt(channels), (channels, 10)), "b3": rng.normal(0, 0.1, 10)}
    nodes = [
        Node("image", "reshape", ["x"], ["image"], {"shape": [0, 1, 8, 8]}),
        Node("conv1", "conv", ["image", "w1", "b1"], ["c1"], {"pads": [1, 1, 1, 1], "activation": "relu"}),
        Node("pool", "max_pool", ["c1"], ["p1"], {"kernel": [2, 2]}),
        Node("depthwise", "conv", ["p1", "w2", "b2"], ["c2"], {"pads": [1, 1, 1, 1], "groups": channels,
                                                               "activation": "sigmoid"}),
        Node("residual", "add", ["c2", "p1"], ["r"], {}),
        Node("smooth", "avg_pool", ["r"], ["s"], {"kernel": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]}),
        Node("squash", "tanh", ["s"], ["t"], {}),
        Node("gap", "global_avg_pool", ["t"], ["g"], {}),
        Node("flat", "flatten", ["g"], ["f"], {}),
        Node("head", "dense", ["f", "w3", "b3"], ["logits"], {}),
        Node("probs", "softmax", ["logits"], ["y"], {}),
    ]
    return Graph([TensorSpec("x", (None, 64))], ["y"], nodes,
                 {name: np.asarray(value, np.float32) for name, value in constants.items()})


def digits_inputs() -> np.ndarray:
    data = np.load(Path(__file__).resolve().parent.parent / "recipes" / "digits" / "data.npz")
    return data["x_train"][:400].astype(np.float32)


def export(qgraph: QGraph, folder: Path, target: NnefTarget) -> Path:
    folder.mkdir()
    target.export(qgraph, folder)
    return folder


def steps_apart(qgraph: QGraph, expected: np.ndarray, actual: np.ndarray) -> float:
    assert expected.shape == actual.shape
    return float(np.max(np.abs(expected.astype(np.float64) - actual)) / qgraph.output_params.scale)


@pytest.mark.parametrize("granularity,quantized_kernels", [("per_tensor", True), ("per_channel", True),
                                                           ("per_tensor", False)])
def test_cnn_in_tract_is_within_one_step_of_the_quantized_reference(
        tmp_path: Path, granularity: str, quantized_kernels: bool) -> None:
    x = digits_inputs()
    qgraph = lower(small_cnn(), x[:300], granularity, TRACT)
    assert {"conv", "lookup", "add", "avg_pool", "mean", "dense", "softmax", "max_pool"} <= {
        layer.op for layer in qgraph.layers}
    target = NnefTarget(NnefTarget.Options(quantized_kernels=quantized_kernels))
    artifact = export(qgraph, tmp_path / "artifact", target)
    with tarfile.open(artifact / ARCHIVE) as archive:
        names = set(archive.getnames())
        graph_text = archive.extractfile("graph.nnef").read().decode()  # type: ignore[union-attr]
    assert "graph.nnef" in names and any(name.endswith(".dat") for name in names)
    uses_tract_kernels = quantized_kernels and granularity == "per_tensor"
    assert ("graph.quant" in names) == uses_tract_kernels
    assert ("to = 'i8'" in graph_text) == uses_tract_kernels  # activations cast to tract's QI8
    held_out = x[300:]
    actual = target.run(artifact, held_out, tmp_path)
    assert actual.dtype == np.float32
    assert steps_apart(qgraph, run_quantized(qgraph, held_out), actual) <= 1.0


def test_trace_gives_every_tensor_and_agrees_with_run(tmp_path: Path) -> None:
    x = digits_inputs()
    qgraph = lower(small_cnn(), x[:300], "per_tensor", TRACT)
    target = NnefTarget()
    artifact = export(qgraph, tmp_path / "artifact", target)
    sample = x[300:320]
    trace = target.trace(artifact, sample, tmp_path)
    reference = run_integer(qgraph, qgraph.input_params.quantize(sample), keep_intermediates=True)
    assert set(trace) == {name for name in qgraph.tensors if name not in qgraph.constants}
    np.testing.assert_array_equal(trace[qgraph.output], target.run(artifact, sample, tmp_path))
    for name, values in trace.items():
        params = qgraph.tensors[name].params
        error = np.abs(values - params.dequantize(reference[name])) / params.scale
        assert error.max() <= 1.0, name


def test_export_is_byte_stable_and_needs_no_tract(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    qgraph = lower(mlp_graph([20, 12, 5], ["relu", "none"], seed=3),
                   np.random.default_rng(4).normal(size=(128, 20)).astype(np.float32), "per_tensor", TRACT)
    first = export(qgraph, tmp_path / "first", NnefTarget())
    monkeypatch.setitem(sys.modules, "tract", None)  # import tract now fails
    second = export(qgraph, tmp_path / "second", NnefTarget())
    assert (first / ARCHIVE).read_bytes() == (second / ARCHIVE).read_bytes()
    with pytest.raises(BuildError, match=r"pip install dabuild\[tract\]"):
        NnefTarget().run(second, np.zeros((1, 20), np.float32), tmp_path)


@pytest.mark.parametrize("island", [["squash"], ["residual", "smooth", "squash"]])
def test_float_islands_run_as_float_ops(tmp_path: Path, island: list[str]) -> None:
    """An island's nodes run float ops on float tensors; the depthwise conv before the second island writes
    its float result straight into it, and tract agrees with the reference within one output step."""
    x = digits_inputs()
    graph = small_cnn()
    config = default_config(graph, TRACT)
    for name in island:
        config.nodes[name] = NodeConfig(weight=None, activation=None)
    stats = calibrate(graph, ({"x": x[i:i + 64]} for i in range(0, 300, 64)), Progress.silent())
    qgraph = quantize(graph, stats, config)
    ops = {layer.name: layer.op for layer in qgraph.layers}
    assert all(ops[name] == "float" for name in island)
    assert (ops["depthwise"] == "float_weighted") == ("residual" in island)
    assert set(qgraph.floats) == {"r", "s"} & {out for node in graph.nodes if node.name in island[:-1]
                                              for out in node.outputs} | ({"c2"} if "residual" in island else set())
    target = NnefTarget()
    artifact = export(qgraph, tmp_path / "artifact", target)
    manifest = json.loads((artifact / "model.json").read_text())
    assert manifest["input_shape"] == [64] and manifest["output_shape"] == [10]
    assert steps_apart(qgraph, run_quantized(qgraph, x[300:]), target.run(artifact, x[300:], tmp_path)) <= 1.0


def rewrite_member(archive: Path, member: str, change: Callable[[np.ndarray], np.ndarray]) -> None:
    """Replace one tensor file inside a .nnef.tgz by `change` of its array (same dtype and quantization)."""
    with tarfile.open(archive) as tar:
        files = {info.name: tar.extractfile(info).read() for info in tar.getmembers()}  # type: ignore[union-attr]
    array, quantized = decode(files[member])
    files[member] = encode(change(array).astype(array.dtype), quantized)
    with tarfile.open(archive, "w:gz") as tar:
        for name, blob in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))


def test_forced_mismatch_fails_the_check_with_a_bundle(tmp_path: Path) -> None:
    x = digits_inputs()
    qgraph = lower(small_cnn(), x[:300], "per_tensor", TRACT)
    target = NnefTarget()
    artifact = export(qgraph, tmp_path / "artifact", target)
    rewrite_member(artifact / ARCHIVE, "head_weight.dat", lambda w: -w)  # the dense head now disagrees
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(CheckError) as failure:
        check_stage(target, qgraph, artifact, x[300:340], None, out_dir, tmp_path / "debug", Progress.silent())
    message = str(failure.value)
    assert "layer 'head'" in message and "fake-quant reference" in message
    bundle = Path(message.rsplit("debug bundle: ", 1)[1])
    assert bundle.parent == tmp_path / "debug"
    report = json.loads((bundle / "report.json").read_text())
    assert not report["ok"] and report["tolerance"] == "approximate" and report["reference"] == "fake_quant"
    assert report["runtime"]["tract"] == tract.version()
    np.testing.assert_array_equal(np.load(bundle / "inputs.npy"), x[300:340])
    np.testing.assert_array_equal(np.load(bundle / "expected.npy"), run_quantized(qgraph, x[300:340]))
    assert steps_apart(qgraph, np.load(bundle / "expected.npy"), np.load(bundle / "actual.npy")) > 1
    target_trace = np.load(bundle / "target_trace.npz")
    assert {"f", "logits", "y"} <= set(target_trace.files) and "logits" in np.load(bundle / "reference_trace.npz")
    assert (bundle / "artifact" / ARCHIVE).is_file()
    rerun = subprocess.run(["sh", str(bundle / "run.sh")], check=False, capture_output=True, text=True,
                           env={**os.environ, "PYTHON": sys.executable})
    assert rerun.returncode == 1 and "outside tolerance 'approximate'" in rerun.stdout
    np.testing.assert_array_equal(np.fromfile(bundle / "rerun.bin", np.float32).reshape(40, 10),
                                  np.load(bundle / "actual.npy"))


def test_digits_recipe_builds_and_checks_an_nnef_target(digits: Path, tmp_path: Path, cache_dir: Path) -> None:
    recipe = digits / "recipe.yaml"
    recipe.write_text(recipe.read_text() + "  - {name: tract, kind: nnef}\n")
    assert main(["build", str(digits), "--build-dir", str(tmp_path / "build"), "-q"]) == 0
    summary = json.loads((tmp_path / "build" / "digits-mlp" / "build.json").read_text())
    assert summary["outcomes"]["export:tract"] == "executed" and summary["outcomes"]["tune:tract"] == "executed"
    check = summary["checks"]["tract"]
    assert check["ok"] and check["tolerance"] == "approximate" and check["mismatches"] == 0


NEW_FLOAT_OPS = ("slice", "elu", "selu", "softplus", "softsign", "abs", "neg", "exp", "log", "sqrt", "reciprocal", "pow", "erf",
                 "log_softmax", "min", "prelu", "instance_norm", "layer_norm", "group_norm", "lrn", "conv_transpose",
                 "conv3d", "max_pool3d", "resize", "gather", "tile", "expand")


def float_op_cases() -> dict[str, Any]:
    """The one-node graphs of test_onnx_float with one dynamic input, for the ops NEW_FLOAT_OPS names and the
    pools padded past their kernel."""
    from test_onnx_float import CASES

    return {name: case for name, case in CASES.items() if not case.extra_inputs and case.outputs == 1
            and (any(name.startswith(op) or case.op == op for op in NEW_FLOAT_OPS) or "padded_past_kernel" in name)}


@pytest.mark.parametrize("name", sorted(float_op_cases()))
def test_float_ops_in_tract_agree_with_the_reference(name: str, tmp_path: Path) -> None:
    """Each op as an fp32-fallback layer between int8 tensors: tract's result within one output step."""
    case = float_op_cases()[name]
    graph = case.graph()
    x = np.random.default_rng(5).standard_normal((64, *case.x[1:])).astype(np.float32)
    if case.op in ("log", "sqrt", "reciprocal"):
        x = np.abs(x) + 0.25
    stats = calibrate(graph, [{"x": x}], Progress.silent())
    qgraph = quantize(graph, stats, QuantConfig({"node": NodeConfig(None, None)}))
    artifact = export(qgraph, tmp_path / "artifact", NnefTarget())
    assert steps_apart(qgraph, run_quantized(qgraph, x[:8]), NnefTarget().run(artifact, x[:8], tmp_path)) <= 1.0


def test_where_in_tract_agrees_with_the_reference(tmp_path: Path) -> None:
    graph = Graph([TensorSpec("x", (None, 3, 4))], ["y"], [Node("node", "where", ["c", "x", "other"], ["y"], {})],
                  {"c": np.arange(12).reshape(3, 4) % 3 == 0, "other": np.linspace(-1, 1, 4, dtype=np.float32)})
    x = np.random.default_rng(6).standard_normal((16, 3, 4)).astype(np.float32)
    qgraph = quantize(graph, calibrate(graph, [{"x": x}], Progress.silent()), QuantConfig({"node": NodeConfig(None, None)}))
    artifact = export(qgraph, tmp_path / "artifact", NnefTarget())
    assert steps_apart(qgraph, run_quantized(qgraph, x), NnefTarget().run(artifact, x, tmp_path)) <= 1.0


def test_new_integer_layers_in_tract_are_within_one_step(tmp_path: Path) -> None:
    from test_onnx_target import new_ops_net

    x = digits_inputs()
    qgraph = lower(new_ops_net(), x[:300], "per_tensor", TRACT)
    assert {"resize", "gather", "max", "min", "where", "matmul", "expand"} <= {layer.op for layer in qgraph.layers}
    target = NnefTarget()
    artifact = export(qgraph, tmp_path / "artifact", target)
    assert steps_apart(qgraph, run_quantized(qgraph, x[300:]), target.run(artifact, x[300:], tmp_path)) <= 1.0


def test_transposed_conv_in_tract_is_within_one_step(tmp_path: Path) -> None:
    from test_onnx_target import upsampling_net

    x = digits_inputs()
    qgraph = lower(upsampling_net(), x[:300], "per_channel", TRACT)
    target = NnefTarget()
    artifact = export(qgraph, tmp_path / "artifact", target)
    assert steps_apart(qgraph, run_quantized(qgraph, x[300:]), target.run(artifact, x[300:], tmp_path)) <= 1.0


def test_prelu_in_tract_is_within_one_step(tmp_path: Path) -> None:
    from test_onnx_target import prelu_net

    x = digits_inputs()
    qgraph = lower(prelu_net(), x[:300], "per_tensor", TRACT)
    assert qgraph.layers[-1].op == "prelu"
    target = NnefTarget()
    artifact = export(qgraph, tmp_path / "artifact", target)
    assert steps_apart(qgraph, run_quantized(qgraph, x[300:]), target.run(artifact, x[300:], tmp_path)) <= 1.0
