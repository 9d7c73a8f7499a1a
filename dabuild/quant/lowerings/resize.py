"""Lowering of a linear resize into a resize_linear layer.

The layers it makes, and the arithmetic they run, are dabuild.qir.layers.resize's."""

from __future__ import annotations

from dabuild.ir.ops import OPS
from dabuild.ir.ops.resize import linear_taps, source_coordinates
from dabuild.qir.fixed_point import quantize_multiplier, round_half_away
from dabuild.qir.layers.resize import FRACTION_BITS, QResizeLinear
from dabuild.qir.qgraph import QLayer
from dabuild.quant.lowering import Lowering


def lower_linear_resize(ctx: Lowering) -> list[QLayer]:
    """The layer of a linear resize node (called by the resize lowering, which handles nearest itself)."""
    node = ctx.node
    attrs = OPS["resize"].resolve(node.attrs)
    shape = (None, *ctx.sample_shape(node.inputs[0]))
    axes, lowers_, uppers, weights = [], [], [], []
    for axis in range(1, len(shape)):
        size, out, scale = int(shape[axis]), int(attrs["sizes"][axis]), float(attrs["scales"][axis])  # type: ignore[arg-type]
        if size == out and scale == 1:
            continue
        coordinates = source_coordinates(out, size, scale, attrs["coordinate_transformation_mode"])
        lower, upper, t = linear_taps(coordinates, size)
        axes.append(axis)
        lowers_.append([int(i) for i in lower])
        uppers.append([int(i) for i in upper])
        weights.append([int(w) for w in round_half_away(t * (1 << FRACTION_BITS))])
    source = ctx.params(node.inputs[0])
    target = ctx.calibrated(node.outputs[0])
    ctx.output(node.outputs[0], target)
    multiplier, shift = quantize_multiplier(source.scale / (target.scale * 2.0 ** (FRACTION_BITS * len(axes))),
                                            ctx.where)
    return [QResizeLinear(name=node.name, inputs=[node.inputs[0]], outputs=list(node.outputs), op_attrs=attrs, axes=axes,
                          lower=lowers_, upper=uppers, weight=weights, multiplier=multiplier, shift=shift)]
