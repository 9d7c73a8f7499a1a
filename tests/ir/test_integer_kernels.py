"""qconv.c (the integer reference's compiled conv and add) against the numpy reference, bit for bit.

The layer-level cases reach what lowered graphs rarely do: exact requantization ties of both signs, every
storage type the kernel writes, uint8 inputs, asymmetric pads, strides and dilations, tails of pixels and
channels, a split among threads, and the adds of two feature maps in channels-last memory. Each runs with
every conv form this machine's build has (int16 pairs; uint8 x int8 quads with VNNI; uint8 x int7 with AVX2),
with weights at the ends of the form's range and inputs at the ends of theirs; weights past a form's range
fall back to the pairs. The whole-graph comparison on every spec case is
tests/targets/c/test_c_kernels.py::test_native_integer_reference_equals_the_numpy_one.
"""

from __future__ import annotations

import numpy as np
import pytest

from dabuild.ir.kernels import integer, native
from dabuild.ir.kernels.integer import PAIRS, QUADS, U8S7, QConvForm
from dabuild.ir.kernels.native import layer_threads
from dabuild.qir.layers import linear
from dabuild.qir.layers.elementwise import LEFT_SHIFT, QAdd, QClamp, QRelu, QSub
from dabuild.qir.layers.linear import QConv, QDense
from dabuild.qir.qgraph import QGraph, QTensor, QuantParams
from dabuild.qir.reference import absorbed_clamps, run_integer

RNG = np.random.default_rng(31)


@pytest.fixture(autouse=True, params=[PAIRS, QUADS, U8S7], ids=lambda form: form.kernel)
def kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> QConvForm:
    """Every test with each conv form: int16 pairs (any CPU), uint8 x int8 quads where VNNI compiled them,
    uint8 x int7 where AVX2 did; the form first, the pairs behind it for weights past its range."""
    monkeypatch.delenv(native.SWITCH, raising=False)
    conv = native.native_conv()
    if conv is None or conv.integer is None:
        pytest.skip("no C compiler: the native integer kernels cannot be built")
    if request.param not in conv.integer.forms:
        pytest.skip(f"the {conv.path} path has no {request.param.name} kernel (VNNI: quads; AVX2: uint8 x int7)")
    monkeypatch.setattr(conv.integer, "forms", tuple(dict.fromkeys((request.param, PAIRS))))
    return request.param


def ran(layer: QConv | QDense, graph: QGraph) -> QConvForm | None:
    """The form qconv.c ran the layer in (what `_qconv` picks; its weight packed for that form's groups), asked
    of the kernels the layer itself calls: the host's, or those a test put in their place (the arm64 build)."""
    conv = linear.native_conv()
    assert conv is not None and conv.integer is not None
    source = graph.tensors[layer.inputs[0]].params
    form = conv.integer.form_for(*layer._weight_range(), layer.bias, source.zero_point, np.dtype(source.storage))
    assert form is not None and form.group in vars(layer)["_packs"]
    return form


def edged(values: np.ndarray, low: int, high: int) -> np.ndarray:
    """`values` with its first and last element set to the ends of [low, high], where a form saturates first."""
    values.flat[0], values.flat[-1] = low, high
    return values


