"""Softmax in fixed point: integers in, probabilities in steps of 1/256 out (int8).

Along `axis`, d = max(x) - x is an integer in [0, qmax - qmin] (255 for
int8) whatever the zero point. A table with one entry per d holds e[d] = round(exp(-s_x * d) * 2**EXP_BITS) (a
Q16 int32; e[0] = 2**16 is exactly 1.0), the sum of the e over the axis is
an int32, and each output is the integer division
y = (e * 256 + sum / 2) / sum - 128 (rounded to nearest, halves up; all
operands non-negative, so C's division gives the same), saturated to int8.
The output params are fixed to scale 1/256, zero point -128: [0, 1) in 256
steps, whatever calibration saw (1.0 itself saturates to 255/256).

A 16-bit input (TFLite's 16x8: int16, whose zero point drops out of x - max)
takes TFLite's int16 softmax instead, in every rounding (it is an algorithm of its own, not a
requantization): d = x - max(x) rescaled so [-65535, 0] spans [-10, 0]
(`input_multiplier`, `input_shift`: TFLite's QuantizeMultiplier of
s_x / (10 / 65535), applied as rounding tflm does), e = exp of it from a
513-entry table with linear interpolation between entries, the reciprocal of
the sum from a second such table of 1 / (1 + x) after normalising the sum by
its leading zeros, and y = e * reciprocal shifted back: int16 at scale
1/32768, zero point 0. The tables are TFLite's LUTPopulate<int16_t>, in
float32 as it computes them (`int16_table`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dabuild.qir.fixed_point import accumulator_trace, quantize_multiplier, requantize, round_half_away
from dabuild.qir.qgraph import QGraph, QLayer, QuantParams, Trace, layer_type

EXP_BITS = 16
OUTPUT_PARAMS = QuantParams(1 / 256, -128)
WIDE_OUTPUT_PARAMS = QuantParams(1 / 32768, 0, "int16")   # TFLite's int16 softmax output
LUT_STEPS = 512                                            # a 16-bit table: 512 intervals, 513 entries
LEVELS = 65535                                             # int16 max - min, TFLite's `range`


def int16_table(function: Callable[[np.ndarray], np.ndarray], input_scale: float, input_zero_point: int,
                output_scale: float) -> np.ndarray:
    """TFLite's LUTPopulate<int16_t> (output zero point 0) in float32, its own arithmetic step by step:
    each of 512 samples of `function` over the input's int16 range, less half its error against linear
    interpolation at the interval's midpoint, then the value at the range's end. `function` maps float32 to
    float32 (exp is taken in float64 and rounded once, as a correctly rounded expf gives it)."""
    f32 = np.float32
    scale = f32(input_scale)
    input_min = scale * f32(-32768 - input_zero_point)
    input_max = scale * f32(32767 - input_zero_point)
    output_min, output_max = f32(output_scale) * f32(-32768), f32(output_scale) * f32(32767)
    step = f32((input_max - input_min) / f32(LUT_STEPS))
    half_step = f32(step / f32(2))
    inverse = f32(f32(65536) / f32(output_max - output_min))
    index = np.arange(LUT_STEPS, dtype=np.float32)
    starts = (input_min + (index * step).astype(np.float32)).astype(np.float32)
    value = function(starts)
    midpoint = function((starts + half_step).astype(np.float32))
    following = function((input_min + ((index + f32(1)) * step).astype(np.float32)).astype(np.float32))
    sample = round_half_away((value * inverse).astype(np.float32))
    interpolated = round_half_away(((following * inverse).astype(np.float32) + sample.astype(np.float32))
                                   .astype(np.float32) / f32(2))
    error = (interpolated - round_half_away((midpoint * inverse).astype(np.float32))).astype(np.float32)
    bias = round_half_away((error / f32(2)).astype(np.float32))
    table = np.clip(sample - bias, -32768, 32767)
    last = np.clip(round_half_away((function(np.array([input_max], np.float32)) * inverse).astype(np.float32)),
                   -32768, 32767)
    return np.concatenate([table, last]).astype(np.int16)


def _exp(values: np.ndarray) -> np.ndarray:
    return np.exp(values.astype(np.float64)).astype(np.float32)


def _reciprocal_of_one_plus(values: np.ndarray) -> np.ndarray:
    return (np.float32(1) / (np.float32(1) + values.astype(np.float32))).astype(np.float32)


def lookup16(table: np.ndarray, values: np.ndarray) -> np.ndarray:
    """TFLite's LUTLookup for int16: the entry at the top 9 bits, plus the slope to the next times the low 7
    bits, rounded (half up) back to the entry's units."""
    values = np.asarray(values, dtype=np.int64)
    index = 256 + (values >> 7)
    base = table.astype(np.int64)[index]
    slope = table.astype(np.int64)[index + 1] - base
    return (base + ((slope * (values & 0x7F) + 64) >> 7)).astype(np.int16)


