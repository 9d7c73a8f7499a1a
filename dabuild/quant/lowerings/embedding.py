"""Lowering of embedding nodes into embedding layers (each row quantized on its own scale).

The layers it makes, and the arithmetic they run, are dabuild.qir.layers.embedding's."""

from __future__ import annotations

import numpy as np

from dabuild.errors import BuildError
from dabuild.qir.fixed_point import quantize_multiplier
from dabuild.qir.layers.embedding import QEmbedding
from dabuild.qir.qgraph import QLayer, QuantParams
from dabuild.quant.lowering import Lowering, lowers


@lowers("embedding", weighted=True, layers=("embedding",))
def lower_embedding(ctx: Lowering) -> list[QLayer]:
    node = ctx.node
    if node.inputs[0] not in ctx.graph.integer_inputs():
        raise BuildError(f"{ctx.where}: integer lowering takes embedding indices from an integer graph input only")
    choice = ctx.config.weight
    if choice is None:
        raise BuildError(f"{ctx.where}: the quantization config gives no weight choice for the table")
    table = ctx.constant(node.inputs[1])
    weight, scales = ctx.weight_integers(table, choice, 0)
    if choice.granularity == "per_tensor":
        ctx.output(node.outputs[0], QuantParams(float(scales[0]), 0, choice.dtype))
        empty = np.zeros(0, np.int32)
        return [QEmbedding(node.name, list(node.inputs[:1]), list(node.outputs), weight, scales, empty, empty)]
    params = ctx.calibrated(node.outputs[0])
    ctx.output(node.outputs[0], params)
    multiplier, shift = quantize_multiplier(scales / params.scale, ctx.where)
    return [QEmbedding(node.name, list(node.inputs[:1]), list(node.outputs), weight, scales, multiplier, shift)]
