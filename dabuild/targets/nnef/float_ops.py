"""dabuild IR ops as NNEF standard fragments on float32 tensors, one small function per op.

Each takes the op's name, the NNEF identifiers of its inputs, the op's
resolved attributes and the inputs' shapes (batch first, None for it), and returns
the identifiers of its outputs. The integer layers of a QGraph reuse them on
the real values of their tensors (see `layers`), and fp32-fallback layers
call them directly. Activations NNEF 1.0 lacks (relu6, hard_sigmoid,
hard_swish, gelu) are spelled with its primitives, gelu's erf with the same
Abramowitz-Stegun polynomial dabuild's own kernel uses.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import accumulate
from typing import Any

import numpy as np

from dabuild.errors import BuildError
from dabuild.ir.graph import TensorSpec
from dabuild.ir.ops import OPS
from dabuild.ir.ops.pool import Pool
from dabuild.ir.ops.reduce import Reduce
from dabuild.ir.ops.shape import Slice
from dabuild.registry import Registry
from dabuild.targets.nnef.emitter import Emitter, integers, number

Shape = tuple[int | None, ...]  # batch-first, None for the batch


def known_size(shape: Shape, axis: int, base: str) -> int:
    """The size of a per-sample axis, which the NNEF text spells out (so it must be known)."""
    size = shape[axis]
    if size is None:
        raise BuildError(f"nnef export: {base} needs the size of axis {axis} of shape {list(shape)}, which is dynamic")
    return int(size)


def _known(shape: Shape, base: str) -> list[int]:
    """Every size of a shape without a batch axis (a constant's), each known."""
    return [known_size(shape, axis, base) for axis in range(len(shape))]
FloatOp = Callable[[Emitter, str, list[str], dict[str, Any], list[Shape], str], list[str]]
FLOAT_OPS: Registry[FloatOp] = Registry("float op exporter", "the nnef target")


def emits(*names: str) -> Callable[[FloatOp], FloatOp]:
    return FLOAT_OPS.register(*names)


def emit_float(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape], base: str,
               where: str) -> list[str]:
    """The NNEF outputs of IR op `op`; BuildError naming `where` when NNEF has no spelling for it."""
    if op not in FLOAT_OPS:
        raise BuildError(f"nnef export: {where} runs op {op!r}, which the NNEF exporter cannot express; "
                         f"it can: {', '.join(FLOAT_OPS.names())}")
    return FLOAT_OPS[op](e, op, inputs, OPS[op].resolve(attrs), shapes, base)


def padding(pads: list[int]) -> str:
    """ONNX-style [begin..., end...] pads as NNEF's [(begin, end), ...]."""
    half = len(pads) // 2
    return "[" + ", ".join(f"({pads[a]}, {pads[a + half]})" for a in range(half)) + "]"


_DIRECT = {"identity": "copy", "relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh",
           "add": "add", "sub": "sub", "mul": "mul", "div": "div"}


@emits(*_DIRECT)
def _direct(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape], base: str) -> list[str]:
    return [e.call(base, _DIRECT[op], *inputs)]


@emits("leaky_relu")
def _leaky_relu(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape],
                base: str) -> list[str]:
    return [e.call(base, "leaky_relu", inputs[0], alpha=number(attrs["alpha"]))]


@emits("clip", "relu6")
def _clip(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape], base: str) -> list[str]:
    low, high = (0.0, 6.0) if op == "relu6" else (attrs["min"], attrs["max"])
    value = inputs[0]
    if low is not None:
        value = e.call(f"{base}_low" if high is not None else base, "max", value, number(low))
    if high is not None:
        value = e.call(base, "min", value, number(high))
    return [value]


@emits("hard_sigmoid")
def _hard_sigmoid(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape],
                  base: str) -> list[str]:
    scaled = e.call(f"{base}_scaled", "mul", inputs[0], number(attrs["alpha"]))
    shifted = e.call(f"{base}_shifted", "add", scaled, number(attrs["beta"]))
    return [e.call(base, "clamp", shifted, "0.0", "1.0")]


