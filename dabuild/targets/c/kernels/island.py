"""Float kernels: a float island's layers (`QFloat`, `QFloatWeighted`) on the profiles with an FPU.

Each kernel reads every input as float32, whatever it is (an int8 tensor
dequantized as it is read, `dabuild_dequantize`; a float island tensor as it
is; a float constant from the kernel's own arrays), and writes each output as
float32 inside the island or quantized at its boundary (`dabuild_quantize`),
as the integer reference does (QuantParams.dequantize/quantize). Sums add in
the order of dabuild.qir.layers.island_order, every product and sum rounded
to float32 on its own (separate statements, and -ffp-contract=off), so the
results equal the integer reference's bit for bit: check stays `exact`.

Every tensor is canonical (channels first); an int8 input stored channels
last is converted before. No kernel needs libm: exp, tanh, sigmoid, erf and
gelu (alone or fused into dense/conv) and softmax call dabuild_kernels.h's
own dabuild_expf and the rest, fixed float32 sequences island_order repeats
in numpy, so they are exact too. matmul multiplies two tensors (or a tensor
and a constant) with numpy's broadcasting, avg_pool divides by each
window's count, transpose copies through a table of source offsets. An op
with no float kernel here (the c capability's float_ops leaves it out, so
tuning never picks it) is a build error naming the layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dabuild.ir.ops import OPS
from dabuild.ir.ops.linear import conv_geometry
from dabuild.qir.layers.fallback import QFloat
from dabuild.qir.qgraph import QGraph, QLayer, QuantParams
from dabuild.targets.c.kernels.registry import CANONICAL, Condition, Step, kernel
from dabuild.targets.c.layout import Storage, Walk, broadcast_strides
from dabuild.targets.c.literals import c_float
from dabuild.targets.c.profiles import Profile

ACTIVATIONS = ("none", "relu", "relu6", "clip", "leaky_relu", "exp", "tanh", "sigmoid", "erf", "gelu")
UNARY = ACTIVATIONS[1:]
COPIES = ("identity", "reshape", "flatten", "squeeze", "unsqueeze")
BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
FLOAT_MAX = "0x1.fffffep+127f"
ISLAND_DTYPES = ("int8", "", "int16", "int16/int8")   # the integer tensors an island reads or writes at its boundary
FLOAT_OPS: set[str] = set()  # every IR op some float kernel below runs (`_float_layer` adds them): CTarget.float_ops


@dataclass(frozen=True)
class Access:
    """How a float kernel reads one input or writes one output: C expressions of an element index."""

    pointer: str               # in0, out1, or a constant array c0
    params: QuantParams | None  # None: float32 values

    def read(self, index: str) -> str:
        if self.params is None:
            return f"((const float *){self.pointer})[{index}]"
        values = (self.pointer if self.params.storage == "int8"
                  else f"((const {self.params.storage}_t *)(const void *){self.pointer})")
        return f"dabuild_dequantize({values}[{index}], {self.params.zero_point}, {c_float(self.params.scale)})"

    def write(self, index: str, value: str) -> str:
        if self.params is None:
            return f"((float *){self.pointer})[{index}] = {value};"
        p = self.params
        if p.storage != "int8":   # a 16-bit tensor at the island's boundary
            return (f"(({p.storage}_t *)(void *){self.pointer})[{index}] = ({p.storage}_t)dabuild_quantize_wide("
                    f"{value}, {c_float(p.scale)}, {p.zero_point}, {p.qmin}, {p.qmax});")
        return (f"{self.pointer}[{index}] = dabuild_quantize({value}, {c_float(p.scale)}, {p.zero_point}, "
                f"{p.qmin}, {p.qmax});")


def _reads(step: Step) -> tuple[list[Access], list[np.ndarray]]:
    """The access of each layer input, in the layer's order, and the float constants (arrays c0, c1, ...)."""
    layer = step.layer
    assert layer is not None
    accesses: list[Access] = []
    constants: list[np.ndarray] = []
    position = 0
    for name in layer.inputs:
        if name in step.constants:
            accesses.append(Access(f"c{len(constants)}", None))
            constants.append(np.ascontiguousarray(step.constants[name], np.float32))
        else:
            accesses.append(Access(f"in{position}", step.inputs[position].params))
            position += 1
    return accesses, constants


