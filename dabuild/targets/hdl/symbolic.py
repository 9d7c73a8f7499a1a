"""dabuild's integer layers as da4ml's symbolic fixed-point operations.

A QGraph whose tensors all have power-of-two scales and zero point 0 (scheme
`pot`) is a fixed-point network: a tensor of dtype intN with scale 2**-f is
the fixed-point type (signed, N - 1 - f integer bits, f fractional bits), of
dtype uintN the unsigned (N - f integer bits, f fractional bits), and every
requantization is a shift. Each converter below maps one layer kind onto
da4ml's `FixedVariableArray` arithmetic on the *real* values (q * 2**-f), so
da4ml sees constant matrices, constant additions, rounding and saturation,
and builds its adder graphs from them; the traced program computes the same
integers as dabuild's integer reference (`run_integer`), bit for bit.

Rounding: dabuild rounds half away from zero, da4ml's `RND` rounds half up.
They differ only on negative ties, so where a layer's output can be negative
one least significant bit of the accumulator is subtracted from negative
accumulators first (one multiplexer per output); after a clamp at >= 0 (relu)
both agree and nothing is added.

Windows (conv, pooling) and layout ops are index maps: the IR op runs on the
*positions* of the input's elements (-1 marks padding), and the symbols are
gathered from them, so every geometry the IR knows maps without a second
implementation of it. A conv is then one constant matrix per output position
(per group), over the taps that are not padding.

Mapped: dense, conv, clamp/relu, add/sub, mul, concat, the layout ops
(gather, tile, expand and nearest resize too), pad, max_pool, reduce_max,
avg_pool, mean (global average pooling, reduce_mean, reduce_sum), lookup
(table activations: every elementwise function), max, min, where, the
matmul of two activations, and transposed conv and linear resize (each an
integer linear map of its input, its constant matrix found by the layer's own
arithmetic on the unit vectors). Refused with a BuildError: softmax
(its integer reference divides by the sum of the exponentials, and da4ml has
no division by a variable) and fp32 fallback layers (the logic has no float).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache
from typing import TypeVar

import numpy as np

from dabuild.errors import BuildError
from dabuild.ir.ops import OPS
from dabuild.ir.ops.pool import AvgPool, Pool
from dabuild.ir.ops.reduce import Reduce
from dabuild.qir.dtypes import int_type
from dabuild.qir.fixed_point import nearest_power_of_two
from dabuild.qir.fixed_point import requantize as requantize_integers
from dabuild.qir.layers.blocked import QBlockedDense
from dabuild.qir.layers.elementwise import QAdd, QClamp, QLookup, QMul
from dabuild.qir.layers.fake_quant import QFixedQuant
from dabuild.qir.layers.linear import QConv, QConvTranspose, QDense, QWeighted
from dabuild.qir.layers.matmul import QMatMul
from dabuild.qir.layers.pool import QAvgPool, QMean
from dabuild.qir.layers.resize import FRACTION_BITS, QResizeLinear
from dabuild.qir.layers.select import QPick, QWhere
from dabuild.qir.layers.shape import SELECTION_OPS, QConcat, QSelection
from dabuild.qir.qgraph import QGraph, QLayer, QuantParams
from dabuild.registry import Registry

try:
    from da4ml.trace import FixedVariable, FixedVariableArray
    from da4ml.trace.ops import quantize, reduce
except ImportError as error:  # the caller (the hdl target) turns this into a BuildError
    raise ImportError("da4ml is not installed", name="da4ml") from error

# Layout ops that only move values, as an index map (pad and the max ops compute, and are not here).
MOVING_OPS = tuple(op for op in SELECTION_OPS if op not in ("pad", "max_pool", "reduce_max"))
# The most integers a search for a shorter averaging multiplier compares (beyond, the Q31 multiplier is kept).
SHORTEST_MULTIPLIER_SPAN = 1 << 22


def fractional_bits(params: QuantParams, where: str) -> int:
    """f of a tensor whose scale is 2**-f and zero point 0; BuildError naming `where` otherwise."""
    exponent = math.log2(params.scale) if params.scale > 0 else math.nan
    if params.zero_point != 0 or not float(exponent).is_integer():
        raise BuildError(f"{where}: scale {params.scale:g} and zero point {params.zero_point} are not a fixed-point "
                         "type; the hdl target needs power-of-two scales with zero point 0 (quantization scheme "
                         "'pot', as capability 'da4ml' offers)")
    return -int(exponent)


def fixed_type(params: QuantParams, where: str, signed: bool | None = None) -> tuple[int, int, int]:
    """(k, i, f) of da4ml for a tensor: sign bit, integer bits without the sign, fractional bits.

    `signed` (default: the dtype's own) False on a signed dtype gives the unsigned type of the same width,
    which holds the non-negative half and more (a clamp to the dtype's range follows where it matters)."""
    f = fractional_bits(params, where)
    dtype = int_type(params.dtype)
    k = int(dtype.signed if signed is None else signed and dtype.signed)
    return k, dtype.bits - k - f, f


def _powers_of_two(values: np.ndarray) -> bool:
    """Whether every value is a positive power of two (2**k for an integer k, negative k included)."""
    exponents = np.log2(np.where(values > 0, values, np.nan))
    return bool(np.all(exponents == np.round(exponents)))


def power_of_two_factor(multiplier: np.ndarray, shift: np.ndarray, where: str) -> np.ndarray:
    """The real factors multiplier * 2**-shift of a layer's requantization; BuildError unless powers of two.

    With pot scales every factor a layer derives from its scales is one (the Q31 multiplier is 2**30); the
    converters read the layer's own integers, so they compute what its `run` computes."""
    factor = np.asarray(multiplier, dtype=np.float64) * 2.0 ** -np.asarray(shift, dtype=np.float64)
    if not _powers_of_two(factor):
        raise BuildError(f"{where}: requantization factors {factor.tolist()} are not powers of two; quantize with "
                         "scheme 'pot' for the hdl target")
    return factor


def _require_unit(unit: float, expected: float, where: str) -> None:
    if unit != expected:
        raise BuildError(f"{where}: its requantization factors do not match its tensors' scales ({unit:g} != "
                         f"{expected:g}), so the fixed-point types cannot express its arithmetic")


def _array(values: np.ndarray, like: FixedVariableArray) -> FixedVariableArray:
    return FixedVariableArray(np.asarray(values, dtype=object), like.solver_options, hwconf=like.hwconf)


def _elementwise(array: FixedVariableArray, function: Callable[[FixedVariable], FixedVariable]) -> FixedVariableArray:
    return _array(np.array([function(v) for v in np.ravel(array._vars)], dtype=object).reshape(array.shape), array)


def clamp(array: FixedVariableArray, low: float, high: float) -> FixedVariableArray:
    """min(max(x, low), high); free where the value range already lies inside."""
    return _elementwise(array, lambda v: v.max_of(low).min_of(high))


def _ties_away(accumulator: FixedVariableArray, lsb: np.ndarray | float, step: float) -> FixedVariableArray:
    """Negative accumulators less one lsb, where ties are possible: after it da4ml's half-up rounding to `step`
    rounds half away from zero, as dabuild does (a tie -n.5 lands below it, other values stay in their step)."""
    lsb = np.broadcast_to(np.asarray(lsb, dtype=np.float64), accumulator.shape)
    if not np.any(lsb < step):
        return accumulator
    flat = np.ravel(accumulator._vars)
    return _array(np.array([v.msb_mux(v - float(d), v) if d < step and v.low < 0 else v
                            for v, d in zip(flat, np.ravel(lsb))], dtype=object).reshape(accumulator.shape),
                  accumulator)


def requantize(accumulator: FixedVariableArray, lsb: np.ndarray | float, params: QuantParams, low: int, high: int,
               where: str) -> FixedVariableArray:
    """round_half_away(acc / scale) clamped to [low, high], in real units: dabuild's requantization.

    `lsb` is the accumulator's step per element (broadcast): s_in * s_w for a weighted layer.
    """
    k, i, f = fixed_type(params, where, signed=low < 0)
    step = params.scale
    if low < 0:
        accumulator = _ties_away(accumulator, lsb, step)
    rounded = accumulator.quantize(k, i, f, overflow_mode="SAT", round_mode="RND")
    type_low, type_high = (-(2 ** (i + f)) if k else 0), 2 ** (i + f) - 1
    if (low, high) == (type_low, type_high):
        return rounded
    return clamp(rounded, low * step, high * step)


def saturate(accumulator: FixedVariableArray, lsb: np.ndarray | float, params: QuantParams, where: str) -> FixedVariableArray:
    """requantize to the whole range of `params`' dtype: what `QuantParams.saturate(requantize(...))` does."""
    return requantize(accumulator, lsb, params, params.qmin, params.qmax, where)


def round_to(value: FixedVariableArray, lsb: float, step: float) -> FixedVariableArray:
    """`value` (multiples of `lsb`) rounded half away from zero to multiples of `step`, never saturated."""
    if lsb >= step:
        return value
    value = _ties_away(value, np.float64(lsb), step)
    f = -int(math.log2(step))
    return _elementwise(value, lambda v: v.quantize(int(v.kif[0]), int(v.kif[1]) + 1, f, "WRAP", "RND"))


Converter = Callable[[QLayer, QGraph, list[FixedVariableArray]], list[FixedVariableArray]]
CONVERTERS: Registry[Converter] = Registry("da4ml mapping", "the hdl target")
# A converter takes the layer class of the ops it is registered under (the registry dispatches by op).
AnyConverter = TypeVar("AnyConverter", bound=Callable[..., list[FixedVariableArray]])


def converts(*ops: str) -> Callable[[AnyConverter], AnyConverter]:
    return CONVERTERS.register(*ops)


def described(layer: QLayer) -> str:
    return f"layer {layer.name!r} ({layer.op})"


# --- gathering by positions ------------------------------------------------------------------------------------


def positions(shape: tuple[int, ...]) -> np.ndarray:
    """The flat index of every element of a per-sample `shape`, as a batch of one (float: IR kernels take it)."""
    return np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.float64).reshape((1, *shape))


def gather(array: FixedVariableArray, where: np.ndarray, fill: float = 0.0) -> FixedVariableArray:
    """array.ravel()[where], with the constant `fill` where the index is -1 (padding)."""
    flat = np.append(np.ravel(array._vars), FixedVariable.from_const(fill, hwconf=array.hwconf))
    return _array(flat[np.asarray(where, dtype=np.int64)], array)


def window_positions(shape: tuple[int, ...], kernel: list[int], strides: list[int], pads: list[int],
                     dilations: list[int], ceil_mode: bool = False) -> np.ndarray:
    """(taps, C, *out) flat input indices of every window of an (C, *spatial) input, -1 in the padding."""
    attrs = {"kernel": kernel, "strides": strides, "pads": pads, "dilations": dilations, "ceil_mode": ceil_mode}
    taps, _ = OPS.typed("max_pool", Pool).tap_views(positions(shape), attrs, -1.0)
    return np.stack([tap[0] for tap in taps]).astype(np.int64)


def reduced_positions(shape: tuple[int, ...], axes: list[int]) -> np.ndarray:
    """(outputs, reduced) flat indices: one row per output of a reduction over per-sample `axes`, in output order."""
    moved = np.moveaxis(positions(shape)[0], axes, list(range(len(shape) - len(axes), len(shape))))
    return moved.reshape(-1, math.prod(shape[a] for a in axes)).astype(np.int64)


def _over_groups(array: FixedVariableArray, groups: np.ndarray,
                 combine: Callable[[FixedVariable, FixedVariable], FixedVariable]) -> FixedVariableArray:
    """Each row of `groups` (flat indices, -1 padding) combined by da4ml's latency-balanced reduction.

    Padding takes no part (it adds 0 to a sum and never wins a max); a row of padding alone is 0."""
    flat = np.ravel(array._vars)
    results = []
    for row in groups:
        values = flat[row[row >= 0]]
        if len(values) == 0:
            results.append(FixedVariable.from_const(0.0, hwconf=array.hwconf))
        else:
            results.append(reduce(combine, values) if len(values) > 1 else values[0])
    return _array(np.array(results, dtype=object), array)


def _window_groups(layer: QSelection | QAvgPool, graph: QGraph) -> np.ndarray:
    """(outputs, taps) input indices of a pooling layer's windows, in the order of its output's elements."""
    kernel, strides, pads, dilations = OPS.typed(layer.op, Pool).geometry(layer.op_attrs)
    shape = graph.tensors[layer.inputs[0]].shape
    taps = window_positions(shape, kernel, strides, pads, dilations, bool(layer.op_attrs["ceil_mode"]))
    return taps.reshape(len(taps), -1).T


# --- converters ------------------------------------------------------------------------------------------------


def _input_scales(layer: QLayer, graph: QGraph, where: str) -> list[float]:
    """The scale of each input, after checking each is a fixed-point type."""
    for i, name in enumerate(layer.inputs):
        fractional_bits(layer.params(graph, i), f"{where}, input {name!r}")
    return [layer.params(graph, i).scale for i in range(len(layer.inputs))]


def _accumulator_lsb(layer: QWeighted, graph: QGraph, where: str) -> np.ndarray:
    """s_in * s_w per output channel, after checking both are powers of two."""
    source = layer.params(graph)
    fractional_bits(source, f"{where}, input {layer.inputs[0]!r}")
    weight_scale = np.asarray(layer.weight_scale, dtype=np.float64)
    if not _powers_of_two(weight_scale):
        raise BuildError(f"{where}: weight scales {weight_scale.tolist()} are not powers of two; quantize its "
                         "weights with scheme 'pot' for the hdl target")
    return np.broadcast_to(source.scale * weight_scale, (len(layer.bias),))


def _affine(rows: FixedVariableArray, weight: np.ndarray, bias: np.ndarray, lsb: np.ndarray,
            source_scale: float) -> FixedVariableArray:
    """rows @ (w * s_w) + bias * s_in * s_w: the constant matrix da4ml turns into adders (no rows: the bias)."""
    constant = bias.astype(np.float64) * lsb
    if rows.shape[-1] == 0:
        return _array(np.broadcast_to(constant, (*rows.shape[:-1], len(constant))).copy(), rows)
    return rows @ (weight.astype(np.float64) * (lsb / source_scale)) + constant


def _finish_weighted(layer: QWeighted, graph: QGraph, accumulator: FixedVariableArray, lsb: np.ndarray,
                     where: str) -> list[FixedVariableArray]:
    output = layer.output_params(graph)
    low, high = layer.accumulator_range(layer.params(graph))
    if np.all(lsb == output.scale) and output.zero_point == 0 and output.qmin <= low.min() and high.max() <= output.qmax:
        # The output is the accumulator itself (an exact tensor of a fixed-point given model): nothing to round or
        # saturate, only the fused activation's bounds where they cut into its range (relu: da4ml's relu).
        return [clamp(accumulator, layer.output_min * output.scale if layer.output_min > low.min() else -math.inf,
                      layer.output_max * output.scale if layer.output_max < high.max() else math.inf)]
    return [requantize(accumulator, lsb, output, layer.output_min, layer.output_max, where)]


@converts("dense")
def convert_dense(layer: QDense, graph: QGraph, inputs: list[FixedVariableArray]) -> list[FixedVariableArray]:
    where = described(layer)
    lsb = _accumulator_lsb(layer, graph, where)
    accumulator = _affine(inputs[0], layer.weight, layer.bias, lsb, layer.params(graph).scale)
    return _finish_weighted(layer, graph, accumulator, lsb, where)


def _lowest_bits(values: np.ndarray) -> np.ndarray:
    """The least power of two each (dyadic) float64 is a multiple of; inf for 0."""
    mantissa, exponent = np.frexp(np.asarray(values, dtype=np.float64))
    integers = np.abs((mantissa * 2.0**53).astype(np.int64))
    lowest = np.maximum(integers & -integers, 1)
    return np.where(integers != 0, np.ldexp(lowest.astype(np.float64), exponent - 53), np.inf)


@converts("blocked_dense")
def convert_blocked_dense(layer: QBlockedDense, graph: QGraph,
                          inputs: list[FixedVariableArray]) -> list[FixedVariableArray]:
    """rows @ (w * s_w per block) + bias, exact in real units, then requantized: what the layer's run computes
    when every block multiplier is its exact ratio s_x * s_w / s_y (power-of-two scales whose ratios the
    accumulator's fractional bits hold). The accumulator's step (where ties are told apart) is the finest of
    s_x * s_w and the bias's lowest bit."""
    where = described(layer)
    source, output = layer.params(graph), layer.output_params(graph)
    fractional_bits(source, f"{where}, input {layer.inputs[0]!r}")
    scales = layer.weight_scale.ravel()
    off_grid = scales[np.log2(scales) % 1 != 0]
    if off_grid.size:
        raise BuildError(f"{where}: parameter scale: blocked weight scale {off_grid[0]:g} is not a power of two; "
                         f"nearest representable: {nearest_power_of_two(float(off_grid[0]))}")
    unit = output.scale * 2.0 ** -layer.shift.astype(np.float64)
    if not np.array_equal(layer.block_multiplier * unit, source.scale * layer.weight_scale):
        raise BuildError(f"{where}: its block scales span more than the accumulator's fractional bits hold, so its "
                         "multipliers round them and fixed-point logic cannot compute what its reference does; "
                         "nearest representable: block scales within 2**30 of each other per output")
    bias = layer.real_bias(output)
    lsb = np.minimum(source.scale * layer.weight_scale.min(axis=0), _lowest_bits(bias))
    accumulator = inputs[0] @ layer.dequantized_weight() + bias
    return [requantize(accumulator, lsb, output, layer.output_min, layer.output_max, where)]


@converts("conv")
def convert_conv(layer: QConv, graph: QGraph, inputs: list[FixedVariableArray]) -> list[FixedVariableArray]:
    """Per output position and group, the window's taps that are not padding times their rows of the weight.

    Zero padding is exact (zero point 0: a padded tap adds nothing), so padded taps are dropped, not traced."""
    where = described(layer)
    lsb = _accumulator_lsb(layer, graph, where)
    source_scale = layer.params(graph).scale
    out_channels, group_channels, *kernel = layer.weight.shape
    taps = window_positions(graph.tensors[layer.inputs[0]].shape, kernel, layer.strides, layer.pads,
                            layer.dilations)                                       # (T, C, *out)
    out_shape = taps.shape[2:]
    per_group = out_channels // layer.groups
    flat = np.ravel(inputs[0]._vars)
    parts = []
    for group in range(layer.groups):
        channels = slice(group * per_group, (group + 1) * per_group)
        matrix = layer.weight[channels].reshape(per_group, -1).T                   # (Cg * T, Og)
        windows = taps[:, group * group_channels:(group + 1) * group_channels]     # (T, Cg, *out)
        windows = np.moveaxis(windows, 0, 1).reshape(group_channels * len(taps), -1).T  # (P, Cg * T)
        rows = []
        for window in windows:
            inside = window >= 0
            rows.append(_affine(_array(flat[window[inside]], inputs[0]), matrix[inside], layer.bias[channels],
                                lsb[channels], source_scale)._vars)
        parts.append(np.array(rows, dtype=object))                                # (P, Og)
    accumulator = np.concatenate(parts, axis=1).T.reshape(out_channels, *out_shape)
    channel_lsb = lsb.reshape(-1, *[1] * len(out_shape))
    return _finish_weighted(layer, graph, _array(accumulator, inputs[0]), channel_lsb, where)


def _linear_map(inputs: FixedVariableArray, matrix: np.ndarray, lsb: np.ndarray, constant: np.ndarray,
                source_scale: float, out_shape: tuple[int, ...]) -> FixedVariableArray:
    """x @ (matrix * lsb / s_x) + constant * lsb per output element: a layer that is an integer linear map of its
    input, its matrix found by the layer's own arithmetic on the unit vectors (exact: integers)."""
    rows = _array(np.ravel(inputs._vars), inputs)
    lsb, constant = np.ravel(lsb), np.ravel(constant)
    return _affine(rows, matrix, constant, lsb, source_scale).reshape(out_shape)


@converts("conv_transpose")
def convert_conv_transpose(layer: QConvTranspose, graph: QGraph,
                           inputs: list[FixedVariableArray]) -> list[FixedVariableArray]:
    """Each output the constant combination of the inputs that reach it (zero weights cost nothing)."""
    where = described(layer)
    channel_lsb = _accumulator_lsb(layer, graph, where)
    shape, out_shape = graph.tensors[layer.inputs[0]].shape, graph.tensors[layer.outputs[0]].shape
    size = math.prod(shape)
    matrix = layer.accumulate(np.eye(size).reshape(size, *shape)).reshape(size, -1)
    per_channel = (-1, *[1] * (len(out_shape) - 1))
    lsb = np.broadcast_to(channel_lsb.reshape(per_channel), out_shape)
    bias = np.broadcast_to(layer.bias.astype(np.float64).reshape(per_channel), out_shape)
    accumulator = _linear_map(inputs[0], matrix, lsb, bias, layer.params(graph).scale, out_shape)
    return _finish_weighted(layer, graph, accumulator, lsb, where)


@converts("resize_linear")
def convert_resize_linear(layer: QResizeLinear, graph: QGraph,
                          inputs: list[FixedVariableArray]) -> list[FixedVariableArray]:
    """The fixed-point weights as a constant matrix, then the power-of-two requantization."""
    where = described(layer)
    [source_scale] = _input_scales(layer, graph, where)
    [factor] = power_of_two_factor(layer.multiplier, layer.shift, where)
    target = layer.output_params(graph)
    unit = source_scale * 2.0 ** -(FRACTION_BITS * len(layer.axes))
    _require_unit(unit / factor, target.scale, where)
    shape, out_shape = graph.tensors[layer.inputs[0]].shape, graph.tensors[layer.outputs[0]].shape
    size = math.prod(shape)
    matrix = layer.interpolate(np.eye(size, dtype=np.int64).reshape(size, *shape)).reshape(size, -1)
    lsb = np.full(out_shape, unit)
    accumulator = _linear_map(inputs[0], matrix, lsb, np.zeros(out_shape), source_scale, out_shape)
    return [saturate(accumulator, lsb, target, where)]


@converts("clamp", "relu")
def convert_clamp(layer: QClamp, graph: QGraph, inputs: list[FixedVariableArray]) -> list[FixedVariableArray]:
    params = layer.params(graph)
    fractional_bits(params, described(layer))
    return [clamp(inputs[0], layer.low * params.scale, layer.high * params.scale)]


@converts(*MOVING_OPS)
def convert_moving(layer: QSelection, graph: QGraph, inputs: list[FixedVariableArray]) -> list[FixedVariableArray]:
    """Run the IR op on the positions of the input's elements, then gather: exact for any op that moves values."""
    shape = graph.tensors[layer.inputs[0]].shape
    return [gather(inputs[0], result[0]) for result in OPS[layer.op].run([positions(shape)], layer.op_attrs)]


@converts("pad")
def convert_pad(layer: QSelection, graph: QGraph, inputs: list[FixedVariableArray]) -> list[FixedVariableArray]:
    """Constant padding is the pad value (already quantized), reflect and edge move values."""
    shape = graph.tensors[layer.inputs[0]].shape
    pads = layer.op_attrs["pads"]
    if pads[0] or pads[len(pads) // 2]:
        raise BuildError(f"{described(layer)}: pads the batch axis, which the logic (one sample) has not")
    [padded] = OPS["pad"].run([positions(shape)], {**layer.op_attrs, "value": -1.0})
    return [gather(inputs[0], padded[0], float(layer.op_attrs.get("value", 0.0)) * layer.params(graph).scale)]


@converts("max_pool", "reduce_max")
def convert_max(layer: QSelection, graph: QGraph, inputs: list[FixedVariableArray]) -> list[FixedVariableArray]:
    """The largest of each window's (or reduced axes') values that are not padding."""
    if layer.op == "max_pool":
        groups = _window_groups(layer, graph)
    else:
        shape = graph.tensors[layer.inputs[0]].shape
        axes = [a - 1 for a in OPS.typed("reduce_max", Reduce).axes(len(shape) + 1, layer.op_attrs)]
        groups = reduced_positions(shape, axes)
    if groups.shape[1] == 0 or np.any(np.all(groups < 0, axis=1)):
        raise BuildError(f"{described(layer)}: a window or reduction without any input value has maximum -inf, "
                         "which no fixed-point type holds")
    result = _over_groups(inputs[0], groups, lambda a, b: a.max_of(b))
    return [result.reshape(graph.tensors[layer.outputs[0]].shape)]


def _shortest_multiplier(multiplier: int, shift: int, low: int, high: int) -> tuple[int, int]:
    """The multiplier of fewest bits (and its shift) that requantizes every integer in [low, high] as
    (multiplier, shift) does: a 1/9 average needs a dozen bits of its Q31 mantissa, not 31, and the rest
    would be adders. Exact by construction: every integer the sum can hold is compared."""
    if high - low + 1 > SHORTEST_MULTIPLIER_SPAN:
        return multiplier, shift
    return _shortest_multiplier_cached(multiplier, shift, low, high)


@lru_cache(maxsize=4096)
def _shortest_multiplier_cached(multiplier: int, shift: int, low: int, high: int) -> tuple[int, int]:
    sums = np.arange(low, high + 1, dtype=np.int64)
    expected = requantize_integers(sums, np.int64(multiplier), np.int64(shift))
    for dropped in range(31, 0, -1):
        if dropped >= shift:
            continue
        shorter = (multiplier + (1 << (dropped - 1))) >> dropped
        if shorter and np.array_equal(requantize_integers(sums, np.int64(shorter), np.int64(shift - dropped)),
                                      expected):
            return shorter, shift - dropped
    return multiplier, shift


def _scaled_sums(sums: FixedVariableArray, source: QuantParams, multiplier: np.ndarray, shift: np.ndarray,
                 target: QuantParams, where: str) -> FixedVariableArray:
    """round_half_away(t * multiplier * 2**-shift) of the integer sums t = sums / s_x, saturated: the averaging
    layers' Q31 requantization as one constant multiplication (a shortest equivalent multiplier, per element)
    and a rounding."""
    multiplier = np.broadcast_to(multiplier, sums.shape).ravel()
    shift = np.broadcast_to(shift, sums.shape).ravel()
    products, steps = [], []
    for total, m, s in zip(np.ravel(sums._vars), multiplier, shift):
        low, high = round(float(total.low) / source.scale), round(float(total.high) / source.scale)
        m, s = _shortest_multiplier(int(m), int(s), low, high)
        step = target.scale * 2.0 ** -s
        products.append(total * (m * step / source.scale))
        steps.append(step)
    shape = sums.shape
    products_array = _array(np.array(products, dtype=object).reshape(shape), sums)
    return saturate(products_array, np.array(steps).reshape(shape), target, where)


@converts("avg_pool")
def convert_avg_pool(layer: QAvgPool, graph: QGraph, inputs: list[FixedVariableArray]) -> list[FixedVariableArray]:
    """Each window's sum (padding adds 0) times the multiplier of its own element count, then rounded."""
    where = described(layer)
    source = layer.params(graph)
    fractional_bits(source, where)
    shape = graph.tensors[layer.inputs[0]].shape
    sums = _over_groups(inputs[0], _window_groups(layer, graph), lambda a, b: a + b)
    counts = OPS.typed("avg_pool", AvgPool).divisors((1, *shape), layer.op_attrs).astype(np.int64) - 1   # (*out)
    counts = np.broadcast_to(counts, (shape[0], *counts.shape)).ravel()
    output_shape = graph.tensors[layer.outputs[0]].shape
    result = _scaled_sums(sums, source, layer.multiplier[counts], layer.shift[counts], layer.output_params(graph),
                          where)
    return [result.reshape(output_shape)]


@converts("mean")
def convert_mean(layer: QMean, graph: QGraph, inputs: list[FixedVariableArray]) -> list[FixedVariableArray]:
    """The sum over the axes times the layer's multiplier (1/count folded in), then rounded."""
    where = described(layer)
    source = layer.params(graph)
    fractional_bits(source, where)
    groups = reduced_positions(graph.tensors[layer.inputs[0]].shape, [a - 1 for a in layer.axes])
    sums = _over_groups(inputs[0], groups, lambda a, b: a + b)
    result = _scaled_sums(sums, source, layer.multiplier, layer.shift, layer.output_params(graph), where)
    return [result.reshape(graph.tensors[layer.outputs[0]].shape)]


@converts("add", "sub")
def convert_add(layer: QAdd, graph: QGraph, inputs: list[FixedVariableArray]) -> list[FixedVariableArray]:
    """Each input on the common grid u = 2 max(s_a, s_b) / 2**left_shift (exact unless its scale is finer
    than u, then rounded as the reference rounds it), the sum or difference, requantized to the output."""
    where = described(layer)
    factors = power_of_two_factor(layer.input_multiplier, layer.input_shift, where) * 2.0**layer.left_shift
    scales = _input_scales(layer, graph, where)
    unit = float(scales[0] / factors[0])
    _require_unit(scales[1] / factors[1], unit, where)
    target = layer.output_params(graph)
    [output_factor] = power_of_two_factor(layer.multiplier, layer.shift, where)
    _require_unit(unit / output_factor, target.scale, where)
    a, b = (round_to(x, scale, unit) for x, scale in zip(inputs, scales))
    total = (a + b if layer.sign > 0 else a - b).reshape(graph.tensors[layer.outputs[0]].shape)  # drops a
    return [saturate(total, min(max(scale, unit) for scale in scales), target, where)]  # constant's batch axis


@converts("mul")
def convert_mul(layer: QMul, graph: QGraph, inputs: list[FixedVariableArray]) -> list[FixedVariableArray]:
    """The exact product of the two inputs (a multiplier circuit, or constant adders for a constant input),
    requantized by the power of two s_a * s_b / s_y."""
    where = described(layer)
    scales = _input_scales(layer, graph, where)
    [factor] = power_of_two_factor(layer.multiplier, layer.shift, where)
    target = layer.output_params(graph)
    _require_unit(scales[0] * scales[1] / factor, target.scale, where)
    try:
        product = (inputs[0] * inputs[1]).reshape(graph.tensors[layer.outputs[0]].shape)
    except AssertionError as error:  # da4ml's way of saying a multiplier does not fit one pipeline stage
        raise BuildError(f"{where}: da4ml cannot place the product of two variables: {error} (raise the hdl "
                         "target's latency_cutoff, or narrow the inputs' types)") from error
    return [saturate(product, scales[0] * scales[1], target, where)]


@converts("concat")
def convert_concat(layer: QConcat, graph: QGraph, inputs: list[FixedVariableArray]) -> list[FixedVariableArray]:
    """Each input requantized to the output's type (free where it already fits), then joined."""
    where = described(layer)
    if layer.axis == 0:
        raise BuildError(f"{where}: concatenates along the batch axis, which the logic (one sample) has not")
    target = layer.output_params(graph)
    factors = power_of_two_factor(layer.multiplier, layer.shift, where)
    parts = []
    for x, factor, scale in zip(inputs, factors, _input_scales(layer, graph, where)):
        _require_unit(scale / factor, target.scale, where)
        parts.append(saturate(x, scale, target, where))
    return [np.concatenate(parts, axis=layer.axis - 1)]


def _requantized_inputs(layer: QPick, graph: QGraph, inputs: list[FixedVariableArray],
                        where: str) -> list[FixedVariableArray]:
    """Each input requantized to the output's type (as concat), broadcast to the output's shape."""
    target = layer.output_params(graph)
    shape = graph.tensors[layer.outputs[0]].shape
    results = []
    for x, factor, scale in zip(inputs, power_of_two_factor(layer.multiplier, layer.shift, where),
                                _input_scales(layer, graph, where)):
        _require_unit(scale / factor, target.scale, where)
        saturated = saturate(x, scale, target, where)
        results.append(np.broadcast_to(saturated._vars, shape))
    return results


@converts("max", "min", "where")
def convert_pick(layer: QPick, graph: QGraph, inputs: list[FixedVariableArray]) -> list[FixedVariableArray]:
    """max/min: a comparator per element; where: the constant condition chooses the wire, no logic at all."""
    where = described(layer)
    a, b = _requantized_inputs(layer, graph, inputs, where)
    if isinstance(layer, QWhere):
        chosen = np.where(np.broadcast_to(layer.condition, a.shape), a, b)
    else:
        pick = (lambda u, v: u.max_of(v)) if layer.op == "max" else (lambda u, v: u.min_of(v))
        chosen = np.array([pick(u, v) for u, v in zip(a.ravel(), b.ravel())], dtype=object).reshape(a.shape)
    return [_array(chosen, inputs[0])]


@converts("matmul")
def convert_matmul(layer: QMatMul, graph: QGraph, inputs: list[FixedVariableArray]) -> list[FixedVariableArray]:
    """The exact products and sums of the two inputs' variables, requantized by the power of two s_a s_b / s_y."""
    where = described(layer)
    scales = _input_scales(layer, graph, where)
    [factor] = power_of_two_factor(layer.multiplier, layer.shift, where)
    target = layer.output_params(graph)
    _require_unit(scales[0] * scales[1] / factor, target.scale, where)
    a, b = (x._vars for x in inputs)
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a, b = np.broadcast_to(a, (*batch, *a.shape[-2:])), np.broadcast_to(b, (*batch, *b.shape[-2:]))
    try:
        products = [(_array(left, inputs[0]) @ _array(right, inputs[0]))._vars
                    for left, right in zip(a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:]))]
    except AssertionError as error:  # da4ml's way of saying a multiplier does not fit one pipeline stage
        raise BuildError(f"{where}: da4ml cannot place the products of two variables: {error} (raise the hdl "
                         "target's latency_cutoff, or narrow the inputs' types)") from error
    product = _array(np.array(products, dtype=object).reshape(graph.tensors[layer.outputs[0]].shape), inputs[0])
    return [saturate(product, scales[0] * scales[1], target, where)]


