"""Calibration: streaming histograms, the four range algorithms, per-channel statistics, memory, bad data."""

from __future__ import annotations

import contextlib
import dataclasses
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from test_quantize import C_CAPABILITY, mlp_graph

from dabuild.errors import BuildError, UsageError
from dabuild.ir import Graph, Node, TensorSpec
from dabuild.ir.interpreter import run
from dabuild.ir.memory import BUDGET, sample_bytes
from dabuild.ir.npz import write_npz
from dabuild.progress import Progress
from dabuild.qir.reference import run_quantized
from dabuild.quant.algorithms import ALGORITHMS
from dabuild.quant.calibrate import STATS_FILE, Stats, calibrate, channel_axes, histogram_bytes
from dabuild.quant.config import QuantConfig
from dabuild.quant.defaults import default_config
from dabuild.quant.histogram import BINS, Histogram
from dabuild.quant.quantize import quantize

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "recipes" / "digits"


def column_stats(values: np.ndarray, batch: int) -> Stats:
    """Stats of one tensor named "t" fed in batches of `batch` rows, channels on the last axis."""
    stats = Stats()
    for start in range(0, len(values), batch):
        stats.observe("t", values[start:start + batch], axis=values.ndim - 1)
    return stats


def with_activation_algorithm(config: QuantConfig, algorithm: str) -> QuantConfig:
    nodes = {name: dataclasses.replace(node, activation=dataclasses.replace(node.activation, algorithm=algorithm))
             for name, node in config.nodes.items()}
    return QuantConfig(nodes)


def test_rebinning_keeps_every_count_in_the_bin_a_single_pass_would_choose() -> None:
    rng = np.random.default_rng(0)
    # Each batch widens the range (and shifts it), forcing re-binning by several doublings.
    batches = [rng.uniform(0.0, 1.0, (2, 500)), rng.normal(-5, 2, (2, 700)), rng.uniform(40, 900, (2, 300)),
               np.full((2, 50), 3.25)]
    histogram = Histogram.empty(2)
    for batch in batches:
        histogram.add(batch)
    everything = np.concatenate(batches, axis=1)
    assert histogram.counts.sum(axis=1).tolist() == [everything.shape[1]] * 2
    for channel in range(2):
        expected = np.floor(everything[channel] / histogram.width[channel]).astype(np.int64) - histogram.offset[channel]
        assert np.array_equal(histogram.counts[channel], np.bincount(expected, minlength=BINS))
        assert (histogram.low[channel], histogram.high[channel]) == (everything[channel].min(), everything[channel].max())


def test_a_constant_channel_keeps_its_count_until_a_second_value_arrives() -> None:
    histogram = Histogram.empty(1)
    histogram.add(np.zeros((1, 100)))
    assert histogram.width[0] == 0 and histogram.counts[0, 0] == 100
    histogram.add(np.array([[-2.0, 6.0]]))
    bins = histogram.bins(0)
    assert bins.total == 102 and bins.counts[np.argmax(bins.counts)] == 100
    zero_bin = int(np.floor(0.0 / bins.width)) - bins.start
    assert bins.counts[zero_bin] == 100


@pytest.mark.parametrize("scheme", ["sym", "asym"])
def test_clipping_algorithms_drop_rare_outliers_and_minmax_keeps_them(scheme: str) -> None:
    rng = np.random.default_rng(1)
    values = np.concatenate([rng.normal(size=200_000), [30.0, -30.0, 29.0]])
    rng.shuffle(values)
    stats = column_stats(values.reshape(-1, 1), 4096)
    low, high = stats.range("t", "minmax", scheme)
    assert (low, high) == (-30.0, 30.0)
    for algorithm, bound in (("percentile", 5.0), ("entropy", 8.0), ("mse", 0.9 * 30)):
        low, high = stats.range("t", algorithm, scheme)
        assert 2.5 < high < bound and -bound < low < -2.5, (algorithm, low, high)


@pytest.mark.parametrize("scheme", ["sym", "asym"])
def test_on_uniform_data_every_algorithm_stays_near_minmax(scheme: str) -> None:
    values = np.random.default_rng(2).uniform(-1.0, 3.0, (100_000, 1))
    stats = column_stats(values, 10_000)
    reference = np.array(stats.range("t", "minmax", scheme))
    for algorithm in ALGORITHMS:
        got = np.array(stats.range("t", algorithm, scheme))
        assert np.allclose(got, reference, atol=0.01 * (reference[1] - reference[0])), (algorithm, got, reference)


def test_percentile_is_configurable_and_sym_takes_it_on_magnitudes() -> None:
    values = np.random.default_rng(3).uniform(-1.0, 1.0, (400_000, 1))
    stats = column_stats(values, 50_000)
    assert stats.range("t", "percentile", "sym", percentile=90.0)[1] == pytest.approx(0.9, abs=0.005)
    low, high = stats.range("t", "percentile", "asym", percentile=90.0)  # 5 % cut from each tail
    assert (low, high) == (pytest.approx(-0.9, abs=0.005), pytest.approx(0.9, abs=0.005))
    with pytest.raises(BuildError, match=r"tensor 't'.*percentile must be in"):
        stats.range("t", "percentile", "sym", percentile=0.0)
    with pytest.raises(BuildError, match=r"unknown calibration algorithm 'kl'.*minmax, percentile, entropy, mse"):
        stats.range("t", "kl")