def conv_layer(x_type: str, y_type: str, channels: int, out_channels: int, kernel: tuple[int, int],
               strides: list[int], pads: list[int], dilations: list[int], ties: bool,
               per_channel: bool, weights: QConvForm = PAIRS) -> tuple[QConv, QGraph]:
    """A conv layer whose weights span the range `weights` runs exactly (int8's whole range for the pairs)."""
    source = QuantParams(0.05, 128 if x_type == "uint8" else -3, x_type)
    target = QuantParams(0.1, 7 if y_type.startswith("u") else -5, y_type)
    count = out_channels if per_channel else 1
    # factors that bring a typical sum (sqrt(taps) * 75^2) to about 100 quantization steps, some further down
    typical = int(30.5 + np.log2(np.sqrt(channels * kernel[0] * kernel[1]) * 75**2 / 100))
    shift = (typical + RNG.integers(0, 3, count)).astype(np.int32)
    if ties:  # a power of two: every odd multiple of 2^(shift - 31) is a tie
        multiplier = np.full(count, 2**30, np.int32)
    else:
        multiplier = RNG.integers(2**30, 2**31 - 1, count).astype(np.int32)
    low, high = weights.weight_low, weights.weight_high
    weight = edged(RNG.integers(low, high + 1, (out_channels, channels, *kernel)).astype(np.int8), low, high)
    bias = RNG.integers(-20000, 20000, out_channels).astype(np.int32)
    layer = QConv(name="conv", inputs=["x"], outputs=["y"], weight=weight, bias=bias, multiplier=multiplier,
                  shift=shift, weight_scale=np.ones(count), output_min=target.qmin, output_max=target.qmax,
                  strides=strides, pads=pads, dilations=dilations, groups=1)
    graph = QGraph("x", "y", {"x": QTensor((channels, 1, 1), source), "y": QTensor((out_channels, 1, 1), target)},
                   [layer])
    return layer, graph


CONVS = [  # x type, y type, channels, out channels, kernel, strides, pads, dilations, ties, per channel
    ("int8", "int8", 3, 5, (3, 3), [1, 1], [1, 1, 1, 1], [1, 1], False, True),
    ("int8", "int8", 64, 70, (1, 1), [1, 1], [0, 0, 0, 0], [1, 1], True, True),
    ("uint8", "uint8", 7, 33, (3, 2), [2, 1], [0, 1, 2, 0], [1, 1], False, False),
    ("int8", "int16", 5, 18, (3, 3), [1, 2], [2, 2, 2, 2], [2, 2], True, False),
    ("uint8", "int8", 4, 130, (7, 7), [2, 2], [3, 3, 3, 3], [1, 1], False, True),
    ("int8", "uint16", 9, 16, (2, 2), [1, 1], [0, 0, 1, 1], [1, 1], False, True),
    # a 1x1 conv whose last block of output channels is one whole vector and a partial one (AVX2's epilogue
    # finishes whole vectors from the registers, the rest through memory), ties of both signs, 1-byte outputs
    ("uint8", "uint8", 32, 28, (1, 1), [1, 1], [0, 0, 0, 0], [1, 1], True, True),
]


@pytest.mark.parametrize("case", CONVS, ids=lambda case: "-".join(map(str, case[:5])))
def test_compiled_conv_equals_the_numpy_reference(case: tuple, kernel: QConvForm) -> None:
    layer, graph = conv_layer(*case, weights=kernel)
    source = graph.tensors["x"].params
    x = edged(RNG.integers(source.qmin, source.qmax + 1, (3, case[2], 13, 11)).astype(source.storage), source.qmin,
              source.qmax)
    compiled = layer.run([x], graph, None)[0]
    assert ran(layer, graph) == kernel
    reference = layer.run([x], graph, {})[0]  # a trace forces the numpy path
    assert compiled.dtype == reference.dtype and compiled.shape == reference.shape
    np.testing.assert_array_equal(compiled, reference)
    assert len(np.unique(reference)) > 3


@pytest.mark.parametrize("x_type, pads, dilations", [("uint8", [3, 3, 3, 3], [1, 1]), ("int8", [2, 4, 1, 0], [1, 2])])
def test_few_channels_run_width_unfolded(x_type: str, pads: list[int], dilations: list[int],
                                         kernel: QConvForm) -> None:
    """The RGB stem's shape (3 channels, 7x7, stride 2) runs width-unfolded in every form (`unfolds`: 7 taps
    of 3 channels padded to whole groups once, not 7 times), with asymmetric pads and a dilation too."""
    layer, graph = conv_layer(x_type, "int8", 3, 24, (7, 7), [2, 2], pads, dilations, False, True, kernel)
    source = graph.tensors["x"].params
    x = edged(RNG.integers(source.qmin, source.qmax + 1, (2, 3, 29, 31)).astype(source.storage), source.qmin,
              source.qmax)
    compiled = layer.run([x], graph, None)[0]
    assert ran(layer, graph) == kernel and vars(layer)["_packs"][kernel.group].unfolded
    np.testing.assert_array_equal(compiled, layer.run([x], graph, {})[0])