@emits("hard_swish")
def _hard_swish(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape],
                base: str) -> list[str]:
    shifted = e.call(f"{base}_shifted", "add", inputs[0], "3.0")
    gate = e.call(f"{base}_gate", "mul", e.call(f"{base}_relu6", "clamp", shifted, "0.0", "6.0"), number(1 / 6))
    return [e.call(base, "mul", inputs[0], gate)]


def _erf(e: Emitter, z: str, base: str) -> str:
    """erf(z) = sign(z) (1 - poly(t) exp(-z^2)), t = 1 / (1 + p |z|): dabuild's `_erf`, step for step."""
    t = e.call(f"{base}_t", "div", "1.0", e.call(f"{base}_tden", "add", e.call(f"{base}_pz", "mul",
                                                                        e.call(f"{base}_abs", "abs", z),
                                                                        number(0.3275911)), "1.0"))
    poly = number(1.061405429)
    for coefficient in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        poly = e.call(f"{base}_poly", "add", e.call(f"{base}_pt", "mul", t, poly), number(coefficient))
    poly = e.call(f"{base}_poly", "mul", t, poly)
    decay = e.call(f"{base}_decay", "exp", e.call(f"{base}_nsq", "neg", e.call(f"{base}_sq", "sqr", z)))
    magnitude = e.call(f"{base}_mag", "sub", "1.0", e.call(f"{base}_tail", "mul", poly, decay))
    return e.call(f"{base}_erf", "mul", e.call(f"{base}_sign", "sign", z), magnitude)


@emits("gelu")
def _gelu(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape], base: str) -> list[str]:
    x = inputs[0]
    if attrs["approximate"] == "tanh":
        cube = e.call(f"{base}_cube", "mul", e.call(f"{base}_sq", "sqr", x), x)
        total = e.call(f"{base}_total", "add", x, e.call(f"{base}_term", "mul", cube, number(0.044715)))
        inner = e.call(f"{base}_tanh", "tanh", e.call(f"{base}_arg", "mul", total, number(math.sqrt(2 / math.pi))))
    else:
        inner = _erf(e, e.call(f"{base}_arg", "mul", x, number(1 / math.sqrt(2))), base)
    half = e.call(f"{base}_half", "mul", e.call(f"{base}_one_plus", "add", inner, "1.0"), "0.5")
    return [e.call(base, "mul", x, half)]


def _with_activation(e: Emitter, attrs: dict[str, Any], value: str, shape: Shape, base: str) -> str:
    """A conv/dense result through its fused activation, if any."""
    if attrs["activation"] == "none":
        return value
    return emit_float(e, attrs["activation"], [value], attrs["activation_attrs"], [shape], base,
                      f"the fused {attrs['activation']} of {base}")[0]


@emits("dense")
def _dense(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape], base: str) -> list[str]:
    """x @ W (+ b): matmul on the last axis, whatever the rank."""
    product = e.call(f"{base}_product" if len(inputs) > 2 else f"{base}_linear", "matmul", inputs[0], inputs[1])
    value = e.call(f"{base}_linear", "add", product, inputs[2]) if len(inputs) > 2 else product
    return [_with_activation(e, attrs, value, shapes[0], base)]


@emits("matmul")
def _matmul(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape], base: str) -> list[str]:
    return [e.call(base, "matmul", *inputs)]


@emits("conv")
def _conv(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape], base: str) -> list[str]:
    spatial = len(shapes[0]) - 2
    value = e.call(f"{base}_linear", "conv", *inputs[:3], border="'constant'",
                   padding=padding(attrs["pads"] or [0] * (2 * spatial)),
                   stride=integers(attrs["strides"] or [1] * spatial),
                   dilation=integers(attrs["dilations"] or [1] * spatial), groups=str(attrs["groups"]))
    return [_with_activation(e, attrs, value, shapes[0], base)]


