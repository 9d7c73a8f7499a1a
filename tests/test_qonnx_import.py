"""QONNX files (Quant, BipolarQuant, Trunc, channels-last wrappers, any width) as given quantization, checked
against qonnx's own executor on the original file; recipes/digits-qonnx end to end as C, QDQ ONNX and FPGA logic."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import copy_recipes
from qonnx_runtime import run_qonnx

pytest.importorskip("qonnx")
import onnx
from onnx import TensorProto, helper, numpy_helper

from dabuild.capability import discover_capabilities
from dabuild.cli import main
from dabuild.errors import BuildError, UsageError
from dabuild.ir.interpreter import run
from dabuild.ir.passes import optimize
from dabuild.progress import Progress
from dabuild.qir.reference import run_quantized
from dabuild.quant.calibrate import calibrate
from dabuild.quant.quantize import quantize
from dabuild.trace.onnx_frontend import OnnxTracer
from dabuild.tune.space import build_space

REPO = Path(__file__).resolve().parent.parent
DIGITS = np.load(REPO / "recipes" / "digits" / "data.npz")
X = DIGITS["x_test"][:80].astype(np.float32)
CAPABILITIES = discover_capabilities()
DOMAIN = "qonnx.custom_op.general"


def recipe_module():
    spec = importlib.util.spec_from_file_location("make_model", REPO / "recipes" / "digits-qonnx" / "make_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def traced(path: Path, shape: tuple) -> object:
    return optimize(OnnxTracer(str(path), {"x": (None, *shape)}).trace())


def lowered(graph, x: np.ndarray, capability: str):
    stats = calibrate(graph, [{"x": x}], Progress.silent())
    return quantize(graph, stats, build_space(graph, CAPABILITIES[capability]).default())


def steps(got: np.ndarray, expected: np.ndarray, scale: float) -> int:
    return int(np.round(np.abs(got.astype(np.float64) - expected).max() / scale))


# dabuild's integer path rounds half away from zero (QONNX HALF_UP): bit-exact. Brevitas's ROUND (half to even)
# differs on exact ties, which power-of-two requantization meets often: one step per layer at most.
@pytest.mark.parametrize("weight_bits, activation_bits, per_channel, rounding, most_steps", [
    (6, 8, True, "ROUND", 1), (3, 5, False, "HALF_UP", 0), (12, 10, True, "ROUND", 1)])
def test_brevitas_style_mlps_of_any_width_agree_with_qonnx(weight_bits, activation_bits, per_channel, rounding,
                                                           most_steps, tmp_path):
    make = recipe_module()
    trained = np.load(REPO / "recipes" / "digits" / "weights.npz")
    path = tmp_path / "model.onnx"
    onnx.save(make.qonnx_mlp([trained[f"w{i}"] for i in (1, 2, 3)], [trained[f"b{i}"] for i in (1, 2, 3)],
                             DIGITS["x_train"], weight_bits, activation_bits, per_channel, rounding), path)
    expected = run_qonnx(path, X)
    graph = traced(path, (64,))
    assert {given.dtype for given in graph.given.values()} == {f"int{weight_bits}"}
    assert np.array_equal(run(graph, {"x": X})[graph.outputs[0]], expected)
    for capability in ("da4ml", "onnxruntime"):  # power-of-two scales: straight onto the hdl target's types
        qgraph = lowered(graph, X, capability)
        assert qgraph.input_params.dtype == f"uint{activation_bits}"
        assert steps(run_quantized(qgraph, X), expected, qgraph.output_params.scale) <= most_steps


def single_node_model(node: onnx.NodeProto, initializers: list, shape: list[int]) -> onnx.ModelProto:
    graph = helper.make_graph([node], "one", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(DOMAIN, 1)])


def scalars(**values: float) -> list:
    return [numpy_helper.from_array(np.asarray(v, np.float32), name) for name, v in values.items()]


def test_trunc_to_nearest_agrees_with_qonnx(tmp_path):
    node = helper.make_node("Trunc", ["x", "s", "z", "bi", "bo"], ["y"], domain=DOMAIN, rounding_mode="ROUND")
    onnx.save(single_node_model(node, scalars(s=0.125, z=0.0, bi=9.0, bo=6.0), [1, 16]), tmp_path / "m.onnx")
    x = np.round(np.random.default_rng(1).uniform(-16, 16, (60, 16)) * 8) / 8
    graph = traced(tmp_path / "m.onnx", (16,))
    fake_quant = graph.nodes[0]
    assert fake_quant.attrs["scale"] == [1.0] and fake_quant.attrs["bits"] == 6
    assert np.array_equal(run(graph, {"x": x.astype(np.float32)})["y"], run_qonnx(tmp_path / "m.onnx", x))


def test_bipolar_weights_and_channels_last_conv_agree_with_qonnx(tmp_path):
    rng = np.random.default_rng(2)
    weight = rng.normal(size=(4, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Quant", ["x", "xs", "z", "xb"], ["xq"], domain=DOMAIN, signed=1, narrow=0),
             helper.make_node("BipolarQuant", ["w", "ws"], ["wq"], domain=DOMAIN),
             helper.make_node("Conv", ["xq", "wq"], ["c"], domain="qonnx.custom_op.channels_last",
                              kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1], dilations=[1, 1], group=1),
             helper.make_node("Quant", ["c", "ys", "z", "yb"], ["y"], domain=DOMAIN, signed=1, narrow=0)]
    initializers = [numpy_helper.from_array(weight, "w"), *scalars(xs=0.25, z=0.0, xb=4.0, ws=0.5, ys=0.5, yb=8.0)]
    graph = helper.make_graph(nodes, "nhwc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5, 5, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, 5, 4])], initializers,
                              value_info=[helper.make_tensor_value_info("xq", TensorProto.FLOAT, [1, 5, 5, 3]),
                                          helper.make_tensor_value_info("wq", TensorProto.FLOAT, [4, 3, 3, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(DOMAIN, 1),
                                                   helper.make_opsetid("qonnx.custom_op.channels_last", 1)])
    onnx.save(model, tmp_path / "m.onnx")
    x = rng.uniform(-2, 2, (20, 5, 5, 3)).astype(np.float32)
    expected = run_qonnx(tmp_path / "m.onnx", x)
    traced_graph = traced(tmp_path / "m.onnx", (5, 5, 3))
    [given] = traced_graph.given.values()
    assert (given.dtype, given.narrow) == ("int2", True)
    assert np.array_equal(run(traced_graph, {"x": x})["y"], expected)
    qgraph = lowered(traced_graph, x, "da4ml")
    assert steps(run_quantized(qgraph, x), expected, 0.5) <= 1


@pytest.mark.parametrize("change, error, message", [
    (dict(bits=20.0), BuildError, "parameter bit width: int20 .* nearest representable: int16"),
    (dict(bits=4.5), UsageError, "parameter bit_width: 4.5 is not an integer; nearest representable: 4"),
    (dict(rounding_mode="UP"), UsageError, "parameter rounding_mode: 'UP' .* nearest representable: CEIL"),
    (dict(rounding_mode="FLOOR"), BuildError, "parameter rounding: 'floor' is implemented by no target"),
    (dict(scale=0.3), BuildError, ("parameter scale: 0.3 is not a power of two, which capability 'da4ml' needs "
                                  r"\(scheme pot\); nearest representable: 2\*\*-2 = 0.25")),
])
def test_unrepresentable_qonnx_quantization_is_refused_naming_node_parameter_and_nearest(change, error, message,
                                                                                         tmp_path):
    attrs = {"signed": 1, "narrow": 0, "rounding_mode": change.get("rounding_mode", "ROUND")}
    node = helper.make_node("Quant", ["x", "s", "z", "b"], ["y"], name="act_quant", domain=DOMAIN, **attrs)
    values = scalars(s=change.get("scale", 0.25), z=0.0, b=change.get("bits", 8.0))
    onnx.save(single_node_model(node, values, [1, 16]), tmp_path / "m.onnx")
    with pytest.raises(error, match=f"act_quant.*{message}"):
        lowered(traced(tmp_path / "m.onnx", (16,)), np.zeros((4, 16), np.float32), "da4ml")


@pytest.mark.parametrize("op, inputs, missing, what", [
    ("Quant", ["x", "s", "z", "b"], 1, "scale"),
    ("Quant", ["x", "s", "z", "b"], 3, "bit_width"),
    ("Trunc", ["x", "s", "z", "bi", "bo"], 1, "scale"),  # was reported as a NaN scale
])
def test_an_omitted_required_qonnx_input_is_refused_naming_it(op, inputs, missing, what, tmp_path):
    values = dict(s=0.25, z=0.0, b=8.0, bi=9.0, bo=6.0)
    named = [name if i != missing else "" for i, name in enumerate(inputs)]
    node = helper.make_node(op, named, ["y"], name="quantizer", domain=DOMAIN, rounding_mode="ROUND")
    present = {name: values[name] for name in named[1:] if name}
    onnx.save(single_node_model(node, scalars(**present), [1, 16]), tmp_path / "m.onnx")
    with pytest.raises(UsageError, match=rf"'quantizer'.*its {what} \(input {missing}\) is missing, which {op} needs"):
        traced(tmp_path / "m.onnx", (16,))


def test_bipolar_activations_are_refused(tmp_path):
    node = helper.make_node("BipolarQuant", ["x", "s"], ["y"], name="signs", domain=DOMAIN)
    onnx.save(single_node_model(node, scalars(s=1.0), [1, 16]), tmp_path / "m.onnx")
    with pytest.raises(UsageError, match="'signs'.*sign function.*nearest representable: Quant with bit_width 2"):
        traced(tmp_path / "m.onnx", (16,))


@pytest.mark.slow
def test_digits_qonnx_recipe_builds_c_onnx_and_hdl_as_given(tmp_path, cache_dir):
    recipe = copy_recipes(tmp_path, "digits", "digits-qonnx") / "digits-qonnx"
    assert main(["build", str(recipe), "--build-dir", str(tmp_path / "build"), "-q"]) == 0
    build = tmp_path / "build" / "digits-qonnx"
    for target in ("mcu", "ort", "fpga"):
        assert json.loads((build / f"check-{target}" / "report.json").read_text())["ok"]
    metrics = json.loads((build / "tune-da4ml" / "metrics.json").read_text())
    assert metrics["strategy"] == "given" and metrics["trials"] == 1
    expected = run_qonnx(recipe / "model.onnx", DIGITS["x_test"])
    assert metrics["quantized"] == pytest.approx(float(np.mean(expected.argmax(1) == DIGITS["y_test"])), abs=0.005)


@pytest.mark.slow
def test_a_real_brevitas_export_agrees_with_qonnx(tmp_path):
    """Brevitas's own export_qonnx (QuantIdentity, 6-bit fixed-point QuantLinear, QuantReLU, output quantizer)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("brevitas")
    pytest.importorskip("onnxoptimizer")
    import brevitas.nn as qnn
    from brevitas.export import export_qonnx
    from brevitas.quant import Int8ActPerTensorFixedPoint, Int8WeightPerTensorFixedPoint, Uint8ActPerTensorFixedPoint

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        qnn.QuantIdentity(act_quant=Uint8ActPerTensorFixedPoint, return_quant_tensor=True),
        qnn.QuantLinear(64, 16, bias=True, weight_quant=Int8WeightPerTensorFixedPoint, weight_bit_width=6,
                        return_quant_tensor=True),
        qnn.QuantReLU(act_quant=Uint8ActPerTensorFixedPoint, return_quant_tensor=True),
        qnn.QuantLinear(16, 10, bias=True, weight_quant=Int8WeightPerTensorFixedPoint, weight_bit_width=6,
                        output_quant=Int8ActPerTensorFixedPoint)).eval()
    path = tmp_path / "brevitas.onnx"
    export_qonnx(model, torch.zeros(1, 64), export_path=str(path))
    expected = run_qonnx(path, X)
    name = onnx.load(path).graph.input[0].name
    graph = optimize(OnnxTracer(str(path), {name: (None, 64)}).trace())
    assert {given.dtype for given in graph.given.values()} == {"int6"}
    assert np.array_equal(run(graph, {name: X})[graph.outputs[0]], expected)
    stats = calibrate(graph, [{name: X}], Progress.silent())
    qgraph = quantize(graph, stats, build_space(graph, CAPABILITIES["da4ml"]).default())
    assert steps(run_quantized(qgraph, X), expected, qgraph.output_params.scale) <= 1
