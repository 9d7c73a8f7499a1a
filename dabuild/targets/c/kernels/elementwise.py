"""Elementwise kernels: clamps, 256-entry tables, and add/sub/mul of two int8 tensors.

Clamps and tables read and write in whatever storage their input has. The
binary ops walk the output's storage with one stride per operand (0 where an
operand broadcasts), so equal shapes in equal storage become one contiguous
loop; the arithmetic is the reference's (TFLite-style rescale for add/sub, each
input's rescaled term a 256-entry table made at export).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dabuild.qir.fixed_point import INT32_MAX, requantize
from dabuild.qir.layers.elementwise import QAdd, QClamp, QLookup, QMul, QPrelu
from dabuild.targets.c.kernels.registry import Operand, Step, kernel
from dabuild.targets.c.layout import Storage, Walk, broadcast_strides


@kernel("relu", "clamp")
@kernel("clamp", "clamp")
def clamp(step: Step) -> dict[str, Any]:
    layer: QClamp = step.layer  # type: ignore[assignment]
    return {"size": step.inputs[0].size, "low": layer.low, "high": layer.high}


@kernel("lookup", "lookup")
def lookup(step: Step) -> dict[str, Any]:
    layer: QLookup = step.layer  # type: ignore[assignment]
    return {"size": step.inputs[0].size, "table": layer.table, "function": layer.function,
            "qmin": step.inputs[0].quant.qmin}


def binary_walk(step: Step) -> Walk:
    """The output's storage, with each input's (broadcast) strides: offsets `o`, `a`, `b`."""
    out = step.outputs[0]
    a, b = step.inputs
    return Walk.over(out.shape, out.storage.order, {"o": out.strides, "a": broadcast_strides(a.storage, out.shape),
                                                      "b": broadcast_strides(b.storage, out.shape)})


def rescale_table(layer: QAdd, operand: Operand, index: int, rounding: str) -> np.ndarray:
    """An add input's rescaled term for each of its 256 int8 values: the reference's own arithmetic, run
    once at export, so the C kernel does one table read per input instead of an int64 requantization."""
    values = np.arange(operand.quant.qmin, operand.quant.qmax + 1, dtype=np.int64) - operand.quant.zero_point
    return requantize(values << layer.left_shift, layer.input_multiplier[index], layer.input_shift[index],
                       rounding)


@kernel("add", "add")
@kernel("sub", "add")
def add(step: Step) -> dict[str, Any]:
    """`contiguous`, `narrow_sum` and `vector_shift` (every operand one flat run, the two terms' sum within int32,
    a shift of 33..62) admit the 32-bit requantization, and on Helium four elements per pass. The output is
    clamped to the output type's range, or to the bounds of the clamp fused into the step (a relu after it)."""
    layer: QAdd = step.layer  # type: ignore[assignment]
    walk = binary_walk(step)
    tables = [rescale_table(layer, operand, index, step.rounding) for index, operand in enumerate(step.inputs)]
    shift = int(layer.shift[0])
    output = step.outputs[0].quant
    low, high = (output.qmin, output.qmax) if step.clamp is None else (max(output.qmin, step.clamp.low),
                                                                        min(output.qmax, step.clamp.high))
    return {"walk": walk, "sign": "+" if layer.sign > 0 else "-", "tables": tables, "low": low, "high": high,
            "offsets": [-operand.quant.qmin for operand in step.inputs],
            "multiplier": int(layer.multiplier[0]), "shift": shift,
            "output_zero_point": step.outputs[0].quant.zero_point,
            "contiguous": len(walk.loops) == 1 and set(walk.loops[0].strides) == {1} and not any(walk.bases),
            "narrow_sum": sum(int(np.abs(table).max(initial=0)) for table in tables) <= INT32_MAX,
            "vector_shift": 33 <= shift <= 62 and step.rounding == "dabuild"}


@kernel("mul", "mul")
def mul(step: Step) -> dict[str, Any]:
    layer: QMul = step.layer  # type: ignore[assignment]
    return {"walk": binary_walk(step), "zero_points": [operand.quant.zero_point for operand in step.inputs],
            "multiplier": int(layer.multiplier[0]), "shift": int(layer.shift[0]),
            "output_zero_point": step.outputs[0].quant.zero_point}


@kernel("prelu", "prelu")
def prelu(step: Step) -> dict[str, Any]:
    """One walk over the output; the slope's constants (canonical, its own shape) at broadcast strides."""
    layer: QPrelu = step.layer  # type: ignore[assignment]
    source, out = step.inputs[0], step.outputs[0]
    slopes = Storage.canonical(tuple(layer.sign.shape))
    walk = Walk.over(out.shape, out.storage.order, {"o": out.strides, "i": broadcast_strides(source.storage, out.shape),
                                                      "s": broadcast_strides(slopes, out.shape)})
    return {"walk": walk, "zero_point": source.quant.zero_point, "output_zero_point": out.quant.zero_point,
            "multiplier": int(layer.multiplier[0]), "shift": int(layer.shift[0]),
            "negative_multiplier": layer.negative_multiplier.ravel(), "negative_shift": layer.negative_shift.ravel(),
            "sign": layer.sign.ravel()}
