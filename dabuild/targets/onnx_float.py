"""A dabuild float Graph as an ONNX model (opset 17): the same computation in another runtime.

It lets onnxruntime check dabuild's kernels and serves as the baseline of the
interpreter benchmark; the quantized ONNX (QDQ) target builds on it. One small
function per op emits the ONNX nodes; fused activations become a separate
activation node, and ops ONNX 17 lacks (gelu, relu6) are spelled with the
nodes it has.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from dabuild.errors import BuildError
from dabuild.ir.given_quant import FixedQuant, GivenQuant
from dabuild.ir.graph import Graph, Node
from dabuild.ir.ops import OPS
from dabuild.ir.ops.pool import Pool
from dabuild.names import unique_name
from dabuild.registry import Registry

OPSET = 17
IR_VERSION = 8
BATCH = "N"  # the name of the dynamic batch dimension


class Emitter:
    """Collects the ONNX nodes and initializers of one export; `fresh` names never collide with `taken` ones."""

    def __init__(self, taken: Iterable[str] = (), make_nodes: bool = True):
        """`make_nodes=False`: names nodes but makes no NodeProtos (sizing a model's initializers needs none)."""
        self.make_nodes = make_nodes
        self.nodes: list[onnx.NodeProto] = []
        self.arrays: list[tuple[str, np.ndarray]] = []  # the initializers' names and values, in order
        self._taken = set(taken)

    @property
    def initializers(self) -> list[onnx.TensorProto]:
        """The initializers as TensorProtos, made when the model is: what they store is known from `arrays`
        without copying every weight into a proto (the onnx target's `stored_bytes` prices configs so)."""
        return [numpy_helper.from_array(values, name) for name, values in self.arrays]

    @classmethod
    def for_graph(cls, graph: Graph) -> Emitter:
        """An emitter holding `graph`'s constants, that never reuses one of its tensor names."""
        emitter = cls({spec.name for spec in graph.inputs} | {name for node in graph.nodes for name in node.outputs})
        for name, array in graph.constants.items():
            emitter.initializer(name, array)
        return emitter

    def initializer(self, name: str, values: np.ndarray) -> str:
        """Add `values` as the initializer `name` (kept as given) and return the name."""
        self._taken.add(name)
        values = np.asarray(values)
        # a copy, as a proto made now would hold, unless nothing can write the array (the weight cache's)
        self.arrays.append((name, values if not values.flags.writeable else values.copy()))
        return name

    def fresh(self, base: str) -> str:
        return unique_name(base, self._taken)

    def constant(self, values: Any, dtype: type, base: str) -> str:
        """Name of a new initializer holding `values` (int64 for shapes and axes, float32 for numbers)."""
        return self.initializer(self.fresh(base), np.asarray(values, dtype))

    def add(self, op_type: str, inputs: list[str], outputs: list[str], name: str, **attrs: Any) -> None:
        name = self.fresh(name)
        if self.make_nodes:
            attrs = {key: value for key, value in attrs.items() if value is not None}
            self.nodes.append(helper.make_node(op_type, inputs, outputs, name=name, **attrs))


NodeExporter = Callable[[Emitter, Node, dict[str, Any]], None]
EXPORTERS: Registry[NodeExporter] = Registry("float exporter", "the onnx target")


def exports(*names: str) -> Callable[[NodeExporter], NodeExporter]:
    return EXPORTERS.register(*names)


_DIRECT = {
    "identity": "Identity", "add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "matmul": "MatMul",
    "relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "hard_swish": "HardSwish",
    "global_avg_pool": "GlobalAveragePool", "softplus": "Softplus", "softsign": "Softsign", "abs": "Abs",
    "neg": "Neg", "exp": "Exp", "log": "Log", "sqrt": "Sqrt", "reciprocal": "Reciprocal", "erf": "Erf",
    "max": "Max", "min": "Min", "prelu": "PRelu", "where": "Where",
}


@exports(*_DIRECT)
def _direct(e: Emitter, node: Node, attrs: dict[str, Any]) -> None:
    e.add(_DIRECT[node.op], node.inputs, node.outputs, node.name)


@exports("leaky_relu")
def _leaky_relu(e: Emitter, node: Node, attrs: dict[str, Any]) -> None:
    e.add("LeakyRelu", node.inputs, node.outputs, node.name, alpha=float(attrs["alpha"]))


@exports("hard_sigmoid")
def _hard_sigmoid(e: Emitter, node: Node, attrs: dict[str, Any]) -> None:
    e.add("HardSigmoid", node.inputs, node.outputs, node.name, alpha=float(attrs["alpha"]), beta=float(attrs["beta"]))


@exports("elu", "selu")
def _exponential_unit(e: Emitter, node: Node, attrs: dict[str, Any]) -> None:
    e.add(node.op.capitalize(), node.inputs, node.outputs, node.name, **{key: float(value) for key, value in attrs.items()})


@exports("pow")
def _pow(e: Emitter, node: Node, attrs: dict[str, Any]) -> None:
    exponent = e.constant(attrs["exponent"], np.float32, f"{node.name}_exponent")
    e.add("Pow", [node.inputs[0], exponent], node.outputs, node.name)


@exports("clip", "relu6")
def _clip(e: Emitter, node: Node, attrs: dict[str, Any]) -> None:
    low, high = (0.0, 6.0) if node.op == "relu6" else (attrs["min"], attrs["max"])
    bounds = ["" if v is None else e.constant(v, np.float32, f"{node.name}_bound") for v in (low, high)]
    while bounds and not bounds[-1]:
        bounds.pop()
    e.add("Clip", [node.inputs[0], *bounds], node.outputs, node.name)


@exports("gelu")
def _gelu(e: Emitter, node: Node, attrs: dict[str, Any]) -> None:
    """Gelu joined ONNX in opset 20: 0.5 x (1 + erf(x / sqrt 2)), or its tanh approximation."""
    x, name = node.inputs[0], node.name
    inner = e.fresh(f"{name}_inner")
    if attrs["approximate"] == "tanh":
        square, cube, term, total, argument = (
            e.fresh(f"{name}_{part}") for part in ("square", "cube", "term", "total", "argument")
        )
        e.add("Mul", [x, x], [square], name)
        e.add("Mul", [square, x], [cube], name)
        e.add("Mul", [cube, e.constant(0.044715, np.float32, f"{name}_c")], [term], name)
        e.add("Add", [x, term], [total], name)
        e.add("Mul", [total, e.constant(math.sqrt(2 / math.pi), np.float32, f"{name}_k")], [argument], name)
        e.add("Tanh", [argument], [inner], name)
    else:
        argument = e.fresh(f"{name}_argument")
        e.add("Mul", [x, e.constant(1 / math.sqrt(2), np.float32, f"{name}_k")], [argument], name)
        e.add("Erf", [argument], [inner], name)
    one_plus, half = e.fresh(f"{name}_one_plus"), e.fresh(f"{name}_half")
    e.add("Add", [inner, e.constant(1.0, np.float32, f"{name}_one")], [one_plus], name)
    e.add("Mul", [one_plus, e.constant(0.5, np.float32, f"{name}_half")], [half], name)
    e.add("Mul", [x, half], node.outputs, name)


def _fused(e: Emitter, node: Node, attrs: dict[str, Any], emit: Callable[[list[str]], None]) -> None:
    """Emit a conv/dense into a fresh tensor, then its fused activation as its own node."""
    if attrs["activation"] == "none":
        emit(node.outputs)
        return
    raw = e.fresh(f"{node.outputs[0]}_linear")
    emit([raw])
    activation = Node(f"{node.name}_{attrs['activation']}", attrs["activation"], [raw], node.outputs,
                      attrs["activation_attrs"])
    EXPORTERS[activation.op](e, activation, OPS[activation.op].resolve(activation.attrs))


@exports("dense")
def _dense(e: Emitter, node: Node, attrs: dict[str, Any]) -> None:
    def emit(outputs: list[str]) -> None:
        if len(node.inputs) == 2:
            e.add("MatMul", node.inputs, outputs, node.name)
            return
        product = e.fresh(f"{node.name}_product")
        e.add("MatMul", node.inputs[:2], [product], node.name)
        e.add("Add", [product, node.inputs[2]], outputs, node.name)

    _fused(e, node, attrs, emit)


@exports("conv")
def _conv(e: Emitter, node: Node, attrs: dict[str, Any]) -> None:
    def emit(outputs: list[str]) -> None:
        e.add("Conv", node.inputs, outputs, node.name, strides=attrs["strides"], pads=attrs["pads"],
              dilations=attrs["dilations"], group=attrs["groups"])

    _fused(e, node, attrs, emit)


@exports("max_pool", "avg_pool")
def _pool(e: Emitter, node: Node, attrs: dict[str, Any]) -> None:
    """MaxPool / AveragePool; pads that reach the kernel (old exporters emulate ceil_mode so) go to a Pad first.

    onnxruntime refuses a pool whose pad is not smaller than its kernel. The part of each pad beyond kernel - 1
    becomes an explicit Pad: with -inf for max (padding never wins), with zeros for an average that counts its
    pads; an average that does not is the ratio of two counting averages, of x and of ones padded alike. In
    ceil_mode the last window must start before the end pad, so moving end padding into the input could add a
    window: that case is refused.
    """
    kernel, strides, pads, dilations = OPS.typed(node.op, Pool).geometry(attrs)
    spatial = len(kernel)
    excess = [max(0, pad - (kernel[axis % spatial] - 1)) for axis, pad in enumerate(pads)]
    if attrs["ceil_mode"] and any(excess[spatial:]):
        raise BuildError(f"onnx export: node {node.name!r} ({node.op}) pads {pads} reach its kernel {kernel} at "
                         "the end in ceil_mode; onnxruntime refuses such a pool and an explicit Pad could add a window")
    common = {"kernel_shape": kernel, "strides": strides, "ceil_mode": int(attrs["ceil_mode"]),
              "pads": [pad - extra for pad, extra in zip(pads, excess)]}
    if not any(excess):
        _pool_node(e, node.op, node.inputs[0], node.outputs[0], node.name, attrs, common, dilations)
        return
    widths = e.constant([0, 0, *excess[:spatial], 0, 0, *excess[spatial:]], np.int64, f"{node.name}_pads")
    padded = e.fresh(f"{node.name}_padded")
    fill = -np.inf if node.op == "max_pool" else 0.0
    e.add("Pad", [node.inputs[0], widths, e.constant(fill, np.float32, f"{node.name}_fill")], [padded], node.name)
    if node.op == "max_pool" or attrs["count_include_pad"]:
        _pool_node(e, node.op, padded, node.outputs[0], node.name, attrs, common, dilations)
        return
    counting = {**attrs, "count_include_pad": True}
    shape, ones, padded_ones, sums, counts = (e.fresh(f"{node.name}_{part}") for part in
                                              ("shape", "ones", "padded_ones", "sums", "counts"))
    e.add("Shape", [node.inputs[0]], [shape], node.name)
    e.add("ConstantOfShape", [shape], [ones], node.name, value=numpy_helper.from_array(np.ones(1, np.float32)))
    e.add("Pad", [ones, widths, e.constant(0.0, np.float32, f"{node.name}_fill")], [padded_ones], node.name)
    _pool_node(e, "avg_pool", padded, sums, node.name, counting, common, dilations)
    _pool_node(e, "avg_pool", padded_ones, counts, node.name, counting, common, dilations)
    e.add("Div", [sums, counts], node.outputs, node.name)


def _pool_node(e: Emitter, op: str, x: str, y: str, name: str, attrs: dict[str, Any], common: dict[str, Any],
               dilations: list[int]) -> None:
    if op == "max_pool":
        e.add("MaxPool", [x], [y], name, dilations=dilations, **common)
    else:
        e.add("AveragePool", [x], [y], name, count_include_pad=int(attrs["count_include_pad"]), **common)


@exports("softmax", "log_softmax", "flatten", "concat")
def _axis(e: Emitter, node: Node, attrs: dict[str, Any]) -> None:
    op_type = {"softmax": "Softmax", "log_softmax": "LogSoftmax", "flatten": "Flatten", "concat": "Concat"}[node.op]
    e.add(op_type, node.inputs, node.outputs, node.name, axis=attrs["axis"])


@exports("batch_norm")
def _batch_norm(e: Emitter, node: Node, attrs: dict[str, Any]) -> None:
    e.add("BatchNormalization", node.inputs, node.outputs, node.name, epsilon=float(attrs["epsilon"]))


@exports("instance_norm")
def _instance_norm(e: Emitter, node: Node, attrs: dict[str, Any]) -> None:
    e.add("InstanceNormalization", node.inputs, node.outputs, node.name, epsilon=float(attrs["epsilon"]))


@exports("layer_norm")
def _layer_norm(e: Emitter, node: Node, attrs: dict[str, Any]) -> None:
    """ONNX 17's LayerNormalization requires a scale; a missing one is ones of the normalized axes' shape."""
    inputs = list(node.inputs)
    if len(inputs) == 1:
        raise BuildError(f"onnx export: node {node.name!r} (layer_norm) has no scale; give it one of ones")
    e.add("LayerNormalization", inputs, node.outputs, node.name, axis=int(attrs["axis"]),
          epsilon=float(attrs["epsilon"]))


@exports("group_norm")
def _group_norm(e: Emitter, node: Node, attrs: dict[str, Any]) -> None:
    """GroupNormalization joined ONNX in 18: here InstanceNormalization over (N, groups, -1), then the
    per-channel scale and bias."""
    x, scale, bias = node.inputs
    name, groups = node.name, int(attrs["groups"])
    grouped, normalized, shape, restored, scaled = (e.fresh(f"{name}_{part}") for part in
                                                    ("grouped", "normalized", "shape", "restored", "scaled"))
    e.add("Reshape", [x, e.constant([0, groups, -1], np.int64, f"{name}_groups")], [grouped], name)
    e.add("InstanceNormalization", [grouped, e.constant(np.ones(groups), np.float32, f"{name}_ones"),
                                    e.constant(np.zeros(groups), np.float32, f"{name}_zeros")],
          [normalized], name, epsilon=float(attrs["epsilon"]))
    e.add("Shape", [x], [shape], name)
    e.add("Reshape", [normalized, shape], [restored], name)
    channel = e.fresh(f"{name}_channel_shape")
    e.add("Unsqueeze", [scale, e.constant([1, 2], np.int64, f"{name}_axes")], [channel], name)
    e.add("Mul", [restored, channel], [scaled], name)
    shift = e.fresh(f"{name}_bias_shape")
    e.add("Unsqueeze", [bias, e.constant([1, 2], np.int64, f"{name}_axes")], [shift], name)
    e.add("Add", [scaled, shift], node.outputs, name)


@exports("lrn")
def _lrn(e: Emitter, node: Node, attrs: dict[str, Any]) -> None:
    e.add("LRN", node.inputs, node.outputs, node.name, size=int(attrs["size"]), alpha=float(attrs["alpha"]),
          beta=float(attrs["beta"]), bias=float(attrs["bias"]))


@exports("conv_transpose")
def _conv_transpose(e: Emitter, node: Node, attrs: dict[str, Any]) -> None:
    e.add("ConvTranspose", node.inputs, node.outputs, node.name, strides=attrs["strides"], pads=attrs["pads"],
          dilations=attrs["dilations"], group=attrs["groups"], output_padding=attrs["output_padding"])


@exports("resize")
def _resize(e: Emitter, node: Node, attrs: dict[str, Any]) -> None:
    """As scales, so the coordinate formulas get the same factors (the batch axis 1); a float32 scale whose
    floor(in * scale) falls short of the size is raised by one float32 step (a 1e-7 relative change)."""
    factors = []
    for size, scale in zip(attrs["sizes"], attrs["scales"]):
        factor = np.float32(scale)
        source = round(size / scale)
        while math.floor(np.float32(source) * factor) < size:
            factor = np.nextafter(factor, np.float32(np.inf))
        factors.append(factor)
    scales = e.constant(factors, np.float32, f"{node.name}_scales")
    e.add("Resize", [node.inputs[0], "", scales], node.outputs, node.name, mode=attrs["mode"],
          coordinate_transformation_mode=attrs["coordinate_transformation_mode"],
          nearest_mode=attrs["nearest_mode"])


@exports("embedding")
def _embedding(e: Emitter, node: Node, attrs: dict[str, Any]) -> None:
    e.add("Gather", [node.inputs[1], node.inputs[0]], node.outputs, node.name, axis=0)


@exports("gather")
def _gather(e: Emitter, node: Node, attrs: dict[str, Any]) -> None:
    indices = e.constant(attrs["indices"], np.int64, f"{node.name}_indices")
    e.add("Gather", [node.inputs[0], indices], node.outputs, node.name, axis=int(attrs["axis"]))


@exports("tile", "expand")
def _repeat(e: Emitter, node: Node, attrs: dict[str, Any]) -> None:
    key, op_type = ("repeats", "Tile") if node.op == "tile" else ("shape", "Expand")
    e.add(op_type, [node.inputs[0], e.constant(attrs[key], np.int64, f"{node.name}_{key}")], node.outputs,
          node.name)


@exports("reshape")
def _reshape(e: Emitter, node: Node, attrs: dict[str, Any]) -> None:
    shape = e.constant(attrs["shape"], np.int64, f"{node.name}_shape")
    e.add("Reshape", [node.inputs[0], shape], node.outputs, node.name)


@exports("transpose")
def _transpose(e: Emitter, node: Node, attrs: dict[str, Any]) -> None:
    e.add("Transpose", node.inputs, node.outputs, node.name, perm=attrs["perm"])


@exports("split")
def _split(e: Emitter, node: Node, attrs: dict[str, Any]) -> None:
    sizes = e.constant(attrs["sizes"], np.int64, f"{node.name}_sizes")
    e.add("Split", [node.inputs[0], sizes], node.outputs, node.name, axis=attrs["axis"])


@exports("slice")
def _slice(e: Emitter, node: Node, attrs: dict[str, Any]) -> None:
    parts = [e.constant(attrs[key], np.int64, f"{node.name}_{key}") for key in ("starts", "ends")]
    parts += [e.constant(attrs[key], np.int64, f"{node.name}_{key}") for key in ("axes", "steps") if attrs[key]]
    if attrs["steps"] and not attrs["axes"]:
        parts.insert(2, e.constant(range(len(attrs["starts"])), np.int64, f"{node.name}_axes"))
    e.add("Slice", [node.inputs[0], *parts], node.outputs, node.name)


@exports("pad")
def _pad(e: Emitter, node: Node, attrs: dict[str, Any]) -> None:
    inputs = [node.inputs[0], e.constant(attrs["pads"], np.int64, f"{node.name}_pads")]
    if attrs["mode"] == "constant":
        inputs.append(e.constant(attrs["value"], np.float32, f"{node.name}_value"))
    e.add("Pad", inputs, node.outputs, node.name, mode=attrs["mode"])


@exports("squeeze", "unsqueeze")
def _squeeze(e: Emitter, node: Node, attrs: dict[str, Any]) -> None:
    axes = [] if attrs["axes"] is None else [e.constant(attrs["axes"], np.int64, f"{node.name}_axes")]
    e.add(node.op.capitalize(), [node.inputs[0], *axes], node.outputs, node.name)


@exports("reduce_mean", "reduce_sum", "reduce_max")
def _reduce(e: Emitter, node: Node, attrs: dict[str, Any]) -> None:
    """In opset 17 ReduceSum reads its axes from an input, ReduceMean and ReduceMax from an attribute."""
    op_type = {"reduce_mean": "ReduceMean", "reduce_sum": "ReduceSum", "reduce_max": "ReduceMax"}[node.op]
    axes = attrs["axes"] or None
    keepdims = int(attrs["keepdims"])
    if op_type == "ReduceSum":
        inputs = node.inputs if axes is None else [*node.inputs, e.constant(axes, np.int64, f"{node.name}_axes")]
        e.add(op_type, inputs, node.outputs, node.name, keepdims=keepdims)
    else:
        e.add(op_type, node.inputs, node.outputs, node.name, axes=axes, keepdims=keepdims)


_ROUNDING = {"half_even": "Round", "floor": "Floor", "ceil": "Ceil"}


@exports("fake_quant")
def _fake_quant(e: Emitter, node: Node, attrs: dict[str, Any]) -> None:
    """(clip(round(x / scale) + zero_point, low, high) - zero_point) * scale, per tensor in arithmetic (any width
    and rounding); per channel as QuantizeLinear/DequantizeLinear, which ONNX 17 has for 8 bits rounding half to
    even."""
    given = GivenQuant.from_attrs(attrs)
    name = node.name
    if given.per_channel:
        if given.bits != 8 or given.narrow or given.rounding != "half_even":
            raise BuildError(f"onnx export: node {name!r} (fake_quant): per-channel {given.dtype} rounding "
                             f"{given.rounding}{' narrow' if given.narrow else ''} has no ONNX 17 spelling "
                             "(per channel: 8 bits, full range, half to even)")
        scale = e.constant(given.scale, np.float32, f"{name}_scale")
        zero = e.initializer(e.fresh(f"{name}_zero_point"), np.asarray(given.zero_point, given.dtype))
        quantized = e.fresh(f"{name}_q")
        e.add("QuantizeLinear", [node.inputs[0], scale, zero], [quantized], name, axis=given.axis)
        e.add("DequantizeLinear", [quantized, scale, zero], node.outputs, name, axis=given.axis)
        return
    low, high = given.bounds()
    scale = e.constant(given.scale[0], np.float32, f"{name}_scale")
    zero = e.constant(given.zero_point[0], np.float32, f"{name}_zero_point")

    def step(op_type: str, *inputs: str, output: str | None = None) -> str:
        result = output or e.fresh(f"{name}_{op_type.lower()}")
        e.add(op_type, list(inputs), [result], name)
        return result

    rounded = _rounded(e, name, step("Div", node.inputs[0], scale), given.rounding)
    bounds = [e.constant(v, np.float32, f"{name}_bound") for v in (low, high)]
    clipped = step("Clip", step("Add", rounded, zero), *bounds)
    step("Mul", step("Sub", clipped, zero), scale, output=node.outputs[0])


def _rounded(e: Emitter, name: str, scaled: str, rounding: str) -> str:
    """`scaled` rounded to integers by `rounding` (dabuild.ir.given_quant.ROUNDINGS) in float ONNX ops."""
    def step(op_type: str, *inputs: str) -> str:
        result = e.fresh(f"{name}_{op_type.lower()}")
        e.add(op_type, list(inputs), [result], name)
        return result

    if rounding in _ROUNDING:
        return step(_ROUNDING[rounding], scaled)
    if rounding == "half_up":
        return step("Floor", step("Add", scaled, e.constant(0.5, np.float32, f"{name}_half")))
    half = e.constant(0.5 if rounding == "half_away" else 0.0, np.float32, f"{name}_half")  # on the magnitude
    magnitude = step("Floor", step("Add", step("Abs", scaled), half))
    return step("Mul", step("Sign", scaled), magnitude)


@exports("fixed_quant")
def _fixed_quant(e: Emitter, node: Node, attrs: dict[str, Any]) -> None:
    """q = round(x * 2**f) saturated (Max, Min) or wrapped (low + (q - low) mod 2**bits, by Floor) per element,
    times 2**-f: the types as per-element constants broadcast over the batch."""
    quant = FixedQuant.from_attrs(attrs)
    name = node.name
    _, _, f = quant.arrays()
    low, high = quant.bounds()

    def constant(values: np.ndarray, base: str) -> str:
        return e.constant(np.asarray(values, dtype=np.float64)[None], np.float32, f"{name}_{base}")

    def step(op_type: str, *inputs: str, output: str | None = None) -> str:
        result = output or e.fresh(f"{name}_{op_type.lower()}")
        e.add(op_type, list(inputs), [result], name)
        return result

    q = _rounded(e, name, step("Mul", node.inputs[0], constant(2.0**f, "scale")), quant.rounding)
    if quant.overflow == "wrap":
        low_name, span = constant(low, "low"), constant(high - low + 1, "span")
        offset = step("Sub", q, low_name)
        wrapped = step("Sub", offset, step("Mul", step("Floor", step("Div", offset, span)), span))
        q = step("Add", wrapped, low_name)
    else:
        q = step("Min", step("Max", q, constant(low, "low")), constant(high, "high"))
    step("Mul", q, constant(2.0**-f, "step"), output=node.outputs[0])


def value_info(name: str, shape: tuple[int | None, ...], dtype: str = "float32") -> onnx.ValueInfoProto:
    """A float32 (or, for an integer input, int64: token ids) tensor with the batch left open."""
    dims = [BATCH if d is None else d for d in shape]
    return helper.make_tensor_value_info(name, TensorProto.FLOAT if dtype == "float32" else TensorProto.INT64, dims)


def to_onnx(graph: Graph, name: str = "dabuild") -> onnx.ModelProto:
    """The float graph as a checked ONNX model; BuildError naming a node whose op has no ONNX spelling."""
    specs = graph.tensor_shapes()
    missing = [f"{node.name} ({node.op})" for node in graph.nodes if node.op not in EXPORTERS]
    if missing:
        raise BuildError(f"onnx export: no ONNX spelling for {', '.join(missing)}")
    emitter = Emitter.for_graph(graph)
    for node in graph.nodes:
        EXPORTERS[node.op](emitter, node, OPS[node.op].resolve(node.attrs))
    onnx_graph = helper.make_graph(
        emitter.nodes,
        name,
        inputs=[value_info(spec.name, spec.shape, spec.dtype) for spec in graph.inputs],
        outputs=[value_info(output, specs[output].shape) for output in graph.outputs],
        initializer=emitter.initializers,
    )
    model = helper.make_model(onnx_graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="dabuild")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model
