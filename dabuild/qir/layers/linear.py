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
from dabuild.ir.kernels.integer import PackedQWeight, Requantization
from dabuild.ir.kernels.native import layer_thread_count, native_conv
from dabuild.ir.ops import OPS
from dabuild.ir.ops.linear import batch_norm_affine
from dabuild.qir.activations import clamp_bounds, is_table_activation, pre_activation
from dabuild.qir.dtypes import accumulator_max, fitting_type
from dabuild.qir.fixed_point import INT32_MAX, accumulator_trace, quantize_multiplier, requantize, round_half_away
from dabuild.qir.layers.blocked import lower_blocked_dense
from dabuild.qir.layers.elementwise import lookup_layer
from dabuild.qir.layers.fallback import lower_float_weighted
from dabuild.qir.qgraph import DenseFeatures, QGraph, QLayer, QuantParams, Trace, layer_type
from dabuild.quant.bias_correction import input_channel_means, mean_output_error
from dabuild.quant.config import QuantChoice
from dabuild.quant.given_params import EXACT
from dabuild.quant.lowering import Lowering, lowers

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
    weight_channel_axis: ClassVar[int] = 0  # and in the weight

    def accumulator_range(self, source: QuantParams) -> tuple[np.ndarray, np.ndarray]:
        """The least and greatest accumulator per output channel over every input `source` holds (bias included;
        padding adds 0, inside the range since zero points lie in it)."""
        return accumulator_range(self.weight, self.bias, source, self.weight_channel_axis)

    @abstractmethod
    def accumulate(self, centred: np.ndarray) -> np.ndarray:
        """sum (x - zp) * w without bias, as exact integers in float64."""

    def conv_weight(self) -> np.ndarray:
        """The weight as an (O, C, KH, KW) conv weight, the layout qconv.c packs."""
        raise NotImplementedError

    def _compiled(self, x: np.ndarray, graph: QGraph) -> np.ndarray | None:
        """The output by qconv.c, or None where the layer's geometry does not apply."""
        return None

    def _qconv(self, x: np.ndarray, graph: QGraph, strides: list[int], pads: list[int], dilations: list[int],
               out: list[int]) -> np.ndarray | None:
        """qconv.c on x (N, H, W, C) -> (N, OH, OW, O), or None where it does not apply: inputs or weights
        wider than 8 bits, an accumulator bound past int32, or no native kernels."""
        native = native_conv()
        source, target = self.params(graph), self.output_params(graph)
        storage = np.dtype(target.storage)
        if (native is None or native.integer is None or np.dtype(source.storage).itemsize != 1
                or self.weight.dtype.itemsize != 1 or storage.itemsize not in (1, 2, 4)):
            return None
        quads = native.integer.quads and np.dtype(source.storage) in (np.dtype(np.int8), np.dtype(np.uint8))
        packed = self._packing(4 if quads else 2)
        bias, magnitudes = np.abs(self.bias.astype(np.int64)), packed.magnitudes
        if np.max(bias + magnitudes * (source.qmax - source.qmin)) > INT32_MAX:
            return None
        if quads:  # the uint8 x int8 kernel sums u w with u up to 255, and takes p sum w off the bias
            pad = int(source.zero_point) + (128 if np.dtype(source.storage) == np.int8 else 0)
            if np.max(np.abs(self.bias.astype(np.int64) - pad * packed.sums) + 255 * magnitudes) > INT32_MAX:
                packed = self._packing(2)

        def per_channel(values: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(np.broadcast_to(values.astype(np.int64), len(self.bias)))

        requantization = Requantization(per_channel(self.bias), per_channel(self.multiplier), per_channel(self.shift),
                                        int(target.zero_point), self.output_min, self.output_max)
        return native.integer.conv(x, int(source.zero_point), packed, requantization, strides, pads, dilations, out,
                                   storage, layer_thread_count())

    def _packing(self, group: int) -> PackedQWeight:
        """The weight packed for qconv.c in groups of `group` input channels, made once per layer (once per
        weight in a tuning run: lowering hands layers of one cached weight one `_packs`, see WeightCache)."""
        packs = self.__dict__.setdefault("_packs", {})
        if group not in packs:
            native = native_conv()
            assert native is not None and native.integer is not None
            packs[group] = native.integer.pack(self.conv_weight(), group)
        return packs[group]

    def run(self, inputs: list[np.ndarray], graph: QGraph, trace: Trace | None) -> list[np.ndarray]:
        """qconv.c where it takes the layer (no trace wanted: the compiled conv keeps no accumulator), else numpy."""
        y = None if trace is not None or graph.rounding != "dabuild" else self._compiled(inputs[0], graph)
        if y is not None:
            return [y]
        centred = np.subtract(inputs[0], self.params(graph).zero_point, dtype=np.float64)  # q - zp, exact
        sums = self.accumulate(centred)
        target = self.output_params(graph)
        native = native_conv()
        if trace is None and native is not None and sums.dtype == np.float64 and graph.rounding == "dabuild":  # compiled
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
        wide = np.dtype(self.params(graph).storage).itemsize > 1   # TFLite's 16x8 layers requantize int64 sums
        y = requantize(accumulator, self.multiplier.reshape(shape), self.shift.reshape(shape), graph.rounding, wide)
        y += target.zero_point
        return [np.clip(y, self.output_min, self.output_max).astype(target.storage)]


@layer_type
@dataclass
class QDense(QWeighted, DenseFeatures):
    """Fully connected over the last axis; weight (in_features, out_features)."""

    op: ClassVar[str] = "dense"
    channel_axis: ClassVar[int] = -1
    weight_channel_axis: ClassVar[int] = -1

    def accumulate(self, centred: np.ndarray) -> np.ndarray:
        return centred @ self.weight.astype(np.float64)

    def conv_weight(self) -> np.ndarray:
        return self.weight.T[:, :, None, None]

    def _compiled(self, x: np.ndarray, graph: QGraph) -> np.ndarray | None:
        """The rows of x (..., in) as the 1x1 images of a conv."""
        if self.weight.ndim != 2 or x.ndim < 1:
            return None
        y = self._qconv(x.reshape(-1, 1, 1, x.shape[-1]), graph, [1, 1], [0, 0], [1, 1], [1, 1])
        return None if y is None else y.reshape(*x.shape[:-1], y.shape[-1])


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

    def conv_weight(self) -> np.ndarray:
        return self.weight

    def _compiled(self, x: np.ndarray, graph: QGraph) -> np.ndarray | None:
        """A plain 2-D conv by qconv.c, as an (N, O, OH, OW) view of channels-last memory, which the next
        conv reads without a copy."""
        if self.groups != 1 or self.weight.ndim != 4:
            return None
        kernel = self.weight.shape[2:]
        out = [(size + self.pads[axis] + self.pads[axis + 2] - self.dilations[axis] * (kernel[axis] - 1) - 1)
               // self.strides[axis] + 1 for axis, size in enumerate(x.shape[2:])]
        y = self._qconv(x.transpose(0, 2, 3, 1), graph, self.strides, self.pads[:2], self.dilations, out)
        return None if y is None else y.transpose(0, 3, 1, 2)


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
    exact = ctx.activation.algorithm == EXACT

    weight_q, weight_scale = ctx.weight_integers(weight, weight_choice, channel_axis)
    if ctx.bias_correction:
        bias = bias - _mean_weight_error(ctx, layer_class, weight, weight_q, weight_scale, channel_axis, geometry)
    accumulator_scale = source.scale * weight_scale
    bias_q = round_half_away(bias.astype(np.float64) / accumulator_scale)
    # Worst |accumulator| over every input: |bias| + sum |w| * (qmax - qmin); int32 overflow in C is undefined,
    # and wide types must stay where float64 sums are exact (dtypes.accumulator_max).
    others = tuple(a for a in range(weight.ndim) if a != channel_axis)
    worst = np.abs(bias_q) + np.abs(weight_q.astype(np.int64)).sum(axis=others) * (source.qmax - source.qmin)
    target = _exact_params(ctx, weight_q, bias, bias_q, accumulator_scale, source, others, table) if exact \
        else ctx.calibrated(written)
    ctx.output(written, target, like=output)
    limit = accumulator_max(source.dtype, weight_choice.dtype, *((target.dtype,) if exact else ()))
    if np.any(worst > limit):
        raise BuildError(f"{ctx.where}: the accumulator could overflow (worst case {int(worst.max())} > {limit}); "
                         f"the bias or the number of input features is too large for {source.dtype} x "
                         f"{weight_choice.dtype} weights")
    multiplier, shift = quantize_multiplier(accumulator_scale / target.scale, ctx.where)
    low, high = clamp_bounds("none" if table else activation, activation_attrs, target)
    layer = layer_class(
        name=node.name, inputs=[node.inputs[0]], outputs=[written], weight=weight_q,
        bias=bias_q.astype(np.int32 if np.all(np.abs(bias_q) <= INT32_MAX) else np.int64),
        multiplier=multiplier, shift=shift, weight_scale=weight_scale, output_min=low, output_max=high, **geometry)
    if ctx.weight_cache is not None:  # packed once per cached weight, not once per lowered config
        layer.__dict__["_packs"] = ctx.weight_cache.derived(node.name)
    layers: list[QLayer] = [layer]
    if table:
        layers.append(lookup_layer(ctx, f"{node.name}:{activation}", written, output, activation, activation_attrs))
    return layers


def accumulator_range(weight: np.ndarray, bias: np.ndarray, source: QuantParams,
                      channel_axis: int) -> tuple[np.ndarray, np.ndarray]:
    """bias + sum of min (max) of w * x over x in the centred range of `source`, per output channel."""
    weights = weight.astype(np.int64)
    others = tuple(a for a in range(weights.ndim) if a != channel_axis % weights.ndim)
    centred_low, centred_high = source.qmin - source.zero_point, source.qmax - source.zero_point
    low = bias.astype(np.int64) + np.minimum(weights * centred_low, weights * centred_high).sum(axis=others)
    high = bias.astype(np.int64) + np.maximum(weights * centred_low, weights * centred_high).sum(axis=others)
    return low, high


def _exact_params(ctx: Lowering, weight_q: np.ndarray, bias: np.ndarray, bias_q: np.ndarray,
                  accumulator_scale: np.ndarray, source: QuantParams, others: tuple[int, ...],
                  table: bool) -> QuantParams:
    """The accumulator itself as the output (a fixed-point given model keeps it exact): scale s_x * s_w, the
    narrowest type holding its worst case; BuildError where the bias is not on that grid or a table follows."""
    if table or len(np.unique(accumulator_scale)) > 1:
        raise BuildError(f"{ctx.where}: the model keeps this layer's output exact, which dabuild does for one "
                         "weight scale and a relu or no activation; quantize the output in the model")
    if not np.array_equal(bias_q * accumulator_scale, bias.astype(np.float64)):
        raise BuildError(f"{ctx.where}: the bias is not on the accumulator's grid {float(accumulator_scale[0]):g} "
                         "(input scale x weight scale), so the exact output cannot hold it; nearest representable: "
                         "weights on a grid fine enough for the bias")
    low, high = accumulator_range(weight_q, bias_q, source, next(a for a in range(weight_q.ndim) if a not in others))
    return QuantParams(float(accumulator_scale[0]), 0, fitting_type(int(low.min()), int(high.max()), ctx.where))


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


@lowers("dense", weighted=True, layers=("dense", "blocked_dense", "lookup", "float_weighted"))
def lower_dense(ctx: Lowering) -> list[QLayer]:
    inputs = ctx.node.inputs
    weight = ctx.constant(inputs[1])
    bias = ctx.constant(inputs[2]) if len(inputs) > 2 else np.zeros(weight.shape[1])
    blocks = ctx.weight_blocks(weight, 1)
    if blocks is not None:
        return lower_blocked_dense(ctx, blocks, bias)
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
