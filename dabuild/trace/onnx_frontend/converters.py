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

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dabuild.registry import Registry
from dabuild.trace.onnx_frontend.conversion import Conversion, Shape, Unsupported

if TYPE_CHECKING:
    from dabuild.trace.onnx_frontend.model_file import OnnxNode


@dataclass(frozen=True)
class Converter:
    convert: Callable[[Conversion, OnnxNode], None]
    static: tuple[int, ...] = ()  # input positions that must be known when loading


CONVERTERS: Registry[Converter] = Registry("converter", "the onnx frontend")


def converts(*op_types: str, static: tuple[int, ...] = ()) -> Callable:
    def register(function: Callable[[Conversion, OnnxNode], None]) -> Callable[[Conversion, OnnxNode], None]:
        for op_type in op_types:
            CONVERTERS.add(op_type, Converter(function, static))
        return function

    return register


def _axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise Unsupported(f"axis {axis} is out of range for rank {rank}")
    return axis % rank


def _present(node: OnnxNode) -> list[str]:
    return [name for name in node.inputs if name]


# ---------------------------------------------------------------- elementwise


_UNARY = {
    "Relu": ("relu", {}),
    "Sigmoid": ("sigmoid", {}),
    "Tanh": ("tanh", {}),
    "HardSwish": ("hard_swish", {}),
    "LeakyRelu": ("leaky_relu", {"alpha": 0.01}),
    "HardSigmoid": ("hard_sigmoid", {"alpha": 0.2, "beta": 0.5}),
    "Gelu": ("gelu", {"approximate": "none"}),
}
_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div"}


@converts(*_UNARY)
def unary(ctx: Conversion, node: OnnxNode) -> None:
    op, defaults = _UNARY[node.op_type]
    attrs = {name: node.attrs.get(name, default) for name, default in defaults.items()}
    ctx.emit(node, op, node.inputs[:1], attrs, node.outputs)


@converts(*_BINARY)
def binary(ctx: Conversion, node: OnnxNode) -> None:
    ctx.emit(node, _BINARY[node.op_type], node.inputs, outputs=node.outputs)


@converts("Identity")
def identity(ctx: Conversion, node: OnnxNode) -> None:
    ctx.emit(node, "identity", node.inputs, outputs=node.outputs)


@converts("Dropout", static=(1, 2))
def dropout(ctx: Conversion, node: OnnxNode) -> None:
    """Inference-mode dropout is the identity; its mask, if asked for, is all true."""
    training = ctx.static(node, 2, "training_mode") if ctx.opset >= 12 else None
    if training is not None and bool(training):
        raise Unsupported("training mode")
    ctx.emit(node, "identity", node.inputs[:1], outputs=node.outputs[:1])
    if len(node.outputs) > 1 and node.outputs[1]:
        shape = ctx.shape(node.inputs[0])
        if None in shape:
            raise Unsupported("a mask output over a dynamic shape")
        ctx.bind(node.outputs[1], np.ones(shape, dtype=bool))


@converts("Clip", static=(1, 2))
def clip(ctx: Conversion, node: OnnxNode) -> None:
    if ctx.opset >= 11:
        bounds = {"min": ctx.static(node, 1, "min"), "max": ctx.static(node, 2, "max")}
    else:
        bounds = {"min": node.attrs.get("min"), "max": node.attrs.get("max")}
    attrs = {name: float(value) for name, value in bounds.items() if value is not None}
    ctx.emit(node, "clip", node.inputs[:1], attrs, node.outputs)