def _base(step: Step) -> dict[str, Any]:
    reads, constants = _reads(step)
    return {"reads": reads, "constants": constants,
            "writes": [Access(f"out{k}", operand.params) for k, operand in enumerate(step.outputs)]}


def activation(name: str, attrs: dict[str, Any]) -> str:
    """C statements applying activation `name` to float `v` in place, as the IR op computes it in float32."""
    if name == "relu":
        return "v = v > 0.0f ? v : 0.0f;"
    if name == "relu6":
        return "v = v > 0.0f ? v : 0.0f; v = v < 6.0f ? v : 6.0f;"
    if name == "leaky_relu":
        return f"v = v < 0.0f ? v * {c_float(attrs['alpha'])} : v;"
    if name == "clip":
        low = "" if attrs["min"] is None else f"v = v > {c_float(attrs['min'])} ? v : {c_float(attrs['min'])}; "
        high = "" if attrs["max"] is None else f"v = v < {c_float(attrs['max'])} ? v : {c_float(attrs['max'])};"
        return (low + high).strip()
    if name in ("exp", "tanh", "sigmoid", "erf"):
        return f"v = dabuild_{name}f(v);"
    if name == "gelu":  # island_order.gelu32's operations, one rounding each
        if attrs["approximate"] == "tanh":
            inner = (f"float c = {c_float(np.float32(0.044715))} * v; c = c * v; c = c * v; c = v + c; "
                     f"c = {c_float(np.float32(math.sqrt(2 / math.pi)))} * c; float e = dabuild_tanhf(c);")
        else:
            inner = f"float e = dabuild_erff(v * {c_float(np.float32(1 / math.sqrt(2)))});"
        return "{ " + inner + " e = e + 1.0f; e = e * 0.5f; v = v * e; }"
    return ""


def _fused(attrs: dict[str, Any]) -> str:
    name = attrs.get("activation", "none")
    return activation(name, OPS[name].resolve(attrs.get("activation_attrs") or {}) if name != "none" else {})


def _float_layer(ops: tuple[str, ...], fused: bool = False) -> Condition:
    """The condition of a float kernel: the layer runs one of `ops` (with a libm-free fused activation), on a
    profile with an FPU. Made once per kernel, at import: `ops` join FLOAT_OPS, the target's float table."""
    FLOAT_OPS.update(ops)

    def runs(layer: QLayer, qgraph: QGraph, profile: Profile) -> str | None:
        op = getattr(layer, "float_op", "")
        if op not in ops:
            return f"float op {op!r} is not {'/'.join(ops)}"
        if not profile.fpu:
            return f"cpu {profile.name!r} has no FPU, so it runs no float islands"
        if fused and layer.op_attrs.get("activation", "none") not in ACTIVATIONS:  # type: ignore[attr-defined]
            return f"its fused {layer.op_attrs['activation']} has no float kernel"  # type: ignore[attr-defined]
        return None
    return runs


def _weight(step: Step, reads: list[Access], index: str, channel: str) -> tuple[str, dict[str, Any]]:
    """The C expression of weight element `index` (output channel `channel`), and the arrays it reads: a
    QFloatWeighted's integers times their scale (as its `real_weight`), else the layer's weight input."""
    layer: Any = step.layer
    if layer.op != "float_weighted":
        return reads[1].read(index), {}
    scale = np.asarray(layer.weight_scale, np.float32).ravel()
    at = channel if scale.size > 1 else "0"
    return f"(float)weight[{index}] * weight_scale[{at}]", {"weight": layer.weight, "weight_scale": scale}


def _bias(step: Step, reads: list[Access], channel: str) -> tuple[str | None, dict[str, Any]]:
    layer: Any = step.layer
    if layer.op == "float_weighted":
        return f"bias[{channel}]", {"bias": np.asarray(layer.bias, np.float32)}
    return (reads[2].read(channel) if len(reads) > 2 else None), {}


@kernel("float", "float_dense", inputs=CANONICAL, outputs=CANONICAL, dtypes=ISLAND_DTYPES,
        when=_float_layer(("dense",), fused=True))
@kernel("float_weighted", "float_dense", inputs=CANONICAL, outputs=CANONICAL, dtypes=ISLAND_DTYPES,
        when=_float_layer(("dense",), fused=True))
