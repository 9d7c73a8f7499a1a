"""Linear resize in integers: the interpolation weights in fixed point, one exact sum, one requantization.

Along each resized axis every output reads two neighbours with weights
(1 - t, t) (the float op's own coordinates, `dabuild.ir.ops.resize`); here
t becomes the integer round(t * 2**FRACTION_BITS), so an output is an exact
integer sum of the centred inputs times products of integer weights, and one
requantization by s_x / (s_y * 2**(FRACTION_BITS * axes)) puts it on the
output's grid. The weights' rounding (2**-13 of the input range at most) is far
below one output step. Nearest resize moves values and is a selection layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from dabuild.qir.fixed_point import requantize
from dabuild.qir.qgraph import QGraph, QLayer, Trace, layer_type

FRACTION_BITS = 12


@layer_type
@dataclass
class QResizeLinear(QLayer):
    op: ClassVar[str] = "resize_linear"
    op_attrs: dict[str, Any]   # the float resize's attributes, which the float-op targets write
    axes: list[int]            # the resized axes, batch-first numbering
    lower: list[list[int]]     # per resized axis: the lower neighbour of each output
    upper: list[list[int]]     # per resized axis: the upper neighbour
    weight: list[list[int]]    # per resized axis: the upper neighbour's weight in units of 2**-FRACTION_BITS
    multiplier: np.ndarray     # int32 (1,): s_x / (s_y 2**(FRACTION_BITS * len(axes)))
    shift: np.ndarray          # int32 (1,)

    def interpolate(self, centred: np.ndarray) -> np.ndarray:
        """The exact integer sums (in units of 2**-(FRACTION_BITS * axes)) of a batch of centred inputs."""
        total = centred.astype(np.int64)
        one = 1 << FRACTION_BITS
        for axis, lower, upper, weight in zip(self.axes, self.lower, self.upper, self.weight):
            shape = [1] * total.ndim
            shape[axis] = -1
            w = np.asarray(weight, np.int64).reshape(shape)
            total = np.take(total, lower, axis=axis) * (one - w) + np.take(total, upper, axis=axis) * w
        return total

    def run(self, inputs: list[np.ndarray], graph: QGraph, trace: Trace | None) -> list[np.ndarray]:
        total = self.interpolate(self.params(graph).centred(inputs[0]))
        target = self.output_params(graph)
        return [target.saturate(requantize(total, self.multiplier, self.shift, graph.rounding) + target.zero_point)]
