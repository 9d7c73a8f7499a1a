"""QGraph layers as TFLite builtin operators, one small function per layer op (the tflite target's op table).

`WRITERS` is the table: its names are the layer types the target writes (`TfliteTarget.layer_types`,
docs/ops.md). A writer reads its inputs from the FlatFile in the layout its operator needs and binds its
outputs. TFLite's quantization conventions: weights symmetric int8 per output channel (axis 0 of a conv's
OHWI and a fully connected's (out, in) weight, axis 3 of a depthwise conv's 1HWO), biases int32 (int64
under int16 activations) with scale s_in * s_w and zero point 0, activations per tensor.

What TFLM computes from the file must be what the reference computes from the QGraph; the QGraph the target
writes is already the one TFLM derives (`integers.as_tflm`). A layer whose clamp bounds no fused activation
states is written with a MAXIMUM/MINIMUM pair after it; a clamp layer after a conv, fully connected, add or
mul that only it reads is fused into that operator where a fused activation states the joint bounds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dabuild.errors import BuildError
from dabuild.qir.layers.elementwise import QClamp, QLookup
from dabuild.qir.layers.linear import QConv, QConvTranspose, QDense, QWeighted
from dabuild.qir.layers.pool import QMean
from dabuild.qir.layers.shape import QConcat, QSelection
from dabuild.qir.layers.softmax import OUTPUT_PARAMS, WIDE_OUTPUT_PARAMS, QSoftmax
from dabuild.qir.qgraph import QLayer, QuantParams
from dabuild.registry import Registry
from dabuild.targets.tflite.flatfile import NHWC, PLAIN, FlatFile, file_axis, permutation
from dabuild.targets.tflm_functions import OUTPUT, hard_swish_exponent, round_away

Writer = Callable[[FlatFile, Any], None]
WRITERS: Registry[Writer] = Registry("layer writer", "the tflite target")
SAME, VALID = 0, 1
BUILTINS = {"sigmoid": "LOGISTIC", "tanh": "TANH", "hard_swish": "HARD_SWISH"}   # table activations TFLite has
FUSED_CODES = {"NONE": 0, "RELU": 1, "RELU_N1_TO_1": 2, "RELU6": 3}
FUSING_OPTIONS = ("Conv2DOptions", "DepthwiseConv2DOptions", "FullyConnectedOptions", "AddOptions", "SubOptions",
                  "MulOptions")   # the operators whose fused activation a clamp after them may set


def writes(*ops: str) -> Callable[[Writer], Writer]:
    return WRITERS.register(*ops)


def write_layer(file: FlatFile, layer: QLayer) -> None:
    if layer.op not in WRITERS:
        raise BuildError(f"tflite export: layer {layer.name!r} ({layer.op}) has no TFLite operator")
    WRITERS[layer.op](file, layer)


# ---------------------------------------------------------------------- fused activations


def fused_bounds(code: str, params: QuantParams) -> tuple[int, int]:
    """The clamp TFLite's CalculateActivationRangeQuantized derives for a fused activation (float32 math)."""
    scale = np.float32(params.scale)

    def quantize(real: float) -> int:
        return params.zero_point + round_away(float(np.float32(real) / scale))

    low, high = {"NONE": (None, None), "RELU": (0.0, None), "RELU6": (0.0, 6.0), "RELU_N1_TO_1": (-1.0, 1.0)}[code]
    return (params.qmin if low is None else max(params.qmin, quantize(low)),
            params.qmax if high is None else min(params.qmax, quantize(high)))


def fused_code(low: int, high: int, params: QuantParams) -> str | None:
    """The fused activation whose clamp is [low, high], or None."""
    return next((code for code in FUSED_CODES if fused_bounds(code, params) == (low, high)), None)


def finish_clamped(file: FlatFile, write: Callable[[int, int], None], name: str, layout: str, low: int,
                   high: int, fuses: bool = True) -> None:
    """Write an operator (`write(output index, fused code)`) whose result is clamped to [low, high]: fused
    where a code states the bounds (and the operator `fuses`), else into a tensor of its own with MAXIMUM and
    MINIMUM after it."""
    params = file.params(name)
    code = fused_code(low, high, params) if fuses else None
    if code is not None:
        output = file.activation(name, layout)
        write(output, FUSED_CODES[code])
        file.place(name, output, layout)
        return
    raw = file.activation(name, layout, suffix="/unclamped")
    write(raw, FUSED_CODES["NONE"])
    file.place(name, _clamp(file, name, raw, layout, low, high), layout)