def float_dense(step: Step) -> dict[str, Any]:
    """acc = sum over k of x[r, k] * w[k, o], then + bias, activation: island_order's dense."""
    layer: Any = step.layer
    base = _base(step)
    out_features = step.outputs[0].shape[-1]
    in_features = step.inputs[0].shape[-1]
    weight, arrays = _weight(step, base["reads"], f"k * {out_features} + o", "o")
    bias, bias_arrays = _bias(step, base["reads"], "o")
    return {**base, **arrays, **bias_arrays, "rows": step.inputs[0].size // in_features, "in_features": in_features,
            "out_features": out_features, "weight_at": weight, "bias_at": bias,
            "activation": _fused(OPS["dense"].resolve(layer.op_attrs))}


@kernel("float", "float_conv", inputs=CANONICAL, outputs=CANONICAL, dtypes=ISLAND_DTYPES,
        when=_float_layer(("conv",), fused=True))
@kernel("float_weighted", "float_conv", inputs=CANONICAL, outputs=CANONICAL, dtypes=ISLAND_DTYPES,
        when=_float_layer(("conv",), fused=True))
def float_conv(step: Step) -> dict[str, Any]:
    """Per output, taps in input channel, kernel row, kernel column order (padding skipped), then + bias,
    activation: island_order's conv. 1-D is a 2-D conv of one row."""
    layer: Any = step.layer
    attrs = OPS["conv"].resolve(layer.op_attrs)
    x, y = step.inputs[0].shape, step.outputs[0].shape
    spatial = len(x) - 1
    strides, pads, dilations = conv_geometry(attrs, spatial)
    if spatial == 1:
        x, y = (x[0], 1, x[1]), (y[0], 1, y[1])
        strides, pads, dilations = [1, strides[0]], [0, pads[0], 0, pads[1]], [1, dilations[0]]
    out_channels, per_group = y[0], x[0] // attrs["groups"]
    kernel_size = (1, *layer_kernel(step)) if spatial == 1 else layer_kernel(step)
    base = _base(step)
    index = f"((o * {per_group} + c) * {kernel_size[0]} + i) * {kernel_size[1]} + j"
    weight, arrays = _weight(step, base["reads"], index, "o")
    bias, bias_arrays = _bias(step, base["reads"], "o")
    return {**base, **arrays, **bias_arrays, "weight_at": weight, "bias_at": bias,
            "activation": _fused(attrs), "in_shape": x, "out_shape": y, "out_channels": out_channels,
            "per_group": per_group, "group_outputs": out_channels // attrs["groups"], "kernel_size": kernel_size,
            "strides": strides, "pads": pads, "dilations": dilations}


def layer_kernel(step: Step) -> tuple[int, ...]:
    """The conv's kernel size: its weight's spatial axes (a QFloat conv's weight is a float constant)."""
    layer: Any = step.layer
    weight = layer.weight if layer.op == "float_weighted" else step.constants[layer.inputs[1]]
    return tuple(np.shape(weight)[2:])


@kernel("float", "float_max_pool", inputs=CANONICAL, outputs=CANONICAL, dtypes=ISLAND_DTYPES,
        when=_float_layer(("max_pool",)))
def float_max_pool(step: Step) -> dict[str, Any]:
    """The largest tap of each window in the input (taps in the padding or past the edge never win)."""
    layer: Any = step.layer
    kernel_size, strides, pads, dilations = OPS["max_pool"].geometry(OPS["max_pool"].resolve(layer.op_attrs))  # type: ignore[attr-defined]
    x, y = step.inputs[0].shape, step.outputs[0].shape
    if len(x) == 2:
        x, y = (x[0], 1, x[1]), (y[0], 1, y[1])
        kernel_size, strides, pads, dilations = [1, *kernel_size], [1, *strides], [0, pads[0], 0, pads[1]], [1, *dilations]
    return {**_base(step), "in_shape": x, "out_shape": y, "kernel_size": kernel_size, "strides": strides,
            "pads": pads, "dilations": dilations, "lowest": f"-{FLOAT_MAX}"}


_MEAN = _float_layer(("global_avg_pool", "reduce_mean"))