def _window(kind: str, e: Emitter, inputs: list[str], attrs: dict[str, Any], shape: Shape, base: str) -> str:
    """max_pool / avg_pool over the spatial axes: NNEF windows span every axis, so N and C get size 1.

    NNEF rounds window counts down; ceil_mode's extra window comes from padding the end by the overhang,
    which border 'ignore' leaves out of the max and the average, as ONNX does.
    """
    pool = OPS.typed(kind, Pool)
    kernel, strides, pads, dilations = pool.geometry(attrs)
    border = "'ignore'" if kind == "max_pool" or not attrs["count_include_pad"] else "'constant'"
    if attrs["ceil_mode"]:
        if border != "'ignore'":
            raise BuildError(f"nnef export: {base} averages with count_include_pad in ceil_mode, whose overhang "
                             "NNEF's padding would count")
        (out, _), = pool.infer([TensorSpec("x", shape)], attrs)
        spatial = len(kernel)
        for axis in range(spatial):
            reach = (known_size(out, 2 + axis, base) - 1) * strides[axis] + dilations[axis] * (kernel[axis] - 1) + 1
            pads = [*pads]
            pads[spatial + axis] += max(0, reach - (known_size(shape, 2 + axis, base) + pads[axis] + pads[spatial + axis]))
    return e.call(base, kind, inputs[0], size=integers([1, 1, *kernel]), border=border,
                  padding=padding([0, 0, *pads[:len(kernel)], 0, 0, *pads[len(kernel):]]),
                  stride=integers([1, 1, *strides]), dilation=integers([1, 1, *dilations]))


@emits("max_pool", "avg_pool")
def _pool(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape], base: str) -> list[str]:
    return [_window(op, e, inputs, attrs, shapes[0], base)]


_REDUCERS = {"reduce_mean": "mean_reduce", "reduce_sum": "sum_reduce", "reduce_max": "max_reduce"}


def reduce(e: Emitter, fragment: str, value: str, axes: list[int], keepdims: bool, base: str) -> str:
    """NNEF reductions keep the reduced axes (size 1); squeeze them away unless `keepdims`."""
    kept = e.call(base if keepdims else f"{base}_kept", fragment, value, axes=integers(axes))
    return kept if keepdims else e.call(base, "squeeze", kept, axes=integers(axes))


@emits(*_REDUCERS)
def _reduce(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape], base: str) -> list[str]:
    return [reduce(e, _REDUCERS[op], inputs[0], list(OPS.typed(op, Reduce).axes(len(shapes[0]), attrs)), attrs["keepdims"], base)]


@emits("global_avg_pool")
def _global_avg_pool(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape],
                     base: str) -> list[str]:
    return [reduce(e, "mean_reduce", inputs[0], list(range(2, len(shapes[0]))), True, base)]


@emits("softmax")
def _softmax(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape],
             base: str) -> list[str]:
    return [e.call(base, "softmax", inputs[0], axes=integers([attrs["axis"] % len(shapes[0])]))]


@emits("concat")
def _concat(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape], base: str) -> list[str]:
    return [e.call(base, "concat", "[" + ", ".join(inputs) + "]", axis=str(attrs["axis"] % len(shapes[0])))]


@emits("reshape")
def _reshape(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape], base: str) -> list[str]:
    """NNEF's reshape reads 0 (copy) and -1 (infer) as dabuild's does."""
    return [e.call(base, "reshape", inputs[0], shape=integers(attrs["shape"]))]


@emits("flatten")
def _flatten(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape],
             base: str) -> list[str]:
    """To 2-D at `axis`: the trailing size is known per sample, the leading one (with the batch) inferred."""
    axis = attrs["axis"] % len(shapes[0])
    if axis == 0:
        return [e.call(base, "reshape", inputs[0], shape="[1, -1]")]
    trailing = math.prod(known_size(shapes[0], a, base) for a in range(axis, len(shapes[0])))
    return [e.call(base, "reshape", inputs[0], shape=integers([-1, trailing]))]


@emits("batch_norm")
def _batch_norm(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape],
                base: str) -> list[str]:
    return [e.call(base, "batch_normalization", inputs[0], inputs[3], inputs[4], inputs[2], inputs[1],
                   epsilon=number(attrs["epsilon"]))]


