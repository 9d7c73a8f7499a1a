"""Lowering of avg_pool, global_avg_pool, reduce_mean and reduce_sum into pooling layers.

The layers it makes, and the arithmetic they run, are dabuild.qir.layers.pool's."""

from __future__ import annotations

import math

import numpy as np

from dabuild.errors import BuildError
from dabuild.ir.ops import OPS
from dabuild.ir.ops.reduce import Reduce
from dabuild.qir.dtypes import accumulator_max
from dabuild.qir.fixed_point import quantize_multiplier
from dabuild.qir.layers.pool import QAvgPool, QMean
from dabuild.qir.qgraph import QLayer, QuantParams
from dabuild.quant.lowering import Lowering, lowers


@lowers("avg_pool", layers=("avg_pool",))
def lower_avg_pool(ctx: Lowering) -> list[QLayer]:
    node = ctx.node
    attrs = OPS["avg_pool"].resolve(node.attrs)
    size = math.prod(attrs["kernel"])
    real = ctx.params(node.inputs[0]).scale / (np.arange(1, size + 1) * _output(ctx, size).scale)
    multiplier, shift = quantize_multiplier(real, ctx.where)
    return [QAvgPool(name=node.name, inputs=list(node.inputs), outputs=list(node.outputs), op_attrs=attrs,
                     multiplier=multiplier, shift=shift)]


@lowers("global_avg_pool", "reduce_mean", "reduce_sum", layers=("mean",))
def lower_mean(ctx: Lowering) -> list[QLayer]:
    node = ctx.node
    rank = ctx.rank(node.inputs[0])
    if node.op == "global_avg_pool":
        axes, keepdims = list(range(2, rank)), True
    else:
        attrs = OPS[node.op].resolve(node.attrs)
        axes, keepdims = list(OPS.typed(node.op, Reduce).axes(rank, attrs)), bool(attrs["keepdims"])
    if 0 in axes:
        raise BuildError(f"{ctx.where}: integer lowering does not reduce over the batch axis 0")
    count = math.prod(ctx.sample_shape(node.inputs[0])[a - 1] for a in axes)
    divisor = 1 if node.op == "reduce_sum" else count
    real = ctx.params(node.inputs[0]).scale / (divisor * _output(ctx, count).scale)
    multiplier, shift = quantize_multiplier(real, ctx.where)
    return [QMean(name=node.name, inputs=list(node.inputs), outputs=list(node.outputs), axes=axes,
                  keepdims=keepdims, multiplier=multiplier, shift=shift, summed=node.op == "reduce_sum")]


def _output(ctx: Lowering, count: int) -> QuantParams:
    """Declare the calibrated output; refuse sums of `count` values that could overflow the accumulator."""
    source = ctx.params(ctx.node.inputs[0])
    if count * (source.qmax - source.qmin) > accumulator_max(source.dtype):
        raise BuildError(f"{ctx.where}: a sum of {count} {source.dtype} values could overflow the accumulator")
    target = ctx.calibrated(ctx.node.outputs[0])
    ctx.output(ctx.node.outputs[0], target)
    return target