@converts("lookup")
def convert_lookup(layer: QLookup, graph: QGraph, inputs: list[FixedVariableArray]) -> list[FixedVariableArray]:
    """da4ml's lookup table over the input type's values (a narrower input range reads a slice of it)."""
    where = described(layer)
    source, target = layer.params(graph), layer.output_params(graph)
    fractional_bits(source, where)
    fractional_bits(target, where)
    table = layer.table.astype(np.float64) * target.scale
    domain = (source.qmin * source.scale, source.qmax * source.scale, source.scale)
    return [_elementwise(inputs[0], lambda v: v.lookup(table, original_qint=domain))]


DA4ML_ROUNDING = {"floor": "TRN", "half_up": "RND"}
DA4ML_OVERFLOW = {"wrap": "WRAP", "saturate": "SAT", "saturate_symmetric": "SAT_SYM"}


@converts("fixed_quant")
def convert_fixed_quant(layer: QFixedQuant, graph: QGraph, inputs: list[FixedVariableArray]) -> list[FixedVariableArray]:
    """da4ml's own `quantize` with the types per element, as da4ml's conversion of an HGQ2 model calls it."""
    quant = layer.quantizer
    if quant.rounding not in DA4ML_ROUNDING:
        raise BuildError(f"{described(layer)}: rounding {quant.rounding!r}; da4ml rounds 'floor' (TRN) or 'half_up' "
                         "(RND) only; nearest choice: rounding 'half_up'")
    shape = graph.tensors[layer.outputs[0]].shape
    k, i, f = (np.broadcast_to(a, shape).astype(np.int8) for a in quant.arrays())
    return [quantize(inputs[0], k, i, f, overflow_mode=DA4ML_OVERFLOW[quant.overflow],
                     round_mode=DA4ML_ROUNDING[quant.rounding])]


