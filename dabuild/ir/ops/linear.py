"""The ops with weights: matmul, dense, conv, batch_norm.

Conv runs as im2col + one batched BLAS matmul per group: `windows` gives a
strided view of every receptive field, one reshape copies it into columns, and
np.matmul multiplies all images and groups at once. A depthwise conv (one input
channel per group) instead accumulates its few kernel taps elementwise, which
never builds the mostly-zero block-diagonal weight a single matmul would need.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dabuild.ir.ops.activation import apply_activation, check_activation
from dabuild.ir.ops.base import Op, OutputSpec, ShapeError, broadcast_shapes, dims_agree, register
from dabuild.ir.ops.window import Padder, output_sizes, pad_widths, window_attrs, windows

if TYPE_CHECKING:
    from dabuild.ir.graph import TensorSpec

FUSED_ACTIVATION = {"activation": "none", "activation_attrs": {}}


@register
class MatMul(Op):
    """numpy.matmul: 1-D operands are promoted and the promoted axis dropped again."""

    name = "matmul"
    arity = (2, 2)
    signature = "a, b"
    rule = "numpy.matmul: (..., m, k) @ (..., k, n) -> (broadcast ..., m, n)"

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        a, b = tuple(inputs[0].shape), tuple(inputs[1].shape)
        if not a or not b:
            raise ShapeError("matmul does not take scalars")
        a2 = (1, *a) if len(a) == 1 else a
        b2 = (*b, 1) if len(b) == 1 else b
        if not dims_agree(a2[-1], b2[-2]):
            raise ShapeError(f"matmul inner dimensions differ: {a} @ {b}")
        batch = broadcast_shapes(a2[:-2], b2[:-2])
        out = (*batch, *(a2[-2:-1] if len(a) > 1 else ()), *(b2[-1:] if len(b) > 1 else ()))
        return [(out, inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        return [np.matmul(arrays[0], arrays[1])]


@register
class Dense(Op):
    """y = activation(x @ weight + bias); weight (in, out), bias (out,) optional.

    The canonical form of a fully connected layer: quantizers and targets
    handle this one op instead of every matmul/add spelling a frontend emits.
    """

    name = "dense"
    arity = (2, 3)
    defaults = FUSED_ACTIVATION
    signature = "x, weight (in, out), bias? (out,)"
    rule = "(..., in) -> (..., out)"

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        check_activation(self.name, attrs)
        x, weight = inputs[0].shape, inputs[1].shape
        if len(weight) != 2:
            raise ShapeError(f"dense weight must be 2-D (in, out), got {weight}")
        if not x or not dims_agree(x[-1], weight[0]):
            raise ShapeError(f"dense input {x} does not end in the weight's in_features {weight[0]}")
        if len(inputs) == 3 and tuple(inputs[2].shape) != (weight[1],):
            raise ShapeError(f"dense bias must have shape ({weight[1]},), got {inputs[2].shape}")
        return [((*x[:-1], weight[1]), inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        y = np.matmul(arrays[0], arrays[1])
        if len(arrays) == 3:
            y += arrays[2]
        return [apply_activation(y, attrs)]


def conv_geometry(attrs: dict[str, Any], spatial: int) -> tuple[list[int], list[int], list[int]]:
    """strides, pads, dilations with their defaults (1, 0, 1 on every spatial axis) filled in."""
    return (
        list(attrs["strides"] or [1] * spatial),
        list(attrs["pads"] or [0] * (2 * spatial)),
        list(attrs["dilations"] or [1] * spatial),
    )


@register
class Conv(Op):
    """Convolution over 1 or more spatial axes (ONNX Conv), with optional bias and fused activation."""

    name = "conv"
    arity = (2, 3)
    defaults = {"strides": None, "pads": None, "dilations": None, "groups": 1, **FUSED_ACTIVATION}
    signature = "x (N, C, *spatial), weight (O, C/groups, *kernel), bias? (O,)"
    rule = "(N, C, *in) -> (N, O, *out), out = (in + pads - dilation*(kernel-1) - 1) // stride + 1"

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        check_activation(self.name, attrs)
        x, weight = tuple(inputs[0].shape), tuple(inputs[1].shape)
        kernel = list(weight[2:])
        if len(weight) != len(x):
            raise ShapeError(f"conv weight {weight} must have the rank of input {x}")
        window_attrs(self.name, x, kernel, attrs)  # type: ignore[arg-type]
        groups, channels, out_channels = attrs["groups"], x[1], weight[0]
        if groups < 1 or out_channels % groups:
            raise ShapeError(f"conv groups {groups} must divide the {out_channels} output channels")
        if channels is not None and channels != weight[1] * groups:
            raise ShapeError(f"conv input has {channels} channels; weight {weight} with groups {groups} takes "
                             f"{weight[1] * groups}")
        if len(inputs) == 3 and tuple(inputs[2].shape) != (out_channels,):
            raise ShapeError(f"conv bias must have shape ({out_channels},), got {inputs[2].shape}")
        out = output_sizes(x, kernel, *conv_geometry(attrs, len(kernel)))  # type: ignore[arg-type]
        return [((x[0], out_channels, *out), inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        x, weight = arrays[0], arrays[1]
        geometry = Geometry(list(weight.shape[2:]), *conv_geometry(attrs, weight.ndim - 2))
        out = output_sizes(x.shape, geometry.kernel, geometry.strides, geometry.pads, geometry.dilations)
        if attrs["groups"] == x.shape[1] and weight.shape[1] == 1:
            y = _depthwise(x, weight, geometry, out)  # type: ignore[arg-type]
        else:
            y = _im2col_matmul(x, weight, attrs["groups"], geometry, out)  # type: ignore[arg-type]
        y = y.reshape(x.shape[0], weight.shape[0], *out)
        if len(arrays) == 3:
            y += arrays[2].reshape(-1, *[1] * len(out))
        return [apply_activation(y, attrs)]


@dataclass
class Geometry:
    kernel: list[int]
    strides: list[int]
    pads: list[int]
    dilations: list[int]

    def padder(self, x: np.ndarray, block: int, out: list[int]) -> Padder:
        widths = pad_widths(x.shape, self.kernel, self.strides, self.pads, self.dilations, out)
        return Padder(x.shape, block, widths, 0.0, x.dtype)

    def windows(self, padded: np.ndarray, out: list[int]) -> np.ndarray:
        """The (N, C, *kernel, *out) window view of an already padded x."""
        return windows(padded, self.kernel, self.strides, self.dilations, out)


COLUMN_BYTES = 1 << 20  # im2col works on blocks of images whose columns fit a core's L2 cache


def _im2col_matmul(x: np.ndarray, weight: np.ndarray, groups: int, geometry: Geometry, out: list[int]) -> np.ndarray:
    """(N, groups, O/groups, prod(out)): per block of images, copy the windows into columns, then one matmul."""
    batch, channels = x.shape[:2]
    length = math.prod(out)
    weights = weight.reshape(groups, weight.shape[0] // groups, -1)
    dtype = np.result_type(x, weight)
    block = min(batch, max(1, COLUMN_BYTES // (channels * math.prod(geometry.kernel) * length * dtype.itemsize)))
    pad = geometry.padder(x, block, out)
    # One window view serves every block: of x itself, or of the padding buffer that each block is copied into.
    view = geometry.windows(x if pad.buffer is None else pad.buffer, out)
    columns = np.empty((block, channels, *geometry.kernel, *out), dtype)
    y = np.empty((batch, groups, weights.shape[1], length), dtype)
    for start in range(0, batch, block):
        count = min(block, batch - start)
        if pad.buffer is None:
            windows_of_block = view[start:start + count]
        else:
            pad(x[start:start + count])
            windows_of_block = view[:count]
        part = columns[:count]
        np.copyto(part, windows_of_block)
        np.matmul(weights, part.reshape(count, groups, -1, length), out=y[start:start + count])
    return y


def _depthwise(x: np.ndarray, weight: np.ndarray, geometry: Geometry, out: list[int]) -> np.ndarray:
    """Depthwise conv (O = C * m): y[n, c*m + j] = sum over taps k of w[c*m + j, k] * window_k(x)[n, c]."""
    batch, channels = x.shape[:2]
    view = geometry.windows(geometry.padder(x, batch, out)(x), out)
    multiplier = weight.shape[0] // channels
    taps = weight.reshape(channels, multiplier, -1, *[1] * len(out))
    y = np.zeros((batch, channels, multiplier, *out), np.result_type(x, weight))
    term = np.empty_like(y)
    for index, tap in enumerate(np.ndindex(*geometry.kernel)):
        np.multiply(view[(slice(None), slice(None), *tap)][:, :, None], taps[:, :, index], out=term)
        y += term
    return y


def batch_norm_affine(
    scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray, epsilon: float
) -> tuple[np.ndarray, np.ndarray]:
    """(multiplier, offset) per channel with batch_norm(x) = x * multiplier + offset, computed in float64.

    The kernel and the folding pass both use this, so a folded graph differs
    from the unfolded one only by the rounding of the folded weights.
    """
    multiplier = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + epsilon)
    offset = bias.astype(np.float64) - mean.astype(np.float64) * multiplier
    return multiplier.astype(np.float32), offset.astype(np.float32)


@register
class BatchNorm(Op):
    """Inference batch normalisation over channel axis 1 (ONNX BatchNormalization)."""

    name = "batch_norm"
    arity = (5, 5)
    defaults = {"epsilon": 1e-5}
    signature = "x (N, C, ...), scale, bias, mean, var (each (C,))"
    rule = "same shape as x"

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        x = tuple(inputs[0].shape)
        if len(x) < 2:
            raise ShapeError(f"batch_norm needs an (N, C, ...) input, got {x}")
        for role, spec in zip(("scale", "bias", "mean", "var"), inputs[1:]):
            if len(spec.shape) != 1 or not dims_agree(spec.shape[0], x[1]):
                raise ShapeError(f"batch_norm {role} must have shape ({x[1]},), got {spec.shape}")
        return [(x, inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        x = arrays[0]
        multiplier, offset = batch_norm_affine(*arrays[1:], attrs["epsilon"])
        channel = (-1, *[1] * (x.ndim - 2))
        y = x * multiplier.reshape(channel)
        y += offset.reshape(channel)
        return [y]