@emits("transpose")
def _transpose(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape],
               base: str) -> list[str]:
    perm = attrs["perm"] if attrs["perm"] is not None else list(reversed(range(len(shapes[0]))))
    return [e.call(base, "transpose", inputs[0], axes=integers(perm))]


@emits("squeeze", "unsqueeze")
def _squeeze(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape], base: str) -> list[str]:
    if attrs["axes"] is None:
        raise BuildError(f"nnef export: {base} squeezes without naming its axes")
    rank = len(shapes[0]) + (len(attrs["axes"]) if op == "unsqueeze" else 0)
    return [e.call(base, op, inputs[0], axes=integers(sorted(a % rank for a in attrs["axes"])))]


@emits("slice")
def _slice(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape], base: str) -> list[str]:
    """ONNX-style bounds, resolved against the known per-sample shape into NNEF's begin/end/stride; an axis
    walked backwards (a flip) is a gather of the indices the IR op picks."""
    axes, begins, ends, strides = [], [], [], []
    value = inputs[0]
    slicer = OPS.typed("slice", Slice)
    for axis, start, end, step in slicer.plan(len(shapes[0]), attrs):
        if axis == 0:
            raise BuildError(f"nnef export: {base} slices the batch axis")
        size = known_size(shapes[0], axis, base)
        if step < 0:
            picked = slicer.run([np.arange(size)[None]], {"starts": [start], "ends": [end], "axes": [1],
                                                                 "steps": [step]})[0][0]
            value = e.call(f"{base}_reversed{axis}", "tract_core_gather", value,
                           e.variable(f"{base}_indices{axis}", picked.astype(np.int64)), axis=str(axis))
            continue
        start, end = (min(max(v + size if v < 0 else v, 0), size) for v in (start, end))
        axes.append(axis)
        begins.append(start)
        ends.append(max(end, start))
        strides.append(step)
    if not axes:
        return [value]
    return [e.call(base, "slice", value, axes=integers(axes), begin=integers(begins), end=integers(ends),
                   stride=integers(strides))]


@emits("split")
def _split(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape], base: str) -> list[str]:
    axis = attrs["axis"] % len(shapes[0])
    if axis == 0:
        raise BuildError(f"nnef export: {base} splits the batch axis")
    offsets = [0, *accumulate(attrs["sizes"])]
    return [e.call(f"{base}_{index}", "slice", inputs[0], axes=integers([axis]), begin=integers([begin]),
                   end=integers([end]), stride="[1]")
            for index, (begin, end) in enumerate(zip(offsets, offsets[1:]))]


@emits("pad")
def _pad(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape], base: str) -> list[str]:
    border = {"constant": "'constant'", "reflect": "'reflect'", "edge": "'replicated'"}[attrs["mode"]]
    return [e.call(base, "pad", inputs[0], padding=padding(attrs["pads"]), border=border,
                   value=number(attrs["value"]))]


# ---------------------------------------------------------------- the ops of issue 10


def aligned(e: Emitter, value: str, shape: Shape, rank: int, base: str) -> str:
    """`value` reshaped to `rank` axes by leading 1s: NNEF broadcasts singleton axes, but aligns shapes from the
    left, numpy from the right."""
    if len(shape) >= rank:
        return value
    return e.call(f"{base}_aligned", "reshape", value, shape=integers([1] * (rank - len(shape)) + _known(shape, base)))


def _exponential_unit(e: Emitter, x: str, alpha: float, base: str) -> str:
    """x if x > 0 else alpha * (exp(x) - 1), exp of min(x, 0) so it never overflows."""
    negative = e.call(f"{base}_expm1", "sub", e.call(f"{base}_exp", "exp", e.call(f"{base}_neg_part", "min", x, "0.0")),
                      "1.0")
    return e.call(f"{base}_unit", "select", e.call(f"{base}_positive", "gt", x, "0.0"), x,
                  e.call(f"{base}_scaled", "mul", negative, number(alpha)))


