"""Converters of QONNX's ops (Brevitas, QKeras and HGQ exports): Quant, BipolarQuant, Trunc, channels-last wrappers.

QONNX tensors are real values throughout: `Quant(x, scale, zero_point,
bit_width)` outputs x quantized and dequantized, which is exactly dabuild's
`fake_quant` (dabuild/ir/given_quant.py), any bit width. So Quant becomes a
fake_quant (over a weight: folded into a `Graph.given` record), a
BipolarQuant of a weight a fake_quant of its +-scale values as int2 (narrow:
-1 and 1), and Trunc a fake_quant to its output scale and width. The
channels-last wrappers (`qonnx.custom_op.channels_last`: Conv, MaxPool,
BatchNormalization on NHWC tensors) become the channels-first op between two
transposes. The op definitions followed are qonnx's
(`qonnx.custom_op.general`); tests and bench/imported.py check the result
against qonnx's own executor (`pip install dabuild[qonnx]`).

Refused, naming the node, the parameter and the nearest representable
choice: non-integer bit widths or zero points, rounding modes with no
fake_quant rounding (UP, HALF_DOWN), BipolarQuant of an activation (a sign
function, no affine quantization).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from dabuild.ir.given_quant import GivenQuant
from dabuild.trace.onnx_frontend.conversion import Conversion, Unsupported
from dabuild.trace.onnx_frontend.converters import CONVERTERS, converts

if TYPE_CHECKING:
    from dabuild.trace.onnx_frontend.model_file import OnnxNode

DOMAINS = ("qonnx.custom_op.general", "onnx.brevitas", "finn.custom_op.general")
CHANNELS_LAST = "qonnx.custom_op.channels_last"
ROUNDING = {"ROUND": "half_even", "HALF_EVEN": "half_even", "HALF_UP": "half_away", "FLOOR": "floor",
            "CEIL": "ceil", "DOWN": "to_zero"}
NEAREST_ROUNDING = {"UP": "CEIL", "HALF_DOWN": "ROUND"}


def _names(*ops: str) -> list[str]:
    return [f"{domain}.{op}" for domain in DOMAINS for op in ops]


def _integer(value: np.ndarray, what: str) -> np.ndarray:
    rounded = np.round(value)
    if not np.array_equal(rounded, value):
        raise Unsupported(f"parameter {what}: {np.ravel(value)[0]:g} is not an integer; nearest representable: "
                          f"{np.ravel(rounded)[0]:g}")
    return rounded.astype(np.int64)


def _rounding(node: OnnxNode, default: str) -> str:
    mode = str(node.attrs.get("rounding_mode", default)).upper()
    if mode not in ROUNDING:
        nearest = NEAREST_ROUNDING.get(mode, "ROUND")
        raise Unsupported(f"parameter rounding_mode: {mode!r} has no dabuild rounding; nearest representable: "
                          f"{nearest}")
    return ROUNDING[mode]


def _channel_axis(parameters: list[np.ndarray], rank: int) -> tuple[int | None, int]:
    """(axis, channels) of per-channel parameters broadcast against a rank-`rank` tensor (None: per tensor)."""
    shapes = [np.shape(p) for p in parameters if np.size(p) > 1]
    if not shapes:
        return None, 1
    shape = (1,) * (rank - len(shapes[0])) + tuple(shapes[0])
    axes = [axis for axis, size in enumerate(shape) if size > 1]
    if len(axes) != 1 or any(np.shape(p) != shapes[0] for p in parameters if np.size(p) > 1):
        raise Unsupported(f"parameter scale: shaped {shapes[0]}, varying along more than one axis; nearest "
                          "representable: one scale per channel")
    return axes[0], shape[axes[0]]


def _given(scale: np.ndarray, zero_point: np.ndarray, bits: int, signed: bool, narrow: bool, rounding: str,
           rank: int) -> GivenQuant:
    axis, channels = _channel_axis([scale, zero_point], rank)
    scales = np.broadcast_to(np.ravel(scale), (channels,)) if axis is not None else np.ravel(scale)[:1]
    points = np.broadcast_to(np.ravel(_integer(np.asarray(zero_point), "zero_point")), scales.shape)
    return GivenQuant(tuple(float(s) for s in scales), tuple(int(z) for z in points), bits, signed, axis, narrow,
                      rounding)


@converts(*_names("Quant", "IntQuant"), static=(1, 2, 3), emits=("fake_quant",))
def quant(ctx: Conversion, node: OnnxNode) -> None:
    bits = int(_integer(np.ravel(ctx.required(node, 3, "bit_width")), "bit_width")[0])
    signed, narrow = bool(node.attrs.get("signed", 1)), bool(node.attrs.get("narrow", 0))
    if bits == 1 and signed:
        bipolar(ctx, node)
        return
    given = _given(ctx.required(node, 1, "scale"), ctx.required(node, 2, "zero_point"), bits, signed, narrow,
                   _rounding(node, "ROUND"), ctx.rank(node.inputs[0]))
    ctx.emit(node, "fake_quant", node.inputs[:1], given.attrs(), node.outputs)


@converts(*_names("BipolarQuant"), static=(1,), emits=("fake_quant",))
def bipolar(ctx: Conversion, node: OnnxNode) -> None:
    """sign(x) * scale (x >= 0: +1): for a weight, +-scale quantized as narrow int2."""
    source = node.inputs[0]
    if source not in ctx.known:
        raise Unsupported("a BipolarQuant of an activation is a sign function, no affine quantization dabuild "
                          "lowers; nearest representable: Quant with bit_width 2, narrow 1")
    scale = np.asarray(ctx.required(node, 1, "scale"), dtype=np.float64)
    values = ctx.known[source]
    signs = np.where(values >= 0, 1.0, -1.0)
    real = ctx.fresh(f"{source}/bipolar")
    ctx.bind(real, (signs * scale).astype(np.float32))
    given = _given(scale, np.zeros(()), 2, True, True, "half_even", values.ndim)
    ctx.emit(node, "fake_quant", [real], given.attrs(), node.outputs)


@converts(*_names("Trunc"), static=(1, 2, 3, 4, 5), emits=("fake_quant", "mul"))
def trunc(ctx: Conversion, node: OnnxNode) -> None:
    """Drop low bits: v2 (six inputs) requantizes to its output scale and width; v1 (five) divides the integer by
    2**(input bits - output bits) and keeps the input scale, i.e. a fake_quant at the coarser scale, then * 2**-t.

    The input is taken to lie on its own scale's grid (it does after a Quant or an integer sum of such values),
    so the first rounding qonnx does is exact and the truncation is one fake_quant."""
    scale = np.asarray(ctx.required(node, 1, "scale"), dtype=np.float64)
    zero_point = np.asarray(ctx.required(node, 2, "zero_point"), dtype=np.float64)
    input_bits = int(_integer(np.ravel(ctx.required(node, 3, "input_bit_width")), "input_bit_width")[0])
    rounding, signed = _rounding(node, "FLOOR"), bool(node.attrs.get("signed", 1))
    if len(node.inputs) > 5:  # Trunc v2: output scale, then output bit width
        output_scale = np.asarray(ctx.required(node, 4, "output_scale"), dtype=np.float64)
        output_bits = int(_integer(np.ravel(ctx.required(node, 5, "output_bit_width")), "output_bit_width")[0])
        factor = 2.0 ** np.round(np.log2(output_scale / scale))
        given = _given(output_scale * np.ones_like(factor), zero_point / factor, output_bits, signed,
                       bool(node.attrs.get("narrow", 0)), rounding, ctx.rank(node.inputs[0]))
        ctx.emit(node, "fake_quant", node.inputs[:1], given.attrs(), node.outputs)
        return
    if np.any(zero_point):
        raise Unsupported("parameter zero_point: Trunc (v1) subtracts an unscaled zero point after truncating; "
                          "nearest representable: zero point 0")
    shift = input_bits - int(_integer(np.ravel(ctx.required(node, 4, "output_bit_width")), "output_bit_width")[0])
    given = _given(scale * 2.0**shift, zero_point, input_bits - shift + int(not signed), signed, False, rounding,
                   ctx.rank(node.inputs[0]))
    (coarse,) = ctx.emit(node, "fake_quant", node.inputs[:1], given.attrs())
    factor_name = ctx.fresh(f"{node.label}/factor")
    ctx.bind(factor_name, np.asarray(2.0**-shift, dtype=np.float32))
    ctx.emit(node, "mul", [coarse, factor_name], outputs=node.outputs)


_LAST_TO_FIRST = {3: [0, 2, 1], 4: [0, 3, 1, 2]}
_FIRST_TO_LAST = {3: [0, 2, 1], 4: [0, 2, 3, 1]}


@converts(*(f"{CHANNELS_LAST}.{op}" for op in ("Conv", "MaxPool", "BatchNormalization")),
          emits={f"{CHANNELS_LAST}.{op}": ("transpose", *(CONVERTERS[op].emits or ()))
                 for op in ("Conv", "MaxPool", "BatchNormalization")})
def channels_last(ctx: Conversion, node: OnnxNode) -> None:
    """The channels-first op between transposes: NHWC -> NCHW (and a conv's OHWI weight -> OIHW), op, back."""
    from dabuild.trace.onnx_frontend.model_file import OnnxNode

    rank = ctx.rank(node.inputs[0])
    if rank not in _LAST_TO_FIRST:
        raise Unsupported(f"a rank-{rank} input; channels-last wrappers take rank 3 or 4")
    moved = 2 if node.op_type == "Conv" else 1  # a conv's weight is channels last too (O, kernel..., I)
    first = [ctx.emit(node, "transpose", [name], {"perm": _LAST_TO_FIRST[rank]})[0] for name in node.inputs[:moved]]
    result = ctx.fresh(f"{node.label}/{node.op_type}")
    CONVERTERS[node.op_type].convert(ctx, OnnxNode(node.label, node.op_type, "", [*first, *node.inputs[moved:]],
                                                   [result, *node.outputs[1:]], node.attrs, node.proto))
    ctx.emit(node, "transpose", [result], {"perm": _FIRST_TO_LAST[rank]}, node.outputs[:1])
