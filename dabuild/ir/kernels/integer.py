"""qconv.c and quantize.c with numpy arrays in and out: the integer reference's 8-bit conv and add, and its
float -> integer quantization, compiled.

qconv.c has several forms of the conv (`QConvForm`): int16 pairs run every 8-bit weight; the byte forms
(VNNI's quads, AVX2's vpmaddubsw ones) multiply twice as many inputs a step but each is exact only for some
weights. `NativeInteger.form_for` picks, per layer, the first form of this build that is exact for the layer's
actual weight range and keeps its sums in int32.

Loaded with the interpreter's native kernels (`dabuild.ir.kernels.native`, same library, same cache and
proof); `dabuild.qir.layers` call it for the layers it takes and keep their numpy code for the rest and
for traces. Every result is an exact integer, so it equals the numpy reference's bit for bit whatever the
thread split (tests/ir/test_integer_kernels.py compares them on every spec case).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from dabuild.ir.kernels.threads import RowsCall, RowSplitter

PARALLEL_MACS = 2_000_000  # a conv with fewer multiply-adds runs on one thread
PARALLEL_LOOKUPS = 1_000_000  # an add looks up (a quantization converts) fewer elements on one thread
INT32_LIMIT = 2**31 - 1


class QConvCall(ctypes.Structure):
    """qconv.c's `QConv`: one conv's tensors, geometry and requantization."""

    _fields_ = [(name, kind) for kind, names in (
        (ctypes.c_void_p, ["x"]), (ctypes.c_ssize_t, ["height", "width", "channels"]), (ctypes.c_void_p, ["weight"]),
        (ctypes.c_ssize_t, ["kernel_h", "kernel_w", "out_channels", "padded_channels"]),
        (ctypes.c_void_p, ["bias", "multiplier", "shift"]), (ctypes.c_int64, ["zero_point", "low", "high"]),
        (ctypes.c_void_p, ["y"]), (ctypes.c_ssize_t, ["out_bytes", "out_h", "out_w", "stride_h", "stride_w",
                                                     "pad_top", "pad_left", "dilation_h", "dilation_w"]),
        (ctypes.c_void_p, ["zeros"])) for name in names]


@dataclass(frozen=True)
class QConvForm:
    """One of qconv.c's conv kernels: how it takes the inputs, and the weights it multiplies exactly."""

    name: str  # as benches and reports print it
    kernel: str  # the qconv.c function
    group: int  # input channels a 4-byte step takes: 2 (int16 q - zero point) or 4 (uint8 u: q + 128 for int8,
    #             q for uint8; the padding holds the zero point so shifted)
    weight_low: int  # the weights it multiplies exactly
    weight_high: int

    def takes(self, low: int, high: int) -> bool:
        """Whether every weight in [low, high] multiplies exactly."""
        return self.weight_low <= low and high <= self.weight_high


PAIRS = QConvForm("int16 pairs (vpmaddwd)", "qconv2d_nhwc", 2, -128, 127)
QUADS = QConvForm("uint8 x int8 quads (vpdpbusd)", "qconv2d_u8_nhwc", 4, -128, 127)
U8S7 = QConvForm("uint8 x int7 (vpmaddubsw)", "qconv2d_u8s7_nhwc", 4, -64, 64)


@dataclass(frozen=True)
class PackedQWeight:
    """An (O, C, KH, KW) int8 conv weight as qconv.c reads it: int16 pairs of input channels (`group` 2) or
    int8 quads (`group` 4, for the uint8 forms)."""

    taps: np.ndarray
    shape: tuple[int, ...]
    padded: int  # output channels rounded up to whole vectors
    channels: int  # input channels rounded up to whole groups
    group: int
    unfolded: bool  # the kernel row's taps packed as channels (see `unfolds`): shape keeps the conv's own
    sums: np.ndarray  # int64 (O,): each output channel's sum of weights (the byte forms' bias correction)
    magnitudes: np.ndarray  # int64 (O,): each output channel's sum of |w|, the accumulator's bound per unit of input


@dataclass(frozen=True)
class Requantization:
    """Per output channel (int64, C-contiguous): what qconv.c adds to each sum and how it scales it."""

    bias: np.ndarray
    multiplier: np.ndarray
    shift: np.ndarray
    zero_point: int
    low: int
    high: int