@emits("elu", "selu")
def _elu(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape], base: str) -> list[str]:
    unit = _exponential_unit(e, inputs[0], attrs["alpha"], base)
    return [unit if op == "elu" else e.call(base, "mul", unit, number(attrs["gamma"]))]


@emits("softplus")
def _softplus(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape],
              base: str) -> list[str]:
    """max(x, 0) + log(1 + exp(-|x|)): the same function as log(1 + exp(x)) without overflow."""
    x = inputs[0]
    tail = e.call(f"{base}_tail", "log", e.call(f"{base}_one_plus", "add", e.call(
        f"{base}_exp", "exp", e.call(f"{base}_neg", "neg", e.call(f"{base}_abs", "abs", x))), "1.0"))
    return [e.call(base, "add", e.call(f"{base}_relu", "max", x, "0.0"), tail)]


@emits("softsign")
def _softsign(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape],
              base: str) -> list[str]:
    return [e.call(base, "div", inputs[0], e.call(f"{base}_den", "add", e.call(f"{base}_abs", "abs", inputs[0]), "1.0"))]


_UNARY = {"abs": "abs", "neg": "neg", "exp": "exp", "log": "log", "sqrt": "sqrt"}


@emits(*_UNARY)
def _unary(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape], base: str) -> list[str]:
    return [e.call(base, _UNARY[op], inputs[0])]


@emits("reciprocal")
def _reciprocal(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape],
                base: str) -> list[str]:
    """1 / x (tract has no NNEF rcp)."""
    return [e.call(base, "div", "1.0", inputs[0])]


@emits("pow")
def _pow(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape], base: str) -> list[str]:
    if attrs["exponent"] == 2:
        return [e.call(base, "sqr", inputs[0])]
    return [e.call(base, "pow", inputs[0], number(attrs["exponent"]))]


@emits("erf")
def _erf_op(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape], base: str) -> list[str]:
    return [_erf(e, inputs[0], base)]


@emits("max", "min")
def _extremum(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape],
              base: str) -> list[str]:
    rank = max(len(shape) for shape in shapes)
    a, b = (aligned(e, name, shape, rank, f"{base}_{i}") for i, (name, shape) in enumerate(zip(inputs, shapes)))
    return [e.call(base, op, a, b)]


@emits("prelu")
def _prelu(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape], base: str) -> list[str]:
    x, slope = inputs[0], aligned(e, inputs[1], shapes[1], len(shapes[0]), base)
    return [e.call(base, "select", e.call(f"{base}_negative", "lt", x, "0.0"), e.call(f"{base}_scaled", "mul", x, slope),
                   x)]


@emits("where")
def _where(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape], base: str) -> list[str]:
    """The condition arrives as a float tensor of 0 and 1 (NNEF variables hold numbers)."""
    rank = max(len(shape) for shape in shapes)
    condition, x, y = (aligned(e, name, shape, rank, f"{base}_{i}") for i, (name, shape) in enumerate(zip(inputs, shapes)))
    return [e.call(base, "select", e.call(f"{base}_condition", "ne", condition, "0.0"), x, y)]


@emits("log_softmax")
def _log_softmax(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape],
                 base: str) -> list[str]:
    """x - max - log(sum(exp(x - max))), as dabuild's kernel."""
    axes = integers([attrs["axis"] % len(shapes[0])])
    shifted = e.call(f"{base}_shifted", "sub", inputs[0], e.call(f"{base}_max", "max_reduce", inputs[0], axes=axes))
    total = e.call(f"{base}_sum", "sum_reduce", e.call(f"{base}_exp", "exp", shifted), axes=axes)
    return [e.call(base, "sub", shifted, e.call(f"{base}_log", "log", total))]


def _standardize(e: Emitter, x: str, axes: list[int], epsilon: float, base: str) -> str:
    """(x - mean) / sqrt(var + epsilon) over `axes`."""
    centred = e.call(f"{base}_centred", "sub", x, e.call(f"{base}_mean", "mean_reduce", x, axes=integers(axes)))
    variance = e.call(f"{base}_variance", "mean_reduce", e.call(f"{base}_square", "sqr", centred), axes=integers(axes))
    deviation = e.call(f"{base}_deviation", "sqrt", e.call(f"{base}_shifted", "add", variance, number(epsilon)))
    return e.call(f"{base}_standard", "div", centred, deviation)


