"""Layers that pick, element by element, one of their inputs' values: max, min and where.

Each input is first requantized to the output's params (as concat does: an
input whose params equal the output's is copied exactly), then the largest,
the smallest, or the one a constant condition names is taken. Requantizing
is monotonic, so max and min of the requantized values are the requantized
max and min: the layer is the float op on the grid, up to that one
rounding. A constant operand is quantized with its own exact min/max.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dabuild.qir.fixed_point import requantize
from dabuild.qir.qgraph import QGraph, QLayer, Trace, layer_type


@dataclass
class QPick(QLayer):
    """Every input requantized to the output's params, then combined by `pick`."""

    multiplier: np.ndarray  # int32 (inputs,): s_i / s_y
    shift: np.ndarray       # int32 (inputs,)

    def requantized(self, inputs: list[np.ndarray], graph: QGraph) -> list[np.ndarray]:
        target = self.output_params(graph)
        return [target.saturate(requantize(self.params(graph, i).centred(x), self.multiplier[i], self.shift[i], graph.rounding)
                                + target.zero_point) for i, x in enumerate(inputs)]


@layer_type
@dataclass
class QMax(QPick):
    op: ClassVar[str] = "max"

    def run(self, inputs: list[np.ndarray], graph: QGraph, trace: Trace | None) -> list[np.ndarray]:
        return [np.maximum(*self.requantized(inputs, graph))]


@layer_type
@dataclass
class QMin(QPick):
    op: ClassVar[str] = "min"

    def run(self, inputs: list[np.ndarray], graph: QGraph, trace: Trace | None) -> list[np.ndarray]:
        return [np.minimum(*self.requantized(inputs, graph))]


@layer_type
@dataclass
class QWhere(QPick):
    """x where the constant `condition` holds, else y (condition broadcasts against the per-sample shape)."""

    op: ClassVar[str] = "where"
    condition: np.ndarray  # bool, without a batch axis

    def run(self, inputs: list[np.ndarray], graph: QGraph, trace: Trace | None) -> list[np.ndarray]:
        x, y = self.requantized(inputs, graph)
        return [np.where(self.condition, x, y).astype(x.dtype)]
