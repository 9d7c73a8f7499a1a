"""Sliding windows over the spatial axes of an (N, C, *spatial) tensor, shared by conv and pooling.

Kernels never loop over pixels: `windows` returns a strided view of every
window at once, and loops (if any) run over the few kernel taps.
"""

from __future__ import annotations

import math
from typing import Any, overload

import numpy as np
from numpy.lib.stride_tricks import as_strided, sliding_window_view

from dabuild.ir.ops.base import ShapeError


def window_attrs(op: str, shape: tuple[int | None, ...], kernel: list[int], attrs: dict[str, Any]) -> None:
    """ShapeError unless strides/pads/dilations (None = default) fit a rank-`shape` input and `kernel`."""
    spatial = len(shape) - 2
    if spatial < 1:
        raise ShapeError(f"{op} needs an (N, C, spatial...) input, got {shape}")
    if len(kernel) != spatial or any(k < 1 for k in kernel):
        raise ShapeError(f"{op} kernel {kernel} does not fit the {spatial} spatial axes of {shape}")
    expected = {"strides": spatial, "pads": 2 * spatial, "dilations": spatial}
    for key, length in expected.items():
        value = attrs.get(key)
        if value is not None and len(value) != length:
            raise ShapeError(f"{op} {key} {value} must have {length} entries for input {shape}")
    if any(s < 1 for s in attrs.get("strides") or []) or any(d < 1 for d in attrs.get("dilations") or []):
        raise ShapeError(f"{op} strides and dilations must be positive")
    if any(p < 0 for p in attrs.get("pads") or []):
        raise ShapeError(f"{op} pads {attrs['pads']} must not be negative")


@overload
def output_size(size: int, kernel: int, stride: int, pads: tuple[int, int], dilation: int,
                ceil_mode: bool = False) -> int: ...
@overload
def output_size(size: int | None, kernel: int, stride: int, pads: tuple[int, int], dilation: int,
                ceil_mode: bool = False) -> int | None: ...
def output_size(
    size: int | None, kernel: int, stride: int, pads: tuple[int, int], dilation: int, ceil_mode: bool = False
) -> int | None:
    """Windows along one axis (ONNX/torch rule: in ceil mode the last window must start inside the input)."""
    if size is None:
        return None
    span = dilation * (kernel - 1) + 1
    room = size + pads[0] + pads[1] - span
    if room < 0:
        raise ShapeError(f"a window of span {span} does not fit an axis of {size} padded by {list(pads)}")
    count = (math.ceil(room / stride) if ceil_mode else room // stride) + 1
    if ceil_mode and (count - 1) * stride >= size + pads[0]:
        count -= 1
    return count


@overload
def output_sizes(shape: tuple[int, ...], kernel: list[int], strides: list[int], pads: list[int],
                 dilations: list[int], ceil_mode: bool = False) -> list[int]: ...
@overload
def output_sizes(shape: tuple[int | None, ...], kernel: list[int], strides: list[int], pads: list[int],
                 dilations: list[int], ceil_mode: bool = False) -> list[int | None]: ...
def output_sizes(
    shape: tuple[int | None, ...], kernel: list[int], strides: list[int], pads: list[int],
    dilations: list[int], ceil_mode: bool = False,
) -> list[int | None] | list[int]:
    """Windows along each spatial axis of an (N, C, *spatial) shape; known sizes give known counts."""
    spatial = len(kernel)
    return [
        output_size(shape[2 + a], kernel[a], strides[a], (pads[a], pads[a + spatial]), dilations[a], ceil_mode)
        for a in range(spatial)
    ]


def pad_widths(
    shape: tuple[int, ...], kernel: list[int], strides: list[int], pads: list[int], dilations: list[int], out: list[int]
) -> list[tuple[int, int]]:
    """(begin, end) padding per spatial axis: `pads`, plus at the end whatever the last (ceil-mode) window reaches."""
    spatial = len(kernel)
    widths = []
    for a in range(spatial):
        reach = (out[a] - 1) * strides[a] + dilations[a] * (kernel[a] - 1) + 1
        widths.append((pads[a], max(pads[a + spatial], reach - shape[2 + a] - pads[a])))
    return widths


class Padder:
    """Pads blocks of up to `block` images into one reused buffer whose border keeps `fill`.

    np.pad allocates and fills a new array per call; conv pads block after
    block, so writing only the interior of a prepared buffer saves that work.
    With `channels_last` the buffer is (block, *spatial, C): conv's matmul wants
    each window's channels contiguous, and the interior copy does the transpose.
    """

    def __init__(self, shape: tuple[int, ...], block: int, widths: list[tuple[int, int]], fill: float, dtype: np.dtype,
                 channels_last: bool = False):
        spatial = [size + begin + end for size, (begin, end) in zip(shape[2:], widths)]
        padded = (block, *spatial, shape[1]) if channels_last else (block, shape[1], *spatial)
        self.buffer = np.full(padded, fill, dtype) if any(begin or end for begin, end in widths) else None
        inside = tuple(slice(b, b + size) for size, (b, _) in zip(shape[2:], widths))
        self.interior = (slice(None), *inside, slice(None)) if channels_last else (slice(None), slice(None), *inside)
        self.channels_last = channels_last

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """x (N, C, *spatial) padded, in the buffer's layout (a view of x when there is nothing to pad)."""
        if self.channels_last:
            x = channels_last(x)
        if self.buffer is None:
            return x
        padded = self.buffer[: len(x)]
        padded[self.interior] = x
        return padded


def channels_last(x: np.ndarray) -> np.ndarray:
    """The (N, *spatial, C) view of an (N, C, *spatial) array."""
    return x.transpose(0, *range(2, x.ndim), 1)


def windows(padded: np.ndarray, kernel: list[int], strides: list[int], dilations: list[int], out: list[int]) -> np.ndarray:
    """A view of shape (N, C, *kernel, *out): element [n, c, *k, *o] = padded[n, c, *(o * stride + k * dilation)]."""
    spatial = len(kernel)
    axes = tuple(range(2, 2 + spatial))
    spans = [d * (k - 1) + 1 for k, d in zip(kernel, dilations)]
    view = sliding_window_view(padded, spans, axis=axes)  # (N, C, *positions, *spans)
    picks = tuple(slice(0, (o - 1) * s + 1, s) for o, s in zip(out, strides))
    taps = tuple(slice(None, None, d) for d in dilations)
    view = view[(slice(None), slice(None)) + picks + taps]
    return view.transpose(0, 1, *range(2 + spatial, 2 + 2 * spatial), *axes)



def windows_last(
    padded: np.ndarray, kernel: list[int], strides: list[int], dilations: list[int], out: list[int]
) -> np.ndarray:
    """A view of shape (N, *out, *kernel, C) of a channels-last (N, *spatial, C) array:
    element [n, *o, *k, c] = padded[n, *(o * stride + k * dilation), c]."""
    steps = padded.strides[1:-1]
    return as_strided(
        padded,
        (len(padded), *out, *kernel, padded.shape[-1]),
        (padded.strides[0], *(s * t for s, t in zip(steps, strides)), *(s * d for s, d in zip(steps, dilations)),
         padded.strides[-1]),
        writeable=False,
    )