def _channel_affine(e: Emitter, value: str, scale: str, bias: str, rank: int, base: str) -> str:
    """value * scale + bias, scale and bias (C,) broadcast along axis 1."""
    shape = integers([1, -1, *[1] * (rank - 2)])
    scaled = e.call(f"{base}_scaled", "mul", value, e.call(f"{base}_scale", "reshape", scale, shape=shape))
    return e.call(base, "add", scaled, e.call(f"{base}_bias", "reshape", bias, shape=shape))


@emits("instance_norm")
def _instance_norm(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape],
                   base: str) -> list[str]:
    rank = len(shapes[0])
    standard = _standardize(e, inputs[0], list(range(2, rank)), attrs["epsilon"], base)
    return [_channel_affine(e, standard, inputs[1], inputs[2], rank, base)]


@emits("group_norm")
def _group_norm(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape],
                base: str) -> list[str]:
    rank, groups = len(shapes[0]), attrs["groups"]
    grouped = e.call(f"{base}_grouped", "reshape", inputs[0], shape=integers([0, groups, -1]))
    standard = _standardize(e, grouped, [2], attrs["epsilon"], base)
    restored = e.call(f"{base}_restored", "reshape", standard, shape=integers([0, *shapes[0][1:]]))  # type: ignore[list-item]
    return [_channel_affine(e, restored, inputs[1], inputs[2], rank, base)]


@emits("layer_norm")
def _layer_norm(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape],
                base: str) -> list[str]:
    rank = len(shapes[0])
    axis = attrs["axis"] % rank
    value = _standardize(e, inputs[0], list(range(axis, rank)), attrs["epsilon"], base)
    for index, fragment in ((1, "mul"), (2, "add")):
        if len(inputs) > index:
            value = e.call(f"{base}_{fragment}" if index < len(inputs) - 1 else base, fragment, value,
                           aligned(e, inputs[index], shapes[index], rank, f"{base}_{index}"))
    return [value]


@emits("lrn")
def _lrn(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape], base: str) -> list[str]:
    """x / (bias + alpha / size * window sum of x**2 across channels) ** beta; the window sum is a 1x1 conv
    with a banded (C, C) matrix of ones."""
    channels = int(shapes[0][1])  # type: ignore[arg-type]
    size, rank = attrs["size"], len(shapes[0])
    before = (size - 1) // 2
    band = np.array([[1.0 if -before <= j - i <= size - 1 - before else 0.0 for j in range(channels)]
                     for i in range(channels)], np.float32) * np.float32(attrs["alpha"] / size)
    weights = e.variable(f"{base}_band", band.reshape(channels, channels, *[1] * (rank - 2)))
    total = e.call(f"{base}_window", "conv", e.call(f"{base}_square", "sqr", inputs[0]), weights, "0.0",
                   border="'constant'", padding=padding([0] * (2 * (rank - 2))), stride=integers([1] * (rank - 2)),
                   dilation=integers([1] * (rank - 2)), groups="1")
    scale = e.call(f"{base}_scale", "pow", e.call(f"{base}_shifted", "add", total, number(attrs["bias"])),
                   number(attrs["beta"]))
    return [e.call(base, "div", inputs[0], scale)]


