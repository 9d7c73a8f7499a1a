"""Integer lowering: rounding rules, requantization, saturation, relu, files, and int8 accuracy on digits.

The helpers `mlp_graph` and `lower` are shared with the C target and check tests.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from dabuild.capability import CapabilitySpec, load_capability
from dabuild.errors import BuildError
from dabuild.ir import Graph, Node, TensorSpec
from dabuild.ir.interpreter import run
from dabuild.progress import Progress
from dabuild.qir.qgraph import QGraph, QuantParams
from dabuild.qir.reference import requantize, run_integer, run_quantized
from dabuild.quant.calibrate import Stats, calibrate
from dabuild.quant.config import NodeConfig, QuantConfig
from dabuild.quant.defaults import default_config
from dabuild.quant.quantize import quantize, quantize_multiplier
from dabuild.resources import data_dir

REPO = Path(__file__).resolve().parents[2]
C_CAPABILITY = load_capability(data_dir("capabilities") / "c.yaml")


def mlp_graph(sizes: list[int], activations: list[str], seed: int = 0) -> Graph:
    """A random dense MLP: sizes [in, h1, ..., out], one activation ("relu"/"none") per layer."""
    rng = np.random.default_rng(seed)
    nodes, constants, source = [], {}, "x"
    for i, (n_in, n_out, act) in enumerate(zip(sizes, sizes[1:], activations), start=1):
        constants[f"w{i}"] = rng.normal(0, 1 / np.sqrt(n_in), (n_in, n_out)).astype(np.float32)
        constants[f"b{i}"] = rng.normal(0, 0.1, n_out).astype(np.float32)
        nodes.append(Node(f"fc{i}", "dense", [source, f"w{i}", f"b{i}"], [f"h{i}"], {"activation": act}))
        source = f"h{i}"
    return Graph([TensorSpec("x", (None, sizes[0]))], [source], nodes, constants)


def lower(graph: Graph, x: np.ndarray, granularity: str = "per_tensor",
          capability: CapabilitySpec = C_CAPABILITY) -> QGraph:
    """Calibrate on `x` in batches and quantize with the capability's default choices."""
    stats = calibrate(graph, ({"x": x[i:i + 64]} for i in range(0, len(x), 64)), Progress.silent())
    config = default_config(graph, capability)
    for name, node in config.nodes.items():
        if node.weight is not None:
            config.nodes[name] = dataclasses.replace(node, weight=dataclasses.replace(node.weight, granularity=granularity))
    return quantize(graph, stats, config)


def one_dense(weight: np.ndarray, bias: np.ndarray, x_range: tuple[float, float], y_range: tuple[float, float],
              activation: str = "none") -> QGraph:
    """A single dense layer lowered from hand-picked ranges (no calibration data needed)."""
    graph = Graph([TensorSpec("x", (None, weight.shape[0]))], ["y"],
                  [Node("fc", "dense", ["x", "w", "b"], ["y"], {"activation": activation})],
                  {"w": weight.astype(np.float32), "b": bias.astype(np.float32)})
    return quantize(graph, Stats({"x": x_range, "y": y_range}), default_config(graph, C_CAPABILITY))


def test_requantize_is_within_one_step_of_float_and_rounds_ties_away_from_zero() -> None:
    rng = np.random.default_rng(1)
    real = np.exp(rng.uniform(np.log(1e-7), np.log(0.99), 2000))
    accumulator = rng.integers(-(2**31), 2**31 - 1, 2000)
    multiplier, shift = quantize_multiplier(real, "test")
    got = requantize(accumulator, multiplier, shift)
    assert np.max(np.abs(got - accumulator * real)) <= 1.0
    half = np.array([2**30], dtype=np.int32), np.array([31], dtype=np.int32)  # exactly 0.5
    assert requantize(np.array([3, -3, 1, -1, 2, -2]), *half).tolist() == [2, -2, 1, -1, 1, -1]


def test_quantize_multiplier_keeps_a_q31_mantissa() -> None:
    multiplier, shift = quantize_multiplier(np.array([0.5, 0.75, 1.0 - 1e-12, 3e-3]), "test")
    assert np.all(multiplier >= 2**30) and np.all(multiplier.astype(np.int64) < 2**31)
    assert np.allclose(multiplier / 2.0 ** shift.astype(np.float64), [0.5, 0.75, 1.0, 3e-3], rtol=1e-9)


def test_bias_is_rounded_half_away_from_zero_in_accumulator_units() -> None:
    # Input range [0, 255] gives scale 1; a weight peak of 127 gives weight scale 1: bias units are 1.0.
    weight = np.full((2, 4), 127.0)
    qgraph = one_dense(weight, np.array([2.5, -2.5, 0.49, -7.5]), (0.0, 255.0), (-10.0, 10.0))
    layer = qgraph.layers[0]
    assert qgraph.input_params == QuantParams(1.0, -128)
    assert layer.weight_scale.tolist() == [1.0]
    assert layer.bias.tolist() == [3, -3, 0, -8]