@converts("Softmax")
def softmax(ctx: Conversion, node: OnnxNode) -> None:
    """Before opset 13, Softmax flattens to 2-D around `axis` (default 1) and normalises each row."""
    x = node.inputs[0]
    shape = ctx.shape(x)
    if ctx.opset >= 13:
        ctx.emit(node, "softmax", [x], {"axis": _axis(node.attrs.get("axis", -1), len(shape))}, node.outputs)
        return
    axis = _axis(node.attrs.get("axis", 1), len(shape))
    if axis == len(shape) - 1:
        ctx.emit(node, "softmax", [x], {"axis": axis}, node.outputs)
        return
    if shape.count(None) > 1:
        raise Unsupported(f"opset {ctx.opset} Softmax over {shape}: more than one dynamic axis")
    (rows,) = ctx.emit(node, "flatten", [x], {"axis": axis})
    (normalised,) = ctx.emit(node, "softmax", [rows], {"axis": 1})
    back = [-1 if size is None else size for size in shape]
    ctx.emit(node, "reshape", [normalised], {"shape": back}, node.outputs)


# ---------------------------------------------------------------- linear algebra


@converts("MatMul")
def matmul(ctx: Conversion, node: OnnxNode) -> None:
    ctx.emit(node, "matmul", node.inputs, outputs=node.outputs)


@converts("Gemm")
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
    sizes = ctx.shape(node.inputs[0])[2:]
    if None in sizes:
        raise Unsupported(f"auto_pad {auto_pad} over dynamic spatial sizes {sizes}")
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
    if spatial not in (1, 2):
        raise Unsupported(f"{spatial}-D windows (dabuild has 1-D and 2-D)")
    strides = [int(s) for s in node.attrs.get("strides", [1] * spatial)]
    dilations = [int(d) for d in node.attrs.get("dilations", [1] * spatial)]
    return {"strides": strides, "pads": _explicit_pads(ctx, node, kernel, strides, dilations), "dilations": dilations}


@converts("Conv")
def conv(ctx: Conversion, node: OnnxNode) -> None:
    kernel = [int(k) for k in node.attrs.get("kernel_shape", ctx.shape(node.inputs[1])[2:])]
    attrs = {**_window(ctx, node, kernel), "groups": int(node.attrs.get("group", 1))}
    ctx.emit(node, "conv", _present(node), attrs, node.outputs)


@converts("MaxPool")
def max_pool(ctx: Conversion, node: OnnxNode) -> None:
    if len(node.outputs) > 1 and node.outputs[1]:
        raise Unsupported("the Indices output")
    kernel = [int(k) for k in node.attrs["kernel_shape"]]
    attrs = {"kernel": kernel, **_window(ctx, node, kernel), "ceil_mode": bool(node.attrs.get("ceil_mode", 0))}
    ctx.emit(node, "max_pool", node.inputs[:1], attrs, node.outputs[:1])


@converts("AveragePool")
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


@converts("GlobalAveragePool")
def global_avg_pool(ctx: Conversion, node: OnnxNode) -> None:
    ctx.emit(node, "global_avg_pool", node.inputs, outputs=node.outputs)


@converts("GlobalMaxPool")
def global_max_pool(ctx: Conversion, node: OnnxNode) -> None:
    axes = list(range(2, ctx.rank(node.inputs[0])))
    ctx.emit(node, "reduce_max", node.inputs, {"axes": axes, "keepdims": True}, node.outputs)


@converts("BatchNormalization")
def batch_norm(ctx: Conversion, node: OnnxNode) -> None:
    if node.attrs.get("training_mode", 0) or any(node.outputs[1:]):
        raise Unsupported("training mode (running statistics outputs)")
    attrs = {"epsilon": float(node.attrs.get("epsilon", 1e-5))}
    ctx.emit(node, "batch_norm", node.inputs, attrs, node.outputs[:1])


# ---------------------------------------------------------------- shapes


@converts("Reshape", static=(1,))
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
    ctx.emit(node, "reshape", [x], {"shape": shape}, node.outputs)


@converts("Flatten")
def flatten(ctx: Conversion, node: OnnxNode) -> None:
    rank = ctx.rank(node.inputs[0])
    axis = node.attrs.get("axis", 1)
    ctx.emit(node, "flatten", node.inputs, {"axis": axis + rank if axis < 0 else axis}, node.outputs)


