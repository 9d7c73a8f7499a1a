"""Embedding: rows of an integer table at run-time integer indices (token ids).

The table is a weight, quantized like any other (symmetric, per tensor or one
scale per row). Per tensor, the output carries the table's own params and the
layer only copies rows: exact, no arithmetic. Per row, each picked row is
requantized from its row's scale to the output's calibrated params (a Q31
multiplier and shift per row, as a dense layer's per-channel requantization).
The indices are never quantized (`qgraph.INDICES`); an index outside the
table's rows is an error, not a wrapped or clamped read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dabuild.errors import BuildError
from dabuild.ir.ops.shape import out_of_range
from dabuild.qir.fixed_point import requantize
from dabuild.qir.qgraph import QGraph, QLayer, Trace, layer_type


@layer_type
@dataclass
class QEmbedding(QLayer):
    """weight[indices], requantized per row to the output's params when `multiplier` is not empty."""

    op: ClassVar[str] = "embedding"
    weight: np.ndarray  # the table's integers (rows, ...), in its dtype's storage type
    weight_scale: np.ndarray  # float64 (1,) per tensor, (rows,) per row
    multiplier: np.ndarray  # int32 Q31, (rows,) per row: s_row / s_y; empty: rows copied as they are
    shift: np.ndarray  # int32 (rows,)

    @property
    def per_row(self) -> bool:
        return bool(self.multiplier.size)

    def picked(self, indices: np.ndarray) -> np.ndarray:
        """The indices, checked against the table's rows (BuildError naming the layer otherwise)."""
        indices = np.asarray(indices).astype(np.int64)
        problem = out_of_range(indices, len(self.weight))
        if problem is not None:
            raise BuildError(f"layer {self.name!r} (embedding): {problem}")
        return indices

    def run(self, inputs: list[np.ndarray], graph: QGraph, trace: Trace | None) -> list[np.ndarray]:
        indices = self.picked(inputs[0])
        rows = np.take(self.weight, indices, axis=0)
        if not self.per_row:
            return [rows]
        out = self.output_params(graph)
        tail = (1,) * (self.weight.ndim - 1)
        scaled = requantize(rows.astype(np.int64), self.multiplier[indices].reshape(*indices.shape, *tail),
                            self.shift[indices].reshape(*indices.shape, *tail), graph.rounding)
        return [out.saturate(scaled + out.zero_point)]
