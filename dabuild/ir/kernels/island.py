"""island_conv.c with numpy arrays in and out: a float island's conv and dense in the C target's summation order.

Loaded with the interpreter's native kernels (`dabuild.ir.kernels.native`, same library, cache and proof).
`dabuild.qir.layers.island_order` calls it for 2-D convs and dense layers and keeps its numpy loops (one
numpy pass per input channel and tap: seconds per layer on ResNet-50, which made a trial that leaves one
conv in fp32 nine times as slow as an all-integer one) for everything else. Each output adds the same
float32 terms in the same order as the numpy loops, so the two agree bit for bit (tests/ir/test_island_kernel.py).
"""

from __future__ import annotations

import ctypes

import numpy as np

from dabuild.ir.kernels.threads import RowsCall, RowSplitter

PARALLEL_MACS = 2_000_000  # a conv with fewer multiply-adds runs on one thread


class IslandConvCall(ctypes.Structure):
    """island_conv.c's `IslandConv`: one conv's tensors and geometry."""

    _fields_ = [(name, kind) for kind, names in (
        (ctypes.c_void_p, ["x"]), (ctypes.c_ssize_t, ["height", "width", "channels"]), (ctypes.c_void_p, ["weight"]),
        (ctypes.c_ssize_t, ["kernel_h", "kernel_w", "out_channels", "group_channels"]),
        (ctypes.c_void_p, ["first", "y"]),
        (ctypes.c_ssize_t, ["out_h", "out_w", "stride_h", "stride_w", "pad_top", "pad_left", "dilation_h",
                            "dilation_w"])) for name in names]


class NativeIsland:
    """island_conv_nhwc and island_grouped_nhwc of one loaded library."""

    def __init__(self, library: ctypes.CDLL, rows: RowSplitter, width: int):
        self._rows = rows
        self.width = width  # output channels per packed block (island_conv.c's ISLAND_WIDTH, the path's)
        self._dense = library.island_conv_nhwc
        self._grouped = library.island_grouped_nhwc
        for function in (self._dense, self._grouped):
            function.argtypes = [ctypes.POINTER(IslandConvCall), ctypes.c_ssize_t, ctypes.c_ssize_t]
            function.restype = None

    def conv(self, x: np.ndarray, weight: np.ndarray, groups: int, strides: list[int], pads: list[int],
             dilations: list[int], out: list[int], threads: int = 1) -> np.ndarray:
        """The sums (no bias) of a float32 conv of x (N, C, H, W) with weight (O, C / groups, KH, KW), as an
        (N, O, OH, OW) view of channels-last memory; pads are the (top, left) ones, `out` is (OH, OW)."""
        prepared = prepare_island_conv(x, weight, groups, strides, pads, dilations, out, self.width)
        return self._rows.run(self._grouped if groups > 1 else self._dense, prepared, threads)


def prepare_island_conv(x: np.ndarray, weight: np.ndarray, groups: int, strides: list[int], pads: list[int],
                        dilations: list[int], out: list[int], width: int) -> RowsCall:
    """`NativeIsland.conv`'s call for a library of island width `width` (its `kernel_island_width()`): x and the
    weight in island_conv.c's layouts and an empty (N, OH, OW, O) output, whose (N, O, OH, OW) view is the
    result."""
    batch, channels, height, in_width = x.shape
    out_channels, group_channels, kernel_h, kernel_w = weight.shape
    inputs = np.ascontiguousarray(x.transpose(0, 2, 3, 1), np.float32)
    # (c, kh, kw, o): for each input channel and tap, the output channels' weights side by side
    taps = np.ascontiguousarray(weight.transpose(1, 2, 3, 0), np.float32)
    first = None
    if groups == 1:
        padded = -(-out_channels // width) * width
        wide = np.zeros((*taps.shape[:3], padded), np.float32)
        wide[..., :out_channels] = taps
        packed = np.ascontiguousarray(wide.reshape(*taps.shape[:3], padded // width, width).transpose(3, 0, 1, 2, 4))
    else:
        packed = taps
        first = (np.arange(out_channels) // (out_channels // groups) * group_channels).astype(np.intp)
    y = np.empty((batch, *out, out_channels), np.float32)
    call = IslandConvCall(inputs.ctypes.data, height, in_width, channels, packed.ctypes.data, kernel_h, kernel_w,
                          out_channels, group_channels, None if first is None else first.ctypes.data,
                          y.ctypes.data, out[0], out[1], strides[0], strides[1], pads[0], pads[1],
                          dilations[0], dilations[1])
    arrays = (inputs, packed, y) if first is None else (inputs, packed, first, y)
    macs = y.size * kernel_h * kernel_w * group_channels
    return RowsCall("island_grouped_nhwc" if groups > 1 else "island_conv_nhwc", call, arrays, batch * out[0],
                    y.transpose(0, 3, 1, 2), macs >= PARALLEL_MACS)
