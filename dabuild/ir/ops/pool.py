"""Pooling: max, average and global average over the spatial axes of (N, C, *spatial).

Max and average pooling combine the strided views of their kernel taps
elementwise (a loop over the few taps, never over pixels). A 2-D float32 max
or average pool of a tensor kept channels last (a conv's output) runs
natively instead (dabuild/ir/kernels/pool.c, the same floats bit for bit):
numpy's strided views of a channels-last tensor took ShuffleNet v1's three
average pools 1.9 ms, a sixth of its run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from dabuild.ir.kernels.native import native_conv
from dabuild.ir.ops.base import REQUIRED, Op, OutputSpec, ShapeError, register
from dabuild.ir.ops.window import Padder, channels_last, output_sizes, pad_widths, window_attrs, windows

if TYPE_CHECKING:
    from dabuild.ir.graph import TensorSpec


class Pool(Op):
    """Shared geometry: kernel, strides (default = kernel), pads, dilations, ceil_mode."""

    defaults = {"kernel": REQUIRED, "strides": None, "pads": None, "ceil_mode": False}
    rule = "(N, C, *in) -> (N, C, *out), out = (in + pads - dilation*(kernel-1) - 1) / stride + 1, floor or ceil"

    def geometry(self, attrs: dict[str, Any]) -> tuple[list[int], list[int], list[int], list[int]]:
        """kernel, strides, pads, dilations with defaults filled in."""
        kernel = list(attrs["kernel"])
        return (
            kernel,
            list(attrs["strides"] or kernel),
            list(attrs["pads"] or [0] * (2 * len(kernel))),
            list(attrs.get("dilations") or [1] * len(kernel)),
        )

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        x = tuple(inputs[0].shape)
        window_attrs(self.name, x, list(attrs["kernel"]), attrs)
        out = output_sizes(x, *self.geometry(attrs), attrs["ceil_mode"])
        return [((*x[:2], *out), inputs[0].dtype)]

    def tap_views(self, x: np.ndarray, attrs: dict[str, Any], fill: float) -> tuple[list[np.ndarray], list[int]]:
        """One strided (N, C, *out) view per kernel tap of x padded with `fill`, and the output sizes."""
        kernel, strides, pads, dilations = self.geometry(attrs)
        out = output_sizes(x.shape, kernel, strides, pads, dilations, attrs["ceil_mode"])
        return _taps(x, kernel, strides, pads, dilations, out, fill), out


def _taps(x: np.ndarray, kernel: list[int], strides: list[int], pads: list[int], dilations: list[int],
          out: list[int], fill: float) -> list[np.ndarray]:
    """One strided (N, C, *out) view per kernel tap of x padded with `fill` (pads, then out's overhang).

    A channels-last x (a conv's output) is padded channels-last, so the taps, and a result made like them
    (`_like_taps`), keep that memory order for the next conv.
    """
    widths = pad_widths(x.shape, kernel, strides, pads, dilations, out)
    last = x.ndim > 2 and channels_last(x).flags.c_contiguous and not x.flags.c_contiguous
    padded = Padder(x.shape, len(x), widths, fill, x.dtype, channels_last=last)(x)
    if last:  # the (N, *spatial, C) buffer seen as (N, C, *spatial)
        padded = padded.transpose(0, -1, *range(1, x.ndim - 1))
    view = windows(padded, kernel, strides, dilations, out)
    return [view[(slice(None), slice(None)) + tap] for tap in np.ndindex(*kernel)]


@register
class MaxPool(Pool):
    name = "max_pool"
    per_sample = True
    defaults = {**Pool.defaults, "dilations": None}
    rule = Pool.rule + "; padding never wins"

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        native = _native_pool(arrays[0], *self.geometry(attrs), attrs["ceil_mode"])
        if native is not None:
            return [native]
        taps, _ = self.tap_views(arrays[0], attrs, -np.inf)
        y = taps[0].copy(order="K")  # the taps' memory order: channels last after a conv
        for tap in taps[1:]:
            np.maximum(y, tap, out=y)
        return [y]


def _native_pool(x: np.ndarray, kernel: list[int], strides: list[int], pads: list[int], dilations: list[int],
                 ceil_mode: bool, divisors: Callable[[], np.ndarray] | None = None) -> np.ndarray | None:
    """The 2-D max pool (average pool, given its `divisors`) of a float32 x kept channels last (a conv's
    output) by dabuild.ir.kernels' pool.c, as the (N, C, OH, OW) view of its channels-last result; None where
    that does not apply (numpy runs it)."""
    if x.dtype != np.float32 or x.ndim != 4 or not channels_last(x).flags.c_contiguous:
        return None
    native = native_conv()
    if native is None:
        return None
    out: list[int] = output_sizes(x.shape, kernel, strides, pads, dilations, ceil_mode)
    y = native.pool(channels_last(x), kernel, strides, pads[:2], dilations, out,
                    None if divisors is None else divisors())
    return y.transpose(0, 3, 1, 2)


@register
class AvgPool(Pool):
    """Average pooling; with count_include_pad the explicit pads count, the ceil-mode overhang never does."""

    name = "avg_pool"
    per_sample = True
    defaults = {**Pool.defaults, "count_include_pad": False}

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        x = arrays[0]
        native = _native_pool(x, *self.geometry(attrs), attrs["ceil_mode"], lambda: self.divisors(x.shape, attrs))
        if native is not None:
            return [native]
        taps, _out = self.tap_views(x, attrs, 0.0)
        y = taps[0].copy(order="K")
        for tap in taps[1:]:
            y += tap
        y /= self.divisors(x.shape, attrs)
        return [y]

    def divisors(self, shape: tuple[int, ...], attrs: dict[str, Any]) -> np.ndarray:
        """How many elements each window averages (read-only; made once per shape and geometry)."""
        kernel, strides, pads, dilations = self.geometry(attrs)
        return _divisors(tuple(shape), tuple(kernel), tuple(strides), tuple(pads), tuple(dilations),
                         bool(attrs["ceil_mode"]), bool(attrs["count_include_pad"]))


@functools.lru_cache(maxsize=64)
def _divisors(shape: tuple[int, ...], kernel: tuple[int, ...], strides: tuple[int, ...], pads: tuple[int, ...],
              dilations: tuple[int, ...], ceil_mode: bool, count_include_pad: bool) -> np.ndarray:
    """AvgPool's counts: a mask of the counted region pooled with the same geometry. Cached: making them took
    half of a small native average pool's time."""
    out = output_sizes(shape, list(kernel), list(strides), list(pads), list(dilations), ceil_mode)
    spatial = len(kernel)
    if count_include_pad:  # the explicit pads as ones, so only the overhang pads with zeros
        counted = np.ones([shape[2 + a] + pads[a] + pads[a + spatial] for a in range(spatial)], np.float32)
        pads = (0,) * (2 * spatial)
    else:
        counted = np.ones(shape[2:], np.float32)
    taps = _taps(counted[None, None], list(kernel), list(strides), list(pads), list(dilations), out, 0.0)
    counts = np.sum(taps, axis=0)[0, 0]
    counts.flags.writeable = False
    return counts


@register
class GlobalAvgPool(Op):
    name = "global_avg_pool"
    per_sample = True
    rule = "(N, C, *spatial) -> (N, C, 1, ...)"

    def shape_rule(self, inputs: list[TensorSpec], attrs: dict[str, Any]) -> list[OutputSpec]:
        x = tuple(inputs[0].shape)
        if len(x) < 3:
            raise ShapeError(f"global_avg_pool needs an (N, C, spatial...) input, got {x}")
        return [((*x[:2], *[1] * (len(x) - 2)), inputs[0].dtype)]

    def kernel(self, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        x = arrays[0]
        return [x.mean(axis=tuple(range(2, x.ndim)), keepdims=True, dtype=x.dtype)]
