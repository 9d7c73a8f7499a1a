"""Lowering of matmul nodes into matmul layers.

The layers it makes, and the arithmetic they run, are dabuild.qir.layers.matmul's."""

from __future__ import annotations

from dabuild.errors import BuildError
from dabuild.qir.layers.matmul import QMatMul
from dabuild.qir.qgraph import QLayer
from dabuild.quant.lowering import Lowering, lowers


@lowers("matmul", layers=("matmul",))
def lower_matmul(ctx: Lowering) -> list[QLayer]:
    node = ctx.node
    if any(ctx.rank(name) < 2 for name in node.inputs if not ctx.is_constant(name)):
        raise BuildError(f"{ctx.where}: integer matmul needs activations of rank >= 2 (batch and rows)")
    inputs, multiplier, shift = ctx.product_of_inputs()
    return [QMatMul(name=node.name, inputs=inputs, outputs=list(node.outputs), multiplier=multiplier, shift=shift)]