@pytest.mark.parametrize("x_type, y_type, rows", [("int8", "int8", (5,)), ("uint8", "int16", (3, 4))])
def test_compiled_dense_equals_the_numpy_reference(x_type: str, y_type: str, rows: tuple[int, ...],
                                                    kernel: QConvForm) -> None:
    conv, _ = conv_layer(x_type, y_type, 300, 37, (1, 1), [1, 1], [0] * 4, [1, 1], y_type == "int16", True, kernel)
    layer = QDense(name="fc", inputs=["x"], outputs=["y"], weight=np.ascontiguousarray(conv.weight[:, :, 0, 0].T),
                   bias=conv.bias, multiplier=conv.multiplier, shift=conv.shift, weight_scale=conv.weight_scale,
                   output_min=conv.output_min, output_max=conv.output_max)
    source, target = QuantParams(0.05, 128 if x_type == "uint8" else -3, x_type), QuantParams(0.1, -5, y_type)
    graph = QGraph("x", "y", {"x": QTensor((300,), source), "y": QTensor((37,), target)}, [layer])
    x = edged(RNG.integers(source.qmin, source.qmax + 1, (*rows, 300)).astype(source.storage), source.qmin,
              source.qmax)
    compiled = layer.run([x], graph, None)[0]
    assert ran(layer, graph) == kernel
    reference = layer.run([x], graph, {})[0]
    assert compiled.dtype == reference.dtype and compiled.shape == (*rows, 37)
    np.testing.assert_array_equal(compiled, reference)
    assert len(np.unique(reference)) > 3


