"""Lowering of clamps, table activations, add, sub, mul and prelu into their integer layers.

The layers it makes, and the arithmetic they run, are dabuild.qir.layers.elementwise's."""

from __future__ import annotations

from typing import Any

import numpy as np

from dabuild.errors import BuildError
from dabuild.ir.ops import OPS
from dabuild.qir.activations import clamp_bounds, is_table_activation, lookup_table
from dabuild.qir.fixed_point import quantize_multiplier
from dabuild.qir.layers.elementwise import LEFT_SHIFT, QAdd, QClamp, QLookup, QMul, QPrelu, QRelu, QSub
from dabuild.qir.qgraph import QLayer
from dabuild.quant.lowering import Lowering, lowers


def lookup_layer(ctx: Lowering, name: str, source: str, output: str, op: str, attrs: dict[str, Any]) -> QLookup:
    """The table of float op `op` from `source`'s params to `output`'s calibrated ones (declared here)."""
    target = ctx.calibrated(output)
    ctx.output(output, target)
    table = lookup_table(op, OPS[op].resolve(attrs), ctx.params(source), target)
    return QLookup(name=name, inputs=[source], outputs=[output], function=op, table=table)


@lowers("relu", "relu6", "clip", layers={"relu": ("relu",), "relu6": ("clamp",), "clip": ("clamp",)})
def lower_clamp(ctx: Lowering) -> list[QLayer]:
    node = ctx.node
    source = ctx.params(node.inputs[0])
    ctx.output(node.outputs[0], source)
    low, high = clamp_bounds(node.op, OPS[node.op].resolve(node.attrs), source)
    layer_class = QRelu if node.op == "relu" else QClamp
    return [layer_class(name=node.name, inputs=list(node.inputs), outputs=list(node.outputs), low=low, high=high)]


@lowers(*(op for op in OPS if is_table_activation(op)), layers=("lookup",))
def lower_table(ctx: Lowering) -> list[QLayer]:
    node = ctx.node
    return [lookup_layer(ctx, node.name, node.inputs[0], node.outputs[0], node.op, node.attrs)]


@lowers("add", "sub", layers={"add": ("add",), "sub": ("sub",)})
def lower_add(ctx: Lowering) -> list[QLayer]:
    node = ctx.node
    inputs = [ctx.int8_input(name) for name in node.inputs]
    scales = np.array([ctx.params(name).scale for name in inputs])
    target = ctx.calibrated(node.outputs[0])
    ctx.output(node.outputs[0], target)
    twice_max = 2 * scales.max()
    input_multiplier, input_shift = quantize_multiplier(scales / twice_max, ctx.where)
    multiplier, shift = quantize_multiplier(twice_max / (2**LEFT_SHIFT * target.scale), ctx.where)
    layer_class = QAdd if node.op == "add" else QSub
    return [layer_class(name=node.name, inputs=inputs, outputs=list(node.outputs), left_shift=LEFT_SHIFT,
                        input_multiplier=input_multiplier, input_shift=input_shift, multiplier=multiplier,
                        shift=shift)]


@lowers("mul", layers=("mul",))
def lower_mul(ctx: Lowering) -> list[QLayer]:
    inputs, multiplier, shift = ctx.product_of_inputs()
    return [QMul(name=ctx.node.name, inputs=inputs, outputs=list(ctx.node.outputs), multiplier=multiplier,
                 shift=shift)]


@lowers("prelu", layers=("lookup", "prelu"))
def lower_prelu(ctx: Lowering) -> list[QLayer]:
    """One slope: a table (leaky_relu with that slope, exact); a slope tensor: QPrelu's two requantizations."""
    node = ctx.node
    slope = ctx.constant(node.inputs[1]).astype(np.float64)
    if slope.size == 1:
        return [lookup_layer(ctx, node.name, node.inputs[0], node.outputs[0], "leaky_relu",
                             {"alpha": float(slope.ravel()[0])})]
    rank = ctx.rank(node.inputs[0])
    if slope.ndim == rank:  # a leading batch axis of the constant: it must be 1
        if slope.shape[0] != 1:
            raise BuildError(f"{ctx.where}: its slope differs from sample to sample of the batch")
        slope = slope[0]
    source = ctx.params(node.inputs[0])
    target = ctx.calibrated(node.outputs[0])
    ctx.output(node.outputs[0], target)
    multiplier, shift = quantize_multiplier(source.scale / target.scale, ctx.where)
    magnitude = np.abs(slope) * source.scale / target.scale
    negative_multiplier, negative_shift = quantize_multiplier(np.where(magnitude > 0, magnitude, 1.0), ctx.where)
    return [QPrelu(name=node.name, inputs=[node.inputs[0]], outputs=list(node.outputs), multiplier=multiplier,
                   shift=shift, negative_multiplier=negative_multiplier.reshape(slope.shape),
                   negative_shift=negative_shift.reshape(slope.shape), sign=np.sign(slope).astype(np.int32))]
