"""One converter per TFLite builtin operator: the file's operator -> dabuild graph nodes.

A converter reads its operator's inputs through the Conversion (run-time
tensors by name, constants as real values), emits nodes, and binds each output
with `ctx.write`, which puts the file's quantization behind it. Options a
converter cannot represent raise Unsupported; the tracer names file, operator
index and name. `CONVERTERS` is the registry; its names are the builtins read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dabuild.registry import Registry
from dabuild.trace.tflite_frontend.conversion import NHWC_TO_NCHW, TO_NCHW, Conversion, Unsupported

Converter = Callable[[Conversion, Any], None]
CONVERTERS: Registry[Converter] = Registry("TFLite operator converter", "the tflite frontend")

# fused_activation_function: ActivationFunctionType value -> (op, attrs); SIGN_BIT (5) has no converter
FUSED = {0: None, 1: ("relu", {}), 2: ("clip", {"min": -1.0, "max": 1.0}), 3: ("relu6", {}), 4: ("tanh", {})}
SAME, VALID = 0, 1


def converts(*names: str) -> Callable[[Converter], Converter]:
    return CONVERTERS.register(*names)


def _finish(ctx: Conversion, op: Any, name: str) -> None:
    """Bind the operator's output to `name` through its fused activation. A quantized kernel applies it as a
    clamp of the output's integers, so a quantized result is put on the output's grid before it (and after)."""
    options = op.builtinOptions
    code = getattr(options, "fusedActivationFunction", 0) if options is not None else 0
    if code not in FUSED:
        raise Unsupported(f"fused activation function {code} (SIGN_BIT) has no dabuild op")
    fused = FUSED[code]
    if fused is not None:
        name = ctx.emit(fused[0], [ctx.quantized(op.outputs[0], name)], fused[1], nchw=name in ctx.nchw)
    ctx.write(op.outputs[0], name)


def _same_pads(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    """TensorFlow's SAME padding of one axis: (before, after), the odd pixel after."""
    effective = (kernel - 1) * dilation + 1
    total = max((-(-size // stride) - 1) * stride + effective - size, 0)
    return total // 2, total - total // 2


def _window(ctx: Conversion, op: Any, kernel: tuple[int, int], dilation: tuple[int, int] = (1, 1)) -> dict[str, Any]:
    """strides, dilations and pads [top, left, bottom, right] of a 2-D window over the operator's NHWC input."""
    options = op.builtinOptions
    strides = (options.strideH, options.strideW)
    _, height, width, _ = ctx.shape(op.inputs[0])
    pads = [0, 0, 0, 0]
    if options.padding == SAME:
        (top, bottom), (left, right) = (_same_pads(size, k, s, d) for size, k, s, d in
                                        zip((height, width), kernel, strides, dilation))
        pads = [top, left, bottom, right]
    elif options.padding != VALID:
        raise Unsupported(f"padding {options.padding} is neither SAME nor VALID")
    return {"strides": list(strides), "pads": pads, "dilations": list(dilation)}


def _nchw_input(ctx: Conversion, op: Any) -> str:
    name = ctx.value(op.inputs[0])
    if name not in ctx.nchw:
        raise Unsupported("its input is not a 4-D NHWC tensor")
    return name


@converts("CONV_2D")
def conv_2d(ctx: Conversion, op: Any) -> None:
    options = op.builtinOptions
    weight_shape = ctx.shape(op.inputs[1])
    dilation = (options.dilationHFactor or 1, options.dilationWFactor or 1)
    attrs = _window(ctx, op, (weight_shape[1], weight_shape[2]), dilation)
    groups = ctx.shape(op.inputs[0])[3] // weight_shape[3]
    weight = ctx.weight(op.inputs[1], [0, 3, 1, 2], channel_axis=0)   # OHWI -> OIHW
    bias = ctx.bias(op.inputs[2] if len(op.inputs) > 2 else -1, op.inputs[0], op.inputs[1])
    result = ctx.emit("conv", [_nchw_input(ctx, op), weight, *bias], {**attrs, "groups": groups}, nchw=True)
    _finish(ctx, op, result)


@converts("DEPTHWISE_CONV_2D")
def depthwise_conv_2d(ctx: Conversion, op: Any) -> None:
    options = op.builtinOptions
    weight_shape = ctx.shape(op.inputs[1])   # (1, kh, kw, channels * multiplier)
    dilation = (options.dilationHFactor or 1, options.dilationWFactor or 1)
    attrs = _window(ctx, op, (weight_shape[1], weight_shape[2]), dilation)
    weight = ctx.weight(op.inputs[1], [3, 0, 1, 2], channel_axis=3)   # -> (channels * multiplier, 1, kh, kw)
    bias = ctx.bias(op.inputs[2] if len(op.inputs) > 2 else -1, op.inputs[0], op.inputs[1])
    groups = ctx.shape(op.inputs[0])[3]
    result = ctx.emit("conv", [_nchw_input(ctx, op), weight, *bias], {**attrs, "groups": groups}, nchw=True)
    _finish(ctx, op, result)


@converts("TRANSPOSE_CONV")
def transpose_conv(ctx: Conversion, op: Any) -> None:
    """inputs: output shape, weight (O, kh, kw, I), input, optional bias; TFLite crops the padding it computes
    for the output size it is given (before: half, rounded down)."""
    options = op.builtinOptions
    out_shape = [int(v) for v in ctx.static(op.inputs[0], "output shape")]
    _, kernel_h, kernel_w, _ = ctx.shape(op.inputs[1])
    _, height, width, _ = ctx.shape(op.inputs[2])
    strides = [options.strideH, options.strideW]
    pads, extra = [0, 0, 0, 0], [0, 0]
    for axis, (size, kernel, out) in enumerate(zip((height, width), (kernel_h, kernel_w), out_shape[1:3])):
        total = (size - 1) * strides[axis] + kernel - out
        if total >= 0:
            pads[axis], pads[axis + 2] = total // 2, total - total // 2
        else:
            extra[axis] = -total
    weight = ctx.weight(op.inputs[1], [3, 0, 1, 2], channel_axis=0)   # -> (I, O, kh, kw)
    bias = ctx.bias(op.inputs[3] if len(op.inputs) > 3 else -1, op.inputs[2], op.inputs[1])
    source = ctx.value(op.inputs[2])
    if source not in ctx.nchw:
        raise Unsupported("its input is not a 4-D NHWC tensor")
    result = ctx.emit("conv_transpose", [source, weight, *bias],
                      {"strides": strides, "pads": pads, "output_padding": extra}, nchw=True)
    _finish(ctx, op, result)


@converts("FULLY_CONNECTED")
def fully_connected(ctx: Conversion, op: Any) -> None:
    options = op.builtinOptions
    if options is not None and getattr(options, "keepNumDims", False):
        raise Unsupported("keep_num_dims is set; dabuild reads fully connected layers over flattened rows")
    if ctx.data(op.inputs[1]) is None:
        raise Unsupported("its weights are a run-time tensor; dabuild reads constant weights")
    in_features = ctx.shape(op.inputs[1])[1]   # (out, in)
    source = ctx.nhwc(op.inputs[0])
    if len(ctx.shape(op.inputs[0])) != 2:
        source = ctx.emit("reshape", [source], {"shape": [-1, in_features]})
    weight = ctx.weight(op.inputs[1], [1, 0], channel_axis=0)   # (O, I) -> (I, O)
    bias = ctx.bias(op.inputs[2] if len(op.inputs) > 2 else -1, op.inputs[0], op.inputs[1])
    _finish(ctx, op, ctx.emit("dense", [source, weight, *bias]))


def _binary(ctx: Conversion, op: Any, ir_op: str) -> None:
    a, b = (ctx.value(index) for index in op.inputs[:2])
    nchw = a in ctx.nchw or b in ctx.nchw
    a, b = ctx.like(op.inputs[0], nchw), ctx.like(op.inputs[1], nchw)
    result = ctx.emit(ir_op, [a, b], nchw=nchw)
    _finish(ctx, op, result)


@converts("ADD")
def add(ctx: Conversion, op: Any) -> None:
    _binary(ctx, op, "add")


@converts("SUB")
def sub(ctx: Conversion, op: Any) -> None:
    _binary(ctx, op, "sub")


@converts("MUL")
def mul(ctx: Conversion, op: Any) -> None:
    _binary(ctx, op, "mul")


def _pool(ctx: Conversion, op: Any, ir_op: str, extra: dict[str, Any]) -> None:
    options = op.builtinOptions
    kernel = (options.filterHeight, options.filterWidth)
    attrs = _window(ctx, op, kernel)
    del attrs["dilations"]
    result = ctx.emit(ir_op, [_nchw_input(ctx, op)], {"kernel": list(kernel), **attrs, **extra}, nchw=True)
    _finish(ctx, op, result)


@converts("AVERAGE_POOL_2D")
def average_pool_2d(ctx: Conversion, op: Any) -> None:
    _pool(ctx, op, "avg_pool", {"count_include_pad": False})


@converts("MAX_POOL_2D")
def max_pool_2d(ctx: Conversion, op: Any) -> None:
    _pool(ctx, op, "max_pool", {})


@converts("MEAN")
def mean(ctx: Conversion, op: Any) -> None:
    rank = len(ctx.shape(op.inputs[0]))
    axes = sorted({int(a) % rank for a in np.ravel(ctx.static(op.inputs[1], "axes"))})
    keep = bool(op.builtinOptions.keepDims) if op.builtinOptions is not None else False
    source = ctx.value(op.inputs[0])
    if source in ctx.nchw and keep:
        result = ctx.emit("reduce_mean", [source], {"axes": sorted(NHWC_TO_NCHW[a] for a in axes), "keepdims": True},
                          nchw=True)
    else:
        result = ctx.emit("reduce_mean", [ctx.nhwc(op.inputs[0])], {"axes": axes, "keepdims": keep})
    ctx.write(op.outputs[0], result)


@converts("RESHAPE")
def reshape(ctx: Conversion, op: Any) -> None:
    """To the output tensor's shape, the batch axis kept as it is (0) where the file's is the batch of 1."""
    shape = list(ctx.shape(op.outputs[0]))
    if shape and shape[0] == 1 and ctx.shape(op.inputs[0])[:1] == (1,):
        shape[0] = 0
    result = ctx.emit("reshape", [ctx.nhwc(op.inputs[0])], {"shape": shape})
    ctx.write(op.outputs[0], _to_nchw(ctx, result, len(shape)))


def _to_nchw(ctx: Conversion, name: str, rank: int) -> str:
    """A result in the file's layout, as the graph keeps it (4-D: NCHW)."""
    return ctx.emit("transpose", [name], {"perm": TO_NCHW}, nchw=True) if rank == 4 else name


@converts("SOFTMAX")
def softmax(ctx: Conversion, op: Any) -> None:
    beta = float(op.builtinOptions.beta) if op.builtinOptions is not None else 1.0
    source = ctx.nhwc(op.inputs[0])
    if beta != 1.0:
        source = ctx.emit("mul", [source, ctx.constant("beta", np.float32(beta))])
    rank = len(ctx.shape(op.inputs[0]))
    ctx.write(op.outputs[0], _to_nchw(ctx, ctx.emit("softmax", [source], {"axis": -1}), rank))


def _unary(ir_op: str) -> Converter:
    def convert(ctx: Conversion, op: Any) -> None:
        source = ctx.value(op.inputs[0])
        ctx.write(op.outputs[0], ctx.emit(ir_op, [source], nchw=source in ctx.nchw))

    return convert


for _name, _op in (("LOGISTIC", "sigmoid"), ("TANH", "tanh"), ("HARD_SWISH", "hard_swish"), ("RELU", "relu"),
                   ("RELU6", "relu6")):
    CONVERTERS.add(_name, _unary(_op))


@converts("QUANTIZE", "DEQUANTIZE")
def quantize(ctx: Conversion, op: Any) -> None:
    """Real values stay real values: the output's quantization (if any) is all a (de)quantizer states. A
    QUANTIZE of a quantized tensor requantizes: a one-input concat (a copy the integer path requantizes) keeps
    the two quantizations apart, as dabuild's given quantization requires."""
    source = ctx.value(op.inputs[0])
    nchw = source in ctx.nchw
    if op.inputs[0] in ctx.inputs and ctx.quantization(op.inputs[0]) is None and nchw:
        # a float model input quantized first thing: quantized before its transpose, so the graph input itself
        # carries the file's parameters (as an integer input does)
        quantized = ctx.quantized(op.outputs[0], ctx.inputs[op.inputs[0]])
        ctx.names[op.outputs[0]] = ctx.emit("transpose", [quantized], {"perm": TO_NCHW}, nchw=True)
    elif ctx.quantization(op.inputs[0]) is not None and ctx.quantization(op.outputs[0]) is not None:
        ctx.write(op.outputs[0], ctx.emit("concat", [source], {"axis": -1}, nchw=nchw))
    else:
        ctx.write(op.outputs[0], ctx.emit("identity", [source], nchw=nchw))


@converts("PAD", "PADV2")
def pad(ctx: Conversion, op: Any) -> None:
    paddings = ctx.static(op.inputs[1], "paddings").astype(np.int64)   # (rank, 2)
    value = 0.0
    if len(op.inputs) > 2:
        value = float(ctx.real(op.inputs[2]).ravel()[0])
    source = ctx.value(op.inputs[0])
    if source in ctx.nchw:
        paddings = paddings[TO_NCHW]
    pads = [int(p) for p in paddings[:, 0]] + [int(p) for p in paddings[:, 1]]
    ctx.write(op.outputs[0], ctx.emit("pad", [source], {"pads": pads, "value": value}, nchw=source in ctx.nchw))


@converts("CONCATENATION")
def concatenation(ctx: Conversion, op: Any) -> None:
    options = op.builtinOptions
    rank = len(ctx.shape(op.outputs[0]))
    axis = int(options.axis) % rank
    names = [ctx.value(index) for index in op.inputs]
    if rank == 4 and all(name in ctx.nchw for name in names):
        result = ctx.emit("concat", names, {"axis": NHWC_TO_NCHW[axis]}, nchw=True)
    else:
        result = _to_nchw(ctx, ctx.emit("concat", [ctx.nhwc(index) for index in op.inputs], {"axis": axis}), rank)
    _finish(ctx, op, result)


@converts("STRIDED_SLICE")
def strided_slice(ctx: Conversion, op: Any) -> None:
    options = op.builtinOptions
    for mask in ("ellipsisMask", "newAxisMask", "shrinkAxisMask"):
        if getattr(options, mask, 0):
            raise Unsupported(f"{mask} {getattr(options, mask)} is set; dabuild reads strided slices with begin and "
                              "end masks only")
    if getattr(options, "offset", False):
        raise Unsupported("offset is set; dabuild reads strided slices whose ends are positions")
    begin, end, stride = (ctx.static(index, what).astype(np.int64) for index, what in
                          zip(op.inputs[1:4], ("begin", "end", "strides")))
    shape = ctx.shape(op.inputs[0])
    starts, ends, axes, steps = [], [], [], []
    for axis in range(len(begin)):
        step = int(stride[axis])
        first = (0 if step > 0 else shape[axis] - 1) if options.beginMask >> axis & 1 else int(begin[axis])
        last = (2**62 if step > 0 else -(2**62)) if options.endMask >> axis & 1 else int(end[axis])
        if (first, last, step) in ((0, 2**62, 1), (0, shape[axis], 1)):
            continue
        if axis == 0:
            raise Unsupported("it slices the batch axis")
        starts.append(first)
        ends.append(last)
        axes.append(axis)
        steps.append(step)
    source = ctx.value(op.inputs[0])
    if source in ctx.nchw:
        axes = [NHWC_TO_NCHW[a] for a in axes]
    attrs = {"starts": starts, "ends": ends, "axes": axes, "steps": steps}
    ctx.write(op.outputs[0], ctx.emit("slice", [source], attrs, nchw=source in ctx.nchw) if axes
              else ctx.emit("identity", [source], nchw=source in ctx.nchw))
