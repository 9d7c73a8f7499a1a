"""The onnx target: QDQ export of the QGraph, proven by onnxruntime against the fake-quant reference."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed")
ort = pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")

from onnx import numpy_helper  # noqa: E402
from test_pipeline import build, executed  # noqa: E402

from dabuild.capability import load_capability  # noqa: E402
from dabuild.cli import _print_summary  # noqa: E402
from dabuild.errors import BuildError, CheckError  # noqa: E402
from dabuild.ir import Graph, Node, TensorSpec  # noqa: E402
from dabuild.progress import Progress  # noqa: E402
from dabuild.qir.qgraph import QGraph  # noqa: E402
from dabuild.qir.reference import quantize_input, run_integer, run_quantized  # noqa: E402
from dabuild.quant.calibrate import Stats, calibrate  # noqa: E402
from dabuild.quant.config import NodeConfig, QuantConfig  # noqa: E402
from dabuild.quant.defaults import default_config  # noqa: E402
from dabuild.quant.quantize import quantize  # noqa: E402
from dabuild.resources import data_dir  # noqa: E402
from dabuild.targets.check import check_stage  # noqa: E402
from dabuild.targets.onnx import MODEL_FILE, OnnxTarget, missing_package_error, runner  # noqa: E402
from dabuild.targets.onnx.isa import detect, saturates  # noqa: E402

CAPABILITY = load_capability(data_dir("capabilities") / "onnxruntime.yaml")
DATA = dict(np.load(Path(__file__).resolve().parents[3] / "recipes" / "digits" / "data.npz"))


def small_cnn(channels: int = 8) -> Graph:
    """conv+relu -> max_pool -> depthwise conv+sigmoid (a table) -> pointwise conv -> residual add ->
    leaky_relu(0.1) (a table no default reproduces) -> avg_pool, concat -> global_avg_pool -> dense+relu6 -> softmax."""
    rng = np.random.default_rng(4)
    constants = {"w1": rng.normal(0, 1 / 3, (channels, 1, 3, 3)), "b1": rng.normal(0, 0.1, channels),
                 "w2": rng.normal(0, 1 / 3, (channels, 1, 3, 3)), "b2": rng.normal(0, 0.1, channels),
                 "w3": rng.normal(0, 1 / np.sqrt(channels), (channels, channels, 1, 1)),
                 "b3": rng.normal(0, 0.1, channels),
                 "w4": rng.normal(0, 0.5, (2 * channels, 10)), "b4": rng.normal(0, 0.1, 10)}
    nodes = [
        Node("image", "reshape", ["x"], ["image"], {"shape": [0, 1, 8, 8]}),
        Node("conv1", "conv", ["image", "w1", "b1"], ["c1"], {"pads": [1, 1, 1, 1], "activation": "relu"}),
        Node("pool", "max_pool", ["c1"], ["p1"], {"kernel": [2, 2]}),
        Node("depthwise", "conv", ["p1", "w2", "b2"], ["c2"], {"pads": [1, 1, 1, 1], "groups": channels,
                                                               "activation": "sigmoid"}),
        Node("pointwise", "conv", ["c2", "w3", "b3"], ["c3"], {}),
        Node("residual", "add", ["c3", "p1"], ["r"], {}),
        Node("act", "leaky_relu", ["r"], ["a"], {"alpha": 0.1}),
        Node("avg", "avg_pool", ["a"], ["ap"], {"kernel": [2, 2]}),
        Node("gap", "global_avg_pool", ["a"], ["g"], {}),
        Node("gmax", "reduce_max", ["ap"], ["m"], {"axes": [2, 3]}),
        Node("join", "concat", ["g", "m"], ["j"], {"axis": 1}),
        Node("flat", "flatten", ["j"], ["f"], {}),
        Node("head", "dense", ["f", "w4", "b4"], ["logits"], {"activation": "relu6"}),
        Node("soft", "softmax", ["logits"], ["y"], {}),
    ]
    return Graph([TensorSpec("x", (None, 64))], ["y"], nodes,
                 {name: np.asarray(value, np.float32) for name, value in constants.items()})


def lower(graph: Graph, config: QuantConfig | None = None) -> QGraph:
    stats = calibrate(graph, [{"x": DATA["x_train"][:400]}], Progress.silent())
    return quantize(graph, stats, config or default_config(graph, CAPABILITY))


def export(qgraph: QGraph, folder: Path, target: OnnxTarget | None = None) -> Path:
    folder.mkdir()
    (target or OnnxTarget()).export(qgraph, folder)
    return folder


def initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {tensor.name: numpy_helper.to_array(tensor) for tensor in model.graph.initializer}


def dequantize_node(model: onnx.ModelProto, initializer: str) -> onnx.NodeProto:
    return next(node for node in model.graph.node if node.op_type == "DequantizeLinear"
                and node.input[0] == initializer)


def weight_integers(model: onnx.ModelProto, name: str, isa: str) -> np.ndarray:
    """A layer's weight integers as the model stores them: int8, or on an isa whose u8s8 kernels saturate, uint8
    with zero point 128 where they reach beyond +-64 (so onnxruntime runs them in its exact u8u8 kernels)."""
    stored = initializers(model)[f"{name}/weight"]
    node = dequantize_node(model, f"{name}/weight")
    wide = int(np.abs(stored.astype(int) - (128 if stored.dtype == np.uint8 else 0)).max()) > 64
    if saturates(isa) and wide:
        assert stored.dtype == np.uint8 and np.all(initializers(model)[node.input[2]] == 128)
        assert name in json.loads({p.key: p.value for p in model.metadata_props}["dabuild.uint8_weights"])
        return stored.astype(int) - 128
    assert stored.dtype == np.int8 and len(node.input) == 2  # zero point 0 by default
    return stored


def test_digits_recipe_builds_and_checks_the_onnx_target(digits: Path, tmp_path: Path, cache_dir: Path) -> None:
    (digits / "recipe.yaml").write_text((digits / "recipe.yaml").read_text() + "  - {name: ort, kind: onnx, check_io: {samples: all}}\n")
    summary = build(digits, tmp_path / "build", "-j", "2")
    assert {"tune:onnxruntime", "export:ort", "check:ort", "check:mcu"} <= executed(summary)
    check = summary["checks"]["ort"]
    assert check["ok"] and check["tolerance"] == "approximate" and check["reference"] == "fake_quant"
    assert check["samples"] == len(DATA["x_test"]) and check["runtime"]["onnxruntime"]
    # The accuracy the artifact delivers in onnxruntime, beside the integer reference's (the tuned one).
    assert check["metric"]["reference"] == summary["metrics"]["tune:onnxruntime"]["quantized"]
    assert abs(check["metric"]["artifact"] - check["metric"]["reference"]) <= 2 / len(DATA["x_test"])
    model = onnx.load(str(tmp_path / "build" / "digits-mlp" / "export-ort" / MODEL_FILE))
    onnx.checker.check_model(model, full_check=True)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"


@pytest.mark.parametrize("opset", [None, 21])
def test_small_cnn_exports_as_checked_qdq_within_one_step(tmp_path: Path, opset: int | None) -> None:
    graph = small_cnn()
    config = default_config(graph, CAPABILITY)
    head = config.nodes["head"]
    config.nodes["head"] = dataclasses.replace(head, weight=dataclasses.replace(head.weight, granularity="per_channel"))
    qgraph = lower(graph, config)
    target = OnnxTarget(OnnxTarget.Options(opset=opset))
    artifact = export(qgraph, tmp_path / "artifact", target)
    model = onnx.load(str(artifact / MODEL_FILE))
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version == (opset or 17)
    assert model.ir_version == onnx.helper.find_min_ir_version_for(list(model.opset_import)) <= 10
    weights = initializers(model)
    layers = {layer.name: layer for layer in qgraph.layers}
    for name, axis in (("conv1", 0), ("pointwise", 0), ("head", 1)):  # per-channel weights, along output channels
        assert np.array_equal(weight_integers(model, name, target.isa), layers[name].weight)
        node = dequantize_node(model, f"{name}/weight")
        assert next(a.i for a in node.attribute if a.name == "axis") == axis
        assert np.allclose(weights[node.input[1]], layers[name].weight_scale)
        bias = weights[f"{name}/bias"]  # float32, the int32 bias on its grid s_in * s_w
        input_scale = qgraph.tensors[layers[name].inputs[0]].params.scale
        assert bias.dtype == np.float32
        assert np.array_equal(np.round(bias / (input_scale * layers[name].weight_scale)), layers[name].bias)
    ops = [node.op_type for node in model.graph.node]
    # Each activation's integers come from one QuantizeLinear, or for the exact table from a Gather.
    assert ops.count("QuantizeLinear") + ops.count("Gather") == len(qgraph.tensors) - len(qgraph.constants)
    assert "Sigmoid" in ops and "LeakyRelu" not in ops and "Gather" in ops  # a table only its attrs reproduce
    x = DATA["x_test"]
    for batch in (x[:1], x):
        actual = target.run(artifact, batch, tmp_path)
        steps = np.abs(actual - run_quantized(qgraph, batch)) / qgraph.output_params.scale
        assert actual.shape == (len(batch), 10) and steps.max() <= 1 + 1e-6
    # The trace: every activation's integers, within a step of the integer reference's; the output as the
    # model returns it (its real values, the same as `run`'s).
    trace = target.trace(artifact, x[:40], tmp_path)
    reference = run_integer(qgraph, quantize_input(qgraph, x[:40]), keep_intermediates=True)
    assert set(trace) == set(qgraph.tensors) - set(qgraph.constants)
    output = trace.pop(qgraph.output)
    assert output.dtype == np.float32 and np.array_equal(output, target.run(artifact, x[:40], tmp_path))
    for name, values in trace.items():
        assert values.dtype == np.int8 and np.abs(values.astype(int) - reference[name]).max() <= 1, name
    out_dir = tmp_path / "check"
    out_dir.mkdir()
    report = check_stage(target, qgraph, artifact, x, None, out_dir, tmp_path / "debug", Progress.silent())
    assert report["ok"] and report["tolerance"] == "approximate" and report["reference"] == "fake_quant"
    assert not (tmp_path / "debug").exists()


def test_fp32_fallback_layer_stays_a_float_op(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    constants = {"w1": rng.normal(0, 0.4, (64, 12)), "d": rng.uniform(0.5, 2.0, 12), "w2": rng.normal(0, 0.4, (12, 5))}
    graph = Graph([TensorSpec("x", (None, 64))], ["y"], [
        Node("fc1", "dense", ["x", "w1"], ["h"], {"activation": "relu"}),
        Node("scale", "div", ["h", "d"], ["s"], {}),
        Node("fc2", "dense", ["s", "w2"], ["y"], {}),
    ], {name: np.asarray(value, np.float32) for name, value in constants.items()})
    first_dense = Graph(graph.inputs, ["h"], graph.nodes[:1], graph.constants)
    dense = default_config(first_dense, CAPABILITY).nodes["fc1"]  # div has no integer lowering: fp32
    config = QuantConfig({"fc1": dense, "scale": NodeConfig(weight=None, activation=None), "fc2": dense})
    qgraph = lower(graph, config)
    assert qgraph.floats == {"h": (12,)}  # fc1 hands the island its float result
    artifact = export(qgraph, tmp_path / "artifact")
    model = onnx.load(str(artifact / MODEL_FILE))
    producers = {output: node for node in model.graph.node for output in node.output}
    div = next(node for node in model.graph.node if node.op_type == "Div")
    assert producers[div.input[0]].op_type == "Relu"  # reads fc1's float result, never quantized
    assert initializers(model)[div.input[1]].dtype == np.float32  # its constant stays float
    consumers = [node.op_type for node in model.graph.node if div.output[0] in node.input]
    assert consumers == ["QuantizeLinear"]  # and its output is quantized as the QGraph says
    x = DATA["x_test"]
    steps = np.abs(OnnxTarget().run(artifact, x, tmp_path) - run_quantized(qgraph, x)) / qgraph.output_params.scale
    assert steps.max() <= 1 + 1e-6


@pytest.mark.parametrize("island", [["pointwise"], ["conv1"], ["conv1", "pool", "depthwise"], ["head"]])
def test_float_islands_stay_float_in_onnxruntime_at_its_default_optimization(tmp_path: Path,
                                                                                island: list[str]) -> None:
    """onnxruntime's default optimizer turns DequantizeLinear -> float Conv -> QuantizeLinear into a QLinearConv
    with a weight it quantizes itself; an island's convs must survive it as float convs, and agree with the
    reference within one output step."""
    graph = small_cnn()
    config = default_config(graph, CAPABILITY)
    for name in island:
        config.nodes[name] = NodeConfig(weight=None, activation=None)
    qgraph = lower(graph, config)
    artifact = export(qgraph, tmp_path / "artifact")
    options = ort.SessionOptions()  # default graph optimization level
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    session = ort.InferenceSession(str(artifact / MODEL_FILE), options, providers=["CPUExecutionProvider"])
    x = DATA["x_test"]
    steps = np.abs(session.run(None, {"x": x})[0] - run_quantized(qgraph, x)) / qgraph.output_params.scale
    assert steps.max() <= 1 + 1e-6
    optimized = [node.op_type for node in onnx.load(str(tmp_path / "optimized.onnx")).graph.node]
    integer_convs = sum(layer.op == "conv" for layer in qgraph.layers)
    float_convs = sum(layer.op in ("float", "float_weighted") and layer.float_op == "conv" for layer in qgraph.layers)
    assert float_convs >= 1 or island == ["head"]
    # Every conv is one node, integer or float; only the integer layers' may have become integer kernels.
    assert optimized.count("QLinearConv") + optimized.count("Conv") + optimized.count("FusedConv") == \
        integer_convs + float_convs
    assert optimized.count("QLinearConv") <= integer_convs and "ConvInteger" not in optimized
    if island == ["head"]:
        assert "QGemm" not in optimized and "MatMulInteger" not in optimized


@pytest.mark.parametrize("opset", [None, 17])
def test_int4_weights_are_int4_initializers_at_opset_21(tmp_path: Path, opset: int | None) -> None:
    graph = small_cnn()
    config = default_config(graph, CAPABILITY)
    for name in ("conv1", "pointwise", "head"):
        node = config.nodes[name]
        config.nodes[name] = dataclasses.replace(node, weight=dataclasses.replace(node.weight, dtype="int4"))
    qgraph = lower(graph, config)
    # Written for a CPU with VNNI, where every weight stays int8 (or INT4). It runs exactly here too: the only
    # weights beyond 7 bits are the depthwise conv's, which onnxruntime runs in its own widening depthwise kernel.
    target = OnnxTarget(OnnxTarget.Options(opset=opset, isa="avx512-vnni"))
    artifact = export(qgraph, tmp_path / "artifact", target)
    model = onnx.load(str(artifact / MODEL_FILE))
    assert model.opset_import[0].version == (opset or 21)
    stored = {tensor.name: tensor for tensor in model.graph.initializer}
    layers = {layer.name: layer for layer in qgraph.layers}
    for name in ("conv1", "pointwise", "head", "depthwise"):
        tensor = stored[f"{name}/weight"]
        narrow = name != "depthwise" and opset is None
        assert tensor.data_type == (onnx.TensorProto.INT4 if narrow else onnx.TensorProto.INT8)
        size = layers[name].weight.size
        assert len(tensor.raw_data) == ((size + 1) // 2 if narrow else size)
        assert np.array_equal(numpy_helper.to_array(tensor).astype(np.int8), layers[name].weight)
    x = DATA["x_test"]
    steps = np.abs(target.run(artifact, x, tmp_path) - run_quantized(qgraph, x)) / qgraph.output_params.scale
    assert steps.max() <= 1 + 1e-6
    # Objective size is what the file stores: packed int4 weights count half a byte each.
    stored = target.stored_bytes(qgraph)
    assert stored == sum(len(t.raw_data) or numpy_helper.to_array(t).nbytes for t in model.graph.initializer)
    sizes = [layers[name].weight.size for name in ("conv1", "pointwise", "head")]
    packed = sum(size - (size + 1) // 2 for size in sizes) if opset is None else 0
    assert target.stored_bytes(lower(graph)) - stored == packed  # the all-int8 config's file stores more


def test_a_perturbed_weight_fails_check_naming_the_layer_and_a_reproducible_bundle(tmp_path: Path) -> None:
    qgraph = lower(small_cnn())
    artifact = export(qgraph, tmp_path / "artifact")
    pristine = (artifact / MODEL_FILE).read_bytes()
    model = onnx.load(str(artifact / MODEL_FILE))
    weight = next(t for t in model.graph.initializer if t.name == "pointwise/weight")
    values = numpy_helper.to_array(weight).copy()
    zero = 128 if values.dtype == np.uint8 else 0  # uint8 where this CPU's u8s8 kernels saturate
    values.flat[0] = zero - 127 if values.flat[0] > zero else zero + 127
    weight.CopyFrom(numpy_helper.from_array(values, weight.name))
    (artifact / MODEL_FILE).write_bytes(model.SerializeToString())
    out_dir, bundles = tmp_path / "out", tmp_path / "debug"
    out_dir.mkdir()
    with pytest.raises(CheckError) as failure:
        check_stage(OnnxTarget(), qgraph, artifact, DATA["x_test"], None, out_dir, bundles, Progress.silent())
    message = str(failure.value)
    assert "outside tolerance 'approximate'" in message and "fake-quant reference" in message
    assert "first diverging layer 'pointwise' (tensor 'c3')" in message
    # Proven layer by layer on onnxruntime's own values, the perturbed layer is the one found.
    assert "layer by layer, layer 'pointwise' (tensor 'c3')" in message and "given the runtime's own inputs" in message
    report = strict_json(out_dir / "report.json")
    assert report["ok"] is False and report["proof"] == "layer by layer"
    assert report["layer_by_layer"]["first_failure"].startswith("layer 'pointwise'")
    bundle = Path(re.search(r"debug bundle: (\S+)$", message).group(1))
    assert bundle.parent == bundles
    for name in ("inputs.npy", "inputs.bin", "expected.npy", "actual.npy", "reference_trace.npz", "target_trace.npz",
                 "versions.json", "report.json", "run.sh", f"artifact/{MODEL_FILE}"):
        assert (bundle / name).is_file(), name
    assert np.array_equal(np.load(bundle / "inputs.npy"), DATA["x_test"])
    assert not np.allclose(np.load(bundle / "expected.npy"), np.load(bundle / "actual.npy"))
    reference_trace, target_trace = np.load(bundle / "reference_trace.npz"), np.load(bundle / "target_trace.npz")
    assert {"x", "c2", "c3", "y", "pointwise:accumulator"} <= set(reference_trace.files)
    assert np.array_equal(reference_trace["c2"], target_trace["c2"])  # before the layer: the same values
    assert not np.array_equal(reference_trace["c3"], target_trace["c3"])
    versions = json.loads((bundle / "versions.json").read_text())
    assert versions["onnxruntime"] == OnnxTarget().runtime_version()["onnxruntime"]
    report = json.loads((bundle / "report.json").read_text())
    assert report["ok"] is False and "pointwise" in report["divergence"]
    # run.sh reruns the bundled (perturbed) model and reports the difference ...
    env = {**os.environ, "PYTHON": sys.executable}
    rerun = subprocess.run(["sh", str(bundle / "run.sh")], check=False, capture_output=True, text=True, env=env)
    assert rerun.returncode != 0 and "outside tolerance 'approximate'" in rerun.stdout
    # ... and agrees once the model is repaired.
    (bundle / "artifact" / MODEL_FILE).write_bytes(pristine)
    rerun = subprocess.run(["sh", str(bundle / "run.sh")], check=False, capture_output=True, text=True, env=env)
    assert rerun.returncode == 0 and "outputs match the reference" in rerun.stdout, rerun.stderr


def strict_json(path: Path) -> dict:
    """A report read as strict JSON: Infinity and NaN are not JSON."""
    def refuse(constant: str) -> None:
        raise AssertionError(f"{path} holds {constant}, which is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


def power_of_two_chain(blocks: int, width: int = 16) -> QGraph:
    """h = h + dense(h) `blocks` times, every activation at scale 0.02 and every weight at 1/64: each dense
    requantizes by exactly 1/64, so about one value in 64 is a tie, which the integer reference rounds away
    from zero and onnxruntime to even. Each layer stays within a step; the chain carries the steps on."""
    rng = np.random.default_rng(0)
    nodes, constants, ranges, h = [], {}, {"x": (-2.56, 2.54)}, "x"
    for i in range(blocks):
        weight = np.clip(np.round(rng.normal(0, 0.1, (width, width)) * 64), -127, 127)
        weight.flat[0] = 127  # the largest |w| sets the scale: 127/64 / 127
        constants[f"w{i}"], constants[f"b{i}"] = weight / 64, np.zeros(width)
        nodes += [Node(f"dense{i}", "dense", [h, f"w{i}", f"b{i}"], [f"d{i}"], {}),
                  Node(f"add{i}", "add", [h, f"d{i}"], [f"h{i}"], {})]
        ranges[f"d{i}"] = ranges[f"h{i}"] = (-2.56, 2.54)
        h = f"h{i}"
    graph = Graph([TensorSpec("x", (None, width))], [h], nodes,
                  {name: np.asarray(value, np.float32) for name, value in constants.items()})
    return quantize(graph, Stats(ranges=ranges), default_config(graph, CAPABILITY))


def test_rounding_drift_through_a_residual_chain_is_proven_layer_by_layer(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture) -> None:
    qgraph = power_of_two_chain(8)
    artifact = export(qgraph, tmp_path / "artifact")
    x = np.random.default_rng(1).normal(0, 0.7, (200, 16)).astype(np.float32)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    report = check_stage(OnnxTarget(), qgraph, artifact, x, None, out_dir, tmp_path / "debug", Progress.silent())
    assert report == strict_json(out_dir / "report.json")
    step = qgraph.output_params.scale
    assert report["ok"] and report["proof"] == "layer by layer" and report["max_abs_err"] >= 2 * step
    proof = report["layer_by_layer"]
    assert proof["ok"] and proof["first_failure"] is None and proof["max_steps"] == 1.0
    assert proof["layers"] == 2 * 8 + 1 and 0 < proof["samples"] < len(x)  # every layer and the input; the drifted
    assert not (tmp_path / "debug").exists()
    summary = {"recipe": "chain", "counts": {"executed": 1, "restored from cache": 0, "up to date": 0}, "metrics": {},
               "checks": {"ort": {**report, "artifact": "build/chain/export-ort"}}}
    _print_summary(summary, 1.0)
    drift = report["max_abs_err"] / step
    assert (f"check:ort: approximate passed layer by layer ({proof['samples']} samples; end to end up to {drift:.3g} "
            "steps) on 200 samples;") in capsys.readouterr().out


def test_check_runs_the_artifact_in_batches_with_the_same_report(tmp_path: Path) -> None:
    """onnxruntime holds a whole call's tensors in dabuild's memory, so check runs it run_batch samples at a
    time (a ResNet-50's 256 check images took 4 GB at once); the parts give the same report as one call."""

    class OneCall(OnnxTarget):
        run_batch = None

    qgraph = power_of_two_chain(8)
    artifact = export(qgraph, tmp_path / "artifact")
    x = np.random.default_rng(1).normal(0, 0.7, (OnnxTarget.run_batch * 2 + 5, 16)).astype(np.float32)
    reports = []
    for target in (OnnxTarget(), OneCall()):
        out_dir = tmp_path / type(target).__name__
        out_dir.mkdir()
        reports.append(check_stage(target, qgraph, artifact, x, None, out_dir, tmp_path / "debug", Progress.silent()))
    assert reports[0] == reports[1] and reports[0]["samples"] == len(x)


def test_a_failing_check_writes_strict_json_when_outputs_are_not_finite(tmp_path: Path) -> None:
    qgraph = lower(small_cnn())
    artifact = export(qgraph, tmp_path / "artifact")
    model = onnx.load(str(artifact / MODEL_FILE))
    output = next(node for node in model.graph.node if node.output[0] == qgraph.output)  # its DequantizeLinear
    model.graph.initializer.append(numpy_helper.from_array(np.array(np.inf, np.float32), "infinite"))
    output.input[1] = "infinite"
    (artifact / MODEL_FILE).write_bytes(model.SerializeToString())
    out_dir, bundles = tmp_path / "out", tmp_path / "debug"
    out_dir.mkdir()
    with pytest.raises(CheckError, match="layer by layer, layer 'soft'") as failure:
        check_stage(OnnxTarget(), qgraph, artifact, DATA["x_test"][:40], None, out_dir, bundles, Progress.silent())
    report = strict_json(out_dir / "report.json")
    assert report["ok"] is False and report["max_abs_err"] is None and report["max_rel_err"] is None
    assert report["layer_by_layer"]["max_steps"] is None
    bundle = Path(re.search(r"debug bundle: (\S+)$", str(failure.value)).group(1))
    assert strict_json(bundle / "report.json")["ok"] is False


def test_a_layer_without_a_qdq_writer_is_named(tmp_path: Path) -> None:
    from dabuild.targets.onnx import qdq

    qgraph = lower(small_cnn())
    with qdq.WRITERS.without("softmax"), pytest.raises(BuildError, match=r"no QDQ writer for layer 'soft' \(softmax\)"):
        OnnxTarget().export(qgraph, tmp_path)
    assert not (tmp_path / MODEL_FILE).exists()


def test_a_model_onnxruntime_cannot_load_is_a_build_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / MODEL_FILE).write_bytes(b"not a model")
    with pytest.raises(BuildError, match=rf"onnxruntime could not run {re.escape(str(tmp_path / MODEL_FILE))}"):
        OnnxTarget().run(tmp_path, np.zeros((1, 64), np.float32), tmp_path)


