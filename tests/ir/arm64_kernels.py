"""The native kernels cross-compiled for arm64 and called under qemu-aarch64, one call per qemu process.

The library is built from the same translation units and flags native.py builds on the host
(`native.vector_paths` with gcc-aarch64-linux-gnu, which takes the NEON path), linked statically with
tests/arm64/kernel_driver.c, so qemu needs no arm64 libraries. A call passes numpy arrays, call structures
(native.py's own ctypes classes: x86-64 and arm64 Linux lay them out alike) and numbers; every array comes
back as the call left it. bench/arm64.py counts the same binary's instructions.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from dabuild.ir.kernels import native
from dabuild.ir.kernels.integer import PAIRS, NativeInteger
from dabuild.ir.kernels.island import prepare_island_conv
from dabuild.ir.kernels.native import (
    NativeHistogram,
    TensorView,
    layer_thread_count,
    pack_weight,
    prepare_pool,
    requantize_arguments,
)
from dabuild.ir.kernels.threads import CHUNKS_PER_THREAD, RowsCall

CROSS, EMULATOR = "aarch64-linux-gnu-gcc", "qemu-aarch64"
DRIVER = Path(__file__).resolve().parents[1] / "arm64" / "kernel_driver.c"
MISSING = [tool for tool in (CROSS, EMULATOR) if shutil.which(tool) is None]
SKIP_REASON = (f"no {' or '.join(MISSING)} on PATH (apt-get install gcc-aarch64-linux-gnu qemu-user): the arm64 "
               "kernels are not checked")
INTEGER, DOUBLE, POINTER = 0, 1, 2  # kernel_driver.c's argument kinds


def build_driver(cache: Path) -> Path:
    """kernel_driver.c and the library's units compiled for arm64, statically linked: from `cache` when these
    sources, flags and compiler built it before (a minute of compiling on a busy 2-core machine), else
    compiled into it."""
    sources = next(native.vector_paths(CROSS))
    version = subprocess.run([CROSS, "--version"], capture_output=True, text=True, check=True).stdout
    texts = {**sources.headers, **sources.units, DRIVER.name: DRIVER.read_text()}
    key = hashlib.sha256(repr((sorted(texts.items()), sources.flags, version)).encode()).hexdigest()[:16]
    binary = cache / f"kernel_driver-{key}"
    if binary.exists():
        return binary
    folder = Path(tempfile.mkdtemp(dir=cache))
    try:
        for name, text in texts.items():
            (folder / name).write_text(text)
        compiles = [subprocess.Popen([CROSS, *sources.flags, "-c", "-o", f"{name}.o", name], cwd=folder)
                    for name in sources.units]
        if any(process.wait() for process in compiles):
            raise RuntimeError(f"{CROSS} could not compile the native kernels (see its errors above)")
        subprocess.run([CROSS, *sources.flags, "-static", "-o", "kernel_driver", DRIVER.name,
                        *(f"{name}.o" for name in sources.units), "-lm"], cwd=folder, check=True)
        (folder / "kernel_driver").replace(binary)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return binary


@dataclass(frozen=True)
class Layout:
    """What the arm64 library reports, as native.py reads it from a loaded one."""

    path: str
    vector_bytes: int
    block_vectors: int
    island_width: int
    qconv_lanes: int
    qconv_block_vectors: int


class Arm64Kernels:
    """The arm64 build of the native kernels, called by name (`call`) under qemu-aarch64."""

    def __init__(self, binary: Path, emulator: Sequence[str] = (EMULATOR,)):
        self.binary, self.emulator = binary, list(emulator)
        self.calls: list[str] = []  # the functions called so far, in order
        path, *numbers = subprocess.run([*self.emulator, str(binary), "info"], capture_output=True, text=True,
                                        check=True, timeout=60).stdout.split()
        self.layout = Layout(path, *map(int, numbers))

    def request(self, function: str, args: Sequence[object], memory: Sequence[np.ndarray] = ()) -> tuple[bytes,
                                                                                                     list[np.ndarray]]:
        """kernel_driver.c's request for function(*args), and the arrays whose bytes the response returns.

        An array argument is passed as a pointer to it; a ctypes structure as a pointer to a copy whose
        pointer fields point into the argument arrays or `memory`; an int (or None) as an integer, a float as
        a double."""
        arrays: list[np.ndarray] = []
        for array in [*(a for a in args if isinstance(a, np.ndarray)), *memory]:
            if not array.flags.c_contiguous:
                raise ValueError("arm64 kernel calls take C-contiguous arrays")
            if not any(array is known for known in arrays):
                arrays.append(array)
        buffers: list[bytes] = [array.tobytes() for array in arrays]
        relocations: list[tuple[int, int, int, int]] = []
        words: list[tuple[int, int]] = []
        for arg in args:
            if isinstance(arg, np.ndarray):
                words.append((POINTER, next(i for i, known in enumerate(arrays) if known is arg)))
            elif isinstance(arg, ctypes.Structure):
                words.append((POINTER, len(buffers)))
                relocations += self._pointers(arg, len(buffers), arrays)
                buffers.append(bytes(arg))
            elif isinstance(arg, float):
                words.append((DOUBLE, struct.unpack("<q", struct.pack("<d", arg))[0]))
            elif arg is None or isinstance(arg, (int, np.integer)):
                words.append((INTEGER, int(arg or 0)))
            else:
                raise TypeError(f"an arm64 kernel argument of type {type(arg).__name__}")
        name = function.encode()
        parts = [struct.pack("<q", len(buffers))]
        for data in buffers:
            parts += [struct.pack("<q", len(data)), data, bytes(-len(data) % 8)]
        parts.append(struct.pack("<q", len(relocations)) + b"".join(struct.pack("<4q", *r) for r in relocations))
        parts += [struct.pack("<q", len(name)), name, bytes(-len(name) % 8), struct.pack("<q", len(words))]
        parts += [struct.pack("<2q", *word) for word in words]
        return b"".join(parts), arrays

    def call(self, function: str, *args: object, memory: Sequence[np.ndarray] = ()) -> int:
        """function(*args) run on arm64 (see `request`); the arrays (arguments and `memory`) take the values the
        call left in them (a read-only one must keep its values); returns the function's result (0 for a void one)."""
        request, arrays = self.request(function, args, memory)
        self.calls.append(function)
        response = subprocess.run([*self.emulator, str(self.binary), "call"], input=request, capture_output=True,
                                  check=True, timeout=300).stdout
        return self.unpack(function, response, arrays)

    def run(self, prepared: RowsCall, threads: int = 1) -> np.ndarray:
        """A prepared call (dabuild.ir.kernels' `prepare_*`) over all its rows, shared among `threads` by threads.c
        as RowSplitter shares them where the call has the work; its result."""
        parts = min(threads if prepared.parallel else 1, prepared.rows)
        if parts <= 1:
            self.call(prepared.kernel, prepared.call, 0, prepared.rows, memory=prepared.arrays)
        else:
            chunk = max(1, prepared.rows // (parts * CHUNKS_PER_THREAD))
            self.call(f"parallel_rows:{prepared.kernel}", prepared.call, prepared.rows, chunk, parts,
                      memory=prepared.arrays)
        return prepared.result

    @staticmethod
    def unpack(function: str, response: bytes, arrays: list[np.ndarray]) -> int:
        """The result of a call of `function` from kernel_driver.c's response, its arrays' bytes copied back into
        `arrays` (those of `request`)."""
        (result,), at = struct.unpack_from("<q", response), 8
        for array in arrays:
            after = np.frombuffer(response, np.uint8, array.nbytes, at)
            at += array.nbytes
            if array.flags.writeable:
                array.reshape(-1).view(np.uint8)[:] = after
            elif not np.array_equal(array.reshape(-1).view(np.uint8), after):
                raise AssertionError(f"{function} wrote into a read-only array")
        return result

    @staticmethod
    def _pointers(call: ctypes.Structure, index: int, arrays: list[np.ndarray]) -> list[tuple[int, int, int, int]]:
        """The relocations of a call structure (buffer `index`): each non-null pointer field to the array it
        points into."""
        relocations = []
        for name, kind in call._fields_:  # type: ignore[misc]
            address = getattr(call, name)
            if kind is not ctypes.c_void_p or not address:
                continue
            target = next((i for i, a in enumerate(arrays)
                           if a.ctypes.data <= address < a.ctypes.data + max(a.nbytes, 1)), None)
            if target is None:
                raise ValueError(f"{type(call).__name__}.{name} points into no array of the call")
            relocations.append((index, getattr(type(call), name).offset, target, address - arrays[target].ctypes.data))
        return relocations


def prepare_float_conv(layout: Layout, x: np.ndarray, weight: np.ndarray, bias: np.ndarray, strides: list[int],
                       pads: list[int], dilations: list[int], groups: int, relu: bool) -> RowsCall:
    """conv.c's call on arm64 for a 2-D conv of x (N, C, H, W) with weight (O, C / groups, KH, KW) and bias, all
    float32 or all float64, as NativeConv.plan makes it on the host (a depthwise conv is conv.c's own kind); the
    (N, O, OH, OW) result."""
    batch, channels, height, width = x.shape
    out_channels, _, kernel_h, kernel_w = weight.shape
    depthwise = groups == channels == out_channels and groups > 1
    conv_groups = 1 if depthwise else groups
    taps, padded = pack_weight(weight, depthwise, layout.vector_bytes, layout.block_vectors, conv_groups)
    out = [(size + pads[axis] + pads[axis + 2] - dilations[axis] * (kernel - 1) - 1) // strides[axis] + 1
           for axis, (size, kernel) in enumerate(((height, kernel_h), (width, kernel_w)))]
    group_out = out_channels // conv_groups
    dtype = x.dtype
    suffix, conv_call = native.ELEMENTS[dtype]
    inputs = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    padded_bias = np.concatenate([bias.reshape(conv_groups, group_out), np.zeros((conv_groups, padded - group_out),
                                                                                 dtype)], 1)
    zeros = np.zeros(channels, dtype)
    y = np.zeros((batch, *out, out_channels), dtype)
    call = conv_call(
        inputs.ctypes.data, height, width, channels // conv_groups, taps.ctypes.data, kernel_h, kernel_w, group_out,
        padded, padded_bias.ctypes.data, None, y.ctypes.data, *out, *strides, pads[0], pads[1], *dilations,
        native.RELU if relu else 0, 0.0, 0.0, zeros.ctypes.data, conv_groups, batch * out[0], 1)
    return RowsCall(f"{'depthwise2d' if depthwise else 'conv2d'}_nhwc_{suffix}", call,
                    (inputs, taps, padded_bias, y, zeros), batch * out[0], y.transpose(0, 3, 1, 2))


class Arm64Histogram(NativeHistogram):
    """histogram.c's extremes, counts (per channel, and of the whole tensor alone) and rebinning run on arm64, one
    call over all channels (NativeHistogram's
    interface, so dabuild.quant's calibration runs on it unchanged)."""

    def __init__(self, kernels: Arm64Kernels):  # no host library: every call goes to `kernels`
        self.kernels = kernels

    @staticmethod
    def _tensor(view: TensorView) -> tuple[TensorView, np.ndarray]:
        """A copy of the floats the view reads, and the view of that copy."""
        reach = 0 if view.outer * view.channels * view.inner == 0 else (
            (view.outer - 1) * view.outer_stride + (view.channels - 1) * view.channel_stride + view.inner)
        values = np.ctypeslib.as_array((ctypes.c_float * reach).from_address(view.x)).copy() if reach else \
            np.zeros(1, np.float32)
        return TensorView(values.ctypes.data, view.outer, view.channels, view.inner, view.outer_stride,
                          view.channel_stride), values

    def extremes(self, view: TensorView) -> tuple[np.ndarray, np.ndarray, int]:
        low = np.full(view.channels, np.inf, np.float32)
        high = np.full(view.channels, -np.inf, np.float32)
        copy, values = self._tensor(view)
        bad = self.kernels.call("channel_extremes", copy, low, high, 0, view.channels, memory=[values])
        return low, high, bad

    def count(self, view: TensorView, reciprocal: np.ndarray, offset: np.ndarray, counts: np.ndarray,
              whole_reciprocal: float, whole_offset: int, whole: np.ndarray) -> None:
        copy, values = self._tensor(view)
        self.kernels.call("channel_counts", copy, reciprocal, offset, counts, float(whole_reciprocal),
                          int(whole_offset), whole, 0, view.channels, memory=[values])

    def whole(self, values: np.ndarray, reciprocal: float, offset: int, counts: np.ndarray | None,
              skip: tuple[float, float] = (np.inf, -np.inf)) -> tuple[float, float, int, int]:
        extremes = np.array([np.inf, -np.inf], np.float32)
        tallies = np.zeros(2, np.int64)
        row = np.zeros(1, np.int64) if counts is None else counts  # a pointer the call does not count into
        self.kernels.call("whole_counts", np.ascontiguousarray(values), len(values), float(reciprocal), int(offset),
                          row, float(skip[0]), float(skip[1]), int(counts is not None), extremes, tallies)
        return float(extremes[0]) + 0.0, float(extremes[1]) + 0.0, int(tallies[0]), int(tallies[1])

    def rebin(self, counts: np.ndarray, channels: np.ndarray, old_offset: np.ndarray, doublings: np.ndarray,
              new_offset: np.ndarray) -> None:
        vectors = [np.ascontiguousarray(vector, np.int64) for vector in (channels, old_offset, doublings, new_offset)]
        self.kernels.call("rebin_channels", counts, vectors[0], len(vectors[0]), *vectors[1:])


class Arm64Integer(NativeInteger):
    """qconv.c's and quantize.c's kernels run on arm64 (NativeInteger's interface; the int16-pairs conv: the
    uint8 x int8 one needs AVX-512 VNNI)."""

    def __init__(self, kernels: Arm64Kernels):  # no host library: every call goes to `kernels`
        self.kernels = kernels
        self.lanes, self.forms = kernels.layout.qconv_lanes, (PAIRS,)
        self.block_vectors = kernels.layout.qconv_block_vectors

    def run(self, prepared: RowsCall, threads: int) -> np.ndarray:
        return self.kernels.run(prepared, threads)


class Arm64Island:
    """island_conv.c's kernels run on arm64 (NativeIsland's `conv`)."""

    def __init__(self, kernels: Arm64Kernels):
        self.kernels = kernels

    def conv(self, x: np.ndarray, weight: np.ndarray, groups: int, strides: list[int], pads: list[int],
             dilations: list[int], out: list[int], threads: int = 1) -> np.ndarray:
        return self.kernels.run(prepare_island_conv(x, weight, groups, strides, pads, dilations, out,
                                                    self.kernels.layout.island_width), threads)


class Arm64Native:
    """What dabuild's paths ask of `native_conv()` besides the float conv (pools, float islands, histograms, the
    integer reference's conv, add, quantization and requantization), run on arm64."""

    def __init__(self, kernels: Arm64Kernels):
        self.kernels = kernels
        self.histogram = Arm64Histogram(kernels)
        self.integer = Arm64Integer(kernels)
        self.island = Arm64Island(kernels)

    def pool(self, x: np.ndarray, kernel: list[int], strides: list[int], pads: list[int], dilations: list[int],
             out: list[int], divisors: np.ndarray | None = None) -> np.ndarray:
        return self.kernels.run(prepare_pool(x, kernel, strides, pads, dilations, out, divisors),
                                layer_thread_count())

    def requantize(self, accumulator: np.ndarray, axis: int, bias: np.ndarray, multiplier: np.ndarray,
                   shift: np.ndarray, zero_point: int, low: int, high: int) -> np.ndarray | None:
        arguments, result = requantize_arguments(accumulator, axis, bias, multiplier, shift, zero_point, low, high)
        return None if self.kernels.call("requantize_channels", *arguments) else result

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Makes the interpreter's pools, the float islands, calibration's histograms and the integer reference's
        kernels run on arm64 (numpy where DABUILD_NATIVE_KERNELS=0, the reference the tests compare with)."""
        from dabuild.ir.ops import pool
        from dabuild.qir import qgraph
        from dabuild.qir.layers import elementwise, island_order, linear
        from dabuild.quant import calibrate, histogram

        def emulated() -> Arm64Native | None:
            return None if os.environ.get(native.SWITCH, "1") == "0" else self

        def emulated_histogram() -> Arm64Histogram | None:
            return None if emulated() is None else self.histogram

        for module in (pool, island_order, linear, elementwise, qgraph):
            monkeypatch.setattr(module, "native_conv", emulated)
        for module in (calibrate, histogram):
            monkeypatch.setattr(module, "native_histogram", emulated_histogram)