def _per_sample_mean(layer: QLayer, qgraph: QGraph, profile: Profile) -> str | None:
    """The float mean's condition: also, a reduce_mean must keep the batch axis."""
    why = _MEAN(layer, qgraph, profile)
    if why is None and isinstance(layer, QFloat) and layer.float_op == "reduce_mean":
        source = layer.inputs[0]
        rank = len(qgraph.tensors[source].shape if source in qgraph.tensors else qgraph.floats[source]) + 1
        attrs = OPS["reduce_mean"].resolve(layer.op_attrs)
        if 0 in OPS["reduce_mean"].axes(rank, attrs):  # type: ignore[attr-defined]  # Reduce's, not every Op's
            return "it reduces the batch axis; the C model runs one sample at a time"
    return why


@kernel("float", "float_mean", inputs=CANONICAL, outputs=CANONICAL, dtypes=ISLAND_DTYPES, when=_per_sample_mean)
def float_mean(step: Step) -> dict[str, Any]:
    """Per output, its reduced values summed in C order, then one division by their count: island_order's
    mean. `starts` holds each output's first input offset, `steps` each reduced value's offset from it."""
    layer: Any = step.layer
    shape = step.inputs[0].shape
    rank = len(shape) + 1  # the IR op's axes count the batch
    if layer.float_op == "global_avg_pool":
        axes = tuple(range(1, len(shape)))
    else:
        attrs = OPS["reduce_mean"].resolve(layer.op_attrs)
        axes = tuple(a - 1 for a in OPS["reduce_mean"].axes(rank, attrs))  # type: ignore[attr-defined]
    starts, steps = _rows(shape, axes)
    return {**_base(step), "starts": starts, "steps": steps, "count": c_float(steps.size)}