class _Refusal:
    """A converter that refuses its op with `why`; `refuses` makes docs/ops.md show the op as refused, not mapped."""

    refuses = True

    def __init__(self, why: str) -> None:
        self.why = why

    def __call__(self, layer: QLayer, graph: QGraph, inputs: list[FixedVariableArray]) -> list[FixedVariableArray]:
        raise BuildError(f"{described(layer)}: {self.why}; the hdl target cannot build this graph")


def _refuse(why: str) -> Converter:
    return _Refusal(why)


CONVERTERS.add("softmax", _refuse(
    "its integer reference divides each exponential by their sum, and da4ml has no division by a variable "
    "(end the graph at the logits: the largest logit is the predicted class)"))
CONVERTERS.add("embedding", _refuse(
    "it reads table rows at run-time token ids, a memory lookup that da4ml's fixed adder graphs do not express "
    "(build it for the c, onnx or nnef target)"))
_FLOAT = _refuse("a float island's layer runs float arithmetic, which fixed-point logic has not "
                 "(capability 'da4ml' has no fp32 fallback)")
CONVERTERS.add("float", _FLOAT)
CONVERTERS.add("float_weighted", _FLOAT)


def converter_of(layer: QLayer) -> Converter:
    """The converter of `layer`'s op; BuildError listing the mapped ops for any other."""
    converter = CONVERTERS.get(layer.op)
    if converter is None:
        raise BuildError(f"layer {layer.name!r}: op {layer.op!r} has no da4ml mapping (mapped: "
                         f"{', '.join(CONVERTERS.names())}); the hdl target cannot build this graph")
    return converter


def constant_symbols(graph: QGraph, name: str, like: FixedVariableArray) -> FixedVariableArray:
    """An integer graph constant (a constant operand of add, mul, ...) as da4ml constants in real units."""
    return _array(graph.constants[name].astype(np.float64) * graph.tensors[name].params.scale, like)


def apply_qgraph(graph: QGraph, x: FixedVariableArray) -> dict[str, FixedVariableArray]:
    """Every tensor of `graph` as da4ml symbols, from the symbolic input `x` (per-sample shape, real units)."""
    params = graph.input_params
    x = x.reshape(graph.tensors[graph.input].shape)
    readers = [layer for layer in graph.layers if graph.input in layer.inputs]
    if params.overflow == "wrap" and all(isinstance(layer, QFixedQuant) for layer in readers):
        values = {graph.input: x}  # its quantizers declare the input's bits, as da4ml's HGQ2 conversion has it
    else:
        values = {graph.input: x.quantize(*fixed_type(params, f"graph input {graph.input!r}"))}
    for name in graph.constants:
        if name in graph.tensors:
            values[name] = constant_symbols(graph, name, x)
    for layer in graph.layers:
        values.update(zip(layer.outputs, converter_of(layer)(layer, graph, [values[name] for name in layer.inputs])))
    return values