@emits("conv_transpose")
def _conv_transpose(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape],
                    base: str) -> list[str]:
    """NNEF deconv; an output padding beyond the end pad is added as zeros after it (bias added last)."""
    spatial = len(shapes[0]) - 2
    pads = list(attrs["pads"] or [0] * (2 * spatial))
    extra = list(attrs["output_padding"] or [0] * spatial)
    begins, ends = pads[:spatial], pads[spatial:]
    trimmed = [max(end - more, 0) for end, more in zip(ends, extra)]
    grown = [max(more - end, 0) for end, more in zip(ends, extra)]
    groups, (channels, group_out, *kernel) = attrs["groups"], _known(shapes[1], base)
    # tract reads the filter as (O, C/groups, *kernel), the layout of the conv it transposes.
    filter_ = e.call(f"{base}_filter", "reshape", e.call(
        f"{base}_filter_groups", "transpose", e.call(f"{base}_filter_split", "reshape", inputs[1], shape=integers(
            [groups, channels // groups, group_out, *kernel])), axes=integers([0, 2, 1, *range(3, 3 + spatial)])),
        shape=integers([groups * group_out, channels // groups, *kernel]))
    value = e.call(f"{base}_deconv", "deconv", inputs[0], filter_, "0.0", border="'constant'",
                   padding=padding(begins + trimmed), stride=integers(attrs["strides"] or [1] * spatial),
                   dilation=integers(attrs["dilations"] or [1] * spatial), groups=str(attrs["groups"]))
    if any(grown):
        value = e.call(f"{base}_grown", "pad", value, padding=padding([0, 0, *[0] * spatial, 0, 0, *grown]),
                       border="'constant'", value="0.0")
    if len(inputs) > 2:
        value = e.call(base, "add", value, e.call(f"{base}_bias", "reshape", inputs[2],
                                                  shape=integers([1, -1, *[1] * spatial])))
    return [value]


@emits("resize")
def _resize(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape], base: str) -> list[str]:
    """Each resized axis as a matmul with its (in, out) interpolation matrix: one-hot columns for nearest,
    the two linear weights for linear, computed by dabuild's own resize kernel on an identity."""
    value, rank = inputs[0], len(shapes[0])
    for axis in range(1, rank):
        size, out = int(shapes[0][axis]), int(attrs["sizes"][axis])  # type: ignore[arg-type]
        if size == out and attrs["scales"][axis] == 1:
            continue
        single = {**attrs, "sizes": [1, out], "scales": [1.0, attrs["scales"][axis]]}
        matrix = OPS["resize"].run([np.eye(size, dtype=np.float32)], single)[0]  # (in, out): row i = input i's weights
        perm = [*[a for a in range(rank) if a != axis], axis]
        moved = e.call(f"{base}_last{axis}", "transpose", value, axes=integers(perm)) if axis != rank - 1 else value
        matrix = matrix.reshape(*[1] * (rank - 2), *matrix.shape)  # tract's matmul wants equal ranks
        product = e.call(f"{base}_axis{axis}", "matmul", moved, e.variable(f"{base}_matrix{axis}", matrix))
        back = list(np.argsort(perm))
        value = e.call(f"{base}_back{axis}", "transpose", product, axes=integers(back)) if axis != rank - 1 else product
    return [value if value != inputs[0] else e.call(base, "copy", value)]


@emits("gather")
def _gather(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape], base: str) -> list[str]:
    axis = attrs["axis"] % len(shapes[0])
    if axis == 0:
        raise BuildError(f"nnef export: {base} gathers along the batch axis")
    indices = np.asarray(attrs["indices"], np.int64) % known_size(shapes[0], axis, base)
    return [e.call(base, "tract_core_gather", inputs[0], e.variable(f"{base}_indices", indices), axis=str(axis))]


@emits("tile", "expand")
def _tile(e: Emitter, op: str, inputs: list[str], attrs: dict[str, Any], shapes: list[Shape], base: str) -> list[str]:
    """expand is a tile of its size-1 axes (after adding leading axes)."""
    value, shape = inputs[0], shapes[0]
    if op == "tile":
        repeats = list(attrs["repeats"])
    else:
        target = OPS["expand"].infer([TensorSpec(base, shape)], attrs)[0][0]
        value = aligned(e, value, shape, len(target), base)
        shape = (*[1] * (len(target) - len(shape)), *shape)
        repeats = [1 if t is None or t == d else int(t) for d, t in zip(shape, target)]
    if repeats[0] != 1:
        raise BuildError(f"nnef export: {base} repeats the batch axis")
    return [e.call(base, "tile", value, repeats=integers(repeats))]
