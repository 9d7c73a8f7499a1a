"""Bias correction: biases absorb the mean output error of quantized weights, from the calibration means."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from test_calibration import digits  # noqa: F401  (fixture: the digits MLP graph and its data)
from test_quantize import C_CAPABILITY, mlp_graph
from test_tuning import ONLY_DEFAULT, digits_recipe, digits_stages, tune  # noqa: F401  (digits_stages: fixture)

from dabuild.errors import BuildError
from dabuild.ir import Graph, Node, TensorSpec
from dabuild.ir.interpreter import run
from dabuild.ir.ops import OPS
from dabuild.progress import Progress
from dabuild.qir.qgraph import QGraph
from dabuild.qir.reference import run_quantized
from dabuild.quant.bias_correction import mean_output_error
from dabuild.quant.calibrate import Stats, calibrate
from dabuild.quant.config import NodeConfig, QuantChoice, QuantConfig
from dabuild.quant.defaults import default_config
from dabuild.quant.lowering import quantize_weight
from dabuild.quant.quantize import quantize

INT4 = QuantChoice("int4", "sym", "per_tensor", "minmax")
INT8_ACTIVATION = QuantChoice("int8", "asym", "per_tensor", "minmax")


def batches(x: np.ndarray, size: int = 128) -> list[dict[str, np.ndarray]]:
    return [{"x": x[i:i + size]} for i in range(0, len(x), size)]


def test_channel_means_from_the_histograms_match_the_data_and_survive_save_and_load(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    values = np.maximum(rng.normal(loc=[0.5, -1.0, 3.0, 0.0], scale=[1.0, 2.0, 0.1, 0.0], size=(6000, 4)), 0)
    stats = Stats()
    for start in range(0, len(values), 250):
        stats.observe("t", values[start:start + 250], axis=1)
    means = stats.channel_means("t")
    spread = values.max(axis=0) - values.min(axis=0)
    assert np.all(np.abs(means - values.mean(axis=0)) <= 1e-3 * spread + 1e-12), (means, values.mean(axis=0))
    stats.save(tmp_path)
    np.testing.assert_array_equal(Stats.load(tmp_path).channel_means("t"), means)


@pytest.mark.parametrize("groups", [1, 2])
def test_conv_mean_error_is_the_input_means_times_the_weight_error_summed_over_taps(groups: int) -> None:
    rng = np.random.default_rng(groups)
    channels, outputs = 4, 6
    weight = rng.normal(size=(outputs, channels // groups, 3, 3))
    weight_q, scale = quantize_weight(weight, INT4, "test", channel_axis=0)
    channel_means = rng.normal(size=channels) * 2
    # Constant over space, so every window sees the image's mean (the formula ignores border effects).
    x = np.broadcast_to(channel_means[None, :, None, None] + rng.normal(size=(64, channels, 1, 1)),
                        (64, channels, 9, 9))
    attrs = {"strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "groups": groups}
    conv = OPS["conv"]
    error = conv.run([x, weight_q * scale], attrs)[0] - conv.run([x, weight], attrs)[0]
    expected = mean_output_error(weight, weight_q, scale, 0, x.mean(axis=(0, 2, 3)), groups)
    np.testing.assert_allclose(error.mean(axis=(0, 2, 3)), expected, rtol=1e-6, atol=1e-9)


def dense_graph(rng: np.random.Generator) -> Graph:
    weight = rng.normal(0, 0.5, (16, 8)).astype(np.float32)
    bias = rng.normal(0, 0.1, 8).astype(np.float32)
    return Graph([TensorSpec("x", (None, 16))], ["y"], [Node("fc", "dense", ["x", "w", "b"], ["y"], {})],
                 {"w": weight, "b": bias})


def test_int4_dense_output_mean_error_shrinks_with_bias_correction() -> None:
    rng = np.random.default_rng(3)
    graph = dense_graph(rng)
    x = (rng.normal(size=(4096, 16)) + rng.uniform(1.0, 3.0, 16)).astype(np.float32)  # means far from 0
    stats = calibrate(graph, batches(x), Progress.silent())
    config = QuantConfig({"fc": NodeConfig(INT4, INT8_ACTIVATION)})
    reference = run(graph, {"x": x})["y"]

    def mean_error(bias_correction: bool) -> np.ndarray:
        return (run_quantized(quantize(graph, stats, config, bias_correction), x) - reference).mean(axis=0)

    plain, corrected = mean_error(False), mean_error(True)
    output_step = float(np.ptp(reference)) / 255
    assert np.abs(plain).mean() > 2 * output_step  # the weight error really does shift the mean
    assert np.abs(corrected).mean() < 0.25 * np.abs(plain).mean(), (corrected, plain)


def test_without_the_option_nothing_changes_and_with_it_only_biases_do() -> None:
    graph = mlp_graph([6, 10, 4], ["relu", "none"], seed=5)
    x = np.random.default_rng(6).normal(1.0, 1.0, size=(512, 6)).astype(np.float32)
    stats = calibrate(graph, batches(x), Progress.silent())
    config = default_config(graph, C_CAPABILITY)
    plain, corrected = quantize(graph, stats, config), quantize(graph, stats, config, bias_correction=True)
    assert [layer.name for layer in plain.layers] == [layer.name for layer in corrected.layers]
    for before, after in zip(plain.layers, corrected.layers):
        fields = {f.name for f in dataclasses.fields(before)} - {"bias"}
        for name in fields:
            np.testing.assert_array_equal(getattr(before, name), getattr(after, name))


def test_a_dense_input_without_feature_channels_in_the_statistics_is_named() -> None:
    graph = dense_graph(np.random.default_rng(7))
    x = np.random.default_rng(8).normal(size=(64, 16)).astype(np.float32)
    stats = Stats()
    stats.observe("x", x, axis=None)
    stats.observe("y", run(graph, {"x": x})["y"], axis=1)
    config = QuantConfig({"fc": NodeConfig(INT4, INT8_ACTIVATION)})
    quantize(graph, stats, config)  # per-tensor statistics serve plain lowering
    with pytest.raises(BuildError, match=r"node 'fc'.*bias correction.*input 'x'"):
        quantize(graph, stats, config, bias_correction=True)


def test_int8_digits_accuracy_with_bias_correction_is_within_a_point_of_without(
        digits: tuple[Graph, dict[str, np.ndarray]]) -> None:  # noqa: F811
    graph, data = digits
    stats = calibrate(graph, batches(data["x_train"][:512], 64), Progress.silent())
    config = default_config(graph, C_CAPABILITY)
    labels = data["y_test"]
    accuracy = {flag: float(np.mean(run_quantized(quantize(graph, stats, config, flag), data["x_test"]).argmax(1)
                                    == labels)) for flag in (False, True)}
    assert accuracy[True] >= accuracy[False] - 0.01, accuracy


def test_the_tune_stage_applies_the_recipe_option_to_the_graph_it_writes(
        digits_stages: tuple[Path, Path], tmp_path: Path) -> None:  # noqa: F811
    biases = {}
    for flag in (False, True):
        recipe = digits_recipe(space=ONLY_DEFAULT, max_trials=1, allow_miss=True, bias_correction=flag)
        tune(digits_stages, tmp_path / str(flag), recipe)
        biases[flag] = [layer.bias for layer in QGraph.load(tmp_path / str(flag) / "qgraph").layers
                        if hasattr(layer, "bias")]
    assert biases[False] and len(biases[False]) == len(biases[True])
    assert any(not np.array_equal(a, b) for a, b in zip(biases[False], biases[True]))


def test_trials_are_scored_with_the_correction_the_artifact_gets(
        digits_stages: tuple[Path, Path], tmp_path: Path) -> None:  # noqa: F811
    """The score of a trial is the score of the graph the stage writes: corrected when the option is on."""
    mse = {}
    for flag in (False, True):
        recipe = digits_recipe(space=ONLY_DEFAULT, max_trials=1, allow_miss=True, bias_correction=flag)
        mse[flag] = tune(digits_stages, tmp_path / str(flag), recipe, trials=tmp_path / "store")["history"][0]["mse"]
    assert mse[True] != mse[False]  # scored separately (not one trial-store entry for both) and differently