@converts("Transpose")
def transpose(ctx: Conversion, node: OnnxNode) -> None:
    rank = ctx.rank(node.inputs[0])
    perm = [int(p) for p in node.attrs.get("perm", range(rank - 1, -1, -1))]
    ctx.emit(node, "transpose", node.inputs, {"perm": perm}, node.outputs)


@converts("Concat")
def concat(ctx: Conversion, node: OnnxNode) -> None:
    axis = _axis(node.attrs["axis"], ctx.rank(node.inputs[0]))
    ctx.emit(node, "concat", _present(node), {"axis": axis}, node.outputs)


@converts("Split", static=(1,))
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


@converts("Slice", static=(1, 2, 3, 4))
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


@converts("Pad", static=(1, 2, 3))
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


@converts("Squeeze", static=(1,))
def squeeze(ctx: Conversion, node: OnnxNode) -> None:
    shape = ctx.shape(node.inputs[0])
    axes = ctx.attr_or_input(node, "axes", 1, since=13)
    if axes is None:
        axes = [axis for axis, size in enumerate(shape) if size == 1]
    ctx.emit(node, "squeeze", node.inputs[:1], {"axes": sorted(_axis(a, len(shape)) for a in axes)}, node.outputs)


@converts("Unsqueeze", static=(1,))
def unsqueeze(ctx: Conversion, node: OnnxNode) -> None:
    axes = ctx.attr_or_input(node, "axes", 1, since=13) or []
    rank = ctx.rank(node.inputs[0]) + len(axes)
    ctx.emit(node, "unsqueeze", node.inputs[:1], {"axes": sorted(_axis(a, rank) for a in axes)}, node.outputs)


_REDUCE = {"ReduceMean": ("reduce_mean", 18), "ReduceSum": ("reduce_sum", 13), "ReduceMax": ("reduce_max", 18)}


@converts(*_REDUCE, static=(1,))
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


# ---------------------------------------------------------------- load-time only


@converts("Shape")
def shape_of(ctx: Conversion, node: OnnxNode) -> None:
    """The static shape of a run-time tensor; a dynamic size is None until a Reshape places it."""
    shape: Shape = ctx.shape(node.inputs[0])
    start, end = node.attrs.get("start", 0), node.attrs.get("end", len(shape))
    dims = list(shape[start:end])
    ctx.bind(node.outputs[0], np.array(dims, dtype=object if None in dims else np.int64))


@converts("Size")
def size_of(ctx: Conversion, node: OnnxNode) -> None:
    shape = ctx.shape(node.inputs[0])
    if None in shape:
        raise Unsupported("the element count of a tensor with a dynamic size")
    ctx.bind(node.outputs[0], np.array(int(np.prod(shape)), dtype=np.int64))


_FLOAT_TYPES = {1: "float32", 10: "float16", 11: "float64"}  # TensorProto element types numpy holds


@converts("Cast")
def cast(ctx: Conversion, node: OnnxNode) -> None:
    """Exporters cast floats to float; any other cast only happens in load-time shape arithmetic."""
    to = node.attrs["to"]
    if to not in _FLOAT_TYPES or ctx.specs[node.inputs[0]].dtype != "float32":
        raise Unsupported(f"a cast of run-time tensors to element type {to}: dabuild graphs compute in float32")
    ctx.emit(node, "identity", node.inputs, outputs=node.outputs)


# Shape-arithmetic ops claimed as evaluated while loading (folding.py evaluates any op whose
# inputs are all known; these are the ones exporters emit for shapes and that are tested so).
LOAD_TIME_OPS = ("Constant", "ConstantOfShape", "Gather")


@converts(*LOAD_TIME_OPS, static=(0, 1))
def load_time_only(ctx: Conversion, node: OnnxNode) -> None:
    raise Unsupported(
        f"{node.op_type} is folded while loading, but here it reads run-time tensors "
        f"{', '.join(repr(name) for name in _present(node) if name not in ctx.known)}"
    )


from dabuild.trace.onnx_frontend import qonnx, quantized  # noqa: E402,F401  (register the quantized ops' converters)

SUPPORTED_OPS: tuple[str, ...] = tuple(CONVERTERS.names())
