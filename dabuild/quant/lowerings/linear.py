"""Lowering of dense, conv, conv_transpose and batch_norm into weighted integer layers.

The layers it makes, and the arithmetic they run, are dabuild.qir.layers.linear's."""

from __future__ import annotations

from typing import Any

import numpy as np

from dabuild.errors import BuildError
from dabuild.ir.ops import OPS
from dabuild.ir.ops.linear import batch_norm_affine
from dabuild.qir.activations import clamp_bounds, is_table_activation, pre_activation
from dabuild.qir.dtypes import accumulator_max, fitting_type
from dabuild.qir.fixed_point import INT32_MAX, quantize_multiplier, round_half_away
from dabuild.qir.layers.linear import QConv, QConvTranspose, QDense, QWeighted, accumulator_range, conv_layout
from dabuild.qir.qgraph import QLayer, QuantParams
from dabuild.quant.bias_correction import input_channel_means, mean_output_error
from dabuild.quant.config import QuantChoice
from dabuild.quant.given_params import EXACT
from dabuild.quant.lowering import Lowering, lowers
from dabuild.quant.lowerings.blocked import lower_blocked_dense
from dabuild.quant.lowerings.elementwise import lookup_layer
from dabuild.quant.lowerings.fallback import lower_float_weighted

PER_CHANNEL_MINMAX = QuantChoice("int8", "sym", "per_channel", "minmax")


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
    worst = np.abs(bias_q) + ctx.weight_magnitudes(weight_q, others) * (source.qmax - source.qmin)
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
