"""Float islands: the nodes a config leaves in fp32 compute in float, and so do the tensors between them.

A float island is a connected set of fp32 nodes. Quantization happens only at
its boundary:

- a tensor whose readers are all fp32 nodes stays float32 (`QGraph.floats`)
  when its writer can write float: another fp32 node, or a quantized dense or
  conv (`QFloatWeighted`: integer weights, dequantized, and its float bias;
  no requantization of its output, so the island is fed the unclipped,
  unrounded sums — the tensor a per-tensor int8 grid would hurt);
- every other input of an fp32 node is an integer tensor it dequantizes, and
  every output some quantized node (or the graph output) reads is quantized
  with the minmax range calibration saw for it.

So `QFloat` runs the node's float op on float32 values, as onnxruntime runs
the float subgraph of the QDQ model between its DequantizeLinear and
QuantizeLinear nodes; its sums in the fixed order of `island_order` (the C
target's float kernels add in it, so they match bit for bit). Only targets whose capability has `fp32_fallback: true`
(they run float islands) accept these layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from dabuild.qir.layers.island_order import run_ordered
from dabuild.qir.qgraph import QGraph, QLayer, Trace, layer_type


def _real(graph: QGraph, names: list[str], values: list[np.ndarray]) -> list[np.ndarray]:
    """Float32 inputs: integer tensors dequantized, float island tensors and float constants as they are."""
    return [graph.tensors[name].params.dequantize(x) if name in graph.tensors else np.asarray(x, np.float32)
            for name, x in zip(names, values)]


def _written(graph: QGraph, names: list[str], results: list[np.ndarray]) -> list[np.ndarray]:
    """Each output quantized at the island's boundary, or kept float32 inside it."""
    return [graph.tensors[name].params.quantize(y) if name in graph.tensors else np.asarray(y, np.float32)
            for name, y in zip(names, results)]


@layer_type
@dataclass
class QFloat(QLayer):
    """An fp32 node: its IR float kernel on float32 values."""

    op: ClassVar[str] = "float"
    computes_in_float: ClassVar[bool] = True
    float_op: str              # the IR op it runs
    op_attrs: dict[str, Any]   # the node's attributes

    def run(self, inputs: list[np.ndarray], graph: QGraph, trace: Trace | None) -> list[np.ndarray]:
        results = run_ordered(self.float_op, _real(graph, self.inputs, inputs), self.op_attrs)
        return _written(graph, self.outputs, results)


@layer_type
@dataclass
class QFloatWeighted(QLayer):
    """A quantized dense or conv writing a float island's input: the float op on its dequantized input and
    weights (integers in storage, with their scales) and its float bias, fused activation included."""

    op: ClassVar[str] = "float_weighted"
    computes_in_float: ClassVar[bool] = True
    float_op: str              # dense | conv
    op_attrs: dict[str, Any]   # the node's attributes (geometry, fused activation)
    weight: np.ndarray         # symmetric integers in the weight dtype's storage
    weight_scale: np.ndarray   # float64 (1 or out_channels,)
    weight_axis: int           # the output channel axis of the weight (conv 0, dense 1)
    bias: np.ndarray           # float32 (out_channels,)

    def real_weight(self) -> np.ndarray:
        """The dequantized weight, float32, as a DequantizeLinear computes it."""
        shape = [1] * self.weight.ndim
        shape[self.weight_axis] = -1
        scale = np.asarray(self.weight_scale, np.float32).reshape(shape if self.weight_scale.size > 1 else [1])
        return self.weight.astype(np.float32) * scale

    def run(self, inputs: list[np.ndarray], graph: QGraph, trace: Trace | None) -> list[np.ndarray]:
        [x] = _real(graph, self.inputs, inputs)
        results = run_ordered(self.float_op, [x, self.real_weight(), self.bias.astype(np.float32)], self.op_attrs)
        return _written(graph, self.outputs, results)
