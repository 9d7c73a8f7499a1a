"""TFLite Micro's int8 LOGISTIC, TANH and HARD_SWISH, value for value, as 256-entry tables.

Shared by the integer targets that compute as TFLM: the tflite target's integer graph (`integers.as_tflm`)
and the c target with a TFLM `rounding` (`tflm_lookups`), so both equal TFLM on a model's table activations.

TFLM computes them in gemmlowp's fixed point (`gemmlowp::logistic` and `gemmlowp::tanh` on a Q4.27 input:
an exp by a Taylor polynomial and a barrel shifter of constant factors, a Newton-Raphson division), not from
a float function, so a table of the float function (what dabuild's lookup layers hold) differs from TFLM's on
a few inputs. These are ports of that arithmetic, in Python integers with int32 semantics, evaluated on every
int8 input once: the table the tflite target's reference uses for a sigmoid or tanh layer.

The output of LOGISTIC is fixed at scale 1/256, zero point -128 and TANH's at 1/128, 0 (TFLM assumes them).
HARD_SWISH (`hard_swish_table`) takes any output params: TFLite's reference HardSwish, in int16 fixed point
with float32 multipliers reduced to 16 bits.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from dabuild.qir.fixed_point import quantize_multiplier, requantize
from dabuild.qir.layers.elementwise import QLookup
from dabuild.qir.qgraph import QGraph, QLayer

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INPUT_INTEGER_BITS = 4   # TFLM's int8 LOGISTIC and TANH take their input as a Q4.27 fixed-point number
OUTPUT = {"sigmoid": (1 / 256, -128, 31 - 8), "tanh": (1 / 128, 0, 31 - 7)}   # scale, zero point, output shift


def round_away(value: float) -> int:
    """TfLiteRound: half away from zero."""
    return math.floor(abs(value) + 0.5) * (1 if value >= 0 else -1)


def _doubling_high_mul(a: int, b: int) -> int:
    """gemmlowp's SaturatingRoundingDoublingHighMul (int32)."""
    if a == b == INT32_MIN:
        return INT32_MAX
    product = a * b
    nudge = (1 << 30) if product >= 0 else 1 - (1 << 30)
    total = product + nudge
    return abs(total) // (1 << 31) * (1 if total >= 0 else -1)   # C division: towards zero


def _divide_by_pot(x: int, exponent: int) -> int:
    """gemmlowp's RoundingDivideByPOT: a rounding arithmetic right shift."""
    mask = (1 << exponent) - 1
    threshold = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> exponent) + (1 if (x & mask) > threshold else 0)


def _multiply_by_pot(x: int, exponent: int) -> int:
    """gemmlowp's SaturatingRoundingMultiplyByPOT: a saturating left shift, or a rounding right shift."""
    if exponent < 0:
        return _divide_by_pot(x, -exponent)
    threshold = (1 << (31 - exponent)) - 1
    return INT32_MAX if x > threshold else INT32_MIN if x < -threshold else x << exponent


def _exp_near_zero(a: int) -> int:
    """exp(a) for a in [-1/4, 0), Q0.31 in and out: a Taylor expansion around -1/8."""
    constant_term, one_third = 1895147668, 715827883
    x = a + (1 << 28)
    x2 = _doubling_high_mul(x, x)
    x3 = _doubling_high_mul(x2, x)
    x4 = _doubling_high_mul(x2, x2)
    x4_over_4 = _multiply_by_pot(x4, -2)
    rest = _multiply_by_pot(_doubling_high_mul(x4_over_4 + x3, one_third) + x2, -1)
    return constant_term + _doubling_high_mul(constant_term, x + rest)


BARREL = ((-2, 1672461947), (-1, 1302514674), (0, 790015084), (1, 290630308), (2, 39332535), (3, 720401), (4, 242))


def _exp_on_negative_values(a: int, integer_bits: int) -> int:
    """exp(a) for a <= 0 in Q(integer_bits), Q0.31 out (gemmlowp's exp_on_negative_values)."""
    fractional = 31 - integer_bits
    quarter = 1 << (fractional - 2)
    a_mod = (a & (quarter - 1)) - quarter
    result = _exp_near_zero(_multiply_by_pot(a_mod, integer_bits))
    remainder = a_mod - a
    for exponent, multiplier in BARREL:
        if integer_bits > exponent and remainder & (1 << (fractional + exponent)):
            result = _doubling_high_mul(result, multiplier)
    if integer_bits > 5 and a < -(1 << (36 - integer_bits)):
        result = 0
    return INT32_MAX if a == 0 else result


