"""matmul of two integer activations (attention scores q @ k^T, weights @ v).

(a - z_a) @ (b - z_b) summed exactly in int64 (int32 suffices at int8 for
inner sizes up to 2**15), requantized by s_a * s_b / s_y. A matmul with a
constant operand became `dense` in the passes; one whose constant is the
first operand reads it as an integer constant quantized with its own range.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dabuild.qir.fixed_point import accumulator_trace, requantize
from dabuild.qir.qgraph import QGraph, QLayer, Trace, layer_type


@layer_type
@dataclass
class QMatMul(QLayer):
    op: ClassVar[str] = "matmul"
    multiplier: np.ndarray  # int32 (1,): s_a * s_b / s_y
    shift: np.ndarray       # int32 (1,)

    def run(self, inputs: list[np.ndarray], graph: QGraph, trace: Trace | None) -> list[np.ndarray]:
        a, b = (self.params(graph, i).centred(x).astype(np.int64) for i, x in enumerate(inputs))
        accumulator = np.matmul(a, b)
        if trace is not None:
            trace[f"{self.name}:accumulator"] = accumulator_trace(accumulator)
        target = self.output_params(graph)
        return [target.saturate(requantize(accumulator, self.multiplier, self.shift, graph.rounding) + target.zero_point)]
