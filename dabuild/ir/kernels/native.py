"""The interpreter's native conv: conv.c compiled by the system C compiler, loaded with ctypes.

numpy + BLAS run the interpreter's small convs far below this machine's peak,
and their im2col copy costs as much as the matmul. conv.c is a direct
convolution over channels-last tensors that the compiler vectorises over the
output channels. dabuild.ir.kernels.compiling compiles the library once per
machine into the kernel cache ($DABUILD_KERNEL_CACHE) and proves it before it
is loaded.

Flags: -O3 -march=native, and the compiler's default floating-point
contraction, so each multiply-add is one fused instruction where the CPU has
FMA. The vector path follows the CPU (vectors.h): 64-byte vectors and 32
registers with AVX-512, 32-byte with AVX2, 16-byte with NEON or SSE; the
packed weights' layout is read from the loaded library. A path the compiler
cannot build falls back to the next narrower one, with one warning naming the
compiler's first error line and the path that runs. DABUILD_VECTOR_BYTES=16 or
32 forces a narrower path (tests run every path this machine can run against
numpy). Each path is deterministic (an output's terms are added in an order the
source fixes, whichever thread computes it); paths may differ in the last bit
where the compiler fuses a multiply-add in one register block shape and not in
another. Results also depend on the CPU where FMA does, as OpenBLAS's already do; the
library's file name carries the path and the CPU's identity, so a shared
cache never hands one CPU another's code. `native_backend()` says which conv
and path ran; the calibrate and tune stage keys include it.

DABUILD_NATIVE_KERNELS=0 forces the numpy path. Without a working compiler the
interpreter runs its convs in numpy and warns once, naming why (the stage keys
record the backend, so nothing cached under the other one is reused).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np

from dabuild.ir.kernels.compiling import CompileError, Sources, available_cores, build
from dabuild.ir.kernels.forking import forget_pool_after_fork
from dabuild.ir.kernels.gather import NativeGather
from dabuild.ir.kernels.integer import NativeInteger
from dabuild.ir.kernels.island import NativeIsland
from dabuild.ir.kernels.threads import CHUNKS_PER_THREAD, RowsCall, RowSplitter
from dabuild.notices import warn

COMPILER = "cc"
VARIANTS = (("float", "int", "f32"), ("double", "long long", "f64"))  # conv.c's element types, its mask types, names
UNITS = ("histogram.c", "requantize.c", "qconv.c", "threads.c", "pool.c", "island_conv.c", "quantize.c",
         "gather.c", "vector_path.c")  # with conv.c's variants, one translation unit each
HEADERS = ("vectors.h", "conv.c")  # included by the units
TARGET_FLAGS = (("-O3", "-march=native"), ("-O3",))  # the CPU's own instructions, else the compiler's default target
FLAGS = ("-pthread",)
WIDTHS = (64, 32, 16)  # vector bytes of vectors.h's paths, widest first
ALIGNMENT = 64  # bytes: packed weights and outputs start on a cache line
SWITCH = "DABUILD_NATIVE_KERNELS"
VECTOR_SWITCH = "DABUILD_VECTOR_BYTES"


def _conv_call(element: type[ctypes._SimpleCData]) -> type[ctypes.Structure]:
    """conv.c's `Conv` of one element type: one conv's tensors and geometry."""
    size = ctypes.c_ssize_t
    fields = [
        ("x", ctypes.c_void_p), ("height", size), ("width", size), ("channels", size),
        ("weight", ctypes.c_void_p), ("kernel_h", size), ("kernel_w", size), ("out_channels", size),
        ("padded_channels", size), ("bias", ctypes.c_void_p), ("residual", ctypes.c_void_p), ("y", ctypes.c_void_p),
        ("out_h", size), ("out_w", size), ("stride_h", size), ("stride_w", size), ("pad_top", size), ("pad_left", size),
        ("dilation_h", size), ("dilation_w", size),
        ("activation", ctypes.c_int), ("low", element), ("high", element), ("zeros", ctypes.c_void_p),
        ("groups", size), ("rows", size), ("parts", size),
    ]
    return type(f"ConvCall_{element.__name__}", (ctypes.Structure,), {"_fields_": fields})


class PoolCall(ctypes.Structure):
    """pool.c's `Pool`: one max or average pool's tensors and geometry."""

    _fields_ = [("x", ctypes.c_void_p), *((name, ctypes.c_ssize_t) for name in ("height", "width", "channels")),
                ("y", ctypes.c_void_p),
                *((name, ctypes.c_ssize_t) for name in ("out_h", "out_w", "kernel_h", "kernel_w", "stride_h",
                                                        "stride_w", "pad_top", "pad_left", "dilation_h",
                                                        "dilation_w")),
                ("divisors", ctypes.c_void_p)]


ELEMENTS: dict[np.dtype, tuple[str, Any]] = {np.dtype(np.float32): ("f32", _conv_call(ctypes.c_float)),
            np.dtype(np.float64): ("f64", _conv_call(ctypes.c_double))}  # conv.c's variants by numpy dtype
RELU, CLAMP = 1, 2  # conv.c's activations: relu, or a clamp to [low, high]
NativeActivation = tuple[int, float, float]  # (0 for none, RELU or CLAMP; low, high)
NO_ACTIVATION: NativeActivation = (0, 0.0, 0.0)
PARALLEL_MACS = 2_000_000  # a conv with fewer multiply-adds (about 25 us here) runs on one thread
DEPTHWISE_COST = 4  # a depthwise multiply-add costs about 4 of a full conv's (measured on MobileNetV2's layers)


class NativeConv:
    """conv.c's `conv2d_nhwc` (ungrouped or grouped) and `depthwise2d_nhwc`, with numpy arrays in and out.

    A prepared conv packs its weight into conv.c's layout once (`pack`) and passes the packed form. With `threads` > 1 (see `layer_threads`), a conv
    with enough work splits its output rows among that many threads; every output is computed by the
    same code in the same order whichever thread runs it, so the result does not depend on the split.
    """

    def __init__(self, library: ctypes.CDLL, compiler: str):
        self.compiler = compiler
        library.kernel_vector_path.restype = ctypes.c_char_p
        self.path = library.kernel_vector_path().decode()  # vectors.h's path: avx512, avx2, neon, sse ...
        self.vector_bytes = library.kernel_vector_bytes()  # conv.c's vectors: weight and bias padded to whole ones
        self.block_vectors = library.kernel_conv_block_vectors()  # vectors of output channels per packed block
        self._kernels: dict[tuple[np.dtype, bool], Any] = {}  # (dtype, depthwise) -> conv.c function
        for dtype, (suffix, call) in ELEMENTS.items():
            for depthwise, name in ((False, "conv2d_nhwc"), (True, "depthwise2d_nhwc")):
                kernel = getattr(library, f"{name}_{suffix}")
                kernel.argtypes = [ctypes.POINTER(call), ctypes.c_ssize_t, ctypes.c_ssize_t]
                kernel.restype = None
                self._kernels[dtype, depthwise] = kernel
        self._pools = {name: getattr(library, name) for name in ("max_pool_nhwc", "avg_pool_nhwc")}
        for pool in self._pools.values():
            pool.argtypes = [ctypes.POINTER(PoolCall), ctypes.c_ssize_t, ctypes.c_ssize_t]
            pool.restype = None
        self.rows = RowSplitter(library)  # threads.c; the same library holds histogram.c, requantize.c, qconv.c,
        self.histogram = NativeHistogram(library)  # island_conv.c, quantize.c and gather.c
        self.requantize = NativeRequantize(library)
        self.integer = NativeInteger(library, self.rows)
        self.island = NativeIsland(library, self.rows, library.kernel_island_width())
        self.gather = NativeGather(library)

    @staticmethod
    def takes(dtype: np.dtype) -> bool:
        """Whether conv.c has a variant for this element type (float32, float64)."""
        return np.dtype(dtype) in ELEMENTS

    def pack(self, weight: np.ndarray, depthwise: bool = False, groups: int = 1) -> PackedWeight:
        """The (O, C / groups, KH, KW) weight in conv.c's layout: done once per weight by a prepared conv. A grouped
        weight is each group's (O / groups, ...) slice packed as an ungrouped weight, one after another."""
        taps, padded = pack_weight(weight, depthwise, self.vector_bytes, self.block_vectors, groups)
        aligned = aligned_empty(taps.shape, taps.dtype)
        aligned[...] = taps
        return PackedWeight(aligned, weight.shape, depthwise, padded, groups)

    def __call__(self, x: np.ndarray, weight: PackedWeight, bias: np.ndarray | None, residual: np.ndarray | None,
                 strides: list[int], pads: list[int], dilations: list[int], out: list[int],
                 activation: NativeActivation = NO_ACTIVATION) -> np.ndarray:
        """y = activation(conv(x) + bias + residual) as an (N, OH, OW, O) array of x's dtype.

        x is (N, H, W, C), residual (N, OH, OW, O) or None, all of the packed weight's dtype, x and residual
        C-contiguous; pads are the (top, left) ones, `out` is (OH, OW).
        """
        plan = self.plan(x.shape, weight, bias, strides, pads, dilations, out, activation)
        return plan(x, residual)

    def plan(self, shape: tuple[int, ...], weight: PackedWeight, bias: np.ndarray | None, strides: list[int],
             pads: list[int], dilations: list[int], out: list[int],
             activation: NativeActivation = NO_ACTIVATION) -> ConvPlan:
        """The conv of (N, H, W, C) inputs of `shape` prepared once (see `__call__` for the arguments): geometry,
        packed weight, padded bias and epilogue filled in, so that each run only points the call at its arrays."""
        batch, height, width, channels = shape
        out_channels, group_channels, kernel_h, kernel_w = weight.shape
        groups, dtype = weight.groups, weight.taps.dtype
        group_out = out_channels // groups
        if bias is not None:  # each group's bias padded to whole vectors, as its weight is
            padding = np.zeros((groups, weight.padded - group_out), dtype)
            bias = np.concatenate([bias.astype(dtype, copy=False).reshape(groups, group_out), padding], 1).ravel()
        zeros = np.zeros(channels, dtype)
        call = ELEMENTS[dtype][1](
            None, height, width, channels // groups,
            weight.taps.ctypes.data, kernel_h, kernel_w, group_out, weight.padded,
            None if bias is None else bias.ctypes.data, None, None,
            out[0], out[1], strides[0], strides[1], pads[0], pads[1], dilations[0], dilations[1],
            *activation, zeros.ctypes.data, groups, batch * out[0], 1,
        )
        macs = batch * out[0] * out[1] * out_channels * kernel_h * kernel_w * group_channels
        work = macs * (DEPTHWISE_COST if weight.depthwise else 1)
        step = self.vector_bytes // dtype.itemsize * (1 if weight.depthwise else self.block_vectors)
        return ConvPlan(self, self._kernels[dtype, weight.depthwise], call, (batch, *out, out_channels), dtype,
                        work >= PARALLEL_MACS, -(-weight.padded // step), (weight, bias, zeros))

    def pool(self, x: np.ndarray, kernel: list[int], strides: list[int], pads: list[int], dilations: list[int],
             out: list[int], divisors: np.ndarray | None = None) -> np.ndarray:
        """pool.c over a C-contiguous float32 (N, H, W, C) x: the (N, OH, OW, C) maxima (taps outside the input
        skipped), or with `divisors` (float32 (OH, OW), each output's count) the averages (taps outside the
        input adding +0, as numpy's zero padding does); pads are the (top, left) ones, `out` is (OH, OW). A large
        pool (a tap costs about what a depthwise multiply-add does) splits its rows among the layer threads."""
        prepared = prepare_pool(x, kernel, strides, pads, dilations, out, divisors)
        return self.rows.run(self._pools[prepared.kernel], prepared, layer_thread_count())


def prepare_pool(x: np.ndarray, kernel: list[int], strides: list[int], pads: list[int], dilations: list[int],
                 out: list[int], divisors: np.ndarray | None) -> RowsCall:
    """`NativeConv.pool`'s call (same arguments)."""
    batch, height, width, channels = x.shape
    y = aligned_empty((batch, *out, channels), x.dtype)
    counts = None if divisors is None else np.ascontiguousarray(divisors, np.float32)
    call = PoolCall(address(x), height, width, channels, address(y), *out, *kernel, *strides, *pads,
                    *dilations, None if counts is None else counts.ctypes.data)
    work = y.size * kernel[0] * kernel[1]
    return RowsCall("max_pool_nhwc" if counts is None else "avg_pool_nhwc", call,
                    (x, y) if counts is None else (x, y, counts), batch * out[0], y,
                    work * DEPTHWISE_COST >= PARALLEL_MACS)


class ConvPlan:
    """One native conv prepared for inputs of one shape (`NativeConv.plan`): calling it with x (and the
    residual, if the conv adds one) copies the prepared call, points it at the arrays and runs it.
    A copy per call, so threads may run one plan on different slices at once."""

    def __init__(self, native: NativeConv, function: Any, call: ctypes.Structure, shape: tuple[int, ...],
                 dtype: np.dtype, parallel: bool, channel_steps: int, keep: tuple[Any, ...]):
        self.native, self.function, self.call = native, function, call
        self.shape, self.dtype, self.parallel = shape, dtype, parallel
        self.channel_steps = channel_steps  # the weight blocks (or depthwise vectors) conv.c may split channels at
        self._keep = keep  # the arrays the call points into
        self._call_type, self._rows = type(call), shape[0] * shape[1]
        self._size = math.prod(shape)

    def __call__(self, x: np.ndarray, residual: np.ndarray | None) -> np.ndarray:
        y, y_address = aligned_elements(self._size, self.dtype)
        call = self._call_type.from_buffer_copy(self.call)
        call.x, call.y = address(x), y_address
        if residual is not None:
            call.residual = address(residual)
        if self.parallel:
            threads = layer_thread_count()
            call.parts = self.parts(threads)
            self.native.rows(self.function, ctypes.byref(call), self._rows * call.parts, threads)
        else:  # one part (the prepared call's)
            self.function(ctypes.byref(call), 0, self._rows)
        return y.reshape(self.shape)

    def parts(self, threads: int) -> int:
        """How many channel parts each output row is split into for `threads` threads: 1 while the rows alone
        give every thread CHUNKS_PER_THREAD chunks to take; else enough parts for that (at most one per weight
        block), so that a late stage's few rows (7 at batch 1 in ResNet-50) still keep 16 threads busy."""
        wanted = threads * CHUNKS_PER_THREAD
        rows = self.shape[0] * self.shape[1]
        if threads <= 1 or rows >= wanted:
            return 1
        return max(1, min(self.channel_steps, -(-wanted // rows)))


def pack_weight(weight: np.ndarray, depthwise: bool, vector_bytes: int, block_vectors: int,
                groups: int = 1) -> tuple[np.ndarray, int]:
    """The (O, C, KH, KW) weight in the layout of conv.c compiled for a path of `vector_bytes` vectors and
    `block_vectors` vectors per register block: output channels padded to whole vectors, (KH, KW, padded) for a
    depthwise conv, else blocks of block_vectors vectors of channels, each a contiguous (KH * KW * C, width)
    slab, one after another (flat); and the padded channel count. A grouped weight (groups > 1) is each group's
    O / groups output channels packed so, one group after another (flat), with one group's padded count."""
    if groups > 1:
        packs = [pack_weight(part, False, vector_bytes, block_vectors) for part in np.split(weight, groups)]
        return np.concatenate([taps for taps, _ in packs]), packs[0][1]
    out_channels, _, kernel_h, kernel_w = weight.shape
    vector = vector_bytes // weight.itemsize
    padded = -(-out_channels // vector) * vector
    taps = np.zeros((kernel_h, kernel_w, *(() if depthwise else (weight.shape[1],)), padded), weight.dtype)
    taps[..., :out_channels] = weight[:, 0].transpose(1, 2, 0) if depthwise else weight.transpose(2, 3, 1, 0)
    if depthwise:
        return taps, padded
    rows, block = taps.reshape(-1, padded), block_vectors * vector
    return np.concatenate([rows[:, first:first + block].ravel() for first in range(0, padded, block)]), padded


@dataclass(frozen=True)
class PackedWeight:
    """A conv weight in conv.c's layout, with the graph weight's (O, C/groups, KH, KW) shape."""

    taps: np.ndarray
    shape: tuple[int, ...]
    depthwise: bool
    padded: int  # output channels (of one group, where grouped) rounded up to whole vectors
    groups: int = 1  # a grouped conv's groups; 1 for an ungrouped or depthwise one


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """np.empty whose memory starts on an ALIGNMENT boundary: a vector load that straddles two cache lines
    costs two, which made the weight loads of a conv on unaligned packed weights about 1.6x slower."""
    return aligned_elements(math.prod(shape), np.dtype(dtype))[0].reshape(shape)


def aligned_elements(count: int, dtype: np.dtype) -> tuple[np.ndarray, int]:
    """`count` elements of `dtype` (1-D) whose memory starts on an ALIGNMENT boundary, and that address (a
    prepared conv's output: taken once, not through `.ctypes`)."""
    buffer = np.empty(count + ALIGNMENT // dtype.itemsize, dtype)
    start = address(buffer)
    skip = -start % ALIGNMENT // dtype.itemsize
    return buffer[skip:skip + count], start + skip * dtype.itemsize


def address(array: np.ndarray) -> int:
    """Where a C-contiguous array's memory starts. numpy's `.ctypes.data` builds a helper object (1.6 us, a few
    times per layer call); a writable array's buffer gives it in a third of that."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(array))  # type: ignore[arg-type]
    except (TypeError, ValueError, BufferError):  # read-only or empty
        return int(array.ctypes.data)


_LAYER_THREADS = threading.local()


@contextlib.contextmanager
def layer_threads(count: int) -> Iterator[None]:
    """Within the block, this thread's native convs split each large layer among `count` threads."""
    before = getattr(_LAYER_THREADS, "count", 1)
    _LAYER_THREADS.count = count
    try:
        yield
    finally:
        _LAYER_THREADS.count = before


def layer_thread_count() -> int:
    """How many threads this thread's native layers may split a large layer among (see `layer_threads`)."""
    return getattr(_LAYER_THREADS, "count", 1)


class TensorView(ctypes.Structure):
    """histogram.c's `TensorView`: a float32 tensor as (outer, channels, inner)."""

    _fields_ = [("x", ctypes.c_void_p), ("outer", ctypes.c_ssize_t), ("channels", ctypes.c_ssize_t),
                ("inner", ctypes.c_ssize_t), ("outer_stride", ctypes.c_ssize_t), ("channel_stride", ctypes.c_ssize_t)]


PARALLEL_VALUES = 1 << 18  # a tensor with fewer values is counted on one thread
LINE_CHANNELS = 16  # float32 channels in a 64-byte cache line: the narrowest part of channels-last memory
SLICE_ROWS = 8 * 2048  # pixels of a slice of channels-last rows at least: 8 x the bins of a channel's row


class NativeHistogram:
    """histogram.c: per-channel extremes and bin counts of a float32 tensor, split among as many threads as
    this process has cores (see `_parts`; each part its own sub-histogram of the whole tensor, merged after)."""

    def __init__(self, library: ctypes.CDLL):
        self._extremes, self._counts = library.channel_extremes, library.channel_counts
        pointer, size = ctypes.c_void_p, ctypes.c_ssize_t
        self._extremes.argtypes = [ctypes.POINTER(TensorView), pointer, pointer, size, size]
        self._extremes.restype = size
        self._counts.argtypes = [ctypes.POINTER(TensorView), pointer, pointer, pointer, ctypes.c_double,
                                 ctypes.c_int64, pointer, size, size]
        self._counts.restype = None
        self._rebin = library.rebin_channels
        self._rebin.argtypes = [pointer, pointer, size, pointer, pointer, pointer]
        self._rebin.restype = None
        self._whole = library.whole_counts
        self._whole.argtypes = [pointer, size, ctypes.c_double, ctypes.c_int64, pointer, ctypes.c_double,
                                ctypes.c_double, size, pointer, pointer]
        self._whole.restype = None
        self._pool: ThreadPoolExecutor | None = None
        self._pool_size = 0
        forget_pool_after_fork(self)

    @staticmethod
    def view(values: np.ndarray, axis: int | None) -> tuple[TensorView, np.ndarray]:
        """`values` as histogram.c's view with channels along `axis` (None: one channel), and the array the view
        reads: `values` itself if its memory fits, else a contiguous copy with the channel axis outside the
        axes after it (channels-last memory is read as it is)."""
        if axis is None:
            values = np.ascontiguousarray(values, np.float32).reshape(1, 1, -1)
            axis = 1
        last = np.moveaxis(values, axis, -1)
        if last.dtype == np.float32 and last.flags.c_contiguous:
            channels = last.shape[-1]
            return TensorView(last.ctypes.data, last.size // max(channels, 1), channels, 1, channels, 1), last
        values = np.ascontiguousarray(values, np.float32)
        channels, inner = values.shape[axis], math.prod(values.shape[axis + 1:])
        return TensorView(values.ctypes.data, values.size // max(channels * inner, 1), channels, inner,
                          channels * inner, inner), values

    def _parts(self, view: TensorView) -> list[tuple[TensorView, int, int, int]]:
        """A big tensor's work for up to this process's cores: (view, first channel, end channel, slice) each.
        Channels-first memory splits by channel (a channel's values are contiguous). Channels-last memory
        splits by channel only down to a cache line's worth (LINE_CHANNELS: narrower parts would each read
        every line of the tensor), then its rows into slices of at least SLICE_ROWS pixels (so that merging a
        slice's sub-histogram, BINS counts a channel, costs at most an eighth of counting it)."""
        cores = available_cores()
        if cores == 1 or view.outer * view.channels * view.inner < PARALLEL_VALUES:
            return [(view, 0, view.channels, 0)]
        if view.inner > 1:
            groups, slices = max(1, min(cores, view.channels)), 1
        else:
            groups = max(1, min(cores, view.channels // LINE_CHANNELS))
            slices = max(1, min(cores // groups, view.outer // SLICE_ROWS))
        parts = []
        for index in range(slices):
            first_row, end_row = view.outer * index // slices, view.outer * (index + 1) // slices
            rows = view if slices == 1 else TensorView(view.x + first_row * view.outer_stride * 4, end_row - first_row,
                                                       view.channels, view.inner, view.outer_stride,
                                                       view.channel_stride)
            parts += [(rows, view.channels * group // groups, view.channels * (group + 1) // groups, index)
                      for group in range(groups)]
        return parts

    def _run(self, count: int, function: Callable[[int], None]) -> None:
        """function(0 .. count - 1): the first on this thread, the others on the pool's threads."""
        if count == 1:
            function(0)
            return
        if self._pool is None or self._pool_size < count - 1:
            self._pool, self._pool_size = ThreadPoolExecutor(count - 1, thread_name_prefix="dabuild-histogram"), count - 1
        others = [self._pool.submit(function, index) for index in range(1, count)]
        function(0)
        for other in others:
            other.result()

    def extremes(self, view: TensorView) -> tuple[np.ndarray, np.ndarray, int]:
        """Each channel's (min, max) as float32 arrays, and how many values are NaN or infinite."""
        parts = self._parts(view)
        slices = parts[-1][3] + 1
        lows = [np.full(view.channels, np.inf, np.float32) for _ in range(slices)]  # one per slice, merged
        highs = [np.full(view.channels, -np.inf, np.float32) for _ in range(slices)]
        bad = [0] * len(parts)

        def part(index: int) -> None:
            rows, first, end, piece = parts[index]
            bad[index] = self._extremes(ctypes.byref(rows), lows[piece].ctypes.data, highs[piece].ctypes.data,
                                        first, end)

        self._run(len(parts), part)
        low, high = lows[0], highs[0]
        for other_low, other_high in zip(lows[1:], highs[1:]):
            np.minimum(low, other_low, out=low)
            np.maximum(high, other_high, out=high)
        # which of -0 and +0 a tie keeps depends on the order values were seen, so on the split: zero extremes
        # are +0 (x + 0.0 is +0 for either zero), so the stats' bytes do not depend on this machine's cores
        low += 0.0
        high += 0.0
        return low, high, sum(bad)

    def count(self, view: TensorView, reciprocal: np.ndarray, offset: np.ndarray, counts: np.ndarray,
              whole_reciprocal: float, whole_offset: int, whole: np.ndarray) -> None:
        """counts (channels, BINS), int32, and whole (BINS,), int64, += the tensor's bin counts (both C-contiguous;
        the caller keeps every count of `counts` below 2^31)."""
        parts = self._parts(view)
        slices = parts[-1][3] + 1
        # each slice past the first counts into its own rows, and each part into its own whole row: merged after
        sub = [counts, *(np.zeros_like(counts) for _ in range(1, slices))]
        wholes = [whole, *(np.zeros_like(whole) for _ in range(1, len(parts)))]

        def part(index: int) -> None:
            rows, first, end, piece = parts[index]
            self._counts(ctypes.byref(rows), reciprocal.ctypes.data, offset.ctypes.data, sub[piece].ctypes.data,
                         whole_reciprocal, whole_offset, wholes[index].ctypes.data, first, end)

        self._run(len(parts), part)
        for other in sub[1:]:
            counts += other
        for other in wholes[1:]:
            whole += other

    def whole(self, values: np.ndarray, reciprocal: float, offset: int, counts: np.ndarray | None,
              skip: tuple[float, float] = (np.inf, -np.inf)) -> tuple[float, float, int, int]:
        """One histogram of all of `values` (float32, C-contiguous, one dimension), in memory order and split
        among the cores, each part with its own row and extremes, merged after: counts (BINS,), int64, += the
        bins of the values outside `skip` ([low, high) in value) whose bin lies in the row; none where `counts`
        is None. Returns (min, max, NaN or infinite values, values left out for lying outside the row)."""
        cores = available_cores()
        parts = 1 if cores == 1 or len(values) < PARALLEL_VALUES else cores
        bounds = [len(values) * index // parts for index in range(parts + 1)]
        rows = [] if counts is None else [counts, *(np.zeros_like(counts) for _ in range(1, parts))]
        extremes = np.tile(np.array([np.inf, -np.inf], np.float32), (parts, 1))
        tallies = np.zeros((parts, 2), np.int64)

        def part(index: int) -> None:
            row = rows[index] if rows else None
            self._whole(values[bounds[index]:].ctypes.data, bounds[index + 1] - bounds[index], reciprocal, offset,
                        None if row is None else row.ctypes.data, skip[0], skip[1], int(row is not None),
                        extremes[index].ctypes.data, tallies[index].ctypes.data)

        self._run(parts, part)
        for row in rows[1:]:
            rows[0] += row
        # +0 for a zero extreme whichever zero a part saw first, as `extremes` does
        return (float(extremes[:, 0].min()) + 0.0, float(extremes[:, 1].max()) + 0.0, int(tallies[:, 0].sum()),
                int(tallies[:, 1].sum()))

    def rebin(self, counts: np.ndarray, channels: np.ndarray, old_offset: np.ndarray, doublings: np.ndarray,
              new_offset: np.ndarray) -> None:
        """counts (C-contiguous int32 (channels, BINS)): the listed rows moved to their wider windows in place,
        as dabuild.quant.histogram.Histogram._rebin does."""
        vectors = [np.ascontiguousarray(vector, np.int64) for vector in (channels, old_offset, doublings, new_offset)]
        self._rebin(counts.ctypes.data, vectors[0].ctypes.data, len(vectors[0]),
                    *(vector.ctypes.data for vector in vectors[1:]))


class NativeRequantize:
    """requantize.c: a weighted layer's exact float64 sums to clamped integers, as fixed_point.requantize does."""

    def __init__(self, library: ctypes.CDLL):
        self._function = library.requantize_channels
        pointer, size, int64 = ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int64
        self._function.argtypes = [pointer, size, size, size, pointer, pointer, pointer, size, int64, int64, int64,
                                   pointer]
        self._function.restype = ctypes.c_int

    def __call__(self, accumulator: np.ndarray, axis: int, bias: np.ndarray, multiplier: np.ndarray,
                 shift: np.ndarray, zero_point: int, low: int, high: int) -> np.ndarray | None:
        """clamp(round((acc + bias) * multiplier / 2**shift) + zero_point) as int32 of the accumulator's shape,
        bias, multiplier and shift along `axis` (multiplier and shift of length 1 or per channel); None where
        the product could leave int64."""
        arguments, result = requantize_arguments(accumulator, axis, bias, multiplier, shift, zero_point, low, high)
        failed = self._function(*(a.ctypes.data if isinstance(a, np.ndarray) else a for a in arguments))
        return None if failed else result


def requantize_arguments(accumulator: np.ndarray, axis: int, bias: np.ndarray, multiplier: np.ndarray,
                         shift: np.ndarray, zero_point: int, low: int, high: int) -> tuple[list[Any], np.ndarray]:
    """requantize_channels' arguments for `NativeRequantize` (same arguments), arrays for its pointers, and the
    result they make (a view of the output)."""
    axis %= accumulator.ndim
    moved = np.moveaxis(accumulator, axis, -1)
    if moved.flags.c_contiguous:  # channels innermost in memory, as the native conv leaves them
        outer, channels, inner, logical = moved.size // moved.shape[-1], moved.shape[-1], 1, moved
    else:
        logical = np.ascontiguousarray(accumulator)
        channels = accumulator.shape[axis]
        inner = math.prod(accumulator.shape[axis + 1:])
        outer = accumulator.size // max(channels * inner, 1)
    y = np.empty(logical.shape, np.int32)
    vectors = [np.ascontiguousarray(vector, np.int64) for vector in (bias, multiplier, shift)]
    arguments = [logical, outer, channels, inner, *vectors, int(len(vectors[1]) > 1), zero_point, low, high, y]
    return arguments, np.moveaxis(y, -1, axis) if logical is moved else y


def native_histogram() -> NativeHistogram | None:
    """The native histogram counter, or None when DABUILD_NATIVE_KERNELS=0 or no C compiler can build it."""
    conv = native_conv()
    return None if conv is None else conv.histogram


def native_switched_on() -> bool:
    """Whether DABUILD_NATIVE_KERNELS leaves the native kernels on: the one check a prepared call repeats."""
    return os.environ.get(SWITCH, "1") != "0"


def native_conv() -> NativeConv | None:
    """The native conv, or None when DABUILD_NATIVE_KERNELS=0 or no C compiler can build it. Waits for a
    compile that `compile_in_background` started rather than starting a second one."""
    if not native_switched_on():
        return None
    forced = os.environ.get(VECTOR_SWITCH) or None
    if forced is not None and (not forced.isdigit() or int(forced) not in WIDTHS):
        warn(f"{VECTOR_SWITCH}={forced!r} is not one of {', '.join(map(str, WIDTHS))}; the native kernels "
             "run the CPU's widest path", key=VECTOR_SWITCH)
        forced = None
    with _loading[0]:
        return _load(None if forced is None else int(forced))


_loading = [threading.Lock()]  # one compile per process, whichever thread asks first


def _unlock_in_child() -> None:
    """A child forked while the compiling thread held the lock has no such thread: a fresh lock, lest it wait."""
    _loading[0] = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_unlock_in_child)


def compile_in_background() -> None:
    """Compile (or find and prove) the native kernels in a thread, so a first build's compile overlaps what
    precedes their first use: loading the plan and tracing (the calibrate stage's key names the backend, so it
    waits for the result, compiled or numpy, as any caller of `native_conv` does). Not a daemon: a build that
    fails meanwhile still leaves the compiled library in the kernel cache for the next one."""
    threading.Thread(target=native_conv, name="dabuild-native-kernels").start()


def native_backend() -> str:
    """Which conv the interpreter runs here, for stage keys and benchmarks:
    'native kernels (<vector path>): <compiler>' or 'numpy'."""
    conv = native_conv()
    return f"native kernels ({conv.path}): {conv.compiler}" if conv else "numpy"


def compiler_path() -> Path | None:
    """The C compiler's executable file (symbolic links followed, so an upgrade changes it), or None."""
    found = shutil.which(COMPILER)
    return Path(found).resolve() if found else None


@functools.cache
def _load(forced_bytes: int | None = None) -> NativeConv | None:
    """The library of the widest path the compiler builds here (or of `forced_bytes`), loaded."""
    compiler = shutil.which(COMPILER)
    try:
        if compiler is None:
            raise OSError(f"no C compiler {COMPILER!r} on PATH")
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True,
                                 timeout=60).stdout.strip().partition("\n")[0]
        failed: list[str] = []
        for sources in vector_paths(compiler, forced_bytes):
            try:
                library, scratch = build(compiler, version, sources)
            except CompileError as error:
                failed.append(f"the {sources.path} path ({error})")
                continue
            try:
                loaded = ctypes.CDLL(str(library))
            finally:
                if scratch is not None:
                    shutil.rmtree(scratch, ignore_errors=True)
            if failed:
                warn(f"the native kernels run the {sources.path} path: {'; '.join(failed)} did not compile")
            return NativeConv(loaded, version)
        raise OSError("; ".join(failed) or f"{compiler} builds no vector path of vectors.h here")
    except (OSError, subprocess.SubprocessError) as error:
        warn(f"the interpreter's native conv kernels could not be built ({error}); its convs run in numpy, "
             f"more slowly (set {SWITCH}=0 to choose that and silence this warning)")
        return None


def vector_paths(compiler: str, forced_bytes: int | None = None) -> Iterator[Sources]:
    """The library's sources for each vector path the compiler's target offers, widest first (only
    `forced_bytes` wide if given): what vectors.h chooses for -march=native, then each narrower width; with no
    -march=native (a compiler without it), the same for the compiler's default target. Lazily: a narrower
    path's probe runs only when the wider one failed."""
    kernels = files("dabuild.ir.kernels")
    headers = {name: kernels.joinpath(name).read_text() for name in HEADERS}
    units = {f"conv_{suffix}.c": f"#define ELEM {elem}\n#define MASK {mask}\n#define NAME(name) name##_{suffix}\n"
                                 f'#include "conv.c"\n' for elem, mask, suffix in VARIANTS}
    units.update({name: kernels.joinpath(name).read_text() for name in UNITS})
    for target in TARGET_FLAGS:
        natural = _probe(compiler, target, headers["vectors.h"], None)
        if natural is None:
            continue
        widths = [width for width in WIDTHS if width <= natural[1]]
        if forced_bytes is not None:
            widths = [forced_bytes] if forced_bytes in widths else []
        for width in widths:
            probed = natural if width == natural[1] else _probe(compiler, target, headers["vectors.h"], width)
            if probed is not None:
                defines = () if width == natural[1] else (f"-DDABUILD_VECTOR_BYTES={width}",)
                yield Sources(units, headers, (*target, *defines, *FLAGS), probed[0], width)
        return


def vector_widths() -> list[int]:
    """The vector bytes of every path this machine's compiler builds, widest first: the paths tests run."""
    compiler = shutil.which(COMPILER)
    return [] if compiler is None else [sources.width for sources in vector_paths(compiler)]


def _probe(compiler: str, target: tuple[str, ...], header: str, width: int | None) -> tuple[str, int] | None:
    """(path name, vector bytes) that vectors.h chooses for these flags, or None where the compiler refuses them
    (an unknown flag, or a width the target macros do not offer): the preprocessor only, milliseconds."""
    define = () if width is None else (f"-DDABUILD_VECTOR_BYTES={width}",)
    result = subprocess.run([compiler, *target, *define, "-E", "-P", "-x", "c", "-"], input=f"{header}\n"
                            "VECTOR_PATH VBYTES\n", capture_output=True, text=True, check=False)
    words = result.stdout.split()
    if result.returncode or len(words) < 2 or not words[-1].isdigit():
        return None
    return words[-2].strip('"'), int(words[-1])
