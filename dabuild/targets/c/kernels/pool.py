"""Pooling, reductions and softmax.

max_pool and avg_pool run over channels-last storage: per output pixel, a
loop over the window's taps that lie inside the input (bounds tested per tap,
never per value) and a contiguous loop over the channels. Padding never wins
a max and adds a centred 0 to a sum, so skipping padded taps is exact; each
avg_pool window picks the multiplier of its element count from a table the
reference's own divisor rule fills. Reductions (mean, sum, max) walk their
input in storage order into accumulators indexed by the output. Softmax is
the reference's fixed point: an exp table indexed by max - x, an int32 sum,
one rounded division per output.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dabuild.ir.ops import OPS
from dabuild.ir.ops.pool import AvgPool, Pool
from dabuild.ir.ops.reduce import Reduce
from dabuild.qir.fixed_point import INT32_MAX
from dabuild.qir.layers.pool import QAvgPool, QMean
from dabuild.qir.layers.shape import QSelection
from dabuild.qir.layers.softmax import QSoftmax
from dabuild.qir.qgraph import QGraph, QLayer
from dabuild.targets.c.kernels.linear import window
from dabuild.targets.c.kernels.registry import CANONICAL, CHANNELS_LAST, Step, kernel
from dabuild.targets.c.layout import Storage, Walk
from dabuild.targets.c.profiles import Profile


def _planar_pool(layer: QLayer, qgraph: QGraph, profile: Profile) -> str | None:
    spatial = len(qgraph.tensors[layer.inputs[0]].shape) - 1
    return None if spatial in (1, 2) else f"{spatial}-D pooling (1-D and 2-D only)"


def _pool_window(step: Step) -> dict[str, int]:
    """The window geometry, and whether every window's rows and columns lie inside the input (`inside_rows`,
    `inside_columns`): then the kernel tests no bounds (no unreachable branches in the generated code)."""
    layer: QSelection = step.layer  # type: ignore[assignment]
    kernel_shape, strides, pads, dilations = OPS.typed(layer.op, Pool).geometry(layer.op_attrs)
    geometry = window(step, kernel_shape, strides, pads, dilations)
    for axis, along in (("height", "rows"), ("width", "columns")):
        before = geometry["pad_top" if axis == "height" else "pad_left"]
        reach = (geometry[f"out_{axis}"] - 1) * geometry[f"stride_{axis}"] - before + \
            (geometry[f"kernel_{axis}"] - 1) * geometry[f"dilation_{axis}"]
        geometry[f"inside_{along}"] = before == 0 and reach < geometry[axis]
    return geometry


@kernel("max_pool", "max_pool", inputs=CHANNELS_LAST, outputs=CHANNELS_LAST, when=_planar_pool)
def max_pool(step: Step) -> dict[str, Any]:
    return _pool_window(step)


@kernel("avg_pool", "avg_pool", inputs=CHANNELS_LAST, outputs=CHANNELS_LAST, when=_planar_pool)
def avg_pool(step: Step) -> dict[str, Any]:
    layer: QAvgPool = step.layer  # type: ignore[assignment]
    counts = OPS.typed("avg_pool", AvgPool).divisors((1, *step.inputs[0].shape), layer.op_attrs).astype(np.int64)
    return {**_pool_window(step), "count_index": counts.ravel() - 1, "multiplier": layer.multiplier,
            "shift": layer.shift, "input_zero_point": step.inputs[0].quant.zero_point,
            "output_zero_point": step.outputs[0].quant.zero_point,
            "tflm_division": step.rounding != "dabuild" and step.inputs[0].quant == step.outputs[0].quant
            and not layer.op_attrs["count_include_pad"]}


def reduction_walk(step: Step, axes: list[int], keepdims: bool) -> Walk:
    """The input in storage order; `i` its offset, `o` the (canonical) output index it accumulates into."""
    source = step.inputs[0]
    kept = [a for a in range(len(source.shape)) if a not in axes]
    out_shape = tuple(1 if a in axes else d for a, d in enumerate(source.shape)) if keepdims else \
        tuple(source.shape[a] for a in kept)
    out_strides = Storage.canonical(out_shape).strides
    accumulate = [0] * len(source.shape)
    for position, axis in enumerate(kept):
        accumulate[axis] = out_strides[axis if keepdims else position]
    return Walk.over(source.shape, source.storage.order, {"i": source.strides, "o": tuple(accumulate)})


@kernel("mean", "mean", outputs=CANONICAL)
def mean(step: Step) -> dict[str, Any]:
    layer: QMean = step.layer  # type: ignore[assignment]
    axes = [a - 1 for a in layer.axes]
    count = int(np.prod([step.inputs[0].shape[a] for a in axes]))
    scales = (step.inputs[0].quant.scale, step.outputs[0].quant.scale)
    multiplier, shift = layer.requantization(step.rounding, scales, (1, *step.inputs[0].shape))
    return {"walk": reduction_walk(step, axes, layer.keepdims), "outputs": step.outputs[0].size, "count": count,
            "input_zero_point": step.inputs[0].quant.zero_point, "multiplier": multiplier,
            "shift": shift, "output_zero_point": step.outputs[0].quant.zero_point,
            # |sum - count * zp| <= 255 * count fits int32, and a shift of 32..62: the 32-bit requantization
            "narrow": 255 * count <= INT32_MAX and 32 <= shift <= 62}


@kernel("reduce_max", "reduce_max", outputs=CANONICAL)
def reduce_max(step: Step) -> dict[str, Any]:
    layer: QSelection = step.layer  # type: ignore[assignment]
    rank = len(step.inputs[0].shape) + 1
    axes = [a - 1 for a in OPS.typed("reduce_max", Reduce).axes(rank, layer.op_attrs)]
    return {"walk": reduction_walk(step, axes, bool(layer.op_attrs["keepdims"])), "outputs": step.outputs[0].size}


@kernel("softmax", "softmax")
def softmax(step: Step) -> dict[str, Any]:
    layer: QSoftmax = step.layer  # type: ignore[assignment]
    source = step.inputs[0]
    axis = layer.axis - 1
    rows = tuple(1 if a == axis else d for a, d in enumerate(source.shape))
    return {"walk": Walk.over(rows, source.storage.order, {"x": source.strides}), "length": source.shape[axis],
            "stride": source.strides[axis], "exp_table": layer.exp_table, "qmin": source.quant.qmin,
            "output_zero_point": step.outputs[0].quant.zero_point}