def test_relu_outputs_are_not_clipped_by_their_spike_at_zero() -> None:
    values = np.maximum(np.random.default_rng(4).normal(size=(100_000, 1)), 0.0)
    stats = column_stats(values, 10_000)
    for algorithm in ALGORITHMS:
        low, high = stats.range("t", algorithm, "asym")
        assert 0.0 <= low < 1e-4 and 3.0 < high <= values.max(), (algorithm, low, high)


def test_per_channel_ranges_follow_each_channel() -> None:
    rng = np.random.default_rng(5)
    scales = np.array([0.1, 1.0, 25.0])
    values = rng.normal(size=(20_000, 3)) * scales
    values[17, 0] = 4.0  # one outlier, only in the quiet channel
    stats = column_stats(values, 1000)
    lows, highs = stats.channel_ranges("t", "minmax")
    assert np.array_equal(lows, values.min(axis=0)) and np.array_equal(highs, values.max(axis=0))
    _, clipped = stats.channel_ranges("t", "percentile", "sym", percentile=99.0)
    assert clipped[0] < 0.6 < highs[0]  # the outlier is gone from channel 0 ...
    assert np.allclose(clipped / scales, 2.576, rtol=0.05)  # ... and each channel keeps its own 99 % of |x|
    assert stats.range("t", "minmax") == (values.min(), values.max())


def test_channel_axes_are_features_for_dense_and_axis_1_for_nchw() -> None:
    rng = np.random.default_rng(6)
    graph = Graph([TensorSpec("x", (None, 3, 4, 4))], ["y"], [
        Node("conv", "conv", ["x", "k"], ["c"], {"pads": [1, 1, 1, 1]}),
        Node("act", "relu", ["c"], ["r"], {}),
        Node("flat", "flatten", ["r"], ["f"], {}),
        Node("fc", "dense", ["f", "w"], ["y"], {}),
    ], {"k": rng.normal(size=(6, 3, 3, 3)).astype(np.float32), "w": rng.normal(size=(96, 5)).astype(np.float32)})
    x = (rng.normal(size=(64, 3, 4, 4)) * np.array([1, 5, 9])[:, None, None]).astype(np.float32)
    stats = calibrate(graph, [{"x": x[:40]}, {"x": x[40:]}], Progress.silent())
    assert {name: stats.channel_axis(name) for name in ("x", "c", "r", "f", "y")} == dict.fromkeys("xcrfy", 1)
    lows, highs = stats.channel_ranges("x")
    assert np.array_equal(highs, x.max(axis=(0, 2, 3))) and np.array_equal(lows, x.min(axis=(0, 2, 3)))
    conv_out = run(graph, {"x": x}, keep_intermediates=True)["c"]
    assert np.array_equal(stats.channel_ranges("c")[1], conv_out.max(axis=(0, 2, 3)))
    sequence = channel_axes(Graph([TensorSpec("s", (None, 7, 8))], ["d"], [Node("fc", "dense", ["s", "w"], ["d"], {})],
                                  {"w": np.zeros((8, 2), dtype=np.float32)}),
                            {"s": (1, 7, 8), "d": (1, 7, 2)})
    assert sequence == {"s": 2, "d": 2}


def test_streamed_statistics_do_not_depend_on_the_batch_size() -> None:
    rng = np.random.default_rng(8)
    values = np.concatenate([rng.standard_t(3, size=(30_000, 2)), [[15.0, -9.0]]])
    one_pass = column_stats(values, len(values))
    for batch in (37, 1000):
        streamed = column_stats(values, batch)
        assert streamed == one_pass  # the same bins and counts, not merely close ones
        for algorithm in ALGORITHMS:
            for scheme in ("sym", "asym"):
                assert streamed.range("t", algorithm, scheme) == one_pass.range("t", algorithm, scheme)
                streamed_channels = streamed.channel_ranges("t", algorithm, scheme)
                assert np.array_equal(streamed_channels, one_pass.channel_ranges("t", algorithm, scheme))


def noisy_digits(x: np.ndarray, samples: int, batch: int, seed: int) -> Iterator[dict[str, np.ndarray]]:
    """`samples` rows made on the fly from the digits images plus noise: no batch outlives its step."""
    rng = np.random.default_rng(seed)
    for start in range(0, samples, batch):
        rows = x[rng.integers(0, len(x), min(batch, samples - start))]
        yield {"x": (rows + rng.normal(0, 0.05, rows.shape)).astype(np.float32)}


