"""Fused data movement: a run of consecutive reshape, transpose, concat, slice and split steps as one step.

ShuffleNet spends much of its time between convs moving channels. v2's unit ends in concat -> reshape ->
transpose -> reshape (the channel shuffle) -> two slices, v1's in the shuffle alone: node by node that is up
to six numpy calls and three copies (the concat, the shuffle's regrouping, the next conv's copy of a slice
that is not contiguous), tens of microseconds of Python per step at batch 1. These ops only move values, so
where every value of a run's outputs comes from is fixed by the inputs' shapes: running the same steps once
on arrays that number the inputs' elements says it. Where each output pixel (n, h, w) takes its channels from
the same pixel of the inputs, the run becomes one gather per output (gather.c) into channels-last memory that
the next conv reads as it is. Only runs of samplewise nodes fuse, so the numbering runs on one sample (a
batch of 64 would take hundreds of MB of int64 indices) and holds for every sample. Otherwise (a reshape that moves values between pixels, a dtype other than
float32, no native kernels) the steps run one by one, as unfused. Either way every value is a copy, bit for bit.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import numpy as np

from dabuild.ir.kernels.gather import PreparedGather, channel_runs
from dabuild.ir.kernels.native import address, aligned_empty, native_conv, native_switched_on
from dabuild.ir.ops.base import Kernel

MOVES = frozenset({"reshape", "transpose", "concat", "slice", "split", "identity", "squeeze", "unsqueeze"})
Part = tuple[Kernel, list[str], list[str]]  # one step of the run: its kernel, input and output names
PLANS_KEPT = 16  # input layouts whose gathers a fused run keeps (batch sizes and memory orders seen)


class FusedMovement:
    """The kernel of a run of data-movement steps: the inputs of the run (tensors made before it) in, the
    tensors that later steps or the graph's outputs read out."""

    def __init__(self, parts: list[Part], inputs: list[str], outputs: list[str]):
        self.parts, self.inputs, self.outputs = parts, inputs, outputs
        self._plans: dict[tuple[object, ...], GatherPlan | None] = {}

    def __call__(self, arrays: list[np.ndarray], out: np.ndarray | None) -> list[np.ndarray]:
        key = tuple((array.shape, array.strides, array.dtype.char) for array in arrays)
        if key not in self._plans:
            if len(self._plans) >= PLANS_KEPT:
                self._plans.clear()
            self._plans[key] = self._plan(arrays)
        plan = self._plans[key]
        return self.one_by_one(arrays) if plan is None or not native_switched_on() else plan(arrays)

    def one_by_one(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The run's steps one after another, as the unfused plan runs them."""
        values = dict(zip(self.inputs, arrays))
        for kernel, inputs, outputs in self.parts:
            values.update(zip(outputs, kernel([values[name] for name in inputs], None)))
        return [values[name] for name in self.outputs]

    def _plan(self, arrays: list[np.ndarray]) -> GatherPlan | None:
        """The gathers that compute the outputs from inputs of these shapes and memory orders, or None where
        an output is not a per-pixel choice of input channels."""
        native = native_conv()
        if (native is None or not self.outputs
                or any(array.dtype != np.float32 or array.ndim != 4 or array.size == 0 for array in arrays)):
            return None
        samples = {len(array) for array in arrays}
        if len(samples) != 1:
            return None
        shapes = np.array([(1, *array.shape[1:]) for array in arrays])  # one sample: each sample moves alike
        sizes = shapes.prod(axis=1)
        ends = np.cumsum(sizes)
        starts = ends - sizes
        numbered = self.one_by_one([np.arange(start, end).reshape(shape)
                                    for start, end, shape in zip(starts, ends, shapes)])
        gathers = []
        for result in numbered:
            if result.ndim != 4 or result.size == 0 or len(result) != 1:
                return None
            batch, _, height, width = result.shape
            sources = np.searchsorted(ends, result, side="right")
            if not all((shapes[source, [0, 2, 3]] == (batch, height, width)).all() for source in np.unique(sources)):
                return None  # an input of other pixels: its pixel p is not the output's
            local = result - starts[sources]
            pixel = local % width + local // (width * height * shapes[sources, 1]) * height * width \
                + local // width % height * width  # the input pixel (n * H + h) * W + w of each value
            if not np.array_equal(pixel, np.arange(batch * height * width).reshape(batch, 1, height, width)
                                  + np.zeros_like(pixel)):
                return None
            channels = local // (width * height) % shapes[sources, 1]
            first_sources, first_channels = sources[0, :, 0, 0], channels[0, :, 0, 0]
            if (sources != first_sources[None, :, None, None]).any() or \
                    (channels != first_channels[None, :, None, None]).any():
                return None
            gathers.append((channel_runs(first_sources, first_channels), (len(arrays[0]), *result.shape[1:])))
        steps = [_pixel_step(array) for array in arrays]
        prepared = [native.gather.prepare(runs, [step or array.shape[1] for step, array in zip(steps, arrays)],
                                          shape[1]) for runs, shape in gathers]
        return GatherPlan(prepared, [shape for _, shape in gathers], [step is None for step in steps])


class GatherPlan:
    """A fused run prepared for one layout of its inputs: one gather per output, and which inputs must first
    be copied channels-last (a layout that is not, rare between convs)."""

    def __init__(self, gathers: list[PreparedGather], shapes: list[tuple[int, ...]], copies: list[bool]):
        self.gathers, self.shapes, self.copies = gathers, shapes, copies

    def __call__(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        views = [np.ascontiguousarray(array.transpose(0, 2, 3, 1)) if copy else array
                 for array, copy in zip(arrays, self.copies)]
        inputs = (ctypes.c_void_p * len(views))(*(address(view) for view in views))
        results = []
        for gather, (batch, channels, height, width) in zip(self.gathers, self.shapes):
            y = aligned_empty((batch, height, width, channels), np.dtype(np.float32))
            gather(inputs, address(y), batch * height * width)
            results.append(y.transpose(0, 3, 1, 2))
        return results


def _pixel_step(array: np.ndarray) -> int | None:
    """Elements from one pixel to the next where the (N, C, H, W) array is held channels last, its channels
    adjacent and its pixels equally spaced (a conv's output or a channel slice of one); else None."""
    batch, channels, height, width = array.shape
    item = array.itemsize
    step = (array.strides[3] if width > 1 else array.strides[2] if height > 1 else array.strides[0] if batch > 1
            else channels * item)
    expected = {1: item, 2: step * width, 0: step * width * height}
    if step % item or step < channels * item or any(
            array.shape[axis] > 1 and array.strides[axis] != stride for axis, stride in expected.items()):
        return None
    return step // item
