"""dense, conv and conv_transpose (and batch_norm, a depthwise 1x1 conv): int x int -> int32 (int64), requantized.

acc = sum (x - x_zero_point) * w + bias, with symmetric integer weights (per
tensor or per output channel) and the bias in integer units of s_x * s_w; then
y = requantize(acc, s_x * s_w / s_y) + y_zero_point, clamped to the fused
activation's bounds (relu, relu6, clip) or the output dtype's range. A fused table
activation (sigmoid, gelu, ...) becomes a lookup layer after the clamp-free
layer. Conv pads with the input zero point (0 after centring), so padding is
exactly a real 0.

The reference computes the sums as float64 matrix products of the integer
values: the lowering proves |acc| < 2**31 for every input when weights and
inputs have at most 8 bits (int32 accumulators, as in C), and |acc| < 2**53
for wider types (int64), so every partial sum is an integer float64 holds
exactly; the result equals integer arithmetic bit for bit, at BLAS speed.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from dabuild.errors import BuildError
from dabuild.ir.kernels.native import native_conv
from dabuild.ir.ops import OPS
from dabuild.ir.ops.linear import batch_norm_affine
from dabuild.quant.activations import clamp_bounds, is_table_activation, pre_activation
from dabuild.quant.bias_correction import input_channel_means, mean_output_error
from dabuild.quant.config import QuantChoice
from dabuild.quant.dtypes import accumulator_max
from dabuild.quant.fixed_point import INT32_MAX, accumulator_trace, quantize_multiplier, requantize, round_half_away
from dabuild.quant.layers.elementwise import lookup_layer
from dabuild.quant.layers.fallback import lower_float_weighted
from dabuild.quant.lowering import Lowering, lowers
from dabuild.quant.qgraph import QGraph, QLayer, Trace, layer_type

PER_CHANNEL_MINMAX = QuantChoice("int8", "sym", "per_channel", "minmax")


@dataclass
class QWeighted(QLayer):
    """Fields shared by dense and conv."""

    weight: np.ndarray        # symmetric integers in the weight dtype's storage (int8 up to 8 bits)
    bias: np.ndarray          # int32 (int64 where wide types need it) (out_channels,), in units of s_in * s_w
    multiplier: np.ndarray    # int32 (1 or out_channels,), Q31 mantissa of s_in * s_w / s_out
    shift: np.ndarray         # int32 (1 or out_channels,), total right shift (31 - exponent)
    weight_scale: np.ndarray  # float64 (1 or out_channels,), kept for reports and dequantization
    output_min: int           # the fused activation's bounds in the output's quantized domain
    output_max: int

    channel_axis: ClassVar[int]  # axis of the output channels in the (batch-first) output

    @abstractmethod
    def accumulate(self, centred: np.ndarray) -> np.ndarray:
        """sum (x - zp) * w without bias, as exact integers in float64."""

    def run(self, inputs: list[np.ndarray], graph: QGraph, trace: Trace | None) -> list[np.ndarray]:
        centred = np.subtract(inputs[0], self.params(graph).zero_point, dtype=np.float64)  # q - zp, exact
        sums = self.accumulate(centred)
        target = self.output_params(graph)
        native = native_conv()
        if trace is None and native is not None and sums.dtype == np.float64:  # the same bits, compiled
            y = native.requantize(sums, self.channel_axis, self.bias, self.multiplier, self.shift,
                                  int(target.zero_point), self.output_min, self.output_max)
            if y is not None:
                return [y.astype(target.storage)]
        accumulator = sums.astype(np.int64)
        channel = [1] * accumulator.ndim
        channel[self.channel_axis] = -1
        accumulator += self.bias.astype(np.int64).reshape(channel)
        if trace is not None:
            trace[f"{self.name}:accumulator"] = accumulator_trace(accumulator)
        shape = channel if len(self.multiplier) > 1 else [1]
        y = requantize(accumulator, self.multiplier.reshape(shape), self.shift.reshape(shape)) + target.zero_point
        return [np.clip(y, self.output_min, self.output_max).astype(target.storage)]


@layer_type
@dataclass
class QDense(QWeighted):
    """Fully connected over the last axis; weight (in_features, out_features)."""

    op: ClassVar[str] = "dense"
    channel_axis: ClassVar[int] = -1

    @property
    def in_features(self) -> int:
        return int(self.weight.shape[0])

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[1])

    def accumulate(self, centred: np.ndarray) -> np.ndarray:
        return centred @ self.weight.astype(np.float64)


@layer_type
@dataclass
class QConv(QWeighted):
    """Convolution over (N, C, *spatial); weight (O, C/groups, *kernel), ONNX geometry."""

    op: ClassVar[str] = "conv"
    channel_axis: ClassVar[int] = 1
    strides: list[int]
    pads: list[int]
    dilations: list[int]
    groups: int

    def accumulate(self, centred: np.ndarray) -> np.ndarray:
        attrs = {"strides": self.strides, "pads": self.pads, "dilations": self.dilations, "groups": self.groups}
        return OPS["conv"].run([centred, self.weight.astype(np.float64)], attrs)[0]


def conv_layout(weight: np.ndarray, groups: int) -> np.ndarray:
    """A transposed conv's (C, O/groups, *kernel) weight as (O, C/groups, *kernel), the layout of a conv's: one
    slice per output channel, so per-channel quantization and the C kernel read it as they read a conv's."""
    channels, group_out, *kernel = weight.shape
    split = weight.reshape(groups, channels // groups, group_out, *kernel)
    return np.ascontiguousarray(split.swapaxes(1, 2).reshape(groups * group_out, channels // groups, *kernel))


def transposed_layout(weight: np.ndarray, groups: int) -> np.ndarray:
    """The inverse of `conv_layout`: (O, C/groups, *kernel) back to ONNX's (C, O/groups, *kernel)."""
    out_channels, group_in, *kernel = weight.shape
    split = weight.reshape(groups, out_channels // groups, group_in, *kernel)
    return np.ascontiguousarray(split.swapaxes(1, 2).reshape(groups * group_in, out_channels // groups, *kernel))


@layer_type
@dataclass
class QConvTranspose(QWeighted):
    """Transposed convolution over (N, C, *spatial); weight in conv layout (O, C/groups, *kernel) (see
    `conv_layout`), ONNX geometry with output padding."""

    op: ClassVar[str] = "conv_transpose"
    channel_axis: ClassVar[int] = 1
    strides: list[int]
    pads: list[int]
    dilations: list[int]
    groups: int
    output_padding: list[int]

    def attrs_of_op(self) -> dict[str, Any]:
        return {"strides": self.strides, "pads": self.pads, "dilations": self.dilations, "groups": self.groups,
                "output_padding": self.output_padding}

    def accumulate(self, centred: np.ndarray) -> np.ndarray:
        weight = transposed_layout(self.weight.astype(np.float64), self.groups)
        return OPS["conv_transpose"].run([centred, weight], self.attrs_of_op())[0]


def _weighted_layers(ctx: Lowering, layer_class: type[QWeighted], weight: np.ndarray, bias: np.ndarray,
                     weight_choice: QuantChoice, channel_axis: int, geometry: dict[str, Any]) -> list[QLayer]:
    """The weighted layer, and a lookup layer after it when the node fuses a table activation; a float
    layer when only fp32 nodes read its output (it feeds a float island)."""
    node = ctx.node
    if node.outputs[0] in ctx.island:
        return lower_float_weighted(ctx, weight, bias, weight_choice, channel_axis)
    source = ctx.params(node.inputs[0])
    activation = node.attrs.get("activation", "none")
    activation_attrs = dict(node.attrs.get("activation_attrs", {}))
    output = node.outputs[0]
    table = is_table_activation(activation)
    written = pre_activation(output) if table else output
    target = ctx.calibrated(written)
    ctx.output(written, target, like=output)

    weight_q, weight_scale = ctx.weight_integers(weight, weight_choice, channel_axis)
    if ctx.bias_correction:
        bias = bias - _mean_weight_error(ctx, layer_class, weight, weight_q, weight_scale, channel_axis, geometry)
    accumulator_scale = source.scale * weight_scale
    bias_q = round_half_away(bias.astype(np.float64) / accumulator_scale)
    # Worst |accumulator| over every input: |bias| + sum |w| * (qmax - qmin); int32 overflow in C is undefined,
    # and wide types must stay where float64 sums are exact (dtypes.accumulator_max).
    others = tuple(a for a in range(weight.ndim) if a != channel_axis)
    worst = np.abs(bias_q) + np.abs(weight_q.astype(np.int64)).sum(axis=others) * (source.qmax - source.qmin)
    limit = accumulator_max(source.dtype, weight_choice.dtype)
    if np.any(worst > limit):
        raise BuildError(f"{ctx.where}: the accumulator could overflow (worst case {int(worst.max())} > {limit}); "
                         f"the bias or the number of input features is too large for {source.dtype} x "
                         f"{weight_choice.dtype} weights")
    multiplier, shift = quantize_multiplier(accumulator_scale / target.scale, ctx.where)
    low, high = clamp_bounds("none" if table else activation, activation_attrs, target)
    layers: list[QLayer] = [layer_class(
        name=node.name, inputs=[node.inputs[0]], outputs=[written], weight=weight_q,
        bias=bias_q.astype(np.int32 if np.all(np.abs(bias_q) <= INT32_MAX) else np.int64),
        multiplier=multiplier, shift=shift, weight_scale=weight_scale, output_min=low, output_max=high, **geometry)]
    if table:
        layers.append(lookup_layer(ctx, f"{node.name}:{activation}", written, output, activation, activation_attrs))
    return layers


def _mean_weight_error(ctx: Lowering, layer_class: type[QWeighted], weight: np.ndarray, weight_q: np.ndarray,
                       weight_scale: np.ndarray, channel_axis: int, geometry: dict[str, Any]) -> np.ndarray:
    """The mean output error the quantized weights add on the calibration data, per output channel."""
    tensor = ctx.node.inputs[0]
    axis = layer_class.channel_axis % ctx.rank(tensor)  # input channels lie where the output's do
    channels = weight.shape[0] if channel_axis == 1 else weight.shape[1] * geometry["groups"]
    means = input_channel_means(ctx.stats, tensor, axis, channels, ctx.where)
    return mean_output_error(weight, weight_q, weight_scale, channel_axis, means, geometry.get("groups", 1))


def _weight_choice(ctx: Lowering) -> QuantChoice:
    if ctx.config.weight is None:
        raise BuildError(f"{ctx.where}: the quantization config gives no weight choice (weight and activation "
                         "both None would mean fp32 fallback)")
    return ctx.config.weight


@lowers("dense", weighted=True, layers=("dense", "lookup", "float_weighted"))
def lower_dense(ctx: Lowering) -> list[QLayer]:
    inputs = ctx.node.inputs
    weight = ctx.constant(inputs[1])
    bias = ctx.constant(inputs[2]) if len(inputs) > 2 else np.zeros(weight.shape[1])
    return _weighted_layers(ctx, QDense, weight, bias, _weight_choice(ctx), 1, {})


@lowers("conv", weighted=True, layers=("conv", "lookup", "float_weighted"))
def lower_conv(ctx: Lowering) -> list[QLayer]:
    inputs = ctx.node.inputs
    weight = ctx.constant(inputs[1])
    bias = ctx.constant(inputs[2]) if len(inputs) > 2 else np.zeros(weight.shape[0])
    attrs = OPS["conv"].resolve(ctx.node.attrs)
    spatial = weight.ndim - 2
    geometry = {"strides": [int(s) for s in attrs["strides"] or [1] * spatial],
                "pads": [int(p) for p in attrs["pads"] or [0] * (2 * spatial)],
                "dilations": [int(d) for d in attrs["dilations"] or [1] * spatial],
                "groups": int(attrs["groups"])}
    return _weighted_layers(ctx, QConv, weight, bias, _weight_choice(ctx), 0, geometry)


@lowers("conv_transpose", weighted=True, layers=("conv_transpose", "float_weighted"))
def lower_conv_transpose(ctx: Lowering) -> list[QLayer]:
    inputs = ctx.node.inputs
    attrs = OPS["conv_transpose"].resolve(ctx.node.attrs)
    groups = int(attrs["groups"])
    weight = conv_layout(ctx.constant(inputs[1]), groups)
    bias = ctx.constant(inputs[2]) if len(inputs) > 2 else np.zeros(weight.shape[0])
    spatial = weight.ndim - 2
    geometry = {"strides": [int(s) for s in attrs["strides"] or [1] * spatial],
                "pads": [int(p) for p in attrs["pads"] or [0] * (2 * spatial)],
                "dilations": [int(d) for d in attrs["dilations"] or [1] * spatial],
                "groups": groups, "output_padding": [int(p) for p in attrs["output_padding"] or [0] * spatial]}
    return _weighted_layers(ctx, QConvTranspose, weight, bias, _weight_choice(ctx), 0, geometry)


@lowers("batch_norm", layers=("conv",))
def lower_batch_norm(ctx: Lowering) -> list[QLayer]:
    """A standalone batch_norm is x * m + b per channel: a depthwise 1x1 conv whose weight m is
    quantized per channel (always: one value per channel, so each lands on +-127 exactly) and whose
    bias b goes to int32 like any conv bias, i.e. a per-channel affine requantization."""
    node = ctx.node
    rank = ctx.rank(node.inputs[0])
    if rank < 3:
        raise BuildError(f"{ctx.where}: a standalone batch_norm needs an (N, C, spatial...) input for integer "
                         "lowering; fold it into the dense before it or run it in fp32")
    scale, bias, mean, var = (ctx.constant(name) for name in node.inputs[1:])
    multiplier, offset = batch_norm_affine(scale, bias, mean, var, OPS["batch_norm"].resolve(node.attrs)["epsilon"])
    spatial = rank - 2
    weight = multiplier.reshape(-1, 1, *[1] * spatial)
    geometry = {"strides": [1] * spatial, "pads": [0] * (2 * spatial), "dilations": [1] * spatial,
                "groups": len(multiplier)}
    return _weighted_layers(ctx, QConv, weight, offset, PER_CHANNEL_MINMAX, 0, geometry)