@layer_type
@dataclass
class QSoftmax(QLayer):
    op: ClassVar[str] = "softmax"
    axis: int               # batch-first numbering
    exp_table: np.ndarray   # int32 (input levels,): round(exp(-s_x * d) * 2**EXP_BITS) for d = 0..qmax-qmin
    #                         16-bit input: int16 (513,), exp over [-10, 0] (int16_table)
    reciprocal_table: np.ndarray | None = None   # 16-bit input: int16 (513,), 1 / (1 + x) over [0, 1]
    input_multiplier: int = 0                    # 16-bit input: d's rescale to [-65535, 0] ~ [-10, 0]
    input_shift: int = 0

    def run(self, inputs: list[np.ndarray], graph: QGraph, trace: Trace | None) -> list[np.ndarray]:
        if self.reciprocal_table is not None:
            return [self._run_int16(inputs[0], trace)]
        x = inputs[0].astype(np.int64)
        e = self.exp_table.astype(np.int64)[x.max(axis=self.axis, keepdims=True) - x]
        total = e.sum(axis=self.axis, keepdims=True)
        if trace is not None:
            trace[f"{self.name}:accumulator"] = accumulator_trace(total)
        target = self.output_params(graph)
        return [target.saturate((e * 256 + total // 2) // total + target.zero_point)]


    def _run_int16(self, x: np.ndarray, trace: Trace | None) -> np.ndarray:
        """TFLite's SoftmaxInt16 along the axis (reference kernel, tensorflow/lite/kernels/internal/reference)."""
        assert self.reciprocal_table is not None
        x = x.astype(np.int64)
        diff = x - x.max(axis=self.axis, keepdims=True)
        scaled = requantize(diff, np.int64(self.input_multiplier), np.int64(self.input_shift), "tflm")
        e = lookup16(self.exp_table, np.clip(scaled + 32767, -32768, 32767)).astype(np.int64)
        total = e.sum(axis=self.axis, keepdims=True)
        if trace is not None:
            trace[f"{self.name}:accumulator"] = accumulator_trace(total)
        headroom = 32 - np.floor(np.log2(np.maximum(total, 1))).astype(np.int64) - 1   # leading zeros of the sum
        shifted = ((total << (headroom - 1)) + (1 << 13)) >> 14
        reciprocal = lookup16(self.reciprocal_table, np.clip(shifted - (1 << 15) - (1 << 16), -32768, 32767))
        right = 31 - headroom
        y = (e * reciprocal.astype(np.int64) + (np.int64(1) << (right - 1))) >> right
        return np.clip(y, 0, 32767).astype(np.int16)


def int16_softmax(name: str, inputs: list[str], outputs: list[str], axis: int, input_scale: float) -> QSoftmax:
    """The 16-bit softmax layer TFLite (and TFLM) computes for an int16 input of float32 scale `input_scale`."""
    multiplier, shift = quantize_multiplier(float(np.float32(input_scale)) / (10.0 / LEVELS), name)
    return QSoftmax(name=name, inputs=inputs, outputs=outputs, axis=axis,
                    exp_table=int16_table(_exp, 10 / LEVELS, 32767, 2 / LEVELS),
                    reciprocal_table=int16_table(_reciprocal_of_one_plus, 1 / LEVELS, -32768, 2 / LEVELS),
                    input_multiplier=int(multiplier[0]), input_shift=int(shift[0]))