def test_outputs_saturate_at_the_int8_limits() -> None:
    qgraph = one_dense(np.array([[127.0, -127.0]]), np.zeros(2), (-1.0, 1.0), (-1.0, 1.0))
    y = run_integer(qgraph, np.array([[127], [-128], [0]], dtype=np.int8))
    zero = qgraph.output_params.zero_point
    assert y.tolist() == [[127, -128], [-128, 127], [zero, zero]]


def test_fused_relu_clamps_at_the_output_zero_point() -> None:
    rng = np.random.default_rng(2)
    weight = rng.normal(size=(8, 6))
    plain = one_dense(weight, np.zeros(6), (-3.0, 3.0), (-4.0, 4.0))
    fused = one_dense(weight, np.zeros(6), (-3.0, 3.0), (-4.0, 4.0), activation="relu")
    x = rng.integers(-128, 128, (200, 8)).astype(np.int8)
    zero = fused.output_params.zero_point
    assert zero != -128  # the range includes negatives, so the clamp is not just saturation
    assert np.array_equal(run_integer(fused, x), np.maximum(run_integer(plain, x), zero))


def test_standalone_relu_is_a_clamp_in_its_input_domain() -> None:
    graph = mlp_graph([5, 7], ["none"])
    graph.nodes.append(Node("act", "relu", ["h1"], ["y"], {}))
    graph.outputs = ["y"]
    qgraph = lower(graph, np.random.default_rng(3).normal(size=(128, 5)).astype(np.float32))
    x = np.random.default_rng(4).integers(-128, 128, (50, 5)).astype(np.int8)
    trace = run_integer(qgraph, x, keep_intermediates=True)
    assert qgraph.output_params == qgraph.tensors["h1"].params
    assert np.array_equal(trace["y"], np.maximum(trace["h1"], qgraph.output_params.zero_point))


def test_input_quantization_rounds_ties_away_and_bounds_everything() -> None:
    params = QuantParams(1.0, 0)
    x = np.array([0.5, -0.5, 1.5, 2.5, -2.5, 0.49, 1e30, -1e30, np.nan, np.inf])
    assert params.quantize(x).tolist() == [1, -1, 2, 3, -3, 0, 127, -128, -128, 127]
    assert params.dequantize(np.array([-128, 127], dtype=np.int8)).tolist() == [-128.0, 127.0]


def _dequantized_by_arithmetic(params: QuantParams, q: np.ndarray) -> np.ndarray:
    """int -> float32 step by step, as model_forward_float does in C (the small arrays' way)."""
    return (q.astype(np.int32) - np.int32(params.zero_point)).astype(np.float32) * np.float32(params.scale)


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_dequantizing_by_table_gives_the_arithmetics_bits_in_its_memory_order(dtype: str) -> None:
    """A large one-byte tensor is dequantized by looking values up: the same floats, laid out in memory as the
    arithmetic lays them out (as the interpreters leave a tensor: channels last under NCHW axes, or a slice),
    so a sum over the result adds in the same order either way."""
    rng = np.random.default_rng(4)
    info = np.iinfo(dtype)
    params = QuantParams(0.0371, -7 if dtype == "int8" else 131, dtype)
    channels_last = rng.integers(info.min, info.max + 1, (2, 9, 1, 64, 33), dtype=dtype)
    for q in (channels_last, channels_last.transpose(0, 4, 1, 2, 3), channels_last[:, ::2], channels_last[..., 1:]):
        table, arithmetic = params.dequantize(q), _dequantized_by_arithmetic(params, q)
        assert table.dtype == np.float32 and np.array_equal(table, arithmetic)
        assert [s for d, s in zip(table.shape, table.strides) if d > 1] == \
            [s for d, s in zip(arithmetic.shape, arithmetic.strides) if d > 1]
        assert float(np.sum(table, dtype=np.float64)).hex() == float(np.sum(arithmetic, dtype=np.float64)).hex()


def test_calibration_streams_batches_to_the_same_ranges_as_one_pass() -> None:
    graph = mlp_graph([6, 5, 3], ["relu", "none"])
    x = np.random.default_rng(5).normal(size=(300, 6)).astype(np.float32)
    stats = calibrate(graph, ({"x": x[i:i + 32]} for i in range(0, 300, 32)), Progress.silent())
    everything = run(graph, {"x": x}, keep_intermediates=True)
    assert set(stats.ranges) == {"x", "h1", "h2"}
    for name, (lo, hi) in stats.ranges.items():
        assert (lo, hi) == (float(everything[name].min()), float(everything[name].max()))


