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

from dabuild.errors import BuildError
from dabuild.ir.graph import TensorSpec
from dabuild.ir.ops import OPS
from dabuild.targets.nnef.emitter import Emitter, integers, number
from dabuild.registry import Registry

Shape = tuple[int | None, ...]  # batch-first, None for the batch
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
    t = e.call(f"{base}_t", "rcp", e.call(f"{base}_tden", "add", e.call(f"{base}_pz", "mul",
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
    kernel, strides, pads, dilations = OPS[kind].geometry(attrs)
    border = "'ignore'" if kind == "max_pool" or not attrs["count_include_pad"] else "'constant'"
    if attrs["ceil_mode"]:
        if border != "'ignore'":
            raise BuildError(f"nnef export: {base} averages with count_include_pad in ceil_mode, whose overhang "
                             "NNEF's padding would count")
        (out, _), = OPS[kind].infer([TensorSpec("x", shape)], attrs)
        spatial = len(kernel)
        for axis in range(spatial):
            reach = (out[2 + axis] - 1) * strides[axis] + dilations[axis] * (kernel[axis] - 1) + 1
            pads = [*pads]
            pads[spatial + axis] += max(0, reach - (shape[2 + axis] + pads[axis] + pads[spatial + axis]))
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
    return [reduce(e, _REDUCERS[op], inputs[0], list(OPS[op].axes(len(shapes[0]), attrs)), attrs["keepdims"], base)]


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
    trailing = math.prod(int(d) for d in shapes[0][axis:])  # type: ignore[arg-type]
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
    """ONNX-style bounds, resolved against the known per-sample shape into NNEF's begin/end/stride."""
    axes, begins, ends, strides = [], [], [], []
    for axis, start, end, step in OPS["slice"].plan(len(shapes[0]), attrs):
        if axis == 0 or step < 1:
            raise BuildError(f"nnef export: {base} slices the batch axis or with a negative step")
        size = int(shapes[0][axis])  # type: ignore[arg-type]
        start, end = (min(max(v + size if v < 0 else v, 0), size) for v in (start, end))
        axes.append(axis), begins.append(start), ends.append(max(end, start)), strides.append(step)
    return [e.call(base, "slice", inputs[0], axes=integers(axes), begin=integers(begins), end=integers(ends),
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