def _reciprocal_step(a: int) -> int:
    """x ~ 1 / ((a + 1) / 2) in Q2.29 for a in (0, 1) (Q0.31) by three Newton-Raphson steps."""
    half_denominator = (a + INT32_MAX + (1 if a + INT32_MAX >= 0 else -1)) // 2   # RoundingHalfSum(a, One)
    x = 1515870810 + _doubling_high_mul(half_denominator, -1010580540)
    for _ in range(3):
        one_minus = (1 << 29) - _doubling_high_mul(half_denominator, x)
        x = x + _multiply_by_pot(_doubling_high_mul(x, one_minus), 2)
    return x


def _logistic_fixed(a: int) -> int:
    """gemmlowp::logistic of a Q4.27 input, Q0.31 out."""
    if a == 0:
        return 1 << 30
    positive = _multiply_by_pot(_reciprocal_step(_exp_on_negative_values(-abs(a), INPUT_INTEGER_BITS)), 1)
    return positive if a > 0 else INT32_MAX - positive


def _tanh_fixed(a: int) -> int:
    """gemmlowp::tanh of a Q4.27 input, Q0.31 out."""
    if a == 0:
        return 0
    negative_abs = a if a < 0 else -a
    t = _multiply_by_pot(_reciprocal_step(_exp_on_negative_values(negative_abs, INPUT_INTEGER_BITS + 1)) - (1 << 29), 2)
    return -t if a < 0 else t


def _multiply_by_quantized_multiplier(x: int, multiplier: int, shift: int) -> int:
    left, right = max(shift, 0), max(-shift, 0)
    return _divide_by_pot(_doubling_high_mul(x * (1 << left), multiplier), right)


def tflm_table(function: str, input_scale: float, input_zero_point: int) -> np.ndarray:
    """TFLM's int8 output for every int8 input (-128..127) of LOGISTIC ("sigmoid") or TANH ("tanh"), at the
    function's fixed output params (`OUTPUT`)."""
    real_multiplier = float(np.float32(input_scale)) * float(1 << (31 - INPUT_INTEGER_BITS))
    mantissa, left_shift = math.frexp(real_multiplier)
    multiplier = round_away(mantissa * 2**31)   # no carry to 2**31 here, as TFLM's Prepare has none
    radius = math.floor(((1 << INPUT_INTEGER_BITS) - 1) * (1 << (31 - INPUT_INTEGER_BITS)) / 2.0**left_shift)
    _, zero_point, output_shift = OUTPUT[function]
    fixed = _logistic_fixed if function == "sigmoid" else _tanh_fixed
    table = []
    for q in range(-128, 128):
        centred = q - input_zero_point
        if centred <= -radius:
            table.append(-128)
        elif centred >= radius:
            table.append(127)
        else:
            value = fixed(_multiply_by_quantized_multiplier(centred, multiplier, left_shift))
            table.append(min(max(_divide_by_pot(value, output_shift) + zero_point, -128), 127))
    return np.array(table, np.int8)


def _int16(value: int) -> int:
    """A C cast to int16 (wrapping)."""
    return (value + 2**15) % 2**16 - 2**15


