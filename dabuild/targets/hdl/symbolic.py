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
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from dabuild.errors import BuildError
from dabuild.ir.ops import OPS
from dabuild.quant import layers  # noqa: F401  (registers every layer type)
from dabuild.quant.layers.elementwise import QClamp
from dabuild.quant.layers.linear import QDense
from dabuild.quant.layers.shape import SELECTION_OPS, QSelection
from dabuild.quant.dtypes import int_type
from dabuild.quant.qgraph import QGraph, QLayer, QuantParams

try:
    from da4ml.trace import FixedVariable, FixedVariableArray
except ImportError as error:  # the caller (the hdl target) turns this into a BuildError
    raise ImportError("da4ml is not installed", name="da4ml") from error

# Layout ops that only move values, as an index map (pad and the max ops compute, and are not here).
MOVING_OPS = tuple(op for op in SELECTION_OPS if op not in ("pad", "max_pool", "reduce_max"))


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


def _elementwise(array: FixedVariableArray, function: Callable[[FixedVariable], FixedVariable]) -> FixedVariableArray:
    values = np.array([function(v) for v in np.ravel(array._vars)], dtype=object).reshape(array.shape)
    return FixedVariableArray(values, array.solver_options, hwconf=array.hwconf)


def clamp(array: FixedVariableArray, low: float, high: float) -> FixedVariableArray:
    """min(max(x, low), high); free where the value range already lies inside."""
    return _elementwise(array, lambda v: v.max_of(low).min_of(high))


def requantize(accumulator: FixedVariableArray, lsb: np.ndarray, params: QuantParams, low: int, high: int,
               where: str) -> FixedVariableArray:
    """round_half_away(acc / scale) clamped to [low, high], in real units: dabuild's requantization.

    `lsb` is the accumulator's step per element (broadcast): s_in * s_w.
    """
    k, i, f = fixed_type(params, where, signed=low < 0)
    step = params.scale
    lsb = np.broadcast_to(np.asarray(lsb, dtype=np.float64), accumulator.shape)
    if low < 0 and np.any(lsb < step):  # half away from zero: pull negative ties down before rounding half up
        flat = np.ravel(accumulator._vars)
        values = np.array([v.msb_mux(v - float(d), v) if d < step else v for v, d in zip(flat, np.ravel(lsb))],
                          dtype=object).reshape(accumulator.shape)
        accumulator = FixedVariableArray(values, accumulator.solver_options, hwconf=accumulator.hwconf)
    rounded = accumulator.quantize(k, i, f, overflow_mode="SAT", round_mode="RND")
    type_low, type_high = (-(2 ** (i + f)) if k else 0), 2 ** (i + f) - 1
    if (low, high) == (type_low, type_high):
        return rounded
    return clamp(rounded, low * step, high * step)


Converter = Callable[[QLayer, QGraph, list[FixedVariableArray]], list[FixedVariableArray]]
CONVERTERS: dict[str, Converter] = {}


def converts(*ops: str) -> Callable[[Converter], Converter]:
    def register(function: Converter) -> Converter:
        for op in ops:
            CONVERTERS[op] = function
        return function
    return register


@converts("dense")
def convert_dense(layer: QDense, graph: QGraph, inputs: list[FixedVariableArray]) -> list[FixedVariableArray]:
    """x @ (w * s_w) + bias * s_in * s_w, then requantized: the constant matrix da4ml turns into adders."""
    where = f"layer {layer.name!r} (dense)"
    source = layer.params(graph)
    fractional_bits(source, f"{where}, input {layer.inputs[0]!r}")
    weight_scale = np.asarray(layer.weight_scale, dtype=np.float64)
    if not np.all(np.log2(weight_scale) == np.round(np.log2(weight_scale))):
        raise BuildError(f"{where}: weight scales {weight_scale.tolist()} are not powers of two; quantize its "
                         "weights with scheme 'pot' for the hdl target")
    lsb = source.scale * weight_scale
    accumulator = inputs[0] @ (layer.weight.astype(np.float64) * weight_scale) + layer.bias.astype(np.float64) * lsb
    output = layer.output_params(graph)
    return [requantize(accumulator, lsb, output, layer.output_min, layer.output_max, where)]


@converts("clamp", "relu")
def convert_clamp(layer: QClamp, graph: QGraph, inputs: list[FixedVariableArray]) -> list[FixedVariableArray]:
    params = layer.params(graph)
    fractional_bits(params, f"layer {layer.name!r} ({layer.op})")
    return [clamp(inputs[0], layer.low * params.scale, layer.high * params.scale)]


@converts(*MOVING_OPS)
def convert_moving(layer: QSelection, graph: QGraph, inputs: list[FixedVariableArray]) -> list[FixedVariableArray]:
    """Run the IR op on the positions of the input's elements, then gather: exact for any op that moves values."""
    shape = graph.tensors[layer.inputs[0]].shape
    positions = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.float64).reshape((1, *shape))
    flat = inputs[0].ravel()
    return [flat[np.asarray(result[0]).astype(np.int64)] for result in OPS[layer.op].run([positions], layer.op_attrs)]


def apply_qgraph(graph: QGraph, x: FixedVariableArray) -> dict[str, FixedVariableArray]:
    """Every tensor of `graph` as da4ml symbols, from the symbolic input `x` (per-sample shape, real units)."""
    params = graph.input_params
    x = x.reshape(graph.tensors[graph.input].shape)
    values = {graph.input: x.quantize(*fixed_type(params, f"graph input {graph.input!r}"))}
    for layer in graph.layers:
        converter = CONVERTERS.get(layer.op)
        if converter is None:
            raise BuildError(f"layer {layer.name!r}: op {layer.op!r} has no da4ml mapping (mapped: "
                             f"{', '.join(sorted(CONVERTERS))}); the hdl target cannot build this graph")
        values.update(zip(layer.outputs, converter(layer, graph, [values[name] for name in layer.inputs])))
    return values
