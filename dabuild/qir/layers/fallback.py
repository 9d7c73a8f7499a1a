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

from dabuild.ir.graph import Graph
from dabuild.qir.layers.island_order import run_ordered
from dabuild.qir.qgraph import QGraph, QLayer, Trace, layer_type
from dabuild.quant.config import QuantChoice, QuantConfig
from dabuild.quant.lowering import MINMAX_INT8, Lowering, quantize_weight

FLOAT_WRITING_OPS = ("dense", "conv")  # quantized ops that can hand an island their float result


def island_tensors(graph: Graph, config: QuantConfig, integer_writers: frozenset[str] = frozenset()) -> set[str]:
    """The tensors that stay float32 under `config`: read only by fp32 nodes, written by a node that can write
    float (fp32, or a quantized dense/conv not among `integer_writers`), and neither the graph's input nor its
    output. `integer_writers` are the quantized dense/convs whose fused activation the targets have no float
    kernel for (a conv's hard_swish on the c target): they requantize, and the island dequantizes their output."""
    readers = graph.consumers()
    floats: set[str] = set()
    for node in graph.nodes:
        choice = config.nodes[node.name]
        if not (choice.fp32 or (node.op in FLOAT_WRITING_OPS and node.name not in integer_writers)):
            continue
        floats.update(tensor for tensor in node.outputs
                      if tensor not in graph.outputs and readers.get(tensor)
                      and all(config.nodes[reader.name].fp32 for reader in readers[tensor]))
    return floats


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


def lower_fp32(ctx: Lowering) -> list[QLayer]:
    """The node as a QFloat layer; its float constants become graph constants under their own names."""
    node = ctx.node
    for name in node.inputs:
        if ctx.is_constant(name):
            ctx.constants[name] = ctx.constant(name)
        elif name not in ctx.floats:
            ctx.params(name)  # an error naming the node if the input is not lowered
    for output in node.outputs:
        _declare_output(ctx, output)
    return [QFloat(name=node.name, inputs=list(node.inputs), outputs=list(node.outputs), float_op=node.op,
                   op_attrs=dict(node.attrs))]


def lower_float_weighted(ctx: Lowering, weight: np.ndarray, bias: np.ndarray, choice: QuantChoice,
                         channel_axis: int) -> list[QLayer]:
    """A dense or conv whose output only fp32 nodes read: quantized weights, float result (see module doc)."""
    node = ctx.node
    ctx.params(node.inputs[0])
    weight_q, weight_scale = quantize_weight(weight, choice, ctx.where, channel_axis)
    _declare_output(ctx, node.outputs[0])
    return [QFloatWeighted(name=node.name, inputs=[node.inputs[0]], outputs=[node.outputs[0]], float_op=node.op,
                           op_attrs=dict(node.attrs), weight=weight_q, weight_scale=weight_scale,
                           weight_axis=channel_axis % weight.ndim, bias=np.asarray(bias, np.float32))]


def _declare_output(ctx: Lowering, tensor: str) -> None:
    if tensor in ctx.island:
        ctx.floats[tensor] = ctx.sample_shape(tensor)
    else:
        ctx.output(tensor, ctx.calibrated(tensor, MINMAX_INT8))
