"""Lowering of data-movement ops and concat into selection and concat layers.

The layers it makes, and the arithmetic they run, are dabuild.qir.layers.shape's."""

from __future__ import annotations

import numpy as np

from dabuild.errors import BuildError
from dabuild.ir.ops import OPS
from dabuild.ir.ops.reduce import Reduce
from dabuild.qir.fixed_point import quantize_multiplier
from dabuild.qir.layers.shape import SELECTION_OPS, QConcat, QSelection
from dabuild.qir.qgraph import LAYER_TYPES, QLayer
from dabuild.quant.lowering import Lowering, lowers
from dabuild.quant.lowerings.resize import lower_linear_resize


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
