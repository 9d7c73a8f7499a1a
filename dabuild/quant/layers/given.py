"""fake_quant: the model's own quantization of a tensor (dabuild/ir/given.py), lowered to nothing or a requantization.

`quantize` gives the fake_quant's input tensor the node's parameters (so the
layer writing it requantizes straight to them); the fake_quant itself then
moves no value: its output is the same integer tensor, and the lowered graph
calls it by the output's name. Only where the input kept other parameters (a
max pool or reshape passes its input's on; a tensor two fake_quants read) is
it a requantization: a one-input concat along the last axis, which every
integer target runs.
"""

from __future__ import annotations

from dabuild.quant.fixed_point import quantize_multiplier
from dabuild.quant.layers.shape import QConcat
from dabuild.quant.lowering import Lowering, lowers
from dabuild.quant.qgraph import QLayer


@lowers("fake_quant")
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
