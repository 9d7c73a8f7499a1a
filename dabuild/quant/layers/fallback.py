"""fp32 fallback: a node the config leaves in float runs its IR float kernel between int8 tensors.

Its int8 inputs are dequantized (float32, as `QuantParams.dequantize`), its
float constants are read as they are, the IR op runs, and each output is
quantized with the minmax range calibration saw for it. Only targets that can
run float (capability `fp32_fallback: true`) accept such a layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from dabuild.ir.ops import OPS
from dabuild.quant.lowering import MINMAX_INT8, Lowering
from dabuild.quant.qgraph import QGraph, QLayer, Trace, layer_type


@layer_type
@dataclass
class QFloat(QLayer):
    op: ClassVar[str] = "float"
    float_op: str              # the IR op it runs
    op_attrs: dict[str, Any]   # the node's attributes

    def run(self, inputs: list[np.ndarray], graph: QGraph, trace: Trace | None) -> list[np.ndarray]:
        real = [graph.tensors[name].params.dequantize(x) if name in graph.tensors else x
                for name, x in zip(self.inputs, inputs)]
        results = OPS[self.float_op].run(real, self.op_attrs)
        return [self.output_params(graph, i).quantize(y) for i, y in enumerate(results)]


def lower_fp32(ctx: Lowering) -> list[QLayer]:
    """The node as a QFloat layer; its float constants become graph constants under their own names."""
    node = ctx.node
    for name in node.inputs:
        if ctx.is_constant(name):
            ctx.constants[name] = ctx.constant(name)
        else:
            ctx.params(name)  # an error naming the node if the input is not lowered
    for output in node.outputs:
        ctx.output(output, ctx.calibrated(output, MINMAX_INT8))
    return [QFloat(name=node.name, inputs=list(node.inputs), outputs=list(node.outputs), float_op=node.op,
                   op_attrs=dict(node.attrs))]
