"""Kernels that move int8 values: zero-copy aliases and views (transpose), gathers (slice, split, layout
conversion), pad and concat.

The source offset of every output value is not re-derived here from each
op's attributes: the IR op itself runs on an array holding each input
value's storage offset, so its output holds, per output value, the offset it
copies (pad: -1 where it fills). Slice and split give an affine map
(a base and one stride per axis), which becomes a strided loop nest; pad gives
one offset table per axis. Whatever the op's attribute conventions, the C
code moves exactly the values the reference moves.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dabuild.errors import BuildError
from dabuild.ir.ops import OPS
from dabuild.qir.layers.shape import QConcat, QSelection
from dabuild.targets.c.kernels.registry import ALIAS, CANONICAL, VIEW, Operand, Step, kernel
from dabuild.targets.c.layout import Storage, Walk

FILL = -(1 << 28)  # a pad table's mark: any sum holding one is negative (rank <= 7, offsets < 2**28)


def _alias(step: Step) -> dict[str, Any]:
    return {}


for _op in ("identity", "reshape", "flatten", "squeeze", "unsqueeze"):
    kernel(_op, "alias", inputs=CANONICAL, outputs=ALIAS, dtypes=("int8", "int16", "int16/int8"))(_alias)
# A transpose moves nothing: its output is the input's bytes in a renamed storage order (Storage.permuted), and a
# reader that wants another order converts it, as it would any tensor. So an NHWC graph input transposed to the
# IR's NCHW is channels-last as it comes, and the convs read it without a copy.
kernel("transpose", "view", outputs=VIEW)(_alias)


def source_offsets(step: Step, fill: float = -1) -> list[np.ndarray]:
    """Per output of the step: the input storage offset of each output value (logical shape), `fill` where none."""
    source = step.inputs[0]
    offsets = sum(index * stride for index, stride in zip(np.indices(source.shape), source.strides))
    offsets = np.asarray(offsets, dtype=np.float64)[None]  # the batch axis the op expects
    if step.layer is None:  # a layout conversion: every value to the same logical place
        return [offsets[0].astype(np.int64)]
    layer: QSelection = step.layer  # type: ignore[assignment]
    attrs = {**layer.op_attrs, "value": fill} if layer.op == "pad" else layer.op_attrs
    return [np.asarray(result)[0].astype(np.int64) for result in OPS[layer.op].run([offsets], attrs)]


def affine_walk(step: Step, offsets: np.ndarray, out: Operand) -> Walk:
    """A walk over `out` whose input offset is the affine map `offsets` (checked value by value)."""
    indices = np.indices(offsets.shape)
    base = int(offsets.flat[0]) if offsets.size else 0
    strides = tuple(int(offsets[tuple(1 if j == a else 0 for j in range(offsets.ndim))] - base)
                    if offsets.shape[a] > 1 else 0 for a in range(offsets.ndim))
    predicted = base + sum((index * stride for index, stride in zip(indices, strides)), np.zeros(offsets.shape, int))
    if not np.array_equal(predicted, offsets):
        raise BuildError(f"layer {step.name!r}: the C target cannot express this {step.kernel.op} as a strided copy")
    return Walk.over(out.shape, out.storage.order, {"o": out.strides, "i": strides}, bases={"i": base})


@kernel("slice", "gather")
@kernel("split", "gather")
@kernel(":convert", "gather")
def gather(step: Step) -> dict[str, Any]:
    """Each output a strided loop nest copying from the input (in1.. are the further outputs for split)."""
    walks = [affine_walk(step, offsets, out) for offsets, out in zip(source_offsets(step), step.outputs)]
    return {"walks": walks, "description": step.kernel.op.lstrip(":")}


@kernel("pad", "pad")
def pad(step: Step) -> dict[str, Any]:
    """One offset table per output axis (FILL where the axis index lies in the padding)."""
    offsets = source_offsets(step)[0]
    out = step.outputs[0]
    valid = [np.moveaxis(offsets, axis, 0).reshape(offsets.shape[axis], -1).max(axis=1) >= 0
             for axis in range(offsets.ndim)]
    anchor = tuple(int(np.argmax(v)) for v in valid)  # a position no axis pads
    base = int(offsets[anchor])
    tables = []
    for axis in range(offsets.ndim):
        line = offsets[anchor[:axis] + (slice(None),) + anchor[axis + 1:]] - (base if axis else 0)
        tables.append(np.where(valid[axis], line, FILL).astype(np.int64))
    rebuilt = sum(np.meshgrid(*tables, indexing="ij"), np.zeros(offsets.shape, np.int64))
    if not np.array_equal(np.where(rebuilt < 0, -1, rebuilt), offsets):
        raise BuildError(f"layer {step.name!r}: the C target cannot express this pad per axis")
    # Axes in the output's storage order, each with its table of input offsets.
    order = out.storage.order
    return {"tables": [tables[a] for a in order], "sizes": [out.shape[a] for a in order],
            "out_strides": [out.strides[a] for a in order], "value": int(step.layer.op_attrs["value"])  # type: ignore[union-attr]
            if step.layer.op_attrs["mode"] == "constant" else 0, "mode": step.layer.op_attrs["mode"]}  # type: ignore[union-attr]


@kernel("concat", "concat")
def concat(step: Step) -> dict[str, Any]:
    """Each input requantized to the output's params (or copied when its params are the output's)."""
    layer: QConcat = step.layer  # type: ignore[assignment]
    out = step.outputs[0]
    axis = layer.axis - 1
    pieces, start = [], 0
    for k, piece in enumerate(step.inputs):
        walk = Walk.over(piece.shape, out.storage.order, {"o": out.strides, "i": piece.strides},
                         bases={"o": start * out.strides[axis]})
        pieces.append({"walk": walk, "exact": piece.params == out.params, "zero_point": piece.quant.zero_point,
                       "multiplier": int(layer.multiplier[k]), "shift": int(layer.shift[k])})
        start += piece.shape[axis]
    return {"pieces": pieces, "output_zero_point": out.quant.zero_point}


def conversion_storage(source: Storage, wanted: str) -> Storage:
    """The storage a layout conversion to `wanted` (channels_last or canonical) writes."""
    return Storage.channels_last(source.shape) if wanted == "channels_last" else Storage.canonical(source.shape)


@kernel("gather", "indexed", outputs=CANONICAL)
@kernel("tile", "indexed", outputs=CANONICAL)
@kernel("expand", "indexed", outputs=CANONICAL)
@kernel("resize", "indexed", outputs=CANONICAL)
def indexed(step: Step) -> dict[str, Any]:
    """A copy through a table holding, per output value, the input offset it reads: any selection of values
    (constant indices, repeats, nearest resizing) in one loop, at four bytes of table per output value."""
    (offsets,) = source_offsets(step)
    return {"offsets": offsets.astype(np.int32), "size": offsets.size}
