"""Lowering of fake_quant and fixed_quant nodes (given quantization) into integer layers.

The layers it makes, and the arithmetic they run, are dabuild.qir.layers.fake_quant's."""

from __future__ import annotations

import math

import numpy as np

from dabuild.errors import BuildError
from dabuild.ir.given_quant import FixedQuant
from dabuild.qir.fixed_point import quantize_multiplier
from dabuild.qir.layers.fake_quant import QFixedQuant
from dabuild.qir.layers.shape import QConcat
from dabuild.qir.qgraph import QLayer
from dabuild.quant.lowering import Lowering, lowers


@lowers("fake_quant", layers=("concat",))
def lower_fake_quant(ctx: Lowering) -> list[QLayer]:
    node = ctx.node
    source, output = node.inputs[0], node.outputs[0]
    before, after = ctx.params(source), ctx.calibrated(output)
    ctx.output(output, after, like=source)
    if before == after:
        if source in {spec.name for spec in ctx.graph.inputs} or source in ctx.graph.outputs or source in ctx.renames:
            ctx.renames[output] = source  # interface names stay; a second quantizer of a tensor reads the first's
        else:
            ctx.renames[source] = output
        return []
    multiplier, shift = quantize_multiplier(before.scale / after.scale, ctx.where)
    return [QConcat(name=node.name, inputs=[source], outputs=[output], axis=ctx.rank(source) - 1,
                    multiplier=multiplier, shift=shift)]


@lowers("fixed_quant", layers=("fixed_quant",))
def lower_fixed_quant(ctx: Lowering) -> list[QLayer]:
    node = ctx.node
    source = ctx.params(node.inputs[0])
    if source.zero_point != 0 or not math.log2(source.scale).is_integer():
        raise BuildError(f"{ctx.where}: reads tensor {node.inputs[0]!r} of scale {source.scale:g} and zero point "
                         f"{source.zero_point}; a fixed-point quantizer reads a fixed-point tensor (a power-of-two "
                         "scale, zero point 0)")
    quant = FixedQuant.from_attrs(node.attrs)
    ctx.output(node.outputs[0], ctx.calibrated(node.outputs[0]))
    k, i, f = quant.arrays()
    return [QFixedQuant(name=node.name, inputs=[node.inputs[0]], outputs=[node.outputs[0]], k=k.astype(np.int8),
                        i=i.astype(np.int8), f=f.astype(np.int8), rounding=quant.rounding, overflow=quant.overflow)]
