"""Converters of quantized ONNX: QuantizeLinear/DequantizeLinear (QDQ) and the QLinear* and com.microsoft Q ops.

Quantization the file states becomes given quantization (dabuild/ir/given_quant.py):
an integer ONNX tensor is, in dabuild's graph, a float tensor holding its real
values (what DequantizeLinear would make of it), written by a `fake_quant`
node with the ONNX scale and zero point. So QuantizeLinear is a fake_quant,
DequantizeLinear of a run-time tensor is the identity, DequantizeLinear of an
integer initializer is a fake_quant over its real values (a weight: folded into
a `Graph.given` record), and QLinearConv, QLinearMatMul, QGemm, QLinearAdd, ...
are their float op between the real values of their inputs, followed by a
fake_quant to their output's scale and zero point. Ops that move integers
without arithmetic (MaxPool, Reshape, Flatten in onnxruntime's QOperator
format) run their ordinary converter on the real values, which they keep on
the grid.

Blocked scales (opset 21 `block_size`) are taken over integer initializers
(weights: a blocked `GivenQuant`, whose scales keep their ONNX shape); the
integer path runs them block by block (`dabuild.qir.layers.blocked`).

Refused, naming the node and the nearest representable choice: float8/float4
types, blocked scales over a run-time tensor (an activation), integer types
over 16 bits outside a bias, dynamic quantization (DynamicQuantizeLinear has
no converter).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np

from dabuild.ir.given_quant import GivenQuant
from dabuild.trace.onnx_frontend.conversion import Conversion, Unsupported
from dabuild.trace.onnx_frontend.converters import CONVERTERS, converts

if TYPE_CHECKING:
    from dabuild.trace.onnx_frontend.model_file import OnnxNode

# Never folded while loading, even over initializers: folding would lose the quantization they state.
QUANTIZATION_OPS = ("QuantizeLinear", "DequantizeLinear")
MICROSOFT = "com.microsoft."
_INTEGER = re.compile(r"(u?)int(\d+)")
WIDEST_GIVEN = 16  # the widest integer type given quantization maps onto (dabuild.qir.dtypes)


def _integer_type(dtype: np.dtype) -> tuple[int, bool]:
    """(bits, signed) of an ONNX integer element type; Unsupported for float8/float4 and the like."""
    name = np.dtype(dtype).name
    match = _INTEGER.fullmatch(name)
    if match is None:
        raise Unsupported(f"parameter zero_point type: {name} is no integer type dabuild quantizes to; "
                          "nearest representable: int8")
    return int(match.group(2)), not match.group(1)


def _zero_point_type(ctx: Conversion, node: OnnxNode, zp_index: int) -> np.dtype:
    zero_point = ctx.static(node, zp_index, "zero point")
    if zero_point is not None:
        return zero_point.dtype
    if node.attrs.get("output_dtype"):  # opset 21: the type without a zero point
        from onnx import helper

        return np.dtype(helper.tensor_dtype_to_np_dtype(int(node.attrs["output_dtype"])))
    return np.dtype(np.uint8)


def given(ctx: Conversion, node: OnnxNode, scale_index: int, zp_index: int, rank: int,
          axis: int | None = None, dtype: np.dtype | None = None) -> GivenQuant:
    """The quantization a node's scale and zero point inputs state for a tensor of `rank` axes.

    `axis`: where per-channel scales run (default: the node's `axis` attribute, 1 as ONNX defines it).
    """
    zero_point = ctx.static(node, zp_index, "zero point")
    bits, signed = _integer_type(dtype if dtype is not None else _zero_point_type(ctx, node, zp_index))
    block_size = int(node.attrs.get("block_size", 0))
    if block_size:
        return _blocked(ctx, node, scale_index, zero_point, rank, bits, signed, block_size)
    scale = np.ravel(ctx.required(node, scale_index, "scale")).astype(np.float64)
    points = np.zeros(scale.shape, np.int64) if zero_point is None else np.ravel(zero_point).astype(np.int64)
    per_channel = scale.size > 1
    channel_axis = (node.attrs.get("axis", 1) if axis is None else axis) % max(rank, 1) if per_channel else None
    return GivenQuant(tuple(float(s) for s in scale), tuple(int(z) for z in np.broadcast_to(points, scale.shape)),
                      bits, signed, channel_axis)


def _blocked(ctx: Conversion, node: OnnxNode, scale_index: int, zero_point: np.ndarray | None, rank: int,
             bits: int, signed: bool, block_size: int) -> GivenQuant:
    """The blocked quantization of opset 21: scales of the tensor's rank, one per block along `axis`."""
    scale = np.asarray(ctx.required(node, scale_index, "scale"), dtype=np.float64)
    if scale.ndim != rank or block_size < 0:
        raise Unsupported(f"parameter block_size: blocks of {block_size} need scales of the tensor's rank {rank} "
                          f"(got shape {list(scale.shape)}); nearest representable: one scale per channel")
    points = np.zeros(scale.shape, np.int64) if zero_point is None else np.asarray(zero_point).astype(np.int64)
    if points.shape != scale.shape:
        raise Unsupported(f"parameter zero_point: shape {list(points.shape)} differs from the blocked scales' "
                          f"{list(scale.shape)}")
    return GivenQuant(tuple(float(s) for s in scale.ravel()), tuple(int(z) for z in points.ravel()), bits, signed,
                      int(node.attrs.get("axis", 1)) % max(rank, 1), block_size=block_size,
                      scale_shape=tuple(int(d) for d in scale.shape))


def _refuse_blocked(quant: GivenQuant, what: str) -> None:
    """Unsupported for blocked scales over a run-time tensor: dabuild quantizes activations per tensor."""
    if quant.blocked:
        raise Unsupported(f"parameter block_size: {what} is blocked (blocks of {quant.block_size}); dabuild blocks "
                          "only weights (integer initializers); nearest representable: one scale for the tensor")


def _real_values(values: np.ndarray, quant: GivenQuant) -> np.ndarray:
    """What DequantizeLinear makes of integer `values` (float32)."""
    centred = values.astype(np.float64) - quant.broadcast(quant.zero_point, values.shape)
    return (centred * quant.broadcast(quant.scale, values.shape)).astype(np.float32)


def real_input(ctx: Conversion, node: OnnxNode, index: int, scale_index: int, zp_index: int,
               axis: int | None = None) -> str:
    """The name of input `index` as real values: a run-time tensor as it is (it holds them already), an integer
    initializer dequantized behind a fake_quant stating its quantization (so a weight keeps it)."""
    name = node.inputs[index]
    if name not in ctx.known:
        return name
    values = ctx.known[name]
    quant = given(ctx, node, scale_index, zp_index, values.ndim, axis, values.dtype)
    real = ctx.fresh(f"{name}/real")
    ctx.bind(real, _real_values(values, quant))
    if quant.bits > WIDEST_GIVEN:  # an int32 bias: its float value is all the integer path needs
        return real
    return ctx.emit(node, "fake_quant", [real], quant.attrs())[0]


def _quantized_output(ctx: Conversion, node: OnnxNode, source: str, scale_index: int, zp_index: int) -> None:
    """fake_quant from the float result `source` to the node's output, at its output scale and zero point."""
    quant = given(ctx, node, scale_index, zp_index, ctx.rank(source))
    _refuse_blocked(quant, "its output")
    ctx.emit(node, "fake_quant", [source], quant.attrs(), node.outputs[:1])
    ctx.quantized.add(node.outputs[0])


def _around(op_type: str) -> tuple[str, ...]:
    """The IR ops a QOperator node emits: its float op's (converted by `_run`), then a fake_quant (or, for a
    float output, an identity)."""
    return (*(CONVERTERS[op_type].emits or ()), "fake_quant", "identity")


def _run(ctx: Conversion, node: OnnxNode, op_type: str, inputs: list[str], attrs: dict | None = None) -> str:
    """Convert `op_type` over `inputs` with the ordinary converter, into a fresh float tensor."""
    from dabuild.trace.onnx_frontend.model_file import OnnxNode

    out = ctx.fresh(f"{node.label}/{op_type}")
    CONVERTERS[op_type].convert(ctx, OnnxNode(node.label, op_type, "", inputs, [out],
                                              node.attrs if attrs is None else attrs, node.proto))
    return out


def _bias(ctx: Conversion, node: OnnxNode, index: int, factor: np.ndarray) -> list[str]:
    """An int32 bias input in float (its scale is `factor`: input scale x weight scale), or nothing."""
    if not ctx.has(node, index):
        return []
    name = ctx.fresh(f"{node.inputs[index]}/real")
    ctx.bind(name, (ctx.required(node, index, "bias").astype(np.float64) * factor).astype(np.float32))
    return [name]


def _scale(ctx: Conversion, node: OnnxNode, index: int) -> np.ndarray:
    return np.ravel(ctx.required(node, index, "scale")).astype(np.float64)


# ---------------------------------------------------------------- QDQ


@converts("QuantizeLinear", MICROSOFT + "QuantizeLinear", static=(1, 2), emits=("fake_quant",))
def quantize_linear(ctx: Conversion, node: OnnxNode) -> None:
    quant = given(ctx, node, 1, 2, ctx.rank(node.inputs[0]))
    _refuse_blocked(quant, "the activation it quantizes")
    if quant.bits > WIDEST_GIVEN:
        raise Unsupported(f"parameter zero_point type: {quant.dtype} activations are wider than dabuild's widest "
                          f"type; nearest representable: {'' if quant.signed else 'u'}int16")
    ctx.emit(node, "fake_quant", node.inputs[:1], quant.attrs(), node.outputs)
    ctx.quantized.add(node.outputs[0])


@converts("DequantizeLinear", MICROSOFT + "DequantizeLinear", static=(1, 2), emits=("fake_quant", "identity"))
def dequantize_linear(ctx: Conversion, node: OnnxNode) -> None:
    if node.inputs[0] not in ctx.known and node.attrs.get("block_size", 0):
        _refuse_blocked(given(ctx, node, 1, 2, ctx.rank(node.inputs[0])), "the run-time tensor it dequantizes")
    name = real_input(ctx, node, 0, 1, 2)
    if name not in ctx.known and not any(name in written.outputs for written in ctx.nodes):
        raise Unsupported(f"it dequantizes the graph input {name!r}; dabuild graphs take real values: nearest "
                          "representable: a float input (quantized inside the model)")
    if name in ctx.known:
        ctx.bind(node.outputs[0], ctx.known[name])
    else:
        ctx.emit(node, "identity", [name], outputs=node.outputs)


# ---------------------------------------------------------------- QOperator (onnxruntime's QuantFormat.QOperator)


@converts("QLinearConv", static=(1, 2, 3, 4, 5, 6, 7, 8), emits=_around("Conv"))
def qlinear_conv(ctx: Conversion, node: OnnxNode) -> None:
    weight = real_input(ctx, node, 3, 4, 5, axis=0)
    bias = _bias(ctx, node, 8, _scale(ctx, node, 1) * _scale(ctx, node, 4))
    _quantized_output(ctx, node, _run(ctx, node, "Conv", [node.inputs[0], weight, *bias]), 6, 7)


@converts("QLinearMatMul", static=(1, 2, 4, 5, 6, 7), emits=_around("MatMul"))
def qlinear_matmul(ctx: Conversion, node: OnnxNode) -> None:
    a = real_input(ctx, node, 0, 1, 2)
    b = real_input(ctx, node, 3, 4, 5, axis=-1)
    _quantized_output(ctx, node, _run(ctx, node, "MatMul", [a, b], {}), 6, 7)


@converts(MICROSOFT + "QGemm", static=(1, 2, 3, 4, 5, 6, 7, 8), emits=_around("Gemm"))
def qgemm(ctx: Conversion, node: OnnxNode) -> None:
    """alpha * A' B' + C, C int32 at scale alpha * a_scale * b_scale; a float output without y_scale."""
    a = real_input(ctx, node, 0, 1, 2)
    b = real_input(ctx, node, 3, 4, 5, axis=0 if node.attrs.get("transB", 0) else 1)
    alpha = float(node.attrs.get("alpha", 1.0))
    bias = _bias(ctx, node, 6, alpha * _scale(ctx, node, 1) * _scale(ctx, node, 4))
    attrs = {key: node.attrs[key] for key in ("alpha", "transA", "transB") if key in node.attrs}
    result = _run(ctx, node, "Gemm", [a, b, *bias], attrs)
    if ctx.has(node, 7):
        _quantized_output(ctx, node, result, 7, 8)
    else:
        ctx.emit(node, "identity", [result], outputs=node.outputs[:1])


_BINARY = {"QLinearAdd": "Add", "QLinearMul": "Mul"}


@converts(*(MICROSOFT + name for name in _BINARY), static=(1, 2, 4, 5, 6, 7),
          emits={MICROSOFT + name: _around(op) for name, op in _BINARY.items()})
def qlinear_binary(ctx: Conversion, node: OnnxNode) -> None:
    a, b = real_input(ctx, node, 0, 1, 2), real_input(ctx, node, 3, 4, 5)
    _quantized_output(ctx, node, _run(ctx, node, _BINARY[node.op_type], [a, b], {}), 6, 7)


_UNARY = {"QLinearGlobalAveragePool": "GlobalAveragePool", "QLinearAveragePool": "AveragePool",
          "QLinearSigmoid": "Sigmoid", "QLinearLeakyRelu": "LeakyRelu", "QLinearSoftmax": "Softmax"}


@converts(*(MICROSOFT + name for name in _UNARY), static=(1, 2, 3, 4),
          emits={MICROSOFT + name: _around(op) for name, op in _UNARY.items()})
def qlinear_unary(ctx: Conversion, node: OnnxNode) -> None:
    """One float op between (X, x_scale, x_zero_point) and (y_scale, y_zero_point), channels first."""
    if node.attrs.get("channels_last", 0):
        raise Unsupported("parameter channels_last: dabuild's layout is channels first; nearest representable: "
                          "channels_last 0 (a Transpose before and after)")
    attrs = {key: value for key, value in node.attrs.items() if key not in ("channels_last", "opset")}
    source = real_input(ctx, node, 0, 1, 2)
    _quantized_output(ctx, node, _run(ctx, node, _UNARY[node.op_type], [source], attrs), 3, 4)


@converts(MICROSOFT + "QLinearConcat", emits=_around("Concat"))
def qlinear_concat(ctx: Conversion, node: OnnxNode) -> None:
    """(Y_scale, Y_zero_point, then X, x_scale, x_zero_point per input) -> concat, quantized to Y's."""
    parts = [real_input(ctx, node, i, i + 1, i + 2) for i in range(2, len(node.inputs), 3)]
    _quantized_output(ctx, node, _run(ctx, node, "Concat", parts), 0, 1)
