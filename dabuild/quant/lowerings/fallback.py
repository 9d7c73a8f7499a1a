"""Lowering of fp32 nodes and the dense/convs that feed a float island into float layers.

The layers it makes, and the arithmetic they run, are dabuild.qir.layers.fallback's."""

from __future__ import annotations

import numpy as np

from dabuild.ir.graph import Graph
from dabuild.qir.layers.fallback import QFloat, QFloatWeighted
from dabuild.qir.qgraph import QLayer
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
