"""blocked_dense: a dense whose given weight scales change along its inputs (ONNX opset 21 blocked weights).

One scale per block of inputs and output channel cannot be folded into one
requantization per output, so the sum is taken block by block:

    P[b, o]   = sum over the inputs k of block b of (x[k] - zp_x) * w[k, o]      (exact, int32 in C)
    acc[o]    = bias[o] + sum over b of P[b, o] * m[b, o]                          (exact, int64)
    y[o]      = round(acc[o] * 2**-shift[o]) + zp_y, clamped                       (half away from zero)

`m[b, o]` = round(s_x * s_w[b, o] / s_y * 2**shift[o]) rescales each partial
sum into one fixed-point accumulator per output with `shift[o]` fractional
bits: the most that keep every multiplier below 2**30 and the worst-case
accumulator below 2**62 (so C adds int32 x int32 -> int64 products and needs no
128-bit step). The bias is on the same grid, s_y * 2**-shift[o]. Every step is
integer arithmetic, so the C kernel reproduces the reference bit for bit; the
multipliers' rounding (relative 2**-30 at the largest block) is the only
difference from dequantizing in float, as onnxruntime does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dabuild.qir.fixed_point import accumulator_trace, requantize
from dabuild.qir.qgraph import DenseFeatures, QGraph, QLayer, QuantParams, Trace, layer_type

MULTIPLIER_BITS = 30  # every block multiplier below 2**30: an int32 C multiplies without care


ACCUMULATOR_BITS = 62  # |acc| below 2**62: the int64 sum, its rounding term and the C rounding never overflow


def block_starts(inputs: int, block_size: int) -> np.ndarray:
    """The first input of every block."""
    return np.arange(0, inputs, block_size)


@layer_type
@dataclass
class QBlockedDense(QLayer, DenseFeatures):
    """Fully connected over the last axis with one weight scale per block of inputs and output (module doc)."""

    op: ClassVar[str] = "blocked_dense"
    weight: np.ndarray            # (in_features, out_features) symmetric integers (int8 storage up to 8 bits)
    block_size: int               # inputs per block (the last block may be shorter)
    block_multiplier: np.ndarray  # int32 (blocks, out_features): s_x * s_w[b, o] / s_y * 2**shift[o]
    shift: np.ndarray             # int32 (out_features,): fractional bits of the accumulator
    bias: np.ndarray              # int64 (out_features,) in units of s_y * 2**-shift[o]
    weight_scale: np.ndarray      # float64 (blocks, out_features), kept for reports and the onnx target
    output_min: int
    output_max: int

    @property
    def blocks(self) -> int:
        return int(self.block_multiplier.shape[0])

    def element_scales(self) -> np.ndarray:
        """The weight scale of every (input, output) element (float64, the weight's shape)."""
        return np.repeat(self.weight_scale, self.block_size, axis=0)[:self.in_features]

    def dequantized_weight(self) -> np.ndarray:
        """The real weights (float64): what the file's blocked DequantizeLinear gives."""
        return self.weight.astype(np.float64) * self.element_scales()

    def real_bias(self, target: QuantParams) -> np.ndarray:
        """The bias in real units (float64): its integers times s_y * 2**-shift (exact: a dyadic rational)."""
        return self.bias.astype(np.float64) * 2.0 ** -self.shift.astype(np.float64) * target.scale

    def partial_sums(self, centred: np.ndarray) -> np.ndarray:
        """(rows, in) centred inputs -> (rows, blocks, out) block sums as int64 (float64 products are exact:
        every |partial sum| is far below 2**53)."""
        padded = self.blocks * self.block_size
        x = np.zeros((len(centred), padded), np.float64)
        x[:, :self.in_features] = centred
        w = np.zeros((padded, self.out_features), np.float64)
        w[:self.in_features] = self.weight
        sums = np.einsum("rbk,bko->rbo", x.reshape(len(x), self.blocks, self.block_size),
                         w.reshape(self.blocks, self.block_size, self.out_features))
        return sums.astype(np.int64)

    def run(self, inputs: list[np.ndarray], graph: QGraph, trace: Trace | None) -> list[np.ndarray]:
        x = inputs[0]
        centred = np.subtract(x, self.params(graph).zero_point, dtype=np.float64).reshape(-1, self.in_features)
        partial = self.partial_sums(centred)
        accumulator = (partial * self.block_multiplier.astype(np.int64)).sum(axis=1) + self.bias.astype(np.int64)
        if trace is not None:
            trace[f"{self.name}:accumulator"] = accumulator_trace(accumulator.reshape(*x.shape[:-1], -1))
        target = self.output_params(graph)
        y = requantize(accumulator, np.ones(1, np.int64), self.shift.astype(np.int64), graph.rounding) + target.zero_point
        y = np.clip(y, self.output_min, self.output_max).astype(target.storage)
        return [y.reshape(*x.shape[:-1], self.out_features)]
