"""Normalisations that use statistics of the input itself: layer, instance, group norm and LRN.

Unlike batch_norm (fixed statistics, an affine map per channel), these divide
by a standard deviation or a sum of squares computed from each sample, so
they have no exact integer form in dabuild: integer lowering refuses them and
they run in float (see `dabuild.quant.lowering.FLOAT_ONLY`). Statistics are
accumulated in float64 and the result returned in x's float type, so the
float kernels agree with onnxruntime and torch to float32 rounding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from dabuild.ir.ops.base import REQUIRED, Op, OutputSpec, ShapeError, check_vector, dims_agree, normalize_axis, register

if TYPE_CHECKING:
    from dabuild.ir.graph import TensorSpec


def _standardize(x: np.ndarray, axes: tuple[int, ...], epsilon: float) -> np.ndarray:
    """(x - mean) / sqrt(var + epsilon) over `axes`, in float64."""
    wide = x.astype(np.float64)
    mean = wide.mean(axis=axes, keepdims=True)
    centred = wide - mean
    variance = np.mean(centred * centred, axis=axes, keepdims=True)
    return centred / np.sqrt(variance + epsilon)


class ChannelNorm(Op):
    """Shared shape rule of instance_norm and group_norm: x (N, C, ...), scale and bias (C,)."""

    per_sample = True
    arity = (3, 3)
    signature = "x (N, C, ...), scale (C,), bias (C,)"
    rule = "same shape as x"

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        x = tuple(inputs[0].shape)
        if len(x) < 3:
            raise ShapeError(f"{self.name} needs an (N, C, spatial...) input, got {x}")
        for role, spec in zip(("scale", "bias"), inputs[1:]):
            check_vector(self.name, role, spec, x[1])
        self.check(x, attrs)
        return [(x, inputs[0].dtype)]

    def check(self, shape: tuple[int | None, ...], attrs: dict[str, Any]) -> None:
        """ShapeError if the attributes do not fit the input shape."""

    def affine(self, normalized: np.ndarray, x: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> np.ndarray:
        channel = (-1, *[1] * (x.ndim - 2))
        y = normalized * scale.reshape(channel).astype(np.float64) + bias.reshape(channel).astype(np.float64)
        return y.astype(x.dtype)


@register
class InstanceNorm(ChannelNorm):
    """ONNX InstanceNormalization: each (sample, channel) standardised over its spatial axes, then scaled."""

    name = "instance_norm"
    defaults = {"epsilon": 1e-5}

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        x, scale, bias = arrays
        normalized = _standardize(x, tuple(range(2, x.ndim)), attrs["epsilon"])
        return [self.affine(normalized, x, scale, bias)]


@register
class GroupNorm(ChannelNorm):
    """torch's group_norm (ONNX GroupNormalization 21): channels in `groups` groups, each standardised over
    its channels and spatial axes, then scaled per channel."""

    name = "group_norm"
    defaults = {"groups": REQUIRED, "epsilon": 1e-5}

    def check(self, shape: tuple[int | None, ...], attrs: dict[str, Any]) -> None:
        groups, channels = attrs["groups"], shape[1]
        if groups < 1 or (channels is not None and channels % groups):
            raise ShapeError(f"group_norm groups {groups} must divide the {channels} channels")

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        x, scale, bias = arrays
        grouped = x.reshape(x.shape[0], attrs["groups"], -1)
        normalized = _standardize(grouped, (2,), attrs["epsilon"]).reshape(x.shape)
        return [self.affine(normalized, x, scale, bias)]


@register
class LayerNorm(Op):
    """ONNX LayerNormalization: standardised over the axes from `axis` on, times scale plus bias (both
    shaped like those axes, or broadcasting to them)."""

    name = "layer_norm"
    arity = (1, 3)
    defaults = {"axis": -1, "epsilon": 1e-5}
    signature = "x, scale?, bias? (shape[axis:])"
    rule = "same shape as x"

    def samplewise(self, attrs: dict[str, Any]) -> bool:
        return bool(self.resolve(attrs)["axis"] != 0)

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        x = tuple(inputs[0].shape)
        axis = normalize_axis(attrs["axis"], len(x), "layer_norm")
        normalized = x[axis:]
        for role, spec in zip(("scale", "bias"), inputs[1:]):
            shape = tuple(spec.shape)
            if len(shape) > len(normalized) or not all(
                    d == 1 or dims_agree(d, n) for d, n in zip(shape[::-1], normalized[::-1])):
                raise ShapeError(f"layer_norm {role} {shape} does not broadcast to the normalized axes {normalized}")
        return [(x, inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        x = arrays[0]
        axis = attrs["axis"] % x.ndim
        y = _standardize(x, tuple(range(axis, x.ndim)), attrs["epsilon"])
        if len(arrays) > 1:
            y = y * arrays[1].astype(np.float64)
        if len(arrays) > 2:
            y = y + arrays[2].astype(np.float64)
        return [y.astype(x.dtype)]


@register
class Lrn(Op):
    """Local response normalisation across channels (ONNX LRN, AlexNet/GoogLeNet):
    x / (bias + alpha / size * sum of x**2 over the `size` channels around each one) ** beta."""

    name = "lrn"
    per_sample = True
    defaults = {"size": REQUIRED, "alpha": 1e-4, "beta": 0.75, "bias": 1.0}
    signature = "x (N, C, ...)"
    rule = "same shape as x"

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        x = tuple(inputs[0].shape)
        if len(x) < 2 or attrs["size"] < 1:
            raise ShapeError(f"lrn needs an (N, C, ...) input and size >= 1, got {x} and size {attrs['size']}")
        return [(x, inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        x = arrays[0]
        size = attrs["size"]
        before, after = (size - 1) // 2, size - 1 - (size - 1) // 2  # ONNX: floor((size-1)/2), ceil((size-1)/2)
        square = x.astype(np.float64) ** 2
        padded = np.pad(square, [(0, 0), (before, after), *[(0, 0)] * (x.ndim - 2)])
        total = np.cumsum(padded, axis=1)
        total = np.concatenate([total[:, size - 1:size], total[:, size:] - total[:, :-size]], axis=1)
        scale = (attrs["bias"] + attrs["alpha"] / size * total) ** attrs["beta"]
        return [(x / scale).astype(x.dtype)]
