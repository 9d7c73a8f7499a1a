"""Averages and sums: avg_pool, global_avg_pool, reduce_mean, reduce_sum.

Each sums the centred integer inputs of a window (or of the reduced axes) in
int32 (int64 for inputs wider than 8 bits), then requantizes with a Q31 multiplier that includes 1/count:
y = round(sum * s_x / (count * s_y)) + y_zero_point, one rounding, half away
from zero (`fixed_point.requantize`). avg_pool's count varies near the border
when padding does not count, so it keeps one multiplier per possible count
(1..kernel size) and each window picks its own; padding adds a centred 0.
max_pool and reduce_max are exact selections (see `shape`). With a TFLM
rounding an avg_pool whose input and output params agree divides as TFLite
Micro does (`QAvgPool.divides_as_tflm`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from dabuild.ir.ops import OPS
from dabuild.ir.ops.pool import AvgPool
from dabuild.qir.fixed_point import accumulator_trace, quantize_multiplier, requantize, tflm_mean_requantization
from dabuild.qir.qgraph import QGraph, QLayer, Trace, layer_type


@layer_type
@dataclass
class QAvgPool(QLayer):
    """Window sums requantized by the multiplier of each window's element count."""

    op: ClassVar[str] = "avg_pool"
    op_attrs: dict[str, Any]  # the IR avg_pool's resolved attributes
    multiplier: np.ndarray    # int32 (kernel size,): entry k-1 is s_x / (k * s_y)
    shift: np.ndarray         # int32 (kernel size,)

    def divides_as_tflm(self, graph: QGraph) -> bool:
        """With a TFLM rounding, TFLite Micro's own average where it applies (input and output params equal, padding
        not counted): the raw sum divided by the count in C integer division, rounded half away from zero."""
        return (graph.rounding != "dabuild" and self.params(graph) == self.output_params(graph)
                and not self.op_attrs["count_include_pad"])

    def run(self, inputs: list[np.ndarray], graph: QGraph, trace: Trace | None) -> list[np.ndarray]:
        pool = OPS.typed("avg_pool", AvgPool)
        x = inputs[0]
        tflm = self.divides_as_tflm(graph)
        values = x.astype(np.int64) if tflm else self.params(graph).centred(x)
        taps, _ = pool.tap_views(values, self.op_attrs, 0)
        total = np.sum(taps, axis=0)
        counts = pool.divisors(x.shape, self.op_attrs).astype(np.int64) - 1
        if trace is not None:
            trace[f"{self.name}:accumulator"] = accumulator_trace(total)
        target = self.output_params(graph)
        if tflm:
            count, half = counts + 1, (counts + 1) // 2
            return [target.saturate(np.where(total > 0, (total + half) // count, -((half - total) // count)))]
        return [target.saturate(requantize(total, self.multiplier[counts], self.shift[counts], graph.rounding) + target.zero_point)]


@layer_type
@dataclass
class QMean(QLayer):
    """The sum over `axes` (batch-first numbering) requantized by s_x / (count * s_y); count 1 for a sum."""

    op: ClassVar[str] = "mean"
    axes: list[int]
    keepdims: bool
    multiplier: np.ndarray  # int32 (1,)
    shift: np.ndarray       # int32 (1,)
    summed: bool = False    # a reduce_sum (count 1), not a mean

    def requantization(self, rounding: str, scales: tuple[float, float], shape: tuple[int, ...]) -> tuple[int, int]:
        """The multiplier and shift the sum is requantized by: the layer's, or with a TFLM rounding TFLite's
        QuantizedMeanOrSum's for a mean (not its 4-D mean over height and width kept as 1x1, another kernel);
        `scales` are the input's and the output's, `shape` the input's with the batch axis."""
        multiplier, shift = int(self.multiplier[0]), int(self.shift[0])
        spatial = len(shape) == 4 and sorted(self.axes) == [2, 3] and self.keepdims
        if rounding == "dabuild" or self.summed or spatial:
            return multiplier, shift
        count = math.prod(shape[a] for a in self.axes)
        ratio, ratio_shift = quantize_multiplier(scales[0] / scales[1], self.name)
        return tflm_mean_requantization(int(ratio[0]), int(ratio_shift[0]), count)

    def run(self, inputs: list[np.ndarray], graph: QGraph, trace: Trace | None) -> list[np.ndarray]:
        total = self.params(graph).centred(inputs[0]).sum(axis=tuple(self.axes), keepdims=self.keepdims)
        if trace is not None:
            trace[f"{self.name}:accumulator"] = accumulator_trace(total)
        target = self.output_params(graph)
        scales = (self.params(graph).scale, target.scale)
        multiplier, shift = self.requantization(graph.rounding, scales, inputs[0].shape)
        return [target.saturate(requantize(total, np.int64(multiplier), np.int64(shift), graph.rounding)
                                + target.zero_point)]
