"""gather.c from Python: a fused run of data-movement nodes (dabuild.ir.movement) as one channel gather.

Loaded with the interpreter's native kernels (`dabuild.ir.kernels.native`, same library, cache and proof).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np


class GatherRun(ctypes.Structure):
    """gather.c's `GatherRun`: `length` channels of input `input` from `source` on, to target, target + step, ..."""

    _fields_ = [(name, ctypes.c_ssize_t) for name in ("input", "source", "target", "step", "length")]


class ChannelGatherCall(ctypes.Structure):
    """gather.c's `ChannelGather`: one output's runs, its inputs and its memory."""

    _fields_ = [("inputs", ctypes.c_void_p), ("pixel_steps", ctypes.c_void_p), ("runs", ctypes.c_void_p),
                ("count", ctypes.c_ssize_t), ("y", ctypes.c_void_p), ("channels", ctypes.c_ssize_t)]


def channel_runs(sources: np.ndarray, channels: np.ndarray) -> list[tuple[int, int, int, int, int]]:
    """Output channel c comes from channel channels[c] of input sources[c]: that mapping as gather.c's runs
    (input, source, target, step, length), each run consecutive input channels sent to equally spaced
    output channels."""
    order = sorted(range(len(sources)), key=lambda c: (int(sources[c]), int(channels[c]), c))
    runs: list[list[int]] = []
    for target in order:
        source, channel = int(sources[target]), int(channels[target])
        last = runs[-1] if runs else None
        if (last is not None and last[0] == source and last[1] + last[4] == channel
                and (last[4] == 1 or last[2] + last[3] * last[4] == target) and target > last[2]):
            if last[4] == 1:
                last[3] = target - last[2]
            last[4] += 1
            continue
        runs.append([source, channel, target, 1, 1])
    return [(source, channel, target, step, length) for source, channel, target, step, length in runs]


class NativeGather:
    """gather_channels of one loaded library."""

    def __init__(self, library: ctypes.CDLL):
        self._function = library.gather_channels
        self._function.argtypes = [ctypes.POINTER(ChannelGatherCall), ctypes.c_ssize_t, ctypes.c_ssize_t]
        self._function.restype = None

    def prepare(self, runs: Sequence[tuple[int, int, int, int, int]], pixel_steps: Sequence[int],
                channels: int) -> PreparedGather:
        """One output's gather, for inputs whose pixels are `pixel_steps` elements apart."""
        return PreparedGather(self._function, runs, pixel_steps, channels)


class PreparedGather:
    """One output's runs and its inputs' pixel steps as C arrays, made once; each call points at the arrays."""

    def __init__(self, function: Any, runs: Sequence[tuple[int, int, int, int, int]],
                 pixel_steps: Sequence[int], channels: int):
        self._function = function
        self._runs = (GatherRun * len(runs))(*(GatherRun(*run) for run in runs))
        self._steps = (ctypes.c_ssize_t * len(pixel_steps))(*pixel_steps)
        self._call = ChannelGatherCall(None, ctypes.addressof(self._steps), ctypes.addressof(self._runs), len(runs),
                                       None, channels)

    def __call__(self, inputs: ctypes.Array, y: int, pixels: int) -> None:
        """y (address of a (pixels, channels) float32 array) from the inputs (an array of their addresses)."""
        call = ChannelGatherCall.from_buffer_copy(self._call)
        call.inputs, call.y = ctypes.addressof(inputs), y
        self._function(ctypes.byref(call), 0, pixels)