def test_stats_and_peak_memory_stay_flat_when_the_calibration_set_grows_tenfold(
        digits_graph: tuple[Graph, dict[str, np.ndarray]], tmp_path: Path) -> None:
    graph, data = digits_graph
    calibrate(graph, noisy_digits(data["x_train"], 256, 128, 0), Progress.silent())  # warm caches and imports
    peaks, sizes = {}, {}
    for samples in (512, 5120):
        tracemalloc.start()
        stats = calibrate(graph, noisy_digits(data["x_train"], samples, 128, 1), Progress.silent())
        peaks[samples] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        stats.save(tmp_path / str(samples))
        sizes[samples] = (tmp_path / str(samples) / STATS_FILE).stat().st_size
        assert stats.tensors["x"].whole.counts.sum() == samples * 64
    assert sizes[512] == sizes[5120]
    assert 0.8 <= peaks[5120] / peaks[512] <= 1.2, peaks


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_int8_digits_mlp_is_within_two_percent_of_float_with_every_algorithm(
        digits_graph: tuple[Graph, dict[str, np.ndarray]], algorithm: str) -> None:
    graph, data = digits_graph
    x = data["x_train"][:512]
    stats = calibrate(graph, ({"x": x[i:i + 64]} for i in range(0, len(x), 64)), Progress.silent())
    qgraph = quantize(graph, stats, with_activation_algorithm(default_config(graph, C_CAPABILITY), algorithm))
    labels = data["y_test"]
    float_accuracy = np.mean(run(graph, {"x": data["x_test"]})[graph.outputs[0]].argmax(1) == labels)
    int8_accuracy = np.mean(run_quantized(qgraph, data["x_test"]).argmax(1) == labels)
    assert int8_accuracy >= float_accuracy - 0.02, (algorithm, int8_accuracy, float_accuracy)


def test_quantize_takes_each_activation_range_from_its_algorithm() -> None:
    graph = mlp_graph([4, 6], ["none"], seed=9)
    rng = np.random.default_rng(10)
    x = rng.normal(size=(20_000, 4)).astype(np.float32)
    x[5] = 60.0  # one outlier row: minmax stretches the input scale for it, percentile does not
    stats = calibrate(graph, ({"x": x[i:i + 500]} for i in range(0, len(x), 500)), Progress.silent())
    config = default_config(graph, C_CAPABILITY)
    scales = {algorithm: quantize(graph, stats, with_activation_algorithm(config, algorithm)).input_params.scale
              for algorithm in ALGORITHMS}
    low, high = stats.range("x", "percentile", "asym")
    assert scales["minmax"] == pytest.approx((60.0 - float(x.min())) / 255, rel=1e-6)
    assert scales["percentile"] == pytest.approx((high - low) / 255, rel=1e-6)
    assert scales["percentile"] < scales["minmax"] / 5


def test_weights_take_their_exact_peak_with_minmax_and_a_clipped_one_with_mse() -> None:
    graph = mlp_graph([256, 64], ["none"], seed=11)
    graph.constants["w1"][0, 0] = 2.0  # one loud weight among 16384 of std 1/16
    stats = calibrate(graph, [{"x": np.random.default_rng(12).normal(size=(64, 256)).astype(np.float32)}],
                      Progress.silent())
    config = default_config(graph, C_CAPABILITY)
    node = config.nodes["fc1"]
    by_mse = QuantConfig({"fc1": dataclasses.replace(node, weight=dataclasses.replace(node.weight, algorithm="mse"))})
    minmax_scale = quantize(graph, stats, config).layers[0].weight_scale[0]
    mse_scale = quantize(graph, stats, by_mse).layers[0].weight_scale[0]
    assert minmax_scale == pytest.approx(2.0 / 127, rel=1e-6)
    assert 0.5 * minmax_scale < mse_scale < 0.99 * minmax_scale  # rounding 16383 weights finer beats one clip


def test_stats_with_histograms_round_trip_byte_stably(tmp_path: Path) -> None:
    graph = mlp_graph([6, 5, 3], ["relu", "none"])
    x = np.random.default_rng(13).normal(size=(300, 6)).astype(np.float32)
    stats = calibrate(graph, ({"x": x[i:i + 64]} for i in range(0, 300, 64)), Progress.silent())
    for folder in ("a", "b"):
        stats.save(tmp_path / folder)
    assert (tmp_path / "a" / STATS_FILE).read_bytes() == (tmp_path / "b" / STATS_FILE).read_bytes()
    loaded = Stats.load(tmp_path / "a")
    assert loaded == stats
    for algorithm in ALGORITHMS:
        assert loaded.range("h2", algorithm, "sym") == stats.range("h2", algorithm, "sym")
        assert np.array_equal(loaded.channel_ranges("h1", algorithm)[1], stats.channel_ranges("h1", algorithm)[1])


