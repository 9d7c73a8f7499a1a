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

from dabuild.ir.kernels.integer import PackedQWeight, Requantization
from dabuild.ir.kernels.native import layer_thread_count, native_conv
from dabuild.ir.ops import OPS
from dabuild.qir.fixed_point import accumulator_trace, requantize
from dabuild.qir.qgraph import DenseFeatures, QGraph, QLayer, QuantParams, Trace, layer_type


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
        wider than 8 bits, an accumulator bound past int32 in every form, or no native kernels."""
        native = native_conv()
        source, target = self.params(graph), self.output_params(graph)
        storage = np.dtype(target.storage)
        if (native is None or native.integer is None or np.dtype(source.storage).itemsize != 1
                or self.weight.dtype.itemsize != 1 or storage.itemsize not in (1, 2, 4)):
            return None
        low, high, sums, magnitudes = self._weight_range()
        form = native.integer.form_for(low, high, sums, magnitudes, self.bias, int(source.zero_point),
                                         np.dtype(source.storage))
        if form is None:
            return None
        packed = self._packing(form.group)

        def per_channel(values: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(np.broadcast_to(values.astype(np.int64), len(self.bias)))

        requantization = Requantization(per_channel(self.bias), per_channel(self.multiplier), per_channel(self.shift),
                                        int(target.zero_point), self.output_min, self.output_max)
        return native.integer.conv(form, x, int(source.zero_point), packed, requantization, strides, pads, dilations,
                                   out, storage, layer_thread_count())

    def _weight_range(self) -> tuple[int, int, np.ndarray, np.ndarray]:
        """The least and greatest weight, and each output channel's sum of w and of |w| (int64), which pick
        qconv.c's form (`NativeInteger.form_for`); made once per layer, as `_packing` is."""
        packs = self.__dict__.setdefault("_packs", {})
        if "range" not in packs:
            wide = self.conv_weight().astype(np.int64).reshape(len(self.bias), -1)
            packs["range"] = (int(wide.min()), int(wide.max()), wide.sum(axis=1), np.abs(wide).sum(axis=1))
        return packs["range"]

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


def accumulator_range(weight: np.ndarray, bias: np.ndarray, source: QuantParams,
                      channel_axis: int) -> tuple[np.ndarray, np.ndarray]:
    """bias + sum of min (max) of w * x over x in the centred range of `source`, per output channel."""
    weights = weight.astype(np.int64)
    others = tuple(a for a in range(weights.ndim) if a != channel_axis % weights.ndim)
    centred_low, centred_high = source.qmin - source.zero_point, source.qmax - source.zero_point
    low = bias.astype(np.int64) + np.minimum(weights * centred_low, weights * centred_high).sum(axis=others)
    high = bias.astype(np.int64) + np.maximum(weights * centred_low, weights * centred_high).sum(axis=others)
    return low, high
