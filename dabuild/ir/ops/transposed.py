"""Transposed convolution (ONNX ConvTranspose, torch's ConvTranspose1d/2d/3d).

The gradient of a conv with respect to its input: each input element adds
its weight-scaled kernel into the output at position input * stride + tap *
dilation - pad. The kernel scatters one kernel tap at a time (a strided slice
of the output per tap, one matmul over the channels per tap and group), so it
never loops over pixels.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from dabuild.ir.ops.base import Op, OutputSpec, ShapeError, register
from dabuild.ir.ops.window import window_attrs

if TYPE_CHECKING:
    from dabuild.ir.graph import TensorSpec


def transposed_geometry(attrs: dict[str, Any], spatial: int) -> tuple[list[int], list[int], list[int], list[int]]:
    """strides, pads, dilations, output_padding with their defaults (1, 0, 1, 0 per spatial axis)."""
    return (list(attrs["strides"] or [1] * spatial), list(attrs["pads"] or [0] * (2 * spatial)),
            list(attrs["dilations"] or [1] * spatial), list(attrs["output_padding"] or [0] * spatial))


def transposed_size(size: int | None, kernel: int, stride: int, pads: tuple[int, int], dilation: int,
                    output_padding: int) -> int | None:
    """ONNX's output size: stride * (in - 1) + output_padding + dilation * (kernel - 1) + 1 - pads."""
    if size is None:
        return None
    return stride * (size - 1) + output_padding + dilation * (kernel - 1) + 1 - pads[0] - pads[1]


@register
class ConvTranspose(Op):
    """Transposed convolution over 1 or more spatial axes, with groups, output padding and optional bias."""

    name = "conv_transpose"
    per_sample = True
    arity = (2, 3)
    defaults = {"strides": None, "pads": None, "dilations": None, "groups": 1, "output_padding": None}
    signature = "x (N, C, *spatial), weight (C, O/groups, *kernel), bias? (O,)"
    rule = ("(N, C, *in) -> (N, O, *out), out = stride*(in-1) + output_padding + dilation*(kernel-1) + 1 "
            "- pads")

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        x, weight = tuple(inputs[0].shape), tuple(inputs[1].shape)
        if None in weight[2:]:
            raise ShapeError(f"conv_transpose weight {weight} has a dynamic kernel size")
        kernel = [k for k in weight[2:] if k is not None]
        if len(weight) != len(x):
            raise ShapeError(f"conv_transpose weight {weight} must have the rank of input {x}")
        window_attrs(self.name, x, kernel, attrs)
        groups, channels = attrs["groups"], x[1]
        if groups < 1 or weight[0] % groups or (channels is not None and channels != weight[0]):
            raise ShapeError(f"conv_transpose input has {channels} channels; weight {weight} with groups {groups} "
                             "needs the weight's first axis to equal them and groups to divide it")
        out_channels = weight[1] * groups
        if len(inputs) == 3 and tuple(inputs[2].shape) != (out_channels,):
            raise ShapeError(f"conv_transpose bias must have shape ({out_channels},), got {inputs[2].shape}")
        spatial = len(kernel)
        strides, pads, dilations, output_padding = transposed_geometry(attrs, spatial)
        if len(output_padding) != spatial or any(not 0 <= p < max(s, d) for p, s, d in
                                                 zip(output_padding, strides, dilations)):
            raise ShapeError(f"conv_transpose output_padding {output_padding} must have one entry per spatial axis, "
                             "each below its stride or dilation")
        out = [transposed_size(x[2 + a], kernel[a], strides[a], (pads[a], pads[a + spatial]), dilations[a],
                               output_padding[a]) for a in range(spatial)]
        if any(size is not None and size < 1 for size in out):
            raise ShapeError(f"conv_transpose of {x} with pads {pads} leaves no output")
        return [((x[0], out_channels, *out), inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        x, weight = arrays[0], arrays[1]
        groups, spatial = attrs["groups"], x.ndim - 2
        strides, pads, dilations, output_padding = transposed_geometry(attrs, spatial)
        kernel = weight.shape[2:]
        batch, channels, sizes = x.shape[0], x.shape[1], x.shape[2:]
        group_in, group_out = channels // groups, weight.shape[1]
        # The output before cropping the pads: every tap lands inside it.
        full = [strides[a] * (sizes[a] - 1) + dilations[a] * (kernel[a] - 1) + 1 + output_padding[a]
                for a in range(spatial)]
        y = np.zeros((batch, groups, group_out, *full), np.float64)
        source = x.reshape(batch, groups, group_in, math.prod(sizes)).astype(np.float64)
        taps = weight.reshape(groups, group_in, group_out, *kernel).astype(np.float64)
        for tap in np.ndindex(*kernel):
            # (N, G, O/G, positions): each group's input channels mixed by this tap's (C/G, O/G) weights.
            contribution = np.einsum("ngcp,gco->ngop", source, taps[(slice(None), slice(None), slice(None)) + tap])
            region = tuple(slice(tap[a] * dilations[a], tap[a] * dilations[a] + strides[a] * (sizes[a] - 1) + 1,
                                 strides[a]) for a in range(spatial))
            y[(slice(None), slice(None), slice(None)) + region] += contribution.reshape(batch, groups, group_out,
                                                                                          *sizes)
        crop = tuple(slice(pads[a], full[a] - pads[a + spatial]) for a in range(spatial))
        y = y.reshape(batch, groups * group_out, *full)[(slice(None), slice(None)) + crop]
        if len(arrays) == 3:
            y = y + arrays[2].reshape(-1, *[1] * spatial)
        return [y.astype(np.result_type(x, weight))]
