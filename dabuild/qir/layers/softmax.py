"""Softmax in fixed point: integers in, probabilities in steps of 1/256 out (int8).

Along `axis`, d = max(x) - x is an integer in [0, qmax - qmin] (255 for
int8) whatever the zero point. A table with one entry per d holds e[d] = round(exp(-s_x * d) * 2**EXP_BITS) (a
Q16 int32; e[0] = 2**16 is exactly 1.0), the sum of the e over the axis is
an int32, and each output is the integer division
y = (e * 256 + sum / 2) / sum - 128 (rounded to nearest, halves up; all
operands non-negative, so C's division gives the same), saturated to int8.
The output params are fixed to scale 1/256, zero point -128: [0, 1) in 256
steps, whatever calibration saw (1.0 itself saturates to 255/256).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dabuild.qir.fixed_point import accumulator_trace
from dabuild.qir.qgraph import QGraph, QLayer, QuantParams, Trace, layer_type

EXP_BITS = 16


OUTPUT_PARAMS = QuantParams(1 / 256, -128)


@layer_type
@dataclass
class QSoftmax(QLayer):
    op: ClassVar[str] = "softmax"
    axis: int               # batch-first numbering
    exp_table: np.ndarray   # int32 (input levels,): round(exp(-s_x * d) * 2**EXP_BITS) for d = 0..qmax-qmin

    def run(self, inputs: list[np.ndarray], graph: QGraph, trace: Trace | None) -> list[np.ndarray]:
        x = inputs[0].astype(np.int64)
        e = self.exp_table.astype(np.int64)[x.max(axis=self.axis, keepdims=True) - x]
        total = e.sum(axis=self.axis, keepdims=True)
        if trace is not None:
            trace[f"{self.name}:accumulator"] = accumulator_trace(total)
        target = self.output_params(graph)
        return [target.saturate((e * 256 + total // 2) // total + target.zero_point)]
