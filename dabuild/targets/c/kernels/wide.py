"""Portable kernels for 16-bit activations (TFLite's 16x8: int16 in and out, int8 weights, int64 sums).

Every CPU profile runs these, Cortex-M ones included: the DSP and Helium
kernels are int8 only, so a layer with an int16 input or output takes this
portable C instead (never an int8 kernel on 16-bit values: kernels are
chosen by dtype). A layer may mix int8 and int16 operands (the tuner's mixed
8/16 choices); each operand gets its own C element type.

The arithmetic is the integer reference's, term for term: sums of centred
inputs in int64, requantized by `dabuild_requantize_exact` (the QGraph's
rounding, exact for any int64 sum: the product with the multiplier may pass
int64 here) or, for a weighted layer with a 16-bit input under a TFLM
rounding, `dabuild_requantize_reduced` (TFLite's multiplier reduced to 16
bits for int64 sums, as `fixed_point._requantize_tflm_wide`). Layouts are
canonical (channels first) throughout; layout moves (transpose, slice) copy
through an offset table made at export by the reference op itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dabuild.ir.ops import OPS
from dabuild.ir.ops.pool import Pool
from dabuild.qir.layers.elementwise import QAdd, QClamp
from dabuild.qir.layers.linear import QConv, QDense, QWeighted
from dabuild.qir.layers.pool import QAvgPool, QMean
from dabuild.qir.layers.softmax import QSoftmax
from dabuild.qir.qgraph import QGraph, QLayer
from dabuild.targets.c.kernels.linear import interleave, window
from dabuild.targets.c.kernels.movement import source_offsets
from dabuild.targets.c.kernels.registry import CANONICAL, Operand, Step, kernel
from dabuild.targets.c.profiles import DSP, MVE, Profile

WIDE = ("int16", "int16/int8")   # layer specs with a 16-bit operand (pure int8 layers keep the int8 kernels)
BOTH = ("per_tensor", "per_channel")


def element_type(operand: Operand) -> str:
    """The C type of an integer operand's values: int16_t for a 16-bit dtype, int8_t up to 8 bits."""
    return f"{operand.quant.storage}_t"


def _types(step: Step) -> dict[str, Any]:
    return {"x_types": [element_type(o) for o in step.inputs], "y_type": element_type(step.outputs[0]),
            "output_zero_point": step.outputs[0].quant.zero_point, "output_min": step.outputs[0].quant.qmin,
            "output_max": step.outputs[0].quant.qmax}


def _weighted(step: Step, layer: QWeighted) -> dict[str, Any]:
    """Constants and requantization of a dense or conv: `reduced` where the reference requantizes a 16-bit input's
    int64 sum as TFLite does (fixed_point._requantize_tflm_wide)."""
    reduced = step.rounding != "dabuild" and step.inputs[0].quant.storage != "int8"
    return {**_types(step), "bias": layer.bias.astype(np.int64), "multiplier": layer.multiplier, "shift": layer.shift,
            "per_channel": len(layer.multiplier) > 1, "input_zero_point": step.inputs[0].quant.zero_point,
            "requantize": "dabuild_requantize_reduced" if reduced else "dabuild_requantize_exact",
            "output_min": layer.output_min, "output_max": layer.output_max}


@kernel("relu", "wide_clamp", dtypes=WIDE, inputs=CANONICAL, outputs=CANONICAL)
@kernel("clamp", "wide_clamp", dtypes=WIDE, inputs=CANONICAL, outputs=CANONICAL)
def wide_clamp(step: Step) -> dict[str, Any]:
    layer: QClamp = step.layer  # type: ignore[assignment]
    return {**_types(step), "size": step.outputs[0].size, "low": layer.low, "high": layer.high}


@kernel("transpose", "wide_gather", dtypes=WIDE, inputs=CANONICAL, outputs=CANONICAL)
@kernel("slice", "wide_gather", dtypes=WIDE, inputs=CANONICAL, outputs=CANONICAL)
def wide_gather(step: Step) -> dict[str, Any]:
    """Each output value copied from the input offset the reference op itself computes (an offset table)."""
    [offsets] = source_offsets(step)
    return {**_types(step), "size": step.outputs[0].size, "offsets": np.ascontiguousarray(offsets).ravel()}


def _planar(layer: QLayer, qgraph: QGraph, profile: Profile) -> str | None:
    rank = len(qgraph.tensors[layer.inputs[0]].shape)
    return None if rank in (2, 3) else f"{rank - 1}-D window (1-D and 2-D only)"


def _gathered(layer: QLayer, qgraph: QGraph, profile: Profile) -> str | None:
    if (why := _planar(layer, qgraph, profile)) is not None:
        return why
    if layer.groups != 1:  # type: ignore[attr-defined]
        return "grouped (a depthwise window of a few taps gains nothing from gathering it)"
    return _int16_input(layer, qgraph, profile)