def test_missing_onnxruntime_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "pip install dabuild[onnx]" in str(missing_package_error("onnxruntime"))
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime now raises ImportError
    monkeypatch.delitem(sys.modules, "dabuild.targets.onnx.runner", raising=False)
    with pytest.raises(BuildError, match=r"needs the Python package 'onnxruntime'.*pip install dabuild\[onnx\]"):
        OnnxTarget().run(tmp_path, np.zeros((1, 64), np.float32), tmp_path)


def test_options_are_validated() -> None:
    assert OnnxTarget.Options().threads == 1 and OnnxTarget.Options().opset is None
    for bad in ({"opset": 16}, {"threads": 0}, {"provider": "cuda"}):
        with pytest.raises(ValueError):
            OnnxTarget.Options.model_validate(bad)


def new_ops_net() -> Graph:
    """The integer layers of issue 10 in one net on the 8x8 digits: elu (a table), nearest resize, gather,
    max, tile, min, where with a constant mask, an attention-like matmul of two activations and expand."""
    rng = np.random.default_rng(8)
    constants = {"w1": rng.normal(0, 1 / 3, (4, 1, 3, 3)), "b1": rng.normal(0, 0.1, 4),
                 "w2": rng.normal(0, 1 / 3, (4, 8, 1, 1)), "b2": rng.normal(0, 0.1, 4),
                 "mask": np.arange(64).reshape(8, 8) % 3 == 0, "w3": rng.normal(0, 0.3, (16, 10))}
    nodes = [
        Node("image", "reshape", ["x"], ["image"], {"shape": [0, 1, 8, 8]}),
        Node("conv1", "conv", ["image", "w1", "b1"], ["c1"], {"pads": [1, 1, 1, 1]}),
        Node("act", "elu", ["c1"], ["a"], {"alpha": 0.5}),
        Node("up", "resize", ["a"], ["u"], {"sizes": [1, 4, 16, 16], "scales": [1, 1, 2, 2],
                                            "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}),
        Node("pool", "max_pool", ["u"], ["p"], {"kernel": [2, 2]}),
        Node("pick", "gather", ["p"], ["g"], {"axis": 1, "indices": [3, 2, 1, 0]}),
        Node("biggest", "max", ["p", "g"], ["m"], {}),
        Node("twice", "tile", ["m"], ["t"], {"repeats": [1, 2, 1, 1]}),
        Node("conv2", "conv", ["t", "w2", "b2"], ["c2"], {}),
        Node("smallest", "min", ["c2", "a"], ["s"], {}),
        Node("masked", "where", ["mask", "s", "m"], ["w"], {}),
        Node("rows", "reshape", ["w"], ["r"], {"shape": [0, 4, 64]}),
        Node("turn", "transpose", ["r"], ["rt"], {"perm": [0, 2, 1]}),
        Node("scores", "matmul", ["r", "rt"], ["sc"], {}),
        Node("level", "reduce_mean", ["r"], ["lv"], {"axes": [2], "keepdims": True}),
        Node("smooth", "resize", ["lv"], ["ls"], {"sizes": [1, 4, 3], "scales": [1, 1, 3], "mode": "linear"}),
        Node("back", "reduce_mean", ["ls"], ["lb"], {"axes": [2], "keepdims": True}),
        Node("spread", "expand", ["lb"], ["e"], {"shape": [1, 4, 4]}),
        Node("sum", "add", ["sc", "e"], ["z"], {}),
        Node("flat", "flatten", ["z"], ["f"], {}),
        Node("head", "dense", ["f", "w3"], ["y"], {}),
    ]
    return Graph([TensorSpec("x", (None, 64))], ["y"], nodes,
                 {name: np.asarray(value, np.float32) for name, value in constants.items()})


def test_new_integer_layers_export_as_qdq_within_one_step(tmp_path: Path) -> None:
    qgraph = lower(new_ops_net())
    assert {"lookup", "resize", "resize_linear", "gather", "max", "tile", "min", "where", "matmul", "expand"} <= \
        {layer.op for layer in qgraph.layers}
    target = OnnxTarget()
    artifact = export(qgraph, tmp_path / "artifact", target)
    onnx.checker.check_model(onnx.load(str(artifact / MODEL_FILE)), full_check=True)
    x = DATA["x_test"][:100]
    steps = np.abs(target.run(artifact, x, tmp_path) - run_quantized(qgraph, x)) / qgraph.output_params.scale
    assert steps.max() <= 1 + 1e-6


def upsampling_net(groups: int = 2) -> Graph:
    """A strided conv down, a grouped transposed conv (output padding) back up, a dense head."""
    rng = np.random.default_rng(9)
    constants = {"w1": rng.normal(0, 1 / 3, (4, 1, 3, 3)), "b1": rng.normal(0, 0.1, 4),
                 "w2": rng.normal(0, 0.5, (4, 6 // groups, 3, 3)), "b2": rng.normal(0, 0.1, 6),
                 "w3": rng.normal(0, 0.1, (6 * 8 * 8, 10))}
    nodes = [
        Node("image", "reshape", ["x"], ["image"], {"shape": [0, 1, 8, 8]}),
        Node("down", "conv", ["image", "w1", "b1"], ["d"], {"strides": [2, 2], "pads": [1, 1, 1, 1],
                                                             "activation": "relu"}),
        Node("up", "conv_transpose", ["d", "w2", "b2"], ["u"], {"strides": [2, 2], "pads": [1, 1, 1, 1],
                                                                 "groups": groups, "output_padding": [1, 1]}),
        Node("flat", "flatten", ["u"], ["f"], {}),
        Node("head", "dense", ["f", "w3"], ["y"], {}),
    ]
    return Graph([TensorSpec("x", (None, 64))], ["y"], nodes,
                 {name: np.asarray(value, np.float32) for name, value in constants.items()})


def prelu_net() -> Graph:
    """A conv, then a prelu with one slope per channel: positive, negative, zero and above one."""
    rng = np.random.default_rng(10)
    return Graph([TensorSpec("x", (None, 64))], ["y"], [
        Node("image", "reshape", ["x"], ["image"], {"shape": [0, 1, 8, 8]}),
        Node("conv", "conv", ["image", "w"], ["c"], {"pads": [1, 1, 1, 1]}),
        Node("act", "prelu", ["c", "slope"], ["y"], {})],
        {"w": rng.normal(0, 0.5, (4, 1, 3, 3)).astype(np.float32),
         "slope": np.array([0.25, -0.5, 0.0, 1.5], np.float32).reshape(4, 1, 1)})


def test_prelu_exports_as_qdq_within_one_step(tmp_path: Path) -> None:
    qgraph = lower(prelu_net())
    assert qgraph.layers[-1].op == "prelu"
    target = OnnxTarget()
    artifact = export(qgraph, tmp_path / "artifact", target)
    x = DATA["x_test"][:50]
    steps = np.abs(target.run(artifact, x, tmp_path) - run_quantized(qgraph, x)) / qgraph.output_params.scale
    assert steps.max() <= 1 + 1e-6


@pytest.mark.parametrize("groups,granularity", [(1, "per_channel"), (2, "per_channel"), (2, "per_tensor")])
def test_transposed_conv_exports_as_qdq_within_one_step(tmp_path: Path, groups: int, granularity: str) -> None:
    graph = upsampling_net(groups)
    config = default_config(graph, CAPABILITY)
    up = config.nodes["up"]
    config.nodes["up"] = dataclasses.replace(up, weight=dataclasses.replace(up.weight, granularity=granularity))
    qgraph = lower(graph, config)
    assert "conv_transpose" in {layer.op for layer in qgraph.layers}
    target = OnnxTarget()
    artifact = export(qgraph, tmp_path / "artifact", target)
    x = DATA["x_test"][:100]
    steps = np.abs(target.run(artifact, x, tmp_path) - run_quantized(qgraph, x)) / qgraph.output_params.scale
    assert steps.max() <= 1 + 1e-6


def test_a_target_keeps_its_session_only_while_the_artifact_is_unchanged(tmp_path: Path) -> None:
    """check runs one artifact batch after batch on one session; a model rewritten in place gets a new one."""
    target, x = OnnxTarget(), DATA["x_test"][:8]
    first, second = lower(small_cnn()), lower(small_cnn(channels=4))
    target.export(first, tmp_path)
    assert np.array_equal(target.run(tmp_path, x[:4], tmp_path), target.run(tmp_path, x, tmp_path)[:4])
    assert set(target.trace(tmp_path, x[:2], tmp_path)) == set(first.tensors) - set(first.constants)
    target.export(second, tmp_path)
    assert np.array_equal(target.run(tmp_path, x, tmp_path), OnnxTarget().run(tmp_path, x, tmp_path))
    trace = target.trace(tmp_path, x[:2], tmp_path)
    assert trace[second.output].shape == (2, 10) and set(trace) == set(second.tensors) - set(second.constants)


@pytest.mark.parametrize("cores,threads", [(3, 1), (4, 2)])
def test_run_shares_a_batch_among_the_cores_with_each_samples_own_bits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      cores: int, threads: int) -> None:
    """check's batch runs as slices at once, one per `threads` of the cores; each sample's outputs are the
    bits onnxruntime gives it run alone."""
    import dabuild.targets.onnx as onnx_target

    monkeypatch.setattr(onnx_target, "available_cores", lambda: cores)
    target, x = OnnxTarget(OnnxTarget.Options(threads=threads)), DATA["x_test"][:7]
    target.export(lower(small_cnn()), tmp_path)
    alone = np.concatenate([OnnxTarget(OnnxTarget.Options(threads=threads)).run(tmp_path, x[i:i + 1], tmp_path)
                            for i in range(len(x))])
    assert np.array_equal(target.run(tmp_path, x, tmp_path), alone)


@pytest.mark.parametrize("isa", ["avx2", "avx512-vnni"])
def test_weights_are_uint8_where_u8s8_saturates_and_onnxruntime_runs_them_exactly(tmp_path: Path, isa: str) -> None:
    """Written for avx2 (no VNNI), wide weights are uint8, which onnxruntime runs in its widening u8u8 kernels on
    every CPU: within a step of the reference here, whatever this CPU is. Written for a CPU with VNNI they stay
    int8; checked on a CPU whose u8s8 kernels saturate, that model runs in onnxruntime's x64 precision mode (as
    VNNI computes), and the check says its default kernels were not run."""
    qgraph = lower(small_cnn())
    target = OnnxTarget(OnnxTarget.Options(isa=isa))
    artifact = export(qgraph, tmp_path / "artifact", target)
    model = onnx.load(str(artifact / MODEL_FILE))
    assert {p.key: p.value for p in model.metadata_props}["dabuild.isa"] == isa
    layers = {layer.name: layer for layer in qgraph.layers}
    for name in ("conv1", "depthwise", "pointwise", "head"):
        assert np.array_equal(weight_integers(model, name, isa), layers[name].weight)
    x, step = DATA["x_test"], qgraph.output_params.scale
    out_dir = tmp_path / "check"
    out_dir.mkdir()
    report = check_stage(target, qgraph, artifact, x, None, out_dir, tmp_path / "debug", Progress.silent())
    assert report["ok"] and report["proof"] == "end to end"  # no saturation left for a layer-by-layer proof to hide
    precise = saturates(detect()) and not saturates(isa)
    assert target.precise == precise and bool(report["not_run"]) == precise
    if precise:  # the default kernels here would be steps off: the precision mode is what the check stands on
        assert "x64 precision mode" in report["not_run"][0]
        default = runner.session(str(artifact / MODEL_FILE)).run(None, {"x": x})[0]
        assert np.abs(default - run_quantized(qgraph, x)).max() / step > 1
    # Objective size counts the zero points the uint8 form adds.
    extra = sum(len(np.atleast_1d(layer.weight_scale)) for layer in qgraph.layers
                if getattr(layer, "weight", None) is not None and np.abs(layer.weight.astype(int)).max() > 64)
    assert target.stored_bytes(qgraph) - OnnxTarget(OnnxTarget.Options(isa="arm64")).stored_bytes(qgraph) == \
        (extra if saturates(isa) else 0)


def test_the_capability_offers_seven_bit_weights_first_where_u8s8_saturates() -> None:
    for isa in ("avx2", "avx512", "x86-64"):
        narrowed = OnnxTarget.capability_for(CAPABILITY, {"isa": isa})
        assert narrowed.ops["conv"].weight.dtype == ["int7", "int8"] and narrowed.ops["dense"].weight.dtype[0] == "int7"
        assert narrowed.ops["embedding"].weight.dtype == ["int8"]  # gathered, never multiplied
    for isa in ("avx512-vnni", "avx-vnni", "arm64"):
        # weights as the capability states them (the float ops are narrowed to the target's own, as on every isa)
        assert OnnxTarget.capability_for(CAPABILITY, {"isa": isa}).ops == CAPABILITY.ops
    # A 7-bit weight is exact in u8s8: the tuner's default config exports no uint8 weight.
    qgraph = lower(small_cnn(), default_config(small_cnn(), OnnxTarget.capability_for(CAPABILITY, {"isa": "avx2"})))
    assert all(np.abs(layer.weight.astype(int)).max() <= 64 for layer in qgraph.layers if hasattr(layer, "weight"))


@pytest.mark.parametrize("flags,machine,isa", [
    ("fpu sse2 avx2 avx512f avx512bw avx512_vnni", "x86_64", "avx512-vnni"),
    ("fpu sse2 avx2 avx_vnni", "x86_64", "avx-vnni"),
    ("fpu sse2 avx2 avx512f avx512bw", "x86_64", "avx512"),
    ("fpu sse2 avx avx2 fma", "x86_64", "avx2"),
    ("fpu sse2 sse4_1", "x86_64", "x86-64"),
    ("", "aarch64", "arm64"),
])
def test_auto_reads_the_instruction_set_from_cpuinfo(flags: str, machine: str, isa: str) -> None:
    assert detect(f"processor\t: 0\nflags\t\t: {flags}\n", machine) == isa