def test_stats_with_a_tensor_but_no_whole_tensor_histogram_are_refused_naming_the_file(tmp_path: Path) -> None:
    write_npz(tmp_path / STATS_FILE, {"range/t": np.array([-1.0, 2.0]), "axis/t": np.array([1])})
    with pytest.raises(BuildError, match=rf"{STATS_FILE}: tensor 't' has no whole-tensor histogram; recalibrate"):
        Stats.load(tmp_path)


def test_stats_holding_only_ranges_serve_minmax_and_ask_for_recalibration_otherwise(tmp_path: Path) -> None:
    write_npz(tmp_path / STATS_FILE, {"range/x": np.array([-1.0, 2.0])})
    stats = Stats.load(tmp_path)
    assert stats.range("x") == (-1.0, 2.0) and stats.range("x", scheme="sym") == (-2.0, 2.0)
    with pytest.raises(BuildError, match=r"tensor 'x'.*only its min/max.*recalibrate"):
        stats.range("x", "entropy")
    with pytest.raises(BuildError, match=r"no calibration statistics for tensor 'y'"):
        stats.range("y")


def test_nan_in_a_data_file_is_rejected_at_load_time_naming_file_and_key(tmp_path: Path) -> None:
    from dabuild.data import load_inputs

    x = np.ones((10, 6), dtype=np.float32)
    x[3, 2] = np.nan
    np.savez(tmp_path / "calib.npz", x_train=x)
    spec = dataclasses.make_dataclass("Spec", [("source", str), ("x", str), ("samples", object)])
    with pytest.raises(UsageError, match=r"calib\.npz: array 'x_train' has 1 NaN or infinite values"):
        load_inputs(spec(tmp_path / "calib.npz", "x_train", None), ["x"])


@pytest.mark.filterwarnings("ignore:.*encountered:RuntimeWarning")  # the overflow below is the point
def test_non_finite_values_during_calibration_name_the_tensor() -> None:
    graph = mlp_graph([6, 5, 3], ["relu", "none"])
    x = np.random.default_rng(14).normal(size=(64, 6)).astype(np.float32)
    poisoned = x.copy()
    poisoned[1, 1] = np.inf
    with pytest.raises(BuildError, match=r"graph input 'x' holds 1 NaN or infinite"):
        calibrate(graph, [{"x": x}, {"x": poisoned}], Progress.silent())
    graph.constants["w1"][:] = 3e38  # overflows float32 inside the first dense layer
    with pytest.raises(BuildError, match=r"tensor 'h1' \(output of node 'fc1', op dense\) holds \d+ NaN or infinite"):
        calibrate(graph, [{"x": x}], Progress.silent())


def test_no_calibration_batches_is_an_error() -> None:
    with pytest.raises(BuildError, match="no calibration samples"):
        calibrate(mlp_graph([4, 2], ["none"]), [], Progress.silent())


@pytest.mark.parametrize("layout", ["channels last", "channels first", "no channel axis"])
def test_native_histograms_count_exactly_what_numpy_counts(monkeypatch: pytest.MonkeyPatch, vector_path: int,
                                                          layout: str) -> None:
    """float32 tensors as the interpreter leaves them, big enough for two threads, in uneven batches; 820 pixels
    an image, so blocks of pixels end part way through a vector of them."""
    from dabuild.ir.kernels import native

    rng = np.random.default_rng(11)
    values = (rng.standard_t(3, size=(6, 20, 41, 150)) * rng.uniform(0.1, 10, 150)).astype(np.float32)
    values[2, 3, 4, 5] = 300.0  # a late outlier: windows widen and rebin
    values[:, :, :, 7] = 0.5  # a constant channel
    values[values < -1.5] = 0.0  # ReLU-like runs of zeros, set aside and counted at once
    values[0, 1, :, 9] = -0.0  # -0 counts in the bin of +0
    if layout == "channels last":
        values = values.transpose(0, 3, 1, 2)  # (N, C, H, W) seen over (N, H, W, C) memory, as after a conv
    axis = None if layout == "no channel axis" else 1

    def stats(batch: int) -> Stats:
        result = Stats()
        for start in range(0, len(values), batch):
            result.observe("t", values[start:start + batch], axis=axis)
        return result

    monkeypatch.delenv(native.SWITCH, raising=False)
    assert native.native_histogram() is not None
    compiled = [stats(batch) for batch in (1, 4)]
    monkeypatch.setenv(native.SWITCH, "0")
    reference = stats(6)
    assert compiled[0] == compiled[1] == reference


def test_native_histograms_split_among_more_threads_count_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """Channels split among 5 threads (as on a machine with 5 cores), each with its own whole-tensor
    sub-histogram merged after: numpy's counts exactly."""
    from dabuild.ir.kernels import native

    rng = np.random.default_rng(13)
    values = (rng.standard_normal((4, 96, 32, 32)) * rng.uniform(0.1, 10, (1, 96, 1, 1))).astype(np.float32)

    monkeypatch.delenv(native.SWITCH, raising=False)
    monkeypatch.setattr(native, "available_cores", lambda: 5)
    compiled = observed_twice(values)
    monkeypatch.setenv(native.SWITCH, "0")
    assert compiled == observed_twice(values)