def _column_bytes(step: Step) -> int:
    """wide_conv_mcu's scratch: one output pixel's window, int16."""
    return 2 * int(np.prod(step.layer.weight.shape[1:]))  # type: ignore[union-attr]


@kernel("conv", "wide_conv_mcu", config="weighted", dtypes=WIDE, inputs=CANONICAL, outputs=CANONICAL,
        granularities=BOTH, when=_gathered, scratch=_column_bytes, isas=(DSP, MVE))
def wide_conv_mcu(step: Step) -> dict[str, Any]:
    """wide_conv on a Cortex-M with the DSP extension or Helium: per output pixel its window gathered (0 where
    it pads) into one int16 column, then four output channels per pass over it (dabuild_wide_dot4), as a dense
    layer; the same exact int64 sums."""
    layer: QConv = step.layer  # type: ignore[assignment]
    geometry = window(step, list(layer.weight.shape[2:]), layer.strides, layer.pads, layer.dilations)
    depth = int(np.prod(layer.weight.shape[1:]))
    return {**_weighted(step, layer), **geometry, **_mcu_weight(step, layer.weight.reshape(len(layer.weight), depth)),
            "depth": depth}


@kernel("conv", "wide_conv", config="weighted", dtypes=WIDE, inputs=CANONICAL, outputs=CANONICAL,
        granularities=BOTH, when=_planar)
