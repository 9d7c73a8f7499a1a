"""Integer types of 2 to 16 bits, signed and unsigned, through the whole integer path.

dtypes parse by name; the integer reference is exact for every width (checked against a re-implementation
in Python integers of what each dense layer defines); da4ml's DAIS program of an MLP with mixed narrow
widths equals the integer reference; targets whose kernels cannot run a width refuse it by layer and type.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from test_quantize import mlp_graph

from dabuild.capability import load_capability
from dabuild.errors import BuildError
from dabuild.ir.graph import Graph
from dabuild.progress import Progress
from dabuild.qir.dtypes import accumulator_max, int_type, is_int_type, type_names
from dabuild.qir.fixed_point import requantize
from dabuild.qir.qgraph import QGraph
from dabuild.qir.reference import quantize_input, run_integer
from dabuild.quant.calibrate import calibrate
from dabuild.quant.config import NodeConfig, QuantChoice, QuantConfig
from dabuild.quant.quantize import quantize
from dabuild.resources import data_dir

DA4ML = load_capability(data_dir("capabilities") / "da4ml.yaml")


def test_names_parse_to_signedness_width_range_and_storage() -> None:
    for name in type_names():
        dtype = int_type(name)
        assert dtype.name == name and is_int_type(name)
        assert dtype.qmax - dtype.qmin + 1 == dtype.levels == 2**dtype.bits
        storage = np.iinfo(dtype.storage)
        assert storage.min <= dtype.qmin and dtype.qmax <= storage.max
        assert np.iinfo(dtype.storage).bits == (8 if dtype.bits <= 8 else 16)
        assert (storage.min < 0) == dtype.signed == (dtype.qmin < 0)
    assert len(type_names()) == 15 + 16
    assert (int_type("int5").qmin, int_type("int5").qmax, int_type("int5").storage) == (-16, 15, "int8")
    assert (int_type("uint8").qmin, int_type("uint8").qmax, int_type("uint8").storage) == (0, 255, "uint8")
    assert (int_type("int12").storage, int_type("uint16").qmax, int_type("uint1").qmax) == ("int16", 65535, 1)


@pytest.mark.parametrize("name", ["int1", "int33", "uint0", "uint33", "int08", "fp16", "int", "Int8", "int-4"])
def test_unknown_names_are_refused_with_the_known_ones(name: str) -> None:
    assert not is_int_type(name)
    with pytest.raises(BuildError, match=rf"unknown integer dtype '{name}' \(dabuild lowers int2\.\.int16 and "
                                         r"uint1\.\.uint16\)"):
        int_type(name)


def test_int17_to_int32_name_only_the_exact_tensors_of_given_models() -> None:
    """HGQ2 keeps accumulators at full width: int_type takes them, but tuning never offers them."""
    assert (int_type("int17").bits, int_type("uint32").qmax) == (17, 2**32 - 1)
    assert not is_int_type("int17") and "int17" not in type_names()


def test_accumulators_are_int32_up_to_8_bits_and_wider_beyond() -> None:
    assert accumulator_max("int8", "int4") == accumulator_max("uint8") == 2**31 - 1
    assert accumulator_max("int8", "int9") > 2**52


def test_requantize_is_exact_where_the_product_leaves_int64() -> None:
    """round(acc * m / 2**s), half away from zero, against Python integers: accumulators of 16-bit types
    times Q31 multipliers need up to 84 bits (results beyond int64 saturate there), and power-of-two
    multipliers come out as plain shifts."""
    rng = np.random.default_rng(3)
    accumulator = rng.integers(-(2**52), 2**52, 2000)
    accumulator[:4] = [0, 1, -1, 2**52 - 1]
    multiplier = rng.integers(2**30, 2**31, 2000)
    multiplier[::3] = 2**30
    shift = rng.integers(1, 63, 2000)

    def reference(a: int, m: int, s: int) -> int:
        exact = Fraction(a * m, 2**s)
        rounded = min(int(abs(exact) + Fraction(1, 2)), 2**63 - 1)
        return rounded if exact >= 0 else -rounded

    expected = [reference(int(a), int(m), int(s)) for a, m, s in zip(accumulator, multiplier, shift)]
    assert requantize(accumulator, multiplier, shift).tolist() == expected
    narrow = accumulator >> 30  # the int64 fast path, on the same definition
    assert requantize(narrow, multiplier, shift).tolist() == [
        reference(int(a), int(m), int(s)) for a, m, s in zip(narrow, multiplier, shift)]


# ---------------------------------------------------------------- the integer reference at every width


def dense_relu_graph() -> Graph:
    return mlp_graph([12, 16, 4], ["relu", "none"], seed=2)


def lowered(graph: Graph, x: np.ndarray, choices: dict[str, tuple[str, str]], scheme: str) -> QGraph:
    """Every dense node with (weight dtype, activation dtype); weights sym or pot, activations `scheme`."""
    stats = calibrate(graph, ({"x": x[i:i + 64]} for i in range(0, len(x), 64)), Progress.silent())
    weight_scheme = "pot" if scheme == "pot" else "sym"
    config = QuantConfig({name: NodeConfig(QuantChoice(w, weight_scheme, "per_channel", "minmax"),
                                           QuantChoice(a, scheme, "per_tensor", "minmax"))
                          for name, (w, a) in choices.items()})
    return quantize(graph, stats, config)


def dense_by_definition(qgraph: QGraph, x_q: np.ndarray) -> np.ndarray:
    """Each dense layer as its fields define it, in Python integers and exact fractions: acc = sum (x - zp) w + b,
    y = clamp(round_half_away(acc * multiplier / 2**shift) + zp_y, output_min, output_max)."""
    values = x_q.astype(object)
    for layer in qgraph.layers:
        source, target = layer.params(qgraph), layer.output_params(qgraph)
        weight, bias = layer.weight.astype(object), layer.bias.astype(object)
        accumulator = (values - source.zero_point).dot(weight) + bias
        multiplier = np.broadcast_to(layer.multiplier.astype(object), accumulator.shape[1:])
        shift = np.broadcast_to(layer.shift.astype(object), accumulator.shape[1:])
        rows = []
        for row in accumulator:
            exact = [Fraction(int(a) * int(m), 2 ** int(s)) for a, m, s in zip(row, multiplier, shift)]
            rounded = [int(abs(e) + Fraction(1, 2)) * (1 if e >= 0 else -1) for e in exact]
            rows.append([min(max(r + target.zero_point, layer.output_min), layer.output_max) for r in rounded])
        values = np.array(rows, dtype=object)
        assert layer.output_min >= target.qmin and layer.output_max <= target.qmax
    return values.astype(np.int64)


@pytest.mark.parametrize(("weights", "activations", "scheme"), [
    (("int3", "int6"), ("int5", "uint6"), "pot"),
    (("int6", "int12"), ("uint6", "int16"), "pot"),
    (("int12", "int3"), ("int16", "int5"), "sym"),
    (("int16", "int16"), ("uint16", "int16"), "asym"),
], ids=["int3-int6/int5-uint6", "int6-int12/uint6-int16", "int12-int3/int16-int5", "int16/uint16-int16-asym"])
def test_run_integer_is_exact_and_within_each_range(weights: tuple[str, str], activations: tuple[str, str],
                                                    scheme: str) -> None:
    graph = dense_relu_graph()
    x = np.random.default_rng(4).normal(size=(300, 12)).astype(np.float32)
    qgraph = lowered(graph, x, dict(zip(["fc1", "fc2"], zip(weights, activations))), scheme)
    for layer, weight_dtype in zip(qgraph.layers, weights):
        dtype = int_type(weight_dtype)
        peak = np.abs(layer.weight.astype(np.int64)).max()
        # sym lands the largest weight on qmax; pot rounds the scale up to a power of two, so within a factor 2
        assert layer.weight.dtype == np.dtype(dtype.storage) and dtype.qmax // 2 < peak <= dtype.qmax
        assert peak == dtype.qmax or scheme == "pot"
    x_q = quantize_input(qgraph, x)
    trace = run_integer(qgraph, x_q, keep_intermediates=True)
    assert np.array_equal(trace[qgraph.output][:40].astype(np.int64), dense_by_definition(qgraph, x_q[:40]))
    for tensor, dtype in (("h1", activations[0]), ("h2", activations[1])):
        params = qgraph.tensors[tensor].params
        assert params.dtype == dtype and trace[tensor].dtype == np.dtype(int_type(dtype).storage)
        assert trace[tensor].min() >= params.qmin and trace[tensor].max() <= params.qmax
        spread = int(trace[tensor].max()) - int(trace[tensor].min())
        assert spread >= min(params.qmax, 2**12) // 4  # the range is used (relu halves it, pot up to twice more)
    # The integers mean what each layer computes in float: within one output step of its dequantized
    # input times its dequantized weights, clamped to what the output holds.
    for layer in qgraph.layers:
        source, target = layer.params(qgraph), layer.output_params(qgraph)
        weight = layer.weight * layer.weight_scale.reshape(1, -1)
        real = source.dequantize(trace[layer.inputs[0]]).astype(np.float64) @ weight \
            + layer.bias * source.scale * layer.weight_scale
        low, high = target.dequantize(np.array([layer.output_min, layer.output_max]))
        error = np.abs(target.dequantize(trace[layer.outputs[0]]) - np.clip(real, low, high)) / target.scale
        assert error.max() <= 1.0 + 1e-6


# ---------------------------------------------------------------- targets


def mixed_mlp() -> QGraph:
    """The da4ml capability's pot scheme with a different width per layer: the input (typed as fc1's
    activation) and the first hidden layer uint6, then int5, the output int10 (stored as int16)."""
    graph = mlp_graph([6, 10, 5, 3], ["relu", "relu", "none"], seed=5)
    x = np.random.default_rng(6).normal(size=(256, 6)).astype(np.float32)
    return lowered(graph, x, {"fc1": ("int3", "uint6"), "fc2": ("int6", "int5"), "fc3": ("int12", "int10")}, "pot")


def test_da4ml_offers_the_widths_it_documents() -> None:
    dense = DA4ML.for_op("dense")
    assert dense.weight.dtype[0] == dense.activation.dtype[0] == "int8"  # the default stays uniform int8
    assert {"int2", "int3", "int12", "int16"} <= set(dense.weight.dtype)
    assert {"int3", "uint3", "uint8", "int16"} <= set(dense.activation.dtype)
    assert all(is_int_type(name) for name in [*dense.weight.dtype, *dense.activation.dtype])


def test_hdl_program_of_mixed_widths_equals_the_integer_reference(tmp_path: Path) -> None:
    pytest.importorskip("da4ml")
    from dabuild.targets.hdl import HdlTarget

    qgraph = mixed_mlp()
    # A signed input type of its own (same qmax as uint6, so fc1's scales stay), narrower than its storage.
    qgraph.tensors["x"] = dataclasses.replace(qgraph.tensors["x"], params=dataclasses.replace(
        qgraph.input_params, dtype="int7"))
    target = HdlTarget(HdlTarget.Options(simulate="never"))
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    target.export(qgraph, artifact)
    params = qgraph.input_params
    x_q = np.random.default_rng(7).integers(params.qmin, params.qmax + 1, (3000, 6)).astype(params.storage)
    expected = run_integer(qgraph, x_q)
    actual = target.run(artifact, x_q, tmp_path)
    assert actual.dtype == expected.dtype == np.int16 and np.array_equal(actual, expected)
    assert len(np.unique(expected)) > 50 and expected.min() < 0


def test_the_c_target_refuses_widths_its_kernels_cannot_run(tmp_path: Path) -> None:
    from dabuild.targets.c import CTarget

    with pytest.raises(BuildError, match=r"layer 'fc1' \(dense\): the C target cannot run tensor 'x' of dtype "
                                         r"uint6 \(it runs int8, int16\)"):
        CTarget().export(mixed_mlp(), tmp_path / "c")
    graph = mlp_graph([6, 4], ["relu"], seed=5)
    x = np.random.default_rng(6).normal(size=(64, 6)).astype(np.float32)
    wide_weights = lowered(graph, x, {"fc1": ("int12", "int8")}, "sym")
    with pytest.raises(BuildError, match=r"layer 'fc1' \(dense\): the C target cannot run weights stored as int16"):
        CTarget().export(wide_weights, tmp_path / "c")


def test_the_onnx_target_refuses_widths_its_kernels_cannot_run() -> None:
    pytest.importorskip("onnx", reason="the onnx target needs dabuild[onnx]")
    from dabuild.targets.onnx.qdq import to_qdq_onnx

    with pytest.raises(BuildError, match=r"layer 'fc1' \(dense\): the onnx target cannot run tensor 'x' of dtype "
                                         r"uint6 \(it runs int8, uint8, int16\)"):
        to_qdq_onnx(mixed_mlp())


def test_the_nnef_target_refuses_widths_its_kernels_cannot_run() -> None:
    from dabuild.targets.nnef import build_document

    with pytest.raises(BuildError, match=r"layer 'fc1' \(dense\): the nnef target cannot run tensor 'x'"):
        build_document(mixed_mlp(), True)