def observed_twice(values: np.ndarray) -> Stats:
    """Stats of `values` (channels on axis 1) and of its first two samples times 3: a second batch that widens
    every channel's window."""
    result = Stats()
    result.observe("t", values, axis=1)
    result.observe("t", values[:2] * 3, axis=1)
    return result


@pytest.mark.parametrize("channels", [96, 20])
def test_channels_last_histograms_split_by_rows_count_the_same(monkeypatch: pytest.MonkeyPatch,
                                                               channels: int) -> None:
    """Channels-last memory on 16 cores: channel parts no narrower than a cache line, the rows in slices each
    with its own sub-histogram and extremes, merged after: numpy's counts and extremes exactly."""
    from dabuild.ir.kernels import native

    rng = np.random.default_rng(14)
    memory = (rng.standard_normal((8, 48, 60, channels)) * rng.uniform(0.1, 10, channels)).astype(np.float32)
    values = memory.transpose(0, 3, 1, 2)  # (N, C, H, W) over channels-last memory, as a conv leaves it

    monkeypatch.delenv(native.SWITCH, raising=False)
    monkeypatch.setattr(native, "available_cores", lambda: 16)
    monkeypatch.setattr(native, "SLICE_ROWS", 64)
    histogram = native.native_histogram()
    assert histogram is not None
    parts = histogram._parts(histogram.view(values, 1)[0])
    assert len({part[3] for part in parts}) > 1 and all(end - first >= 16 or channels < 16 for _, first, end, _ in parts)
    compiled = observed_twice(values)
    signed = memory.copy()
    signed[..., 3] = np.where(np.arange(8)[:, None, None] % 2, 0.0, -0.0)  # zeros of both signs, in both slices
    extremes = [histogram.extremes(histogram.view(signed.transpose(0, 3, 1, 2), 1)[0]) for _ in range(2)]
    monkeypatch.setattr(native, "available_cores", lambda: 1)
    whole = histogram.extremes(histogram.view(signed.transpose(0, 3, 1, 2), 1)[0])
    for low, high, _ in extremes:  # whatever the split: +0 where an extreme is zero
        assert low.tobytes() == whole[0].tobytes() and high.tobytes() == whole[1].tobytes()
        assert not np.signbit(low[3]) and not np.signbit(high[3])
    monkeypatch.setattr(native, "available_cores", lambda: 16)
    with_nan = memory.copy()
    with_nan[1, 2, 3, 4] = with_nan[7, 40, 1, 5] = np.nan  # in two slices: each part's count of them is summed
    with pytest.raises(BuildError, match="holds 2 NaN or infinite values"):
        Stats().observe("t", with_nan.transpose(0, 3, 1, 2), axis=1)
    monkeypatch.setenv(native.SWITCH, "0")
    assert compiled == observed_twice(values)


