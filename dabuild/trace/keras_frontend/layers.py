"""One converter per Keras layer class: Keras layer -> IR nodes (see the module docstring of `walk` for layouts).

A converter reads the layer's configuration and weights (as numpy), asks the
Builder for its inputs in the layout it needs, and returns the output Value(s).
Supporting another layer means adding one decorated function here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dabuild.trace.keras_frontend.walk import Builder, Call, Unsupported, Value, converts

# ---------------------------------------------------------------- activations


@dataclass(frozen=True)
class KerasActivation:
    """How a Keras activation is applied, and the IR ops that emits (the converters' `emits` follow from them)."""

    emits: tuple[str, ...]
    apply: Callable[[Builder, Value], Value]


def _simple(op: str, **attrs: object) -> KerasActivation:
    return KerasActivation((op,), lambda b, x: b.value(op, [x.name], dict(attrs), x.channels_first))


def _softmax(b: Builder, x: Value, axis: int = -1) -> Value:
    return b.value("softmax", [x.name], {"axis": x.axis(axis)}, x.channels_first)


def _silu(b: Builder, x: Value) -> Value:
    gate = b.emit("sigmoid", [x.name])
    return b.value("mul", [x.name, gate], channels_first=x.channels_first)


_SILU = KerasActivation(("sigmoid", "mul"), _silu)

# Keras activation names (keras.activations.serialize) -> how to apply them; keras 3 hard_sigmoid is relu6(x+3)/6
ACTIVATIONS: dict[str, KerasActivation] = {
    "linear": KerasActivation((), lambda b, x: x),
    "relu": _simple("relu"),
    "relu6": _simple("relu6"),
    "sigmoid": _simple("sigmoid"),
    "tanh": _simple("tanh"),
    "leaky_relu": _simple("leaky_relu", alpha=0.2),
    "hard_sigmoid": _simple("hard_sigmoid", alpha=1 / 6, beta=0.5),
    "hard_silu": _simple("hard_swish"),
    "hard_swish": _simple("hard_swish"),
    "gelu": _simple("gelu", approximate="none"),
    "silu": _SILU,
    "swish": _SILU,
    "softmax": KerasActivation(("softmax",), _softmax),
}


# Every IR op an `activation=` may emit, read off ACTIVATIONS (adding an activation is one entry there).
ACTIVATION_OPS = tuple(sorted({op for activation in ACTIVATIONS.values() for op in activation.emits}))


def activation_name(function: object) -> str:
    import keras

    name = keras.activations.serialize(function)
    return name if isinstance(name, str) else str(name.get("config", name))


def activate(b: Builder, layer: object, x: Value) -> Value:
    """The layer's own `activation` applied to `x`."""
    function = getattr(layer, "activation", None)
    if function is None:
        return x
    name = activation_name(function)
    if name not in ACTIVATIONS:
        raise Unsupported(f"activation {name!r}; supported: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name].apply(b, x)


@converts("Activation", emits=ACTIVATION_OPS)
def activation_layer(b: Builder, call: Call) -> Value:
    return activate(b, call.layer, call.inputs[0])


@converts("ReLU", emits=("relu", "relu6", "clip", "leaky_relu"))
def relu(b: Builder, call: Call) -> Value:
    layer, x = call.layer, call.inputs[0]
    slope, top = float(layer.negative_slope), layer.max_value
    if float(layer.threshold) != 0:
        raise Unsupported(f"threshold {layer.threshold} (only 0 is mapped)")
    top = None if top is None else float(top)
    if slope == 0 and top is None:
        return b.value("relu", [x.name], channels_first=x.channels_first)
    if slope == 0 and top == 6:
        return b.value("relu6", [x.name], channels_first=x.channels_first)
    if slope == 0:
        return b.value("clip", [x.name], {"min": 0.0, "max": top}, x.channels_first)
    if top is None:
        return b.value("leaky_relu", [x.name], {"alpha": slope}, x.channels_first)
    raise Unsupported("negative_slope together with max_value")


@converts("LeakyReLU", emits=("leaky_relu",))
def leaky_relu(b: Builder, call: Call) -> Value:
    x = call.inputs[0]
    return b.value("leaky_relu", [x.name], {"alpha": float(call.layer.negative_slope)}, x.channels_first)


@converts("Softmax", emits=("softmax",))
def softmax(b: Builder, call: Call) -> Value:
    axis = call.layer.axis
    if not isinstance(axis, int):
        axis = list(axis)
        if len(axis) != 1:
            raise Unsupported(f"softmax over several axes {axis}")
        axis = axis[0]
    return _softmax(b, call.inputs[0], axis)


# ---------------------------------------------------------------- no-ops at inference


@converts("Dropout", "SpatialDropout1D", "SpatialDropout2D", "GaussianNoise", "GaussianDropout", "AlphaDropout",
          "ActivityRegularization", emits=())
def inference_identity(b: Builder, call: Call) -> Value:
    """Layers that only act while training pass their input through at inference."""
    return call.inputs[0]


# ---------------------------------------------------------------- dense


@converts("Dense", emits=("dense", *ACTIVATION_OPS))
def dense(b: Builder, call: Call) -> Value:
    """Dense over the last axis, any rank: Keras's own layout."""
    x = b.keras_layout(call.inputs[0])
    w = call.weights
    names = [x.name, b.constant(w["kernel"], "kernel")]
    if "bias" in w:
        names.append(b.constant(w["bias"], "bias"))
    return activate(b, call.layer, b.value("dense", names, {"activation": "none"}))


def _einsum_as_dense(equation: str, kernel_shape: tuple[int, ...]) -> tuple[list[int], str]:
    """For `...x,xy..->...y..` (the kernel contracts the input's last axis only): (output free shape, letters).

    Other equations (contracting several axes, transposing the input) have no IR op: Unsupported."""
    refusal = Unsupported(f"equation {equation!r}: only equations contracting the input's last axis with the "
                          "kernel's first are mapped, e.g. 'abc,cd->abd'")
    try:
        operands, output = equation.replace(" ", "").split("->")
        source, kernel = operands.split(",")
    except ValueError:
        raise refusal from None
    batch, free = source[:-1], kernel[1:]
    if not source or kernel[:1] != source[-1:] or output != batch + free or len(free) != len(kernel_shape) - 1:
        raise refusal
    return list(kernel_shape[1:]), free


@converts("EinsumDense", emits=("dense", "reshape", *ACTIVATION_OPS))
def einsum_dense(b: Builder, call: Call) -> Value:
    """EinsumDense that is a dense over the last axis (possibly to several new axes): dense, then reshape."""
    layer = call.layer
    w = call.weights
    kernel = w["kernel"]
    free_shape, free = _einsum_as_dense(layer.equation, kernel.shape)
    x = b.keras_layout(call.inputs[0])
    names = [x.name, b.constant(kernel.reshape(kernel.shape[0], -1), "kernel")]
    if "bias" in w:
        axes = layer.bias_axes or ""
        if any(letter not in free for letter in axes):
            raise Unsupported(f"bias_axes {axes!r} outside the kernel's output axes {free!r}")
        bias_shape = [size if letter in axes else 1 for letter, size in zip(free, free_shape)]
        bias = np.broadcast_to(w["bias"].reshape(bias_shape), free_shape).reshape(-1)
        names.append(b.constant(bias, "bias"))
    y = b.value("dense", names, {"activation": "none"})
    if len(free_shape) != 1:
        y = b.value("reshape", [y.name], {"shape": [0] * (x.rank - 1) + free_shape})
    return activate(b, layer, y)


# ---------------------------------------------------------------- convolution


def _channels_first_input(b: Builder, layer: object, x: Value) -> Value:
    """A spatial layer's input in the IR's layout; a `data_format="channels_first"` layer has it so already."""
    if getattr(layer, "data_format", "channels_last") == "channels_first":
        return b.layout(b.keras_layout(x), True)  # Keras's layout is the IR's here
    return b.channels_first(x)


def _spatial_output(layer: object, y: Value) -> Value:
    """A spatial layer's IR output as a Value: in Keras's own layout when the layer is channels first."""
    return Value(y.name, y.rank, getattr(layer, "data_format", "channels_last") != "channels_first")


def padding(mode: str, sizes: tuple[int, ...], kernel: list[int], strides: list[int], dilations: list[int]
            ) -> list[int]:
    """ONNX-order pads (begins, then ends) for Keras's `valid`, `same` (extra at the end, as TF) or `causal`."""
    if mode == "valid":
        return [0] * 2 * len(kernel)
    spans = [d * (k - 1) + 1 for k, d in zip(kernel, dilations)]
    if mode == "causal":
        return [span - 1 for span in spans] + [0] * len(kernel)
    if mode != "same":
        raise Unsupported(f"padding {mode!r}")
    totals = [max((math.ceil(n / s) - 1) * s + span - n, 0) for n, s, span in zip(sizes, strides, spans)]
    return [t // 2 for t in totals] + [t - t // 2 for t in totals]


def _conv(b: Builder, layer: Any, x: Value, kernel: np.ndarray, bias: np.ndarray | None, groups: int,
          strides: list[int] | None = None, mode: str | None = None) -> Value:
    """An IR conv over channels-first `x` with an (O, C/groups, *k) kernel, Keras's geometry of `layer`."""
    size = kernel.shape[2:]
    strides = list(strides or layer.strides)
    dilations = list(layer.dilation_rate)
    pads = padding(mode or layer.padding, b.sizes(x, 2), list(size), strides, dilations)
    names = [x.name, b.constant(kernel, "kernel")]
    if bias is not None:
        names.append(b.constant(bias, "bias"))
    attrs = {"strides": strides, "pads": pads, "dilations": dilations, "groups": groups, "activation": "none"}
    return b.value("conv", names, attrs, channels_first=True)


def _to_oihw(kernel: np.ndarray) -> np.ndarray:
    """Keras's (*k, C/groups, O) kernel as the IR's (O, C/groups, *k)."""
    rank = kernel.ndim
    return np.ascontiguousarray(kernel.transpose(rank - 1, rank - 2, *range(rank - 2)))


def _depthwise_kernel(kernel: np.ndarray) -> np.ndarray:
    """Keras's depthwise (*k, C, M) kernel as the IR's grouped (C*M, 1, *k): output channel c*M + m, as Keras."""
    rank = kernel.ndim
    moved = kernel.transpose(rank - 2, rank - 1, *range(rank - 2))  # (C, M, *k)
    return np.ascontiguousarray(moved.reshape(-1, 1, *moved.shape[2:]))


@converts("Conv1D", "Conv2D", "Conv3D", "DepthwiseConv1D", "DepthwiseConv2D", emits=("conv", *ACTIVATION_OPS))
def conv(b: Builder, call: Call) -> Value:
    """Convolutions; a depthwise one is a conv with one group per input channel."""
    layer = call.layer
    x = _channels_first_input(b, layer, call.inputs[0])
    w = call.weights
    if hasattr(layer, "depth_multiplier"):
        kernel, groups = _depthwise_kernel(w["kernel"]), b.sizes(x)[0]
    else:
        kernel, groups = _to_oihw(w["kernel"]), int(layer.groups)
    y = _conv(b, layer, x, kernel, w.get("bias"), groups)
    return _spatial_output(layer, activate(b, layer, y))


@converts("SeparableConv1D", "SeparableConv2D", emits=("conv", *ACTIVATION_OPS))
def separable_conv(b: Builder, call: Call) -> Value:
    """A depthwise conv (no bias) then a 1x1 conv with the bias and the activation."""
    layer = call.layer
    x = _channels_first_input(b, layer, call.inputs[0])
    w = call.weights
    depthwise = _conv(b, layer, x, _depthwise_kernel(w["depthwise_kernel"]), None, b.sizes(x)[0])
    pointwise = _to_oihw(w["pointwise_kernel"])
    ones = [1] * (pointwise.ndim - 2)
    y = _conv(b, layer, depthwise, pointwise, w.get("bias"), 1, strides=ones, mode="valid")
    return _spatial_output(layer, activate(b, layer, y))


# ---------------------------------------------------------------- normalisation


@converts("BatchNormalization", emits=("batch_norm",))
def batch_norm(b: Builder, call: Call) -> Value:
    """Inference batch norm over the channel axis: the IR's batch_norm, which normalises axis 1."""
    layer, x = call.layer, call.inputs[0]
    axis = layer.axis if isinstance(layer.axis, int) else None
    if axis is not None and x.axis(axis) != 1 and axis % x.rank == x.rank - 1:
        x = b.channels_first(x)
    if axis is None or x.axis(axis) != 1:
        raise Unsupported(f"axis {layer.axis} (only the channel axis is mapped)")
    w = call.weights
    channels = w["moving_mean"].shape[0]
    scale = w.get("gamma", np.ones(channels, np.float32))
    offset = w.get("beta", np.zeros(channels, np.float32))
    names = [x.name, b.constant(scale, "gamma"), b.constant(offset, "beta"),
             b.constant(w["moving_mean"], "moving_mean"), b.constant(w["moving_variance"], "moving_variance")]
    return b.value("batch_norm", names, {"epsilon": float(layer.epsilon)}, channels_first=x.channels_first)


# ---------------------------------------------------------------- pooling


def _pool(b: Builder, call: Call, op: str) -> Value:
    layer = call.layer
    x = _channels_first_input(b, layer, call.inputs[0])
    kernel, strides = list(layer.pool_size), list(layer.strides or layer.pool_size)
    pads = padding(layer.padding, b.sizes(x, 2), kernel, strides, [1] * len(kernel))
    attrs = {"kernel": kernel, "strides": strides, "pads": pads, "ceil_mode": False}
    if op == "avg_pool":
        attrs["count_include_pad"] = False  # Keras averages over the window's real elements only
    return _spatial_output(layer, b.value(op, [x.name], attrs, channels_first=True))


@converts("MaxPooling1D", "MaxPooling2D", "MaxPooling3D", emits=("max_pool",))
def max_pool(b: Builder, call: Call) -> Value:
    return _pool(b, call, "max_pool")


@converts("AveragePooling1D", "AveragePooling2D", "AveragePooling3D", emits=("avg_pool",))
def avg_pool(b: Builder, call: Call) -> Value:
    return _pool(b, call, "avg_pool")


def _global_pool(b: Builder, call: Call, op: str) -> Value:
    layer = call.layer
    x = _channels_first_input(b, layer, call.inputs[0])
    spatial = list(range(2, x.rank))
    y = b.value(op, [x.name], {"axes": spatial, "keepdims": bool(layer.keepdims)}, channels_first=True)
    return _spatial_output(layer, y)


@converts("GlobalAveragePooling1D", "GlobalAveragePooling2D", "GlobalAveragePooling3D", emits=("reduce_mean",))
def global_avg_pool(b: Builder, call: Call) -> Value:
    return _global_pool(b, call, "reduce_mean")


@converts("GlobalMaxPooling1D", "GlobalMaxPooling2D", "GlobalMaxPooling3D", emits=("reduce_max",))
def global_max_pool(b: Builder, call: Call) -> Value:
    return _global_pool(b, call, "reduce_max")


@converts("ZeroPadding1D", "ZeroPadding2D", "ZeroPadding3D", emits=("pad",))
def zero_padding(b: Builder, call: Call) -> Value:
    layer = call.layer
    x = _channels_first_input(b, layer, call.inputs[0])
    pairs = [layer.padding] if isinstance(layer.padding[0], int) else list(layer.padding)
    begins, ends = [0, 0] + [int(p[0]) for p in pairs], [0, 0] + [int(p[1]) for p in pairs]
    return _spatial_output(layer, b.value("pad", [x.name], {"pads": begins + ends}, channels_first=True))


# ---------------------------------------------------------------- merging


def _same_layout(b: Builder, values: list[Value]) -> list[Value]:
    """The inputs in one layout: the IR's if any input is in it (a residual add between convs stays there)."""
    wanted = any(v.channels_first for v in values)
    return [b.layout(v, wanted) if v.rank == values[0].rank else v for v in values]


def _fold(b: Builder, op: str, values: list[Value]) -> Value:
    values = _same_layout(b, values)
    result = values[0]
    for value in values[1:]:
        result = b.value(op, [result.name, value.name], channels_first=values[0].channels_first)
    return result


@converts("Add", emits=("add",))
def add(b: Builder, call: Call) -> Value:
    return _fold(b, "add", call.inputs)


@converts("Multiply", emits=("mul",))
def multiply(b: Builder, call: Call) -> Value:
    return _fold(b, "mul", call.inputs)


@converts("Subtract", emits=("sub",))
def subtract(b: Builder, call: Call) -> Value:
    return _fold(b, "sub", call.inputs)


@converts("Average", emits=("add", "mul"))
def average(b: Builder, call: Call) -> Value:
    total = _fold(b, "add", call.inputs)
    share = b.constant(np.array(1 / len(call.inputs), np.float32), "share")
    return b.value("mul", [total.name, share], channels_first=total.channels_first)


@converts("Concatenate", emits=("concat",))
def concatenate(b: Builder, call: Call) -> Value:
    values = _same_layout(b, call.inputs)
    axis = values[0].axis(call.layer.axis)
    return b.value("concat", [v.name for v in values], {"axis": axis}, channels_first=values[0].channels_first)


def _operand(b: Builder, operand: object) -> Value:
    """A keras.ops operand: a Value, or a Python or numpy constant."""
    if isinstance(operand, Value):
        return operand
    array = np.asarray(operand, dtype=np.float32)
    if array.ndim:
        raise Unsupported("an array constant operand (only scalars are mapped)")
    return Value(b.constant(array, "constant"), 0)


def _binary_op(op: str) -> Callable[[Builder, Call], Value]:
    def convert(b: Builder, call: Call) -> Value:
        first, second = (_operand(b, operand) for operand in call.args[:2])
        tensors = _same_layout(b, [v for v in (first, second) if v.rank])
        layout = tensors[0].channels_first
        first, second = (tensors.pop(0) if v.rank else v for v in (first, second))
        return b.value(op, [first.name, second.name], channels_first=layout)

    convert.__doc__ = f"`x {op} y` in a functional model (keras.ops), tensors or scalars."
    return convert


for _op, _name in (("add", "Add"), ("sub", "Subtract"), ("mul", "Multiply")):
    converts(f"ops.{_name}", emits=(_op,))(_binary_op(_op))


# ---------------------------------------------------------------- reshaping


@converts("Flatten", emits=("flatten",))
def flatten(b: Builder, call: Call) -> Value:
    """Flatten in Keras's element order: the input goes back to channels last first."""
    x = b.keras_layout(call.inputs[0])
    return b.value("flatten", [x.name], {"axis": 1})


@converts("Reshape", emits=("reshape",))
def reshape(b: Builder, call: Call) -> Value:
    x = b.keras_layout(call.inputs[0])
    return b.value("reshape", [x.name], {"shape": [0, *(int(d) for d in call.layer.target_shape)]})


@converts("Permute", emits=("transpose",))
def permute(b: Builder, call: Call) -> Value:
    x = b.keras_layout(call.inputs[0])
    return b.value("transpose", [x.name], {"perm": [0, *(int(d) for d in call.layer.dims)]})