def _clamp(file: FlatFile, name: str, source: int, layout: str, low: int, high: int) -> int:
    """MAXIMUM with low then MINIMUM with high (each only where it clamps anything) of file tensor `source`."""
    params = file.params(name)
    dtype = file.dtype(params)
    for builtin, bound, skip in (("MAXIMUM", low, params.qmin), ("MINIMUM", high, params.qmax)):
        if bound == skip:
            continue
        scalar = file.tensor(f"{name}/{builtin.lower()}", [1], dtype, params, np.array([bound]))
        output = file.activation(name, layout, suffix=f"/{builtin.lower()}")
        file.operator(builtin, [source, scalar], [output], "MaximumMinimumOptions")
        source = output
    return source


@writes("clamp", "relu")
def clamp(file: FlatFile, layer: QClamp) -> None:
    """Nothing where the input never leaves [low, high]; fused into the operator writing the input where only
    this layer reads it and a fused activation states the joint bounds; else MAXIMUM/MINIMUM."""
    [name], [output] = layer.inputs, layer.outputs
    params = file.params(name)
    placed = file.layouts(name)[0] if file.layouts(name) else None
    producer = file.producers.get(placed.index) if placed is not None else None
    bounds = file.bounds.get(placed.index, (params.qmin, params.qmax)) if placed is not None else (params.qmin,
                                                                                                   params.qmax)
    low, high = max(bounds[0], layer.low), min(bounds[1], layer.high)
    if placed is not None and (low, high) == bounds:
        file.place(output, placed.index, placed.layout)
        return
    fusing = {getattr(file.s.BuiltinOptions, options) for options in FUSING_OPTIONS}
    fusable = (producer is not None and producer.builtinOptionsType in fusing
               and producer.builtinOptions.fusedActivationFunction == FUSED_CODES["NONE"]
               and file.readers.get(name) == 1 and len(file.layouts(name)) == 1)
    code = fused_code(low, high, params)
    if placed is not None and producer is not None and fusable and code is not None:
        producer.builtinOptions.fusedActivationFunction = FUSED_CODES[code]
        file.bounds[placed.index] = (low, high)
        file.clamped.add(name)
        file.place(output, placed.index, placed.layout)
        return
    layout = placed.layout if placed is not None else PLAIN
    file.place(output, _clamp(file, output, file.value(name, layout), layout, layer.low, layer.high), layout)


# ---------------------------------------------------------------------- convolution and fully connected