@pytest.mark.parametrize("channels", [2048, 150])
def test_channels_last_extremes_read_by_blocks_of_pixels_are_numpys(monkeypatch: pytest.MonkeyPatch,
                                                                     vector_path: int, channels: int) -> None:
    """Channels-last memory is read a block of pixels at a time (every tile of channels, then the channels left
    over, before the next block): each channel's min and max exactly numpy's, extremes in the first, a middle
    and the last block and in tiled and left-over channels, +0 where an extreme is zero, every NaN and
    infinity counted."""
    from dabuild.ir.kernels import native

    monkeypatch.delenv(native.SWITCH, raising=False)
    monkeypatch.setattr(native, "available_cores", lambda: 1)  # one part: every block in one call
    histogram = native.native_histogram()
    assert histogram is not None
    rng = np.random.default_rng(15)
    pixels = 301  # several blocks at either width, the last one short
    memory = rng.standard_normal((pixels, channels)).astype(np.float32)
    memory[0, 1], memory[pixels // 2, 2], memory[-1, -1], memory[-1, 0] = 50.0, -50.0, 60.0, -60.0
    memory[:, 3] = np.where(np.arange(pixels) % 2, 0.0, -0.0)  # zeros of both signs: the extremes are +0
    low, high, bad = histogram.extremes(histogram.view(memory, 1)[0])
    assert bad == 0
    assert low.tobytes() == (memory.min(axis=0) + np.float32(0)).tobytes()
    assert high.tobytes() == (memory.max(axis=0) + np.float32(0)).tobytes()
    memory[7, 5], memory[-1, -2], memory[pixels // 2, 0] = np.nan, np.inf, np.nan
    assert histogram.extremes(histogram.view(memory, 1)[0])[2] == 3


def test_int32_channel_counts_widen_before_they_could_overflow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per-channel rows count in int32 until a channel could pass the limit, then in int64: the same counts."""
    from dabuild.quant import histogram

    rng = np.random.default_rng(12)
    values = rng.standard_normal((5, 16, 10, 20)).astype(np.float32)  # 200 values per channel and sample

    def stats() -> Stats:
        result = Stats()
        for sample in values:
            result.observe("t", sample[None], axis=1)
        return result

    narrow = stats()
    assert narrow.tensors["t"].channels.counts.dtype == np.int32
    monkeypatch.setattr(histogram, "NARROW_COUNT_LIMIT", 500)  # crossed by the third sample
    widened = stats()
    assert widened.tensors["t"].channels.counts.dtype == np.int64 and widened == narrow
    assert widened.tensors["t"].channels.counts.sum(axis=1).tolist() == [5 * 200] * 16


def assert_native_counts_equal_numpys(values: np.ndarray, batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Channel statistics of `values` (axis 1) observed a sample at a time and `batch` at a time by the native
    kernels, and `batch` at a time by numpy: all three the same."""
    from dabuild.ir.kernels import native

    def stats(size: int) -> Stats:
        result = Stats()
        for start in range(0, len(values), size):
            result.observe("t", values[start:start + size], axis=1)
        return result

    monkeypatch.delenv(native.SWITCH, raising=False)
    compiled = [stats(size) for size in (1, batch)]
    monkeypatch.setenv(native.SWITCH, "0")
    assert compiled[0] == compiled[1] == stats(batch)


@pytest.mark.parametrize("channels_last", [False, True])
def test_native_whole_histograms_derived_from_big_channels_are_exact(monkeypatch: pytest.MonkeyPatch,
                                                                     vector_path: int, channels_last: bool) -> None:
    """Channels with enough values per batch have their whole-tensor counts derived from their own rows'
    gains (histogram.c): the same counts numpy bins value by value, with channel widths finer than the whole's."""

    rng = np.random.default_rng(12)
    values = (rng.standard_normal((3, 96, 96, 5)) * np.array([0.01, 1.0, 30.0, 1.0, 2.0])).astype(np.float32)
    values[..., 3] = 0.25  # a constant channel: counted into the whole directly
    values[..., 4] = np.maximum(values[..., 4], 0)  # ReLU-like: half zeros, set aside and counted at once
    values[1, 7, 7:30, 4] = -0.0
    values[2, 50, 50, 1] = -700.0  # a late outlier: the whole's window and one channel's widen
    values = values.transpose(0, 3, 1, 2) if channels_last else np.ascontiguousarray(values.transpose(0, 3, 1, 2))

    assert_native_counts_equal_numpys(values, 3, monkeypatch)


@pytest.mark.parametrize("channels_last", [False, True])
def test_native_bins_leave_float32_only_where_it_would_be_inexact(monkeypatch: pytest.MonkeyPatch,
                                                                  vector_path: int, channels_last: bool) -> None:
    """histogram.c bins in float32 where that is exact and in double elsewhere: products that would lose bits
    below float32's normal range (subnormal values), grid offsets past 2^24 (values far from zero on a fine
    grid), tiny and huge widths: numpy's double-precision counts exactly, on every vector path."""

    rng = np.random.default_rng(21)
    values = rng.standard_normal((2, 40, 24, 6)).astype(np.float32)
    values[..., 0] = 1e5 + values[..., 0] * 0.01  # a grid of width 2^-15: offsets near 3.3e9
    values[..., 1] *= np.float32(1e-40)  # subnormal values
    values[..., 2] *= np.float32(1e-30)  # tiny, normal
    values[..., 3] *= np.float32(1e30)  # huge
    values[..., 4] = np.where(values[..., 4] > 0, np.float32(2.0 ** -140), np.float32(-(2.0 ** -149)))
    values[..., 5] = -8e6 + values[..., 5]  # negative, offset just below 2^24 in magnitude
    values = values.transpose(0, 3, 1, 2) if channels_last else np.ascontiguousarray(values.transpose(0, 3, 1, 2))

    assert_native_counts_equal_numpys(values, 2, monkeypatch)


@pytest.mark.parametrize("channels", [3, 200])
def test_native_histograms_reject_non_finite_values_naming_the_tensor(vector_path: int, channels: int) -> None:
    """Channels first, and channels last with enough channels for the register tiles of histogram.c."""
    memory = np.ones((2, 4, 4, channels), np.float32)
    memory[1, 0, 0, 2] = np.inf
    memory[0, 3, 1, channels - 1] = np.nan
    for values in (np.ascontiguousarray(memory.transpose(0, 3, 1, 2)), memory.transpose(0, 3, 1, 2)):
        with pytest.raises(BuildError, match="tensor 't' holds 2 NaN or infinite"):
            Stats().observe("t", values, axis=1)


def whole_only_cases() -> dict[str, np.ndarray]:
    """Tensors for the whole-tensor-only count: windows that widen late (a second pass), a constant channel,
    ReLU-like zeros of both signs, and values float32 bins inexactly (far from zero, subnormal, huge)."""
    rng = np.random.default_rng(17)
    mixed = (rng.standard_t(3, size=(6, 20, 41, 150)) * rng.uniform(0.1, 10, 150)).astype(np.float32)
    mixed[4, 3, 4, 5] = 300.0  # a late outlier: the window widens and its values are counted in a second pass
    mixed[5, 1, 2, 3] = -900.0
    mixed[:, :, :, 7] = 0.5
    mixed[mixed < -1.5] = 0.0
    mixed[0, 1, :, 9] = -0.0
    awkward = rng.standard_normal((4, 6, 24, 41)).astype(np.float32)
    awkward[:, 0] = 1e5 + awkward[:, 0] * 0.01  # offsets near 3.3e9 on a fine grid
    awkward[:, 1] *= np.float32(1e-40)  # subnormal
    awkward[:, 2] *= np.float32(1e30)  # huge
    awkward[:, 3] = -8e6 + awkward[:, 3]
    constant = np.full((3, 2, 5, 7), 0.25, np.float32)
    constant[2, 1, 4, 6] = 0.75  # a second value only in the last batch: the first grid then
    return {"channels last": mixed.transpose(0, 3, 1, 2), "channels first": np.ascontiguousarray(
        mixed.transpose(0, 3, 1, 2)), "inexact float32 bins": awkward, "constant, then not": constant}


@pytest.mark.parametrize("case", list(whole_only_cases()))
def test_whole_tensor_histograms_alone_count_what_numpy_and_the_channel_pass_count(
        monkeypatch: pytest.MonkeyPatch, vector_path: int, case: str) -> None:
    """Stats(per_channel=False): each tensor counted as a whole, in memory order, extremes in the same pass and a
    second pass only for values past the window. The same histogram numpy counts, and the same as the
    whole-tensor histogram beside per-channel ones, whatever the batches; the outliers took the second pass."""
    from dabuild.ir.kernels import native
    from dabuild.quant import calibrate as calibration

    values = whole_only_cases()[case]
    monkeypatch.delenv(native.SWITCH, raising=False)
    kernels = type(calibration.native_histogram())  # the host's, or those a test put in their place
    second_passes = []
    counted = kernels.whole

    def whole(self: native.NativeHistogram, flat: np.ndarray, reciprocal: float, offset: int,
              counts: np.ndarray | None, skip: tuple[float, float] = (np.inf, -np.inf)) -> tuple:
        second_passes.append(skip[0] < skip[1])
        return counted(self, flat, reciprocal, offset, counts, skip)

    monkeypatch.setattr(kernels, "whole", whole)

    def stats(batch: int, per_channel: bool = False) -> Stats:
        result = Stats(per_channel=per_channel)
        for start in range(0, len(values), batch):
            result.observe("t", values[start:start + batch], axis=1)
        return result

    compiled = [stats(batch) for batch in (1, 3)]
    if case.startswith("channels"):
        assert any(second_passes), "the late outliers never took the second pass"
    with_channels = stats(2, per_channel=True)
    monkeypatch.setenv(native.SWITCH, "0")
    reference = stats(len(values))
    assert compiled[0] == compiled[1] == reference
    assert all(tensor.channels is None for tensor in reference.tensors.values())
    assert np.array_equal(compiled[0].tensors["t"].whole.counts, with_channels.tensors["t"].whole.counts)
    assert compiled[0].ranges == with_channels.ranges


def test_whole_tensor_histograms_split_among_more_threads_count_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """A big tensor's memory split among 5 threads, each its own row and extremes, merged after."""
    from dabuild.ir.kernels import native

    values = whole_only_cases()["channels last"]
    monkeypatch.delenv(native.SWITCH, raising=False)
    monkeypatch.setattr(native, "available_cores", lambda: 5)

    def stats() -> Stats:
        result = Stats(per_channel=False)
        result.observe("t", values, axis=1)
        result.observe("t", values[:2] * 3, axis=1)  # widens the window: the second pass, split too
        return result

    split = stats()
    monkeypatch.setenv(native.SWITCH, "0")
    assert split == stats()


def test_whole_tensor_histograms_reject_non_finite_values_naming_the_tensor(vector_path: int) -> None:
    """A NaN in a full block and an infinity among the last values, in a first batch and in a later one."""
    memory = np.ones((2, 4, 4, 70), np.float32)  # 2,240 values: 35 blocks of 64, the last values fewer
    memory[0, 0, 1, 2] = np.nan
    memory[1, 3, 3, 69] = -np.inf
    for values in (np.ascontiguousarray(memory.transpose(0, 3, 1, 2)), memory.transpose(0, 3, 1, 2)):
        with pytest.raises(BuildError, match="tensor 't' holds 2 NaN or infinite"):
            Stats(per_channel=False).observe("t", values, axis=1)
        stats = Stats(per_channel=False)
        stats.observe("t", np.ones_like(values) * np.arange(70, dtype=np.float32)[None, :, None, None], axis=1)
        with pytest.raises(BuildError, match="tensor 't' holds 2 NaN or infinite"):
            stats.observe("t", values, axis=1)


def test_whole_tensor_statistics_save_load_and_say_what_they_cannot_serve(tmp_path: Path) -> None:
    """calibrate(per_channel=False), as a build without bias correction runs it: the same ranges and
    whole-tensor histograms as with channels, a fraction of the memory, and a clear error for channel means."""
    rng = np.random.default_rng(5)
    graph = small_conv_net(rng)
    batches = [{"x": rng.standard_normal((16, 3, 12, 12)).astype(np.float32)}]
    plain = calibrate(graph, batches, Progress.silent(), per_channel=False)
    full = calibrate(graph, batches, Progress.silent())
    assert plain.ranges == full.ranges and not plain.per_channel
    assert all(np.array_equal(plain.tensors[name].whole.counts, full.tensors[name].whole.counts)
               for name in full.tensors)
    assert histogram_bytes(graph, per_channel=False) * 20 < histogram_bytes(graph)
    plain.save(tmp_path)
    loaded = Stats.load(tmp_path)
    assert loaded == plain and not loaded.per_channel
    assert loaded.range("h", "percentile", percentile=99.0) == full.range("h", "percentile", percentile=99.0)
    with pytest.raises(BuildError, match="tensor 'h': calibration kept its whole-tensor histogram only.*"
                                         "tuning.bias_correction"):
        loaded.channel_means("h")


def small_conv_net(rng: np.random.Generator) -> Graph:
    """Two convs and a dense layer on 3x12x12 images."""
    constants = {"w1": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
                 "w2": rng.standard_normal((4, 8, 3, 3)).astype(np.float32),
                 "w3": rng.standard_normal((100, 300)).astype(np.float32), "b3": np.ones(300, np.float32)}
    nodes = [Node("c1", "conv", ["x", "w1"], ["h"], {"pads": [1] * 4, "activation": "relu"}),
             Node("c2", "conv", ["h", "w2"], ["h2"], {"strides": [2, 2]}),
             Node("flat", "flatten", ["h2"], ["f"], {}),
             Node("fc", "dense", ["f", "w3", "b3"], ["y"], {})]
    return Graph([TensorSpec("x", (None, 3, 12, 12))], ["y"], nodes, constants)


def budget_for_samples(graph: Graph, samples: int) -> str:
    """A DABUILD_MEMORY that leaves room for `samples` samples at a time beside the weights and histograms."""
    weights = sum(array.nbytes for array in graph.constants.values())
    return str(2 * weights + histogram_bytes(graph) + samples * sample_bytes(graph))


def test_batches_past_the_memory_budget_run_in_parts_with_the_same_statistics(monkeypatch: pytest.MonkeyPatch) -> None:
    """Convs and dense layers compute each sample alone (a dense layer as a native 1x1 conv, not by a BLAS
    GEMM whose rounding depends on its row count), so cutting batches changes no bit."""
    rng = np.random.default_rng(2)
    graph = small_conv_net(rng)
    batch = [{"x": rng.standard_normal((50, 3, 12, 12)).astype(np.float32)}]
    whole = calibrate(graph, batch, Progress.silent())
    monkeypatch.setenv(BUDGET, budget_for_samples(graph, 7))
    assert calibrate(graph, batch, Progress.silent()) == whole
    monkeypatch.setenv(BUDGET, "1K")
    with pytest.raises(BuildError, match=r"calibrate: the model needs about .* histograms .* more than the memory "
                                         r"budget"):
        calibrate(graph, batch, Progress.silent())


def test_runs_take_as_many_samples_as_fit_across_batch_boundaries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of 10, 10, 3 and 9 samples where 7 fit run as 7, 7, 7, 7 and the last 4, in the samples' order,
    with the same statistics as one batch; progress hears each run's samples once it has run."""
    from dabuild.quant.calibrate import _runs

    rng = np.random.default_rng(4)
    graph = small_conv_net(rng)
    x = rng.standard_normal((32, 3, 12, 12)).astype(np.float32)
    cuts = [0, 10, 20, 23, 32]
    batches = [{"x": x[low:high]} for low, high in zip(cuts, cuts[1:])]
    monkeypatch.setenv(BUDGET, budget_for_samples(graph, 7))
    runs = [run["x"] for run in _runs(graph, batches, histogram_bytes(graph))]
    assert [len(run) for run in runs] == [7, 7, 7, 7, 4]
    assert np.array_equal(np.concatenate(runs), x)
    progress = HeardProgress()
    assert calibrate(graph, batches, progress) == calibrate(graph, [{"x": x}], Progress.silent())
    assert progress.heard == [7, 7, 7, 7, 4]


class HeardProgress(Progress):
    """A silent Progress that keeps each `advance(n)`'s n."""

    def __init__(self) -> None:
        super().__init__(level=0, live=False)
        self.heard: list[int] = []

    @contextlib.contextmanager
    def track(self, label: str, total: int | None = None) -> Iterator[Callable[[int], None]]:
        yield self.heard.append