def wide_conv(step: Step) -> dict[str, Any]:
    layer: QConv = step.layer  # type: ignore[assignment]
    geometry = window(step, list(layer.weight.shape[2:]), layer.strides, layer.pads, layer.dilations)
    return {**_weighted(step, layer), **geometry, "weight": np.ascontiguousarray(layer.weight),
            "group_in": layer.weight.shape[1], "group_out": geometry["out_channels"] // layer.groups}


def _int16_input(layer: QLayer, qgraph: QGraph, profile: Profile) -> str | None:
    params = qgraph.tensors[layer.inputs[0]].params
    if params.dtype != "int16" or params.zero_point != 0:
        return "not an int16 input of zero point 0 (TFLite's symmetric 16x8)"
    return None


def _mcu_weight(step: Step, rows: np.ndarray) -> dict[str, Any]:
    """Weight rows for dabuild_wide_dot4: on a DSP profile each row's whole groups of 4 interleaved (SXTB16 then
    gives the pairs SMLAD multiplies with two int16 of x), its tail of fewer than 4 as is."""
    interleaved = step.profile.interleaved
    if interleaved:
        whole = rows.shape[-1] & ~3
        rows = np.concatenate([interleave(rows[..., :whole]), rows[..., whole:]], axis=-1)
    return {"weight": np.ascontiguousarray(rows), "interleaved": int(interleaved)}


@kernel("dense", "wide_dense_mcu", config="weighted", dtypes=WIDE, inputs=CANONICAL, outputs=CANONICAL,
        granularities=BOTH, when=_int16_input, isas=(DSP, MVE))
def wide_dense_mcu(step: Step) -> dict[str, Any]:
    """wide_dense on a Cortex-M with the DSP extension or Helium: four outputs per pass over x, int16 pairs (or
    vectors of 8) against widened int8 weights (dabuild_wide_dot4), the same exact int64 sums."""
    layer: QDense = step.layer  # type: ignore[assignment]
    return {**_weighted(step, layer), **_mcu_weight(step, layer.weight.T),
            "in_features": layer.in_features, "out_features": layer.out_features,
            "rows": step.inputs[0].size // layer.in_features}


@kernel("dense", "wide_dense", config="weighted", dtypes=WIDE, inputs=CANONICAL, outputs=CANONICAL,
        granularities=BOTH)
def wide_dense(step: Step) -> dict[str, Any]:
    layer: QDense = step.layer  # type: ignore[assignment]
    return {**_weighted(step, layer), "weight": np.ascontiguousarray(layer.weight.T),
            "in_features": layer.in_features, "out_features": layer.out_features,
            "rows": step.inputs[0].size // layer.in_features}


def _broadcast_offsets(source: Operand, shape: tuple[int, ...]) -> np.ndarray | None:
    """Per output value, the offset of the value of `source` numpy broadcasting reads (None: the same offset)."""
    rank = max(len(shape), len(source.shape))
    offsets = np.arange(source.size).reshape(source.shape)
    broadcast = np.broadcast_to(offsets.reshape((1,) * (rank - offsets.ndim) + offsets.shape), shape).ravel()
    return None if np.array_equal(broadcast, np.arange(broadcast.size)) else np.ascontiguousarray(broadcast)


@kernel("add", "wide_add", dtypes=WIDE, inputs=CANONICAL, outputs=CANONICAL)
@kernel("sub", "wide_add", dtypes=WIDE, inputs=CANONICAL, outputs=CANONICAL)
def wide_add(step: Step) -> dict[str, Any]:
    """Broadcast operands (and constant ones, graph constants) read through offset tables; a clamp fused into the
    step (a residual block's relu, `Step.clamp`) narrows the output bounds."""
    layer: QAdd = step.layer  # type: ignore[assignment]
    output = step.outputs[0].quant
    low, high = (output.qmin, output.qmax) if step.clamp is None else (max(output.qmin, step.clamp.low),
                                                                        min(output.qmax, step.clamp.high))
    return {**_types(step), "output_min": low, "output_max": high, "size": step.outputs[0].size, "sign": layer.sign, "left_shift": layer.left_shift,
            "offsets": [_broadcast_offsets(source, step.outputs[0].shape) for source in step.inputs],
            "zero_points": [o.quant.zero_point for o in step.inputs],
            "input_multiplier": [int(m) for m in layer.input_multiplier],
            "input_shift": [int(s) for s in layer.input_shift],
            "multiplier": int(layer.multiplier[0]), "shift": int(layer.shift[0])}


def _pool(layer: QLayer, qgraph: QGraph, profile: Profile) -> str | None:
    if layer.op_attrs.get("ceil_mode"):  # type: ignore[attr-defined]
        return "ceil_mode windows"
    return _planar(layer, qgraph, profile)


def _window(step: Step) -> dict[str, Any]:
    kernel_shape, strides, pads, dilations = OPS.typed(step.kernel.op, Pool).geometry(step.layer.op_attrs)  # type: ignore[union-attr]
    return {**_types(step), **window(step, kernel_shape, strides, pads, dilations),
            "input_zero_point": step.inputs[0].quant.zero_point}


@kernel("max_pool", "wide_max_pool", dtypes=WIDE, inputs=CANONICAL, outputs=CANONICAL, when=_pool)
def wide_max_pool(step: Step) -> dict[str, Any]:
    return _window(step)


@kernel("avg_pool", "wide_avg_pool", dtypes=WIDE, inputs=CANONICAL, outputs=CANONICAL, when=_pool)
def wide_avg_pool(step: Step) -> dict[str, Any]:
    """TFLM's integer division where the reference takes it (QAvgPool.divides_as_tflm), else the sum of centred
    values requantized by the multiplier of its count."""
    layer: QAvgPool = step.layer  # type: ignore[assignment]
    divides = (step.rounding != "dabuild" and step.inputs[0].quant == step.outputs[0].quant
               and not layer.op_attrs["count_include_pad"])
    return {**_window(step), "divides": divides, "count_pads": bool(layer.op_attrs["count_include_pad"]),
            "multiplier": layer.multiplier, "shift": layer.shift}


@kernel("mean", "wide_mean", dtypes=WIDE, inputs=CANONICAL, outputs=CANONICAL)
def wide_mean(step: Step) -> dict[str, Any]:
    """Each output the sum of its inputs, listed output by output in an offset table (the reduction's members)."""
    layer: QMean = step.layer  # type: ignore[assignment]
    source = step.inputs[0]
    offsets = np.arange(source.size).reshape(source.shape)
    axes = tuple(axis - 1 for axis in layer.axes)   # the layer numbers axes with the batch first
    kept = [axis for axis in range(len(source.shape)) if axis not in axes]
    members = np.ascontiguousarray(offsets.transpose(*kept, *axes)).ravel()
    scales = (source.quant.scale, step.outputs[0].quant.scale)
    multiplier, shift = layer.requantization(step.rounding, scales, (1, *source.shape))
    return {**_types(step), "members": members, "count": source.size // step.outputs[0].size,
            "outputs": step.outputs[0].size, "input_zero_point": source.quant.zero_point,
            "multiplier": multiplier, "shift": shift}


def _int16_softmax(layer: QLayer, qgraph: QGraph, profile: Profile) -> str | None:
    return None if getattr(layer, "reciprocal_table", None) is not None else "not TFLite's int16 softmax"


@kernel("softmax", "wide_softmax", dtypes=WIDE, inputs=CANONICAL, outputs=CANONICAL, when=_int16_softmax)
def wide_softmax(step: Step) -> dict[str, Any]:
    """TFLite's int16 softmax (QSoftmax._run_int16) along the layer's axis, its two tables as constants."""
    layer: QSoftmax = step.layer  # type: ignore[assignment]
    shape = step.inputs[0].shape
    axis = layer.axis - 1
    return {**_types(step), "outer": int(np.prod(shape[:axis])), "depth": shape[axis],
            "inner": int(np.prod(shape[axis + 1:])), "exp_table": layer.exp_table,
            "reciprocal_table": layer.reciprocal_table, "input_multiplier": layer.input_multiplier,
            "input_shift": layer.input_shift}