def test_stats_config_and_qgraph_round_trip_through_files_byte_stably(tmp_path: Path) -> None:
    graph = mlp_graph([6, 5, 3], ["relu", "none"])
    x = np.random.default_rng(6).normal(size=(100, 6)).astype(np.float32)
    stats = calibrate(graph, [{"x": x}], Progress.silent())
    config = default_config(graph, C_CAPABILITY)
    qgraph = quantize(graph, stats, config)
    first, second = tmp_path / "a", tmp_path / "b"
    for folder in (first, second):
        folder.mkdir()
        stats.save(folder)
        config.save(folder / "quant_config.json")
        qgraph.save(folder)
    for name in ("stats.npz", "quant_config.json", "qgraph.json", "qweights.npz"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    assert Stats.load(first) == stats
    assert QuantConfig.load(first / "quant_config.json") == config
    x_q = qgraph.input_params.quantize(x)
    assert np.array_equal(run_integer(QGraph.load(first), x_q), run_integer(qgraph, x_q))


def test_config_hash_is_stable_and_follows_the_choices() -> None:
    graph = mlp_graph([4, 3], ["none"])
    config = default_config(graph, C_CAPABILITY)
    assert config.content_hash() == default_config(graph, C_CAPABILITY).content_hash()
    node = config.nodes["fc1"]
    changed = QuantConfig({"fc1": dataclasses.replace(node, weight=dataclasses.replace(node.weight, granularity="per_channel"))})
    assert changed.content_hash() != config.content_hash()
    # the hash is of the canonical JSON of to_dict(), which saved configs (and so stored hashes) are written from
    odd = QuantConfig({'b"é': node, "a": NodeConfig(None, None), **config.nodes})
    assert odd.canonical_json() == json.dumps(odd.to_dict(), sort_keys=True, separators=(",", ":"))


def test_default_config_names_the_node_when_the_capability_cannot_serve_it() -> None:
    graph = mlp_graph([4, 3], ["none"])
    no_int8 = C_CAPABILITY.model_copy(deep=True)
    no_int8.ops["dense"].weight.dtype = ["int32"]  # wider than any integer type dabuild lowers
    with pytest.raises(BuildError, match=r"node 'fc1'.*int32.*lowers only int2\.\.int16"):
        default_config(graph, no_int8)
    no_weights = C_CAPABILITY.model_copy(deep=True)
    no_weights.ops["dense"].weight = None
    with pytest.raises(BuildError, match=r"node 'fc1'.*does not allow weight"):
        default_config(graph, no_weights)
    graph.nodes.append(Node("ratio", "div", ["h1", "h1"], ["y"], {}))  # div has no integer lowering
    with pytest.raises(BuildError, match=r"node 'ratio'.*'div'"):
        default_config(graph, C_CAPABILITY)


def test_per_channel_weights_get_one_multiplier_per_output() -> None:
    graph = mlp_graph([10, 8, 4], ["relu", "none"], seed=7)
    graph.constants["w1"][:, 0] *= 50  # one loud channel: per-tensor scales would drown the others
    x = np.random.default_rng(8).normal(size=(256, 10)).astype(np.float32)
    per_tensor, per_channel = lower(graph, x), lower(graph, x, "per_channel")
    assert [len(layer.multiplier) for layer in per_channel.layers] == [8, 4]
    assert [len(layer.multiplier) for layer in per_tensor.layers] == [1, 1]
    reference = run(graph, {"x": x})["h2"]
    error = {name: np.abs(run_quantized(q, x) - reference).mean()
             for name, q in (("tensor", per_tensor), ("channel", per_channel))}
    assert error["channel"] < error["tensor"]


def test_int8_digits_mlp_is_within_two_percent_of_float() -> None:
    from dabuild.ir.passes import optimize
    from dabuild.trace.base import load_model, trace_model

    digits = REPO / "recipes" / "digits"
    model = load_model(f"{digits / 'model.py'}:build", digits / "weights.npz")
    graph = optimize(trace_model(model, "numpy", {"x": (None, 64)}))
    assert [(n.op, n.attrs.get("activation")) for n in graph.nodes] == [("dense", "relu"), ("dense", "relu"),
                                                                        ("dense", "none")]
    data = np.load(digits / "data.npz")
    qgraph = lower(graph, data["x_train"][:512])
    labels = data["y_test"]
    float_accuracy = np.mean(run(graph, {"x": data["x_test"]})[graph.outputs[0]].argmax(1) == labels)
    int8_accuracy = np.mean(run_quantized(qgraph, data["x_test"]).argmax(1) == labels)
    assert float_accuracy > 0.9
    assert int8_accuracy >= float_accuracy - 0.02
