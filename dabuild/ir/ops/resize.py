"""Resize (ONNX Resize/Upsample, torch's interpolate): nearest or linear, axis by axis.

Each resized axis maps every output index to a source coordinate by the
coordinate transformation mode (ONNX's formulas), then takes the nearest
source element (by `nearest_mode`) or the two around it with linear weights.
Linear interpolation over several axes is the same as one axis after the
other (ONNX's "linear" is separable), so the kernel is a loop over axes of one
`take` (nearest) or two `take`s and a weighted sum (linear).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from dabuild.ir.ops.base import REQUIRED, Op, OutputSpec, ShapeError, register

if TYPE_CHECKING:
    from dabuild.ir.graph import TensorSpec

MODES = ("nearest", "linear")
COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                    "tf_half_pixel_for_nn")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def source_coordinates(out_size: int, in_size: int, scale: float, mode: str) -> np.ndarray:
    """The source coordinate of each output index along one axis (ONNX Resize's formulas, in float64).

    As ONNX, the formulas use the real output length in_size * scale, which scales given as such need not make
    a whole number."""
    index = np.arange(out_size, dtype=np.float64)
    length = in_size * scale
    if mode == "half_pixel":
        return (index + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = in_size / 2 * (1 - out_size / length)
        return offset + (index + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (index + 0.5) / scale - 0.5 if length > 1 else np.zeros(out_size)
    if mode == "align_corners":
        return index * (in_size - 1) / (length - 1) if length > 1 else np.zeros(out_size)
    if mode == "asymmetric":
        return index / scale
    return (index + 0.5) / scale  # tf_half_pixel_for_nn


def nearest_indices(coordinates: np.ndarray, in_size: int, mode: str) -> np.ndarray:
    """The source element each coordinate picks, clamped to the axis."""
    if mode == "round_prefer_floor":
        picked = np.where(coordinates - np.floor(coordinates) == 0.5, np.floor(coordinates), np.round(coordinates))
    elif mode == "round_prefer_ceil":
        picked = np.floor(coordinates + 0.5)
    elif mode == "floor":
        picked = np.floor(coordinates)
    else:
        picked = np.ceil(coordinates)
    return np.clip(picked, 0, in_size - 1).astype(np.int64)


def linear_taps(coordinates: np.ndarray, in_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lower index, upper index, weight of the upper) per coordinate, clamped to the axis as ONNX does."""
    coordinates = np.clip(coordinates, 0, in_size - 1)
    lower = np.floor(coordinates).astype(np.int64)
    upper = np.minimum(lower + 1, in_size - 1)
    return lower, upper, coordinates - lower


@register
class Resize(Op):
    """Nearest or linear resize of every axis to `sizes` (the batch axis keeps its size), with ONNX's
    coordinate transformation and nearest rounding modes; `scales` are the factors the coordinates use."""

    name = "resize"
    per_sample = True
    defaults = {"sizes": REQUIRED, "scales": REQUIRED, "mode": "nearest",
                "coordinate_transformation_mode": "half_pixel", "nearest_mode": "round_prefer_floor"}
    rule = "(N, *in) -> (N, *sizes[1:])"

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        x = tuple(inputs[0].shape)
        self.validate(len(x), attrs)
        sizes = list(attrs["sizes"])
        return [((x[0], *sizes[1:]), inputs[0].dtype)]

    def validate(self, rank: int, attrs: dict[str, Any]) -> None:
        sizes, scales = attrs["sizes"], attrs["scales"]
        if len(sizes) != rank or len(scales) != rank:
            raise ShapeError(f"resize sizes {sizes} and scales {scales} need one entry per axis of a rank-{rank} "
                             "input")
        if scales[0] != 1:
            raise ShapeError("resize of the batch axis (axis 0) mixes samples")
        if any(size < 1 for size in sizes[1:]) or any(scale <= 0 for scale in scales):
            raise ShapeError(f"resize sizes {sizes} and scales {scales} must be positive")
        for key, allowed in (("mode", MODES), ("coordinate_transformation_mode", COORDINATE_MODES),
                             ("nearest_mode", NEAREST_MODES)):
            if attrs[key] not in allowed:
                raise ShapeError(f"resize {key} {attrs[key]!r} is not one of {', '.join(allowed)}")

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        y = arrays[0]
        for axis in range(1, y.ndim):
            y = self.along(y, axis, attrs)
        return [y]

    def along(self, x: np.ndarray, axis: int, attrs: dict[str, Any]) -> np.ndarray:
        """x resized along one axis."""
        in_size, out_size, scale = x.shape[axis], int(attrs["sizes"][axis]), float(attrs["scales"][axis])
        if in_size == out_size and scale == 1:
            return x
        coordinates = source_coordinates(out_size, in_size, scale, attrs["coordinate_transformation_mode"])
        if attrs["mode"] == "nearest":
            return np.take(x, nearest_indices(coordinates, in_size, attrs["nearest_mode"]), axis=axis)
        lower, upper, weight = linear_taps(coordinates, in_size)
        shape = [1] * x.ndim
        shape[axis] = out_size
        weight = weight.reshape(shape)
        low, high = np.take(x, lower, axis=axis).astype(np.float64), np.take(x, upper, axis=axis)
        return (low + (high - low) * weight).astype(x.dtype)


def resize_scales(in_sizes: list[int], out_sizes: list[int]) -> list[float]:
    """The factors ONNX derives from sizes when only sizes are given."""
    return [out / size if size else 1.0 for size, out in zip(in_sizes, out_sizes)]


def sizes_from_scales(in_sizes: list[int], scales: list[float]) -> list[int]:
    """ONNX's output sizes for scales: floor(in * scale)."""
    return [math.floor(size * scale + 1e-9) for size, scale in zip(in_sizes, scales)]
