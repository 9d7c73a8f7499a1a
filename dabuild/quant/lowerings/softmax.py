"""Lowering of softmax into a softmax layer.

The layers it makes, and the arithmetic they run, are dabuild.qir.layers.softmax's."""

from __future__ import annotations

import numpy as np

from dabuild.errors import BuildError
from dabuild.ir.ops import OPS
from dabuild.qir.fixed_point import INT32_MAX, round_half_away
from dabuild.qir.layers.softmax import EXP_BITS, OUTPUT_PARAMS, WIDE_OUTPUT_PARAMS, QSoftmax, int16_softmax
from dabuild.qir.qgraph import QLayer
from dabuild.quant.lowering import Lowering, lowers


@lowers("softmax", layers=("softmax",))
def lower_softmax(ctx: Lowering) -> list[QLayer]:
    node = ctx.node
    source = ctx.params(node.inputs[0])
    rank = ctx.rank(node.inputs[0])
    axis = int(OPS["softmax"].resolve(node.attrs)["axis"]) % rank
    length = ctx.shapes[node.inputs[0]].shape[axis]
    if axis == 0 or length is None or length * 2**EXP_BITS > INT32_MAX:
        raise BuildError(f"{ctx.where}: fixed-point softmax needs a known non-batch axis of fewer than "
                         f"{INT32_MAX // 2**EXP_BITS + 1} elements (axis {axis} has {length})")
    if np.dtype(source.storage).itemsize == 2:
        if source.dtype != "int16":
            raise BuildError(f"{ctx.where}: a 16-bit softmax (TFLite's) takes int16, not {source.dtype}")
        ctx.output(node.outputs[0], WIDE_OUTPUT_PARAMS)
        return [int16_softmax(node.name, list(node.inputs), list(node.outputs), axis, source.scale)]
    ctx.output(node.outputs[0], OUTPUT_PARAMS)
    steps = np.arange(source.qmax - source.qmin + 1, dtype=np.float64)
    table = round_half_away(np.exp(-source.scale * steps) * 2**EXP_BITS).astype(np.int32)
    return [QSoftmax(name=node.name, inputs=list(node.inputs), outputs=list(node.outputs), axis=axis,
                     exp_table=table)]
