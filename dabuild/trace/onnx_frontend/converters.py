"""One converter per ONNX op type: ONNX node -> IR nodes (see docs of the IR op set).

A converter reads the node's attributes and load-time inputs from the
`Conversion` and emits IR nodes whose outputs carry the ONNX output names.
Supporting another op means adding one decorated function here. `static` lists
the input positions a converter needs known at load time (shapes, axes, pads):
the conformance tests turn such graph inputs into initializers.

Opset differences are handled where they occur: an attribute that became an
input (Squeeze axes in 13, Slice starts in 10, Clip bounds in 11, ...) is read
from whichever the model's opset uses.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dabuild.ir.ops.resize import COORDINATE_MODES, NEAREST_MODES, resize_scales, sizes_from_scales
from dabuild.registry import Registry
from dabuild.trace.onnx_frontend.conversion import Conversion, Shape, Unsupported

if TYPE_CHECKING:
    from dabuild.trace.onnx_frontend.model_file import OnnxNode


@dataclass(frozen=True)
class Converter:
    convert: Callable[[Conversion, OnnxNode], None]
    static: tuple[int, ...] = ()  # input positions that must be known when loading
    emits: tuple[str, ...] | None = None  # the IR ops it may emit (docs/ops.md's coverage); None = undeclared


# This module's converters register as it is imported; those of quantized ops, on the first lookup.
CONVERTERS: Registry[Converter] = Registry("converter", "the onnx frontend", (
    "dabuild.trace.onnx_frontend.qonnx", "dabuild.trace.onnx_frontend.quantized"))

Emits = tuple[str, ...] | Mapping[str, tuple[str, ...]]


def converts(*op_types: str, static: tuple[int, ...] = (), emits: Emits | None = None) -> Callable:
    """Register a converter for `op_types`; `emits` names the IR ops it may emit, for all of them or per op type.

    The declaration feeds the coverage table and is held to: `Conversion.emit` refuses an op it does not list.
    """
    def register(function: Callable[[Conversion, OnnxNode], None]) -> Callable[[Conversion, OnnxNode], None]:
        for op_type in op_types:
            declared = emits.get(op_type, ()) if isinstance(emits, Mapping) else emits
            CONVERTERS.add(op_type, Converter(function, static, None if declared is None else tuple(declared)))
        return function

    return register


def _known(dims: Sequence[int | None]) -> tuple[int, ...] | None:
    """The sizes, when every one is known."""
    known = tuple(d for d in dims if d is not None)
    return known if len(known) == len(dims) else None


def _axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise Unsupported(f"axis {axis} is out of range for rank {rank}")
    return axis % rank


def _present(node: OnnxNode) -> list[str]:
    return [name for name in node.inputs if name]


# ---------------------------------------------------------------- elementwise


_UNARY: dict[str, tuple[str, dict[str, Any]]] = {
    "Relu": ("relu", {}),
    "Sigmoid": ("sigmoid", {}),
    "Tanh": ("tanh", {}),
    "HardSwish": ("hard_swish", {}),
    "LeakyRelu": ("leaky_relu", {"alpha": 0.01}),
    "HardSigmoid": ("hard_sigmoid", {"alpha": 0.2, "beta": 0.5}),
    "Gelu": ("gelu", {"approximate": "none"}),
    "Elu": ("elu", {"alpha": 1.0}),
    "Selu": ("selu", {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875}),
    "Softplus": ("softplus", {}),
    "Softsign": ("softsign", {}),
    "Abs": ("abs", {}),
    "Neg": ("neg", {}),
    "Exp": ("exp", {}),
    "Log": ("log", {}),
    "Sqrt": ("sqrt", {}),
    "Reciprocal": ("reciprocal", {}),
    "Erf": ("erf", {}),
}
_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div"}


@converts(*_UNARY, emits={op_type: (op,) for op_type, (op, _) in _UNARY.items()})
def unary(ctx: Conversion, node: OnnxNode) -> None:
    op, defaults = _UNARY[node.op_type]
    attrs = {name: node.attrs.get(name, default) for name, default in defaults.items()}
    ctx.emit(node, op, node.inputs[:1], attrs, node.outputs)


@converts(*_BINARY, emits={op_type: (op,) for op_type, op in _BINARY.items()})
def binary(ctx: Conversion, node: OnnxNode) -> None:
    ctx.emit(node, _BINARY[node.op_type], node.inputs, outputs=node.outputs)


_VARIADIC = {"Sum": "add", "Mean": "add", "Max": "max", "Min": "min"}


@converts(*_VARIADIC, emits={"Sum": ("identity", "add"), "Mean": ("identity", "add", "mul"),
                            "Max": ("identity", "max"), "Min": ("identity", "min")})
def variadic(ctx: Conversion, node: OnnxNode) -> None:
    """Sum/Mean/Max/Min of any number of broadcasting inputs: a chain of binary nodes (Mean: then / count)."""
    inputs = _present(node)
    mean = node.op_type == "Mean" and len(inputs) > 1
    if len(inputs) == 1:
        ctx.emit(node, "identity", inputs, outputs=node.outputs)
        return
    total = inputs[0]
    for position, name in enumerate(inputs[1:], start=2):
        last = position == len(inputs) and not mean
        (total,) = ctx.emit(node, _VARIADIC[node.op_type], [total, name], outputs=node.outputs if last else None)
    if mean:
        ctx.emit(node, "mul", [total, _scalar(ctx, node, 1 / len(inputs))], outputs=node.outputs)


@converts("Pow", static=(1,), emits=("pow",))
def power(ctx: Conversion, node: OnnxNode) -> None:
    """x ** y with y a known scalar (the form normalisations and activations use)."""
    exponent = ctx.static(node, 1, "exponent")
    if exponent is None or exponent.size != 1:
        raise Unsupported("an exponent that is not one known number")
    ctx.emit(node, "pow", node.inputs[:1], {"exponent": float(np.ravel(exponent)[0])}, node.outputs)


@converts("PRelu", emits=("prelu",))
def prelu(ctx: Conversion, node: OnnxNode) -> None:
    ctx.emit(node, "prelu", node.inputs, outputs=node.outputs)


@converts("Where", static=(0,), emits=("where",))
def where(ctx: Conversion, node: OnnxNode) -> None:
    """A select by a condition known when loading (masks of attention, padding)."""
    ctx.static(node, 0, "condition")
    ctx.emit(node, "where", node.inputs, outputs=node.outputs)


@converts("Identity", emits=("identity",))
def identity(ctx: Conversion, node: OnnxNode) -> None:
    ctx.emit(node, "identity", node.inputs, outputs=node.outputs)


@converts("Dropout", static=(1, 2), emits=("identity",))
def dropout(ctx: Conversion, node: OnnxNode) -> None:
    """Inference-mode dropout is the identity; its mask, if something reads it, is all true."""
    training = ctx.static(node, 2, "training_mode") if ctx.opset >= 12 else None
    if training is not None and bool(training):
        raise Unsupported("training mode")
    ctx.emit(node, "identity", node.inputs[:1], outputs=node.outputs[:1])
    if len(node.outputs) > 1 and node.outputs[1] in ctx.read:
        shape = _known(ctx.shape(node.inputs[0]))
        if shape is None:
            raise Unsupported("a mask output over a dynamic shape")
        ctx.bind(node.outputs[1], np.ones(shape, dtype=bool))


@converts("Clip", static=(1, 2), emits=("clip",))
def clip(ctx: Conversion, node: OnnxNode) -> None:
    if ctx.opset >= 11:
        bounds = {"min": ctx.static(node, 1, "min"), "max": ctx.static(node, 2, "max")}
    else:
        bounds = {"min": node.attrs.get("min"), "max": node.attrs.get("max")}
    attrs = {name: float(value) for name, value in bounds.items() if value is not None}
    ctx.emit(node, "clip", node.inputs[:1], attrs, node.outputs)


_SOFTMAXES = {"Softmax": "softmax", "LogSoftmax": "log_softmax"}


@converts(*_SOFTMAXES, emits={op_type: (op, "flatten", "reshape") for op_type, op in _SOFTMAXES.items()})
def softmax(ctx: Conversion, node: OnnxNode) -> None:
    """Before opset 13, (Log)Softmax flattens to 2-D around `axis` (default 1) and normalises each row."""
    op, x = _SOFTMAXES[node.op_type], node.inputs[0]
    shape = ctx.shape(x)
    if ctx.opset >= 13:
        ctx.emit(node, op, [x], {"axis": _axis(node.attrs.get("axis", -1), len(shape))}, node.outputs)
        return
    axis = _axis(node.attrs.get("axis", 1), len(shape))
    if axis == len(shape) - 1:
        ctx.emit(node, op, [x], {"axis": axis}, node.outputs)
        return
    if shape.count(None) > 1:
        raise Unsupported(f"opset {ctx.opset} {node.op_type} over {shape}: more than one dynamic axis")
    (rows,) = ctx.emit(node, "flatten", [x], {"axis": axis})
    (normalised,) = ctx.emit(node, op, [rows], {"axis": 1})
    back = [-1 if size is None else size for size in shape]
    ctx.emit(node, "reshape", [normalised], {"shape": back}, node.outputs)


# ---------------------------------------------------------------- normalisation


@converts("LRN", emits=("lrn",))
def lrn(ctx: Conversion, node: OnnxNode) -> None:
    attrs = {"size": int(node.attrs["size"]), "alpha": float(node.attrs.get("alpha", 1e-4)),
             "beta": float(node.attrs.get("beta", 0.75)), "bias": float(node.attrs.get("bias", 1.0))}
    ctx.emit(node, "lrn", node.inputs[:1], attrs, node.outputs)


@converts("InstanceNormalization", emits=("instance_norm",))
def instance_norm(ctx: Conversion, node: OnnxNode) -> None:
    ctx.emit(node, "instance_norm", node.inputs, {"epsilon": float(node.attrs.get("epsilon", 1e-5))}, node.outputs)


@converts("LayerNormalization", emits=("layer_norm", "reduce_mean", "sub", "mul", "add", "sqrt", "reciprocal"))
def layer_norm(ctx: Conversion, node: OnnxNode) -> None:
    """The optional Mean and InvStdDev outputs are computed beside it with reductions, when a model reads them."""
    if node.attrs.get("stash_type", 1) != 1:
        raise Unsupported("stash_type other than float")
    rank = ctx.rank(node.inputs[0])
    axis, epsilon = _axis(node.attrs.get("axis", -1), rank), float(node.attrs.get("epsilon", 1e-5))
    ctx.emit(node, "layer_norm", _present(node), {"axis": axis, "epsilon": epsilon}, node.outputs[:1])
    wanted = node.outputs[1:3]
    if not any(wanted):
        return
    axes = {"axes": list(range(axis, rank)), "keepdims": True}
    mean_output = wanted[0] or None
    (mean,) = ctx.emit(node, "reduce_mean", node.inputs[:1], axes, [mean_output] if mean_output else None)
    if len(wanted) < 2 or not wanted[1]:
        return
    (centred,) = ctx.emit(node, "sub", [node.inputs[0], mean])
    (square,) = ctx.emit(node, "mul", [centred, centred])
    (variance,) = ctx.emit(node, "reduce_mean", [square], axes)
    (shifted,) = ctx.emit(node, "add", [variance, _scalar(ctx, node, epsilon)])
    (deviation,) = ctx.emit(node, "sqrt", [shifted])
    ctx.emit(node, "reciprocal", [deviation], outputs=[wanted[1]])


@converts("GroupNormalization", static=(1, 2), emits=("group_norm",))
def group_norm(ctx: Conversion, node: OnnxNode) -> None:
    """Opset 18 gives scale and bias per group, opset 21 per channel; dabuild's group_norm takes them per channel."""
    groups = int(node.attrs["num_groups"])
    channels = ctx.shape(node.inputs[0])[1]
    if channels is None:
        raise Unsupported("a dynamic channel count")
    names = []
    for index, what in ((1, "scale"), (2, "bias")):
        value = ctx.static(node, index, what)
        assert value is not None  # required inputs
        if value.size == groups and groups != channels:
            value = np.repeat(value, channels // groups)
        names.append(ctx.fresh(f"{node.label}/{what}"))
        ctx.bind(names[-1], np.asarray(value, np.float32).reshape(-1))
    attrs = {"groups": groups, "epsilon": float(node.attrs.get("epsilon", 1e-5))}
    ctx.emit(node, "group_norm", [node.inputs[0], *names], attrs, node.outputs)


# ---------------------------------------------------------------- linear algebra


@converts("MatMul", emits=("matmul",))
def matmul(ctx: Conversion, node: OnnxNode) -> None:
    ctx.emit(node, "matmul", node.inputs, outputs=node.outputs)


@converts("Gemm", emits=("dense", "transpose", "matmul", "mul", "add", "identity"))
def gemm(ctx: Conversion, node: OnnxNode) -> None:
    """alpha * A' @ B' + beta * C: one `dense` when B and C are known parameters, else matmul/mul/add."""
    alpha, beta = float(node.attrs.get("alpha", 1.0)), float(node.attrs.get("beta", 1.0))
    a = node.inputs[0]
    if node.attrs.get("transA", 0):
        (a,) = ctx.emit(node, "transpose", [a], {"perm": [1, 0]})
    parameters = _dense_parameters(ctx, node, alpha, beta)
    if parameters is not None:
        ctx.emit(node, "dense", [a, *parameters], {"activation": "none"}, node.outputs)
        return
    b = node.inputs[1]
    if node.attrs.get("transB", 0):
        (b,) = ctx.emit(node, "transpose", [b], {"perm": [1, 0]})
    terms = [(ctx.emit(node, "matmul", [a, b])[0], alpha)]
    if ctx.has(node, 2):
        terms.append((node.inputs[2], beta))
    scaled = [name if scale == 1.0 else ctx.emit(node, "mul", [name, _scalar(ctx, node, scale)])[0] for name, scale in terms]
    ctx.emit(node, "add" if len(scaled) == 2 else "identity", scaled, outputs=node.outputs)


def _dense_parameters(ctx: Conversion, node: OnnxNode, alpha: float, beta: float) -> list[str] | None:
    """Names of dense's (in, out) weight and (out,) bias with alpha and beta folded in, if B and C allow it."""
    weight = ctx.known.get(node.inputs[1])
    bias = ctx.known.get(node.inputs[2]) if ctx.has(node, 2) else None
    if weight is None or weight.dtype.kind != "f" or (ctx.has(node, 2) and bias is None):
        return None
    weight = weight.T if node.attrs.get("transB", 0) else weight
    out_features = weight.shape[1]
    if bias is not None and (bias.size not in (1, out_features) or any(d != 1 for d in bias.shape[:-1])):
        return None  # a C that varies along the rows is no bias
    names = [ctx.fresh(f"{node.label}/weight")]
    ctx.bind(names[0], np.ascontiguousarray(weight * np.float32(alpha), dtype=np.float32))
    if bias is not None:
        names.append(ctx.fresh(f"{node.label}/bias"))
        vector = np.broadcast_to(bias.reshape(-1) * np.float32(beta), (out_features,))
        ctx.bind(names[1], np.ascontiguousarray(vector, dtype=np.float32))
    return names


def _scalar(ctx: Conversion, node: OnnxNode, value: float) -> str:
    name = ctx.fresh(f"{node.label}/scale")
    ctx.bind(name, np.array(value, dtype=np.float32))
    return name


# ---------------------------------------------------------------- convolution and pooling


def _explicit_pads(ctx: Conversion, node: OnnxNode, kernel: list[int], strides: list[int], dilations: list[int]) -> list[int]:
    """ONNX `pads` [begins..., ends...], computing SAME_UPPER / SAME_LOWER from the static input size."""
    spatial = len(kernel)
    auto_pad = node.attrs.get("auto_pad", "NOTSET")
    if auto_pad in ("NOTSET", ""):
        return [int(p) for p in node.attrs.get("pads", [0] * 2 * spatial)]
    if auto_pad == "VALID":
        return [0] * 2 * spatial
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise Unsupported(f"auto_pad {auto_pad!r}")
    sizes = _known(ctx.shape(node.inputs[0])[2:])
    if sizes is None:
        raise Unsupported(f"auto_pad {auto_pad} over dynamic spatial sizes {ctx.shape(node.inputs[0])[2:]}")
    begins, ends = [], []
    for size, k, stride, dilation in zip(sizes, kernel, strides, dilations):
        out = -(-size // stride)
        total = max(0, (out - 1) * stride + (k - 1) * dilation + 1 - size)
        small, large = total // 2, total - total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else large)
        ends.append(large if auto_pad == "SAME_UPPER" else small)
    return begins + ends


def _window(ctx: Conversion, node: OnnxNode, kernel: list[int]) -> dict[str, list[int]]:
    spatial = len(kernel)
    if spatial < 1:
        raise Unsupported("a window without spatial axes")
    strides = [int(s) for s in node.attrs.get("strides", [1] * spatial)]
    dilations = [int(d) for d in node.attrs.get("dilations", [1] * spatial)]
    return {"strides": strides, "pads": _explicit_pads(ctx, node, kernel, strides, dilations), "dilations": dilations}


@converts("Conv", emits=("conv",))
def conv(ctx: Conversion, node: OnnxNode) -> None:
    kernel = [int(k) for k in node.attrs.get("kernel_shape", ctx.shape(node.inputs[1])[2:])]
    attrs = {**_window(ctx, node, kernel), "groups": int(node.attrs.get("group", 1))}
    ctx.emit(node, "conv", _present(node), attrs, node.outputs)


@converts("ConvTranspose", emits=("conv_transpose",))
def conv_transpose(ctx: Conversion, node: OnnxNode) -> None:
    """pads come from `pads`, from auto_pad, or from `output_shape` (ONNX's rule: the total padding splits
    evenly, the odd unit at the end unless auto_pad is SAME_LOWER)."""
    weight_shape = ctx.shape(node.inputs[1])
    kernel = [int(k) for k in node.attrs.get("kernel_shape", weight_shape[2:])]
    spatial = len(kernel)
    strides = [int(v) for v in node.attrs.get("strides", [1] * spatial)]
    dilations = [int(v) for v in node.attrs.get("dilations", [1] * spatial)]
    output_padding = [int(v) for v in node.attrs.get("output_padding", [0] * spatial)]
    sizes = ctx.shape(node.inputs[0])[2:]
    auto_pad = node.attrs.get("auto_pad", "NOTSET")
    wanted = node.attrs.get("output_shape")
    if wanted is None and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        wanted = [None if size is None else size * stride for size, stride in zip(sizes, strides)]
    if wanted is not None:
        wanted = list(wanted)[-spatial:]
        known_sizes, known_wanted = _known(sizes), _known(wanted)
        if known_sizes is None or known_wanted is None:
            raise Unsupported("output_shape or auto_pad over dynamic spatial sizes")
        begins, ends = [], []
        for a in range(spatial):
            total = (strides[a] * (known_sizes[a] - 1) + output_padding[a] + (kernel[a] - 1) * dilations[a] + 1
                     - int(known_wanted[a]))
            if total < 0:  # a larger output than the kernel reaches: ONNX adds the difference as output padding
                output_padding[a] -= total
                total = 0
            small, large = total // 2, total - total // 2
            begins.append(large if auto_pad == "SAME_LOWER" else small)
            ends.append(small if auto_pad == "SAME_LOWER" else large)
        pads = begins + ends
    elif auto_pad in ("NOTSET", "", "VALID"):
        pads = [int(p) for p in node.attrs.get("pads", [0] * 2 * spatial)] if auto_pad != "VALID" else [0] * 2 * spatial
    else:
        raise Unsupported(f"auto_pad {auto_pad!r}")
    attrs = {"strides": strides, "pads": pads, "dilations": dilations, "groups": int(node.attrs.get("group", 1)),
             "output_padding": output_padding}
    ctx.emit(node, "conv_transpose", _present(node), attrs, node.outputs)


@converts("MaxPool", emits=("max_pool",))
def max_pool(ctx: Conversion, node: OnnxNode) -> None:
    if len(node.outputs) > 1 and node.outputs[1] in ctx.read:
        raise Unsupported("the Indices output")
    kernel = [int(k) for k in node.attrs["kernel_shape"]]
    attrs = {"kernel": kernel, **_window(ctx, node, kernel), "ceil_mode": bool(node.attrs.get("ceil_mode", 0))}
    ctx.emit(node, "max_pool", node.inputs[:1], attrs, node.outputs[:1])


@converts("AveragePool", emits=("avg_pool",))
def avg_pool(ctx: Conversion, node: OnnxNode) -> None:
    kernel = [int(k) for k in node.attrs["kernel_shape"]]
    window = _window(ctx, node, kernel)
    if any(d != 1 for d in window.pop("dilations")):
        raise Unsupported("dilated average pooling")
    attrs = {
        "kernel": kernel,
        **window,
        "ceil_mode": bool(node.attrs.get("ceil_mode", 0)),
        "count_include_pad": bool(node.attrs.get("count_include_pad", 0)),
    }
    ctx.emit(node, "avg_pool", node.inputs[:1], attrs, node.outputs)


@converts("GlobalAveragePool", emits=("global_avg_pool",))
def global_avg_pool(ctx: Conversion, node: OnnxNode) -> None:
    ctx.emit(node, "global_avg_pool", node.inputs, outputs=node.outputs)


@converts("GlobalMaxPool", emits=("reduce_max",))
def global_max_pool(ctx: Conversion, node: OnnxNode) -> None:
    axes = list(range(2, ctx.rank(node.inputs[0])))
    ctx.emit(node, "reduce_max", node.inputs, {"axes": axes, "keepdims": True}, node.outputs)


@converts("BatchNormalization", emits=("batch_norm",))
def batch_norm(ctx: Conversion, node: OnnxNode) -> None:
    if node.attrs.get("training_mode", 0) or any(node.outputs[1:]):
        raise Unsupported("training mode (running statistics outputs)")
    attrs = {"epsilon": float(node.attrs.get("epsilon", 1e-5))}
    ctx.emit(node, "batch_norm", node.inputs, attrs, node.outputs[:1])


# ---------------------------------------------------------------- shapes


@converts("Reshape", static=(1,), emits=("reshape",))
def reshape(ctx: Conversion, node: OnnxNode) -> None:
    """A batch size read from the input's own shape becomes 0 ("copy"), so the graph stays batch-agnostic."""
    x = node.inputs[0]
    if node.inputs[1] not in ctx.known:
        ctx.static(node, 1, "shape")  # raises: the shape is only known at run time
    target = list(np.ravel(ctx.known[node.inputs[1]]))
    source = ctx.shape(x)
    allowzero = node.attrs.get("allowzero", 0)
    shape: list[int] = []
    for axis, size in enumerate(target):
        if size is None:
            if axis < len(source) and source[axis] is None:
                shape.append(0)
            elif target.count(None) == 1 and -1 not in target:
                shape.append(-1)
            else:
                raise Unsupported(f"target shape {target} holds dynamic sizes it cannot place")
        elif int(size) == 0 and allowzero:
            raise Unsupported("allowzero with a zero-sized dimension")
        else:
            shape.append(int(size))
    if ctx.relaxed_batch and _keeps_fixed_batch(source, shape):
        shape[0] = 0  # the file's batch of 1, spelt as a constant: the batch axis passes through
    ctx.emit(node, "reshape", [x], {"shape": shape}, node.outputs)


def _keeps_fixed_batch(source: Shape, shape: list[int]) -> bool:
    """Whether a reshape of a batch-first tensor to a target starting with 1 reshapes each sample alone.

    With the batch fixed to 1, exporters fold `x.view(x.size(0), ...)` to a constant target (1, ...).
    When the rest of the target holds exactly the elements of one sample, the reshape never mixes
    samples, so reading that 1 as "the batch" is what the file computes, for any batch.
    """
    if not source or source[0] is not None or not shape or shape[0] != 1 or None in source[1:]:
        return False
    per_sample = math.prod(size for size in source[1:] if size is not None)  # each is known (checked above)
    rest = [source[axis] if size == 0 and axis < len(source) else size for axis, size in enumerate(shape)][1:]
    known = math.prod(size for size in rest if size != -1 and size is not None)
    return known == per_sample if -1 not in rest else known > 0 and per_sample % known == 0


@converts("Flatten", emits=("flatten",))
def flatten(ctx: Conversion, node: OnnxNode) -> None:
    rank = ctx.rank(node.inputs[0])
    axis = node.attrs.get("axis", 1)
    ctx.emit(node, "flatten", node.inputs, {"axis": axis + rank if axis < 0 else axis}, node.outputs)


@converts("Transpose", emits=("transpose",))
def transpose(ctx: Conversion, node: OnnxNode) -> None:
    rank = ctx.rank(node.inputs[0])
    perm = [int(p) for p in node.attrs.get("perm", range(rank - 1, -1, -1))]
    ctx.emit(node, "transpose", node.inputs, {"perm": perm}, node.outputs)


@converts("Concat", emits=("concat",))
def concat(ctx: Conversion, node: OnnxNode) -> None:
    axis = _axis(node.attrs["axis"], ctx.rank(node.inputs[0]))
    ctx.emit(node, "concat", _present(node), {"axis": axis}, node.outputs)


@converts("Split", static=(1,), emits=("split",))
def split(ctx: Conversion, node: OnnxNode) -> None:
    x = node.inputs[0]
    shape = ctx.shape(x)
    axis = _axis(node.attrs.get("axis", 0), len(shape))
    sizes = ctx.attr_or_input(node, "split", 1, since=13)
    if sizes is None:
        length, parts = shape[axis], int(node.attrs.get("num_outputs", len(node.outputs)))
        if length is None:
            raise Unsupported("splitting the dynamic axis")
        step = -(-length // parts)  # ONNX: equal parts, the last one smaller
        sizes = [min(step, length - i * step) for i in range(parts)]
    ctx.emit(node, "split", [x], {"axis": axis, "sizes": sizes}, node.outputs)


@converts("Slice", static=(1, 2, 3, 4), emits=("slice",))
def slice_(ctx: Conversion, node: OnnxNode) -> None:
    rank = ctx.rank(node.inputs[0])
    if ctx.opset >= 10:
        starts, ends = ctx.ints(node, 1, "starts"), ctx.ints(node, 2, "ends")
        axes, steps = ctx.ints(node, 3, "axes"), ctx.ints(node, 4, "steps")
    else:
        starts, ends = list(node.attrs["starts"]), list(node.attrs["ends"])
        axes, steps = node.attrs.get("axes"), None
    assert starts is not None and ends is not None  # required inputs, checked by onnx.checker
    axes = [_axis(a, rank) for a in (axes if axes is not None else range(len(starts)))]
    steps = steps if steps is not None else [1] * len(starts)
    attrs = {"starts": starts, "ends": ends, "axes": axes, "steps": steps}
    ctx.emit(node, "slice", node.inputs[:1], attrs, node.outputs)


@converts("Pad", static=(1, 2, 3), emits=("pad",))
def pad(ctx: Conversion, node: OnnxNode) -> None:
    mode = node.attrs.get("mode", "constant")
    if mode not in ("constant", "reflect", "edge"):
        raise Unsupported(f"pad mode {mode!r}")
    rank = ctx.rank(node.inputs[0])
    if ctx.opset >= 11:
        pads = ctx.ints(node, 1, "pads") or []
        value = ctx.static(node, 2, "constant_value")
        axes = ctx.ints(node, 3, "axes")
    else:
        pads, value, axes = [int(p) for p in node.attrs["pads"]], node.attrs.get("value", 0.0), None
    if axes is not None:  # opset 18: pads only for the listed axes
        full = [0] * 2 * rank
        for position, axis in enumerate(_axis(a, rank) for a in axes):
            full[axis], full[rank + axis] = pads[position], pads[len(axes) + position]
        pads = full
    attrs = {"pads": pads, "mode": mode, "value": 0.0 if value is None else float(np.ravel(value)[0])}
    ctx.emit(node, "pad", node.inputs[:1], attrs, node.outputs)


@converts("Squeeze", static=(1,), emits=("squeeze",))
def squeeze(ctx: Conversion, node: OnnxNode) -> None:
    shape = ctx.shape(node.inputs[0])
    axes = ctx.attr_or_input(node, "axes", 1, since=13)
    if axes is None:
        axes = [axis for axis, size in enumerate(shape) if size == 1]
    ctx.emit(node, "squeeze", node.inputs[:1], {"axes": sorted(_axis(a, len(shape)) for a in axes)}, node.outputs)


@converts("Unsqueeze", static=(1,), emits=("unsqueeze",))
def unsqueeze(ctx: Conversion, node: OnnxNode) -> None:
    axes = ctx.attr_or_input(node, "axes", 1, since=13) or []
    rank = ctx.rank(node.inputs[0]) + len(axes)
    ctx.emit(node, "unsqueeze", node.inputs[:1], {"axes": sorted(_axis(a, rank) for a in axes)}, node.outputs)


_REDUCE = {"ReduceMean": ("reduce_mean", 18), "ReduceSum": ("reduce_sum", 13), "ReduceMax": ("reduce_max", 18)}


@converts(*_REDUCE, static=(1,), emits={op_type: (op, "identity") for op_type, (op, _) in _REDUCE.items()})
def reduce(ctx: Conversion, node: OnnxNode) -> None:
    """Axes moved from attribute to input in opset 13 (ReduceSum) or 18 (the others)."""
    op, since = _REDUCE[node.op_type]
    rank = ctx.rank(node.inputs[0])
    axes = ctx.attr_or_input(node, "axes", 1, since=since)
    if not axes and node.attrs.get("noop_with_empty_axes", 0):
        ctx.emit(node, "identity", node.inputs[:1], outputs=node.outputs)
        return
    attrs = {
        "axes": sorted(_axis(a, rank) for a in axes) if axes else None,
        "keepdims": bool(node.attrs.get("keepdims", 1)),
    }
    ctx.emit(node, op, node.inputs[:1], attrs, node.outputs)


_RESIZE_MODES = {"nearest": "nearest", "linear": "linear", "bilinear": "linear"}


def _resize(ctx: Conversion, node: OnnxNode, scales: list[float] | None, sizes: list[int] | None,
            attrs: dict[str, str]) -> None:
    """One resize node from ONNX's scales or sizes over `axes` (sizes win: the output shape they give is exact)."""
    shape = ctx.shape(node.inputs[0])
    rank = len(shape)
    if None in shape[1:]:
        raise Unsupported(f"resizing {shape}: only the batch axis may be dynamic")
    known = [1 if size is None else int(size) for size in shape]
    axes = [_axis(a, rank) for a in node.attrs.get("axes", range(rank))]
    policy = node.attrs.get("keep_aspect_ratio_policy", "stretch")
    if sizes is not None:
        if len(sizes) != len(axes):
            raise Unsupported(f"sizes {sizes} for axes {axes}")
        if policy != "stretch":  # one scale for every listed axis, the output sizes rounded from it
            ratios = [size / known[axis] for size, axis in zip(sizes, axes)]
            common = min(ratios) if policy == "not_larger" else max(ratios)
            sizes = [math.floor(known[axis] * common + 0.5) for axis in axes]
        full = list(known)
        for axis, size in zip(axes, sizes):
            full[axis] = int(size)
        scales = resize_scales(known, full)
        scales[0], sizes = 1.0, full
    elif scales is not None:
        if len(scales) != len(axes):
            raise Unsupported(f"scales {scales} for axes {axes}")
        full_scales = [1.0] * rank
        for axis, scale in zip(axes, scales):
            full_scales[axis] = float(scale)
        scales, sizes = full_scales, sizes_from_scales(known, full_scales)
    else:
        raise Unsupported("neither scales nor sizes")
    if scales[0] != 1 or (shape[0] is not None and sizes[0] != shape[0]):
        raise Unsupported("resizing the batch axis")
    ctx.emit(node, "resize", node.inputs[:1], {"sizes": [int(s) for s in sizes], "scales": [float(s) for s in scales],
                                               **attrs}, node.outputs)


@converts("Resize", static=(1, 2, 3), emits=("resize",))
def resize(ctx: Conversion, node: OnnxNode) -> None:
    """Opset 10 reads scales from input 1; 11 on from inputs 2 (scales) and 3 (sizes)."""
    mode = node.attrs.get("mode", "nearest")
    if mode not in _RESIZE_MODES:
        raise Unsupported(f"mode {mode!r} (dabuild resizes nearest and linear)")
    if node.attrs.get("antialias", 0):
        raise Unsupported("antialias")
    transform = node.attrs.get("coordinate_transformation_mode", "half_pixel" if ctx.opset >= 11 else "asymmetric")
    if transform not in COORDINATE_MODES:
        raise Unsupported(f"coordinate_transformation_mode {transform!r}")
    nearest = node.attrs.get("nearest_mode", "round_prefer_floor")
    if nearest not in NEAREST_MODES:
        raise Unsupported(f"nearest_mode {nearest!r}")
    if ctx.opset < 11:
        scales, sizes = ctx.static(node, 1, "scales"), None
    else:
        scales, sizes = ctx.static(node, 2, "scales"), ctx.static(node, 3, "sizes")
    scale_list = None if scales is None or scales.size == 0 else [float(v) for v in np.ravel(scales)]
    size_list = None if sizes is None or sizes.size == 0 else [int(v) for v in np.ravel(sizes)]
    _resize(ctx, node, scale_list, size_list, {"mode": _RESIZE_MODES[mode],
                                               "coordinate_transformation_mode": transform, "nearest_mode": nearest})


@converts("Upsample", static=(1,), emits=("resize",))
def upsample(ctx: Conversion, node: OnnxNode) -> None:
    """Upsample (opsets 7-9): Resize with asymmetric coordinates and floor rounding."""
    mode = node.attrs.get("mode", "nearest")
    if mode not in _RESIZE_MODES:
        raise Unsupported(f"mode {mode!r}")
    scales = node.attrs.get("scales") if ctx.opset < 9 else ctx.static(node, 1, "scales")
    _resize(ctx, node, None if scales is None else [float(v) for v in np.ravel(scales)], None,
            {"mode": _RESIZE_MODES[mode], "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"})


@converts("Gather", static=(1,), emits=("gather", "embedding"))
def gather(ctx: Conversion, node: OnnxNode) -> None:
    """Gather from a run-time tensor at indices known when loading (a Gather of known values folds), or rows of a
    constant table at run-time integer indices (token ids): an embedding."""
    if node.inputs[1] in ctx.specs and node.inputs[0] in ctx.known:
        if _axis(node.attrs.get("axis", 0), ctx.rank(node.inputs[0])) != 0:
            raise Unsupported("it gathers a constant table at run-time indices along an axis other than 0")
        ctx.emit(node, "embedding", [node.inputs[1], node.inputs[0]], {}, node.outputs)
        return
    indices = ctx.static(node, 1, "indices")
    assert indices is not None  # a required input
    rank = ctx.rank(node.inputs[0])
    attrs = {"axis": _axis(node.attrs.get("axis", 0), rank), "indices": np.asarray(indices, np.int64).tolist()}
    ctx.emit(node, "gather", node.inputs[:1], attrs, node.outputs)


@converts("Tile", static=(1,), emits=("tile",))
def tile(ctx: Conversion, node: OnnxNode) -> None:
    ctx.emit(node, "tile", node.inputs[:1], {"repeats": ctx.ints(node, 1, "repeats")}, node.outputs)


@converts("Expand", static=(1,), emits=("expand",))
def expand(ctx: Conversion, node: OnnxNode) -> None:
    ctx.emit(node, "expand", node.inputs[:1], {"shape": ctx.ints(node, 1, "shape")}, node.outputs)


# ---------------------------------------------------------------- load-time only


@converts("Shape", emits=())
def shape_of(ctx: Conversion, node: OnnxNode) -> None:
    """The static shape of a run-time tensor; a dynamic size is None until a Reshape places it."""
    shape: Shape = ctx.shape(node.inputs[0])
    start, end = node.attrs.get("start", 0), node.attrs.get("end", len(shape))
    dims = list(shape[start:end])
    ctx.bind(node.outputs[0], np.array(dims, dtype=object if None in dims else np.int64))


@converts("Size", emits=())
def size_of(ctx: Conversion, node: OnnxNode) -> None:
    shape = _known(ctx.shape(node.inputs[0]))
    if shape is None:
        raise Unsupported("the element count of a tensor with a dynamic size")
    ctx.bind(node.outputs[0], np.array(math.prod(shape), dtype=np.int64))


_FLOAT_TYPES = {1: "float32", 10: "float16", 11: "float64"}  # TensorProto element types numpy holds


@converts("Cast", emits=("identity",))
def cast(ctx: Conversion, node: OnnxNode) -> None:
    """Exporters cast floats to float; any other cast only happens in load-time shape arithmetic."""
    to = node.attrs["to"]
    if to not in _FLOAT_TYPES or ctx.specs[node.inputs[0]].dtype != "float32":
        raise Unsupported(f"a cast of run-time tensors to element type {to}: dabuild graphs compute in float32")
    if _FLOAT_TYPES[to] == "float64":
        raise Unsupported("a cast of run-time tensors to float64: the model computes in float64 from here, "
                          "and dabuild's float32 would change its results")
    ctx.emit(node, "identity", node.inputs, outputs=node.outputs)


# Shape-arithmetic ops claimed as evaluated while loading (folding.py evaluates any op whose
# inputs are all known; these are the ones exporters emit for shapes and that are tested so).
LOAD_TIME_OPS = ("Constant", "ConstantOfShape")


@converts(*LOAD_TIME_OPS, static=(0, 1), emits=())
def load_time_only(ctx: Conversion, node: OnnxNode) -> None:
    raise Unsupported(
        f"{node.op_type} is folded while loading, but here it reads run-time tensors "
        f"{', '.join(repr(name) for name in _present(node) if name not in ctx.known)}"
    )


SUPPORTED_OPS: tuple[str, ...] = tuple(CONVERTERS.names())
