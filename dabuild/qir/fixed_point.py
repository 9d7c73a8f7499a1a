"""The integer arithmetic every lowered layer shares: rounding, Q31 multipliers, requantization.

Rounding, used everywhere a real number becomes an integer (input
quantization, weights, biases, tables, requantization): round half away from
zero. It is symmetric, and in C it needs only shifts of non-negative numbers,
whose result the standard defines (right shifts of negative values are
implementation-defined in C99).

A real factor r becomes a Q31 `multiplier` in [2**30, 2**31) and a right
`shift`, r ≈ multiplier * 2**-shift; `requantize(acc, multiplier, shift)` is
round(acc * r) computed in int64 the way the C kernels compute it (exactly
beyond int64 too, for the wide accumulators of 9- to 16-bit types).

`ROUNDINGS` are the ways a requantization may round acc * multiplier / 2**shift
(a target option, `QGraph.rounding`; docs/design.md gives each formula):
`dabuild` once, half away from zero; `tflm` as TFLite Micro and CMSIS-NN do by
default, a doubling high multiply that rounds half up at 2**31, then a rounding
divide by the rest of the power of two, half away from zero; `tflm-single` as
CMSIS-NN built with CMSIS_NN_USE_SINGLE_ROUNDING (and TFLite's
TFLITE_SINGLE_ROUNDING), once, half up.
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np

from dabuild.errors import BuildError

Rounding = Literal["dabuild", "tflm", "tflm-single"]
ROUNDINGS: tuple[str, ...] = get_args(Rounding)
DOUBLING_SHIFT = 31  # the doubling high multiply's right shift: the Q31 product's high word, doubled

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MAX = 2**63 - 1
MAX_SHIFT = 62  # keeps |acc * multiplier| + rounding term inside int64


def round_half_away(x: np.ndarray) -> np.ndarray:
    """Round to nearest, ties away from zero (numpy's own rounding sends ties to even)."""
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def quantize_multiplier(real: np.ndarray | float, where: str) -> tuple[np.ndarray, np.ndarray]:
    """Positive `real` ≈ multiplier * 2**-shift with a Q31 multiplier in [2**30, 2**31)."""
    real = np.atleast_1d(np.asarray(real, dtype=np.float64))
    if np.any(~(real > 0)):
        raise BuildError(f"{where}: requantization factor {real.min():g} is not positive")
    mantissa, exponent = np.frexp(real)
    multiplier = round_half_away(mantissa * 2.0**31).astype(np.int64)
    carry = multiplier == 2**31
    multiplier[carry] //= 2
    exponent = exponent + carry
    shift = 31 - exponent.astype(np.int64)
    if np.any(shift < 1):
        raise BuildError(f"{where}: requantization multiplier {real.max():g} is too large (>= 2**30)")
    # Tiny multipliers: drop mantissa bits rather than shift past int64 (the result rounds to 0 anyway).
    excess = np.maximum(shift - MAX_SHIFT, 0)
    multiplier = round_half_away(multiplier / 2.0**excess).astype(np.int64)
    return multiplier.astype(np.int32), np.minimum(shift, MAX_SHIFT).astype(np.int32)


def requantize(accumulator: np.ndarray, multiplier: np.ndarray, shift: np.ndarray,
               rounding: str = "dabuild", wide: bool = False) -> np.ndarray:
    """round(acc * multiplier / 2**shift), ties away from zero, as the C `requantize` does it in int64
    (another `rounding` of ROUNDINGS: `_requantize_tflm`, or for the int64 sums of `wide` 16-bit inputs
    `_requantize_tflm_wide`).

    The magnitude is shifted and the sign put back, so C never right-shifts a
    negative number (implementation-defined in C99). `multiplier` and `shift`
    broadcast against `accumulator` (per-channel arrays come shaped to fit).
    The trailing zero bits of the multiplier are shifted off first (the same
    real factor, so the same result): a power-of-two factor becomes a pure
    shift. When |acc| * multiplier could still leave int64 (the wide
    accumulators of types over 8 bits), the product is taken in Python
    integers: slower, never wrong; a result beyond int64 saturates there
    (every caller clamps it to a type of at most 16 bits anyway).
    """
    accumulator = np.asarray(accumulator).astype(np.int64)
    if rounding != "dabuild" and wide:
        return _requantize_tflm_wide(accumulator, np.asarray(multiplier).astype(np.int64),
                                     np.asarray(shift).astype(np.int64))
    if rounding != "dabuild":
        return _requantize_tflm(accumulator, np.asarray(multiplier).astype(np.int64),
                                np.asarray(shift).astype(np.int64), rounding)
    multiplier, shift = _without_trailing_zeros(np.asarray(multiplier).astype(np.int64),
                                                np.asarray(shift).astype(np.int64))
    magnitude = np.abs(accumulator)
    half = np.left_shift(np.int64(1), shift - 1)
    peak = int(magnitude.max(initial=0)) * int(multiplier.max(initial=0)) + int(half.max(initial=0))
    if peak <= INT64_MAX:
        rounded = (magnitude * multiplier + half) >> shift
    else:
        exact = (magnitude.astype(object) * multiplier.astype(object) + half.astype(object)) >> shift.astype(object)
        rounded = np.minimum(exact, INT64_MAX).astype(np.int64)
    return np.where(accumulator < 0, -rounded, rounded)


def tflm_mean_requantization(multiplier: int, shift: int, count: int) -> tuple[int, int]:
    """TFLite's QuantizedMeanOrSum folds 1/count into the Q31 multiplier of s_x / s_y (`multiplier`, `shift`):
    n = min(floor(log2 count), 32, shift' + 31) for TFLite's shift' = 31 - shift, then (multiplier << n) / count
    (truncated) with the shift n larger. The same real factor as dabuild's, rounded otherwise."""
    bits = min(count.bit_length() - 1, 32, 62 - shift)
    return (multiplier << bits) // count, shift + bits


def _requantize_tflm(accumulator: np.ndarray, multiplier: np.ndarray, shift: np.ndarray,
                     rounding: str) -> np.ndarray:
    """TFLite Micro's and CMSIS-NN's requantization of `rounding` ("tflm" or "tflm-single"), in floor shifts.

    With p = acc * multiplier, "tflm-single" is floor((p + 2**(shift-1)) / 2**shift), and so is "tflm" for
    shift <= 31 (TFLM shifts acc left by 31 - shift first, so the doubling high multiply rounds last). For
    shift > 31, "tflm" takes h = floor((p + 2**30) / 2**31) (SaturatingRoundingDoublingHighMul: half up; it
    saturates only for INT32_MIN * INT32_MIN, which a positive multiplier never is), then
    RoundingDivideByPOT(h, shift - 31): floor((h + 2**(e-1) - [h < 0]) / 2**e), half away from zero. The
    multiplier keeps its trailing zeros here: the first rounding depends on them. The product is exact (Python
    integers) where it could leave int64.
    """
    peak = int(np.abs(accumulator).max(initial=0)) * int(multiplier.max(initial=0)) + 2**DOUBLING_SHIFT
    wide = peak > INT64_MAX
    product = accumulator.astype(object) * multiplier.astype(object) if wide else accumulator * multiplier
    shift = shift.astype(object) if wide else shift
    one = 1 if wide else np.int64(1)
    single = (product + (one << (shift - 1))) >> shift
    if rounding == "tflm-single":
        rounded = single
    elif rounding == "tflm":
        high = (product + (one << (DOUBLING_SHIFT - 1))) >> DOUBLING_SHIFT
        rest = np.maximum(shift - DOUBLING_SHIFT, 1)
        divided = (high + (one << (rest - 1)) - (high < 0)) >> rest
        rounded = np.where(shift > DOUBLING_SHIFT, divided, single)
    else:
        raise BuildError(f"unknown rounding {rounding!r} (known: {', '.join(ROUNDINGS)})")
    if wide:
        rounded = np.clip(np.asarray(rounded, dtype=object), -INT64_MAX, INT64_MAX).astype(np.int64)
    return np.asarray(rounded, dtype=np.int64)


def _requantize_tflm_wide(accumulator: np.ndarray, multiplier: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """TFLite's MultiplyByQuantizedMultiplier for an int64 sum (16x8 layers), which CMSIS-NN's
    arm_nn_requantize_s64 matches: the multiplier reduced to 16 bits, r = (m + 2**15) >> 16 (0x7FFF from
    0x7FFF0000 on), then floor((acc * r + 2**(s - 17)) / 2**(s - 16)), once, half up."""
    reduced = np.where(multiplier < 0x7FFF0000, (multiplier + (1 << 15)) >> 16, 0x7FFF)
    total = shift - 16
    peak = int(np.abs(accumulator).max(initial=0)) * int(reduced.max(initial=0))
    if peak + 2**62 > INT64_MAX:
        exact = (accumulator.astype(object) * reduced.astype(object)
                 + (1 << (total.astype(object) - 1))) >> total.astype(object)
        return np.clip(np.asarray(exact, dtype=object), -INT64_MAX, INT64_MAX).astype(np.int64)
    return (accumulator * reduced + (np.int64(1) << (total - 1))) >> total


def _without_trailing_zeros(multiplier: np.ndarray, shift: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """multiplier / 2**t and shift - t for the most trailing zero bits t that keep the shift >= 1."""
    lowest_bit = multiplier & -multiplier  # 0 for a zero multiplier, which stays as it is
    zeros = np.where(lowest_bit > 0, np.log2(np.maximum(lowest_bit, 1)).astype(np.int64), 0)
    drop = np.minimum(zeros, shift - 1)
    return multiplier >> drop, shift - drop


def accumulator_trace(values: np.ndarray) -> np.ndarray:
    """An accumulator as traces show it: int32 as the C kernels hold it, int64 where a wide type's sum needs it."""
    values = np.asarray(values)
    fits = values.size == 0 or (values.min() >= INT32_MIN and values.max() <= INT32_MAX)
    return values.astype(np.int32 if fits else np.int64)


def saturate(values: np.ndarray, low: int, high: int, dtype: str) -> np.ndarray:
    """Clamp integer values to [low, high] and store them as `dtype`."""
    return np.clip(values, low, high).astype(dtype)


def nearest_power_of_two(scale: float) -> str:
    """The power of two nearest `scale` and the error taking it would introduce."""
    exponent = int(np.round(np.log2(scale)))
    return f"2**{exponent} = {2.0**exponent:g} (every value {abs(2.0**exponent / scale - 1):.2%} off)"