def test_ties_are_hit_and_rounded_away_from_zero(kernel: QConvForm) -> None:
    layer, graph = conv_layer("int8", "int16", 4, 16, (1, 1), [1, 1], [0] * 4, [1, 1], True, True, kernel)
    layer.shift[:] = 31  # factor 1/2: an odd sum + bias is a tie
    x = RNG.integers(-128, 128, (2, 4, 5, 5)).astype(np.int8)
    sums = np.einsum("nchw,oc->nohw", x.astype(np.int64) + 3, layer.weight[:, :, 0, 0].astype(np.int64))
    sums += layer.bias.astype(np.int64)[:, None, None]
    assert np.any(sums % 2 == 1) and np.any((sums < 0) & (sums % 2 == 1))
    expected = np.clip(np.sign(sums) * ((np.abs(sums) + 1) // 2) - 5, -32768, 32767)
    np.testing.assert_array_equal(layer.run([x], graph, None)[0], expected)
    assert ran(layer, graph) == kernel


def test_a_split_among_threads_gives_the_same_bits(kernel: QConvForm) -> None:
    layer, graph = conv_layer("int8", "int8", 32, 64, (3, 3), [1, 1], [1, 1, 1, 1], [1, 1], False, True, kernel)
    x = RNG.integers(-128, 128, (4, 32, 40, 40)).astype(np.int8)
    alone = layer.run([x], graph, None)[0]
    with layer_threads(3):
        np.testing.assert_array_equal(layer.run([x], graph, None)[0], alone)
    np.testing.assert_array_equal(alone, layer.run([x], graph, {})[0])
    assert ran(layer, graph) == kernel


@pytest.mark.parametrize("extreme", [-128, -65, -64, 64, 65, 127])
@pytest.mark.parametrize("x_type", ["int8", "uint8"])
def test_a_weight_past_the_forms_range_falls_back_to_the_pairs(kernel: QConvForm, x_type: str, extreme: int) -> None:
    """One weight at `extreme` among weights the form takes: the form runs where it multiplies that weight
    exactly (uint8 x int7: within +-64), else the int16 pairs; inputs at both ends of their range (where a
    byte form's pairs of products are largest), the result the numpy reference's either way."""
    layer, graph = conv_layer(x_type, "int8", 12, 20, (3, 3), [1, 1], [1, 1, 1, 1], [1, 1], False, True, kernel)
    layer.weight.flat[7] = extreme
    source = graph.tensors["x"].params
    x = np.where(RNG.random((2, 12, 8, 9)) < 0.5, source.qmin, source.qmax).astype(source.storage)
    np.testing.assert_array_equal(layer.run([x], graph, None)[0], layer.run([x], graph, {})[0])
    assert ran(layer, graph) == (kernel if kernel.takes(extreme, extreme) else PAIRS)


def test_an_accumulator_past_int32_falls_back_to_numpy() -> None:
    layer, graph = conv_layer("int8", "int8", 8, 4, (1, 1), [1, 1], [0] * 4, [1, 1], False, True)
    layer.bias[:] = 2**31 - 10  # the compiled conv's int32 sums could wrap: the reference must run
    x = RNG.integers(-128, 128, (1, 8, 3, 3)).astype(np.int8)
    np.testing.assert_array_equal(layer.run([x], graph, None)[0], layer.run([x], graph, {})[0])


@pytest.mark.parametrize("y_type", ["int8", "uint8"])
def test_outputs_far_past_the_range_clamp_as_the_reference_does(y_type: str, kernel: QConvForm) -> None:
    """Factors near 2^29, 2^-1 and 2^-20 per channel: most sums land far outside the 1-byte range, past 2^31
    steps with the first (where the AVX2 epilogue caps its rounded magnitudes), of both signs; some inside."""
    layer, graph = conv_layer("uint8", y_type, 16, 24, (3, 3), [1, 1], [1, 1, 1, 1], [1, 1], False, True, kernel)
    layer.shift[:] = np.array([2, 32, 51])[np.arange(24) % 3]
    x = RNG.integers(0, 256, (2, 16, 9, 10)).astype(np.uint8)
    compiled = layer.run([x], graph, None)[0]
    reference = layer.run([x], graph, {})[0]
    np.testing.assert_array_equal(compiled, reference)
    target = graph.tensors["y"].params
    assert np.any(reference == target.qmin) and np.any(reference == target.qmax)
    assert np.any((reference > target.qmin) & (reference < target.qmax))


@pytest.mark.parametrize("layer_class", [QAdd, QSub])
@pytest.mark.parametrize("types", [("int8", "int8", "int8"), ("uint8", "int8", "uint8")])
def test_compiled_add_of_feature_maps_equals_the_numpy_reference(layer_class: type[QAdd],
                                                                  types: tuple[str, str, str]) -> None:
    params = [QuantParams(scale, zero_point, dtype)
              for scale, zero_point, dtype in zip((0.03, 0.07, 0.05), (-4, 9, 2), types)]
    params[2] = QuantParams(0.05, 130 if types[2] == "uint8" else 2, types[2])
    tensors = {name: QTensor((6, 5, 4), p) for name, p in zip("aby", params)}
    layer = layer_class(name="add", inputs=["a", "b"], outputs=["y"], left_shift=LEFT_SHIFT,
                        input_multiplier=np.array([1717986918, 2**30], np.int32), input_shift=np.array([31, 31], np.int32),
                        multiplier=np.array([1288490189], np.int32), shift=np.array([31 - LEFT_SHIFT + 1], np.int32))
    graph = QGraph("a", "y", tensors, [layer])
    a, b = (RNG.integers(p.qmin, p.qmax + 1, (3, 4, 5, 6)).astype(p.storage).transpose(0, 3, 1, 2)
            for p in params[:2])  # NCHW views of channels-last memory, as the compiled conv leaves them
    compiled = layer.run([a, b], graph, None)[0]
    reference = layer.run([a, b], graph, {})[0]
    assert compiled.dtype == reference.dtype
    np.testing.assert_array_equal(compiled, reference)
    mixed = layer.run([a, np.ascontiguousarray(b)], graph, None)[0]  # operands in different memory orders
    np.testing.assert_array_equal(mixed, reference)


@pytest.mark.parametrize("clamp_class, bounds", [(QRelu, (2, 127)), (QClamp, (-20, 60))])
def test_an_add_applies_the_clamp_after_it_in_one_lookup(clamp_class: type[QClamp], bounds: tuple[int, int],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """run_integer runs a residual add and the relu (or clamp) that alone reads it as one table look-up, split
    among threads (threads.c's rows are its elements); the result is the two layers' numpy reference bit for bit."""
    monkeypatch.setattr(integer, "PARALLEL_LOOKUPS", 1000)  # this small tensor split as a large one would be
    params = QuantParams(0.05, 2, "int8")
    tensors = {name: QTensor((32, 64, 64), params) for name in ("a", "b", "s", "y")}
    first = QRelu(name="first", inputs=["a"], outputs=["b"], low=-100, high=100)  # the add's second operand
    add = QAdd(name="add", inputs=["a", "b"], outputs=["s"], left_shift=LEFT_SHIFT,
               input_multiplier=np.array([2**30, 1717986918], np.int32), input_shift=np.array([31, 31], np.int32),
               multiplier=np.array([2**30], np.int32), shift=np.array([30 + LEFT_SHIFT], np.int32))
    clamp = clamp_class(name="relu", inputs=["s"], outputs=["y"], low=bounds[0], high=bounds[1])
    graph = QGraph("a", "y", tensors, [first, add, clamp])
    assert absorbed_clamps(graph) == {1: clamp}
    x = RNG.integers(-128, 128, (2, 64, 64, 32)).astype(np.int8).transpose(0, 3, 1, 2)
    with layer_threads(2):
        fused = run_integer(graph, x)
    traced = run_integer(graph, x, keep_intermediates=True)  # each layer's own numpy code
    np.testing.assert_array_equal(fused, traced["y"])
    assert fused.min() == bounds[0] and fused.max() <= bounds[1] and len(np.unique(fused)) > 20


def test_a_clamp_is_not_absorbed_where_another_layer_reads_the_sum() -> None:
    params = QuantParams(0.05, 0, "int8")
    tensors = {name: QTensor((4,), params) for name in ("a", "s", "r", "y")}
    add = QAdd(name="add", inputs=["a", "a"], outputs=["s"], left_shift=LEFT_SHIFT,
               input_multiplier=np.array([2**30, 2**30], np.int32), input_shift=np.array([31, 31], np.int32),
               multiplier=np.array([2**30], np.int32), shift=np.array([31 - LEFT_SHIFT], np.int32))
    relu = QRelu(name="relu", inputs=["s"], outputs=["r"], low=0, high=127)
    other = QAdd(name="add2", inputs=["s", "r"], outputs=["y"], left_shift=LEFT_SHIFT,
                 input_multiplier=add.input_multiplier, input_shift=add.input_shift, multiplier=add.multiplier,
                 shift=add.shift)
    assert absorbed_clamps(QGraph("a", "y", tensors, [add, relu, other])) == {}


@pytest.mark.parametrize("dtype, zero_point", [("int8", -3), ("uint8", 128), ("int16", 5), ("uint16", 7), ("int4", 1)])
def test_compiled_quantization_equals_the_numpy_one(dtype: str, zero_point: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """quantize.c (large arrays) against QuantParams.quantize's numpy code: exact ties and the float32
    neighbours below them, NaN and infinities, values far past the range, a channels-last view, two threads."""
    monkeypatch.setattr(integer, "PARALLEL_LOOKUPS", 1000)  # split among the threads as a large array would be
    params = QuantParams(0.0371, zero_point, dtype)
    x = (RNG.standard_normal(60000) * 2.0 ** RNG.integers(-8, 12, 60000)).astype(np.float32)
    x[:5] = [np.nan, np.inf, -np.inf, -0.0, 0.0]
    ties = (RNG.integers(-300, 300, 1000) + np.float32(0.5)) * np.float32(0.0371)
    x[100:1100], x[1100:2100] = ties, np.nextafter(ties, np.float32(0))
    view = x.reshape(6, 100, 100).transpose(0, 2, 1)
    with layer_threads(2):
        compiled = params.quantize(view)
    with monkeypatch.context() as numpy_only:
        numpy_only.setenv(native.SWITCH, "0")
        reference = params.quantize(view)
    assert compiled.dtype == reference.dtype and compiled.shape == reference.shape
    np.testing.assert_array_equal(compiled, reference)
    assert compiled.strides == (10000 * compiled.itemsize, compiled.itemsize, 100 * compiled.itemsize)