class QAddCall(ctypes.Structure):
    """qconv.c's `QAdd`: one add's inputs, table and output."""

    _fields_ = [(name, ctypes.c_void_p) for name in ("a", "b", "table", "y")]


class QuantizeCall(ctypes.Structure):
    """quantize.c's `Quantize`: one conversion's input, parameters and output."""

    _fields_ = [("x", ctypes.c_void_p), *((name, ctypes.c_float) for name in ("scale", "span", "zero_point", "qmin", "qmax")),
                ("out_bytes", ctypes.c_ssize_t), ("y", ctypes.c_void_p)]


class NativeInteger:
    """qconv.c's conv forms, qadd_lookup and quantize_f32 of one loaded library."""

    forms: tuple[QConvForm, ...]  # this build's conv forms, in the order `form_for` tries them (PAIRS last)

    def __init__(self, library: ctypes.CDLL, rows: RowSplitter):
        self._rows = rows
        calls = {"qadd_lookup": QAddCall, "quantize_f32": QuantizeCall,
                 **{form.kernel: QConvCall for form in (PAIRS, QUADS, U8S7)}}
        self._kernels = {name: getattr(library, name) for name in calls}
        for name, kernel in self._kernels.items():
            kernel.argtypes = [ctypes.POINTER(calls[name]), ctypes.c_ssize_t, ctypes.c_ssize_t]
            kernel.restype = None
        library.qconv_u8_available.restype = library.qconv_u8s7_available.restype = ctypes.c_int
        if library.qconv_u8_available():  # AVX-512 VNNI
            self.forms = (QUADS, PAIRS)
        elif library.qconv_u8s7_available():  # AVX2's vpmaddubsw
            self.forms = (U8S7, PAIRS)
        else:
            self.forms = (PAIRS,)
        library.qconv_lanes.restype = library.qconv_block_vectors.restype = ctypes.c_ssize_t
        self.lanes = int(library.qconv_lanes())
        self.block_vectors = int(library.qconv_block_vectors())  # vectors of output channels per packed block

    def pack(self, weight: np.ndarray, group: int = 2) -> PackedQWeight:
        """The weight in qconv.c's layout (see qconv.c) for groups of 2 (int16) or 4 (int8) input channels;
        where `unfolds`, as the (O, KW * C, KH, 1) weight of the width-unfolded conv."""
        shape = weight.shape
        unfolded = unfolds(shape[1], shape[3], group)
        if unfolded:  # w'[o, kw * C + c, kh, 0] = w[o, c, kh, kw]
            weight = weight.transpose(0, 3, 1, 2).reshape(shape[0], shape[3] * shape[1], shape[2], 1)
        out_channels, channels, kernel_h, kernel_w = weight.shape
        padded = -(-out_channels // self.lanes) * self.lanes
        whole = -(-channels // group) * group
        taps = np.zeros((kernel_h, kernel_w, whole, padded), np.int16 if group == 2 else np.int8)
        taps[:, :, :channels, :out_channels] = weight.transpose(2, 3, 1, 0)
        # (tap, group, member, O) -> (tap * group, O, member): each output channel's weights of a group side by side
        rows = taps.reshape(kernel_h * kernel_w * whole // group, group, padded).transpose(0, 2, 1)
        block = self.block_vectors * self.lanes
        flat = np.concatenate([np.ascontiguousarray(rows[:, first:first + block]).ravel()
                               for first in range(0, padded, block)])
        wide = weight.astype(np.int64).reshape(out_channels, -1)
        return PackedQWeight(flat, shape, padded, whole, group, unfolded, wide.sum(axis=1), np.abs(wide).sum(axis=1))

    def form_for(self, low: int, high: int, sums: np.ndarray, magnitudes: np.ndarray, bias: np.ndarray,
                 zero_point: int, storage: np.dtype) -> QConvForm | None:
        """The first of this build's forms that multiplies weights in [low, high] exactly and whose int32 sums
        cannot wrap for inputs of `storage` (8 bits) with this zero point, given each output channel's sum of
        weights and of |w| and its bias; None where none can (the numpy reference runs). Every form's inputs
        lie within 255 of 0 (q - zero point, or u), and a byte form's bias has p sum w taken off."""
        for form in self.forms:
            if form.takes(low, high) and np.max(np.abs(bias.astype(np.int64) - pad_value(form, zero_point, storage)
                                                       * sums) + 255 * magnitudes) <= INT32_LIMIT:
                return form
        return None

    def conv(self, form: QConvForm, x: np.ndarray, zero_point: int, weight: PackedQWeight,
             requantization: Requantization, strides: list[int], pads: list[int], dilations: list[int],
             out: list[int], storage: np.dtype, threads: int = 1) -> np.ndarray:
        """The (N, OH, OW, O) outputs in `storage` (1, 2 or 4 bytes) of x (N, H, W, C), 8-bit integers with
        the given zero point, by `form` (weight packed for its group); pads are the (top, left) ones, `out` is
        (OH, OW) (see `prepare_conv`)."""
        return self.run(prepare_conv(x, zero_point, weight, requantization, strides, pads, dilations, out, storage,
                                     form), threads)

    def add_lookup(self, a: np.ndarray, b: np.ndarray, table: np.ndarray, threads: int = 1) -> np.ndarray:
        """table[a * 256 + b] element by element for two 1-byte arrays of one shape, in a's dtype and memory
        order (a and b in the same order: an NCHW view of channels-last memory stays one); a large array's
        elements split among `threads`."""
        return self.run(prepare_add(a, b, table), threads)

    def quantize(self, x: np.ndarray, scale: float, zero_point: int, qmin: int, qmax: int, storage: np.dtype,
                 threads: int = 1) -> np.ndarray:
        """float32 x as QuantParams.quantize makes it integers of `storage` (1 or 2 bytes; see quantize.c), in
        x's memory order; a large array's elements split among `threads`."""
        return self.run(prepare_quantize(x, scale, zero_point, qmin, qmax, storage), threads)

    def run(self, prepared: RowsCall, threads: int) -> np.ndarray:
        return self._rows.run(self._kernels[prepared.kernel], prepared, threads)


def unfolds(channels: int, kernel_w: int, group: int) -> bool:
    """Whether a conv runs width-unfolded: each output column's kernel row of inputs copied side by side as
    kernel_w * channels channels, the conv then (KH, 1). Where channels are few (the RGB stem's 3, 7 taps
    wide), the channels padded to whole groups once per row instead of once per tap take fewer steps: 7 x 11
    pairs instead of 7 x 7 x 2, 7 x 6 quads instead of 7 x 7. The copy costs kernel_w / stride_w times the
    input, small where channels are."""
    return kernel_w > 1 and -(-kernel_w * channels // group) < kernel_w * -(-channels // group)


def pad_value(form: QConvForm, zero_point: int, storage: np.dtype) -> int:
    """What a padding tap (and a channel added to make whole groups) holds in `form`'s inputs: the zero point
    as the form stores inputs (0 for centred ones)."""
    if form.group == 2:
        return 0
    return zero_point + (128 if np.dtype(storage) == np.int8 else 0)


def prepare_conv(x: np.ndarray, zero_point: int, weight: PackedQWeight, requantization: Requantization,
                 strides: list[int], pads: list[int], dilations: list[int], out: list[int],
                 storage: np.dtype, form: QConvForm = PAIRS) -> RowsCall:
    """`NativeInteger.conv`'s call. The byte forms take x as u = q + 128 (int8) or q (uint8), the padding as
    p = zero point (+ 128), and p * sum w off the bias (see qconv.c); the caller has checked the form's int32
    bound (`NativeInteger.form_for`)."""
    assert weight.group == form.group, f"{form.name} reads groups of {form.group}, the weight has {weight.group}"
    batch, height, width, channels = x.shape
    out_channels, _, kernel_h, kernel_w = weight.shape
    r = requantization
    bias = r.bias
    pad = pad_value(form, zero_point, x.dtype)
    dtype = np.int16 if form.group == 2 else np.uint8
    if form.group == 4:
        bias = np.ascontiguousarray(r.bias - pad * weight.sums)

    def write(values: np.ndarray, into: np.ndarray) -> None:
        """x as the form takes it: q - zero point (int16), or q + 128 (int8) or q (uint8)."""
        if form.group == 2:
            np.subtract(values, np.int16(zero_point), out=into, dtype=np.int16)
        elif values.dtype == np.int8:
            np.bitwise_xor(values.view(np.uint8), np.uint8(0x80), out=into)
        else:
            into[...] = values

    # the geometry along the width qconv.c sees: the conv's own, or the unfolded one's (kernel 1, stride 1)
    columns, geometry = (out[1], (1, 1, 0, 1)) if weight.unfolded else (width, (kernel_w, strides[1], pads[1],
                                                                                 dilations[1]))
    inputs = np.empty((batch, height, columns, weight.channels), dtype)
    if weight.unfolded:
        span = (columns - 1) * strides[1] + (kernel_w - 1) * dilations[1] + 1  # padded columns the taps read
        padded = np.full((batch, height, span, channels), pad, dtype)
        kept = max(0, min(width, span - pads[1]))
        write(x[:, :, :kept], padded[:, :, pads[1]:pads[1] + kept])
        _unfold(padded, kernel_w, strides[1], dilations[1], inputs)
        used = kernel_w * channels
    else:
        write(x, inputs[..., :channels])
        used = channels
    inputs[..., used:] = pad  # the channels that make whole groups
    zeros = np.full(weight.channels, pad, dtype)
    y = np.empty((batch, *out, out_channels), storage)
    call = QConvCall(inputs.ctypes.data, height, columns, weight.channels, weight.taps.ctypes.data,
                     kernel_h, geometry[0], out_channels, weight.padded, bias.ctypes.data,
                     r.multiplier.ctypes.data, r.shift.ctypes.data, r.zero_point, r.low, r.high,
                     y.ctypes.data, y.itemsize, out[0], out[1], strides[0], geometry[1], pads[0], geometry[2],
                     dilations[0], geometry[3], zeros.ctypes.data)
    arrays = (inputs, weight.taps, bias, r.multiplier, r.shift, y, zeros)
    return RowsCall(form.kernel, call, arrays, batch * out[0], y,
                    y.size * kernel_h * kernel_w * channels >= PARALLEL_MACS)


def _unfold(padded: np.ndarray, kernel_w: int, stride: int, dilation: int, inputs: np.ndarray) -> None:
    """inputs[n, h, j, kw * C + c] = padded[n, h, j * stride + kw * dilation, c]: the (N, H, OW, >= KW * C)
    inputs of a width-unfolded conv (see `unfolds`) from its (N, H, padded W, C) ones, in one copy (a view of
    `padded` with a kw axis; undilated, each output column's KW * C values are one run of it)."""
    batch, height, _, channels = padded.shape
    shape = (batch, height, inputs.shape[2], kernel_w, channels)
    n, h, w, c = padded.strides
    taps = np.lib.stride_tricks.as_strided(padded, shape, (n, h, w * stride, w * dilation, c), writeable=False)
    n, h, w, c = inputs.strides
    np.copyto(np.lib.stride_tricks.as_strided(inputs, shape, (n, h, w, c * channels, c)), taps)


def prepare_add(a: np.ndarray, b: np.ndarray, table: np.ndarray) -> RowsCall:
    """`NativeInteger.add_lookup`'s call."""
    order = _memory_order(a)
    if order is None or _memory_order(b) != order:
        order = tuple(range(a.ndim))
    a_flat = np.ascontiguousarray(a.transpose(order))
    b_flat = np.ascontiguousarray(b.transpose(order))
    y = np.empty_like(a_flat)
    call = QAddCall(a_flat.ctypes.data, b_flat.ctypes.data, table.ctypes.data, y.ctypes.data)
    return RowsCall("qadd_lookup", call, (a_flat, b_flat, table, y), y.size, y.transpose(np.argsort(order)),
                    y.size >= PARALLEL_LOOKUPS)


def prepare_quantize(x: np.ndarray, scale: float, zero_point: int, qmin: int, qmax: int,
                     storage: np.dtype) -> RowsCall:
    """`NativeInteger.quantize`'s call."""
    order = _memory_order(x) or tuple(range(x.ndim))
    flat = np.ascontiguousarray(x.transpose(order))
    y = np.empty(flat.shape, storage)
    call = QuantizeCall(flat.ctypes.data, np.float32(scale), np.float32(qmax - qmin), np.float32(zero_point),
                        np.float32(qmin), np.float32(qmax), y.itemsize, y.ctypes.data)
    return RowsCall("quantize_f32", call, (flat, y), y.size, y.transpose(np.argsort(order)), y.size >= PARALLEL_LOOKUPS)


def _memory_order(array: np.ndarray) -> tuple[int, ...] | None:
    """The axes of `array` from outermost to innermost in memory, if it is dense in that order, else None."""
    order = tuple(int(axis) for axis in np.argsort([-s for s in array.strides], kind="stable"))
    return order if array.transpose(order).flags.c_contiguous else None
