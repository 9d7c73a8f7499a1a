"""Layers that only move, copy or select integer values, and concat.

Layout ops (identity, reshape, flatten, transpose, squeeze, unsqueeze, slice,
split, pad, gather with constant indices, tile, expand, nearest resize) and the max ops (max_pool, reduce_max) output values of their
input (pad: or its quantized pad value), so they run on integers without any
requantization and their outputs keep the input's params. The reference runs
the IR op's own float kernel on the integer values held in float32, which
is exact: float32 holds every value of a type up to 16 bits, and moving or comparing values never
rounds. Constant padding pads with the quantized pad value (the zero point
for the usual 0).

concat requantizes each input to the output's params (an input whose params
already equal the output's gets the multiplier 2**30 >> 30, an exact copy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from dabuild.errors import BuildError
from dabuild.ir.ops import OPS
from dabuild.ir.ops.reduce import Reduce
from dabuild.qir.fixed_point import quantize_multiplier, requantize
from dabuild.qir.layers.resize import lower_linear_resize
from dabuild.qir.qgraph import LAYER_TYPES, QGraph, QLayer, Trace, layer_type
from dabuild.quant.lowering import Lowering, lowers

SELECTION_OPS = ("identity", "reshape", "flatten", "transpose", "squeeze", "unsqueeze", "slice", "split", "pad",
                 "max_pool", "reduce_max", "gather", "tile", "expand", "resize")


@dataclass
class QSelection(QLayer):
    """The IR op `op` applied to integer values; `op_attrs` are its resolved attributes."""

    op_attrs: dict[str, Any]

    def run(self, inputs: list[np.ndarray], graph: QGraph, trace: Trace | None) -> list[np.ndarray]:
        dtype = inputs[0].dtype
        return [np.asarray(y).astype(dtype) for y in OPS[self.op].run([inputs[0].astype(np.float32)], self.op_attrs)]


for _op in SELECTION_OPS:  # one registered layer class per op, so targets key their kernels by op
    layer_type(type(f"Q{_op.title().replace('_', '')}", (QSelection,), {"op": _op, "__doc__": f"int8 {_op}."}))


@lowers(*SELECTION_OPS, layers={**{op: (op,) for op in SELECTION_OPS}, "resize": ("resize", "resize_linear")})
def lower_selection(ctx: Lowering) -> list[QLayer]:
    node = ctx.node
    source = ctx.params(node.inputs[0])
    attrs = OPS[node.op].resolve(node.attrs)
    if node.op == "pad" and attrs["mode"] == "constant":
        attrs = {**attrs, "value": float(source.quantize(np.float32(attrs["value"])))}
    if node.op == "reduce_max" and 0 in OPS.typed(node.op, Reduce).axes(ctx.rank(node.inputs[0]), attrs):
        raise BuildError(f"{ctx.where}: integer lowering does not reduce over the batch axis 0")
    if node.op == "resize" and attrs["mode"] != "nearest":
        return lower_linear_resize(ctx)
    if (node.op in ("gather", "tile") and not OPS[node.op].samplewise(attrs)) or (
            node.op == "expand" and len(attrs["shape"]) > ctx.rank(node.inputs[0])):
        raise BuildError(f"{ctx.where}: integer lowering does not move values across the batch axis 0")
    if node.op == "squeeze" and attrs["axes"] is None:  # fix the axes now: a batch of 1 must stay a batch
        attrs = {**attrs, "axes": [a for a, d in enumerate(ctx.shapes[node.inputs[0]].shape) if a > 0 and d == 1]}
    for output in node.outputs:
        ctx.output(output, source)
    layer_type = LAYER_TYPES[node.op]
    assert issubclass(layer_type, QSelection)  # every op lowered here moves values by an IR op
    return [layer_type(name=node.name, inputs=[node.inputs[0]], outputs=list(node.outputs), op_attrs=attrs)]


@layer_type
@dataclass
class QConcat(QLayer):
    """Each input requantized to the output's params, then joined along `axis` (batch axis 0 included)."""

    op: ClassVar[str] = "concat"
    axis: int
    multiplier: np.ndarray  # int32 (inputs,): s_i / s_y
    shift: np.ndarray       # int32 (inputs,)

    def run(self, inputs: list[np.ndarray], graph: QGraph, trace: Trace | None) -> list[np.ndarray]:
        target = self.output_params(graph)
        parts = [target.saturate(requantize(self.params(graph, i).centred(x), self.multiplier[i], self.shift[i], graph.rounding)
                                 + target.zero_point) for i, x in enumerate(inputs)]
        return [np.concatenate(parts, axis=self.axis)]


@lowers("concat", layers=("concat",))
def lower_concat(ctx: Lowering) -> list[QLayer]:
    node = ctx.node
    constants = [name for name in node.inputs if ctx.is_constant(name)]
    if constants:
        raise BuildError(f"{ctx.where}: integer lowering concatenates activations only; input "
                         f"{constants[0]!r} is a constant (run this node in fp32)")
    target = ctx.calibrated(node.outputs[0])
    ctx.output(node.outputs[0], target)
    scales = np.array([ctx.params(name).scale for name in node.inputs])
    multiplier, shift = quantize_multiplier(scales / target.scale, ctx.where)
    axis = int(node.attrs["axis"]) % ctx.rank(node.outputs[0])
    return [QConcat(name=node.name, inputs=list(node.inputs), outputs=list(node.outputs), axis=axis,
                    multiplier=multiplier, shift=shift)]