def _doubling_high_mul16(a: int, b: int, rounding: bool = True) -> int:
    """gemmlowp's SaturatingRoundingDoublingHighMul on int16 (`rounding`), or TFLite's SaturatingDoublingHighMul
    (truncating)."""
    if a == b == -(2**15):
        return 2**15 - 1
    product = a * b
    nudge = ((1 << 14) if product >= 0 else 1 - (1 << 14)) if rounding else 0
    total = product + nudge
    return _int16(abs(total) // (1 << 15) * (1 if total >= 0 else -1))


def _saturating_left_shift16(value: int, amount: int) -> int:
    return min(max(value * (1 << amount), -(2**15)), 2**15 - 1)


def _quantize_multiplier(real: float) -> tuple[int, int]:
    """TFLite's QuantizeMultiplier: a Q31 multiplier and its exponent (a left shift)."""
    if real == 0:
        return 0, 0
    mantissa, exponent = math.frexp(real)
    fixed = round_away(mantissa * 2**31)
    if fixed == 2**31:
        fixed, exponent = fixed // 2, exponent + 1
    return (0, 0) if exponent < -31 else (fixed, exponent)


def _to_int16_multiplier(multiplier: int) -> int:
    """TFLite's DownScaleInt32ToInt16Multiplier."""
    return 2**15 - 1 if multiplier >= INT32_MAX - (1 << 15) else (multiplier + (1 << 15)) >> 16


def hard_swish_exponent(input_scale: float, output_scale: float) -> int:
    """The exponent of HARD_SWISH's output multiplier; TFLM refuses the operator where it is positive."""
    hires = np.float32(1 / 128) * np.float32(input_scale)
    return _quantize_multiplier(float(hires / np.float32(output_scale)))[1]


def hard_swish_table(input_scale: float, input_zero_point: int, output_scale: float,
                     output_zero_point: int) -> np.ndarray:
    """TFLite's int8 HardSwish for every int8 input (-128..127): its Prepare's float32 multipliers, reduced to
    16 bits, and its Eval's int16 arithmetic."""
    hires = np.float32(1 / 128) * np.float32(input_scale)
    output_multiplier, output_exponent = _quantize_multiplier(float(hires / np.float32(output_scale)))
    reluish_multiplier, reluish_exponent = _quantize_multiplier(float(hires / (np.float32(3) / np.float32(32768))))
    output16, reluish16 = _to_int16_multiplier(output_multiplier), _to_int16_multiplier(reluish_multiplier)
    table = []
    for q in range(-128, 128):
        hires_value = _int16((q - input_zero_point) * (1 << 7))
        preshift = _doubling_high_mul16(hires_value, output16)
        reluish = hires_value
        if reluish_exponent > 0:
            reluish = _saturating_left_shift16(reluish, reluish_exponent - 1)
        reluish = _doubling_high_mul16(reluish, reluish16)
        if reluish_exponent > 0:
            reluish = _saturating_left_shift16(reluish, 1)
        if reluish_exponent < 0:
            reluish = _divide_by_pot(reluish, -reluish_exponent)
        reluish = _int16((reluish + (1 << 15)) >> 1)
        value = _divide_by_pot(_doubling_high_mul16(reluish, preshift, rounding=False), -output_exponent)
        table.append(min(max(_int16(value + output_zero_point), -128), 127))
    return np.array(table, np.int8)


def tflm_lookup(layer: QLookup, graph: QGraph) -> QLookup:
    """`layer` with the table TFLM computes where it has the function for int8 (LOGISTIC or TANH at their fixed
    output params, then TFLite's QUANTIZE to the layer's; HARD_SWISH), else as it is."""
    source, target = (graph.tensors[name].params for name in (*layer.inputs, *layer.outputs))
    if source.dtype != "int8" or target.dtype != "int8" or layer.function not in (*OUTPUT, "hard_swish"):
        return layer
    if layer.function == "hard_swish":
        return dataclasses.replace(layer, table=hard_swish_table(source.scale, source.zero_point, target.scale,
                                                                 target.zero_point))
    table = tflm_table(layer.function, source.scale, source.zero_point)
    scale, zero_point, _ = OUTPUT[layer.function]
    if (float(np.float32(scale)), zero_point) != (float(np.float32(target.scale)), target.zero_point):
        multiplier, shift = quantize_multiplier(float(np.float32(scale)) / target.scale, layer.name)
        table = target.saturate(requantize(table.astype(np.int64) - zero_point, multiplier, shift, "tflm")
                                + target.zero_point)
    return dataclasses.replace(layer, table=table)


def tflm_lookups(qgraph: QGraph) -> QGraph:
    """`qgraph` with every lookup layer TFLM has a function for computing TFLM's table (`tflm_lookup`)."""
    layers: list[QLayer] = [tflm_lookup(layer, qgraph) if isinstance(layer, QLookup) else layer
                            for layer in qgraph.layers]
    return dataclasses.replace(qgraph, layers=layers)
