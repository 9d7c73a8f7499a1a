"""Lowering of a dense with blocked weights into a blocked_dense layer (and a lookup after it).

The layers it makes, and the arithmetic they run, are dabuild.qir.layers.blocked's."""

from __future__ import annotations

import numpy as np

from dabuild.errors import BuildError
from dabuild.qir.activations import clamp_bounds
from dabuild.qir.fixed_point import MAX_SHIFT, round_half_away
from dabuild.qir.layers.blocked import ACCUMULATOR_BITS, MULTIPLIER_BITS, QBlockedDense, block_starts
from dabuild.qir.qgraph import QLayer, QuantParams
from dabuild.quant.given_params import EXACT, WeightBlocks
from dabuild.quant.lowering import FusedActivation, Lowering
from dabuild.quant.lowerings.elementwise import lookup_layer


def block_peaks(weight: np.ndarray, block_size: int, source: QuantParams) -> np.ndarray:
    """The largest |partial sum| of every block and output over every input `source` holds (int64)."""
    span = max(source.qmax - source.zero_point, source.zero_point - source.qmin)
    magnitudes = np.abs(weight.astype(np.int64))
    return np.add.reduceat(magnitudes, block_starts(len(weight), block_size), axis=0) * span


def block_rescaling(source: QuantParams, target: QuantParams, blocks: WeightBlocks, bias: np.ndarray,
                    where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(block multipliers, shifts, bias) of the accumulator (module doc): the most fractional bits per output
    that keep every multiplier below 2**MULTIPLIER_BITS and the worst accumulator below 2**ACCUMULATOR_BITS."""
    ratios = source.scale * blocks.scales / target.scale
    _, exponent = np.frexp(ratios.max(axis=0))  # the largest ratio per output lies below 2**exponent
    shift = np.minimum(MULTIPLIER_BITS - exponent.astype(np.int64), MAX_SHIFT)
    peaks = block_peaks(blocks.integers, blocks.block_size, source).astype(np.float64)
    real_bias = np.abs(np.asarray(bias, np.float64)) / target.scale
    while True:
        worst = (np.abs(round_half_away(ratios * 2.0**shift)) * peaks).sum(axis=0) + real_bias * 2.0**shift + 1
        over = worst >= 2.0**ACCUMULATOR_BITS
        if not over.any():
            break
        shift = shift - over
    if np.any(shift < 1):
        raise BuildError(f"{where}: the blocked weights' requantization factor {float(ratios.max()):g} is too large "
                         "for the fixed-point accumulator (the output scale is too fine for the input and weight "
                         "scales)")
    multiplier = round_half_away(ratios * 2.0**shift).astype(np.int64)
    bias_q = round_half_away(np.asarray(bias, np.float64) / target.scale * 2.0**shift).astype(np.int64)
    return multiplier.astype(np.int32), shift.astype(np.int32), bias_q


def lower_blocked_dense(ctx: Lowering, blocks: WeightBlocks, bias: np.ndarray) -> list[QLayer]:
    """The blocked_dense layer, and a lookup layer after it when the node fuses a table activation."""
    node = ctx.node
    if node.outputs[0] in ctx.island or ctx.activation.algorithm == EXACT:
        raise BuildError(f"{ctx.where}: parameter block_size: a dense with blocked weights (blocks of "
                         f"{blocks.block_size}) runs with a quantized output only; nearest representable: quantize "
                         "its output in the model")
    source = ctx.params(node.inputs[0])
    fused = FusedActivation.of(node)
    target = ctx.calibrated(fused.written)
    ctx.output(fused.written, target, like=node.outputs[0])
    multiplier, shift, bias_q = block_rescaling(source, target, blocks, bias, ctx.where)
    low, high = clamp_bounds("none" if fused.table else fused.op, fused.attrs, target)
    layers: list[QLayer] = [QBlockedDense(
        name=node.name, inputs=[node.inputs[0]], outputs=[fused.written], weight=blocks.integers,
        block_size=blocks.block_size, block_multiplier=multiplier, shift=shift, bias=bias_q,
        weight_scale=blocks.scales, output_min=low, output_max=high)]
    if fused.table:
        layers.append(lookup_layer(ctx, f"{node.name}:{fused.op}", fused.written, node.outputs[0], fused.op,
                                   fused.attrs))
    return layers
