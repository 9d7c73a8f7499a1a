"""ATen op -> dabuild op converters, one small function per op family.

Each converter reads a `Call` (the node and its arguments by schema name),
emits dabuild nodes through the `Builder`, and returns the output tensor name
(or one name per output). It raises `Unsupported` with a reason for argument
combinations dabuild cannot express, such as transposed convolution.
Names follow ATen's overload packets, so `conv2d.default` and
`conv2d.padding` share one converter.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dabuild.trace.torch_frontend.convert import (
    CONVERTERS,
    INT64_MAX,
    Builder,
    Call,
    Unsupported,
    aten,
    expand,
    normalize,
    op_name,
)


def known(target: Any) -> bool:
    """Whether a converter here maps this ATen op (capture decomposes only the others)."""
    return getattr(target, "namespace", None) == "aten" and op_name(target) in CONVERTERS


# ---------------------------------------------------------------- pass-through


@aten("clone", "detach", "alias", "contiguous", "lift_fresh_copy", emits=())
def passthrough(builder: Builder, call: Call) -> str:
    return builder.tensor(call["self"])


@aten("dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout", emits=())
def dropout(builder: Builder, call: Call) -> str:
    if call["train"]:
        raise Unsupported("dropout in training mode")
    return builder.tensor(call["input"])


@aten("_to_copy", "to", emits=())
def to_float32(builder: Builder, call: Call) -> str:
    """A copy or conversion that keeps float32 (dabuild computes in float32 only)."""
    source, result = call.node.all_input_nodes[0].meta["val"], call.node.meta["val"]
    if str(source.dtype) != "torch.float32" or str(result.dtype) != "torch.float32":
        raise Unsupported(f"conversion from {source.dtype} to {result.dtype} (dabuild computes in float32)")
    return builder.tensor(call["self"])


# ---------------------------------------------------------------- elementwise


def _scaled(builder: Builder, arg: Any, alpha: Any) -> str:
    """`alpha * arg` (add/sub's alpha), folded when arg is a constant."""
    if alpha == 1:
        return builder.tensor(arg)
    array = builder.constant(arg)
    if array is not None:
        return builder.add_constant(array * np.float32(alpha), builder.hint(arg))
    return builder.emit1("mul", [builder.tensor(arg), builder.add_constant(np.float32(alpha), "alpha")])


@aten("add", emits=("add", "mul"))
def add(builder: Builder, call: Call) -> str:
    return builder.emit1("add", [builder.tensor(call["self"]), _scaled(builder, call["other"], call["alpha"])])


@aten("sub", emits=("sub", "mul"))
def sub(builder: Builder, call: Call) -> str:
    return builder.emit1("sub", [builder.tensor(call["self"]), _scaled(builder, call["other"], call["alpha"])])


@aten("rsub", emits=("sub", "mul"))
def rsub(builder: Builder, call: Call) -> str:
    return builder.emit1("sub", [builder.tensor(call["other"]), _scaled(builder, call["self"], call["alpha"])])


@aten("mul", emits=("mul",))
def mul(builder: Builder, call: Call) -> str:
    return builder.emit1("mul", [builder.tensor(call["self"]), builder.tensor(call["other"])])


@aten("div", emits=("div",))
def div(builder: Builder, call: Call) -> str:
    if call.args.get("rounding_mode") is not None:
        raise Unsupported(f"division with rounding_mode={call['rounding_mode']!r}")
    return builder.emit1("div", [builder.tensor(call["self"]), builder.tensor(call["other"])])


@aten("maximum", emits=("max",))
def maximum(builder: Builder, call: Call) -> str:
    return builder.emit1("max", [builder.tensor(call["self"]), builder.tensor(call["other"])])


@aten("minimum", emits=("min",))
def minimum(builder: Builder, call: Call) -> str:
    return builder.emit1("min", [builder.tensor(call["self"]), builder.tensor(call["other"])])


@aten("where", emits=("where",))
def where(builder: Builder, call: Call) -> str:
    """A select by a condition known while tracing (a mask), between tensors or numbers."""
    condition = builder.value(call["condition"]) if not builder.is_tensor(call["condition"]) else None
    if condition is None:
        raise Unsupported("a condition computed from the inputs (dabuild selects by a constant condition)")
    name = builder.fresh(builder.hint(call["condition"]))
    array = np.asarray(condition.detach().numpy() if hasattr(condition, "detach") else condition, dtype=bool)
    builder.constants[name], builder.shapes[name] = array, tuple(array.shape)
    return builder.emit1("where", [name, builder.tensor(call["self"]), builder.tensor(call["other"])])


# ---------------------------------------------------------------- activations


def _unary(op: str, **attrs: Any) -> Any:
    def converter(builder: Builder, call: Call) -> str:
        return builder.emit1(op, [builder.tensor(call["self"])], dict(attrs))

    return converter


aten("relu", emits=("relu",))(_unary("relu"))
aten("relu6", emits=("relu6",))(_unary("relu6"))
aten("sigmoid", emits=("sigmoid",))(_unary("sigmoid"))
aten("tanh", emits=("tanh",))(_unary("tanh"))
aten("hardswish", emits=("hard_swish",))(_unary("hard_swish"))
aten("hardsigmoid", emits=("hard_sigmoid",))(_unary("hard_sigmoid", alpha=1 / 6, beta=0.5))
aten("selu", emits=("selu",))(_unary("selu"))
aten("abs", emits=("abs",))(_unary("abs"))
aten("neg", emits=("neg",))(_unary("neg"))
aten("exp", emits=("exp",))(_unary("exp"))
aten("log", emits=("log",))(_unary("log"))
aten("sqrt", emits=("sqrt",))(_unary("sqrt"))
aten("reciprocal", emits=("reciprocal",))(_unary("reciprocal"))
aten("erf", emits=("erf",))(_unary("erf"))


@aten("rsqrt", emits=("sqrt", "reciprocal"))
def rsqrt(builder: Builder, call: Call) -> str:
    return builder.emit1("reciprocal", [builder.emit1("sqrt", [builder.tensor(call["self"])])])


@aten("elu", emits=("elu", "selu"))
def elu(builder: Builder, call: Call) -> str:
    """torch's elu is scale * elu(input_scale * x, alpha): selu when scaled, elu otherwise."""
    if float(call["input_scale"]) != 1:
        raise Unsupported(f"elu with input_scale {call['input_scale']}")
    x, alpha, scale = builder.tensor(call["self"]), float(call["alpha"]), float(call["scale"])
    if scale == 1:
        return builder.emit1("elu", [x], {"alpha": alpha})
    return builder.emit1("selu", [x], {"alpha": alpha, "gamma": scale})


@aten("softplus", emits=("softplus", "mul"))
def softplus(builder: Builder, call: Call) -> str:
    """softplus(beta x) / beta; torch's threshold (x above it passes unchanged) differs from it below float32's
    resolution, so it is not modelled."""
    x, beta = builder.tensor(call["self"]), float(call["beta"])
    if beta == 1:
        return builder.emit1("softplus", [x])
    scaled = builder.emit1("mul", [x, builder.add_constant(np.float32(beta), "beta")])
    return builder.emit1("mul", [builder.emit1("softplus", [scaled]), builder.add_constant(np.float32(1 / beta), "beta")])


@aten("pow", emits=("pow",))
def power(builder: Builder, call: Call) -> str:
    """A tensor to a known scalar power (pow.Tensor_Scalar, or pow.Tensor_Tensor with a known one-element exponent)."""
    exponent = builder.constant(call["exponent"])
    if "self" not in call.args or not builder.is_tensor(call["self"]) or exponent is None or exponent.size != 1:
        raise Unsupported("a power whose exponent is not one known number")
    return builder.emit1("pow", [builder.tensor(call["self"])], {"exponent": float(exponent.reshape(()))})


@aten("prelu", "_prelu_kernel", emits=("prelu",))
def prelu(builder: Builder, call: Call) -> str:
    """nn.PReLU's weight has one slope (or one per channel, axis 1): shaped (C, 1, ...) to broadcast there."""
    x = builder.tensor(call["self"])
    slope = builder.constant(call["weight"])
    rank = len(builder.shape(x))
    if slope is None:
        raise Unsupported("a slope computed from the inputs")
    slope = slope.reshape(-1, *[1] * max(rank - 2, 0)) if slope.size > 1 else slope.reshape(())
    return builder.emit1("prelu", [x, builder.add_constant(slope, builder.hint(call["weight"]))])


@aten("leaky_relu", emits=("leaky_relu",))
def leaky_relu(builder: Builder, call: Call) -> str:
    return builder.emit1("leaky_relu", [builder.tensor(call["self"])], {"alpha": float(call["negative_slope"])})


@aten("gelu", emits=("gelu",))
def gelu(builder: Builder, call: Call) -> str:
    return builder.emit1("gelu", [builder.tensor(call["self"])], {"approximate": call["approximate"]})


def _bounds(builder: Builder, low: Any, high: Any) -> tuple[float | None, float | None]:
    """Clamp bounds as floats; tensor bounds only when they are known scalars."""
    result = []
    for bound in (low, high):
        array = None if bound is None else builder.constant(bound)
        if array is not None and array.size != 1:
            raise Unsupported("clamp with per-element bounds")
        result.append(None if array is None else float(array.reshape(())))
    return result[0], result[1]


_CLIPS = ("relu", "relu6", "clip")


def _clip(builder: Builder, x: Any, low: Any, high: Any) -> str:
    """clamp/hardtanh as the most specific dabuild op: relu, relu6 or clip."""
    low_value, high_value = _bounds(builder, low, high)
    if low_value == 0 and high_value is None:
        return builder.emit1("relu", [builder.tensor(x)])
    if low_value == 0 and high_value == 6:
        return builder.emit1("relu6", [builder.tensor(x)])
    attrs = {key: value for key, value in (("min", low_value), ("max", high_value)) if value is not None}
    return builder.emit1("clip", [builder.tensor(x)], attrs)


@aten("clamp", emits=_CLIPS)
def clamp(builder: Builder, call: Call) -> str:
    return _clip(builder, call["self"], call["min"], call["max"])


@aten("clamp_min", emits=_CLIPS)
def clamp_min(builder: Builder, call: Call) -> str:
    return _clip(builder, call["self"], call["min"], None)


@aten("clamp_max", emits=_CLIPS)
def clamp_max(builder: Builder, call: Call) -> str:
    return _clip(builder, call["self"], None, call["max"])


@aten("hardtanh", emits=_CLIPS)
def hardtanh(builder: Builder, call: Call) -> str:
    return _clip(builder, call["self"], call["min_val"], call["max_val"])


@aten("softmax", "_softmax", emits=("softmax",))
def softmax(builder: Builder, call: Call) -> str:
    return builder.emit1("softmax", [builder.tensor(call["self"])], {"axis": int(call["dim"])})


@aten("log_softmax", "_log_softmax", emits=("log_softmax",))
def log_softmax(builder: Builder, call: Call) -> str:
    return builder.emit1("log_softmax", [builder.tensor(call["self"])], {"axis": int(call["dim"])})


@aten("scaled_dot_product_attention", emits=("matmul", "transpose", "mul", "add", "softmax"))
def attention(builder: Builder, call: Call) -> str:
    """softmax(q @ k^T * scale (+ mask)) @ v, as nn.MultiheadAttention runs in eval mode; the mask a constant."""
    if call.args.get("dropout_p"):
        raise Unsupported("attention dropout (call model.eval())")
    if call.args.get("enable_gqa"):
        raise Unsupported("grouped-query attention")
    query, key, value = (builder.tensor(call[part]) for part in ("query", "key", "value"))
    rank = len(builder.shape(query))
    scale = call.args.get("scale")
    scale = 1 / np.sqrt(builder.size(query, -1)) if scale is None else float(scale)
    perm = [*range(rank - 2), rank - 1, rank - 2]
    scores = builder.emit1("matmul", [query, builder.emit1("transpose", [key], {"perm": perm})])
    scores = builder.emit1("mul", [scores, builder.add_constant(np.float32(scale), "attention_scale")])
    mask = call.args.get("attn_mask")
    if call.args.get("is_causal"):
        causal = np.triu(np.full((builder.size(query, -2), builder.size(key, -2)), -np.inf, np.float32), 1)
        scores = builder.emit1("add", [scores, builder.add_constant(causal, "causal_mask")])
    if mask is not None:
        known = builder.constant(mask)
        if known is None:
            raise Unsupported("an attention mask computed from the inputs")
        if builder.value(mask).dtype == torch.bool:
            known = np.where(known > 0, 0.0, -np.inf).astype(np.float32)
        scores = builder.emit1("add", [scores, builder.add_constant(known, builder.hint(mask))])
    weights = builder.emit1("softmax", [scores], {"axis": rank - 1})
    return builder.emit1("matmul", [weights, value])


# ---------------------------------------------------------------- normalisation


@aten("layer_norm", "native_layer_norm", emits=("layer_norm",))
def layer_norm(builder: Builder, call: Call) -> Any:
    x = builder.tensor(call["input"])
    rank = len(builder.shape(x))
    inputs = [x]
    shape = [int(d) for d in call["normalized_shape"]]
    for part, default in (("weight", np.ones), ("bias", np.zeros)):
        value = np.asarray(default(shape), np.float32) if call[part] is None else builder.constant(call[part])
        if value is None:
            raise Unsupported(f"a layer norm {part} computed from the inputs")
        inputs.append(builder.add_constant(value, builder.hint(call[part]) if call[part] is not None else part))
    y = builder.emit1("layer_norm", inputs, {"axis": rank - len(shape), "epsilon": float(call["eps"])})
    return y if call.name == "layer_norm" else [y, None, None]


def _channel_parameters(builder: Builder, call: Call, channels: int | None) -> list[str]:
    """A norm's per-channel weight and bias (ones and zeros when absent) as constants."""
    if channels is None:
        raise Unsupported("a dynamic channel count")
    names = []
    for part, default in (("weight", np.ones), ("bias", np.zeros)):
        value = np.asarray(default(channels), np.float32) if call[part] is None else builder.constant(call[part])
        if value is None:
            raise Unsupported(f"a norm {part} computed from the inputs")
        names.append(builder.add_constant(value, builder.hint(call[part]) if call[part] is not None else part))
    return names


@aten("group_norm", "native_group_norm", emits=("group_norm",))
def group_norm(builder: Builder, call: Call) -> Any:
    x = builder.tensor(call["input"])
    groups = int(call["num_groups"] if "num_groups" in call.args else call["group"])
    attrs = {"groups": groups, "epsilon": float(call["eps"])}
    y = builder.emit1("group_norm", [x, *_channel_parameters(builder, call, builder.shape(x)[1])], attrs)
    return y if call.name == "group_norm" else [y, None, None]


@aten("instance_norm", emits=("instance_norm",))
def instance_norm(builder: Builder, call: Call) -> str:
    """nn.InstanceNorm (statistics of each sample); with running statistics it is a batch norm."""
    if not call["use_input_stats"]:
        raise Unsupported("instance norm with running statistics (track_running_stats=True in eval mode)")
    x = builder.tensor(call["input"])
    return builder.emit1("instance_norm", [x, *_channel_parameters(builder, call, builder.shape(x)[1])],
                         {"epsilon": float(call["eps"])})


# ---------------------------------------------------------------- linear algebra


def _dense(builder: Builder, call: Call, x: Any, weight: tuple[np.ndarray, Any], bias: tuple[np.ndarray, Any] | None) -> str:
    """A dense node; `weight` and `bias` are (array in dabuild's layout, the torch argument it came from)."""
    inputs = [builder.tensor(x), builder.add_constant(weight[0], builder.hint(weight[1]))]
    if bias is not None:
        inputs.append(builder.add_constant(bias[0].reshape(-1), builder.hint(bias[1])))
    return builder.emit1("dense", inputs, {"activation": "none"}, hint=call.node.name)  # as canonicalize_dense spells it


def _matmul_add(builder: Builder, x: Any, weight: Any, bias: Any) -> str:
    """x @ weight (+ bias) for a weight computed from the inputs."""
    product = builder.emit1("matmul", [builder.tensor(x), builder.tensor(weight)])
    return product if bias is None else builder.emit1("add", [product, builder.tensor(bias)])


@aten("linear", emits=("dense", "transpose", "matmul", "add"))
def linear(builder: Builder, call: Call) -> str:
    weight = builder.constant(call["weight"])
    bias = None if call["bias"] is None else builder.constant(call["bias"])
    if weight is not None and (call["bias"] is None or bias is not None):
        return _dense(builder, call, call["input"], (weight.T, call["weight"]),
                      None if bias is None else (bias, call["bias"]))
    transposed = builder.emit1("transpose", [builder.tensor(call["weight"])], {"perm": [1, 0]})
    product = builder.emit1("matmul", [builder.tensor(call["input"]), transposed])
    return product if call["bias"] is None else builder.emit1("add", [product, builder.tensor(call["bias"])])


@aten("addmm", emits=("dense", "matmul", "add"))
def addmm(builder: Builder, call: Call) -> str:
    if call["beta"] != 1 or call["alpha"] != 1:
        raise Unsupported(f"addmm with beta={call['beta']}, alpha={call['alpha']}")
    weight, bias = builder.constant(call["mat2"]), builder.constant(call["self"])
    if weight is not None and bias is not None and bias.size == weight.shape[1]:
        return _dense(builder, call, call["mat1"], (weight, call["mat2"]), (bias, call["self"]))
    return _matmul_add(builder, call["mat1"], call["mat2"], call["self"])


@aten("mm", "bmm", "matmul", emits=("dense", "matmul"))
def matmul(builder: Builder, call: Call) -> str:
    other = call["mat2"] if "mat2" in call.args else call["other"]
    weight = builder.constant(other)
    if weight is not None and weight.ndim == 2:
        return _dense(builder, call, call["self"], (weight, other), None)
    return _matmul_add(builder, call["self"], other, None)


def _pads(padding: Any, weight_shape: tuple[int, ...], dilations: list[int]) -> list[int]:
    """torch's symmetric padding (ints, 'same' or 'valid') as ONNX pads [begin..., end...]."""
    spatial = len(weight_shape) - 2
    if padding == "valid":
        return [0] * (2 * spatial)
    if padding == "same":
        totals = [d * (k - 1) for d, k in zip(dilations, weight_shape[2:])]
        return [t // 2 for t in totals] + [t - t // 2 for t in totals]
    values = expand(padding, spatial)
    return values + values


@aten("conv_transpose1d", "conv_transpose2d", "conv_transpose3d", emits=("conv_transpose",))
def conv_transpose(builder: Builder, call: Call) -> str:
    """torch's padding p trims p from both ends of each axis (ONNX pads [p..., p...]); dilation as ONNX's."""
    weight = builder.tensor(call["weight"])
    spatial = len(builder.shape(weight)) - 2
    padding = expand(call["padding"], spatial)
    attrs = {"strides": expand(call["stride"], spatial), "pads": padding + padding,
             "dilations": expand(call["dilation"], spatial), "groups": int(call["groups"]),
             "output_padding": expand(call["output_padding"], spatial)}
    inputs = [builder.tensor(call["input"]), weight]
    if call["bias"] is not None:
        inputs.append(builder.tensor(call["bias"]))
    return builder.emit1("conv_transpose", inputs, attrs)


@aten("conv1d", "conv2d", "conv3d", "convolution", emits=("conv", "conv_transpose"))
def conv(builder: Builder, call: Call) -> str:
    if call.args.get("transposed"):
        return conv_transpose(builder, call)
    if any(call.args.get("output_padding") or []):
        raise Unsupported("convolution with output_padding")
    weight = builder.tensor(call["weight"])
    weight_shape = builder.shape(weight)
    spatial = len(weight_shape) - 2
    dilations = expand(call["dilation"], spatial)
    attrs = {
        "strides": expand(call["stride"], spatial),
        "pads": _pads(call["padding"], weight_shape, dilations),  # type: ignore[arg-type]
        "dilations": dilations,
        "groups": int(call["groups"]),
    }
    inputs = [builder.tensor(call["input"]), weight]
    if call["bias"] is not None:
        inputs.append(builder.tensor(call["bias"]))
    return builder.emit1("conv", inputs, attrs)


@aten("batch_norm", "_native_batch_norm_legit_no_training", "native_batch_norm", emits=("batch_norm",))
def batch_norm(builder: Builder, call: Call) -> Any:
    """Inference batch norm over axis 1 with the running statistics."""
    if call.args.get("training"):
        raise Unsupported("batch norm with batch statistics (call model.eval(), or track_running_stats=True)")
    mean, var = builder.constant(call["running_mean"]), builder.constant(call["running_var"])
    if mean is None or var is None:
        raise Unsupported("batch norm without constant running statistics")
    scale = np.ones_like(mean) if call["weight"] is None else builder.constant(call["weight"])
    shift = np.zeros_like(mean) if call["bias"] is None else builder.constant(call["bias"])
    if scale is None or shift is None:
        raise Unsupported("batch norm with a computed weight or bias")
    parts = ((scale, "weight"), (shift, "bias"), (mean, "running_mean"), (var, "running_var"))
    names = [builder.add_constant(array, builder.hint(call[part]) if call[part] is not None else f"{call.node.name}.{part}")
             for array, part in parts]
    y = builder.emit1("batch_norm", [builder.tensor(call["input"]), *names], {"epsilon": float(call["eps"])})
    return y if call.name == "batch_norm" else [y, None, None]  # the others also return batch statistics


# ---------------------------------------------------------------- pooling


def _pool_geometry(call: Call, spatial: int) -> dict[str, Any]:
    kernel = expand(call["kernel_size"], spatial)
    padding = expand(call["padding"], spatial)
    return {
        "kernel": kernel,
        "strides": expand(call["stride"], spatial) if call["stride"] else kernel,
        "pads": padding + padding,
        "ceil_mode": bool(call["ceil_mode"]),
    }


@aten("max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices", "max_pool3d_with_indices", emits=("max_pool",))
def max_pool(builder: Builder, call: Call) -> Any:
    x = builder.tensor(call["self"])
    spatial = len(builder.shape(x)) - 2
    attrs = {**_pool_geometry(call, spatial), "dilations": expand(call["dilation"], spatial)}
    y = builder.emit1("max_pool", [x], attrs)
    return [y, None] if call.name.endswith("_with_indices") else y


@aten("avg_pool1d", "avg_pool2d", "avg_pool3d", emits=("avg_pool",))
def avg_pool(builder: Builder, call: Call) -> str:
    if call.args.get("divisor_override") is not None:
        raise Unsupported("average pooling with divisor_override")
    x = builder.tensor(call["self"])
    attrs = {**_pool_geometry(call, len(builder.shape(x)) - 2), "count_include_pad": bool(call["count_include_pad"])}
    return builder.emit1("avg_pool", [x], attrs)


@aten("adaptive_avg_pool1d", "adaptive_avg_pool2d", "_adaptive_avg_pool2d", emits=("global_avg_pool", "avg_pool"))
def adaptive_avg_pool(builder: Builder, call: Call) -> str:
    """Output size 1 is a global average; other sizes that divide the input are a plain average pool."""
    x = builder.tensor(call["self"])
    sizes = builder.shape(x)[2:]
    wanted = [size if out is None else int(out) for out, size in zip(expand(call["output_size"], len(sizes)), sizes)]
    if all(out == 1 for out in wanted):
        return builder.emit1("global_avg_pool", [x])
    if any(size is None or out is None or size % out for size, out in zip(sizes, wanted)):
        raise Unsupported(f"adaptive average pooling from {list(sizes)} to {wanted} (sizes must divide evenly)")
    kernel = [size // out for size, out in zip(sizes, wanted)]  # type: ignore[operator]
    return builder.emit1("avg_pool", [x], {"kernel": kernel, "strides": kernel})


# ---------------------------------------------------------------- resizing


_INTERPOLATIONS = {  # ATen op -> (mode, coordinate transformation, nearest rounding) as torch computes it
    "upsample_nearest1d": ("nearest", "asymmetric", "floor"),
    "upsample_nearest2d": ("nearest", "asymmetric", "floor"),
    "upsample_nearest3d": ("nearest", "asymmetric", "floor"),
    "_upsample_nearest_exact1d": ("nearest", "half_pixel", "round_prefer_ceil"),
    "_upsample_nearest_exact2d": ("nearest", "half_pixel", "round_prefer_ceil"),
    "_upsample_nearest_exact3d": ("nearest", "half_pixel", "round_prefer_ceil"),
    "upsample_linear1d": ("linear", "pytorch_half_pixel", "floor"),
    "upsample_bilinear2d": ("linear", "pytorch_half_pixel", "floor"),
    "upsample_trilinear3d": ("linear", "pytorch_half_pixel", "floor"),
}


@aten(*_INTERPOLATIONS, emits=("resize",))
def interpolate(builder: Builder, call: Call) -> str:
    """F.interpolate: the output sizes torch recorded; the scale factors, when given, drive the coordinates
    (torch uses 1/scale_factor, not in/out, unless recompute_scale_factor)."""
    x = builder.tensor(call["input"])
    shape = builder.shape(x)
    if None in shape[1:]:
        raise Unsupported("resizing with dynamic sizes besides the batch")
    mode, transform, nearest = _INTERPOLATIONS[call.name]
    if call.args.get("align_corners"):
        transform = "align_corners"
    out = builder.dims(call.node.meta["val"])
    spatial = len(shape) - 2
    given = call.args.get("scale_factors") or [call.args.get(f"scales_{axis}") for axis in ("d", "h", "w")[-spatial:]]
    scales = [1.0, 1.0]
    for axis in range(spatial):
        factor = given[axis] if axis < len(given) else None
        scales.append(float(factor) if factor else out[2 + axis] / shape[2 + axis])  # type: ignore[operator]
    sizes = [0, int(shape[1]), *[int(size) for size in out[2:]]]  # type: ignore[arg-type]
    return builder.emit1("resize", [x], {"sizes": sizes, "scales": scales, "mode": mode,
                                         "coordinate_transformation_mode": transform, "nearest_mode": nearest})


# ---------------------------------------------------------------- shape ops


@aten("expand", emits=("expand",))
def expand_(builder: Builder, call: Call) -> str:
    """To the shape torch recorded (the batch axis stays dynamic)."""
    x = builder.tensor(call["self"])
    shape = [1 if size is None else int(size) for size in builder.dims(call.node.meta["val"])]
    return builder.emit1("expand", [x], {"shape": shape})


@aten("repeat", emits=("unsqueeze", "tile"))
def repeat(builder: Builder, call: Call) -> str:
    """Tile; more repeats than axes first add leading axes of size 1."""
    x = builder.tensor(call["self"])
    repeats = [int(r) for r in call["repeats"]]
    extra = len(repeats) - len(builder.shape(x))
    if extra > 0:
        x = builder.emit1("unsqueeze", [x], {"axes": list(range(extra))})
    return builder.emit1("tile", [x], {"repeats": repeats})


@aten("embedding", emits=("embedding",))
def embedding(builder: Builder, call: Call) -> str:
    """nn.Embedding / F.embedding: rows of the (constant) weight at run-time integer indices. padding_idx only
    shapes the gradient, max_norm is applied when the module is built (torch.export records no renorm here)."""
    if not builder.is_tensor(call["indices"]) or builder.is_tensor(call["weight"]):
        raise Unsupported("an embedding needs a constant table and indices that arrive at run time")
    return builder.emit1("embedding", [builder.tensor(call["indices"]), builder.tensor(call["weight"])])


@aten("index_select", emits=("gather",))
def index_select(builder: Builder, call: Call) -> str:
    x = builder.tensor(call["self"])
    indices = builder.value(call["index"])
    if not isinstance(indices, torch.Tensor):
        raise Unsupported("indices computed from the inputs")
    return builder.emit1("gather", [x], {"axis": normalize(call["dim"], len(builder.shape(x))),
                                         "indices": indices.tolist()})


@aten("index", emits=("gather",))
def index(builder: Builder, call: Call) -> str:
    """x[..., idx] with one known index tensor (the other axes taken whole)."""
    x = builder.tensor(call["self"])
    picks = [(axis, item) for axis, item in enumerate(call["indices"]) if item is not None]
    if len(picks) != 1:
        raise Unsupported("indexing with several index tensors")
    axis, item = picks[0]
    indices = builder.value(item)
    if not isinstance(indices, torch.Tensor) or indices.dtype in (torch.bool, torch.uint8) \
            or indices.dtype.is_floating_point:
        raise Unsupported("indices computed from the inputs, or a boolean mask")
    return builder.emit1("gather", [x], {"axis": axis, "indices": indices.tolist()})


@aten("view", "reshape", "_unsafe_view", "view_copy", "unflatten", emits=("reshape",))
def reshape(builder: Builder, call: Call) -> str:
    """A reshape to the shape torch recorded: sizes that follow the batch become 0 (copy) or -1 (infer)."""
    x = builder.tensor(call["self"])
    source = call.node.all_input_nodes[0].meta["val"].shape
    target: list[int] = []
    for axis, size in enumerate(call.node.meta["val"].shape):
        if builder.dim(size) is not None:
            target.append(int(builder.dim(size)))  # type: ignore[arg-type]
        elif axis < len(source) and str(source[axis]) == str(size):
            target.append(0)
        else:
            target.append(-1)
    if target.count(-1) > 1:
        raise Unsupported(f"reshape to {list(call.node.meta['val'].shape)} has several batch-dependent sizes")
    return builder.emit1("reshape", [x], {"shape": target})


@aten("flatten", emits=("flatten", "reshape"))
def flatten(builder: Builder, call: Call) -> str:
    x = builder.tensor(call["self"])
    rank = len(builder.shape(x))
    if rank >= 2 and normalize(call["start_dim"], rank) == 1 and normalize(call["end_dim"], rank) == rank - 1:
        return builder.emit1("flatten", [x], {"axis": 1})
    return reshape(builder, call)


@aten("permute", emits=("transpose",))
def permute(builder: Builder, call: Call) -> str:
    x = builder.tensor(call["self"])
    rank = len(builder.shape(x))
    return builder.emit1("transpose", [x], {"perm": [normalize(d, rank) for d in call["dims"]]})


@aten("transpose", "t", emits=("transpose",))
def transpose(builder: Builder, call: Call) -> str:
    x = builder.tensor(call["self"])
    rank = len(builder.shape(x))
    if rank < 2:
        return x
    first, second = (0, 1) if call.name == "t" else (normalize(call["dim0"], rank), normalize(call["dim1"], rank))
    perm = list(range(rank))
    perm[first], perm[second] = perm[second], perm[first]
    return builder.emit1("transpose", [x], {"perm": perm})


@aten("cat", "concat", emits=("concat",))
def cat(builder: Builder, call: Call) -> str:
    inputs = [builder.tensor(t) for t in call["tensors"]]
    rank = len(builder.shape(inputs[0]))
    return builder.emit1("concat", inputs, {"axis": normalize(call["dim"], rank)})


@aten("split", "split_with_sizes", "chunk", "tensor_split", emits=("split",))
def split(builder: Builder, call: Call) -> list[str | None]:
    """Every flavour of split, by the piece sizes torch recorded."""
    x = builder.tensor(call["self"])
    axis = normalize(call["dim"], len(builder.shape(x)))
    if builder.shape(x)[axis] is None:
        raise Unsupported("splitting the batch axis")
    sizes = [int(piece.shape[axis]) for piece in call.node.meta["val"]]
    return list(builder.emit("split", [x], {"axis": axis, "sizes": sizes}, outputs=len(sizes)))


def _bound(value: Any, axis_size: Any) -> int:
    """A slice bound as an int; a symbolic bound equal to the axis size means 'to the end'."""
    if value is None:
        return INT64_MAX
    if hasattr(value, "meta"):  # an fx node holding a SymInt
        if str(value.meta["val"]) == str(axis_size):
            return INT64_MAX
        raise Unsupported(f"slice bound {value.meta['val']} depends on the batch size")
    return int(value)


@aten("slice", emits=("slice",))
def slice_(builder: Builder, call: Call) -> str:
    x = builder.tensor(call["self"])
    shape = builder.shape(x)
    axis = normalize(call["dim"], len(shape))
    axis_size = call.node.all_input_nodes[0].meta["val"].shape[axis]
    start = 0 if call["start"] is None else _bound(call["start"], axis_size)
    end, step = _bound(call["end"], axis_size), int(call["step"])
    size = shape[axis]
    if size is not None:
        end = min(end, size)
    if start == 0 and step == 1 and (end == INT64_MAX or end == shape[axis]):
        return x
    return builder.emit1("slice", [x], {"starts": [start], "ends": [end], "axes": [axis], "steps": [step]})


@aten("flip", emits=("slice",))
def flip(builder: Builder, call: Call) -> str:
    """A slice with step -1 along each listed axis."""
    x = builder.tensor(call["self"])
    axes = [normalize(d, len(builder.shape(x))) for d in call["dims"]]
    if any(builder.shape(x)[axis] is None for axis in axes):
        raise Unsupported("flipping the batch axis")
    return builder.emit1("slice", [x], {"starts": [-1] * len(axes), "ends": [-INT64_MAX] * len(axes), "axes": axes,
                                        "steps": [-1] * len(axes)})


@aten("select", emits=("slice", "squeeze"))
def select(builder: Builder, call: Call) -> str:
    x = builder.tensor(call["self"])
    shape = builder.shape(x)
    axis, index = normalize(call["dim"], len(shape)), int(call["index"])
    if index < 0:
        if shape[axis] is None:
            raise Unsupported("selecting from the end of the batch axis")
        index += shape[axis]  # type: ignore[operator]
    piece = builder.emit1("slice", [x], {"starts": [index], "ends": [index + 1], "axes": [axis], "steps": [1]})
    return builder.emit1("squeeze", [piece], {"axes": [axis]})


@aten("squeeze", emits=("squeeze",))
def squeeze(builder: Builder, call: Call) -> str:
    """torch ignores axes whose size is not 1; so do we."""
    x = builder.tensor(call["self"])
    shape = builder.shape(x)
    dims = call.args.get("dim")
    listed = range(len(shape)) if dims is None else [dims] if isinstance(dims, int) else dims
    axes = sorted({normalize(axis, len(shape)) for axis in listed if shape[normalize(axis, len(shape))] == 1})
    return builder.emit1("squeeze", [x], {"axes": axes}) if axes else x


@aten("unsqueeze", emits=("unsqueeze",))
def unsqueeze(builder: Builder, call: Call) -> str:
    x = builder.tensor(call["self"])
    return builder.emit1("unsqueeze", [x], {"axes": [normalize(call["dim"], len(builder.shape(x)) + 1)]})


@aten("constant_pad_nd", emits=("pad",))
def constant_pad(builder: Builder, call: Call) -> str:
    return _pad(builder, builder.tensor(call["self"]), call["pad"], "constant", float(call["value"]))


@aten("reflection_pad1d", "reflection_pad2d", "replication_pad1d", "replication_pad2d", emits=("pad",))
def mode_pad(builder: Builder, call: Call) -> str:
    mode = "reflect" if call.name.startswith("reflection") else "edge"
    return _pad(builder, builder.tensor(call["self"]), call["padding"], mode, 0.0)


def _pad(builder: Builder, x: str, pad: list[int], mode: str, value: float) -> str:
    """torch's pad list (last axis first, begin/end pairs) as ONNX pads [begin..., end...]."""
    rank = len(builder.shape(x))
    begins, ends = [0] * rank, [0] * rank
    for pair in range(len(pad) // 2):
        axis = rank - 1 - pair
        begins[axis], ends[axis] = int(pad[2 * pair]), int(pad[2 * pair + 1])
    if min(begins + ends) < 0:
        raise Unsupported("negative padding (cropping)")
    return builder.emit1("pad", [x], {"pads": begins + ends, "mode": mode, "value": value})


# ---------------------------------------------------------------- reductions


def _reduce(op: str) -> Any:
    def converter(builder: Builder, call: Call) -> str:
        x = builder.tensor(call["self"])
        rank = len(builder.shape(x))
        dims = call.args.get("dim")
        if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
            axes = None
        else:
            axes = sorted(normalize(d, rank) for d in ([dims] if isinstance(dims, int) else dims))
        return builder.emit1(op, [x], {"axes": axes, "keepdims": bool(call.args.get("keepdim", False))})

    return converter


aten("mean", emits=("reduce_mean",))(_reduce("reduce_mean"))
aten("sum", emits=("reduce_sum",))(_reduce("reduce_sum"))
aten("amax", emits=("reduce_max",))(_reduce("reduce_max"))
