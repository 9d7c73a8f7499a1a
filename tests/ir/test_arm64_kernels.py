"""The native kernels' arm64 (NEON) paths against numpy: the library's units cross-compiled with
gcc-aarch64-linux-gnu and called under qemu-aarch64 (Debian's qemu-user) through tests/ir/arm64_kernels.py.

An x86 machine cannot run the NEON paths natively; these run the host tests' own cases on them:
- conv.c: every 2-D case of tests/ir/test_native_kernels.py (ungrouped, grouped and depthwise, partial
  vectors, pads, strides, dilations), within float tolerance of numpy; the smaller ones in float64 on
  integers (the integer reference's sums), exactly;
- pool.c: its pool cases, numpy's floats bit for bit (NaN winning, signed zeros);
- island_conv.c: tests/ir/test_island_kernel.py's convs, infinities and dense layers, bit for bit with the
  numpy loops' order;
- histogram.c: tests/quant/test_calibration.py's native histogram cases (layouts, derived whole-tensor counts,
  float32 bins only where exact, rebinning, NaN and infinities; whole-tensor histograms alone, with their
  second pass), numpy's counts exactly;
- qconv.c (int16 pairs), the 8-bit add's lookup, quantize.c and requantize.c: tests/ir/test_integer_kernels.py's
  cases, bit for bit.
All but conv.c run through dabuild's own code (the interpreter's pool op, island_order, calibration, the
integer reference's layers) with their kernels swapped for the arm64 build (Arm64Native), and each such test
must have reached qemu; threads.c shares an island conv's and an integer conv's rows among threads there.
Not run on arm64: the uint8 x int8 conv (AVX-512 VNNI only). Instruction counts: bench/arm64.py.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import numpy as np
import pytest
import test_calibration as calibration_tests
import test_integer_kernels as integer_tests
import test_island_kernel as island_tests
import test_native_kernels as conv_tests
from arm64_kernels import MISSING, SKIP_REASON, Arm64Kernels, Arm64Native, build_driver, prepare_float_conv

from dabuild.ir.kernels import native
from dabuild.ir.kernels.integer import PAIRS
from dabuild.ir.ops import OPS
from dabuild.qir.layers.elementwise import QAdd, QClamp, QRelu, QSub

pytestmark = pytest.mark.skipif(bool(MISSING), reason=SKIP_REASON)


@pytest.fixture(scope="module")
def kernels(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Arm64Kernels:
    """The arm64 build, kept in pytest's cache folder between runs (compiling it takes a minute), or in a
    temporary one where the cache is switched off (-p no:cacheprovider)."""
    cache = getattr(pytestconfig, "cache", None)  # absent with -p no:cacheprovider
    folder = cache.mkdir("arm64-kernels") if cache is not None else tmp_path_factory.mktemp("arm64-kernels")
    return Arm64Kernels(build_driver(folder))


@pytest.fixture
def on_arm64(kernels: Arm64Kernels, monkeypatch: pytest.MonkeyPatch) -> Iterator[Arm64Kernels]:
    """dabuild's pools, float islands and histograms running on the arm64 build for the test, which must have
    called it (else the host's kernels or numpy answered)."""
    Arm64Native(kernels).install(monkeypatch)
    before = len(kernels.calls)
    yield kernels
    assert len(kernels.calls) > before, "the test never called the arm64 kernels"


def test_arm64_builds_the_neon_path(kernels: Arm64Kernels) -> None:
    layout = kernels.layout
    assert (layout.path, layout.vector_bytes, layout.block_vectors, layout.island_width, layout.qconv_lanes,
            layout.qconv_block_vectors) == ("neon", 16, 4, 16, 4, 4)


TWO_D = [case for case in conv_tests.CASES if len(case[3]) == 2]


@pytest.mark.parametrize("case", TWO_D)
@pytest.mark.parametrize("activation", ["relu", "none"])
def test_neon_conv_matches_numpy(kernels: Arm64Kernels, monkeypatch: pytest.MonkeyPatch, case: tuple,
                                 activation: str) -> None:
    batch, channels, out_channels, size, kernel, strides, pads, dilations, groups = case
    rng = np.random.default_rng(channels * 100 + out_channels)
    x = rng.standard_normal((batch, channels, *size)).astype(np.float32)
    weight = (rng.standard_normal((out_channels, channels // groups, *kernel))
              / np.sqrt(channels // groups * np.prod(kernel))).astype(np.float32)
    bias = rng.standard_normal(out_channels).astype(np.float32)
    monkeypatch.setenv(native.SWITCH, "0")
    attrs = {"strides": strides, "pads": pads, "dilations": dilations, "groups": groups, "activation": activation}
    reference = OPS["conv"].run([x, weight, bias], attrs)[0]
    compiled = kernels.run(prepare_float_conv(kernels.layout, x, weight, bias, strides, pads, dilations, groups,
                                              activation == "relu"))
    conv_tests.assert_close(np.ascontiguousarray(compiled), reference)


@pytest.mark.parametrize("case", [case for case in TWO_D if case[0] * case[1] * case[2] * np.prod(case[3]) < 2e5])
def test_neon_float64_conv_of_integers_is_exact(kernels: Arm64Kernels, monkeypatch: pytest.MonkeyPatch,
                                                case: tuple) -> None:
    """The integer reference's sums (conv.c's float64 variant): integer-valued operands give numpy's result."""
    batch, channels, out_channels, size, kernel, strides, pads, dilations, groups = case
    rng = np.random.default_rng(4)
    x = rng.integers(-255, 256, (batch, channels, *size)).astype(np.float64)
    weight = rng.integers(-127, 128, (out_channels, channels // groups, *kernel)).astype(np.float64)
    bias = rng.integers(-9999, 9999, out_channels).astype(np.float64)
    monkeypatch.setenv(native.SWITCH, "0")
    attrs = {"strides": strides, "pads": pads, "dilations": dilations, "groups": groups}
    reference = OPS["conv"].run([x, weight, bias], attrs)[0]
    compiled = kernels.run(prepare_float_conv(kernels.layout, x, weight, bias, strides, pads, dilations, groups,
                                              relu=False))
    assert compiled.dtype == np.float64
    np.testing.assert_array_equal(compiled, reference)


@pytest.mark.parametrize("op, attrs", conv_tests.POOLS)
def test_neon_pools_match_numpy_bit_for_bit(on_arm64: Arm64Kernels, monkeypatch: pytest.MonkeyPatch, op: str,
                                            attrs: dict) -> None:
    conv_tests.test_pools_of_a_conv_output_match_numpy_bit_for_bit(monkeypatch, 16, op, attrs)


@pytest.mark.parametrize("case", island_tests.CONVS)
def test_neon_island_convs_match_the_numpy_order(on_arm64: Arm64Kernels, monkeypatch: pytest.MonkeyPatch,
                                                 case: tuple) -> None:
    island_tests.test_conv_matches_the_numpy_order(monkeypatch, case, 1)


def test_neon_island_conv_split_among_threads_matches(on_arm64: Arm64Kernels, monkeypatch: pytest.MonkeyPatch) -> None:
    """threads.c on arm64: the largest island conv's rows shared among 2 threads, the same bits."""
    island_tests.test_conv_matches_the_numpy_order(monkeypatch, island_tests.CONVS[0], 2)
    assert "parallel_rows:island_conv_nhwc" in on_arm64.calls


def test_neon_island_infinities_and_zeros(on_arm64: Arm64Kernels, monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/ir/test_island_kernel.py's infinities and signed zeros: the same bits, except that a NaN made here
    (inf * 0, inf - inf) is arm64's default NaN, 0x7fc00000, where x86 (and so numpy on x86) makes 0xffc00000;
    numpy on arm64 makes arm64's."""
    x = island_tests.values(1, 4, 6, 6)
    x[0, 0, 2, 3], x[0, 1, 0, 0], x[0, 2, 5, 5] = np.inf, -np.inf, -0.0
    weight = island_tests.values(5, 4, 3, 3)
    weight[1, 0] = 0.0
    weight[2, 3, 1, 1] = -0.0
    attrs = {"strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "groups": 1, "activation": "none"}
    compiled, reference = island_tests.both(monkeypatch, "conv", [x, weight], attrs)
    made = np.isnan(reference)
    assert made.any() and np.array_equal(np.isnan(compiled), made)
    bits = np.ascontiguousarray(compiled).view(np.uint32)
    assert set(bits[made].tolist()) == {0x7FC00000}
    assert island_tests.same_bits(np.where(made, 0, compiled), np.where(made, 0, reference))


@pytest.mark.parametrize("shape", [(3, 37), (2, 4, 19)])
def test_neon_island_dense_matches_the_numpy_order(on_arm64: Arm64Kernels, monkeypatch: pytest.MonkeyPatch,
                                                   shape: tuple[int, ...]) -> None:
    island_tests.test_dense_matches_the_numpy_order(monkeypatch, shape)


@pytest.mark.parametrize("layout", ["channels last", "channels first", "no channel axis"])
def test_neon_histograms_count_exactly_what_numpy_counts(on_arm64: Arm64Kernels, monkeypatch: pytest.MonkeyPatch,
                                                         layout: str) -> None:
    calibration_tests.test_native_histograms_count_exactly_what_numpy_counts(monkeypatch, 16, layout)


@pytest.mark.parametrize("channels_last", [False, True])
def test_neon_whole_histograms_derived_from_big_channels_are_exact(on_arm64: Arm64Kernels,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   channels_last: bool) -> None:
    calibration_tests.test_native_whole_histograms_derived_from_big_channels_are_exact(monkeypatch, 16, channels_last)


@pytest.mark.parametrize("channels_last", [False, True])
def test_neon_bins_leave_float32_only_where_it_would_be_inexact(on_arm64: Arm64Kernels,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                channels_last: bool) -> None:
    calibration_tests.test_native_bins_leave_float32_only_where_it_would_be_inexact(monkeypatch, 16, channels_last)


@pytest.mark.parametrize("case", list(calibration_tests.whole_only_cases()))
def test_neon_whole_tensor_histograms_alone_count_what_numpy_counts(on_arm64: Arm64Kernels,
                                                                    monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    calibration_tests.test_whole_tensor_histograms_alone_count_what_numpy_and_the_channel_pass_count(
        monkeypatch, 16, case)


def test_neon_whole_tensor_histograms_reject_non_finite_values_naming_the_tensor(on_arm64: Arm64Kernels) -> None:
    calibration_tests.test_whole_tensor_histograms_reject_non_finite_values_naming_the_tensor(16)


@pytest.mark.parametrize("channels", [3, 200])
def test_neon_histograms_reject_non_finite_values_naming_the_tensor(on_arm64: Arm64Kernels, channels: int) -> None:
    calibration_tests.test_native_histograms_reject_non_finite_values_naming_the_tensor(16, channels)


@pytest.mark.parametrize("case", integer_tests.CONVS)
def test_neon_integer_convs_equal_the_numpy_reference(on_arm64: Arm64Kernels, case: tuple) -> None:
    integer_tests.test_compiled_conv_equals_the_numpy_reference(case, PAIRS)


@pytest.mark.parametrize("x_type, y_type, rows", [("int8", "int8", (5,)), ("uint8", "int16", (3, 4))])
def test_neon_integer_dense_equals_the_numpy_reference(on_arm64: Arm64Kernels, x_type: str, y_type: str,
                                                       rows: tuple[int, ...]) -> None:
    integer_tests.test_compiled_dense_equals_the_numpy_reference(x_type, y_type, rows, PAIRS)


def test_neon_integer_ties_are_rounded_away_from_zero(on_arm64: Arm64Kernels) -> None:
    integer_tests.test_ties_are_hit_and_rounded_away_from_zero(PAIRS)


def test_neon_integer_conv_split_among_threads_gives_the_same_bits(on_arm64: Arm64Kernels) -> None:
    integer_tests.test_a_split_among_threads_gives_the_same_bits(PAIRS)
    assert "parallel_rows:qconv2d_nhwc" in on_arm64.calls


def test_neon_requantization_of_wide_sums_equals_numpy(on_arm64: Arm64Kernels) -> None:
    """Sums past int32 leave qconv.c for the float64 conv; requantize.c finishes them on arm64."""
    integer_tests.test_an_accumulator_past_int32_falls_back_to_numpy()


@pytest.mark.parametrize("layer_class", [QAdd, QSub])
@pytest.mark.parametrize("types", [("int8", "int8", "int8"), ("uint8", "int8", "uint8")])
def test_neon_adds_equal_the_numpy_reference(on_arm64: Arm64Kernels, layer_class: type[QAdd],
                                             types: tuple[str, str, str]) -> None:
    integer_tests.test_compiled_add_of_feature_maps_equals_the_numpy_reference(layer_class, types)


@pytest.mark.parametrize("clamp_class, bounds", [(QRelu, (2, 127)), (QClamp, (-20, 60))])
def test_neon_add_and_clamp_in_one_lookup(on_arm64: Arm64Kernels, monkeypatch: pytest.MonkeyPatch,
                                          clamp_class: type[QClamp], bounds: tuple[int, int]) -> None:
    integer_tests.test_an_add_applies_the_clamp_after_it_in_one_lookup(clamp_class, bounds, monkeypatch)


@pytest.mark.parametrize("dtype, zero_point", [("int8", -3), ("uint8", 128), ("int16", 5), ("uint16", 7), ("int4", 1)])
def test_neon_quantization_equals_the_numpy_one(on_arm64: Arm64Kernels, monkeypatch: pytest.MonkeyPatch, dtype: str,
                                                zero_point: int) -> None:
    integer_tests.test_compiled_quantization_equals_the_numpy_one(dtype, zero_point, monkeypatch)


def test_a_call_of_a_function_the_driver_lacks_is_refused(kernels: Arm64Kernels) -> None:
    with pytest.raises(subprocess.CalledProcessError, match="returned non-zero exit status 2"):
        kernels.call("no_such_kernel", np.zeros(3, np.float32), 0, 3)