def _rows(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """A reduction over `axes` of a C-order `shape` as rows: each row's first offset, and each reduced value's
    offset from it (the reduced values in C order)."""
    kept = [a for a in range(len(shape)) if a not in axes]
    offsets = np.arange(int(np.prod(shape))).reshape(shape).transpose(*kept, *axes).reshape(
        int(np.prod([shape[a] for a in kept])), -1)
    return offsets[:, 0].astype(np.int32), (offsets[0] - offsets[0, 0]).astype(np.int32)


def _unary(step: Step) -> dict[str, Any]:
    layer: Any = step.layer
    op = layer.float_op
    base = _base(step)  # a copy's shape input, if any, is not read
    return {**base, "constants": base["constants"][:1] if base["reads"][0].pointer == "c0" else [],
            "size": step.outputs[0].size,
            "activation": "" if op in COPIES else activation(op, OPS[op].resolve(layer.op_attrs))}


kernel("float", "float_unary", inputs=CANONICAL, outputs=CANONICAL, dtypes=ISLAND_DTYPES,
       when=_float_layer(UNARY + COPIES))(_unary)


@kernel("float", "float_binary", inputs=CANONICAL, outputs=CANONICAL, dtypes=ISLAND_DTYPES,
        when=_float_layer(tuple(BINARY)))
def float_binary(step: Step) -> dict[str, Any]:
    """One walk over the output, each input at its broadcast strides (a float constant in its own shape)."""
    layer: Any = step.layer
    out = step.outputs[0]
    base = _base(step)
    storages, position = [], 0
    for name in layer.inputs:
        if name in step.constants:
            shape = tuple(np.shape(step.constants[name]))
            storages.append(Storage.canonical(shape[max(0, len(shape) - len(out.shape)):]))
        else:
            storages.append(step.inputs[position].storage)
            position += 1
    walk = Walk.over(out.shape, out.storage.order, {"o": out.strides, "a": broadcast_strides(storages[0], out.shape),
                                                      "b": broadcast_strides(storages[1], out.shape)})
    return {**base, "walk": walk, "operator": BINARY[layer.float_op]}


@kernel("float", "float_softmax", inputs=CANONICAL, outputs=CANONICAL, dtypes=ISLAND_DTYPES,
        when=_float_layer(("softmax",)))
def float_softmax(step: Step) -> dict[str, Any]:
    """Per row along the axis: the max, then e = exp(x - max) summed from 0 in index order, then each e (computed
    again) divided by the sum: island_order's softmax."""
    layer: Any = step.layer
    shape = step.inputs[0].shape
    axis = OPS["softmax"].resolve(layer.op_attrs)["axis"] % (len(shape) + 1) - 1  # the per-sample axis
    starts, steps = _rows(shape, (axis,))
    return {**_base(step), "starts": starts, "steps": steps}


def _matrices(shape: tuple[int, ...], batch: tuple[int, ...]) -> np.ndarray:
    """The first offset of each matrix of a C-order `shape` (at least 2-D), broadcast over `batch`."""
    lead = shape[:-2]
    firsts = np.arange(int(np.prod(lead, dtype=np.int64))).reshape(lead) * (shape[-2] * shape[-1])
    return np.broadcast_to(firsts, batch).ravel().astype(np.int32)


@kernel("float", "float_matmul", inputs=CANONICAL, outputs=CANONICAL, dtypes=ISLAND_DTYPES,
        when=_float_layer(("matmul",)))
def float_matmul(step: Step) -> dict[str, Any]:
    """numpy.matmul of two tensors (or a tensor and a constant): per matrix of the broadcast batch, each
    a[i, :] . b[:, j] summed from 0 in t order: island_order's matmul. A tensor operand is its sample with a
    batch axis of 1, as the IR's batch-first matmul reads it; a 1-D operand is promoted as numpy does."""
    layer: Any = step.layer
    shapes, position = [], 0
    for name in layer.inputs:
        if name in step.constants:
            shapes.append(tuple(np.shape(step.constants[name])))
        else:
            shapes.append((1, *step.inputs[position].shape))
            position += 1
    a, b = shapes
    a = (1, *a) if len(a) == 1 else a
    b = (*b, 1) if len(b) == 1 else b
    batch = tuple(np.broadcast_shapes(a[:-2], b[:-2]))
    return {**_base(step), "a_starts": _matrices(a, batch), "b_starts": _matrices(b, batch), "rows": a[-2],
            "inner": a[-1], "columns": b[-1]}


@kernel("float", "float_avg_pool", inputs=CANONICAL, outputs=CANONICAL, dtypes=ISLAND_DTYPES,
        when=_float_layer(("avg_pool",)))
def float_avg_pool(step: Step) -> dict[str, Any]:
    """Per window, its taps summed from 0 in kernel row, column order (the padding and the ceil-mode overhang
    skipped), then one division by the window's count (the IR op's divisors): island_order's avg_pool."""
    layer: Any = step.layer
    attrs = OPS["avg_pool"].resolve(layer.op_attrs)
    kernel_size, strides, pads, dilations = OPS["avg_pool"].geometry(attrs)  # type: ignore[attr-defined]
    x, y = step.inputs[0].shape, step.outputs[0].shape
    divisors = OPS["avg_pool"].divisors((1, *x), attrs)  # type: ignore[attr-defined]
    if len(x) == 2:
        x, y = (x[0], 1, x[1]), (y[0], 1, y[1])
        kernel_size, strides, pads, dilations = [1, *kernel_size], [1, *strides], [0, pads[0], 0, pads[1]], [1, *dilations]
    return {**_base(step), "in_shape": x, "out_shape": y, "kernel_size": kernel_size, "strides": strides,
            "pads": pads, "dilations": dilations, "divisors": np.asarray(divisors, np.float32).ravel()}


_TRANSPOSE = _float_layer(("transpose",))


def _batch_first(layer: QLayer, qgraph: QGraph, profile: Profile) -> str | None:
    """The float transpose's condition: also, its permutation keeps the batch axis first."""
    why = _TRANSPOSE(layer, qgraph, profile)
    if why is None and not OPS["transpose"].samplewise(layer.op_attrs):  # type: ignore[attr-defined]
        return "it moves the batch axis; the C model runs one sample at a time"
    return why


@kernel("float", "float_transpose", inputs=CANONICAL, outputs=CANONICAL, dtypes=ISLAND_DTYPES,
        when=_batch_first)
def float_transpose(step: Step) -> dict[str, Any]:
    """Each output value copied from its input offset (a table): any permutation that keeps the batch first."""
    layer: Any = step.layer
    shape = step.inputs[0].shape
    perm = OPS["transpose"].resolve(layer.op_attrs)["perm"]
    sources = np.arange(int(np.prod(shape))).reshape(shape).transpose([a - 1 for a in perm[1:]]).ravel()
    return {**_base(step), "sources": sources.astype(np.int32)}
