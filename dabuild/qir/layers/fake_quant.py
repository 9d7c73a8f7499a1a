"""fake_quant: the model's own quantization of a tensor (dabuild/ir/given_quant.py), lowered to nothing or a requantization.

`quantize` gives the fake_quant's input tensor the node's parameters (so the
layer writing it requantizes straight to them); the fake_quant itself then
moves no value: its output is the same integer tensor, and the lowered graph
calls it by the output's name. Only where the input kept other parameters (a
max pool or reshape passes its input's on; a tensor two fake_quants read) is
it a requantization: a one-input concat along the last axis, which every
integer target runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dabuild.errors import BuildError
from dabuild.ir.given_quant import FixedQuant
from dabuild.qir.fixed_point import quantize_multiplier
from dabuild.qir.layers.shape import QConcat
from dabuild.qir.qgraph import QGraph, QLayer, Trace, layer_type
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


@layer_type
@dataclass
class QFixedQuant(QLayer):
    """A fixed-point quantizer with a type per element (`dabuild.ir.given_quant.FixedQuant`), integers to integers:
    the input's integers (units of its scale 2**-F_in) rounded and wrapped or saturated per element, written in
    units of the output's scale 2**-F."""

    op: ClassVar[str] = "fixed_quant"
    k: np.ndarray         # int8, the per-sample shape or broadcast to it (IR layout)
    i: np.ndarray         # int8
    f: np.ndarray         # int8
    rounding: str
    overflow: str

    @property
    def quantizer(self) -> FixedQuant:
        return FixedQuant.of(self.k, self.i, self.f, self.rounding, self.overflow)

    def run(self, inputs: list[np.ndarray], graph: QGraph, trace: Trace | None) -> list[np.ndarray]:
        source, target = self.params(graph), self.output_params(graph)
        quant = self.quantizer
        if -math.log2(target.scale) != quant.fractional_bits:
            raise BuildError(f"layer {self.name!r} (fixed_quant): output scale {target.scale:g} is not 2**-"
                             f"{quant.fractional_bits}")
        centred = source.centred(inputs[0])
        return [quant.integers(centred, -int(math.log2(source.scale))).astype(target.storage)]


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