def _window_padding(file: FlatFile, layer: Any, name: str, kernel: list[int], strides: list[int],
                    dilations: list[int], pads: list[int], pad_value: int) -> tuple[int, int]:
    """The input (NHWC) and TFLite padding of a 2-D window: SAME or VALID where the pads are TFLite's, else a
    PADV2 with `pad_value` first and VALID."""
    source = file.value(name, NHWC)
    height, width = (1, *file.qgraph.tensors[name].shape[1:])[-2:]   # a 1-D window: unit height
    if not any(pads):
        return source, VALID
    same = []
    for size, k, s, d in zip((height, width), kernel, strides, dilations):
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        same.append((total // 2, total - total // 2))
    if [same[0][0], same[1][0], same[0][1], same[1][1]] == list(pads):
        return source, SAME
    top, left, bottom, right = pads
    params = file.params(name)
    dtype = file.dtype(params)
    padded_shape = [1, height + top + bottom, width + left + right, file.qgraph.tensors[name].shape[0]]
    padded = file.tensor(f"{name}/padded", padded_shape, dtype, params)
    paddings = file.ints(f"{layer.name}/paddings", [[0, 0], [top, bottom], [left, right], [0, 0]])
    value = file.tensor(f"{layer.name}/pad_value", [1], dtype, params, np.array([pad_value]))
    file.operator("PADV2", [source, paddings, value], [padded], "PadV2Options")
    return padded, VALID


def _bias(file: FlatFile, layer: QWeighted, input_params: QuantParams) -> int:
    """The int32 bias (int64 under int16 inputs) with scale s_in * s_w per channel, zero point 0."""
    dtype = "int64" if input_params.dtype == "int16" else "int32"
    if dtype == "int32" and np.abs(layer.bias.astype(np.int64)).max(initial=0) > 2**31 - 1:
        raise BuildError(f"layer {layer.name!r} ({layer.op}): its bias needs int64, which TFLite takes only "
                         "under int16 activations")
    scales = np.float64(np.float32(input_params.scale)) * layer.weight_scale.astype(np.float32).astype(np.float64)
    count = len(layer.bias)
    return file.tensor(f"{layer.name}/bias", [count], dtype, data=layer.bias,
                       scales=np.broadcast_to(scales, count), axis=0)


def _weights(file: FlatFile, layer: QWeighted, values: np.ndarray, axis: int) -> int:
    if layer.weight.dtype != np.int8:
        raise BuildError(f"layer {layer.name!r} ({layer.op}): TFLite takes int8 weights, not {layer.weight.dtype}")
    channels = values.shape[axis]
    return file.tensor(f"{layer.name}/weight", list(values.shape), "int8", data=values,
                       scales=np.broadcast_to(layer.weight_scale, channels), axis=axis)


@writes("conv")
def conv(file: FlatFile, layer: QConv) -> None:
    """CONV_2D (groups 1) or DEPTHWISE_CONV_2D (one group per input channel), NHWC; a 1-D conv as TensorFlow's
    converter writes a Conv1D: over [N, 1, L, C], its kernel, strides, dilations and pads of unit height."""
    [name], [output] = layer.inputs, layer.outputs
    if layer.weight.ndim not in (3, 4):
        raise BuildError(f"layer {layer.name!r} (conv): TFLite convolutions are 1-D or 2-D; this one has "
                         f"{layer.weight.ndim - 2} spatial axes")
    flat = layer.weight.ndim == 3
    weights = layer.weight[:, :, None, :] if flat else layer.weight   # (O, I, KH, KW)
    strides, dilations = ([1, *layer.strides], [1, *layer.dilations]) if flat else (layer.strides, layer.dilations)
    pads = [0, layer.pads[0], 0, layer.pads[1]] if flat else layer.pads
    out_channels, group_in, kernel_h, kernel_w = weights.shape
    channels = file.qgraph.tensors[name].shape[0]
    depthwise = layer.groups == channels and group_in == 1 and layer.groups > 1
    if layer.groups != 1 and not depthwise:
        raise BuildError(f"layer {layer.name!r} (conv): {layer.groups} groups; TFLite writes plain (1 group) "
                         "and depthwise (one group per input channel) convolutions")
    params = file.params(name)
    source, padding = _window_padding(file, layer, name, [kernel_h, kernel_w], strides, dilations, pads,
                                      params.zero_point)
    geometry = {"padding": padding, "strideH": strides[0], "strideW": strides[1],
                "dilationHFactor": dilations[0], "dilationWFactor": dilations[1]}
    if depthwise:
        weight = _weights(file, layer, weights.transpose(1, 2, 3, 0), 3)   # (1, KH, KW, O)
        builtin, options = "DEPTHWISE_CONV_2D", "DepthwiseConv2DOptions"
        geometry["depthMultiplier"] = out_channels // channels
    else:
        weight = _weights(file, layer, weights.transpose(0, 2, 3, 1), 0)   # OHWI
        builtin, options = "CONV_2D", "Conv2DOptions"
    bias = _bias(file, layer, params)

    def write(index: int, code: int) -> None:
        file.operator(builtin, [source, weight, bias], [index], options, fusedActivationFunction=code, **geometry)
        file.bounds[index] = (layer.output_min, layer.output_max)

    finish_clamped(file, write, output, NHWC, layer.output_min, layer.output_max)


@writes("conv_transpose")
def conv_transpose(file: FlatFile, layer: QConvTranspose) -> None:
    """TRANSPOSE_CONV (1 group, undilated, OHWI weights per channel on axis 0), its output shape an input: the
    pads must be what TFLite crops for that shape (VALID: none before; SAME: half of the total, the odd pixel
    after)."""
    [name], [output] = layer.inputs, layer.outputs
    if layer.weight.ndim != 4 or layer.groups != 1 or any(d != 1 for d in layer.dilations):
        raise BuildError(f"layer {layer.name!r} (conv_transpose): TFLite's transposed conv is 2-D, 1 group, "
                         "undilated")
    _, height, width = file.qgraph.tensors[name].shape
    out_channels, out_height, out_width = file.qgraph.tensors[output].shape
    kernel = layer.weight.shape[2:]
    padding = None
    for code in (VALID, SAME):
        before = []
        for size, out, k, s in zip((height, width), (out_height, out_width), kernel, layer.strides):
            expected = -(-out // s) if code == SAME else (out - k) // s + 1
            total = max((-(-out // s) - 1) * s + k - out, 0) if code == SAME else 0
            before.append(total // 2 if expected == size else None)
        if before == layer.pads[:2]:
            padding = code
            break
    if padding is None:
        raise BuildError(f"layer {layer.name!r} (conv_transpose): pads {layer.pads} are not what TFLite crops "
                         "(VALID or SAME) for its output shape")
    weight = _weights(file, layer, layer.weight.transpose(0, 2, 3, 1), 0)   # OHWI
    bias = _bias(file, layer, file.params(name))
    shape = file.ints(f"{layer.name}/output_shape", [1, out_height, out_width, out_channels])
    source = file.value(name, NHWC)

    def write(index: int, code: int) -> None:
        file.operator("TRANSPOSE_CONV", [shape, weight, source, bias], [index], "TransposeConvOptions",
                      padding=padding, strideH=layer.strides[0], strideW=layer.strides[1])
        file.bounds[index] = (layer.output_min, layer.output_max)

    params = file.params(output)
    low, high = layer.output_min, layer.output_max
    finish_clamped(file, write, output, NHWC, low, high, fuses=(low, high) == (params.qmin, params.qmax))


@writes("dense")
def dense(file: FlatFile, layer: QDense) -> None:
    """FULLY_CONNECTED over the last axis: weight (out, in); over rows of rank > 1 with keep_num_dims."""
    [name], [output] = layer.inputs, layer.outputs
    keep = len(file.qgraph.tensors[name].shape) > 1
    source = file.value(name, PLAIN)
    weight = _weights(file, layer, np.ascontiguousarray(layer.weight.T), 0)
    bias = _bias(file, layer, file.params(name))

    def write(index: int, code: int) -> None:
        file.operator("FULLY_CONNECTED", [source, weight, bias], [index], "FullyConnectedOptions",
                      fusedActivationFunction=code, keepNumDims=keep)
        file.bounds[index] = (layer.output_min, layer.output_max)

    finish_clamped(file, write, output, PLAIN, layer.output_min, layer.output_max)


# ---------------------------------------------------------------------- elementwise


def _common_layout(file: FlatFile, names: list[str], elementwise: bool = False) -> str:
    """The layout of the first run-time operand already written (plain for constants only); a rank-3 tensor's
    channels-last layout only for an `elementwise` operator (the others number axes by `permutation`, which
    that layout's unit height has no entry for)."""
    for name in names:
        if name not in file.qgraph.constants and file.layouts(name):
            layout = file.layouts(name)[0].layout
            return layout if elementwise or file.rank(name) != 3 else PLAIN
    return PLAIN


def _binary(builtin: str, options: str, **fields: Any) -> Writer:
    def write(file: FlatFile, layer: QLayer) -> None:
        [output] = layer.outputs
        rank = file.rank(output)
        layout = _common_layout(file, layer.inputs, elementwise=True)
        operands = [_constant_operand(file, name, layout, rank) if name in file.qgraph.constants
                    else file.value(name, layout) for name in layer.inputs]
        index = file.activation(output, layout)
        file.operator(builtin, operands, [index], options, fusedActivationFunction=0, **fields)
        file.place(output, index, layout)

    return write


def _constant_operand(file: FlatFile, name: str, layout: str, rank: int) -> int:
    """A constant operand broadcast to the other operand's `rank` (numpy's rule: trailing axes align)."""
    for placed in file.layouts(name):
        if placed.layout == layout:
            return placed.index
    return file.constant(name, file.qgraph.constants[name], layout, rank)


WRITERS.add("add", _binary("ADD", "AddOptions", potScaleInt16=False))
WRITERS.add("sub", _binary("SUB", "SubOptions", potScaleInt16=False))
WRITERS.add("mul", _binary("MUL", "MulOptions"))


def _requantized(file: FlatFile, name: str, layout: str, params: QuantParams, suffix: str) -> int:
    """`name` in `layout`, through a QUANTIZE to `params` where its own differ (what TFLM requantizes with)."""
    source = file.value(name, layout)
    if file.params(name) == params:
        return source
    index = file.activation(name, layout, params, suffix=suffix)
    file.operator("QUANTIZE", [source], [index], "QuantizeOptions")
    return index


@writes("concat")
def concat(file: FlatFile, layer: QConcat) -> None:
    """CONCATENATION of the inputs each requantized to the output's params (a QUANTIZE where they differ);
    one input: the QUANTIZE alone."""
    [output] = layer.outputs
    params = file.params(output)
    layout = _common_layout(file, layer.inputs)
    parts = [_requantized(file, name, layout, params, f"/to_{output}") for name in layer.inputs]
    if len(parts) == 1:
        file.place(output, parts[0], layout)
        return
    index = file.activation(output, layout)
    file.operator("CONCATENATION", parts, [index], "ConcatenationOptions",
                  axis=file_axis(layout, file.rank(output), layer.axis))
    file.place(output, index, layout)


@writes("softmax")
def softmax(file: FlatFile, layer: QSoftmax) -> None:
    """SOFTMAX (beta 1) over the last axis of the layout that puts the layer's axis last, int8 to int8 (output
    1/256, zero point -128) or int16 to int16 (TFLite's int16 softmax: input zero point 0, output 1/32768, 0)."""
    [name], [output] = layer.inputs, layer.outputs
    eight = file.params(name).dtype == "int8" and file.params(output) == OUTPUT_PARAMS
    sixteen = (layer.reciprocal_table is not None and file.params(name).dtype == "int16"
               and file.params(name).zero_point == 0 and file.params(output) == WIDE_OUTPUT_PARAMS)
    if not (eight or sixteen):
        raise BuildError(f"layer {layer.name!r} (softmax): the tflite target writes int8 softmax (output scale "
                         "1/256, zero point -128) and int16 softmax (input zero point 0, output scale 1/32768, "
                         "zero point 0); this one reads or writes another type")
    rank = file.rank(name)
    layout = next((layout for layout in (PLAIN, NHWC) if file_axis(layout, rank, layer.axis) == rank - 1), None)
    if layout is None:
        raise BuildError(f"layer {layer.name!r} (softmax): TFLite's softmax runs over the last axis; axis "
                         f"{layer.axis} is last in no layout")
    index = file.activation(output, layout)
    file.operator("SOFTMAX", [file.value(name, layout)], [index], "SoftmaxOptions", beta=1.0)
    file.place(output, index, layout)


@writes("lookup")
def lookup(file: FlatFile, layer: QLookup) -> None:
    """LOGISTIC or TANH (int8) at TFLite's fixed output params, and a QUANTIZE to the layer's where they
    differ; the reference's table is TFLM's own arithmetic (`functions.tflm_table`, via integers.as_tflm)."""
    [name], [output] = layer.inputs, layer.outputs
    if layer.function == "hard_swish" and file.params(name).dtype == file.params(output).dtype == "int8":
        if hard_swish_exponent(file.params(name).scale, file.params(output).scale) > 0:
            raise BuildError(f"layer {layer.name!r} (lookup): hard_swish's output scale is below 1/128 of its "
                             "input's, which TFLite's HARD_SWISH refuses")
        layout = _common_layout(file, [name], elementwise=True)
        index = file.activation(output, layout)
        file.operator("HARD_SWISH", [file.value(name, layout)], [index])
        file.place(output, index, layout)
        return
    if layer.function not in BUILTINS or file.params(name).dtype != "int8":
        raise BuildError(f"layer {layer.name!r} (lookup): a table of {layer.function} over "
                         f"{file.params(name).dtype}; the tflite target writes int8 sigmoid (LOGISTIC) and tanh (TANH)")
    scale, zero_point, _ = OUTPUT[layer.function]
    fixed = QuantParams(scale, zero_point, "int8")
    layout = _common_layout(file, [name], elementwise=True)
    params = file.params(output)
    index = file.activation(output, layout, fixed, suffix="/fixed" if params != fixed else "")
    file.operator(BUILTINS[layer.function], [file.value(name, layout)], [index])
    if params != fixed:
        requantized = file.activation(output, layout)
        file.operator("QUANTIZE", [index], [requantized], "QuantizeOptions")
        index = requantized
    file.place(output, index, layout)


# ---------------------------------------------------------------------- pooling and reductions


def _pool(builtin: str) -> Writer:
    def write(file: FlatFile, layer: Any) -> None:
        [name], [output] = layer.inputs, layer.outputs
        attrs = layer.op_attrs
        kernel = list(attrs["kernel"])
        if len(kernel) != 2 or attrs.get("ceil_mode") or any(d != 1 for d in attrs.get("dilations") or [1, 1]):
            raise BuildError(f"layer {layer.name!r} ({layer.op}): TFLite pools 2-D windows, undilated, floor mode")
        if file.params(name) != file.params(output):
            raise BuildError(f"layer {layer.name!r} ({layer.op}): TFLite's pools keep their input's params")
        strides = list(attrs["strides"] or kernel)
        pads = list(attrs["pads"] or [0, 0, 0, 0])
        if builtin == "AVERAGE_POOL_2D" and attrs.get("count_include_pad") and any(pads):
            raise BuildError(f"layer {layer.name!r} (avg_pool): padding that counts is written as a pad layer "
                             "before the pool (integers.as_tflm)")
        source, padding = _window_padding(file, layer, name, kernel, strides, [1, 1], pads, file.params(name).qmin)
        if builtin == "AVERAGE_POOL_2D" and padding == VALID and any(pads):   # a PADV2 would count
            raise BuildError(f"layer {layer.name!r} (avg_pool): pads {pads} that do not count; TFLite's average "
                             "pool leaves out only SAME padding")
        index = file.activation(output, NHWC)
        file.operator(builtin, [source], [index], "Pool2DOptions", padding=padding, strideH=strides[0],
                      strideW=strides[1], filterHeight=kernel[0], filterWidth=kernel[1])
        file.place(output, index, NHWC)

    return write


WRITERS.add("avg_pool", _pool("AVERAGE_POOL_2D"))
WRITERS.add("max_pool", _pool("MAX_POOL_2D"))


@writes("mean")
def mean(file: FlatFile, layer: QMean) -> None:
    """MEAN over the layer's axes: in the input's layout where the axes left keep their order, else plain."""
    [name], [output] = layer.inputs, layer.outputs
    if layer.summed:
        raise BuildError(f"layer {layer.name!r} (mean): a reduce_sum; the tflite target writes means")
    rank = file.rank(name)
    layout = _common_layout(file, [name])
    kept = [a for a in range(rank) if a not in layer.axes]
    if not layer.keepdims and [file_axis(layout, rank, a) for a in kept] != sorted(
            file_axis(layout, rank, a) for a in kept):
        layout = PLAIN
    axes = sorted(file_axis(layout, rank, a) for a in layer.axes)
    out_layout = layout if layer.keepdims else PLAIN
    index = file.activation(output, out_layout)
    file.operator("MEAN", [file.value(name, layout), file.ints(f"{layer.name}/axes", axes)], [index],
                  "ReducerOptions", keepDims=layer.keepdims)
    file.place(output, index, out_layout)


# ---------------------------------------------------------------------- moving values


@writes("identity")
def identity(file: FlatFile, layer: QSelection) -> None:
    placed = file.layouts(layer.inputs[0])
    if not placed:
        file.value(layer.inputs[0], PLAIN)
        placed = file.layouts(layer.inputs[0])
    file.place(layer.outputs[0], placed[0].index, placed[0].layout)


@writes("reshape", "flatten", "squeeze", "unsqueeze")
def reshape(file: FlatFile, layer: QSelection) -> None:
    """RESHAPE of the plain input to the output's shape (batch 1)."""
    [name], [output] = layer.inputs, layer.outputs
    shape = [1, *file.qgraph.tensors[output].shape]
    index = file.activation(output, PLAIN)
    file.operator("RESHAPE", [file.value(name, PLAIN), file.ints(f"{layer.name}/shape", shape)], [index],
                  "ReshapeOptions", newShape=shape)
    file.place(output, index, PLAIN)


@writes("transpose")
def transpose(file: FlatFile, layer: QSelection) -> None:
    """Nothing where the transpose only moves between the layouts (the same file tensor); else TRANSPOSE."""
    [name], [output] = layer.inputs, layer.outputs
    perm = list(layer.op_attrs["perm"])
    rank = len(perm)
    file.value(name, _common_layout(file, [name]))
    for placed in file.layouts(name):
        if rank == 3 and placed.layout != PLAIN:
            continue   # a rank-3 tensor channels last: its unit height has no permutation
        for layout in (PLAIN, NHWC):
            composite = np.argsort(permutation(placed.layout, rank))[perm][list(permutation(layout, rank))]
            if list(composite) == list(range(rank)):
                file.place(output, placed.index, layout)
                return
    source = next(placed for placed in file.layouts(name) if rank != 3 or placed.layout == PLAIN)
    composite = np.argsort(permutation(source.layout, rank))[perm]
    index = file.activation(output, PLAIN)
    file.operator("TRANSPOSE", [source.index, file.ints(f"{layer.name}/perm", composite)], [index],
                  "TransposeOptions")
    file.place(output, index, PLAIN)


@writes("pad")
def pad(file: FlatFile, layer: QSelection) -> None:
    """PADV2 with the layer's quantized value, in the input's layout."""
    [name], [output] = layer.inputs, layer.outputs
    attrs = layer.op_attrs
    if attrs.get("mode", "constant") != "constant":
        raise BuildError(f"layer {layer.name!r} (pad): mode {attrs['mode']!r}; TFLite pads with a constant")
    rank = file.rank(name)
    layout = _common_layout(file, [name])
    pads = list(attrs["pads"])
    pairs = [[pads[a], pads[a + rank]] for a in permutation(layout, rank)]
    params = file.params(name)
    value = file.tensor(f"{layer.name}/value", [1], file.dtype(params), params, np.array([int(attrs["value"])]))
    index = file.activation(output, layout)
    file.operator("PADV2", [file.value(name, layout), file.ints(f"{layer.name}/paddings", pairs), value], [index],
                  "PadV2Options")
    file.place(output, index, layout)


@writes("slice")
def strided_slice(file: FlatFile, layer: QSelection) -> None:
    """STRIDED_SLICE with every axis's begin, end and stride resolved against the input's shape."""
    [name], [output] = layer.inputs, layer.outputs
    rank = file.rank(name)
    layout = _common_layout(file, [name])
    shape = (1, *file.qgraph.tensors[name].shape)
    begin, end, strides, end_mask = [0] * rank, list(shape), [1] * rank, 0
    attrs = layer.op_attrs
    axes = attrs["axes"] if attrs["axes"] is not None else list(range(len(attrs["starts"])))
    steps = attrs["steps"] if attrs["steps"] is not None else [1] * len(axes)
    for axis, start, stop, step in zip(axes, attrs["starts"], attrs["ends"], steps):
        axis %= rank
        first, last, _ = slice(int(start), int(stop), int(step)).indices(shape[axis])
        begin[axis], end[axis], strides[axis] = first, last, int(step)
        if last < 0:   # a negative step down to the first element: "to the end" is TFLite's end mask
            end_mask |= 1 << file_axis(layout, rank, axis)
    order = permutation(layout, rank)
    index = file.activation(output, layout)
    operands = [file.value(name, layout)] + [file.ints(f"{layer.name}/{what}", [values[a] for a in order])
                                            for what, values in (("begin", begin), ("end", end), ("strides", strides))]
    file.operator("STRIDED_SLICE", operands, [index], "StridedSliceOptions", endMask=end_mask)
    file.place(output, index, layout)

